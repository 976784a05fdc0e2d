"""How long the code location takes to load: `dagster definitions validate` here against a peer
checkout (another commit of this repository), alternated in the same run.

CPU seconds (user + system of the command and its children), not wall time, are the figure:
they move far less when other work shares the cores. Prints each pair and the ratio of the
medians (here / peer), with n.

    .venv/bin/python bench/definitions_load.py --peer-ref 5c815c6 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def validate_cpu_s(checkout: Path, home: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one `dagster definitions validate` in `checkout`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "dagster"), "definitions", "validate",
                           "-w", "workspace.yaml"], cwd=checkout, capture_output=True,
                          text=True, check=False,
                          env={**os.environ, "DAGSTER_HOME": str(home),
                               "DAGSTER_DISABLE_TELEMETRY": "1"})
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"validate failed in {checkout}:\n{proc.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-ref", required=True, help="the commit to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        peer, home = Path(tmp) / "peer", Path(tmp) / "home"
        home.mkdir()
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(peer), args.peer_ref],
                       cwd=ROOT, check=True)
        try:
            here_s, peer_s = [], []
            for i in range(args.repeats):
                p, pw = validate_cpu_s(peer, home)
                h, hw = validate_cpu_s(ROOT, home)
                peer_s.append(p)
                here_s.append(h)
                print(f"pair {i + 1}: peer {p:.2f} s CPU ({pw:.1f} s wall), here {h:.2f} s CPU "
                      f"({hw:.1f} s wall)")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(peer)], cwd=ROOT,
                           check=False)
    here, other = statistics.median(here_s), statistics.median(peer_s)
    print(f"median CPU s: here {here:.2f}, peer {args.peer_ref} {other:.2f} (n={args.repeats} "
          f"each); ratio here/peer {here / other:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
