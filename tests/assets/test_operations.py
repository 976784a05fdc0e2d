"""The `operations` asset on the H200 recording: the real serving_config, kserve_manifest and
operations assets in a real Dagster instance, on what the run's assets stored there. At the
run's stack the h200 configuration was measured, so the rules alert at the measured saturation
point and the ScaledObject scales there; at the repository's stack the same configuration was
never measured, and neither is rendered, saying why.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.operations import VALID_CHECK, operations
from bench import gpu_recordings as rec
from resources.config_files import ConfigFiles, OutputDirs
from tests.assets.test_h200_stages_replay import (  # noqa: F401
    Replayed,
    instance,
    repo_configs,
    run_configs,
)
from tests.assets.test_h200_stages_replay import replay as stages_replay
from tests.dagster_support import metadata


def replay(instance, configs: ConfigFiles, tmp_path: Path  # noqa: F811
           ) -> tuple[Replayed, Path]:
    """The stages' replay (with the H200's load timing), each cell rendering its operations
    beside its manifest."""
    out = tmp_path / "manifests"
    result = stages_replay(instance, configs, OutputDirs(manifests_dir=str(out)), tmp_path,
                           with_load_timing=True, also=(operations,))
    return result, out / rec.MODEL / "operations"


def _check(result: Replayed, node_type: str) -> dg.AssetCheckEvaluation:
    return next(e for e in result.cells[node_type].get_asset_check_evaluations()
                if e.check_name == VALID_CHECK)


def _alerts(path: Path) -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(path.read_text())["groups"]
            for r in g["rules"] if "alert" in r}


@pytest.mark.slow
def test_measured_configuration_alerts_and_scales_at_its_saturation_point(
        instance, run_configs, tmp_path):  # noqa: F811
    result, out = replay(instance, run_configs, tmp_path)
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert set(result.cells) == {"h200", "b300"}
    for nt in result.cells:  # each cell renders and checks its own node type's files
        assert _check(result, nt).passed, _check(result, nt).metadata["errors"]
        assert set(metadata(result.cells[nt], "operations")["files"]) >= {
            f"{nt}-rules.yml", f"{nt}-operations.yaml", f"{nt}-dashboard.json"}
    h200 = result.cells["h200"]
    bench, _, _ = rec.benchmark_result(rec.slo(run_configs))
    queue = _alerts(out / "h200-rules.yml")["ModelQueueAboveSaturation"]
    assert queue["expr"].endswith(f"> {bench.saturation_concurrency}")
    docs = list(yaml.safe_load_all((out / "h200-operations.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["PrometheusRule", "PodMonitor", "PodMonitor",
                                         "ScaledObject"]
    assert docs[3]["spec"]["scaleTargetRef"]["name"] == \
        metadata(h200, "kserve_manifest")["services"]["h200"] + "-predictor"
    assert (out / "h200-dashboard.json").is_file() and (out / "dcgm-counters.csv").is_file()
    assert "measured saturation concurrency" in metadata(h200, "operations")["thresholds"]
    b300 = _alerts(out / "b300-rules.yml")  # every manifest's node type, its own GPU selector
    assert 'modelName=~"NVIDIA[- ]B300[- ]SXM6[- ]AC"' in b300["GPUXidError"]["expr"]
    # b300 was never measured: its cell has no measured saturation point to alert or scale at
    assert "ModelQueueAboveSaturation" not in b300


@pytest.mark.slow
def test_unmeasured_configuration_gets_no_measured_threshold_and_says_why(
        instance, repo_configs, tmp_path):  # noqa: F811
    result, out = replay(instance, repo_configs, tmp_path)
    assert result.success and _check(result, "h200").passed
    assert "ModelQueueAboveSaturation" not in _alerts(out / "h200-rules.yml")
    kinds = [d["kind"] for d in yaml.safe_load_all((out / "h200-operations.yaml").read_text())]
    assert "ScaledObject" not in kinds
    why = metadata(result.cells["h200"], "operations")["not_rendered"]["h200"]["ScaledObject"]
    assert why.startswith("no benchmark at this configuration")
