"""Stand-ins and result readers the asset tests share: upstream stages stored as fixed values
at their partition level (a model's own stages keyed by model, its cells by (model, node
type); assets/partitions.py), what a materialization recorded, several runs read as one, and
a run-status sensor evaluated on a run."""

from __future__ import annotations

from typing import Any

import dagster as dg

from assets.partitions import cell_key, cells_partitions, models_partitions, split_cell

# The cell-level stages (assets/partitions.py; pipelines/jobs.py CELL_ASSETS holds the same).
CELL_LEVEL = frozenset({"served_accuracy", "config_search", "load_timing", "serving_benchmark",
                        "kserve_manifest",
                        "operations", "readiness", "readiness_report"})


def level_of(name: str) -> dg.PartitionsDefinition:
    """The partitions of a stage by name: cells for the GPU-dependent ones, else models."""
    return cells_partitions if name in CELL_LEVEL else models_partitions


def upstream_specs(*names: str) -> list[dg.AssetSpec]:
    """External specs of upstream stages, each at its level."""
    return [dg.AssetSpec(n, partitions_def=level_of(n)) for n in names]


def stand_in(name: str, value, partitions_def: dg.PartitionsDefinition | None = None
             ) -> dg.AssetsDefinition:
    """An asset named like an upstream stage that stores exactly `value`."""
    @dg.asset(name=name, partitions_def=partitions_def or level_of(name))
    def _stand_in():
        return value

    return _stand_in


def register(instance: dg.DagsterInstance, model: str, node_type: str | None = None) -> None:
    """The model's partition, and the node type's where given."""
    if not instance.has_dynamic_partition("models", model):
        instance.add_dynamic_partitions("models", [model])
    if node_type and not instance.has_dynamic_partition("node_types", node_type):
        instance.add_dynamic_partitions("node_types", [node_type])


def _model(key: str) -> str:
    return split_cell(key)[0] if "|" in str(key) else str(key)


def store_upstream(instance: dg.DagsterInstance, key: str, node_type: str | None = None,
                   **values) -> None:
    """Materialize stand-ins of the upstream stages that store exactly `values`: the per-model
    ones under the model, the cell-level ones under (model, node type); the node type is
    `node_type`, else the value's own (`node_type` of a LoadTimingResult or
    ServingBenchmarkResult), else the one in a cell `key`."""
    model = _model(key)
    register(instance, model)
    per_model = {n: v for n, v in values.items() if n not in CELL_LEVEL}
    if per_model:
        assert dg.materialize([stand_in(n, v) for n, v in per_model.items()], instance=instance,
                              partition_key=model).success
    for name, value in values.items():
        if name not in CELL_LEVEL:
            continue
        nt = node_type or getattr(value, "node_type", None) or (
            split_cell(key)[1] if "|" in str(key) else None)
        if not nt:
            raise ValueError(f"{name}: say its node type (node_type=...)")
        register(instance, model, nt)
        assert dg.materialize([stand_in(name, value)], instance=instance,
                              partition_key=str(cell_key(model, nt))).success


def metadata(result, asset: str) -> dict:
    """The metadata values `asset`'s materialization recorded in this run."""
    for e in result.get_asset_materialization_events():
        if e.asset_key == dg.AssetKey(asset):
            return {k: getattr(v, "value", v) for k, v in e.materialization.metadata.items()}
    raise AssertionError(f"{asset} was not materialized")


class Runs:
    """Several runs of one test read as one result (a model's run, then its cell's: one run
    cannot hold both levels); a later run's value of an asset wins."""

    def __init__(self, results: list[dg.ExecuteInJobResult]):
        self.results = results

    @property
    def success(self) -> bool:
        return all(r.success for r in self.results)

    def _with(self, name: str) -> dg.ExecuteInJobResult:
        for r in reversed(self.results):
            if any(e.asset_key == dg.AssetKey(name)
                   for e in r.get_asset_materialization_events()):
                return r
        raise AssertionError(f"{name} was not materialized")

    def output_for_node(self, name: str, output_name: str = "result") -> Any:
        return self._with(name).output_for_node(name, output_name)

    def asset_value(self, name: str) -> Any:
        return self._with(name).asset_value(name)

    def get_asset_materialization_events(self) -> list:
        return [e for r in self.results for e in r.get_asset_materialization_events()]

    def get_asset_check_evaluations(self) -> list:
        return [e for r in self.results for e in r.get_asset_check_evaluations()]

    def get_step_failure_events(self) -> list:
        return [e for r in self.results for e in r.get_step_failure_events()]

    @property
    def all_events(self) -> list:
        return [e for r in self.results for e in r.all_events]

    @property
    def run_id(self) -> str:
        return self.results[-1].run_id


def after_success(sensor: dg.RunStatusSensorDefinition, instance: dg.DagsterInstance,
                  defs: dg.Definitions, run_id: str):
    """A run-status sensor evaluated on a successful run, as the daemon evaluates it (the
    definitions' `configs` resource at hand)."""
    run = instance.get_run_by_id(run_id)
    [success] = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.RUN_SUCCESS).records
    ctx = dg.build_run_status_sensor_context(
        sensor_name=sensor.name, dagster_instance=instance, dagster_run=run,
        dagster_event=success.event_log_entry.dagster_event,
        repository_def=defs.get_repository_def(), resources={"configs": defs.resources["configs"]})
    return sensor(ctx)
