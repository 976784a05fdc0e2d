"""Where a run's time went, per step: wall seconds from the run's event records, CPU seconds and
child processes (the engine) from a sampler of this process tree.

Why both: on a machine shared with other work a step's wall time says as much about the other
work as about the step; the CPU seconds its process tree burnt (the engine subprocess included)
say what the step itself cost. The wall times are the instance's own step start and end records,
not a clock kept beside the run.
"""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import dagster as dg

from onboarding.serving.frontend import children, tree_cpu_s

_STEP_END = (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE)
# Dagster's compute-log capture starts these beside every step (`tail -F` of the step's output
# and its orphan watcher): real children, but the instance's, not the step's work.
_LOG_CAPTURE = ("tail -F", "watch_orphans.py")
# a child only ever seen between its fork and its exec, which still shows this process's argv
FORK = "(forked, not seen after exec)"
# one that had exited (a zombie, its command line gone) by the first look
EXITED = "(exited before it was seen)"


@dataclass(frozen=True)
class ChildProcess:
    """A direct child of the sampled process (an engine start, a tool), as first and last seen."""

    pid: int
    command: str
    first_seen: float
    last_seen: float

    @property
    def alive_s(self) -> float:
        return self.last_seen - self.first_seen


@dataclass(frozen=True, kw_only=True)
class StepTiming:
    step: str
    status: str  # "success", "failure", or "running" (no end record)
    start: float  # the event records' time.time()
    end: float | None
    cpu_s: float | None  # None where the samples do not cover the step
    children: tuple[ChildProcess, ...] = ()
    # children an earlier step started that were still up in this one (a handed-off engine),
    # with the step each was counted in
    carried: tuple[ChildProcess, ...] = ()
    carried_from: tuple[str, ...] = ()

    @property
    def wall_s(self) -> float | None:
        return None if self.end is None else self.end - self.start


def _command(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [Path(a.decode(errors="replace")).name for a in argv[:3] if a]
    return " ".join(" ".join(words).split())[:60] or "?"  # one line: `python -c <code>`


@dataclass(kw_only=True)
class TreeSampler:
    """Samples this process tree's cumulative CPU seconds and its direct children every
    `interval_s` on a background thread, on `time.time()`'s clock (the event records')."""

    interval_s: float = 0.5
    pid: int = field(default_factory=os.getpid)
    samples: list[tuple[float, float]] = field(default_factory=list)
    children: dict[int, ChildProcess] = field(default_factory=dict)
    _own: str = ""  # this process's own command line, read once on entering
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)  # samples stay in time order

    def look(self) -> None:
        """A sample now. Besides the periodic ones, a breakdown read while sampling takes one,
        so it covers up to that moment, not only up to the last periodic look."""
        with self._lock:
            self._read()

    def _read(self) -> None:
        now = time.time()
        self.samples.append((now, tree_cpu_s(self.pid, reaped=True)))
        try:
            kids = children(self.pid)
        except OSError:
            kids = []
        for kid in kids:
            seen, command = self.children.get(kid), _command(kid)
            if any(w in command for w in _LOG_CAPTURE):  # also one that exec'd into it
                self.children.pop(kid, None)
                continue
            # read again at every look: a child first seen between fork and exec still shows
            # its parent's command line; a zombie's is empty ("?"), so the last real one stays
            if seen is not None and command == "?":
                command = seen.command
            # one never seen after its exec (gone within one interval) says so, rather than
            # passing for a second copy of the demo (`python demo.py (0)` in load_timing)
            if command == self._own:
                command = FORK
            elif command == "?" and seen is None:  # a zombie at its first look
                command = EXITED
            self.children[kid] = ChildProcess(kid, command, seen.first_seen if seen else now,
                                              now)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.look()

    def __enter__(self) -> Self:
        self._own = _command(self.pid)
        self.look()
        self._thread = threading.Thread(target=self._loop, name="run-cpu", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.look()


def cpu_between(samples: Sequence[tuple[float, float]], t0: float, t1: float) -> float | None:
    """CPU seconds between t0 and t1 from (time, cumulative seconds) samples, interpolated;
    None when the samples do not cover the window."""
    if t1 < t0 or len(samples) < 2 or samples[0][0] > t0 or samples[-1][0] < t1:
        return None
    times = [t for t, _ in samples]

    def at(t: float) -> float:
        i = min(max(bisect_right(times, t), 1), len(samples) - 1)
        (ta, ca), (tb, cb) = samples[i - 1], samples[i]
        return ca if tb == ta else ca + (cb - ca) * (t - ta) / (tb - ta)

    return at(t1) - at(t0)


def step_timings(records: Iterable[dg.EventLogEntry], samples: Sequence[tuple[float, float]] = (),
                 children: Iterable[ChildProcess] = ()) -> list[StepTiming]:
    """One row per step in start order, from a run's STEP_START / STEP_SUCCESS / STEP_FAILURE
    records; a child process belongs to the step it was first seen in, and is `carried` by a
    later step it was still seen in."""
    starts: dict[str, float] = {}
    ends: dict[str, tuple[float, str]] = {}
    for entry in records:
        event = entry.dagster_event
        if event is None or entry.step_key is None:
            continue
        if event.event_type == dg.DagsterEventType.STEP_START:
            starts.setdefault(entry.step_key, entry.timestamp)
        elif event.event_type in _STEP_END:
            ok = event.event_type == dg.DagsterEventType.STEP_SUCCESS
            ends[entry.step_key] = (entry.timestamp, "success" if ok else "failure")
    kids = sorted(children, key=lambda c: c.first_seen)
    rows = []
    owner: dict[int, str] = {}
    for step, start in sorted(starts.items(), key=lambda kv: kv[1]):
        end, status = ends.get(step, (None, "running"))
        mine = tuple(c for c in kids if start <= c.first_seen <= (end or float("inf")))
        carried = tuple(c for c in kids if c.first_seen < start < c.last_seen
                        and c.pid in owner)
        owner.update((c.pid, step) for c in mine)
        cpu = None if end is None else cpu_between(samples, start, end)
        rows.append(StepTiming(step=step, status=status, start=start, end=end, cpu_s=cpu,
                               children=mine, carried=carried,
                               carried_from=tuple(owner[c.pid] for c in carried)))
    return rows


def run_step_timings(instance: dg.DagsterInstance, run_id: str, sampler: TreeSampler | None = None
                     ) -> list[StepTiming]:
    """`step_timings` of a stored run, read back from the instance's event log."""
    types = {dg.DagsterEventType.STEP_START, *_STEP_END}
    records = [r.event_log_entry for r in instance.get_records_for_run(
        run_id, of_type=types, limit=100_000).records]
    if sampler is None:
        return step_timings(records)
    sampler.look()
    return step_timings(records, sampler.samples, sampler.children.values())


def breakdown_lines(rows: Sequence[StepTiming], cores: int | None = None) -> list[str]:
    """The table the demo prints: wall and CPU seconds per step, the child processes (engine
    starts) each step ran and how long each was alive, and the totals."""
    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:7.1f}"

    lines = [f"  {'step':<28} {'wall s':>7} {'CPU s':>7}  child processes (alive s)"]
    for r in rows:
        kids = ", ".join([f"{c.command} ({c.alive_s:.0f})" for c in r.children]
                         + [f"{c.command} (kept from {step})"
                            for c, step in zip(r.carried, r.carried_from, strict=True)])
        lines.append(f"  {r.step:<28} {s(r.wall_s)} {s(r.cpu_s)}  {kids or '-'}"
                     + ("" if r.status == "success" else f"  [{r.status}]"))
    ended = [r for r in rows if r.end is not None]
    if ended:
        span = max(r.end for r in ended) - min(r.start for r in rows)
        cpu = [r.cpu_s for r in ended if r.cpu_s is not None]
        load = os.getloadavg()
        lines.append(f"  {'first start to last end':<28} {s(span)} {s(sum(cpu) if cpu else None)}"
                     f"  (load average now {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
                     f" on {cores or os.cpu_count()} cores)")
    return lines
