"""The search runner with real engine processes: the fake engine posing as vLLM on the CPU, each
candidate its own process (its environment sets how fast it answers, or that it dies at
start), judged by the real load generator at a Poisson rate."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.openai_stream_server import install_as_vllm
from onboarding.common.refs import VariantRef
from onboarding.fetch.catalog import ModelSpec
from onboarding.serving.config_search import Candidate, SearchFailed, candidates
from onboarding.serving.rate_verdict import MET, NOT_MET, RateSlo
from onboarding.serving.stats import Slo
from resources.engine import Engine
from resources.loadgen import LoadGenerator
from resources.search_runner import Traffic, run_search
from tests.conftest import tiny_with_smol_tokenizer

SLO = Slo(ttft_p95_s=0.2, itl_mean_ms=100, error_rate_max=0.0, target_concurrency=4)
RATE = RateSlo(target_rate_rps=20, ttft_p_s=0.2, tpot_p_ms=100, percentile=90, confidence=0.9,
               min_requests=20, max_seconds=10, look_every=20, repeats=2)


@pytest.fixture
def model_dir(tiny_checkpoint, tmp_path) -> Path:
    return tiny_with_smol_tokenizer(tiny_checkpoint, tmp_path / "variant")


def setup(tmp_path, model_dir, monkeypatch, slow_ms: dict[int, str]):
    from transformers import AutoTokenizer

    monkeypatch.setenv("FAKE_TTFT_MS", "5")
    monkeypatch.setenv("FAKE_ITL_MS", "1")
    engine = Engine(bin_dir=str(install_as_vllm(tmp_path / "bin")), hardware="cpu",
                    node_type="cpu", start_timeout_s=30, log_dir=str(tmp_path / "logs"))
    spec = ModelSpec(id="tiny", source="s3://models/tiny/", served_name="tiny",
                     engine_args={"max_model_len": 1024, "max_num_seqs": 1})
    cands, _, basis = candidates(engine.template(), engine.local_config(spec, "bf16"), [4, 8],
                                 [2048], target_concurrency=4, max_candidates=3)
    # each candidate's own environment decides how its engine behaves (it changes the hash,
    # which is only this test's business)
    cands = [Candidate(dataclasses.replace(c.config, env={**c.config.env, **slow_ms[i]}),
                       c.predicted, c.baseline) if i in slow_ms else c
             for i, c in enumerate(cands)]
    variant = VariantRef("tiny", "bf16", str(model_dir), 1, "stub")
    return engine, variant, cands, basis, AutoTokenizer.from_pretrained(model_dir)


def test_a_crashed_candidate_is_counted_and_the_met_one_wins(tmp_path, model_dir, monkeypatch):
    engine, variant, cands, basis, tok = setup(tmp_path, model_dir, monkeypatch, {
        1: {"FAKE_ENGINE_EXIT_CODE": "3"}, 2: {"FAKE_TTFT_MS": "400"}})
    result = run_search(engine, LoadGenerator(), variant, cands, basis, SLO, RATE,
                        Traffic(input_tokens=8, output_tokens=4, warmup_requests=1,
                                request_timeout_s=10),
                        tok, budget_s=600, start_s=5, log=lambda s: None)
    table = result.table()
    assert [row["verdict"] for row in table] == [MET, "crashed", NOT_MET]
    assert result.crashed == 1 and result.measured == 3
    assert "exited" in table[1]["note"] or "code 3" in table[1]["note"]
    assert table[2]["note"].startswith("repetition 1 not met") and table[2]["runs"] == 1
    assert table[0]["runs"] == 2 and table[0]["n"] >= 2 * 20 and table[0]["chosen"]
    assert result.winner.hash == cands[0].config.hash
    assert "the plan's configuration was already the best" in result.margin


def test_no_candidate_met_fails_closed_with_the_best_ones_numbers(tmp_path, model_dir,
                                                                  monkeypatch):
    engine, variant, cands, basis, tok = setup(tmp_path, model_dir, monkeypatch, {
        0: {"FAKE_TTFT_MS": "400"}, 1: {"FAKE_TTFT_MS": "300"},
        2: {"FAKE_ENGINE_EXIT_CODE": "3"}})
    with pytest.raises(SearchFailed) as err:
        run_search(engine, LoadGenerator(), variant, cands, basis, SLO, RATE,
                   Traffic(input_tokens=8, output_tokens=4, warmup_requests=1,
                           request_timeout_s=10),
                   tok, budget_s=600, start_s=5, log=lambda s: None)
    text = str(err.value)
    assert "not met by any of 3 candidates (1 crashed)" in text
    assert cands[1].config.hash in text and "n=" in text


def test_a_challenger_that_cannot_beat_the_plan_by_the_margin_is_not_repeated(
        tmp_path, model_dir, monkeypatch):
    """The plan's configuration meets the SLO at a TTFT of 60 ms, a third of its 0.2 s bound.
    With min_margin 0.95 a challenger must keep every run under 0.05 of that, about 3 ms of
    TTFT, which a 5 ms engine cannot: its first run decides that it cannot win, so it is not
    repeated, although it is ahead of the plan (the best so far)."""
    engine, variant, cands, basis, tok = setup(tmp_path, model_dir, monkeypatch, {
        0: {"FAKE_TTFT_MS": "60"}})
    result = run_search(engine, LoadGenerator(), variant, cands[:2], basis, SLO, RATE,
                        Traffic(input_tokens=8, output_tokens=4, warmup_requests=1,
                                request_timeout_s=10),
                        tok, budget_s=600, start_s=5, min_margin=0.95, log=lambda s: None)
    plan, challenger = result.table()
    assert plan["verdict"] == challenger["verdict"] == MET
    assert plan["runs"] == 2 and challenger["runs"] == 1
    assert challenger["headroom"] < plan["headroom"]  # ahead of the best so far
    assert "had to stay under to win" in challenger["note"]
    assert result.winner.hash == cands[0].config.hash


def test_each_precision_is_served_from_its_own_weights(tmp_path, model_dir, monkeypatch):
    """Candidates at two precisions, one variant each: the engine of each candidate is started
    on its precision's directory; a precision without weights is refused before any start."""
    from onboarding.common.errors import ConfigError

    engine, variant, cands, basis, tok = setup(tmp_path, model_dir, monkeypatch, {})
    other = tiny_with_smol_tokenizer(model_dir, tmp_path / "fp8")
    fp8 = Candidate(dataclasses.replace(cands[1].config, precision="fp8"), other_start=True)
    started: list[tuple[str, str]] = []

    class Recorded:  # the real engine, and which weights each start was given
        def serve(self, v, config, **kw):
            started.append((config.precision, v.path))
            # the CPU build serves bf16: the fp8 candidate's engine starts as bf16 here
            return engine.serve(dataclasses.replace(v, precision="bf16"),
                                dataclasses.replace(config, precision="bf16"), **kw)

    traffic = Traffic(input_tokens=8, output_tokens=4, warmup_requests=1, request_timeout_s=10)
    with pytest.raises(ConfigError, match="no weights for fp8"):
        run_search(Recorded(), LoadGenerator(), {"bf16": variant}, [cands[0], fp8], basis, SLO,
                   RATE, traffic, tok, budget_s=600, start_s=5, log=lambda s: None)
    assert started == []
    fp8_ref = VariantRef("tiny", "fp8", str(other), 1, "stub")
    result = run_search(Recorded(), LoadGenerator(), {"bf16": variant, "fp8": fp8_ref},
                        [cands[0], fp8], basis, SLO, RATE, traffic, tok, budget_s=600,
                        start_s=5, log=lambda s: None)
    assert started == [("bf16", str(model_dir)), ("fp8", str(other))]
    assert [r["precision"] for r in result.table()] == ["bf16", "fp8"]


def test_each_engine_starts_its_own_candidates(tmp_path, model_dir, monkeypatch):
    """Candidates in two engines, one `Engine` resource each: each candidate is started by the
    resource of its configuration's engine; an engine with none at hand is refused before any
    start. (Both resources here start the fake engine posing as vLLM: the CPU has no second
    engine installed; which resource started which candidate is what is checked.)"""
    from onboarding.common.errors import ConfigError

    engine, variant, cands, basis, tok = setup(tmp_path, model_dir, monkeypatch, {})
    other = Candidate(dataclasses.replace(cands[1].config, engine="sglang"), other_start=True,
                      other_engine=True)
    started: list[tuple[str, str]] = []

    class Recorded:  # the real engine, and which resource each start went to
        def __init__(self, name):
            self.name = name

        def serve(self, v, config, **kw):
            started.append((self.name, config.engine))
            return engine.serve(v, dataclasses.replace(config, engine="vllm"), **kw)

    traffic = Traffic(input_tokens=8, output_tokens=4, warmup_requests=1, request_timeout_s=10)
    with pytest.raises(ConfigError, match="no engine at hand for sglang"):
        run_search({"vllm": Recorded("vllm")}, LoadGenerator(), variant, [cands[0], other],
                   basis, SLO, RATE, traffic, tok, budget_s=600, start_s=5, log=lambda s: None)
    assert started == []
    result = run_search({"vllm": Recorded("vllm"), "sglang": Recorded("sglang")},
                        LoadGenerator(), variant, [cands[0], other], basis, SLO, RATE, traffic,
                        tok, budget_s=600, start_s=5, log=lambda s: None)
    assert started == [("vllm", "vllm"), ("sglang", "sglang")]
    assert [r["engine"] for r in result.table()] == ["vllm", "sglang"]
    assert other.label.startswith("sglang bf16 TP 1, ")
