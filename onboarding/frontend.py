"""The engine's frontend (vLLM's API server process) as a measured cost.

A load generator must not load the engine it measures, and a point whose API server ran out of
its one core measures the frontend, not the GPU. Both are read from the same figure: the CPU
time (utime + stime, all threads) of the process that listens on the engine's port, from
`/proc/<pid>/stat`, against the tokens the engine generated meanwhile (its own counter) or the
point's wall time. The engine's children (vLLM's EngineCore and workers) are read apart
(`tree_cpu_s`), so the API server's share is never confused with the engine loop's.
"""

from __future__ import annotations

import os
from pathlib import Path

FRONTEND_BOUND_CORES = 0.9
"""An API server above this share of one core over a point is marked frontend-bound: it is a
single asyncio process, so near one core it, not the GPU, sets the point's numbers."""

FRONTEND_ADVICE = ("the engine's API server ran above {cores:g} of a core: this point measures "
                   "the frontend, not the GPU. Start the engine with more API server processes "
                   "(vLLM --api-server-count N) and measure again.")

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rfind(")") + 2:].split()  # the name in parentheses may hold spaces


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) one process has used so far."""
    f = _stat_fields(pid)
    return (int(f[11]) + int(f[12])) / _CLK_TCK


def children(pid: int) -> list[int]:
    """Direct children of `pid` (from every thread's children list)."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of `pid` and all its living descendants (the whole engine)."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            total += process_cpu_s(p)
        except (OSError, ValueError, IndexError):
            continue  # exited between the listing and the read
        todo += children(p)
    return total


def frontend_columns(cpu_s: float | None, seconds: float) -> dict[str, float | bool | None]:
    """The sweep table's columns for one point: the API server's mean share of a core over the
    point, and whether that makes the point frontend-bound. None where it could not be read."""
    if cpu_s is None or seconds <= 0:
        return {"frontend_cpu_cores": None, "frontend_bound": None}
    cores = cpu_s / seconds
    return {"frontend_cpu_cores": cores, "frontend_bound": cores > FRONTEND_BOUND_CORES}
