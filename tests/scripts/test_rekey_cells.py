"""scripts/rekey_cells.py: results stored under the per-model partitioning move onto cells.

The old values are made the way the old graph made them: assets partitioned by model alone,
materialized into a real instance with the filesystem IO manager; the script moves them and
the cell-partitioned stored value reads back equal, with the run it came from recorded.
"""

from __future__ import annotations

import subprocess
import sys

import dagster as dg
import pytest

from assets.partitions import cells_partitions, models_partitions
from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.stats import LoadTimingResult
from resources.upstream import latest_materialization, stored_value
from scripts import rekey_cells

OLD = LoadTimingResult(model="m", precision="bf16", servable=True, reason="",
                       cold_start_p50_s=7.0, cold_start_p95_s=8.0, warm_start_p50_s=1.0,
                       weight_bytes=10, node_type="cpu", config_hash="c0ffee")


def _old_graph_run(instance: dg.DagsterInstance) -> str:
    """One run of the per-model graph: load timing recording its node type, served accuracy
    not, readiness judging every target."""

    @dg.asset(name="load_timing", partitions_def=models_partitions)
    def load_timing():
        return dg.Output(OLD, metadata={"node_type": "cpu"})

    @dg.asset(name="served_accuracy", partitions_def=models_partitions)
    def served_accuracy():
        return {"bf16": 0.5}

    @dg.asset(name="readiness", partitions_def=models_partitions)
    def readiness():
        return "judged every target at once"

    instance.add_dynamic_partitions("models", ["m", "no-type"])
    result = dg.materialize([load_timing, served_accuracy, readiness], instance=instance,
                            partition_key="m")
    assert result.success

    @dg.asset(name="serving_benchmark", partitions_def=models_partitions)
    def serving_benchmark():
        return "a benchmark from before node types were recorded"

    assert dg.materialize([serving_benchmark], instance=instance,
                          partition_key="no-type").success
    return result.run_id


def test_measured_values_move_to_their_cell_and_read_back_equal():
    with dg.instance_for_test() as instance:
        run_id = _old_graph_run(instance)
        moves = {(m.asset, m.model): m for m in rekey_cells.plan(instance)}
        assert moves[("load_timing", "m")].node_type == "cpu"
        # served accuracy recorded no node type: its run's load timing did
        assert moves[("served_accuracy", "m")].node_type == "cpu"
        assert moves[("serving_benchmark", "no-type")].node_type == ""
        assert ("readiness", "m") not in moves  # derived: re-rendered, not moved

        cells = rekey_cells.apply(instance, list(moves.values()))

        assert cells == ["m|cpu"]
        io = dg.FilesystemIOManager()
        with dg.build_resources({"io_manager": io}, instance=instance) as built:
            value = stored_value(built.io_manager, instance, "load_timing", "m|cpu",
                                 cells_partitions)
            assert value == OLD
            assert stored_value(built.io_manager, instance, "served_accuracy", "m|cpu",
                                cells_partitions) == {"bf16": 0.5}
        mat = latest_materialization(instance, "load_timing", "m|cpu")
        assert mat.metadata["rekeyed_from_run"].value == run_id
        assert mat.metadata["node_type"].value == "cpu"
        # what could not be told stays where it was
        assert latest_materialization(instance, "serving_benchmark", "no-type") is not None
        assert (rekey_cells.storage_dir(instance) / "serving_benchmark" / "no-type").is_file()
        # a second pass finds nothing more to move (the cell's folder is no old key)
        assert [m for m in rekey_cells.plan(instance) if m.node_type] == [
            m for m in moves.values() if m.node_type]  # the old records are history, kept
        again = rekey_cells.apply(instance, [m for m in rekey_cells.plan(instance)
                                             if m.node_type])
        assert again == []  # their files moved already: nothing is moved twice


@pytest.mark.slow
def test_the_dry_run_moves_nothing(tmp_path):
    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        _old_graph_run(instance)
    proc = subprocess.run([sys.executable, "scripts/rekey_cells.py"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={"DAGSTER_HOME": str(home), "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": str(PROJECT_ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "load_timing[m]: -> cell m|cpu" in proc.stdout
    assert "serving_benchmark[no-type]: left as it is" in proc.stdout
    assert "readiness[m]: per model" in proc.stdout and "dry run" in proc.stdout
    assert (home / "storage" / "load_timing" / "m").is_file()
