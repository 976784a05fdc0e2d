"""The cells of a model: after its own stages, one run per node type of the fleet.

A run has one partition key, so a model's stages (per model) and its cells (model x node type)
are two jobs (pipelines/jobs.py). `cells_after_model` chains them: when a model's onboarding or
re-validation run succeeds, it requests that model's cells.

- Which node types: the catalog entry's `node_types`, else the fleet's (deploy.yaml
  `target_node_types` and the embedded `cpu`).
- Measured or planned: a cell is measured (`onboard_cell`) where its GPU steps can run on its
  node type: every node type of nodes.yaml on the k8s executor (the run's partition places the
  step pods on that pool), locally only the engine's own node type (ONBOARDING_NODE_TYPE). The
  others are planned (`plan_cell`): rendered and judged from whatever was measured there, so
  the grid shows every cell and says why it is not ready.
- Only after a run that planned the model (the whole job, or a selection with serving_config):
  a fetch alone gives the cells nothing to render from.
- After a re-validation of the model's own stages, the cells already onboarded are re-validated
  (`revalidate_cell`); the schedule re-runs stale cells by themselves (pipelines/schedules.py).
"""

from __future__ import annotations

import os

import dagster as dg

from assets.partitions import LOCAL_NODE_TYPE, cell_key, node_types_partitions, split_cell
from onboarding.common.config import deep_merge
from onboarding.runs.cluster import EXECUTOR_ENV, NODE_TYPE_ENV, executor_kind
from pipelines.executors import cell_run_config
from pipelines.jobs import onboard_cell, onboard_model, plan_cell
from pipelines.launch import job_stages
from pipelines.schedules import (
    REVALIDATE_CELL_JOB,
    onboarded_cells,
    revalidate_cell_job,
    revalidate_job,
)
from resources.config_files import ConfigFiles

CELL_TRIGGER_TAG = "onboarding/after_run"
SERVING_CONFIG = dg.AssetKey("serving_config")


def fleet_node_types(configs: ConfigFiles) -> list[str]:
    """The fleet's node types: deploy.yaml's deployment targets, then the embedded `cpu`."""
    targets = list(configs.deploy().target_node_types)
    return [*targets, *([LOCAL_NODE_TYPE] if LOCAL_NODE_TYPE not in targets else [])]


def measurable_here(configs: ConfigFiles) -> set[str]:
    """Node types whose cells this deployment can measure: every GPU node type on the k8s
    executor, else the engine's own."""
    if executor_kind(configs.cluster, os.environ.get(EXECUTOR_ENV)) == "k8s":
        return set(configs.nodes().node_types)
    return {(os.environ.get(NODE_TYPE_ENV) or "").strip() or LOCAL_NODE_TYPE}


def cells_of(model_node_types: list[str] | None, configs: ConfigFiles) -> dict[str, str]:
    """node type -> the job its cell runs: onboard_cell where it can be measured, plan_cell
    where not."""
    fleet = fleet_node_types(configs)
    wanted = model_node_types if model_node_types else fleet
    here = measurable_here(configs)
    return {nt: onboard_cell.name if nt in here else plan_cell.name for nt in wanted}


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS, monitored_jobs=[onboard_model, revalidate_job],
    request_jobs=[onboard_cell, plan_cell, revalidate_cell_job],
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="After a model's own stages succeed: one run per cell of the model (measured "
    "where its node type can run, else planned); after their re-validation, the onboarded "
    "cells' re-validation.")
def cells_after_model(context: dg.RunStatusSensorContext, configs: ConfigFiles):
    run = context.dagster_run
    model = run.tags.get("dagster/partition", "")
    if not model:
        return dg.SkipReason(f"run {run.run_id} has no model partition")
    if run.asset_selection and SERVING_CONFIG not in run.asset_selection:  # empty: the job
        # a subset that did not plan (a fetch alone): the cells would render from nothing new
        return dg.SkipReason(f"run {run.run_id} of {model} did not plan it (no "
                             "serving_config in its selection): no cell follows")
    passed = {k: v for k, v in run.tags.items()
              if k.startswith("onboarding/") and k != CELL_TRIGGER_TAG}
    registered = set(context.instance.get_dynamic_partitions(node_types_partitions.name))
    if run.job_name == revalidate_job.name:
        ready = configs.automation().revalidation.ready_assets
        cells = {split_cell(key)[1]: REVALIDATE_CELL_JOB
                 for key in onboarded_cells(context.instance, ready, model)}
    else:
        spec = configs.catalog().specs.get(model) or configs.discovered().specs.get(model)
        cells = cells_of(spec.node_types if spec else None, configs)
    missing = sorted(nt for nt in cells if nt not in registered)
    if missing:
        context.instance.add_dynamic_partitions(node_types_partitions.name, missing)
    requests = []
    for nt, job in cells.items():
        stages = job_stages(context.repository_def, job)
        launch = configs.automation().launch
        sweep = passed.get("onboarding/sweep") or launch.default_sweep
        requests.append(dg.RunRequest(
            job_name=job, partition_key=str(cell_key(model, nt)),
            run_key=f"{run.run_id}:{nt}",
            # the sweep's config over the cell's placement: a run request's own run config
            # replaces the job's partitioned config, so it carries both
            run_config=deep_merge(cell_run_config(str(cell_key(model, nt)), configs),
                                  launch.run_config(sweep, stages)
                                  if job != plan_cell.name else {}),
            tags={**passed, CELL_TRIGGER_TAG: run.run_id}))
    if not requests:
        return dg.SkipReason(f"{model}: no cell to run")
    context.log.info(f"{model}: " + ", ".join(f"{nt} ({job})" for nt, job in cells.items()))
    return requests


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Registers the fleet's node types (deploy.yaml target_node_types and "
           "the embedded cpu, plus any a catalog entry names) as `node_types` partitions: the "
           "columns of the readiness grid.")
def fleet_partitions_sensor(context: dg.SensorEvaluationContext, configs: ConfigFiles):
    wanted = set(fleet_node_types(configs))
    for spec in configs.catalog().specs.values():
        wanted.update(spec.node_types or ())
    existing = set(context.instance.get_dynamic_partitions(node_types_partitions.name))
    new = sorted(wanted - existing)
    if not new:
        return dg.SkipReason(f"all {len(wanted)} node type(s) of the fleet are registered")
    context.log.info(f"registering node type(s) {', '.join(new)}")
    return dg.SensorResult(
        dynamic_partitions_requests=[node_types_partitions.build_add_request(new)])
