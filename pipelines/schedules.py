"""Re-validation: on a cron from configs/automation.yaml, re-run the stack-dependent stages of
every ready model whose results were measured on another serving stack.

A schedule, not declarative automation, on purpose: re-validating a fleet is GPU-hours, so it
runs at a stated time, only for models that finished onboarding (`ready_assets`), one run per
model and fingerprint (run key), and it can be evaluated on demand from the UI. An eager
automation condition would also fire for half-onboarded models and whenever the daemon happens
to notice. docs/automation.md has the longer argument.
"""

from typing import Any

import dagster as dg

from assets.stack import SERVING_STACK, STACK_FINGERPRINT_KEY, current_stack
from onboarding.automation import load_automation
from pipelines.executors import onboarding_executor
from pipelines.launch import job_stages
from pipelines.partitions import models_partitions

REVALIDATE_JOB = "revalidate_model"
# Stages whose results change with the serving stack; each depends on `serving_stack`.
STACK_DEPENDENT = ("quantized", "accuracy", "load_timing", "serving_benchmark",
                   "deployment_plan", "kserve_manifest")
STACK_INPUT_TAG = f"dagster/input_data_version/{SERVING_STACK.to_user_string()}"
# What Dagster records as an input version when there is no observation to take it from.
_DAGSTER_MARKERS = frozenset({"INITIAL", "NULL", "UNKNOWN"})
UNKNOWN_STACK = "unknown"


def _latest(instance: dg.DagsterInstance, asset: str, partition: str):
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]),
        limit=1).records
    return records[0].asset_materialization if records else None


def measured_on(mat: dg.AssetMaterialization) -> str:
    """The stack fingerprint a materialization was produced on.

    Dagster's input version when it is a fingerprint (the observation in force when the step
    ran, also what the UI's staleness uses); when the run came before any observation Dagster
    records only a marker (`INITIAL`), and the fingerprint the asset recorded itself
    (`serving_stack_fingerprint`) decides. `unknown` when neither exists.
    """
    tagged = (mat.tags or {}).get(STACK_INPUT_TAG)
    if tagged and tagged not in _DAGSTER_MARKERS:
        return tagged
    recorded = mat.metadata.get(STACK_FINGERPRINT_KEY)
    return str(recorded.value) if recorded is not None else UNKNOWN_STACK


def stale_ready_models(instance: dg.DagsterInstance, fingerprint: str,
                       ready_assets: list[str]) -> dict[str, dict[str, Any]]:
    """Ready models whose stack-dependent materializations were produced on another stack.

    Returns model -> {stale asset: the fingerprint it was measured on, or `unknown`}.
    """
    out: dict[str, dict[str, Any]] = {}
    for model in sorted(instance.get_dynamic_partitions(models_partitions.name)):
        if any(_latest(instance, a, model) is None for a in ready_assets):
            continue
        stale = {}
        for asset in STACK_DEPENDENT:
            mat = _latest(instance, asset, model)
            if mat is not None and (seen := measured_on(mat)) != fingerprint:
                stale[asset] = seen
        if stale:
            out[model] = stale
    return out


_cfg = load_automation().revalidation


@dg.schedule(
    cron_schedule=_cfg.cron,
    execution_timezone=_cfg.timezone,
    job_name=REVALIDATE_JOB,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Re-validates ready models whose results were measured on another serving "
    "stack (configs/automation.yaml `revalidation`).",
)
def revalidation_schedule(context: dg.ScheduleEvaluationContext):
    fp, _ = current_stack()
    cfg = load_automation()
    stale = stale_ready_models(context.instance, fp, cfg.revalidation.ready_assets)
    if not stale:
        return dg.SkipReason(f"every ready model is current with stack {fp[:16]}")
    for model, assets in stale.items():
        context.log.info(f"{model}: stale against stack {fp[:16]}: "
                         + ", ".join(f"{a} (measured on {v[:16]})" for a, v in assets.items()))
    return [
        dg.RunRequest(partition_key=model, run_key=f"revalidate-{model}@{fp[:16]}",
                      run_config=cfg.launch.run_config(
                          cfg.launch.automatic_sweep,
                          job_stages(context.repository_def, REVALIDATE_JOB)),
                      tags={"onboarding/trigger": "revalidation",
                            "onboarding/stack_fingerprint": fp,
                            "onboarding/stale_assets": ",".join(sorted(assets))})
        for model, assets in stale.items()
    ]


def revalidate_job(present: set[dg.AssetKey]):
    """serving_stack (observed first, on the node the run uses) and every stack-dependent stage
    that exists, with what lies downstream of them; `checkpoint` is not re-fetched."""
    dependent = [dg.AssetKey(a) for a in STACK_DEPENDENT if dg.AssetKey(a) in present]
    selection = dg.AssetSelection.assets(SERVING_STACK)
    if dependent:
        selection = selection | dg.AssetSelection.assets(*dependent).downstream()
    return dg.define_asset_job(
        REVALIDATE_JOB, selection=selection, executor_def=onboarding_executor(),
        description="Observe the serving stack, then re-run the stages whose results depend "
        "on it, for one model.")


def verdict_changes(instance: dg.DagsterInstance, run_id: str, model: str) -> list[dict]:
    """Each check this run evaluated, with the verdict the partition had before it.

    `before` is None when the check never ran for the partition before this run.
    """
    from dagster._core.storage.asset_check_execution_record import (
        COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES,
        AssetCheckExecutionRecordStatus,
    )

    rows = []
    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records
    for record in records:
        evaluation = record.event_log_entry.dagster_event.event_specific_data
        key = evaluation.asset_check_key
        before = None
        history = instance.event_log_storage.get_asset_check_execution_history(
            key, limit=50, status=COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES)
        for prior in history:
            if prior.run_id == run_id or prior.partition not in (model, None):
                continue
            if prior.partition is None:
                run = instance.get_run_by_id(prior.run_id)
                if run is None or run.tags.get("dagster/partition") != model:
                    continue
            before = prior.status == AssetCheckExecutionRecordStatus.SUCCEEDED
            break
        rows.append({"asset": key.asset_key.to_user_string(), "check": key.name,
                     "before": before, "after": bool(evaluation.passed)})
    return rows


def _verdict(passed: bool | None) -> str:
    return "never run" if passed is None else "passed" if passed else "failed"


def report_revalidation(context: dg.RunStatusSensorContext) -> dg.SkipReason | None:
    """Record on each re-validated asset whether its gates and SLO verdicts changed."""
    run = context.dagster_run
    if run.job_name != REVALIDATE_JOB:
        return dg.SkipReason(f"{run.job_name} is not {REVALIDATE_JOB}")
    model = run.tags.get("dagster/partition")
    rows = verdict_changes(context.instance, run.run_id, model)
    by_asset: dict[str, list[dict]] = {}
    for row in rows:
        by_asset.setdefault(row["asset"], []).append(row)
    for asset, checks in by_asset.items():
        changed = [c for c in checks if c["before"] is not None and c["before"] != c["after"]]
        summary = "; ".join(f"{c['check']}: {_verdict(c['before'])} -> {_verdict(c['after'])}"
                            for c in changed) or "unchanged"
        context.log.info(f"{model} {asset}: re-validation verdicts {summary}")
        context.instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=asset, partition=model, metadata={
                "revalidation_run": run.run_id,
                "run_status": run.status.value,
                "stack_fingerprint": run.tags.get("onboarding/stack_fingerprint", "unknown"),
                "verdict_changed": bool(changed),
                "verdict_change": summary,
                "verdicts": dg.MetadataValue.md(
                    "| check | before | after |\n|---|---|---|\n" + "\n".join(
                        f"| {c['check']} | {_verdict(c['before'])} | {_verdict(c['after'])} |"
                        for c in checks)),
            }))
    return None


def revalidation_verdict_sensors(job) -> list[dg.RunStatusSensorDefinition]:
    """Run-status sensors on `job` (the revalidate_model job): one for success, one for
    failure, since a blocking gate that now fails ends the run as a failure."""

    @dg.run_status_sensor(name="revalidation_verdicts_on_success",
                          run_status=dg.DagsterRunStatus.SUCCESS, monitored_jobs=[job],
                          default_status=dg.DefaultSensorStatus.RUNNING,
                          description="After a successful re-validation: did a gate or SLO "
                          "verdict change? Recorded as an observation on each re-validated "
                          "asset.")
    def on_success(context: dg.RunStatusSensorContext):
        return report_revalidation(context)

    @dg.run_status_sensor(name="revalidation_verdicts_on_failure",
                          run_status=dg.DagsterRunStatus.FAILURE, monitored_jobs=[job],
                          default_status=dg.DefaultSensorStatus.RUNNING,
                          description="After a failed re-validation (a blocking gate now "
                          "fails): the verdict changes, recorded on each re-validated asset.")
    def on_failure(context: dg.RunStatusSensorContext):
        return report_revalidation(context)

    return [on_success, on_failure]
