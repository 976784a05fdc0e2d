"""The fifth H200 run replayed on a CPU (tests/data/gpu/h200-2026-12-02-run5/): the 8B twin in
bf16 on vLLM 0.22.0 and SGLang 0.5.17 (issue 29's last pair), and three fully cold starts of
SmolLM2 at one configuration (issue 25 item 5). What the GPU measured is data here; what is
recomputed is the configurations at that run's pins, the goodput and the engine choice, the
client's accounting against each engine's histograms, the cold-start p95 from the starts, and
the manifest the real serving_config and kserve_manifest assets render from that p95. Nothing
here starts an engine."""

from __future__ import annotations

import pytest

from onboarding.deploy.engine_choice import (
    MEASURED,
    choose_engine,
    goodput_at_slo,
    measurements_from_twins,
)
from tests import gpu_recordings as rec
from tests.assets import test_h200_replay as first_run
from tests.assets.test_h200_replay import GOLDEN, isvc, rendered, replay
from tests.conftest import assert_golden

# the first run's replay fixtures: its instance, and configs/ as that run had it (the same
# pins and configuration 0660e584b7cc as this run's load timing)
instance, run_configs = first_run.instance, first_run.run_configs

STEP = "llama-3-1-8b-instruct-twin:bf16"
FILES = ("vllm-twins", "sglang-twins")


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return rec.candidates_at_run5(tmp_path_factory.mktemp("run5"))


def steps() -> dict[str, dict]:
    out = {}
    for name in FILES:
        step = rec.recording_run5(name)["steps"][STEP]
        out[step["engine"].split(" ")[0]] = step
    return out


def test_both_engines_ran_the_bf16_configuration_the_plan_gives_at_the_runs_pins(bf16):
    """The twin's FP8 plan at bf16 (as bench/gpu_serving.py twin_target runs it) through each
    template hashes to what the device recorded: another template or plan would not count."""
    _, candidates = bf16
    recorded = {e: s["config_hash"] for e, s in steps().items()}
    assert set(recorded) == {"vllm", "sglang"}
    assert {e: candidates[e].hash for e in recorded} == recorded
    assert all(s["config_basis"].startswith("the fp8 plan's configuration at bf16")
               for s in steps().values())


def test_the_bf16_choice_is_the_higher_goodput_recomputed_from_the_points(bf16):
    cf, candidates = bf16
    goodput = {e: goodput_at_slo(s["rows"], int(s["slo"]["target_concurrency"]))
               for e, s in steps().items()}
    assert all(g is not None and g[1] == 32 for g in goodput.values()), goodput
    measured = [m for name in FILES for m in measurements_from_twins(
        rec.recording_run5(name), name, "h200")]
    choice = choose_engine("h200", candidates, measured, cf.stack().engine)
    assert choice.basis == MEASURED
    assert choice.engine == max(goodput, key=lambda e: goodput[e][0]) == "sglang"
    assert choice.goodput == pytest.approx({e: g[0] for e, g in goodput.items()})


def test_every_bf16_points_client_itl_agrees_with_its_engines_histogram():
    for engine, step in steps().items():
        for r in step["rows"]:
            assert r["failed"] == 0 and r["completed"] == r["requests"], (engine, r["load"])
            assert r["itl_mean_ms"] == pytest.approx(r["server_itl_mean_ms"], rel=0.02), \
                (engine, r["load"])


def test_above_the_slots_the_plan_admits_requests_wait_and_ttft_misses_on_both_engines():
    """At c=64 with 32 slots (max_num_seqs / max-running-requests 32) half the requests queue:
    each engine's own gauges say so, and the point fails the SLO on TTFT p95 for both."""
    for engine, step in steps().items():
        (at64,) = [r for r in step["rows"] if r["load"] == 64]
        assert step["argv_params"]["max_num_seqs"] == 32
        assert (at64["peak_running"], at64["peak_waiting"]) == (32, 32), engine
        assert at64["ttft_p95_s"] > step["slo"]["ttft_p95_s"] and not at64["meets_slo"]


def test_three_fully_cold_starts_make_a_p95_and_the_check_is_rejudged(run_configs):
    md = rec.recording_run5("onboard-T")["assets"][rec.MODEL]["load_timing"]
    timing = rec.load_timing_result_run5()
    kinds = [s.kind for s in rec.start_samples_from(md["starts"])]
    assert kinds == ["fully_cold"] * 3
    assert timing.cold_start_p95_s == pytest.approx(md["cold_start_p95_s"], abs=5e-4)
    assert timing.cold_start_p50_s == pytest.approx(md["cold_start_p50_s"], abs=5e-4)
    assert md["cold_weights_p50_s"] is None and md["warm_start_p50_s"] is None
    assert timing.config_hash == rec.RUN_CONFIG_HASH  # the first run's configuration
    (job,) = rec.recording_run5("onboard-T")["steps"].values()
    check = next(c for c in job["checks"] if c["check"] == "cold_start_within_budget")
    budget_s = rec.slo(run_configs).cold_start_p95_max_s
    assert check["metadata"]["expected_max_s"] == budget_s
    assert check["passed"] is (timing.cold_start_p95_s <= budget_s) is False


def test_the_h200_manifest_sizes_its_startup_probe_from_the_three_start_p95(
        instance, run_configs, outputs, tmp_path):
    """Fed the fifth run's load timing (same configuration as the first run's sweep), the h200
    manifest's startup probe is sized from a p95 of three starts: no "fewer than" note, the
    window 2 x p95 (weights in the node cache), and the golden holds the whole manifest."""
    result = replay(instance, run_configs, outputs, tmp_path, with_load_timing=True,
                    load_timing=rec.load_timing_result_run5())
    assert result.success, [e.metadata for e in result.get_asset_check_evaluations()]
    text = rendered(result, "h200")
    assert_golden(GOLDEN / "smollm2-135m-h200-replayed-run5.yaml", text,
                  "smollm2-135m-h200-replayed-run5.yaml: the replayed rendering changed")
    doc = isvc(text)
    note = doc["metadata"]["annotations"]["model-onboarding.io/startup-probe"]
    assert doc["metadata"]["labels"]["model-onboarding.io/probe-basis"] == "measured"
    assert "p95 154.2 s (n=3)" in note and "fewer than" not in note
    probe = doc["spec"]["predictor"]["model"]["startupProbe"]
    window = probe["failureThreshold"] * probe["periodSeconds"]
    assert window >= 2 * rec.load_timing_result_run5().cold_start_p95_s
