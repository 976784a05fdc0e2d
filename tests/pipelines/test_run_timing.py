"""The demo's time breakdown: per step, wall seconds from a real run's event records, CPU seconds
and child processes from the sampler, in a real (ephemeral) Dagster instance."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from pipelines.run_timing import (
    EXITED,
    FORK,
    TreeSampler,
    breakdown_lines,
    cpu_between,
    run_step_timings,
)


@dg.asset
def burns_cpu() -> int:
    t0, n = time.process_time(), 0
    while time.process_time() - t0 < 0.6:
        n += 1
    return n


@dg.asset(deps=[burns_cpu])
def waits_on_a_child() -> None:
    subprocess.run(["sleep", "1.5"], check=True)


@pytest.mark.slow
def test_each_step_gets_its_wall_time_cpu_time_and_child_processes():
    with dg.instance_for_test() as instance:
        with TreeSampler(interval_s=0.1) as sampler:
            result = dg.materialize([burns_cpu, waits_on_a_child], instance=instance)
        rows = run_step_timings(instance, result.run_id, sampler)
        records = {(e.step_key, e.dagster_event.event_type): e.timestamp
                   for e in instance.all_logs(result.run_id) if e.dagster_event and e.step_key}
    assert [r.step for r in rows] == ["burns_cpu", "waits_on_a_child"]
    assert all(r.status == "success" and r.wall_s is not None and r.wall_s > 0 for r in rows)
    burn, wait = rows
    assert burn.start == records[("burns_cpu", dg.DagsterEventType.STEP_START)]
    assert burn.end == records[("burns_cpu", dg.DagsterEventType.STEP_SUCCESS)]
    # the busy step burnt its 0.6 s of CPU; the one that waited on `sleep` burnt far less
    assert burn.cpu_s is not None and burn.cpu_s >= 0.45
    assert wait.cpu_s is not None and wait.cpu_s < burn.cpu_s / 2
    assert [c.command for c in wait.children] == ["sleep 1.5"] and not burn.children
    assert wait.children[0].alive_s >= 1.0
    table = "\n".join(breakdown_lines(rows))
    assert "waits_on_a_child" in table and "sleep 1.5" in table and "load average" in table


@pytest.mark.slow
def test_a_breakdown_read_while_sampling_covers_the_last_step():
    """The demo prints each run's breakdown inside its sampler's block, right after the run:
    however long ago the last periodic look was, the last step's CPU seconds are known."""
    with dg.instance_for_test() as instance, TreeSampler(interval_s=3600) as sampler:
        result = dg.materialize([burns_cpu], instance=instance)
        [row] = run_step_timings(instance, result.run_id, sampler)
    assert row.cpu_s is not None and row.cpu_s >= 0.45


def test_cpu_is_none_where_the_samples_do_not_cover_the_step():
    samples = [(10.0, 1.0), (11.0, 2.0), (12.0, 2.5)]
    assert cpu_between(samples, 10.5, 11.5) == 0.75
    assert cpu_between(samples, 9.0, 11.0) is None and cpu_between(samples, 11.0, 13.0) is None


_KEPT: list[subprocess.Popen] = []


@dg.asset
def starts_and_keeps_a_child() -> None:
    _KEPT.append(subprocess.Popen(["sh", "-c", "sleep 30\ntrue"]))
    time.sleep(0.5)


@dg.asset(deps=[starts_and_keeps_a_child])
def uses_the_kept_child() -> None:
    time.sleep(1.0)
    child = _KEPT.pop()
    child.kill()
    child.wait()


def test_a_child_kept_up_into_a_later_step_is_listed_there_too():
    """load_timing hands its warm engine to serving_benchmark: the benchmark's row says it ran
    on a process started (and counted) in the earlier step; one command line per child."""
    with dg.instance_for_test() as instance:
        with TreeSampler(interval_s=0.1) as sampler:
            result = dg.materialize([starts_and_keeps_a_child, uses_the_kept_child],
                                    instance=instance)
        rows = run_step_timings(instance, result.run_id, sampler)
    first, second = rows
    assert [c.command for c in first.children] == ["sh -c sleep 30 true"]
    assert second.children == () and [c.pid for c in second.carried] == [first.children[0].pid]
    table = breakdown_lines(rows)
    line = next(t for t in table if "uses_the_kept_child" in t)
    assert "sh -c sleep 30 true (kept from starts_and_keeps_a_child)" in line
    assert len(table) == 4  # header, two steps, total: no command spills onto a line of its own


def test_a_child_seen_only_before_its_exec_is_not_named_as_this_process():
    """A child that lives less than one interval after its exec may only ever be seen between
    fork and exec, with this process's own command line: the demo's table then listed
    `python demo.py (0)` under load_timing, as if the demo had started itself again."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with TreeSampler(interval_s=0.05) as sampler:
        child = ctx.Process(target=time.sleep, args=(0.5,))  # forked, never exec's
        child.start()
        child.join()
    assert sampler.children[child.pid].command == FORK


def test_a_child_that_exited_before_the_first_look_says_so():
    """A zombie's command line is empty: one first seen that way was listed as `? (0)`."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # a zombie by its state (an empty command line alone is also what a process in the
    # middle of its exec shows)
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.02)
    with TreeSampler(interval_s=0.05) as sampler:
        child.wait()
    assert sampler.children[child.pid].command == EXITED


def test_a_child_is_named_by_what_it_executes_not_by_the_parent_it_was_forked_from():
    """A child first seen between fork and exec still has its parent's command line (the demo
    once listed its engine as `python demo.py`); it is named by what it runs once it has
    exec'd, and a child gone before the last look keeps the name it had."""
    with TreeSampler(interval_s=0.05) as sampler:
        code = "import os, time\ntime.sleep(0.5)\nos.execv('/bin/sleep', ['sleep', '0.7'])"
        child = subprocess.Popen([sys.executable, "-c", code])
        child.wait()
        time.sleep(0.2)
    assert sampler.children[child.pid].command == "sleep 0.7"
