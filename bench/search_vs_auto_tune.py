"""The measured configuration search against vLLM's own tuner on the same engine and model.

vLLM ships `benchmarks/auto_tune/auto_tune.sh` in its source tree (not in the wheel): for each
max-num-seqs x max-num-batched-tokens it starts `vllm serve`, sends `vllm bench serve` at an
infinite rate (1,000 prompts), and where the P99 end-to-end latency is over
MAX_LATENCY_ALLOWED_MS walks the request rate down one request/s at a time (100 prompts each);
the best is the highest throughput that met the bound, then a profiled run of it. It judges one
P99 of 100 or 1,000 requests with no interval; the search here judges TTFT and TPOT at p99 as
Clopper-Pearson questions at a Poisson rate, repeated (onboarding/serving/rate_verdict.py).

    peer    (on the GPU machine) the upstream script, set up the way its README says (the
            variables at its top), on the twin's variant directory, with these edits: no
            `--disable-log-requests` (vLLM 0.22's `vllm serve` has no such flag: request logs
            are off unless --enable-log-requests), and its `pkill -if vllm` replaced by ending
            the process group of the server it started (nothing else on the machine is
            touched). Timed line by line; writes <out>/peer.json.
    report  the search's record (search.json) and the peer's (peer.json): the configuration
            each found, and the wall time each took, with the ratio.

    python3 bench/search_vs_auto_tune.py peer --script auto_tune.sh --model DIR --out DIR \\
        [--seqs "32 64"] [--tokens "2048 8192"] [--in 512 --out-len 256] [--max-e2el-ms MS] \\
        [--deadline-s S]
    .venv/bin/python bench/search_vs_auto_tune.py report tests/data/gpu/config-search
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

RESULT_LINE = re.compile(r"max_num_seqs: (\d+), max_num_batched_tokens: (\d+), request_rate: "
                         r"(\S+), e2el: (\S+), throughput: (\S+), goodput: (\S*)")
MISSED_LINE = re.compile(r"max_num_seqs: (\d+), max_num_batched_tokens: (\d+) does not meet")
BEST_LINE = re.compile(r"best_max_num_seqs: (\d+), best_num_batched_tokens: (\d+), "
                       r"best_throughput: ([0-9.]+)")
# The upstream lines this runner changes (each must be found, or the script changed upstream)
EDITS = (
    ('        "--disable-log-requests"\n', ""),
    ("    local server_pid=$!\n", "    server_pid=$!\n"),
    ('            vllm serve "${common_args_array[@]}"',
     '            setsid vllm serve "${common_args_array[@]}"'),
    ("    pkill -if vllm\n", "    stop_server\n"),
    ("\npkill -if vllm\n", "\nstop_server\n"),
)
STOP_SERVER = """
stop_server() {  # the server this script started, its whole process group
    if [[ -n "${server_pid:-}" ]]; then
        kill -TERM -- "-$server_pid" 2>/dev/null
        for _ in $(seq 1 30); do kill -0 "$server_pid" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$server_pid" 2>/dev/null
        server_pid=""
    fi
}
trap 'stop_server; exit 143' TERM
trap stop_server EXIT
"""


def configured(text: str, a: argparse.Namespace) -> str:
    """The upstream script with its variables set for this model and the edits above."""
    values = {"MODEL": a.model, "SYSTEM": "GPU", "TP": "1", "INPUT_LEN": str(a.in_len),
              "OUTPUT_LEN": str(a.out_len), "MAX_MODEL_LEN": str(a.max_model_len),
              "MIN_CACHE_HIT_PCT": "0", "MAX_LATENCY_ALLOWED_MS": str(a.max_e2el_ms),
              "NUM_SEQS_LIST": a.seqs, "NUM_BATCHED_TOKENS_LIST": a.tokens}
    for name, value in values.items():
        text, n = re.subn(rf"^{name}=.*$", f'{name}="{value}"', text, count=1,
                          flags=re.MULTILINE)
        if n != 1:
            raise SystemExit(f"the upstream script has no {name}= line")
    for old, new in EDITS:
        if old not in text:
            raise SystemExit(f"the upstream script has no {old.strip()!r}: it changed")
        text = text.replace(old, new)
    return text.replace("\nbest_throughput=0\n", f"\n{STOP_SERVER}\nbest_throughput=0\n", 1)


def peer(a: argparse.Namespace) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # BASE is three levels above the script and the script `cd`s into $BASE/vllm
    root = Path(a.work)
    here = root / "vllm" / "benchmarks" / "auto_tune"
    here.mkdir(parents=True, exist_ok=True)
    (here / "auto_tune.sh").write_text(configured(Path(a.script).read_text(), a))
    env = {**os.environ, "PIP_NO_INDEX": "1"}  # its `pip install datasets`: no registry here
    log = out / "peer-log.txt"
    rec: dict = {"script": a.script_source, "edits": [[o, n] for o, n in EDITS],
                 "variables": {"MODEL": a.model, "INPUT_LEN": a.in_len, "OUTPUT_LEN": a.out_len,
                               "MAX_MODEL_LEN": a.max_model_len,
                               "MAX_LATENCY_ALLOWED_MS": a.max_e2el_ms,
                               "NUM_SEQS_LIST": a.seqs, "NUM_BATCHED_TOKENS_LIST": a.tokens},
                 "deadline_s": a.deadline_s, "results": [], "missed": [], "events": []}
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", "auto_tune.sh"], cwd=here, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    timed_out = False
    with log.open("w") as fh:
        assert proc.stdout is not None
        for line in proc.stdout:
            t = round(time.monotonic() - t0, 1)
            fh.write(f"[{t:7.1f}] {line}")
            fh.flush()
            if m := RESULT_LINE.search(line):
                rec["results"].append({"max_num_seqs": int(m[1]),
                                       "max_num_batched_tokens": int(m[2]),
                                       "request_rate": m[3], "p99_e2el_ms": float(m[4]),
                                       "throughput_rps": float(m[5]), "goodput": m[6], "at_s": t})
            elif m := MISSED_LINE.search(line):
                rec["missed"].append({"max_num_seqs": int(m[1]),
                                      "max_num_batched_tokens": int(m[2]), "at_s": t})
            elif "finish permutations" in line:
                rec["permutations_s"] = t
            elif "Using gpu_memory_utilization" in line or "server started" in line \
                    or "server failed" in line:
                rec["events"].append([t, line.strip()])
            elif m := BEST_LINE.search(line):
                rec["best"] = {"max_num_seqs": int(m[1]), "max_num_batched_tokens": int(m[2]),
                               "throughput_rps": float(m[3])}
            rec["seconds"] = t
            (out / "peer.json").write_text(json.dumps(rec, indent=1))
            if time.monotonic() - t0 > a.deadline_s:
                timed_out = True
                break
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(5)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    rec.update(rc=proc.returncode, timed_out=timed_out, seconds=round(time.monotonic() - t0, 1))
    bench_logs = sorted(root.glob("auto-benchmark/*/*"))
    rec["logs"] = [str(p.relative_to(root)) for p in bench_logs]
    (out / "peer.json").write_text(json.dumps(rec, indent=1))
    print(json.dumps({k: rec.get(k) for k in ("best", "permutations_s", "seconds", "rc",
                                                "timed_out")}))
    return 0


def report(a: argparse.Namespace) -> int:
    d = Path(a.dir)
    s = json.loads((d / "search.json").read_text())
    pf = next((f for f in (d / "peer.json", d / "peer" / "peer.json") if f.is_file()), None)
    p = json.loads(pf.read_text()) if pf else None
    win = next((r for r in s["table"] if r.get("chosen")), None)
    print(f"search: {len(s['table'])} candidates in {s['search_s']:.0f} s; chosen when it ran "
          + (f"max_num_seqs={win['max_num_seqs']}, max_num_batched_tokens="
             f"{win['max_num_batched_tokens']} ({win['verdict']}, n={win['n']})" if win
             else f"none ({s['failed_closed']})"))
    if p is None:
        print("auto_tune: not recorded")
        return 0
    best = p.get("best")
    done = len(p["results"]) + len(p["missed"])
    print(f"auto_tune: {done} of its configurations in {p['seconds']:.0f} s"
          + (" (stopped at its deadline)" if p.get("timed_out") else "")
          + (f", permutations in {p['permutations_s']:.0f} s" if "permutations_s" in p else "")
          + (f"; best max_num_seqs={best['max_num_seqs']}, max_num_batched_tokens="
             f"{best['max_num_batched_tokens']} at {best['throughput_rps']} req/s" if best
             else "; no best"))
    if p.get("timed_out"):
        print("best configuration: not compared (auto_tune stopped before its grid was done)")
    elif best and win:
        same = (best["max_num_seqs"], best["max_num_batched_tokens"]) == \
            (win["max_num_seqs"], win["max_num_batched_tokens"])
        print("best configuration: " + ("the same for both" if same else
              "they differ (the search judges a sustained rate at p99 TTFT and TPOT, auto_tune "
              "a 100-prompt burst at one P99 end-to-end bound)"))
    if p["results"] or p["missed"]:
        # per configuration: from its memory probe's end to its last finished configuration
        probe = next((t for t, e in p["events"] if "gpu_memory_utilization" in e), 0.0)
        last = max(r["at_s"] for r in p["results"] + p["missed"])
        per_s = s["search_s"] / max(len(s["table"]), 1)
        per_p = (last - probe) / done
        print(f"wall time per configuration: search {per_s:.0f} s (engine start and the "
              f"repeated verdict), auto_tune {per_p:.0f} s (engine start, 1,000 prompts at an "
              f"infinite rate, the rate walked down) after its {probe:.0f} s memory probe; "
              f"ratio auto_tune/search {per_p / per_s:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("peer")
    p.add_argument("--script", required=True, help="the upstream auto_tune.sh")
    p.add_argument("--script-source", default="vllm-project/vllm "
                   "benchmarks/auto_tune/auto_tune.sh")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/tmp/peer")
    p.add_argument("--seqs", default="32 64")
    p.add_argument("--tokens", default="2048 8192")
    p.add_argument("--in-len", type=int, default=512)
    p.add_argument("--out-len", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--max-e2el-ms", type=int, default=9680)
    p.add_argument("--deadline-s", type=float, default=600)
    r = sub.add_parser("report")
    r.add_argument("dir")
    a = ap.parse_args(argv)
    return peer(a) if a.cmd == "peer" else report(a)


if __name__ == "__main__":
    sys.exit(main())
