"""A performance twin on the real engine: SmolLM2-135M's own config.json and tokenizer (no
weights) as a twin in the real SeaweedFS, through the graph to PyPI's vLLM CPU build started
with `--load-format dummy` (random weights): load timing (one cold start, handed off) and a
reduced chat sweep on it; then the client's cost to the API server against `vllm bench serve`
(its own start). Skipped, with the reason, when the engine venv or SmolLM2 has not been
built."""

from __future__ import annotations

import json
import shutil
import statistics
import urllib.request
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
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import VariantRef
from onboarding.fetch.catalog import ArchitectureHint, ModelSpec
from onboarding.fetch.twins import NOT_A_WEIGHT_READ, twin_source_dir
from onboarding.serving.frontend import process_cpu_s
from onboarding.serving.prompts import synthetic_prompts
from onboarding.serving.stats import parse_metrics, summarize
from resources.engine import Engine
from resources.evaluator import LmEvalEvaluator
from resources.huggingface import HuggingFaceStore
from resources.loadgen import LoadGenerator, completion_bodies
from resources.nvme_cache import NvmeCache
from resources.quantizer import ModelOptQuantizer
from resources.telemetry import GpuTelemetry
from resources.upstream import optional_upstream
from tests.conftest import write_spec
from tests.engine_python import engine_python

pytestmark = [pytest.mark.slow, pytest.mark.engine]

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
            # one start (a twin reads no weights: its warm and cold-weights starts differ from
            # the cold one only in the page cache it does not use; the fake engine's tests
            # cover the three kinds on a twin), handed off to the benchmark
            "load_timing": {"config": {"cold_repeats": 1, "cold_weights_repeats": 0,
                                       "warm_repeats": 0}},
            "serving_benchmark": {"config": {"concurrency": [1, 4],
                                             "requests_per_point": 2}}}})
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert not [f for f in result.output_for_node("checkpoint").files if "safetensors" in f]
    assert result.output_for_node("quantized").get("fp8").usable  # the marker, unserved here
    assert result.output_for_node("serving_variant").precision == "bf16"
    md = {k: getattr(v, "value", v) for k, v in next(
        iter(result.asset_materializations_for_node("load_timing"))).metadata.items()}
    assert md["weight_load_phase"] == NOT_A_WEIGHT_READ and md["weights_load_gbps"] is None
    assert md["cold_start_p95_s"] > 0
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


def _generated_tokens(base_url: str) -> float:
    with urllib.request.urlopen(base_url + "/metrics") as resp:
        return parse_metrics(resp.read().decode())["vllm:generation_tokens_total"]


# what `vllm bench serve ARGS` runs (vllm/entrypoints/cli/benchmark/serve.py: the subcommand's
# parser is `add_cli_args`, its command `main(args)`), as a snippet for tests/engine_python.py
VLLM_BENCH_SERVE = """
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args(argv))
"""


def _api_cpu_s_per_1k_tokens(running, client, seed: int) -> float:
    """The API server's CPU seconds (utime + stime of the process on the port) per 1,000
    tokens the engine generated while `client` ran (the engine's own counter, so both clients
    are counted alike)."""
    tokens, cpu_s = _generated_tokens(running.base_url), process_cpu_s(running.pid)
    client(seed)
    return 1e3 * (process_cpu_s(running.pid) - cpu_s) / (
        _generated_tokens(running.base_url) - tokens)


@pytest.mark.alone  # a neighbour's load moved the ratio past 1.2 (1.22 measured beside one)
def test_the_client_costs_the_api_server_no_more_per_token_than_vllm_bench_serve(tmp_path):
    """On the CPU engine: the load generator must not load the engine it measures.

    The issue's twin, Llama-3.1-8B-Instruct's config (vocab 128,256) with the twins' shared
    tokenizer (SmolLM2's, 49,152 ids), on random weights, cut to 2 layers of width 64 so the
    CPU runs it. Greedy decoding on random weights repeats one or two ids per request, and for
    about half the prompts those ids have no token in the tokenizer: no text ever comes out, and
    vLLM's incremental detokenizer then re-decodes the whole prompt plus everything generated at
    every step. A client that forces temperature 0 makes the frontend do that work; `vllm bench
    serve` sends no temperature (the server samples by the model's default) and does not.

    The same load from both (64 at a time, 64 requests, 896 tokens in, 128 out, ignore_eos),
    taking turns, three runs each, the client counting tokens as the serving benchmark does
    (the engine template's `load_generator.count_tokens_by`). Tolerance 1.2x on the medians
    (target 1.1x). At 64 at a time (2026-12-05, two test runs each, this 2-core machine
    otherwise idle) the client sending temperature 0 measured 1.40x and 1.38x, the client as
    shipped 1.01x and 0.97x. At 128 at a time, as the test ran before (twice as long), greedy
    measured 1.30-1.31x, the client 1.05-1.08x counting by continuous usage and 1.04x by token
    ids (2026-12-03). Fewer requests keep each one's work, and so the ratio; 64 output tokens
    instead of 128 did not (greedy read 1.14x: the re-decoding grows with every step). Single
    runs move by up to 10 %. No wall time is asserted."""
    from transformers import AutoTokenizer

    model = twin_source_dir("llama-3-1-8b-instruct-twin", tmp_path / "twin")
    config = json.loads((model / "config.json").read_text())
    config.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                  num_attention_heads=1, num_key_value_heads=1, head_dim=64)
    (model / "config.json").write_text(json.dumps(config))
    engine = Engine(hardware="cpu", log_dir=str(tmp_path / "logs"), start_timeout_s=300)
    spec = ModelSpec(id="llama-twin-cut", source="s3://local/llama-twin-cut/",
                     served_name="twin", weights="random",
                     engine_args={"max_model_len": 1024, "max_num_seqs": 128},
                     architecture=ArchitectureHint(params_billion=0.01, num_layers=2,
                                                   num_kv_heads=1, head_dim=64))
    variant = VariantRef(model=spec.id, precision="bf16", path=str(model), total_bytes=0,
                         content_hash="twin")
    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    n, c, isl, osl = 64, 64, 896, 128
    count = engine.template().load_generator.count_tokens_by  # as the serving benchmark sends

    with engine.serve(variant, engine.local_config(spec, "bf16")) as running:
        def ours(seed: int) -> None:
            prompts = synthetic_prompts(tokenizer, n, isl, seed=seed)
            run = LoadGenerator().run_point(running.base_url,
                                            completion_bodies("twin", prompts, osl,
                                                              count_tokens_by=count),
                                            concurrency=c, max_seconds=600,
                                            request_timeout_s=600)
            assert summarize(run.records, run.duration_s).completed == n

        def vllm_bench(seed: int) -> None:
            # `vllm bench serve`'s own argument parser and entry point, in the session's one
            # engine Python rather than a fresh `vllm` process per run: the same client code,
            # without importing vLLM again for each of the three runs (about 10 s each here)
            engine_python().run(VLLM_BENCH_SERVE, *[
                "--backend", "vllm", "--base-url",
                running.base_url, "--endpoint", "/v1/completions", "--model", "twin",
                "--tokenizer", str(model), "--dataset-name", "random",
                "--random-input-len", str(isl), "--random-output-len", str(osl),
                "--num-prompts", str(n), "--max-concurrency", str(c), "--ignore-eos",
                "--disable-tqdm", "--seed", str(seed), "--save-result",
                "--result-dir", str(tmp_path), "--result-filename", f"bench-{seed}.json"])
            assert json.loads((tmp_path / f"bench-{seed}.json").read_text())["completed"] == n

        figures: dict[str, list[float]] = {"ours": [], "vllm bench serve": []}
        for i in range(3):
            turns = [("ours", ours), ("vllm bench serve", vllm_bench)]
            for name, client in turns if i % 2 == 0 else turns[::-1]:
                figures[name].append(_api_cpu_s_per_1k_tokens(running, client, 100 + i))
    ratio = statistics.median(figures["ours"]) / statistics.median(figures["vllm bench serve"])
    print(json.dumps({"count_tokens_by": count, "api_server_cpu_s_per_1k_tokens": figures,
                      "ratio": ratio}))
    assert ratio <= 1.2, figures
