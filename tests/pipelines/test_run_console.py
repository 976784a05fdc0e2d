"""The demo's terminal (pipelines/run_console.py): one line per step with its time, checks and
failure, nothing of Dagster's own console logger, every event in the log file it names."""

from __future__ import annotations

import io
import re
import uuid

import dagster as dg

from pipelines.run_console import QUIET_CONSOLE, RunConsole


@dg.asset
def first(context) -> int:
    context.log.info("halfway there")
    return 1


@dg.asset(check_specs=[dg.AssetCheckSpec("positive", asset="checked"),
                       dg.AssetCheckSpec("small", asset="checked")])
def checked(first: int):
    yield dg.Output(first)
    yield dg.AssetCheckResult(check_name="positive", passed=first > 0)
    yield dg.AssetCheckResult(check_name="small", passed=first > 5)


@dg.asset
def second(first: int) -> int:
    raise ValueError("the disk is full\nand a second line")


@dg.asset
def third(second: int) -> int:
    return second


def test_one_line_per_step_and_every_event_in_the_file(tmp_path, capfd):
    job = dg.Definitions(assets=[first, checked, second, third],
                         jobs=[dg.define_asset_job("j")]).resolve_job_def("j")
    out, run_id = io.StringIO(), str(uuid.uuid4())
    log_path = tmp_path / "runs" / f"{run_id}.log"
    with dg.instance_for_test() as instance, \
            RunConsole(instance, run_id, log_path, out=out, poll_s=0.05, live=False):
        result = job.execute_in_process(instance=instance, run_id=run_id,
                                        run_config=QUIET_CONSOLE, raise_on_error=False)
    assert not result.success
    lines = out.getvalue().splitlines()
    assert lines[0] == "  first: started"
    assert re.fullmatch(r"  first: done in \d+ s", lines[1])
    checked_done = next(ln for ln in lines if ln.startswith("  checked: done"))
    assert re.fullmatch(r"  checked: done in \d+ s, checks 1 of 2 passed", checked_done)
    [failed] = [ln for ln in lines if ln.startswith("  second: FAILED")]
    assert re.fullmatch(r"  second: FAILED after \d+ s: ValueError: the disk is full", failed)
    assert "  second: started" in lines and "  third: started" not in lines
    text = log_path.read_text()
    assert re.search(r"^\d\d:\d\d:\d\d DEBUG +first STEP_START: ", text, re.MULTILINE)
    assert re.search(r"^\d\d:\d\d:\d\d INFO +first: halfway there$", text, re.MULTILINE)
    captured = capfd.readouterr()
    assert "STEP_START" not in captured.err + captured.out  # the console logger said nothing
