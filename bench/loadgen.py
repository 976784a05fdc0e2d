"""Load-generator benchmark: our aiohttp client vs `vllm bench serve`, guidellm and aiperf.

Two modes. The fake-server mode (the default) compares the clients' own reports with a fake
server's ground truth. The real-engine mode (`--real-engine`) compares what our
client and `vllm bench serve` cost a real engine's frontend: see "Real-engine mode" below.

All four drive the same fake OpenAI-compatible streaming server (bench/openai_stream_server.py, a test fixture that records the true send times), one fresh server
process per (case, tool), tools interleaved and their order rotated per repeat. Each tool gets
`concurrency` warm-up requests (ours, vllm `--num-warmups`, aiperf `--warmup-request-count`;
guidellm has no count-based warm-up and runs without), excluded from its numbers. Printed per
case: each tool's own reported req/s, TTFT p50 and mean ITL, the server's truth, and ratios
against our client.

    .venv/bin/python bench/loadgen.py [--repeats 2] [--quick] [--json out.json]

Peers: `vllm bench serve` from .venv-engine; guidellm and aiperf in throwaway venvs
(.cache/venv-guidellm, .cache/venv-aiperf; `python3 -m venv D && D/bin/pip install
guidellm==0.8.1` / `aiperf==0.13.0`). A peer that is not installed is reported as such.

Real-engine mode: per concurrency, our client and `vllm bench serve` (random dataset, same
input/output lengths, ignore_eos) take turns on one engine, `--repeats` runs each (order
rotated, fresh prompts every run). Per run: req/s, TTFT, the client's mean ITL against the
engine's own ITL histogram over the run, and the API server's CPU (utime + stime of the
process that serves the port, /proc/<pid>/stat) per 1,000 tokens the engine generated (its
`vllm:generation_tokens_total`), with the whole engine tree's beside it. Printed: medians and
ratios against `vllm bench serve`. `--variants` adds our client with one ingredient swapped for
the peer's (bench-body, usage-at-end, no-accept, no-trace, asyncio, no-scrape)
to find which one costs the frontend; `ours:greedy` and `vllm bench serve:temperature-0` force
temperature 0, which on random weights makes vLLM's detokenizer re-decode every request's
prompt at every step.

    # the CPU engine, started here (SmolLM2-135M from .cache unless --model)
    .venv/bin/python bench/loadgen.py --real-engine --concurrency 16,64 --max-num-seqs 64 \
        --input-len 64 --output-len 64 --repeats 3
    # the Llama-3.1-8B twin's vocabulary and tokenizer, cut to 2 layers x 64, random weights
    .venv/bin/python bench/loadgen.py --real-engine --twin llama-3-1-8b-instruct-twin \
        --max-num-seqs 128 --concurrency 128 --input-len 512 --output-len 256 \
        --requests 256 --variants "vllm bench serve,ours,ours:greedy"
    # an engine already running (a GPU script started it): its URL and API-server pid
    python bench/loadgen.py --real-engine --engine-url http://127.0.0.1:8000 \
        --engine-pid "$(pgrep -f -o 'vllm serve')" --tokenizer /path/to/model \
        --concurrency 32,64,128,256 --input-len 512 --output-len 256 --requests 1024 \
        --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp

import resources.loadgen as loadgen_mod
from bench.hub_cache import seed_hub_cache
from bench.openai_stream_server import running_fake_server
from onboarding.serving.frontend import process_cpu_s, tree_cpu_s
from onboarding.serving.prompts import synthetic_prompts
from onboarding.serving.stats import histogram_mean_delta, parse_metrics, summarize
from resources.loadgen import LoadGenerator, completion_bodies

SMOL = ROOT / ".cache" / "smollm2-135m-instruct"
VLLM = ROOT / ".venv-engine" / "bin" / "vllm"
GUIDELLM = ROOT / ".cache" / "venv-guidellm" / "bin" / "guidellm"
AIPERF = ROOT / ".cache" / "venv-aiperf" / "bin" / "aiperf"
INPUT_TOKENS = 8
TOOL_TIMEOUT_S = 600
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
               "VLLM_NO_USAGE_STATS": "1", "GUIDELLM__DISABLE_TELEMETRY": "1"}


@dataclass(frozen=True)
class Case:
    name: str
    ttft_ms: float
    itl_ms: float
    concurrency: int
    output_tokens: int
    requests: int


@dataclass
class Measured:
    rps: float
    ttft_p50_ms: float
    itl_mean_ms: float
    completed: int


def _env() -> dict[str, str]:
    return {**os.environ, **OFFLINE_ENV}


def _run(argv: list[str], env: dict | None = None) -> None:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S,
                         env=env or _env(), check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} exited {out.returncode}: "
                           f"{(out.stdout + out.stderr)[-1500:]}")


def ours(url: str, c: Case, work: Path) -> Measured:
    prompts = [" ".join(["word"] * INPUT_TOKENS)] * (c.requests + c.concurrency)
    bodies = completion_bodies("fake", prompts, c.output_tokens)
    run = LoadGenerator().run_point(url, bodies[c.concurrency:], concurrency=c.concurrency,
                                    max_seconds=600, request_timeout_s=300,
                                    warmup_bodies=bodies[:c.concurrency])
    s = summarize(run.records, run.duration_s)
    return Measured(s.request_throughput_rps, s.ttft_s.p50 * 1e3, s.itl_ms.mean, s.completed)


def vllm_bench(url: str, c: Case, work: Path) -> Measured:
    _run([str(VLLM), "bench", "serve", "--backend", "vllm", "--base-url", url,
          "--endpoint", "/v1/completions", "--model", "fake", "--tokenizer", str(SMOL),
          "--dataset-name", "random", "--random-input-len", str(INPUT_TOKENS),
          "--random-output-len", str(c.output_tokens), "--num-prompts", str(c.requests),
          "--max-concurrency", str(c.concurrency), "--ignore-eos", "--disable-tqdm",
          "--num-warmups", str(c.concurrency),
          "--save-result", "--result-dir", str(work), "--result-filename", "vllm.json"])
    d = json.loads((work / "vllm.json").read_text())
    return Measured(d["request_throughput"], d["median_ttft_ms"], d["mean_itl_ms"],
                    d["completed"])


def guidellm(url: str, c: Case, work: Path) -> Measured:
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": str(SMOL),
                    "request_format": "/v1/completions"},
        "profile": {"kind": "concurrent", "streams": c.concurrency},
        "data": [{"kind": "synthetic_text", "prompt_tokens": INPUT_TOKENS,
                  "output_tokens": c.output_tokens}],
        "constraints": [{"kind": "max_requests", "count": c.requests}],
        "outputs": [{"kind": "json", "path": str(work / "guidellm.json")}]}}
    (work / "scenario.json").write_text(json.dumps(scenario))
    _run([str(GUIDELLM), "run", "--scenario", str(work / "scenario.json"),
          "--disable-console-interactive"])
    b = json.loads((work / "guidellm.json").read_text())["benchmarks"][0]
    m = b["metrics"]
    done = m["time_to_first_token_ms"]["successful"]["count"]
    return Measured(done / b["duration"], m["time_to_first_token_ms"]["successful"]["median"],
                    m["inter_token_latency_ms"]["successful"]["mean"], done)


def aiperf(url: str, c: Case, work: Path) -> Measured:
    # aiperf resolves tokenizers through the HF cache even offline: seed one with SmolLM2's.
    tok_dir, cache = work / "tok", work / "hf-cache"
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(SMOL / name, tok_dir / name)
    seed_hub_cache(cache, "local/smollm2", tok_dir)
    _run([str(AIPERF), "profile", "--model", "fake", "--tokenizer", "local/smollm2",
          "--url", url, "--endpoint-type", "completions", "--streaming",
          "--concurrency", str(c.concurrency), "--request-count", str(c.requests),
          "--isl", str(INPUT_TOKENS), "--osl", str(c.output_tokens),
          "--use-server-token-count", "--extra-inputs", "ignore_eos:true", "--ui", "none",
          "--warmup-request-count", str(c.concurrency),
          "--warmup-concurrency", str(c.concurrency),
          "--artifact-dir", str(work / "aiperf")], env={**_env(), "HF_HUB_CACHE": str(cache)})
    d = json.loads((work / "aiperf" / "profile_export_aiperf.json").read_text())
    return Measured(d["request_throughput"]["avg"], d["time_to_first_token"]["p50"],
                    d["inter_token_latency"]["avg"], int(d["request_count"]["avg"]))


TOOLS = {"ours (aiohttp)": (ours, None), "vllm bench serve": (vllm_bench, VLLM),
         "guidellm": (guidellm, GUIDELLM), "aiperf": (aiperf, AIPERF)}


def truth(url: str) -> tuple[float, float, int]:
    with urllib.request.urlopen(url + "/truth") as r:
        t = json.loads(r.read())
    itl = statistics.mean(t["itl_s"]) * 1e3 if t["itl_s"] else 0.0
    return statistics.median(t["ttft_s"]) * 1e3, itl, t["completed"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer requests per case")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--tools", default=",".join(TOOLS))
    real = ap.add_argument_group("real-engine mode")
    real.add_argument("--real-engine", action="store_true",
                      help="our client vs vllm bench serve on a real engine")
    real.add_argument("--engine-url", default=None,
                      help="an engine already running; default: start the CPU engine here")
    real.add_argument("--engine-pid", type=int, default=None,
                      help="with --engine-url: the pid of its API server (the process on the port)")
    real.add_argument("--served-name", default=None, help="default: the engine's /v1/models")
    real.add_argument("--model", default=str(SMOL), help="the CPU engine's model directory")
    real.add_argument("--tokenizer", default=None, help="default: --model")
    real.add_argument("--twin", default=None, help="a performance twin under twins/ (e.g. "
                      "llama-3-1-8b-instruct-twin): its vocabulary and tokenizer, 2 layers x 64, "
                      "random weights, on the CPU engine")
    real.add_argument("--max-num-seqs", type=int, default=64, help="the CPU engine's")
    real.add_argument("--concurrency", default="16,64")
    real.add_argument("--input-len", type=int, default=64)
    real.add_argument("--output-len", type=int, default=64)
    real.add_argument("--requests", type=int, default=0, help="per run; default 3 x concurrency")
    real.add_argument("--variants", default="ours,vllm bench serve",
                      help="clients, comma-separated: " + ", ".join([*OUR_VARIANTS,
                                                                     *BENCH_VARIANTS]))
    args = ap.parse_args()
    if args.real_engine:
        if args.engine_url and args.engine_pid is None:
            ap.error("--engine-url needs --engine-pid (its API server's pid)")
        real_main(args)
        return
    n = 600 if args.quick else 2000
    cases = [Case("zero-delay, c=64", 0, 0, 64, 256, n),
             Case("zero-delay, c=256", 0, 0, 256, 256, n),
             Case("TTFT 100 ms + ITL 20 ms, c=256", 100, 20, 256, 128, 768)]
    tools = [t for t in TOOLS if t in args.tools.split(",")]
    rows = []
    for rep in range(args.repeats):
        for case in cases:
            order = tools[rep % len(tools):] + tools[:rep % len(tools)]
            for tool in order:
                fn, exe = TOOLS[tool]
                row = {"repeat": rep, "case": case.name, "tool": tool}
                if exe is not None and not exe.exists():
                    rows.append({**row, "error": f"not installed ({exe})"})
                    continue
                with running_fake_server(ttft_ms=case.ttft_ms, itl_ms=case.itl_ms) as url, \
                        tempfile.TemporaryDirectory() as work:
                    t0 = time.perf_counter()
                    try:
                        m = fn(url, case, Path(work))
                    except (RuntimeError, OSError, KeyError, subprocess.TimeoutExpired) as exc:
                        rows.append({**row, "error": str(exc)[-300:]})
                        print(f"{case.name:32} {tool:18} FAILED {str(exc)[-200:]}", flush=True)
                        continue
                    true_ttft, true_itl, served = truth(url)
                row.update(rps=m.rps, ttft_p50_ms=m.ttft_p50_ms, itl_mean_ms=m.itl_mean_ms,
                           completed=m.completed, true_ttft_p50_ms=true_ttft,
                           true_itl_mean_ms=true_itl, served=served,
                           wall_s=time.perf_counter() - t0)
                rows.append(row)
                print(f"{case.name:32} {tool:18} {m.rps:8.1f} req/s  TTFT p50 "
                      f"{m.ttft_p50_ms:7.2f} ms (true {true_ttft:7.2f})  ITL {m.itl_mean_ms:7.3f}"
                      f" ms (true {true_itl:7.3f})  completed {m.completed}", flush=True)
    print_summary(rows, cases, tools)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def print_summary(rows: list[dict], cases: list[Case], tools: list[str]) -> None:
    ok = [r for r in rows if "error" not in r]
    print("\n| case | tool | req/s (median of repeats) | ours ÷ tool | TTFT p50 − true (ms) "
          "| mean ITL error vs true |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        mine = [r["rps"] for r in ok if r["case"] == case.name and r["tool"] == tools[0]]
        for tool in tools:
            rs = [r for r in ok if r["case"] == case.name and r["tool"] == tool]
            if not rs:
                err = next((r["error"] for r in rows if r["case"] == case.name
                            and r["tool"] == tool), "no result")
                print(f"| {case.name} | {tool} | failed: {err[:80]} | | | |")
                continue
            rps = statistics.median(r["rps"] for r in rs)
            ratio = statistics.median(mine) / rps if mine else float("nan")
            dttft = statistics.median(r["ttft_p50_ms"] - r["true_ttft_p50_ms"] for r in rs)
            if case.itl_ms:
                ierr = statistics.median(r["itl_mean_ms"] / r["true_itl_mean_ms"] - 1
                                         for r in rs)
                ierr_s = f"{ierr:+.2%}"
            else:
                ierr_s = "n/a (zero delay)"
            print(f"| {case.name} | {tool} | {rps:.1f} | {ratio:.2f}× | {dttft:+.2f} | "
                  f"{ierr_s} |")


# ---- real-engine mode: our client and `vllm bench serve` on one real engine ----

ENGINE_COUNTERS = {"generated": "vllm:generation_tokens_total", "prompt": "vllm:prompt_tokens_total",
                   "preemptions": "vllm:num_preemptions_total",
                   "requests": "vllm:request_success_total"}
ITL_HIST, TTFT_HIST = "vllm:inter_token_latency_seconds", "vllm:time_to_first_token_seconds"


@contextlib.contextmanager
def _swapped(**names):
    """Diagnostic only: one ingredient of our request path swapped for `vllm bench serve`'s,
    by replacing a private name of resources/loadgen.py for the run."""
    old = {k: getattr(loadgen_mod, k) for k in names}
    for k, v in names.items():
        setattr(loadgen_mod, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(loadgen_mod, k, v)


def _body_swap(**fields):
    """Our bodies with `fields` set."""
    def bodies(model, prompts, max_tokens):
        return [json.dumps({**json.loads(b), **fields}).encode()
                for b in completion_bodies(model, prompts, max_tokens)]
    return bodies


# What `vllm bench serve` sends beside the prompt and max_tokens (no temperature, as ours).
BENCH_BODY = {"repetition_penalty": 1.0, "logprobs": None,
              "stream_options": {"include_usage": True}}
# name -> (what it swaps, private names of resources/loadgen.py, body builder)
OUR_VARIANTS = {
    "ours": ("the client as shipped", {}, completion_bodies),
    "ours:bench-body": ("vllm bench serve's body fields", {},
                        _body_swap(**BENCH_BODY)),
    "ours:greedy": ("temperature 0 (greedy), as the client sent before it sampled", {},
                    _body_swap(temperature=0.0)),
    "ours:usage-at-end": ("usage only in the last chunk", {},
                          _body_swap(stream_options={"include_usage": True})),
    "ours:no-accept": ("no Accept: text/event-stream header",
                       {"_JSON_HEADERS": {"Content-Type": "application/json"}}, completion_bodies),
    "ours:no-trace": ("no on_request_chunk_sent trace hook",
                      {"_trace_config": aiohttp.TraceConfig}, completion_bodies),
    "ours:asyncio": ("asyncio's own event loop instead of uvloop", {"_run": asyncio.run},
                     completion_bodies),
    "ours:no-scrape": ("no /metrics scrapes (the benchmark reads the counters around the run)",
                       {}, completion_bodies),
}
# The peer as it runs by default (no temperature: the server samples by the model's
# generation_config), and forced greedy.
BENCH_VARIANTS = {"vllm bench serve": [], "vllm bench serve:temperature-0": ["--temperature", "0"]}


@dataclass
class Engine_:
    url: str
    pid: int
    served_name: str


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        return parse_metrics(r.read().decode())


def _served_name(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def _ours_run(eng: Engine_, variant: str, tok, a, c: int, seed: int) -> dict:
    _, names, bodies_of = OUR_VARIANTS[variant]
    prompts = synthetic_prompts(tok, a.requests or 3 * c, a.input_len, seed=seed)
    bodies = bodies_of(eng.served_name, prompts, a.output_len)
    with _swapped(**names):
        gen = LoadGenerator(metrics_path="" if variant == "ours:no-scrape" else "/metrics")
        run = gen.run_point(eng.url, bodies, concurrency=c, max_seconds=3600,
                            request_timeout_s=3600)
    s = summarize(run.records, run.duration_s)
    return {"rps": s.request_throughput_rps, "ttft_mean_ms": s.ttft_s.mean * 1e3,
            "itl_mean_ms": s.itl_ms.mean, "completed": s.completed, "failed": s.failed,
            "duration_s": run.duration_s}


def _bench_run(eng: Engine_, variant: str, tokenizer: str, a, c: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as work:
        _run([str(VLLM), "bench", "serve", "--backend", "vllm", "--base-url", eng.url,
              "--endpoint", "/v1/completions", "--model", eng.served_name,
              "--tokenizer", tokenizer, "--dataset-name", "random",
              "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
              "--num-prompts", str(a.requests or 3 * c), "--max-concurrency", str(c),
              "--ignore-eos", "--disable-tqdm", "--seed", str(seed), *BENCH_VARIANTS[variant],
              "--save-result", "--result-dir", work, "--result-filename", "r.json"])
        d = json.loads((Path(work) / "r.json").read_text())
    return {"rps": d["request_throughput"], "ttft_mean_ms": d["mean_ttft_ms"],
            "itl_mean_ms": d["mean_itl_ms"], "completed": d["completed"],
            "failed": d.get("failed"),
            "duration_s": d["duration"]}


def _measured(eng: Engine_, run) -> dict:
    """One client run against the engine's own counters and the API server's CPU."""
    m0, api0, tree0 = _metrics(eng.url), process_cpu_s(eng.pid), tree_cpu_s(eng.pid)
    r = run()
    m1, api1, tree1 = _metrics(eng.url), process_cpu_s(eng.pid), tree_cpu_s(eng.pid)
    delta = {k: m1.get(n, 0.0) - m0.get(n, 0.0) for k, n in ENGINE_COUNTERS.items()}
    gen = delta["generated"] or float("nan")
    itl = histogram_mean_delta(m0, m1, ITL_HIST)
    ttft = histogram_mean_delta(m0, m1, TTFT_HIST)
    return {**r, "api_cpu_s_per_1k": 1e3 * (api1 - api0) / gen,
            "tree_cpu_s_per_1k": 1e3 * (tree1 - tree0) / gen,
            "api_cpu_cores": (api1 - api0) / r["duration_s"],
            "engine_itl_mean_ms": itl * 1e3 if itl is not None else None,
            "engine_ttft_mean_ms": ttft * 1e3 if ttft is not None else None,
            "generated_tokens": delta["generated"],
            "prompt_tokens_per_request": delta["prompt"] / max(delta["requests"], 1),
            "preemptions": delta["preemptions"]}


def _cut_twin(twin_id: str, dest: Path) -> Path:
    """A performance twin's source (config.json + the twins' shared tokenizer) with its
    vocabulary kept and its body cut to 2 layers of width 64, so the CPU engine runs it on
    random weights: what the twin's tokens cost the frontend, not what its layers cost."""
    from onboarding.fetch.twins import twin_source_dir

    model = twin_source_dir(twin_id, dest)
    config = json.loads((model / "config.json").read_text())
    config.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                  num_attention_heads=1, num_key_value_heads=1, head_dim=64)
    (model / "config.json").write_text(json.dumps(config))
    return model


def _cpu_engine(a, stack: contextlib.ExitStack) -> Engine_:
    from onboarding.common.refs import VariantRef
    from onboarding.fetch.catalog import ArchitectureHint, ModelSpec
    from resources.engine import Engine

    engine = Engine(hardware="cpu", log_dir=str(Path(tempfile.gettempdir()) / "bench-loadgen"),
                    start_timeout_s=600)
    args = {"max_model_len": a.input_len + a.output_len + 64, "max_num_seqs": a.max_num_seqs}
    if a.twin:
        model = Path(a.model)
        spec = ModelSpec(id="bench-twin", source="s3://local/bench-twin/", served_name="bench",
                         weights="random", engine_args=args, architecture=ArchitectureHint(
                             params_billion=0.01, num_layers=2, num_kv_heads=1, head_dim=64))
        config = engine.local_config(spec, "bf16")
        variant = VariantRef(model=spec.id, precision="bf16", path=str(model), total_bytes=0,
                             content_hash="bench")
        running = stack.enter_context(engine.serve(variant, config))
    else:
        model = Path(a.model)
        size = sum(p.stat().st_size for p in model.glob("*.safetensors"))
        variant = VariantRef(model="bench-loadgen", precision="bf16", path=str(model),
                             total_bytes=size, content_hash="bench")
        running = stack.enter_context(engine.serve(variant, "bench", args))
    print(f"CPU engine on {running.base_url}, API server pid {running.pid}", flush=True)
    return Engine_(running.base_url, running.pid, running.served_name)


def real_main(a) -> None:
    from transformers import AutoTokenizer

    os.environ.update(OFFLINE_ENV)
    work = tempfile.TemporaryDirectory()
    if a.twin:
        if a.engine_url:
            raise SystemExit("--twin starts the CPU engine: leave out --engine-url")
        a.model = str(_cut_twin(a.twin, Path(work.name) / "twin"))
    tokenizer = a.tokenizer or a.model
    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    variants = a.variants.split(",")
    unknown = [v for v in variants if v not in OUR_VARIANTS and v not in BENCH_VARIANTS]
    if unknown:
        raise SystemExit(f"unknown --variants {unknown}; known: "
                         f"{', '.join([*OUR_VARIANTS, *BENCH_VARIANTS])}")
    rows = []
    with contextlib.ExitStack() as stack:
        if a.engine_url:
            eng = Engine_(a.engine_url.rstrip("/"), a.engine_pid,
                          a.served_name or _served_name(a.engine_url.rstrip("/")))
        else:
            eng = _cpu_engine(a, stack)
        for c in [int(x) for x in a.concurrency.split(",")]:
            for rep in range(a.repeats):
                order = variants[rep % len(variants):] + variants[:rep % len(variants)]
                for v in order:
                    seed = 1000 * c + 10 * rep + variants.index(v)
                    run = (functools.partial(_ours_run, eng, v, tok, a, c, seed)
                           if v in OUR_VARIANTS
                           else functools.partial(_bench_run, eng, v, tokenizer, a, c, seed))
                    row = {"concurrency": c, "repeat": rep, "client": v, **_measured(eng, run)}
                    rows.append(row)
                    print(json.dumps({k: round(x, 4) if isinstance(x, float) else x
                                      for k, x in row.items()}), flush=True)
    print_real_summary(rows, variants)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


def _med(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")


def _ratio(rows: list[dict], base: list[dict], key: str) -> str:
    return f"{_med(rows, key) / _med(base, key):.2f}×" if base else "–"


def print_real_summary(rows: list[dict], variants: list[str]) -> None:
    ref = next((v for v in variants if v in BENCH_VARIANTS), None)
    print(f"\nmedians per client; ratios against {ref!r} at the same concurrency\n")
    print("| c | client | runs | req/s | ÷ ref | API s/1k tok | ÷ ref | API cores | tree s/1k tok "
          "| TTFT ms | ÷ ref | mean ITL vs engine histogram | prompt tok/req | preemptions |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in sorted({r["concurrency"] for r in rows}):
        at = [r for r in rows if r["concurrency"] == c]
        base = [r for r in at if r["client"] == ref]
        for v in variants:
            rs = [r for r in at if r["client"] == v]
            if not rs:
                continue
            ratio = functools.partial(_ratio, rs, base)
            itl_err = statistics.median(r["itl_mean_ms"] / r["engine_itl_mean_ms"] - 1
                                        for r in rs if r.get("engine_itl_mean_ms"))
            print(f"| {c} | {v} | {len(rs)} | {_med(rs, 'rps'):.2f} | {ratio('rps')} | "
                  f"{_med(rs, 'api_cpu_s_per_1k'):.3f} | {ratio('api_cpu_s_per_1k')} | "
                  f"{_med(rs, 'api_cpu_cores'):.2f} | {_med(rs, 'tree_cpu_s_per_1k'):.3f} | "
                  f"{_med(rs, 'ttft_mean_ms'):.1f} | {ratio('ttft_mean_ms')} | {itl_err:+.1%} | "
                  f"{_med(rs, 'prompt_tokens_per_request'):.0f} | "
                  f"{_med(rs, 'preemptions'):.0f} |")


if __name__ == "__main__":
    main()
