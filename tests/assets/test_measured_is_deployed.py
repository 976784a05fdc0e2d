"""What is deployed is what was measured, through the real assets in a real instance.

The engine is the fake engine fixture posing as vLLM on an H200 (no GPU here); everything else
is real: the serving plan, the published variant on the local S3 server (the model's run), the
load timing and benchmark that start the planned configuration, and the manifest that renders
it (the (model, h200) cell's run).
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.deploy import kserve_manifest, published_variant, serving_config
from assets.partitions import cell_key, models_partitions
from assets.serving import SLO_CHECK, load_timing, serving_benchmark
from bench.openai_stream_server import install_as_vllm
from onboarding.common.refs import CheckpointRef, VariantRef
from onboarding.quantize.variants import AccuracyReport, QuantizedSet, write_manifest
from resources.engine import Engine
from resources.huggingface import HuggingFaceStore
from resources.loadgen import LoadGenerator
from resources.manifest_validator import ManifestValidator
from resources.telemetry import GpuTelemetry
from resources.upstream import optional_upstream
from tests.conftest import tiny_with_smol_tokenizer, write_spec
from tests.dagster_support import Runs, metadata, register, upstream_specs

KEY = "tiny-model"
NODE_TYPE = "h200"  # the fake engine's (h200_engine)
RUN = {"ops": {
    "load_timing": {"config": {"cold_repeats": 1, "cold_weights_repeats": 0,
                               "warm_repeats": 0}},
    "serving_benchmark": {"config": {"concurrency": [1, 2], "requests_per_point": 4,
                                     "scenarios": ["chat"]}}}}


@pytest.fixture(autouse=True)
def short_rate_verdict(config_dir) -> None:
    """configs/search.yaml's h200 rate verdict made short for the fake engine: the gpu
    profile's verdict at the target rate still runs (p99, n stated) but in seconds, at 50 req/s
    and one run, not minutes (its own behaviour is tests/assets/test_serving.py's)."""
    search = yaml.safe_load((config_dir / "search.yaml").read_text())
    search["rate_verdict"]["node_types"][NODE_TYPE] = {
        "target_rate_rps": 50.0, "min_seconds": 0, "max_seconds": 30, "look_every": 100,
        "repeats": 1}
    (config_dir / "search.yaml").write_text(yaml.safe_dump(search))


@pytest.fixture
def model_dir(tiny_checkpoint, tmp_path) -> Path:
    """The tiny random Llama with SmolLM2's tokenizer and a cache manifest, as `checkpoint`
    leaves a verified entry."""
    d = tiny_with_smol_tokenizer(tiny_checkpoint, tmp_path / "cache" / KEY / "r1")
    write_manifest(d, "s3://models/tiny/", "r1")
    return d


@pytest.fixture
def h200_engine(tmp_path, monkeypatch, configs) -> Engine:
    """The fake engine as vLLM on an H200: hardware sm90, the pinned engine version."""
    monkeypatch.setenv("FAKE_TTFT_MS", "5")
    monkeypatch.setenv("FAKE_ITL_MS", "1")
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(tmp_path / "record.json"))
    return Engine(bin_dir=str(install_as_vllm(tmp_path / "bin")), hardware="sm90",
                  node_type="h200", start_timeout_s=30,
                  log_dir=str(tmp_path / "logs"), configs=configs,
                  engine_version=configs.stack().engine_version)


def stand_ins(path: Path):
    manifest = json.loads((path / "onboarding-manifest.json").read_text())

    @dg.asset(name="checkpoint", partitions_def=models_partitions)
    def _checkpoint() -> CheckpointRef:
        return CheckpointRef(model=KEY, source="s3://models/tiny/", revision="r1", path=str(path),
                             content_hash=manifest["content_hash"],
                             total_bytes=sum(f["size"] for f in manifest["files"]))

    @dg.asset(name="serving_variant", partitions_def=models_partitions)
    def _variant() -> VariantRef:
        size = sum(p.stat().st_size for p in path.glob("*.safetensors"))
        return VariantRef(KEY, "bf16", str(path), size, manifest["content_hash"], size)

    @dg.asset(name="quantized", partitions_def=models_partitions)
    def _quantized() -> QuantizedSet:
        return QuantizedSet(KEY, str(path), 1, ())

    @dg.asset(name="accuracy", partitions_def=models_partitions)
    def _accuracy() -> AccuracyReport:
        return AccuracyReport(KEY, (), ())

    return [_checkpoint, _variant, _quantized, _accuracy]


def run(instance, model_dir, engine, configs, outputs, s3_store):
    # The fake H200 is no accepted node; node qualification has its own tests
    # (tests/assets/test_serving.py), these are about what is measured and deployed.
    path = configs.path("scenarios.yaml")
    scenarios = yaml.safe_load(path.read_text())
    scenarios["profiles"]["gpu"]["require_node_acceptance"] = False
    path.write_text(yaml.safe_dump(scenarios))
    assets = [*stand_ins(model_dir), serving_config, published_variant, load_timing,
              serving_benchmark, kserve_manifest, *upstream_specs("predictions", "config_search")]
    resources = {"configs": configs, "outputs": outputs, "engine": engine,
                 "loadgen": LoadGenerator(), "telemetry": GpuTelemetry(), "s3": s3_store,
                 "hf": HuggingFaceStore(), "manifest_validator": ManifestValidator(),
                 "optional_upstream": optional_upstream}
    # The model's run first (plan, publish), then the (model, h200) cell's (time, benchmark,
    # render), as onboard_model and onboard_cell; the measuring config is the cell run's.
    register(instance, KEY, NODE_TYPE)
    model_run = dg.materialize(assets, instance=instance, partition_key=KEY,
                               selection=["checkpoint", "serving_variant", "quantized",
                                          "accuracy", "serving_config", "published_variant"],
                               raise_on_error=False, resources=resources)
    if not model_run.success:
        return Runs([model_run])
    cell_run = dg.materialize(assets, instance=instance,
                              partition_key=str(cell_key(KEY, NODE_TYPE)),
                              selection=["load_timing", "serving_benchmark", "kserve_manifest"],
                              run_config=RUN, raise_on_error=False, resources=resources)
    return Runs([model_run, cell_run])


def _normalized(args: list[str], model_path: str, port: int) -> list[str]:
    """The parts that must differ between a test node and a pod: where the model is, which
    port, which bind address."""
    out = ["<model>" if a == model_path else a for a in args]
    out = [a for a in out if not a.startswith("--host=")]
    return [a.replace(f"--port={port}", "--port=<port>") for a in out]


@pytest.mark.slow
def test_the_benchmarked_engine_command_is_the_rendered_container_args(
        config_dir, configs, outputs, model_dir, h200_engine, s3_store, tmp_path):
    write_spec(config_dir, KEY, "s3://models/tiny/", precision_ladder=["bf16"],
               scenarios=["chat"], engine_args={"max_model_len": 2048})
    instance = dg.DagsterInstance.ephemeral()
    result = run(instance, model_dir, h200_engine, configs, outputs, s3_store)
    assert result.success
    plan_hash = metadata(result, "serving_config")["config_hashes"]["h200"]
    timed, bench = metadata(result, "load_timing"), metadata(result, "serving_benchmark")
    assert timed["config_hash"] == bench["config_hash"] == plan_hash  # the planned one
    assert bench["rate_verdict"] == "met" and bench["rate_verdict_n"] >= 300  # gpu: at a rate

    record = json.loads((tmp_path / "record.json").read_text())  # the benchmark's start
    started = record["argv"][record["argv"].index("serve") + 1:]
    manifest = metadata(result, "kserve_manifest")
    docs = list(yaml.safe_load_all(Path(manifest["path_h200"]).read_text()))
    isvc = next(d for d in docs if d["kind"] == "InferenceService")
    model = isvc["spec"]["predictor"]["model"]
    port = int(next(a for a in started if a.startswith("--port=")).split("=")[1])
    assert _normalized(started, str(model_dir), port) == _normalized(
        model["args"], "/mnt/models", 8080)
    assert "--max-num-seqs=32" in model["args"]  # the plan's, benchmarked too
    assert {k: record["env"][k] for k in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK")} == {
        e["name"]: e["value"] for e in model["env"] if e["name"] in
        ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK")}

    labels, notes = isvc["metadata"]["labels"], isvc["metadata"]["annotations"]
    assert labels["model-onboarding.io/config-hash"] == plan_hash
    assert labels["model-onboarding.io/measured"] == "true"
    assert labels["model-onboarding.io/published"] == "true"
    published = metadata(result, "published_variant")
    assert model["storageUri"] == published["uri_bf16"]
    assert model["storageUri"].startswith("s3://model-serving/tiny-model/bf16/")
    # h200 has a node cache (deploy.yaml local_model_cache): the pod mounts the published
    # variant from it, so the startup window counts no pull
    assert "cached on the node by LocalModelCache: no pull" in notes[
        "model-onboarding.io/startup-probe"]
    assert isvc["metadata"]["annotations"]["serving.kserve.io/nodegroup"] == "h200-nvme-cache"
    assert f"at configuration {plan_hash}" in notes["model-onboarding.io/throughput"]
    slo = next(e for e in result.get_asset_check_evaluations() if e.check_name == SLO_CHECK)
    assert slo.passed and slo.severity == dg.AssetCheckSeverity.ERROR  # gpu: blocking
    assert slo.metadata["gate"].value.startswith("blocking (gpu profile")


@pytest.mark.slow
def test_a_missed_slo_in_the_gpu_profile_blocks_the_manifest(
        config_dir, configs, outputs, model_dir, h200_engine, s3_store):
    write_spec(config_dir, KEY, "s3://models/tiny/", precision_ladder=["bf16"],
               scenarios=["chat"], engine_args={"max_model_len": 2048},
               slo={"itl_mean_ms": 0.01})
    instance = dg.DagsterInstance.ephemeral()
    result = run(instance, model_dir, h200_engine, configs, outputs, s3_store)
    slo = next(e for e in result.get_asset_check_evaluations() if e.check_name == SLO_CHECK)
    assert not slo.passed and slo.severity == dg.AssetCheckSeverity.ERROR
    assert not result.success
    materialized = {e.asset_key.to_user_string()
                    for e in result.get_asset_materialization_events()}
    assert "serving_benchmark" in materialized and "kserve_manifest" not in materialized


def test_publishing_fills_this_nodes_kserve_cache_folder_without_a_download(
        config_dir, configs, outputs, model_dir, h200_engine, s3_store, tmp_path):
    """A node whose KServe cache root exists (deploy.yaml local_model_cache) gets the published
    variant in the agent's `models/<sha256[:16]>/` folder from the files just verified: the same
    inodes as the NVMe cache's (one copy per node), zero bytes over the wire, and the completion
    file the model pods wait for, so KServe's download Job later finds it filled."""
    from onboarding.deploy.kserve import CACHE_COMPLETE, agent_model_dir

    root = tmp_path / "kserve-cache"
    root.mkdir()
    path = configs.path("deploy.yaml")
    deploy = yaml.safe_load(path.read_text())
    for node in deploy["local_model_cache"]["node_types"].values():
        node["cache_root"] = str(root)
    path.write_text(yaml.safe_dump(deploy))
    write_spec(config_dir, KEY, "s3://models/tiny/", precision_ladder=["bf16"],
               scenarios=["chat"], engine_args={"max_model_len": 2048})
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("models", [KEY])
    result = dg.materialize(
        [*stand_ins(model_dir), serving_config, published_variant,
         *upstream_specs("predictions", "config_search")],
        partition_key=KEY, instance=instance, raise_on_error=False,
        resources={"configs": configs, "outputs": outputs, "s3": s3_store,
                   "optional_upstream": optional_upstream})
    assert result.success
    uri = metadata(result, "published_variant")["uri_bf16"]
    folder = Path(agent_model_dir(str(root), uri))
    assert (folder / CACHE_COMPLETE).is_file()
    weights = sorted(model_dir.glob("*.safetensors"))
    assert weights
    for w in weights:
        assert (folder / w.name).stat().st_ino == w.stat().st_ino  # hard link, no copy
    [row] = [r for r in metadata(result, "published_variant")["published"].split("\n")
             if "| bf16 |" in r]
    assert f"files in {folder}, 0 bytes fetched" in row
