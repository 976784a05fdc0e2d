"""The serving sweep outside Dagster: a plain logger, a stand-in load generator, no context."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest

from onboarding.common.errors import OnboardingError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.frontend import FrontendSampler
from onboarding.serving.profiles import resolve_slo
from onboarding.serving.stack import load_stack
from onboarding.serving.stats import RequestRecord
from resources.config_files import ConfigFiles
from resources.loadgen import PointRun
from resources.sweep import run_sweep
from resources.telemetry import GpuTelemetry

TWIN = "llama-3-1-8b-instruct-twin"


class StubLoadGenerator:
    """Answers every request at once: 4 tokens, TTFT 10 ms, ITL 2 ms."""

    def __init__(self):
        self.points: list[dict] = []

    def run_point(self, base_url, bodies, **kw) -> PointRun:
        self.points.append({"n": len(bodies), "warmup": len(kw["warmup_bodies"]), **kw})
        records = [RequestRecord(ok=True, start_s=0.0, ttft_s=0.01, e2e_s=0.016,
                                 itl_s=[0.002] * 3, content_chunks=4, stream_tokens=4,
                                 output_tokens=4) for _ in bodies]
        return PointRun(records=records, duration_s=0.5)


class WordTokenizer:
    """One token per word, 100 words " word<a..j><a..j>": all round-trip."""

    def __init__(self):
        letters = "abcdefghij"
        self.words = [f" word{a}{b}" for a in letters for b in letters]
        self.ids = {w: i for i, w in enumerate(self.words)}

    def get_vocab(self) -> dict[str, int]:
        return dict(self.ids)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.words[i] for i in ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [self.ids[" " + w] for w in text.split()]


@pytest.fixture
def tokenizer():
    return WordTokenizer()


def _sweep(tokenizer, running, **kw):
    cf = ConfigFiles()
    _, profile = cf.profile("gpu", "h200")
    scenarios = {"chat": profile.scenarios["chat"].model_copy(
        update={"input_tokens": 16, "prefix_tokens": 4, "output_tokens": 4})}
    sweep = profile.sweep.model_copy(update={"concurrency": [1, 2, 4], "requests_per_point": 6})
    slo = resolve_slo(cf.slo_section(), "h200", cf.spec(TWIN))
    vllm = load_stack(PROJECT_ROOT / "configs" / "stack.yaml").templates["vllm"]
    loadgen = StubLoadGenerator()
    with GpuTelemetry().sampler([0]) as sampler, FrontendSampler(os.getpid()) as frontend:
        rows, points = run_sweep(logging.getLogger("sweep-test"), loadgen, running, vllm, "m",
                                 scenarios, sweep, slo, tokenizer, sampler, frontend, **kw)
    return rows, points, loadgen, sweep


def test_the_sweep_runs_with_a_plain_logger_and_no_asset_context(tokenizer, caplog):
    running = SimpleNamespace(base_url="http://stub", exited=lambda _=None: False)
    with caplog.at_level(logging.INFO, logger="sweep-test"):
        rows, points, loadgen, sweep = _sweep(tokenizer, running)
    assert [r["load"] for r in rows] == [1, 2, 4]
    assert [p for p, _ in points["chat"]] == [1, 2, 4]
    assert not any(r["engine_exited"] for r in rows)
    # the warm-up goes before the first point only
    assert [p["warmup"] for p in loadgen.points] == [sweep.warmup_requests, 0, 0]
    assert [m.split(":")[0] for m in caplog.messages if m.startswith("chat @ ")] == [
        "chat @ 1", "chat @ 2", "chat @ 4"]


class Exited(OnboardingError):
    pass


def _dying_engine():
    """Exits during the second point; its error carries what the sweep says was kept."""
    calls = iter([False, True])
    return SimpleNamespace(
        base_url="http://stub", exited=lambda _=None: next(calls),
        exited_error=lambda point, kept: Exited("engine", f"died during {point}; {kept}", "-"))


def test_an_engine_exit_hands_the_rows_so_far_to_keep_partial_and_names_where(tokenizer):
    kept: list = []

    def keep(rows, point):
        kept.append(([r["engine_exited"] for r in rows], point))
        return "in /reports/partial.csv"

    with pytest.raises(Exited) as err:
        _sweep(tokenizer, _dying_engine(), keep_partial=keep)
    assert kept == [([False, True], "chat @ 2")]
    assert "died during chat @ 2; the 2 point(s) measured, the last one marked " \
           "engine_exited, are in /reports/partial.csv" in str(err.value)


def test_without_keep_partial_the_error_says_the_points_were_not_kept(tokenizer):
    with pytest.raises(Exited, match="are not kept"):
        _sweep(tokenizer, _dying_engine())
