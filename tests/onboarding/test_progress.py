"""Progress lines for the event log (onboarding/common/progress.py): a heartbeat that reads the
tqdm bars a library has open, and a throttle for a loop's own counts."""

from __future__ import annotations

import threading

from tqdm import tqdm

from onboarding.common.progress import Throttled, heartbeat, open_bars


def test_the_heartbeat_logs_the_open_bars_while_the_block_runs_and_stops_after():
    lines: list[str] = []
    beat = threading.Event()

    def log(line: str) -> None:
        lines.append(line)
        beat.set()

    with tqdm(total=560, desc="Running loglikelihood requests", disable=False) as bar:
        bar.update(340)
        with heartbeat(log, "fp8: scoring", every_s=0.05):
            assert beat.wait(5)
    n = len(lines)
    assert lines[0].startswith("fp8: scoring: Running loglikelihood requests 340/560, ")
    assert lines[0].endswith(" s")
    beat.clear()
    assert not beat.wait(0.2) and len(lines) == n  # nothing after the block
    assert open_bars() == []  # the bar closed


def test_without_a_log_nothing_runs():
    with heartbeat(None, "x", every_s=0.01):
        assert not [t for t in threading.enumerate() if t.name.startswith("heartbeat")]


def test_throttled_logs_the_first_then_at_most_every_interval_and_always_the_last():
    now = [0.0]
    lines: list[str] = []
    say = Throttled(lines.append, every_s=10, clock=lambda: now[0])
    for t in range(25):
        now[0] = float(t)
        say(f"item {t}", last=t == 24)
    assert lines == ["item 0", "item 10", "item 20", "item 24"]
