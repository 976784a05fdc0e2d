"""Noisy-neighbour check on a 2-GPU H200: two engines side by side through the rendered
launchers, each alone and then both under load, and whether either's SLO numbers degrade
beyond a stated bound.

The layout is planned by the project's own code (onboarding.layouts.placement) on a two-GPU H200 node
(one NUMA node per GPU here, since the machine's topology is not known in advance), and
the engines start from the launchers onboarding.layouts.render writes: CUDA_VISIBLE_DEVICES
isolation, the fixed --gpu-memory-utilization, numactl where the machine has it. The models are
performance twins: a config.json and tokenizer (`--model-dir`), weights random
(`--load-format dummy`) unless safetensors are there. The gateway (LiteLLM) runs only where
`litellm` is importable; otherwise the engines are loaded on their own ports and the JSON says
so.

On the GPU machine, from the repository root (vLLM 0.22 under /tmp/site, as docs/gpu.md,
"Making a recording", installs it):

    PYTHONPATH=/tmp/site:. python3 scripts/gpu_noisy_neighbour.py --model-dir /tmp/twin \\
        --params-billion 1.07 --out $OUT

`--dry-run` plans and renders the launchers only (no engine, no GPU): what the CPU tests run.
Results: $OUT/noisy_neighbour.json and $OUT/layout/ (the rendered files and engine logs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onboarding.common.paths import DEFAULT_CONFIG_DIR
from onboarding.common.processes import reap_group
from onboarding.deploy.kserve import load_deploy
from onboarding.deploy.plan import (
    Measured,
    load_nodes,
    param_count_from_safetensors,
    plan_inputs,
    shape_from_checkpoint,
)
from onboarding.fetch.catalog import ArchitectureHint, ModelSpec
from onboarding.layouts.placement import Layout, layout_entries, load_layouts, plan_layout
from onboarding.layouts.render import render_layout, write_layout_files
from onboarding.serving.profiles import load_slo_section
from onboarding.serving.stack import load_stack

NODE = "h200x2"
LAYOUT = "h200x2-pair"
MODELS = ("twin-a", "twin-b")


def twin_spec(model_id: str, model_dir: Path, params_billion: float, context: int) -> ModelSpec:
    cfg = json.loads((model_dir / "config.json").read_text())
    shape = shape_from_checkpoint(model_dir)
    hint = ArchitectureHint(params_billion=params_billion, num_layers=shape.num_layers,
                            num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                            num_attention_heads=shape.num_attention_heads,
                            hidden_size=cfg.get("hidden_size"), vocab_size=cfg.get("vocab_size"),
                            tie_word_embeddings=bool(cfg.get("tie_word_embeddings")))
    return ModelSpec(id=model_id, source=f"s3://models/{model_id}/", served_name=model_id,
                     plan_only=True, precision_ladder=["bf16"], architecture=hint,
                     engine_args={"max_model_len": context}, slo={"target_concurrency": 32})


def plan_pair(model_dir: Path, params_billion: float, context: int):
    """The project's planner on a two-GPU H200: one twin per GPU."""
    nodes = load_nodes(DEFAULT_CONFIG_DIR / "nodes.yaml")
    h200 = nodes.node_types["h200"]
    nodes = nodes.model_copy(update={"node_types": {**nodes.node_types, NODE: h200.model_copy(
        update={"gpus_per_node": 2, "numa_gpus": [[0], [1]]})}})
    cfg = load_layouts(DEFAULT_CONFIG_DIR / "layouts.yaml")
    rule = cfg.throughput_rule.model_copy(update={"node_types": {
        **cfg.throughput_rule.node_types, NODE: cfg.throughput_rule.node_types["h200"]}})
    layout = Layout(node_type=NODE, description="noisy-neighbour pair", models=[
        {"model": m, "traffic_share": 0.5, "qos": "latency-critical", "tensor_parallel": [1]}
        for m in MODELS])
    cfg = cfg.model_copy(update={"throughput_rule": rule, "layouts": {LAYOUT: layout}})
    specs = {m: twin_spec(m, model_dir, params_billion, context) for m in MODELS}
    params = param_count_from_safetensors(model_dir)
    inputs = {m: plan_inputs(s, nodes, shape_from_checkpoint(model_dir), Measured(), params)
              for m, s in specs.items()}
    entries = layout_entries(layout, specs, inputs,
                             load_slo_section(DEFAULT_CONFIG_DIR / "gates.yaml"), {})
    plan = plan_layout(LAYOUT, layout, entries, cfg, nodes)
    if not plan.feasible:
        raise SystemExit(f"the pair does not fit: {plan.reason}")
    rendered = render_layout(plan, specs, inputs, cfg, nodes,
                             load_stack(DEFAULT_CONFIG_DIR / "stack.yaml"),
                             load_deploy(DEFAULT_CONFIG_DIR / "deploy.yaml"))
    return plan, rendered


def start(script: Path, model_dir: Path, vllm: str, log: Path) -> subprocess.Popen:
    dummy = "" if any(model_dir.glob("*.safetensors")) else "--load-format dummy"
    env = {**os.environ, "VLLM": vllm, "MODEL_PATH": str(model_dir),
           "ENGINE_EXTRA_ARGS": f"{dummy} --tokenizer {model_dir}".strip(),
           "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    if shutil.which("numactl") is None:
        env["NUMACTL"] = ""  # the launcher's binding needs numactl; said in the result
    return subprocess.Popen(["bash", str(script)], env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(port: int, proc: subprocess.Popen, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"engine on port {port} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return time.monotonic() - t0
        except OSError:
            time.sleep(2)
    raise SystemExit(f"engine on port {port} not ready within {timeout_s:.0f} s")


def bench(vllm: str, port: int, model: str, model_dir: Path, args, result: Path) -> dict:
    cmd = [*vllm.split(), "bench", "serve", "--backend", "vllm",
           "--base-url", f"http://127.0.0.1:{port}", "--model", model,
           "--tokenizer", str(model_dir), "--dataset-name", "random",
           "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
           "--num-prompts", str(args.prompts), "--max-concurrency", str(args.concurrency),
           "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,95,99",
           "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name]
    subprocess.run(cmd, check=True, timeout=1800, capture_output=True)
    data = json.loads(result.read_text())
    return {k: data.get(k) for k in ("p95_ttft_ms", "mean_itl_ms", "mean_tpot_ms",
                                     "output_throughput", "completed")}


def degradation(alone: dict, together: dict, bound: float) -> dict:
    ratios = {k: together[k] / alone[k] for k in ("p95_ttft_ms", "mean_itl_ms") if alone[k]}
    return {"ratios": ratios, "bound": 1 + bound,
            "within": all(r <= 1 + bound for r in ratios.values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--params-billion", type=float, required=True)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "noisy-out")))
    ap.add_argument("--vllm", default="python3 -m vllm.entrypoints.cli.main")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--bound", type=float, default=0.10,
                    help="allowed relative rise of TTFT p95 and mean ITL under the neighbour")
    ap.add_argument("--ready-timeout-s", type=float, default=900)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    plan, rendered = plan_pair(args.model_dir, args.params_billion, args.context)
    directory = write_layout_files(args.out / "layout", plan, rendered)
    summary = {"placements": {p.model: {"gpus": list(p.gpu_ids), "port": p.port,
                                        "gpu_memory_utilization": p.gpu_memory_utilization}
                              for p in plan.placements},
               "numactl": shutil.which("numactl") is not None,
               "gateway": "not run: engines loaded on their own ports (no litellm on the device)"}
    if args.dry_run:
        print(json.dumps(summary, indent=1))
        return 0
    procs = {}
    try:
        for p in plan.placements:
            procs[p.model] = start(directory / "launchers" / f"{p.model}.sh", args.model_dir,
                                   args.vllm, args.out / f"engine-{p.model}.log")
        summary["ready_s"] = {p.model: round(wait_ready(p.port, procs[p.model],
                                                        args.ready_timeout_s), 1)
                              for p in plan.placements}
        ports = {p.model: p.port for p in plan.placements}

        def run(model: str, tag: str) -> dict:
            return bench(args.vllm, ports[model], model, args.model_dir, args,
                         args.out / f"bench-{model}-{tag}.json")

        alone = {m: run(m, "alone") for m in MODELS}
        with ThreadPoolExecutor(2) as pool:
            together = dict(zip(MODELS, pool.map(lambda m: run(m, "together"), MODELS),
                                strict=True))
        summary.update(alone=alone, together=together, verdict={
            m: degradation(alone[m], together[m], args.bound) for m in MODELS})
    finally:
        for proc in procs.values():
            reap_group(proc)
    (args.out / "noisy_neighbour.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0 if all(v["within"] for v in summary["verdict"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
