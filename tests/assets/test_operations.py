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

from assets.deploy import kserve_manifest, serving_config
from assets.operations import VALID_CHECK, operations
from bench import gpu_recordings as rec
from resources.config_files import ConfigFiles, OutputDirs
from resources.huggingface import HuggingFaceStore
from resources.manifest_validator import ManifestValidator
from resources.s3 import S3ObjectStore
from resources.upstream import optional_upstream
from tests.assets.test_h200_stages_replay import UPSTREAM, instance, repo_configs, run_configs  # noqa: F401
from tests.dagster_support import metadata, store_upstream


def replay(instance, configs: ConfigFiles, tmp_path: Path  # noqa: F811
           ) -> tuple[dg.ExecuteInJobResult, Path]:
    bench, _, _ = rec.benchmark_result(rec.slo(configs))
    store_upstream(instance, rec.MODEL, checkpoint=rec.checkpoint(tmp_path / "checkpoint"),
                   serving_variant=rec.serving_variant(tmp_path / "checkpoint"),
                   accuracy=rec.accuracy(), serving_benchmark=bench,
                   published_variant=rec.published("B"), load_timing=rec.load_timing_result())
    out = tmp_path / "manifests"
    result = dg.materialize(
        [serving_config, kserve_manifest, operations, *UPSTREAM], instance=instance,
        partition_key=rec.MODEL, raise_on_error=False,
        resources={"configs": configs, "outputs": OutputDirs(manifests_dir=str(out)),
                   "manifest_validator": ManifestValidator(),
                   "s3": S3ObjectStore(endpoint_url="http://127.0.0.1:1",
                                       access_key_id="unused-id", secret_access_key="unused"),
                   "hf": HuggingFaceStore(), "optional_upstream": optional_upstream})
    return result, out / rec.MODEL / "operations"


def _check(result: dg.ExecuteInJobResult) -> dg.AssetCheckEvaluation:
    return next(e for e in result.get_asset_check_evaluations() if e.check_name == VALID_CHECK)


def _alerts(path: Path) -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(path.read_text())["groups"]
            for r in g["rules"] if "alert" in r}


@pytest.mark.slow
def test_measured_configuration_alerts_and_scales_at_its_saturation_point(
        instance, run_configs, tmp_path):  # noqa: F811
    result, out = replay(instance, run_configs, tmp_path)
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert _check(result).passed, _check(result).metadata["errors"]
    bench, _, _ = rec.benchmark_result(rec.slo(run_configs))
    queue = _alerts(out / "h200-rules.yml")["ModelQueueAboveSaturation"]
    assert queue["expr"].endswith(f"> {bench.saturation_concurrency}")
    docs = list(yaml.safe_load_all((out / "h200-operations.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["PrometheusRule", "PodMonitor", "PodMonitor",
                                         "ScaledObject"]
    assert docs[3]["spec"]["scaleTargetRef"]["name"] == \
        metadata(result, "kserve_manifest")["services"]["h200"] + "-predictor"
    assert (out / "h200-dashboard.json").is_file() and (out / "dcgm-counters.csv").is_file()
    assert "measured saturation concurrency" in metadata(result, "operations")["thresholds"]
    b300 = _alerts(out / "b300-rules.yml")  # every manifest's node type, its own GPU selector
    assert 'modelName=~"NVIDIA[- ]B300[- ]SXM6[- ]AC"' in b300["GPUXidError"]["expr"]


@pytest.mark.slow
def test_unmeasured_configuration_gets_no_measured_threshold_and_says_why(
        instance, repo_configs, tmp_path):  # noqa: F811
    result, out = replay(instance, repo_configs, tmp_path)
    assert result.success and _check(result).passed
    assert "ModelQueueAboveSaturation" not in _alerts(out / "h200-rules.yml")
    kinds = [d["kind"] for d in yaml.safe_load_all((out / "h200-operations.yaml").read_text())]
    assert "ScaledObject" not in kinds
    why = metadata(result, "operations")["not_rendered"]["h200"]["ScaledObject"]
    assert why.startswith("no benchmark at this configuration")
