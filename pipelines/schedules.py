"""Re-validation: on a cron from configs/automation.yaml, re-run the stack-dependent stages of
every onboarded model whose results were measured on another serving stack, and the
spec-dependent ones of every onboarded model whose catalog entry changed since they ran.

Onboarded means every `revalidation.ready_assets` is materialized for the partition, whatever
the model's `readiness` verdict: a new stack can turn "not ready" into "ready" (or back), so a
model that missed its SLOs is re-validated too; the verdict before is tagged on the run.

A schedule, not declarative automation, on purpose: re-validating a fleet is GPU-hours, so it
runs at a stated time, only for models that finished onboarding (`ready_assets`), one run per
model and fingerprint (run key), and it can be evaluated on demand from the UI. An eager
automation condition would also fire for half-onboarded models and whenever the daemon happens
to notice. docs/automation.md has the longer argument.

Which stages depend on the stack, and which on the spec, is read off the asset graph: the assets
that name `serving_stack` (`model_spec`) in their decorators (`deps=[SERVING_STACK,
MODEL_SPEC]`).
"""

from typing import Any

import dagster as dg

from assets.model_spec import MODEL_SPEC, SPEC_VERSION_KEY, spec_version
from assets.partitions import (
    CELL_DERIVED,
    CELL_MEASURED,
    FLEET,
    cells_partitions,
    level_selection,
    materialized_cells,
    split_cell,
)
from assets.stack import SERVING_STACK, STACK_FINGERPRINT_KEY, current_stack
from onboarding.common.config import deep_merge
from onboarding.common.tables import md_table
from pipelines.automation import AT_LOAD
from pipelines.executors import cell_run_config, cell_run_tags, onboarding_executor
from pipelines.jobs import CELL_ASSETS, FLEET_ASSETS, LAYOUT_ASSETS
from pipelines.launch import job_stages
from resources.config_files import ConfigFiles
from resources.upstream import latest_materialization, stored_value

REVALIDATE_JOB = "revalidate_model"
REVALIDATE_CELL_JOB = "revalidate_cell"
READINESS = dg.AssetKey("readiness")
STACK_INPUT_TAG = f"dagster/input_data_version/{SERVING_STACK.to_user_string()}"
STACK_DEPENDENT = dg.AssetSelection.assets(SERVING_STACK).downstream(depth=1) - \
    dg.AssetSelection.assets(SERVING_STACK)
SPEC_DEPENDENT = dg.AssetSelection.assets(MODEL_SPEC).downstream(depth=1) - \
    dg.AssetSelection.assets(MODEL_SPEC)
# What Dagster records as an input version when there is no observation to take it from.
_DAGSTER_MARKERS = frozenset({"INITIAL", "NULL", "UNKNOWN"})
UNKNOWN_STACK = "unknown"


def stack_dependent(asset_graph) -> list[str]:
    """Names of the assets that depend on serving_stack directly, in this code location."""
    return sorted(k.to_user_string() for k in STACK_DEPENDENT.resolve(asset_graph))


def spec_dependent(asset_graph) -> list[str]:
    """Names of the assets that depend on model_spec directly, in this code location."""
    return sorted(k.to_user_string() for k in SPEC_DEPENDENT.resolve(asset_graph))


def spec_read(mat: dg.AssetMaterialization) -> str:
    """The spec version a materialization read, as the asset recorded it (`spec_metadata`);
    `unknown` when it did not. Dagster's input version of a partitioned dependency is a hash
    over the dependency's partition versions, not the version itself, so it is the UI's to
    compare (its stale marker), not this schedule's."""
    recorded = mat.metadata.get(SPEC_VERSION_KEY)
    return str(recorded.value) if recorded is not None else UNKNOWN_STACK


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


def cell_verdict(io_manager: dg.IOManager, instance: dg.DagsterInstance, cell: str) -> str:
    """The latest `readiness` verdict of one cell, in words: the `Readiness` value the asset
    stored (assets/readiness.py), not its metadata, which is for people."""
    verdict = stored_value(io_manager, instance, READINESS, cell, cells_partitions)
    return verdict.summary() if verdict is not None else "not judged yet"


def readiness_verdict(io_manager: dg.IOManager, instance: dg.DagsterInstance, model: str
                      ) -> str:
    """Every judged cell of a model, in words (`<node type>: <verdict>`)."""
    cells = materialized_cells(instance, "readiness", model)
    if not cells:
        return "not judged yet"
    return "; ".join(f"{split_cell(c)[1]}: {cell_verdict(io_manager, instance, c)}"
                     for c in cells)


def onboarded_cells(instance: dg.DagsterInstance, ready_assets: list[str],
                    model: str | None = None) -> list[str]:
    """Cells (only `model`'s when given) with every `ready_assets` materialized, whatever
    their readiness verdict."""
    if not ready_assets:
        return []
    ready = set.intersection(*(set(materialized_cells(instance, a, model))
                               for a in ready_assets))
    return sorted(ready, key=split_cell)


def onboarded_models(instance: dg.DagsterInstance, ready_assets: list[str]) -> list[str]:
    """Models with at least one onboarded cell."""
    return sorted({split_cell(c)[0] for c in onboarded_cells(instance, ready_assets)})


def stale_partitions(instance: dg.DagsterInstance, fingerprint: str, partitions: list[str],
                     dependent: list[str]) -> dict[str, dict[str, Any]]:
    """Of `partitions` (models or cells), those whose stack-dependent materializations were
    produced on another stack.

    Returns partition -> {stale asset: the fingerprint it was measured on, or `unknown`}.
    """
    out: dict[str, dict[str, Any]] = {}
    for key in partitions:
        stale = {}
        for asset in dependent:
            mat = latest_materialization(instance, asset, key)
            if mat is not None and (seen := measured_on(mat)) != fingerprint:
                stale[asset] = seen
        if stale:
            out[key] = stale
    return out


def spec_stale_partitions(instance: dg.DagsterInstance, versions: dict[str, str],
                          partitions: list[str], dependent: list[str]
                          ) -> dict[str, dict[str, str]]:
    """Of `partitions` (models or cells), those whose spec-dependent materializations read
    another version of the model's spec than `versions[model]` (its catalog entry now).

    Returns partition -> {stale asset: the spec version it read, or `unknown`}.
    """
    out: dict[str, dict[str, str]] = {}
    for key in partitions:
        model = split_cell(key)[0] if "|" in key else key
        if model not in versions:  # no resolvable entry: the catalog sensor reports it
            continue
        stale = {}
        for asset in dependent:
            mat = latest_materialization(instance, asset, key)
            if mat is not None and (read := spec_read(mat)) != versions[model]:
                stale[asset] = read
        if stale:
            out[key] = stale
    return out


def revalidation_key(model: str, fingerprint: str, spec: str | None) -> str:
    """`revalidate-<model>@<fingerprint[:16]>`, plus `+spec-<version[:12]>` when the model's
    spec changed: one run per model, stack and spec."""
    return f"revalidate-{model}@{fingerprint[:16]}" + (f"+spec-{spec[:12]}" if spec else "")


def _why_stale(fp: str, stack: dict[str, str] | None, version: str,
               spec: dict[str, str] | None) -> str:
    why = []
    if stack:
        why.append(f"stale against stack {fp[:16]}: " + ", ".join(
            f"{a} (measured on {v[:16]})" for a, v in stack.items()))
    if spec:
        why.append(f"stale against its spec {version[:16]}: " + ", ".join(
            f"{a} (read {v[:16]})" for a, v in spec.items()))
    return "; ".join(why)


def _model_level(names: list[str]) -> list[str]:
    return [n for n in names if n not in CELL_ASSETS and n not in FLEET_ASSETS]


def _cell_level(names: list[str]) -> list[str]:
    return [n for n in names if n in CELL_ASSETS]


def revalidation_requests(context: dg.ScheduleEvaluationContext, configs: ConfigFiles,
                          io_manager: dg.IOManager, level: str
                          ) -> list[dg.RunRequest] | dg.SkipReason:
    """Runs of `level` ("model": the model's own stages; "cell": one cell's) for every
    onboarded partition of that level whose results are stale. A cell of a model that is
    stale at the model level is left to the model's run: its cells follow it
    (pipelines/cells.py)."""
    cfg = configs.automation()
    if drift := AT_LOAD.drift(cfg):
        context.log.warning(drift)
    fp, _ = current_stack(configs)
    graph = context.repository_def.asset_graph
    ready = cfg.revalidation.ready_assets
    versions = {m: spec_version(s) for m, s in configs.catalog().specs.items()}
    models = onboarded_models(context.instance, ready)
    model_stale = {**stale_partitions(context.instance, fp, models,
                                      _model_level(stack_dependent(graph))),
                   **spec_stale_partitions(context.instance, versions, models,
                                           _model_level(spec_dependent(graph)))}
    if level == "model":
        keys, job = models, REVALIDATE_JOB
        stack_deps, spec_deps = (_model_level(stack_dependent(graph)),
                                 _model_level(spec_dependent(graph)))
    else:
        keys = [c for c in onboarded_cells(context.instance, ready)
                if split_cell(c)[0] not in model_stale]
        job = REVALIDATE_CELL_JOB
        stack_deps, spec_deps = (_cell_level(stack_dependent(graph)),
                                 _cell_level(spec_dependent(graph)))
    stale = stale_partitions(context.instance, fp, keys, stack_deps)
    spec_stale = spec_stale_partitions(context.instance, versions, keys, spec_deps)
    what = "model" if level == "model" else "cell"
    if not stale and not spec_stale:
        return dg.SkipReason(f"every onboarded {what} is current with stack {fp[:16]} and "
                             "its catalog entry")
    todo = sorted({*stale, *spec_stale})
    verdicts = {k: readiness_verdict(io_manager, context.instance, k) if level == "model"
                else cell_verdict(io_manager, context.instance, k) for k in todo}
    for key in todo:
        model = split_cell(key)[0] if level == "cell" else key
        context.log.info(f"{key} ({verdicts[key]}): "
                         + _why_stale(fp, stale.get(key), versions.get(model, ""),
                                      spec_stale.get(key)))
    stages = job_stages(context.repository_def, job)
    requests = []
    for key in todo:
        model = split_cell(key)[0] if level == "cell" else key
        requests.append(dg.RunRequest(
            partition_key=key,
            run_key=revalidation_key(key.replace("|", "@"), fp, versions[model]
                                     if key in spec_stale else None),
            # a cell's placement beside the sweep (the request's run config replaces the job's
            # partitioned config)
            run_config=deep_merge(cell_run_config(key, configs) if level == "cell" else {},
                                  cfg.launch.run_config(cfg.launch.automatic_sweep, stages)),
            tags={"onboarding/trigger": "revalidation",
                  # the cells after a model's run take the sweep from it (pipelines/cells.py)
                  "onboarding/sweep": cfg.launch.automatic_sweep,
                  "onboarding/stack_fingerprint": fp,
                  **({"onboarding/spec_version": versions[model]} if key in spec_stale else {}),
                  "onboarding/ready_before": verdicts[key],
                  "onboarding/stale_assets": ",".join(sorted(
                      {*stale.get(key, {}), *spec_stale.get(key, {})}))}))
    return requests


_SCHEDULE_WHY = ("It picks, whatever their readiness verdict, those whose results were "
                 "measured on another serving stack or read another version of the model's "
                 "catalog entry (configs/automation.yaml `revalidation`).")


def _revalidation_schedule(name: str, job: str, level: str, description: str
                           ) -> dg.ScheduleDefinition:
    """The re-validation schedule of one level ("model" or "cell"): `revalidation_requests`
    on the cron of configs/automation.yaml."""

    @dg.schedule(name=name, cron_schedule=AT_LOAD.cron, execution_timezone=AT_LOAD.timezone,
                 job_name=job, default_status=dg.DefaultScheduleStatus.RUNNING,
                 description=description + " " + _SCHEDULE_WHY)
    def _schedule(context: dg.ScheduleEvaluationContext, configs: ConfigFiles,
                  io_manager: dg.ResourceParam[dg.IOManager]):
        return revalidation_requests(context, configs, io_manager, level)

    return _schedule


revalidation_schedule = _revalidation_schedule(
    "revalidation_schedule", REVALIDATE_JOB, "model",
    "Re-validates the model-level stages (quantized, accuracy, the plan, ...) of onboarded "
    "models (a cell with every revalidation.ready_assets materialized); their cells follow.")
cell_revalidation_schedule = _revalidation_schedule(
    "cell_revalidation_schedule", REVALIDATE_CELL_JOB, "cell",
    "Re-validates exactly the stale (model, node type) cells of onboarded cells; a cell whose "
    "model is stale waits for the model's run.")


_REVALIDATED = dg.AssetSelection.assets(SERVING_STACK, MODEL_SPEC).downstream() - LAYOUT_ASSETS
revalidate_job = dg.define_asset_job(
    REVALIDATE_JOB,
    selection=_REVALIDATED - level_selection(CELL_MEASURED, CELL_DERIVED, FLEET),
    executor_def=onboarding_executor(),
    description="Observe the serving stack, record the model's spec, then re-run the model's "
    "own stages whose results depend on either, for one model; `checkpoint` is not re-fetched. "
    "Its onboarded cells follow (revalidate_cell).")

revalidate_cell_job = dg.define_asset_job(
    REVALIDATE_CELL_JOB,
    selection=(_REVALIDATED & level_selection(CELL_MEASURED, CELL_DERIVED))
    | level_selection(FLEET) | dg.AssetSelection.assets(SERVING_STACK),
    executor_def=onboarding_executor(),
    description="Observe the serving stack, then re-run one (model, node type) cell's stages "
    "that depend on the stack or the model's spec, on that node type.",
    config=dg.PartitionedConfig(partitions_def=cells_partitions,
                                run_config_for_partition_key_fn=cell_run_config,
                                tags_for_partition_key_fn=cell_run_tags))


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


def report_revalidation(context: dg.RunStatusSensorContext,
                        io_manager: dg.ResourceParam[dg.IOManager]) -> dg.SkipReason | None:
    """Record on each re-validated asset whether its gates and SLO verdicts changed."""
    run = context.dagster_run
    if run.job_name not in (REVALIDATE_JOB, REVALIDATE_CELL_JOB):
        return dg.SkipReason(f"{run.job_name} is not {REVALIDATE_JOB} or {REVALIDATE_CELL_JOB}")
    model = run.tags.get("dagster/partition")  # a model, or a cell `<model>|<node type>`
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
                "readiness": cell_verdict(io_manager, context.instance, model) if "|" in model
                else readiness_verdict(io_manager, context.instance, model),
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
                                run_status=status,
                                monitored_jobs=[revalidate_job, revalidate_cell_job],
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
