"""A run as a person at a terminal follows it: one line per step (started; done in N s, with its
checks; failed, with why), a live line for the step that runs, while every event of the run
(DEBUG included) goes to a log file instead of the terminal.

It reads the run's own event records from the instance, in a side thread, so the job runs in the
caller's thread as before (Ctrl+C still reaches it and its engine stops).
"""

from __future__ import annotations

import datetime
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Self, TextIO

import dagster as dg

# Dagster's console logger, quiet: the same lines are in the log file (execute_in_process run
# config; the job's default `console` logger).
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
_T = dg.DagsterEventType


def log_line(entry: dg.EventLogEntry) -> str:
    """One event as the log file holds it: time, level, step, message."""
    when = datetime.datetime.fromtimestamp(entry.timestamp).strftime("%H:%M:%S")
    level = {10: "DEBUG", 20: "INFO", 30: "WARNING", 40: "ERROR"}.get(entry.level,
                                                                          str(entry.level))
    event = entry.dagster_event
    kind = f" {event.event_type_value}" if event is not None else ""
    return f"{when} {level:<7} {entry.step_key or '-'}{kind}: {entry.message}"


class RunConsole:
    """Follows `run_id` in `instance` while the caller executes it (a context manager)."""

    def __init__(self, instance: dg.DagsterInstance, run_id: str, log_path: Path,
                 out: TextIO = sys.stdout, poll_s: float = 0.5, live: bool | None = None):
        self.instance, self.run_id, self.log_path = instance, run_id, log_path
        self.out, self.poll_s = out, poll_s
        self.live = out.isatty() if live is None else live
        self._cursor: str | None = None
        self._started: dict[str, float] = {}
        self._checks: dict[str, list[bool]] = {}
        self._last: dict[str, str] = {}  # step -> its latest INFO line, for the live line
        self._finished: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="run console", daemon=True)
        self._live_shown = False

    def __enter__(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.log_path, "a", encoding="utf-8")  # closed in __exit__
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.drain()  # what the run wrote after the last poll
        self._clear_live()
        self._file.close()

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.drain()
            self._show_live()

    def drain(self) -> None:
        """Every record since the last call: to the file, and the step lines to `out`."""
        while True:
            conn = self.instance.get_records_for_run(self.run_id, cursor=self._cursor,
                                                     limit=500)
            for record in conn.records:
                self._file.write(log_line(record.event_log_entry) + "\n")
                self._step_line(record.event_log_entry)
            self._file.flush()
            self._cursor = conn.cursor
            if not conn.has_more:
                return

    def _step_line(self, entry: dg.EventLogEntry) -> None:
        event, step = entry.dagster_event, entry.step_key
        if step is None:
            return
        if event is None:
            if entry.level >= 20:
                self._last[step] = entry.user_message
            return
        kind = event.event_type
        if kind == _T.STEP_START:
            self._started[step] = entry.timestamp
            self._print(f"  {step}: started")
        elif kind == _T.ASSET_CHECK_EVALUATION:
            self._checks.setdefault(step, []).append(event.event_specific_data.passed)
        elif kind in (_T.STEP_SUCCESS, _T.STEP_FAILURE):
            self._finished.add(step)
            took = entry.timestamp - self._started.get(step, entry.timestamp)
            checks = self._checks.get(step, [])
            verdict = (f", checks {sum(checks)} of {len(checks)} passed" if checks else "")
            if kind == _T.STEP_SUCCESS:
                self._print(f"  {step}: done in {took:.0f} s{verdict}")
            else:
                error = event.step_failure_data.error
                why = (error.cause or error).message.strip().splitlines()[0] if error else ""
                self._print(f"  {step}: FAILED after {took:.0f} s{verdict}: {why}")
        elif kind == _T.STEP_SKIPPED:
            self._print(f"  {step}: skipped (an upstream step did not materialize)")

    def _print(self, line: str) -> None:
        self._clear_live()
        print(line, file=self.out, flush=True)

    def _show_live(self) -> None:
        running = [s for s in self._started if s not in self._finished]
        if not self.live or not running:
            return
        step = running[-1]
        took = time.time() - self._started[step]
        line = f"  … {step} {took:.0f} s" + (f": {self._last[step]}" if step in self._last
                                              else "")
        width = shutil.get_terminal_size((100, 20)).columns - 1
        self.out.write("\r\033[K" + line[:width])
        self.out.flush()
        self._live_shown = True

    def _clear_live(self) -> None:
        if self._live_shown:
            self.out.write("\r\033[K")
            self.out.flush()
            self._live_shown = False
