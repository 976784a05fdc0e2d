"""What one GB of page-cache writes costs in system time, by write length: the fetch's pwrite
pattern (16 threads, each writing whole 16 MiB chunks of a pre-sized file in 1 MiB blocks, its
socket read size, then fdatasync), each block through the fetch's own `resources/s3.py::
pwrite_all` (pieces of `WRITE_BLOCK`, 256 KiB since 2182177) against one 1 MiB pwrite per
block (the fetch before), interleaved in the same run.

Linux sizes a buffered write's page-cache folio from the write's length (include/linux/
pagemap.h `write_begin_get_folio`), so the two ask the page allocator for order-6 and order-8
blocks. `--churn-gb N` first allocates and frees N GB of anonymous memory and waits
`--settle` seconds, which on the 2-core VM leaves free memory short of mid-order blocks
(/proc/buddyinfo is printed before each round), the state a test suite also leaves.

    .venv/bin/python bench/write_block.py [--gb 1] [--reps 3] [--churn-gb 0] [--settle 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from resources.s3 import READ_BLOCK, WRITE_BLOCK, pwrite_all

CHUNK = 16 << 20
THREADS = 16
OURS = f"{WRITE_BLOCK >> 10} KiB writes (ours)"
BEFORE = f"{READ_BLOCK >> 20} MiB writes (before)"


def write_file(path: Path, size: int, ours: bool) -> tuple[float, float]:
    """Wall and system seconds of writing `size` bytes the way the fetch does, then syncing."""
    data = os.urandom(READ_BLOCK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, size)
    chunks = list(range(0, size, CHUNK))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not chunks:
                    return
                start = chunks.pop()
            for off in range(start, min(start + CHUNK, size), READ_BLOCK):
                block = data[: min(READ_BLOCK, size - off)]
                if ours:
                    pwrite_all(fd, block, off, path)
                else:
                    os.pwrite(fd, block, off)

    t0, s0 = time.monotonic(), os.times().system
    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.fdatasync(fd)
    wall, sys_s = time.monotonic() - t0, os.times().system - s0
    os.close(fd)
    return wall, sys_s


def churn(gb: float, settle_s: float) -> None:
    """Allocate, touch and free `gb` GB of anonymous memory in a child, then wait."""
    n = int(gb * (1 << 30))
    subprocess.run([sys.executable, "-c", f"bytearray(b'\\x01') * {n}"], check=True)
    time.sleep(settle_s)


def buddyinfo() -> str:
    lines = [ln for ln in Path("/proc/buddyinfo").read_text().splitlines() if "Normal" in ln]
    return " ".join(lines[-1].split()[4:]) if lines else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--churn-gb", type=float, default=0.0,
                    help="allocate and free this much anonymous memory before each round")
    ap.add_argument("--settle", type=float, default=30.0, help="seconds to wait after a churn")
    args = ap.parse_args()
    size = int(args.gb * (1 << 30))
    (ROOT / ".cache").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-write-block-", dir=ROOT / ".cache"))
    names = [OURS, BEFORE]
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    try:
        for rep in range(args.reps):
            if args.churn_gb:
                churn(args.churn_gb, args.settle)
            print(f"round {rep + 1}: free blocks by order 0-10: {buddyinfo()}", flush=True)
            for name in names[rep % 2:] + names[:rep % 2]:
                path = work / "f"
                wall, sys_s = write_file(path, size, name == OURS)
                path.unlink()
                runs[name].append((wall, sys_s))
                print(f"  {name:<22} wall {wall:5.2f} s  system {sys_s:5.2f} s", flush=True)
    finally:
        for p in work.iterdir():
            p.unlink()
        work.rmdir()
    print(f"\n{size / 1e9:.2f} GB per write, {args.reps} interleaved rounds, churn "
          f"{args.churn_gb:g} GB, medians\n")
    print("| writes | wall s | system s |\n|---|---:|---:|")
    med = {}
    for name in names:
        med[name] = (statistics.median(r[0] for r in runs[name]),
                     statistics.median(r[1] for r in runs[name]))
        print(f"| {name} | {med[name][0]:.2f} | {med[name][1]:.2f} |")
    ours, peer = names
    print(f"\nsystem time: {peer} / {ours} = {med[peer][1] / max(med[ours][1], 1e-9):.2f}"
          f"; wall: {med[peer][0] / max(med[ours][0], 1e-9):.2f} (>= 1.0: ours no worse)")


if __name__ == "__main__":
    main()
