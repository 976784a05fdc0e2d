"""Re-validation: on a cron from configs/automation.yaml, re-run the stack-dependent stages of
every onboarded model whose results were measured on another serving stack.

Onboarded means every `revalidation.ready_assets` is materialized for the partition, whatever
the model's `readiness` verdict: a new stack can turn "not ready" into "ready" (or back), so a
model that missed its SLOs is re-validated too; the verdict before is tagged on the run.

A schedule, not declarative automation, on purpose: re-validating a fleet is GPU-hours, so it
runs at a stated time, only for models that finished onboarding (`ready_assets`), one run per
model and fingerprint (run key), and it can be evaluated on demand from the UI. An eager
automation condition would also fire for half-onboarded models and whenever the daemon happens
to notice. docs/automation.md has the longer argument.

Which stages depend on the stack is read off the asset graph: the assets that name
`serving_stack` in their decorators (`deps=[SERVING_STACK]`).
"""

from typing import Any

import dagster as dg

from assets.partitions import models_partitions
from assets.stack import SERVING_STACK, STACK_FINGERPRINT_KEY, current_stack
from onboarding.common.tables import md_table
from pipelines.automation import AT_LOAD
from pipelines.executors import onboarding_executor
from pipelines.jobs import LAYOUT_ASSETS
from pipelines.launch import job_stages
from resources.config_files import ConfigFiles
from resources.upstream import latest_materialization

REVALIDATE_JOB = "revalidate_model"
STACK_INPUT_TAG = f"dagster/input_data_version/{SERVING_STACK.to_user_string()}"
STACK_DEPENDENT = dg.AssetSelection.assets(SERVING_STACK).downstream(depth=1) - \
    dg.AssetSelection.assets(SERVING_STACK)
# What Dagster records as an input version when there is no observation to take it from.
_DAGSTER_MARKERS = frozenset({"INITIAL", "NULL", "UNKNOWN"})
UNKNOWN_STACK = "unknown"


def stack_dependent(asset_graph) -> list[str]:
    """Names of the assets that depend on serving_stack directly, in this code location."""
    return sorted(k.to_user_string() for k in STACK_DEPENDENT.resolve(asset_graph))


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


def readiness_verdict(instance: dg.DagsterInstance, model: str) -> str:
    """The latest `readiness` verdict of a model (assets/readiness.py), in words."""
    mat = latest_materialization(instance, "readiness", model)
    verdict = mat.metadata.get("verdict") if mat is not None else None
    return str(verdict.value) if verdict is not None else "not judged yet"


def stale_onboarded_models(instance: dg.DagsterInstance, fingerprint: str,
                           ready_assets: list[str], dependent: list[str]
                           ) -> dict[str, dict[str, Any]]:
    """Onboarded models (every `ready_assets` materialized, whatever their readiness verdict)
    whose stack-dependent materializations were produced on another stack.

    Returns model -> {stale asset: the fingerprint it was measured on, or `unknown`}.
    """
    out: dict[str, dict[str, Any]] = {}
    for model in sorted(instance.get_dynamic_partitions(models_partitions.name)):
        if any(latest_materialization(instance, a, model) is None for a in ready_assets):
            continue
        stale = {}
        for asset in dependent:
            mat = latest_materialization(instance, asset, model)
            if mat is not None and (seen := measured_on(mat)) != fingerprint:
                stale[asset] = seen
        if stale:
            out[model] = stale
    return out


@dg.schedule(
    cron_schedule=AT_LOAD.cron,
    execution_timezone=AT_LOAD.timezone,
    job_name=REVALIDATE_JOB,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Re-validates onboarded models (every revalidation.ready_assets materialized), "
    "whatever their readiness verdict, whose results were measured on another serving stack "
    "(configs/automation.yaml `revalidation`).",
)
def revalidation_schedule(context: dg.ScheduleEvaluationContext, configs: ConfigFiles):
    AT_LOAD.check()
    fp, _ = current_stack(configs)
    cfg = configs.automation()
    stale = stale_onboarded_models(context.instance, fp, cfg.revalidation.ready_assets,
                               stack_dependent(context.repository_def.asset_graph))
    if not stale:
        return dg.SkipReason(f"every onboarded model is current with stack {fp[:16]}")
    verdicts = {model: readiness_verdict(context.instance, model) for model in stale}
    for model, assets in stale.items():
        context.log.info(f"{model} ({verdicts[model]}): stale against "
                         f"stack {fp[:16]}: " + ", ".join(
                             f"{a} (measured on {v[:16]})" for a, v in assets.items()))
    stages = job_stages(context.repository_def, REVALIDATE_JOB)
    return [
        dg.RunRequest(partition_key=model, run_key=f"revalidate-{model}@{fp[:16]}",
                      run_config=cfg.launch.run_config(cfg.launch.automatic_sweep, stages),
                      tags={"onboarding/trigger": "revalidation",
                            "onboarding/stack_fingerprint": fp,
                            "onboarding/ready_before": verdicts[model],
                            "onboarding/stale_assets": ",".join(sorted(assets))})
        for model, assets in stale.items()
    ]


revalidate_job = dg.define_asset_job(
    REVALIDATE_JOB,
    selection=dg.AssetSelection.assets(SERVING_STACK).downstream() - LAYOUT_ASSETS,
    executor_def=onboarding_executor(),
    description="Observe the serving stack, then re-run the stages whose results depend on it "
    "(and what lies downstream of them), for one model; `checkpoint` is not re-fetched.")


def _check_verdicts(instance: dg.DagsterInstance, run_id: str) -> dict[dg.AssetCheckKey, bool]:
    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records
    out = {}
    for record in records:
        evaluation = record.event_log_entry.dagster_event.event_specific_data
        out[evaluation.asset_check_key] = bool(evaluation.passed)
    return out


def verdict_changes(instance: dg.DagsterInstance, run_id: str, model: str,
                    lookback_runs: int = 50) -> list[dict]:
    """Each check this run evaluated, with the verdict the partition had before it: the
    newest earlier run of this model that evaluated the same check.

    `before` is None when the check never ran for the partition before this run.
    """
    after = _check_verdicts(instance, run_id)
    earlier = [r for r in instance.get_runs(
        filters=dg.RunsFilter(tags={"dagster/partition": model}), limit=lookback_runs)
        if r.run_id != run_id]
    before: dict[dg.AssetCheckKey, bool] = {}
    for run in earlier:  # newest first
        for key, passed in _check_verdicts(instance, run.run_id).items():
            before.setdefault(key, passed)
        if set(after) <= set(before):
            break
    return [{"asset": key.asset_key.to_user_string(), "check": key.name,
             "before": before.get(key), "after": passed} for key, passed in after.items()]


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
                "readiness": readiness_verdict(context.instance, model),
                "verdicts": dg.MetadataValue.md(md_table(
                    {"check": c["check"], "before": _verdict(c["before"]),
                     "after": _verdict(c["after"])} for c in checks)),
            }))
    return None


def _verdicts_sensor(status: dg.DagsterRunStatus, description: str
                     ) -> dg.RunStatusSensorDefinition:
    """`report_revalidation` after a re-validation run that ended in `status` (a run-status
    sensor watches one status)."""
    return dg.run_status_sensor(name=f"revalidation_verdicts_on_{status.value.lower()}",
                                run_status=status, monitored_jobs=[revalidate_job],
                                default_status=dg.DefaultSensorStatus.RUNNING,
                                description=description)(report_revalidation)


revalidation_sensors = [
    _verdicts_sensor(dg.DagsterRunStatus.SUCCESS, "After a successful re-validation: did a "
                     "gate or SLO verdict change? Recorded as an observation on each "
                     "re-validated asset."),
    _verdicts_sensor(dg.DagsterRunStatus.FAILURE, "After a failed re-validation (a blocking "
                     "gate now fails): the verdict changes, recorded on each re-validated "
                     "asset."),
]
