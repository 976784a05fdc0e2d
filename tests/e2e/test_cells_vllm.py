"""One model on two node types at once: each (model, node type) cell keeps its own truth.

- `cpu`: measured here, by the real vLLM CPU engine (load timing and a reduced sweep).
- `h200`: replayed. What load_timing and serving_benchmark stored on an H200
  (tests/data/gpu/h200/, read back by bench/gpu_recordings.py) is stored as the h200 cell's
  measurements, labelled `replayed_from`; the real kserve_manifest, readiness and
  readiness_report run on it, as on the GPU node. The configs are the ones the H200 run had
  (its stack pin), so the h200 plan gives the configuration that was measured there.

Both cells end measured and judged, the fleet grid shows both, and re-running one cell leaves
every materialization of the other as it was (read from the instance's event log).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest

from assets.deploy import kserve_manifest, serving_config
from assets.partitions import cell_key
from assets.readiness import readiness
from assets.report import fleet_report, readiness_report
from assets.serving import load_timing, serving_benchmark
from bench import gpu_recordings as rec
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import VariantRef
from onboarding.quantize.variants import QuantizedSet
from resources.config_files import ConfigFiles, OutputDirs
from resources.engine import Engine
from resources.huggingface import HuggingFaceStore
from resources.loadgen import LoadGenerator
from resources.manifest_validator import ManifestValidator
from resources.s3 import S3ObjectStore
from resources.telemetry import GpuTelemetry
from resources.upstream import optional_upstream
from tests.dagster_support import register, store_upstream, upstream_specs

pytestmark = [pytest.mark.slow, pytest.mark.engine]

VLLM = PROJECT_ROOT / ".venv-engine" / "bin" / "vllm"
SMOL = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"
if not VLLM.is_file() or not (SMOL / "model.safetensors").is_file():
    pytest.skip(f"needs the engine venv ({VLLM}) and the model ({SMOL}): "
                "`bash scripts/dev.sh setup`", allow_module_level=True)

MODEL = rec.MODEL
ASSETS = [serving_config, load_timing, serving_benchmark, kserve_manifest, readiness,
          readiness_report, fleet_report,
          *upstream_specs("checkpoint", "serving_variant", "accuracy", "quantized",
                          "published_variant", "predictions", "served_accuracy",
                          "config_search")]
CELL_ASSETS = ("load_timing", "serving_benchmark", "kserve_manifest", "readiness",
               "readiness_report")
REPLAYED_FROM = "tests/data/gpu/h200"


def _resources(configs: ConfigFiles, outputs: OutputDirs, tmp_path: Path) -> dict:
    return {"configs": configs, "outputs": outputs, "optional_upstream": optional_upstream,
            "engine": Engine(hardware="cpu", log_dir=str(tmp_path / "logs"),
                             start_timeout_s=300, configs=configs),
            "loadgen": LoadGenerator(), "telemetry": GpuTelemetry(),
            "manifest_validator": ManifestValidator(),
            "s3": S3ObjectStore(endpoint_url="http://127.0.0.1:1", access_key_id="unused-id",
                                secret_access_key="unused"),
            "hf": HuggingFaceStore()}


def _recorded(name: str, value, node_type: str) -> dg.AssetsDefinition:
    @dg.asset(name=name, partitions_def=load_timing.partitions_def)
    def _asset():
        return dg.Output(value, metadata={"replayed_from": REPLAYED_FROM,
                                          "node_type": node_type})

    return _asset


def _replay(instance: dg.DagsterInstance, node_type: str, **values) -> None:
    """Store recorded values as the cell's own materializations, labelled as replayed."""
    register(instance, MODEL, node_type)
    assert dg.materialize([_recorded(n, v, node_type) for n, v in values.items()],
                          instance=instance,
                          partition_key=str(cell_key(MODEL, node_type))).success


def _node(verdict, node_type: str):
    [node] = verdict.nodes  # a cell judges its own node type and no other
    assert node.node_type == node_type
    return node


def _cell_records(instance: dg.DagsterInstance, node_type: str) -> dict[str, list[int]]:
    """Every materialization of the cell, as event log storage ids, per asset."""
    key = str(cell_key(MODEL, node_type))
    return {a: [r.storage_id for r in instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(a), asset_partitions=[key]),
        limit=100).records] for a in CELL_ASSETS}


def test_one_model_on_two_node_types_each_cell_measured_and_judged(tmp_path):
    configs = ConfigFiles(config_dir=str(rec.configs_at_run(tmp_path / "configs")),
                          discovered_dir=str(tmp_path / "discovered-specs"))
    outputs = OutputDirs(manifests_dir=str(tmp_path / "manifests"),
                         reports_dir=str(tmp_path / "reports"))
    weights = tmp_path / "smollm2"
    shutil.copytree(SMOL, weights)
    recorded = rec.serving_variant(tmp_path / "checkpoint")
    resources = _resources(configs, outputs, tmp_path)
    with dg.instance_for_test() as instance:
        register(instance, MODEL, "cpu")
        register(instance, MODEL, "h200")
        # the model's own stages, as fetched and gated on the H200; the served variant is the
        # same checkpoint (same bytes), held here where the CPU engine can read it
        store_upstream(instance, MODEL, checkpoint=rec.checkpoint(tmp_path / "checkpoint"),
                       serving_variant=VariantRef(MODEL, "bf16", str(weights),
                                                  recorded.total_bytes, recorded.content_hash,
                                                  recorded.weight_bytes),
                       accuracy=rec.accuracy(), quantized=QuantizedSet(MODEL, "", 1, ()),
                       published_variant=rec.published("B"))
        plan = dg.materialize(ASSETS, instance=instance, partition_key=MODEL,
                              selection=["serving_config"], resources=resources)
        assert plan.success
        assert plan.output_for_node("serving_config").config("h200").hash == \
            rec.RUN_CONFIG_HASH

        _replay(instance, "h200", load_timing=rec.load_timing_result(),
                serving_benchmark=rec.benchmark_result(rec.slo(configs))[0])
        h200 = dg.materialize(ASSETS, instance=instance,
                              partition_key=str(cell_key(MODEL, "h200")),
                              selection=["kserve_manifest", "readiness", "readiness_report"],
                              resources=resources)
        assert h200.success
        cpu = dg.materialize(
            ASSETS, instance=instance, partition_key=str(cell_key(MODEL, "cpu")),
            selection=list(CELL_ASSETS), resources=resources,
            run_config={"ops": {
                "load_timing": {"config": {"cold_repeats": 1, "cold_weights_repeats": 0,
                                           "warm_repeats": 0}},
                "serving_benchmark": {"config": {"concurrency": [1, 2],
                                                 "requests_per_point": 2}}}})
        assert cpu.success

        # both cells measured, each on its own node type
        assert cpu.output_for_node("serving_benchmark").node_type == "cpu"
        assert cpu.output_for_node("load_timing").cold_start_p95_s > 0
        replayed = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("serving_benchmark"),
                                  asset_partitions=[str(cell_key(MODEL, "h200"))]),
            limit=1).records[0].asset_materialization
        assert replayed.metadata["replayed_from"].value == REPLAYED_FROM

        # and judged: the h200 verdict rests on the H200's numbers at the measured
        # configuration; the cpu cell's on why a cpu cell is never deployed
        h200_manifest = h200.output_for_node("kserve_manifest")
        assert h200_manifest.config_hashes == {"h200": rec.RUN_CONFIG_HASH}
        assert h200_manifest.measured == {"h200": True}
        h200_verdict = _node(h200.output_for_node("readiness"), "h200")
        bench = rec.benchmark_result(rec.slo(configs))[0]
        assert h200_verdict.config_hash == rec.RUN_CONFIG_HASH
        assert not any("never measured" in r for r in h200_verdict.reasons)
        assert any("SLOs" in r for r in h200_verdict.reasons) == (not bench.slo_pass)
        cpu_verdict = _node(cpu.output_for_node("readiness"), "cpu")
        assert not cpu_verdict.ready
        assert "not a deployment target" in "; ".join(cpu_verdict.reasons)
        assert cpu.output_for_node("kserve_manifest").files == {}

        # the grid holds both cells at once
        grid = dg.materialize(ASSETS, instance=instance, selection=["fleet_report"],
                              resources=resources)
        rows = {(r.model, r.node_type): r for r in grid.output_for_node("fleet_report").rows}
        assert rows[(MODEL, "h200")].since is not None and rows[(MODEL, "cpu")].since is not None
        assert rows[(MODEL, "h200")].ready == h200_verdict.ready
        assert rows[(MODEL, "h200")].href == f"{MODEL}/h200/readiness.html"
        assert (outputs.reports / MODEL / "cpu" / "serving_benchmark.csv").is_file()

        # re-running one cell leaves the other's materializations as they were
        before_h200, before_cpu = _cell_records(instance, "h200"), _cell_records(instance,
                                                                                 "cpu")
        again = dg.materialize(ASSETS, instance=instance,
                               partition_key=str(cell_key(MODEL, "cpu")),
                               selection=["kserve_manifest", "readiness", "readiness_report"],
                               resources=resources)
        assert again.success
        assert _cell_records(instance, "h200") == before_h200
        after_cpu = _cell_records(instance, "cpu")
        for asset in ("kserve_manifest", "readiness", "readiness_report"):
            assert len(after_cpu[asset]) == len(before_cpu[asset]) + 1, asset
