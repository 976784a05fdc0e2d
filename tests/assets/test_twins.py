"""A performance twin through the graph in a real Dagster instance: the Llama-3.1-8B twin's
config.json and tokenizer fetched from the real SeaweedFS, Model Optimizer's export markers,
accuracy not applicable, the precision of the node at hand, `load_format: dummy` in its
configuration, its starts and sweep on the fake engine; publish and manifest refuse; never
ready. The model's own stages run keyed by the model, the measured ones in its (model, cpu)
cell, in the graph's order. The real vLLM CPU engine on a twin: tests/e2e/test_twin_vllm.py."""

from __future__ import annotations

import math
import shutil
import uuid
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.checkpoint import COMPLETE, INTACT, checkpoint
from assets.deploy import kserve_manifest, published_variant, serving_config
from assets.partitions import cell_key, cells_partitions, models_partitions
from assets.quantize import (
    QUANTIZED_PRECISIONS,
    SERVING_CHECK,
    accuracy,
    export_check_name,
    gate_check_name,
    quantized,
    serving_variant,
)
from assets.readiness import readiness
from assets.served_accuracy import PRECISIONS, agreement_check_name, served_accuracy
from assets.serving import (
    COLD_START_CHECK,
    SLO_CHECK,
    config_search,
    load_timing,
    serving_benchmark,
)
from bench.openai_stream_server import install_as_vllm
from onboarding.common.paths import PROJECT_ROOT
from onboarding.fetch.twins import (
    NO_WEIGHTS,
    NOT_A_WEIGHT_READ,
    NOT_APPLICABLE,
    NOT_READY,
    twin_source_dir,
)
from resources.config_files import ConfigFiles, OutputDirs
from resources.engine import Engine
from resources.evaluator import LmEvalEvaluator
from resources.huggingface import HuggingFaceStore
from resources.loadgen import LoadGenerator
from resources.manifest_validator import ManifestValidator
from resources.nvme_cache import NvmeCache
from resources.quantizer import ModelOptQuantizer
from resources.s3 import S3ObjectStore
from resources.telemetry import GpuTelemetry
from resources.upstream import optional_upstream
from tests.conftest import ACCESS_KEY, SECRET_KEY
from tests.dagster_support import Runs, level_of, metadata, register

# the twin through the graph in one instance, end to end
pytestmark = pytest.mark.slow

KEY = "llama-3-1-8b-instruct-twin"
ASSETS = [checkpoint, quantized, accuracy, served_accuracy, serving_variant, serving_config,
          config_search, load_timing, serving_benchmark, published_variant, kserve_manifest,
          readiness, dg.AssetSpec("predictions", partitions_def=models_partitions)]
# Up to serving_benchmark, one run per level in the graph's order (a run cannot mix per-model
# and per-cell stages; serving_variant reads every cell's served_accuracy)
UP_TO_BENCHMARK = [[checkpoint, quantized, accuracy], [served_accuracy],
                   [serving_variant, serving_config],
                   [config_search, load_timing, serving_benchmark]]
RUN_CONFIG = {"ops": {
    "load_timing": {"config": {"cold_repeats": 1, "cold_weights_repeats": 1, "warm_repeats": 1}},
    "serving_benchmark": {"config": {"concurrency": [1, 2], "requests_per_point": 4}}}}


@pytest.fixture(scope="module")
def twin(tmp_path_factory, s3_server):
    """One instance, the twin uploaded to the test server, the graph up to serving_benchmark
    run on the CPU 'node' with the fake engine; each test reads or extends it."""
    tmp = tmp_path_factory.mktemp("twin")
    config_dir = tmp / "configs"
    shutil.copytree(PROJECT_ROOT / "configs", config_dir, ignore=shutil.ignore_patterns("models"))
    (config_dir / "models").mkdir()
    prefix = f"t-{uuid.uuid4().hex[:10]}/{KEY}/"
    spec = yaml.safe_load((PROJECT_ROOT / "configs" / "models" / f"{KEY}.yaml").read_text())
    spec["source"] = f"s3://models/{prefix}"
    (config_dir / "models" / f"{KEY}.yaml").write_text(yaml.safe_dump(spec))
    s3 = S3ObjectStore(endpoint_url=s3_server.endpoint_url, access_key_id=ACCESS_KEY,
                       secret_access_key=SECRET_KEY, chunk_size_mb=1)
    s3.upload_dir(twin_source_dir(KEY, tmp / "source"), "models", prefix)
    configs = ConfigFiles(config_dir=str(config_dir), discovered_dir=str(tmp / "found"))
    fake_bin = install_as_vllm(tmp / "bin")
    resources = {
        "configs": configs, "s3": s3, "hf": HuggingFaceStore(),
        "outputs": OutputDirs(manifests_dir=str(tmp / "manifests"),
                              reports_dir=str(tmp / "reports")),
        "nvme_cache": NvmeCache(root=str(tmp / "nvme"), reserve_gb=0),
        "quantizer": ModelOptQuantizer(device="cpu", configs=configs),
        "evaluator": LmEvalEvaluator(limit=8, configs=configs),
        "engine": Engine(bin_dir=str(fake_bin), hardware="cpu", node_type="cpu",
                         start_timeout_s=30, log_dir=str(tmp / "logs"), configs=configs),
        "loadgen": LoadGenerator(), "telemetry": GpuTelemetry(),
        "manifest_validator": ManifestValidator(), "optional_upstream": optional_upstream}
    with dg.instance_for_test() as instance:
        results = []
        for selection in UP_TO_BENCHMARK:
            results.append(materialize(instance, resources, selection, run_config=RUN_CONFIG))
            if not results[-1].success:
                break
        yield instance, resources, Runs(results)


def materialize(instance: dg.DagsterInstance, resources: dict, selection: list,
                node_type: str = "cpu", run_config: dict | None = None):
    """`selection` (all of one level) keyed by the model, or by its (model, `node_type`) cell;
    the run config of the selected stages only."""
    names = {a.key.to_user_string() for a in selection}
    [level] = {level_of(n) for n in names}
    register(instance, KEY, node_type)
    ops = {k: v for k, v in (run_config or {}).get("ops", {}).items() if k in names}
    return dg.materialize(
        ASSETS, selection=selection, instance=instance, resources=resources,
        partition_key=str(cell_key(KEY, node_type)) if level == cells_partitions else KEY,
        run_config={"ops": ops} if ops else None, raise_on_error=False)


def run(twin, selection: list, node_type: str = "cpu", **resources):
    instance, base, _ = twin
    return materialize(instance, {**base, **resources}, selection, node_type)


def checks(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {f"{e.asset_key.to_user_string()}.{e.check_name}": e
            for e in result.get_asset_check_evaluations()}


def error(result, step: str) -> str:
    err, parts = result.failure_data_for_node(step).error, []
    while err is not None:
        parts.append(err.message)
        err = err.cause
    return "\n".join(parts)


def not_applicable(ev: dg.AssetCheckEvaluation) -> bool:
    """Neither a pass nor a blocking failure: a warning saying so."""
    return (not ev.passed and ev.severity == dg.AssetCheckSeverity.WARN
            and ev.metadata["status"].value == "not_applicable")


def test_the_twins_checkpoint_is_its_config_and_tokenizer_with_no_weights(twin):
    _, _, result = twin
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    ref = result.output_for_node("checkpoint")
    assert set(ref.files) == {"config.json", "tokenizer.json", "tokenizer_config.json",
                              "chat_template.jinja"}
    md = metadata(result, "checkpoint")
    assert md["weights"] == NO_WEIGHTS and md["weight_bytes"] == 0
    c = checks(result)
    assert c[f"checkpoint.{COMPLETE}"].passed and c[f"checkpoint.{INTACT}"].passed
    assert c[f"checkpoint.{COMPLETE}"].metadata["weights"].value == NO_WEIGHTS


def test_quantized_makes_the_export_markers_and_accuracy_is_not_applicable(twin):
    _, _, result = twin
    q = result.output_for_node("quantized")
    for precision, algo in (("nvfp4", "NVFP4"), ("fp8", "FP8")):
        v = q.get(precision)
        assert v.usable and v.stats["quant_algo"] == algo
        assert (Path(v.path) / "hf_quant_config.json").is_file()
        assert not list(Path(v.path).glob("*.safetensors"))
    c = checks(result)
    for precision in QUANTIZED_PRECISIONS:
        assert not_applicable(c[f"quantized.{export_check_name(precision)}"])
        gate = c[f"accuracy.{gate_check_name(precision)}"]
        assert not_applicable(gate) and gate.metadata["reason"].value == NOT_APPLICABLE
    for precision in PRECISIONS:
        assert not_applicable(c[f"served_accuracy.{agreement_check_name(precision)}"])
    report = result.output_for_node("accuracy")
    assert {g.precision: (g.passed, g.verdict) for g in report.gates} == {
        p: (False, "not_applicable") for p in ("nvfp4", "fp8", "bf16")}
    assert report.records == ()  # nothing was evaluated
    assert NOT_APPLICABLE in metadata(result, "accuracy")["accuracy_table"]


def test_on_a_node_type_nothing_plans_the_twin_is_measured_at_what_the_engine_serves(twin):
    _, _, result = twin
    ref = result.output_for_node("serving_variant")
    assert ref.precision == "bf16" and ref.weight_bytes == 0
    md = metadata(result, "serving_variant")
    assert md["accuracy_gate"] == NOT_APPLICABLE
    assert "cpu is no node type of the plan" in md["chosen_because"]
    assert checks(result)[f"serving_variant.{SERVING_CHECK}"].passed


def test_on_an_h200_the_twin_is_measured_at_the_plans_precision(twin):
    h200 = Engine(hardware="sm90", node_type="h200", configs=twin[1]["configs"])
    result = run(twin, [serving_variant], engine=h200)
    assert result.success
    ref = result.output_for_node("serving_variant")
    assert ref.precision == "fp8" and ref.path.endswith(".variants/fp8")
    assert "the plan serves fp8 on h200 (TP 1 fits" in metadata(
        result, "serving_variant")["chosen_because"]
    assert checks(result)[f"serving_variant.{SERVING_CHECK}"].passed


def test_the_twins_configurations_load_random_weights(twin):
    _, _, result = twin
    splan = result.output_for_node("serving_config")
    for nt in ("b300", "h200"):
        config = splan.config(nt)
        assert config.params["load_format"] == "dummy"
        assert "--load-format=dummy" in config.param_args
    assert (splan.config("b300").precision, splan.config("h200").precision) == ("nvfp4", "fp8")
    assert metadata(result, "serving_config")["weights_basis"].startswith("estimate")


def test_load_timing_measures_starts_and_says_no_weights_were_read(twin):
    _, _, result = twin
    t = metadata(result, "load_timing")
    assert t["weight_load_phase"] == NOT_A_WEIGHT_READ and t["weights"].startswith("random")
    assert t["weight_bytes"] == 0 and t["weights_load_gbps"] is None
    assert t["raw_read_gbps"] is None and t["cold_start_p95_s"] > 0
    assert "--load-format=dummy" in t["engine_argv"]
    timing = result.output_for_node("load_timing")
    assert timing.random_weights and timing.config_hash == t["config_hash"]
    cold = checks(result)[f"load_timing.{COLD_START_CHECK}"]
    assert not_applicable(cold) and NOT_A_WEIGHT_READ in cold.metadata["reason"].value
    assert math.isclose(cold.metadata["cold_start_p95_s"].value, timing.cold_start_p95_s)
    bench = result.output_for_node("serving_benchmark")
    assert bench.servable and bench.tokens_per_s_per_gpu > 0
    assert bench.config_hash == timing.config_hash
    assert checks(result)[f"serving_benchmark.{SLO_CHECK}"].severity == \
        dg.AssetCheckSeverity.WARN  # the cpu profile: a stand-in, as for any model


def test_publish_and_manifest_refuse_and_the_twin_is_never_ready(twin):
    published = run(twin, [published_variant])
    assert not published.success
    assert f"{NOT_READY}: random weights are nothing to publish" in error(
        published, "published_variant")
    # every cell: the one measured here, and the node types the plan serves it on
    for node_type in ("cpu", "h200", "b300"):
        manifest = run(twin, [kserve_manifest], node_type)
        assert not manifest.success, node_type
        why = error(manifest, "kserve_manifest")
        assert f"{NOT_READY}: no deployable manifest is rendered" in why, node_type
        assert not list(Path(twin[1]["outputs"].manifests, KEY).rglob("*.yaml"))
        verdict = run(twin, [readiness], node_type)
        assert verdict.success, node_type
        value = verdict.output_for_node("readiness")
        assert not value.ready and value.summary() == f"not ready: {NOT_READY}", node_type
        assert metadata(verdict, "readiness")["ready"] is False
