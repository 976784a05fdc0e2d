"""Three fully cold starts of SmolLM2 at one configuration on an H200
(tests/data/gpu/h200-cold-start/onboard-T.json), replayed on a CPU: the cold-start p95
recomputed from the starts, the check re-judged, and the manifest the real serving_config and
kserve_manifest assets render from that p95. Nothing here starts an engine."""

from __future__ import annotations

import pytest

from bench import gpu_recordings as rec
from tests.assets import test_h200_stages_replay as stages
from tests.assets.test_h200_stages_replay import GOLDEN, isvc, rendered, replay
from tests.conftest import assert_golden

# the stages' replay fixtures: its instance, and configs/ as it ran (the same pins and
# configuration 0660e584b7cc as these starts)
instance, run_configs = stages.instance, stages.run_configs


def test_three_fully_cold_starts_make_a_p95_and_the_check_is_rejudged(run_configs):
    md = rec.recorded("cold_start", "onboard-T")["assets"][rec.MODEL]["load_timing"]
    timing = rec.cold_start_load_timing()
    kinds = [s.kind for s in rec.start_samples_from(md["starts"])]
    assert kinds == ["fully_cold"] * 3
    assert timing.cold_start_p95_s == pytest.approx(md["cold_start_p95_s"], abs=5e-4)
    assert timing.cold_start_p50_s == pytest.approx(md["cold_start_p50_s"], abs=5e-4)
    assert md["cold_weights_p50_s"] is None and md["warm_start_p50_s"] is None
    assert timing.config_hash == rec.RUN_CONFIG_HASH  # the stages' recording's configuration
    (job,) = rec.recorded("cold_start", "onboard-T")["steps"].values()
    check = next(c for c in job["checks"] if c["check"] == "cold_start_within_budget")
    budget_s = rec.slo(run_configs).cold_start_p95_max_s
    assert check["metadata"]["expected_max_s"] == budget_s
    assert check["passed"] is (timing.cold_start_p95_s <= budget_s) is False


@pytest.mark.slow
def test_the_h200_manifest_sizes_its_startup_probe_from_the_three_start_p95(
        instance, run_configs, outputs, tmp_path):
    """Fed these starts' load timing (the same configuration as the stages' sweep), the h200
    manifest's startup probe is sized from a p95 of three starts: no "fewer than" note, the
    window 2 x p95 (weights in the node cache), and the golden holds the whole manifest."""
    result = replay(instance, run_configs, outputs, tmp_path, with_load_timing=True,
                    load_timing=rec.cold_start_load_timing())
    assert result.success, [e.metadata for e in result.get_asset_check_evaluations()]
    text = rendered(result, "h200")
    assert_golden(GOLDEN / "smollm2-135m-h200-replayed-cold-start.yaml", text,
                  "smollm2-135m-h200-replayed-cold-start.yaml: the replayed rendering changed")
    doc = isvc(text)
    note = doc["metadata"]["annotations"]["model-onboarding.io/startup-probe"]
    assert doc["metadata"]["labels"]["model-onboarding.io/probe-basis"] == "measured"
    assert "p95 154.2 s (n=3)" in note and "fewer than" not in note
    probe = doc["spec"]["predictor"]["model"]["startupProbe"]
    window = probe["failureThreshold"] * probe["periodSeconds"]
    assert window >= 2 * rec.cold_start_load_timing().cold_start_p95_s
