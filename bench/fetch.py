"""Cold fetch of a >=1 GB multi-file checkpoint from the local SeaweedFS: ours vs named peers.

Peers, measured in the same run and interleaved: `aws s3 cp --recursive` (awscli) and boto3
`download_file` with its default TransferConfig, file after file; and the same boto3 loop with
an fsync of each file, the peer with our durability (download_file leaves its bytes in the page
cache, written back by the kernel after the process exits). Each contender runs in its own
process into an empty directory; we report median seconds, MB/s, CPU seconds (the process
tree's user + system, and the S3 server's, which on a loaded machine decide the wall time),
peak RSS, and the ratios peer-time / our-time (>= 1.0 means we are at least as fast), against
boto3 `download_file` by name and against the best peer. Then the warm path: a `checkpoint`
materialization (with its integrity check) of the already verified entry.

`--load N` runs N busy CPU processes (pure-Python spin loops, `nice` 0) beside every contender,
a "loaded machine": on 2 cores, `--load 2` leaves the fetch and the S3 server
competing for CPU with two other busy processes, as when the suite or a build runs beside it.

    .venv/bin/python bench/fetch.py [--gb 1.0] [--files 4] [--reps 3] [--load 0]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PY = sys.executable
AK, SK = "bench", "bench-secret"


def make_checkpoint(out: Path, total_bytes: int, files: int) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    per = total_bytes // files
    rng = np.random.default_rng(0)
    weight_map = {}
    for i in range(files):
        name = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        save_file({f"layer{i}.weight": rng.integers(0, 255, per, dtype=np.uint8)}, str(out / name))
        weight_map[f"layer{i}.weight"] = name
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))


def _tree_rss(root_pid: int) -> int:
    """Resident bytes of a process and all its descendants, read from /proc."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def _children_cpu_s() -> float:
    """User + system seconds of every child waited for so far (and of theirs)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _proc_cpu_s(pid: int) -> float:
    """User + system seconds of a running process (the S3 server), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_child(code: str, env: dict) -> tuple[float, int, str, float]:
    """Seconds of wall time, peak RSS of the process tree (sampled every 20 ms), stdout, and the
    CPU seconds of the process tree (getrusage of the children, one child at a time).

    RSS is sampled from /proc rather than getrusage: Linux carries ru_maxrss across fork+exec,
    so a child would report this (large) parent's peak.
    """
    cpu0 = _children_cpu_s()
    t0 = time.monotonic()
    proc = subprocess.Popen([PY, "-c", code], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    seconds = time.monotonic() - t0
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"contender failed:\n{code}\n{err[-3000:]}")
    return seconds, peak[0], out, _children_cpu_s() - cpu0



OURS = textwrap.dedent("""
    import os, sys, time, json
    from onboarding.fetch.catalog import parse_source
    from resources.nvme_cache import NvmeCache
    from resources.s3 import S3ObjectStore
    t0, c0 = time.monotonic(), os.times()
    store = S3ObjectStore(endpoint_url=os.environ["S3_ENDPOINT_URL"],
        access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"])
    r = NvmeCache(root=os.environ["DEST"], reserve_gb=0).fetch("bench", store,
        parse_source("s3://models/bench/"))
    c1 = os.times()
    print(json.dumps({"inner_s": time.monotonic() - t0, "warm": r.warm,
                      "inner_cpu_s": c1.user - c0.user + c1.system - c0.system}))
""")

BOTO3 = textwrap.dedent("""
    import os, time, json, boto3
    t0, c0 = time.monotonic(), os.times()
    c = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    dest = os.environ["DEST"]
    for page in c.get_paginator("list_objects_v2").paginate(Bucket="models", Prefix="bench/"):
        for o in page.get("Contents", []):
            path = os.path.join(dest, o["Key"][len("bench/"):])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            c.download_file("models", o["Key"], path)
            if os.environ.get("FSYNC"):
                fd = os.open(path, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
    c1 = os.times()
    print(json.dumps({"inner_s": time.monotonic() - t0,
                      "inner_cpu_s": c1.user - c0.user + c1.system - c0.system}))
""")

AWSCLI = textwrap.dedent("""
    import os, subprocess, sys, time, json
    aws = os.path.join(os.path.dirname(sys.executable), "aws")
    cpu = lambda: (lambda t: t.children_user + t.children_system)(os.times())
    t0, c0 = time.monotonic(), cpu()
    subprocess.run([aws, "--version"], check=True, capture_output=True)
    startup, startup_cpu = time.monotonic() - t0, cpu() - c0
    t0, c0 = time.monotonic(), cpu()
    subprocess.run([aws, "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url",
                    os.environ["S3_ENDPOINT_URL"], "s3://models/bench/", os.environ["DEST"]],
                   check=True)
    # the CLI's own start-up (measured just before, same process tree) is not transfer time
    print(json.dumps({"inner_s": time.monotonic() - t0 - startup,
                      "inner_cpu_s": cpu() - c0 - startup_cpu}))
""")

WARM = textwrap.dedent("""
    import os, json, time
    import dagster as dg
    from assets.checkpoint import checkpoint
    from pipelines.resources import build_resources
    from resources.nvme_cache import NvmeCache
    # The production wiring (pipelines/resources.py, from the environment), so the warm path
    # gets whatever resources the asset asks for; only the cache's reserve is the bench's own.
    res = {**build_resources(), "nvme_cache": NvmeCache(root=os.environ["DEST"], reserve_gb=0)}
    with dg.instance_for_test() as inst:
        inst.add_dynamic_partitions("models", ["bench"])
        t0 = time.monotonic()
        r = dg.materialize([checkpoint], partition_key="bench", instance=inst, resources=res)
        total = time.monotonic() - t0
        md = r.asset_materializations_for_node("checkpoint")[0].metadata
        checks = [e.passed for e in r.get_asset_check_evaluations()]
        print(json.dumps({"materialize_s": total, "warm": md["warm_cache"].value,
                          "checks": checks}))
""")


def start_load(n: int) -> list[subprocess.Popen]:
    """`n` processes that spin on the CPU until killed (the loaded machine)."""
    return [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--load", type=int, default=0,
                    help="busy CPU processes beside every contender (default 0: a quiet machine)")
    args = ap.parse_args()
    from resources.s3 import S3ObjectStore
    from resources.seaweedfs import LocalS3Server

    work = Path(tempfile.mkdtemp(prefix="bench-fetch-", dir=ROOT / ".cache"))
    server = LocalS3Server(data_dir=work / "s3", access_key=AK, secret_key=SK).start()
    load: list[subprocess.Popen] = []
    try:
        src = work / "src"
        make_checkpoint(src, int(args.gb * (1 << 30)), args.files)
        total = sum(p.stat().st_size for p in src.iterdir())
        store = S3ObjectStore(endpoint_url=server.endpoint_url, access_key_id=AK,
                              secret_access_key=SK)
        store.upload_dir(src, "models", "bench/")
        shutil.rmtree(src)
        cfg = work / "configs"
        shutil.copytree(ROOT / "configs", cfg, ignore=shutil.ignore_patterns("models"))
        (cfg / "models").mkdir()
        (cfg / "models" / "bench.yaml").write_text(
            "id: bench\nsource: s3://models/bench/\nserved_name: bench\n")
        env = {**os.environ, **server.env(), "ONBOARDING_CONFIG_DIR": str(cfg),
               "AWS_EC2_METADATA_DISABLED": "true", "DAGSTER_DISABLE_TELEMETRY": "1"}
        contenders = {"ours (checkpoint fetch)": (OURS, {}),
                      "aws s3 cp --recursive": (AWSCLI, {}),
                      "boto3 download_file": (BOTO3, {}),
                      "boto3 download_file + fsync": (BOTO3, {"FSYNC": "1"})}
        results: dict[str, list[tuple[float, float, int, float, float, float]]] = {
            k: [] for k in contenders}
        load = start_load(args.load)
        names = list(contenders)
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                dest = work / "dest"
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir()
                code, extra = contenders[name]
                server_cpu0 = _proc_cpu_s(server.process.pid)
                seconds, rss, out, cpu = run_child(code, {**env, **extra, "DEST": str(dest)})
                server_cpu = _proc_cpu_s(server.process.pid) - server_cpu0
                report = json.loads(out.strip().splitlines()[-1])
                inner, inner_cpu = report["inner_s"], report["inner_cpu_s"]
                got = sum(p.stat().st_size for p in dest.rglob("*.safetensors"))
                if got < total * 0.99:
                    raise SystemExit(f"{name} wrote {got} of {total} bytes")
                results[name].append((inner, seconds, rss, cpu, server_cpu, inner_cpu))
                print(f"rep {rep + 1} {name:<28} transfer {inner:6.2f}s  process {seconds:6.2f}s"
                      f"  CPU {inner_cpu:5.2f}s of {cpu:5.2f}s (server {server_cpu:4.2f}s)  {rss / 1e6:4.0f} MB RSS"
                      f"  load {os.getloadavg()[0]:.1f}", flush=True)
        print(f"\ncheckpoint: {args.files} safetensors files, {total / 1e9:.2f} GB, "
              f"{args.reps} interleaved repetitions, medians; {args.load} busy CPU process(es) "
              f"beside each contender on {os.cpu_count()} cores\n")
        print("| contender | transfer s (median) | MB/s | whole process s (median) | "
              "CPU s, transfer (median) | CPU s, process (median) | CPU s, S3 server (median) | "
              "peak RSS MB |\n|---|---:|---:|---:|---:|---:|---:|---:|")
        med, wall = {}, {}
        for name, runs in results.items():
            med[name] = statistics.median(r[0] for r in runs)
            wall[name] = statistics.median(r[1] for r in runs)
            rss = max(r[2] for r in runs)
            rate = f"{total / 1e6 / med[name]:.0f}" if med[name] > 0 else "n/a"
            print(f"| {name} | {med[name]:.2f} | {rate} | {wall[name]:.2f} | "
                  f"{statistics.median(r[5] for r in runs):.2f} | "
                  f"{statistics.median(r[3] for r in runs):.2f} | "
                  f"{statistics.median(r[4] for r in runs):.2f} | {rss / 1e6:.0f} |")
        ours = names[0]
        # awscli's transfer is its run less its own start-up, measured just before: on a
        # checkpoint far under --gb 1 the start-up's noise exceeds the transfer, and a
        # non-positive time is no peer figure.
        timed = {k: v for k, v in med.items() if v > 0}
        for k in sorted(set(med) - set(timed)):
            print(f"{k}: transfer not separable from its start-up at this size (no ratio)")
        peer = min((k for k in timed if k != ours), key=timed.get)
        peer_wall = min((k for k in wall if k != ours), key=wall.get)
        print(f"\ntransfer: boto3 download_file / ours = "
              f"{med['boto3 download_file'] / med[ours]:.2f} (>= 1.0: ours at least as fast; "
              "ours also sha256-verifies and fsyncs); with its fsync "
              f"{med['boto3 download_file + fsync'] / med[ours]:.2f}")
        print(f"transfer: best peer ({peer}) / ours = {med[peer] / med[ours]:.2f}")
        print(f"whole process incl. interpreter and imports: best peer ({peer_wall}) / ours = "
              f"{wall[peer_wall] / wall[ours]:.2f}")
        # warm: the verified entry from one more cold fetch, then the asset re-materialized
        dest = work / "dest"
        shutil.rmtree(dest, ignore_errors=True)
        run_child(OURS, {**env, "DEST": str(dest)})
        warm = []
        for _ in range(args.reps):
            _, _, out, _ = run_child(WARM, {**env, "DEST": str(dest)})
            body = json.loads(out.strip().splitlines()[-1])
            assert body["warm"] and all(body["checks"]), body
            warm.append(body["materialize_s"])
        print(f"warm re-materialization of the verified {total / 1e9:.2f} GB entry (asset + "
              f"completeness + full sha256 integrity check): median {statistics.median(warm):.2f}s")
    finally:
        for p in load:
            p.kill()
            p.wait()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
