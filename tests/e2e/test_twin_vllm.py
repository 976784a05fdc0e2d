"""A performance twin on the real engine: SmolLM2-135M's own config.json and tokenizer (no
weights) as a twin in the real SeaweedFS, through the graph to PyPI's vLLM CPU build started
with `--load-format dummy` (random weights): load timing (one cold start, handed off) and a
reduced chat sweep on it; then what the client asks the engine to do, against `vllm bench
serve`. Skipped, with the reason, when the engine venv or SmolLM2 has not been
built."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.checkpoint import checkpoint
from assets.deploy import serving_config
from assets.partitions import cell_key
from assets.quantize import accuracy, quantized, serving_variant
from assets.served_accuracy import served_accuracy
from assets.serving import load_timing, serving_benchmark
from onboarding.common.paths import PROJECT_ROOT
from onboarding.fetch.twins import NOT_A_WEIGHT_READ, twin_source_dir
from onboarding.serving.prompts import synthetic_prompts
from onboarding.serving.stats import summarize
from resources.engine import Engine
from resources.evaluator import LmEvalEvaluator
from resources.huggingface import HuggingFaceStore
from resources.loadgen import LoadGenerator, completion_bodies
from resources.nvme_cache import NvmeCache
from resources.quantizer import ModelOptQuantizer
from resources.telemetry import GpuTelemetry
from resources.upstream import optional_upstream
from tests.conftest import write_spec
from tests.dagster_support import Runs, metadata, register, upstream_specs
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
    register(instance, KEY, "cpu")
    assets = [checkpoint, quantized, accuracy, served_accuracy, serving_variant, serving_config,
              load_timing, serving_benchmark, *upstream_specs("predictions", "config_search")]
    resources = {"configs": configs, "outputs": outputs, "s3": s3_store,
                 "hf": HuggingFaceStore(), "optional_upstream": optional_upstream,
                 "nvme_cache": NvmeCache(root=str(tmp_path / "nvme"), reserve_gb=0),
                 "quantizer": ModelOptQuantizer(device="cpu", configs=configs),
                 "evaluator": LmEvalEvaluator(limit=8, configs=configs), "engine": engine,
                 "loadgen": LoadGenerator(), "telemetry": GpuTelemetry()}
    # the model's own stages, then its cpu cell's on the engine at hand
    model_run = dg.materialize(
        assets, partition_key=KEY, instance=instance, raise_on_error=False,
        selection=["checkpoint", "quantized", "accuracy", "serving_variant", "serving_config"],
        resources=resources)
    assert model_run.success, [e.message for e in model_run.all_events if e.is_failure]
    cell_run = dg.materialize(
        assets, partition_key=str(cell_key(KEY, "cpu")), instance=instance,
        raise_on_error=False,
        selection=["served_accuracy", "load_timing", "serving_benchmark"], resources=resources,
        run_config={"ops": {
            # one start (a twin reads no weights: its warm and cold-weights starts differ from
            # the cold one only in the page cache it does not use; the fake engine's tests
            # cover the three kinds on a twin), handed off to the benchmark
            "load_timing": {"config": {"cold_repeats": 1, "cold_weights_repeats": 0,
                                       "warm_repeats": 0}},
            "serving_benchmark": {"config": {"concurrency": [1, 4],
                                             "requests_per_point": 2}}}})
    result = Runs([model_run, cell_run])
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert not [f for f in result.output_for_node("checkpoint").files if "safetensors" in f]
    assert result.output_for_node("quantized").get("fp8").usable  # the marker, unserved here
    assert result.output_for_node("serving_variant").precision == "bf16"
    md = metadata(result, "load_timing")
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


# what `vllm bench serve ARGS` runs (vllm/entrypoints/cli/benchmark/serve.py: the subcommand's
# parser is `add_cli_args`, its command `main(args)`), as a snippet for tests/engine_python.py
VLLM_BENCH_SERVE = """
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args(argv))
"""

# what a request may carry that changes the work the engine does for it (vLLM's
# CompletionRequest sampling fields); a client may differ from the peer only in what it asks
# to be told (`stream_options`, `return_token_ids`), never here
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "n", "best_of", "seed",
                   "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs",
                   "prompt_logprobs", "ignore_eos", "min_tokens", "stop", "stop_token_ids",
                   "use_beam_search", "echo", "logit_bias", "guided_json", "response_format")
NO_OP = {"repetition_penalty": 1.0, "logprobs": None, "echo": False, "n": 1}


def _sampling(body: dict) -> dict:
    return {k: body[k] for k in SAMPLING_FIELDS if k in body and NO_OP.get(k, ...) != body[k]}


def test_the_client_asks_the_engine_for_the_same_work_as_vllm_bench_serve(tmp_path):
    """The load generator must not load the engine it measures: what each request asks the
    engine to do is what `vllm bench serve` asks, field by field.

    Why it matters, measured on the CPU engine (`bench/loadgen.py --real-engine`, the
    Llama-3.1-8B twin cut to 2 layers on random weights, docs/benchmarks.md): a client that
    forces temperature 0 made vLLM's API server spend 1.38-1.40x the CPU per token that `vllm
    bench serve` does (greedy decoding on random weights repeats ids with no text, and the
    incremental detokenizer re-decodes the whole request at every step); the client as shipped
    read 0.97-1.08x. That ratio moves by 10 % from run to run on a shared machine, so it is a
    benchmark's to print; the cause is a request field, and this test holds it. Both clients
    send to the fake server (bench/openai_stream_server.py), which keeps their bodies:
    `vllm bench serve`'s own parser and entry point, in the engine venv, with the serving
    benchmark's `count_tokens_by`, `ignore_eos` and lengths."""
    from transformers import AutoTokenizer

    from bench.openai_stream_server import running_fake_server

    model = twin_source_dir("llama-3-1-8b-instruct-twin", tmp_path / "twin")
    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    n, isl, osl = 4, 64, 8
    count = Engine(hardware="cpu").template().load_generator.count_tokens_by
    bodies = {}
    for name in ("ours", "vllm bench serve"):
        with running_fake_server() as url:
            if name == "ours":
                run = LoadGenerator(metrics_path="").run_point(
                    url, completion_bodies("twin", synthetic_prompts(tokenizer, n, isl, seed=1),
                                           osl, count_tokens_by=count),
                    concurrency=2, max_seconds=60, request_timeout_s=60)
                assert summarize(run.records, run.duration_s).completed == n
            else:
                engine_python().run(VLLM_BENCH_SERVE, *[
                    "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
                    "--model", "twin", "--tokenizer", str(model), "--dataset-name", "random",
                    "--random-input-len", str(isl), "--random-output-len", str(osl),
                    "--num-prompts", str(n), "--max-concurrency", "2", "--ignore-eos",
                    "--disable-tqdm", "--seed", "1", "--ready-check-timeout-sec", "0"])
            with urllib.request.urlopen(url + "/truth") as resp:
                bodies[name] = json.loads(resp.read())["bodies"]
    assert len(bodies["ours"]) == n and len(bodies["vllm bench serve"]) >= n
    peer = {json.dumps(_sampling(b), sort_keys=True) for b in bodies["vllm bench serve"]}
    assert len(peer) == 1, peer  # the peer asks the same of every request
    expected = json.loads(peer.pop())
    assert expected.get("ignore_eos") is True  # the comparison saw the shared flag
    for body in bodies["ours"]:
        assert _sampling(body) == expected, body
        assert body["stream"] and body["max_tokens"] == osl
        assert set(body) - {"model", "prompt", "max_tokens", "stream", "stream_options",
                            "return_token_ids", *SAMPLING_FIELDS} == set(), body
