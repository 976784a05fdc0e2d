"""Load-generator benchmark: our aiohttp client vs `vllm bench serve`, guidellm and aiperf.

All four drive the same fake OpenAI-compatible streaming server (tests/fakes/
openai_stream_server.py, a test fixture that records the true send times), one fresh server
process per (case, tool), tools interleaved and their order rotated per repeat. Each tool gets
`concurrency` warm-up requests (ours, vllm `--num-warmups`, aiperf `--warmup-request-count`;
guidellm has no count-based warm-up and runs without), excluded from its numbers. Printed per
case: each tool's own reported req/s, TTFT p50 and mean ITL, the server's truth, and ratios
against our client.

    .venv/bin/python bench/loadgen.py [--repeats 2] [--quick] [--json out.json]

Peers: `vllm bench serve` from .venv-engine; guidellm and aiperf in throwaway venvs
(.cache/venv-guidellm, .cache/venv-aiperf; `python3 -m venv D && D/bin/pip install
guidellm==0.8.1` / `aiperf==0.13.0`). A peer that is not installed is reported as such.
"""

from __future__ import annotations

import argparse
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

from onboarding.serving_stats import summarize
from resources.loadgen import LoadGenerator, completion_bodies
from tests.fakes.openai_stream_server import running_fake_server
from tests.hub_cache import seed_hub_cache

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
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
