"""The measured search with a second engine's candidates beside the plan's, on an H100
(tests/data/gpu/search-over-engines/), read back through the product's own code: the four
candidates rebuilt from the plan serving_config gives the 8B FP8 twin on h100 (the stack pinned to
the engine that ran) with SGLang's renderings as other starts, their hashes and command lines
against the ones the device started, and every recorded run judged again from its requests
against the verdict the device printed.

The recording stops inside its fourth candidate (its README says why): there is no table and no
winner to replay, and these tests claim none. The search's table and record are replayed from
the complete recordings (tests/assets/test_config_search_recordings.py).
"""

from __future__ import annotations

import functools
import json
import re
from collections import defaultdict

import pytest

from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.rate_verdict import RateSlo
from onboarding.serving.stats import Slo
from tests.search_recording import SearchRecording, judged_runs

REC = PROJECT_ROOT / "tests" / "data" / "gpu" / "search-over-engines"
MODEL = "llama-3-1-8b-instruct-twin"


@functools.cache
def _log() -> str:
    return (REC / "search.log").read_text()


def _settings() -> tuple[Slo, RateSlo]:
    """The SLO and the rate verdict's settings, as the device printed them."""
    def kwargs(name: str) -> dict:
        body = re.search(rf"\b{name}\((.*)\)\n", _log()).group(1)
        return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", body)}

    slo = kwargs("Slo")
    slo["target_concurrency"] = int(slo["target_concurrency"])
    rate = kwargs("RateSlo")
    for k in ("min_requests", "look_every", "repeats"):
        rate[k] = int(rate[k])
    return Slo(**slo), RateSlo(**rate)


def _printed_runs() -> dict[str, list[str]]:
    """Per candidate hash, the verdict text of each run the device printed, in order."""
    out: dict[str, list[str]] = defaultdict(list)
    current = None
    for line in _log().splitlines():
        if m := re.match(r"search on \w+: .*\(([0-9a-f]{12})\)$", line):
            current = m.group(1)
            out[current]  # a candidate started, with or without a run
        elif m := re.match(r"  run \d+/\d+ at [0-9.]+ req/s: (.*) \(stopped: \w+\)$", line):
            out[current].append(m.group(1))
    return dict(out)


def _printed_candidates() -> list[str]:
    return re.findall(r"^  ([0-9a-f]{12}) ", _log(), re.MULTILINE)


@pytest.fixture(scope="module")
def judged() -> dict:
    """Every recorded run, judged again from its requests at the settings the device printed."""
    return judged_runs(REC / "samples.jsonl.gz", *_settings())


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    """The candidates as bench/config_search.py --plan --other-starts --engine-bin-for
    sglang=DIR built them on the device: (candidates, templates, what engine_bases left out)."""
    from bench.config_search import planned_base, planned_serving
    from onboarding.deploy.serving_plan import engine_bases
    from onboarding.serving.config_search import candidates
    from resources.config_files import ConfigFiles

    cfg = SearchRecording(REC).pinned_configs(tmp_path_factory.mktemp("pinned"))
    cf = ConfigFiles(config_dir=str(cfg))
    spec, stack = cf.spec(MODEL), cf.stack()
    slo, _ = _settings()
    base = planned_base(cf, spec, "h100")
    starts, left_out = engine_bases(planned_serving(cf, spec), spec, stack, "h100",
                                    at_hand=frozenset({"sglang"}))
    cands, _, _ = candidates(stack.templates[base.engine], base, [128], [8192],
                             slo.target_concurrency, 4, starts=starts, templates=stack.templates)
    return cands, stack.templates, left_out


def test_the_device_started_the_candidates_the_plan_renders(rebuilt):
    cands, templates, left_out = rebuilt
    assert [c.config.hash for c in cands] == _printed_candidates()
    # the plan's engine first at equal numbers, the other engine's rendering right after it
    assert [(c.config.engine, c.config.max_num_seqs) for c in cands] == [
        ("vllm", 32), ("sglang", 32), ("vllm", 128), ("sglang", 128)]
    assert all(c.config.precision == "fp8" and c.config.tensor_parallel == 1 for c in cands)
    # the engine that has no rendering for the twin is said, not silently dropped
    assert any(w.startswith("engine trtllm:") for w in left_out)
    started = json.loads((REC / "engine-argv.json").read_text())
    assert [s["hash"] for s in started] == [c.config.hash for c in cands]
    for s, c in zip(started, cands, strict=True):
        argv = s["argv"]
        command = templates[c.config.engine].command
        port = int(next(a for a in argv if a.startswith("--port=")).split("=")[1])
        model_dir = next(a.split("=", 1)[-1] for a in argv
                         if a.rstrip("/").endswith(f"{MODEL}-fp8"))
        assert argv[len(command):] == c.config.args(model_dir, port, "127.0.0.1"), c.config.hash
        assert argv[0].endswith(command[0].split("}")[-1])


def test_each_recorded_run_is_judged_again_as_the_device_printed_it(judged):
    _, rate = _settings()
    printed = _printed_runs()
    assert list(printed) == _printed_candidates()
    for h, texts in printed.items():
        assert [v.says() for v in judged.get(h, [])] == texts, h
        assert all(v.n >= rate.min_requests for v in judged.get(h, []))


def test_what_the_search_measured_before_it_stopped(judged):
    """At 26 req/s both engines at the plan's 32 sequences queue past the TTFT bounds, SGLang
    further than vLLM; vLLM with 128 x 8192 meets every bound in both runs; SGLang's
    128 x 8192 started and has no run."""
    plan, sgl32, vllm128, sgl128 = _printed_candidates()
    assert [v.outcome for v in judged[plan]] == ["not met"]
    assert [v.outcome for v in judged[sgl32]] == ["not met"]
    assert judged[sgl32][0].stat("ttft_p99").estimate > judged[plan][0].stat("ttft_p99").estimate
    assert judged[sgl32][0].goodput_rps < judged[plan][0].goodput_rps
    assert [v.outcome for v in judged[vllm128]] == ["met", "met"]
    assert min(v.goodput_rps for v in judged[vllm128]) > 4 * judged[plan][0].goodput_rps
    assert sgl128 not in judged
    # SGLang served the twin's ModelOpt FP8 checkpoint in FP8, with an FP8 KV cache
    keys = (REC / "engine-key-lines.txt").read_text()
    assert "quant=modelopt_fp8" in keys and "dtype: torch.float8_e4m3fn" in keys
