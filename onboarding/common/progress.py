"""Progress of a long step as log lines, at a rate a person can read in the event log.

The libraries the long steps call (lm-eval, Model Optimizer, transformers) show progress as tqdm
bars on stderr, which the Dagster event log never sees. `heartbeat` reads the bars that are open
while a call runs and logs them every `every_s` seconds from a side thread ("fp8: scoring:
Running loglikelihood requests 340/560, 20 s"); `Throttled` logs a loop's own counts at most
that often, and always its last.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

Log = Callable[[str], None]
EVERY_S = 10.0


def open_bars() -> list[str]:
    """'desc n/total' of every tqdm bar open in this process, oldest first."""
    from tqdm import tqdm

    bars = []
    for bar in list(tqdm._instances):  # tqdm keeps no public registry of bars
        if getattr(bar, "disable", False):
            continue
        desc = (bar.desc or "").rstrip(": ") or "working"
        total = f"/{bar.total}" if bar.total else ""
        bars.append((getattr(bar, "start_t", 0.0), f"{desc} {bar.n}{total}"))
    return [text for _, text in sorted(bars)]


@contextlib.contextmanager
def heartbeat(log: Log | None, label: str, every_s: float = EVERY_S,
              detail: Callable[[], list[str]] = open_bars) -> Iterator[None]:
    """While the block runs, every `every_s` seconds: `label`, what `detail` says, the time."""
    if log is None:
        yield
        return
    stop = threading.Event()
    t0 = time.monotonic()

    def beat() -> None:
        while not stop.wait(every_s):
            bars = detail()
            log(f"{label}: {', '.join(bars) if bars else 'running'}, "
                f"{time.monotonic() - t0:.0f} s")

    thread = threading.Thread(target=beat, name=f"heartbeat {label}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class Throttled:
    """`log` at most once per `every_s` seconds; `last=True` always logs."""

    def __init__(self, log: Log | None, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self._log, self._every_s, self._clock = log, every_s, clock
        self._next = clock()  # the first call logs

    def __call__(self, message: str | Callable[[], str], last: bool = False) -> None:
        if self._log is None:
            return
        now = self._clock()
        if last or now >= self._next:
            self._log(message() if callable(message) else message)
            self._next = now + self._every_s
