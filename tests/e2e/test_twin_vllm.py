"""A performance twin on the real engine: SmolLM2-135M's own config.json and tokenizer (no
weights) as a twin in the real SeaweedFS, through the graph to PyPI's vLLM CPU build started
with `--load-format dummy` (random weights): load timing (one cold, one warm start) and a
reduced chat sweep. About 1.5 min on 2 cores (three engine starts). Skipped, with the reason,
when the engine venv or SmolLM2 has not been built."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.checkpoint import checkpoint
from assets.deploy import serving_config
from assets.partitions import models_partitions
from assets.quantize import accuracy, quantized, serving_variant
from assets.served_accuracy import served_accuracy
from assets.serving import load_timing, serving_benchmark
from onboarding.paths import PROJECT_ROOT
from onboarding.twins import NOT_A_WEIGHT_READ
from resources.engine import Engine
from resources.evaluator import LmEvalEvaluator
from resources.huggingface import HuggingFaceStore
from resources.loadgen import LoadGenerator
from resources.nvme_cache import NvmeCache
from resources.quantizer import ModelOptQuantizer
from resources.telemetry import GpuTelemetry
from resources.upstream import optional_upstream
from tests.conftest import write_spec

pytestmark = pytest.mark.slow

SMOL = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"
VLLM = PROJECT_ROOT / ".venv-engine" / "bin" / "vllm"
KEY = "smollm2-135m-twin"
ARCHITECTURE = {"params_billion": 0.135, "num_layers": 30, "num_attention_heads": 9,
                "num_kv_heads": 3, "head_dim": 64, "hidden_size": 576, "vocab_size": 49152,
                "tie_word_embeddings": True}

if not VLLM.is_file() or not (SMOL / "config.json").is_file():
    pytest.skip(f"needs the engine venv ({VLLM}, scripts/setup.sh) and SmolLM2's config and "
                f"tokenizer ({SMOL}, scripts/build_smollm2.py)", allow_module_level=True)


def test_the_cpu_engine_serves_a_twin_on_random_weights(config_dir, configs, outputs, tmp_path,
                                                         s3_store, unique_prefix):
    twin = tmp_path / "twin"
    twin.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja"):
        shutil.copy(SMOL / name, twin / name)
    s3_store.upload_dir(twin, "models", unique_prefix)
    write_spec(config_dir, KEY, f"s3://models/{unique_prefix}", weights="random",
               precision_ladder=["fp8", "bf16"], scenarios=["chat"], architecture=ARCHITECTURE,
               engine_args={"max_model_len": 1024, "max_num_seqs": 16})
    engine = Engine(hardware="cpu", log_dir=str(tmp_path / "logs"), start_timeout_s=300,
                    configs=configs)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("models", [KEY])
    result = dg.materialize(
        [checkpoint, quantized, accuracy, served_accuracy, serving_variant, serving_config,
         load_timing, serving_benchmark,
         dg.AssetSpec("predictions", partitions_def=models_partitions)],
        partition_key=KEY, instance=instance, raise_on_error=False,
        resources={"configs": configs, "outputs": outputs, "s3": s3_store,
                   "hf": HuggingFaceStore(), "optional_upstream": optional_upstream,
                   "nvme_cache": NvmeCache(root=str(tmp_path / "nvme"), reserve_gb=0),
                   "quantizer": ModelOptQuantizer(device="cpu", configs=configs),
                   "evaluator": LmEvalEvaluator(limit=8, configs=configs), "engine": engine,
                   "loadgen": LoadGenerator(), "telemetry": GpuTelemetry()},
        run_config={"ops": {
            "load_timing": {"config": {"cold_repeats": 1, "cold_weights_repeats": 0,
                                       "warm_repeats": 1}},
            "serving_benchmark": {"config": {"concurrency": [1, 4],
                                             "requests_per_point": 8}}}})
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert not [f for f in result.output_for_node("checkpoint").files if "safetensors" in f]
    assert result.output_for_node("quantized").get("fp8").usable  # the marker, unserved here
    assert result.output_for_node("serving_variant").precision == "bf16"
    md = {k: getattr(v, "value", v) for k, v in next(
        iter(result.asset_materializations_for_node("load_timing"))).metadata.items()}
    assert md["weight_load_phase"] == NOT_A_WEIGHT_READ and md["weights_load_gbps"] is None
    assert md["cold_start_p95_s"] > 0 and md["warm_start_p50_s"] > 0
    assert "--load-format=dummy" in md["engine_argv"]
    bench = result.output_for_node("serving_benchmark")
    assert bench.servable and bench.tokens_per_s_per_gpu > 0
    assert bench.config_hash == result.output_for_node("load_timing").config_hash == md[
        "config_hash"]
    logs = "\n".join(p.read_text(errors="replace") for p in Path(tmp_path / "logs").glob("*.log"))
    assert "load_format=dummy" in logs and "Loading weights took" not in logs
    print(yaml.safe_dump({"load_timing": {k: md[k] for k in (
        "cold_start_p50_s", "cold_start_p95_s", "warm_start_p50_s")},
        "tokens_per_s": bench.tokens_per_s_per_gpu, "config_hash": bench.config_hash}))
