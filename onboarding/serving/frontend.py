"""The engine's frontend (vLLM's API server process) as a measured cost.

A load generator must not load the engine it measures, and a point whose API server ran out of
its one core measures the frontend, not the GPU. Both are read from the same figure: the CPU
time (utime + stime, all threads) of the process that listens on the engine's port, from
`/proc/<pid>/stat`, against the tokens the engine generated meanwhile (its own counter) or the
point's wall time. The engine's children (vLLM's EngineCore and workers) are read apart
(`tree_cpu_s`), so the API server's share is never confused with the engine loop's.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

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


def process_cpu_s(pid: int, reaped: bool = False) -> float:
    """CPU seconds (user + system, all threads) one process has used so far; with `reaped`, also
    its waited-for children's (cutime + cstime), which stay counted after they exit."""
    f = _stat_fields(pid)
    return sum(int(x) for x in f[11:15 if reaped else 13]) / _CLK_TCK


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


def _walk(pid: int, visit: Callable[[int], bool]) -> None:
    """`visit` `pid` and its living descendants, each once; where it returns False the walk
    does not go below that process. One that exits between the listing and the read is left
    out."""
    todo, seen = [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            if not visit(p):
                continue
        except (OSError, ValueError, IndexError):
            continue
        todo += children(p)


def tree_cpu_s(pid: int, reaped: bool = False) -> float:
    """CPU seconds of `pid` and all its living descendants (the whole engine); `reaped` adds
    each one's waited-for children (`process_cpu_s`)."""
    cpu: list[float] = []
    _walk(pid, lambda p: cpu.append(process_cpu_s(p, reaped)) or True)
    return sum(cpu)


def process_title(pid: int) -> str:
    """The process's command line as `ps` shows it (a title set by setproctitle included)."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
    return raw.decode(errors="replace") or Path(f"/proc/{pid}/comm").read_text().strip()


def frontend_processes_cpu_s(pid: int, engine_titles: Sequence[str] = ()
                             ) -> dict[int, tuple[str, float]]:
    """CPU seconds and title of every frontend process of the engine that `pid` starts: `pid`
    and its descendants outside any subtree whose title holds one of `engine_titles` (the
    template's `engine_process_titles`: vLLM's set_process_title names its engine core
    VLLM::EngineCore and its workers VLLM::Worker...). With one API server that is `pid` alone
    (the engine core is its child); with vLLM's `--api-server-count N` the launcher `pid` and
    its N API server children (vllm/entrypoints/cli/serve.py, run_multi_api_server). With no
    titles, `pid` alone."""
    if not engine_titles:
        return {pid: (process_title(pid), process_cpu_s(pid))}
    out: dict[int, tuple[str, float]] = {}

    def visit(p: int) -> bool:
        title = process_title(p)
        if p != pid and any(w in title for w in engine_titles):
            return False  # the engine's own subtree
        out[p] = (title, process_cpu_s(p))
        return True

    _walk(pid, visit)
    return out


def frontend_cpu_delta(before: dict[int, tuple[str, float]],
                       after: dict[int, tuple[str, float]]) -> dict[int, tuple[str, float]]:
    """Each frontend process's CPU seconds between two `frontend_processes_cpu_s` readings (a
    process that appeared between them counts from zero)."""
    return {p: (t, cpu - before.get(p, (t, 0.0))[1]) for p, (t, cpu) in after.items()}


def frontend_columns(cpu_s: float | None, seconds: float) -> dict[str, float | bool | None]:
    """The sweep table's columns for one point: the API server's mean share of a core over the
    point, and whether that makes the point frontend-bound. None where it could not be read."""
    if cpu_s is None or seconds <= 0:
        return {"frontend_cpu_cores": None, "frontend_bound": None}
    cores = cpu_s / seconds
    return {"frontend_cpu_cores": cores, "frontend_bound": cores > FRONTEND_BOUND_CORES}


FRONTEND_BOUND_LABEL = f"frontend-bound (API server > {FRONTEND_BOUND_CORES:g} core)"


def frontend_bound_points(rows: Sequence[dict]) -> list[dict]:
    """The sweep rows marked frontend-bound (a row without the column is not)."""
    return [r for r in rows if r.get("frontend_bound") is True]


def cpu_between(samples: Sequence[tuple[float, float]], t0: float, t1: float) -> float | None:
    """CPU seconds used between `t0` and `t1`, from (time, cumulative CPU seconds) samples in
    time order, linearly interpolated; None when the samples do not cover the window."""
    if t1 <= t0 or len(samples) < 2 or samples[0][0] > t0 or samples[-1][0] < t1:
        return None
    times = [t for t, _ in samples]

    def at(t: float) -> float:
        i = min(max(bisect.bisect_right(times, t), 1), len(samples) - 1)
        (ta, ca), (tb, cb) = samples[i - 1], samples[i]
        return ca if tb == ta else ca + (cb - ca) * (t - ta) / (tb - ta)

    return at(t1) - at(t0)


class FrontendSampler:
    """The API server's cumulative CPU seconds, read on a background thread every
    `interval_s` between `start()` and `stop()`, on `time.monotonic()`'s clock.

    A process that cannot be read (gone, another user's) leaves `unavailable` saying why, and
    no samples: the point's columns then read None, never a made-up zero."""

    def __init__(self, pid: int, interval_s: float = 0.25):
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[tuple[float, float]] = []
        self.unavailable = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the thread and `columns` both read: keep time order
        self._thread: threading.Thread | None = None

    def _read(self) -> bool:
        try:
            with self._lock:
                self.samples.append((time.monotonic(), process_cpu_s(self.pid)))
        except (OSError, ValueError, IndexError) as exc:
            self.unavailable = f"/proc/{self.pid}/stat: {exc}"
            return False
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s) and self._read():
            pass

    def start(self) -> Self:
        if self._read():
            self._thread = threading.Thread(target=self._loop, name="frontend-cpu",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def columns(self, seconds: float) -> dict[str, float | bool | None]:
        """`frontend_columns` over the last `seconds` (the point just measured): one more
        sample is read now, so the window's end is covered."""
        if not self._read():
            return frontend_columns(None, seconds)
        end = self.samples[-1][0]
        return frontend_columns(cpu_between(self.samples, end - seconds, end), seconds)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
