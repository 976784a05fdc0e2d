"""Sensors: checkpoints that land in the bucket, catalog keys as partitions, the serving stack.

- `new_checkpoint_sensor` scans the watched prefix in bounded pages (onboarding.fetch.discovery),
  registers each complete model folder as a partition and requests one onboarding run per
  content id (run key `model@content-id`). Incomplete folders wait; a malformed spec beside the
  weights is logged as an error on the tick and remembered, other models carry on; deleted
  folders are reported on the `checkpoint` asset. A tick that requests runs also records a
  `serving_stack` observation when there is none yet or the stack changed (the runs observe it
  again first; the tick's own record serves runs that select a subset of the assets).
- `catalog_partitions_sensor` makes every catalogued model launchable from the UI, and reports
  each catalog file that does not validate once (the other models are unaffected).
- `node_partitions_sensor` registers every GPU node listed in configs/acceptance.yaml `nodes`
  as a `nodes` partition (node acceptance, docs/acceptance.md).
- `serving_stack_sensor` records a `serving_stack` observation when the fingerprint changes, so
  the UI marks stack-dependent results stale without waiting for a run.
"""

import hashlib
import json

import dagster as dg

from assets.model_spec import spec_events
from assets.partitions import models_partitions, nodes_partitions
from assets.stack import STACK_FINGERPRINT_KEY, observation_event
from onboarding.fetch.discovery import (
    Folder,
    Known,
    ScanCursor,
    ScanStep,
    advance,
    evaluate,
    folder_uri,
    write_discovered_spec,
)
from onboarding.runs.automation import AutomationConfig
from pipelines.automation import AT_LOAD
from pipelines.jobs import onboard_model
from pipelines.launch import job_stages
from pipelines.schedules import readiness_verdict
from resources.config_files import ConfigFiles
from resources.s3 import S3ObjectStore

CHECKPOINT = dg.AssetKey("checkpoint")
TRIGGER_TAG = "onboarding/trigger"


@dg.sensor(
    job=onboard_model,
    minimum_interval_seconds=AT_LOAD.discovery_interval_s,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Onboards complete checkpoints dropped under the watched S3 prefix "
    "(configs/automation.yaml `discovery`).",
)
def new_checkpoint_sensor(context: dg.SensorEvaluationContext, s3: S3ObjectStore,
                          configs: ConfigFiles, io_manager: dg.ResourceParam[dg.IOManager]):
    cfg = configs.automation()
    if drift := AT_LOAD.drift(cfg):
        context.log.warning(drift)
    d = cfg.discovery
    cursor = ScanCursor.from_json(context.cursor, f"s3://{d.bucket}/{d.prefix}")
    step = advance(cursor, lambda after, n: s3.list_page(d.bucket, d.prefix, after, n),
                   d.prefix, d.completion_marker, d.page_size, d.max_pages_per_tick)
    registered = set(context.instance.get_dynamic_partitions(models_partitions.name))
    new_keys, runs = _onboard_closed_folders(context, s3, io_manager, configs, cfg, cursor,
                                             step, registered)
    events = _deleted_folder_events(context, cfg, step, registered | set(new_keys))
    if runs:  # observed before the runs start (the daemon records events first)
        _, stack_event = observation_event(context.instance, configs)
        if stack_event is not None:
            events.append(stack_event)
    context.update_cursor(cursor.to_json())
    summary = (f"listed {step.keys} keys in {step.pages} page(s); pass "
               f"{'finished' if step.pass_finished else 'continues'}; {len(runs)} run(s) "
               "requested")
    if not (runs or new_keys or events):
        return dg.SkipReason(summary)  # shown on the tick in the UI; the cursor still moves
    context.log.info(summary)
    return dg.SensorResult(
        run_requests=runs, asset_events=events,
        dynamic_partitions_requests=[models_partitions.build_add_request(new_keys)]
        if new_keys else [])


def _onboard_closed_folders(context: dg.SensorEvaluationContext, s3: S3ObjectStore,
                            io_manager: dg.IOManager, configs: ConfigFiles,
                            cfg: AutomationConfig, cursor: ScanCursor, step: ScanStep,
                            registered: set[str]
                            ) -> tuple[list[str], list[dg.RunRequest]]:
    """Judge each folder the scan closed: partitions to add and runs to request."""
    d = cfg.discovery
    stages = job_stages(context.repository_def, onboard_model.name)
    catalogued = configs.catalogued()
    catalog = catalogued.specs  # what people wrote, not the sensor
    discovered = configs.discovered().specs
    owners = {k.model: name for name, k in cursor.known.items() if k.state == "submitted"}
    new_keys: list[str] = []
    runs: list[dg.RunRequest] = []
    for folder in step.closed:
        verdict = evaluate(folder, cursor.known.get(folder.name), bucket=d.bucket,
                           prefix=d.prefix, read=lambda key: s3.read_object(d.bucket, key),
                           marker=d.completion_marker, require_marker=d.require_marker,
                           catalog=catalog, discovered=discovered, owners=owners,
                           defaults=catalogued.defaults)
        if verdict is None:
            continue
        cursor.known[folder.name] = verdict.known
        (context.log.error if verdict.error else context.log.info)(verdict.message)
        spec = verdict.spec
        if spec is None:
            continue
        if verdict.write:
            write_discovered_spec(configs.discovered_path, spec, spec.source)
            discovered[spec.id] = spec
        owners[spec.id] = folder.name
        if spec.id not in registered and spec.id not in new_keys:
            new_keys.append(spec.id)
        before = readiness_verdict(io_manager, context.instance, spec.id)
        context.log.info(f"{spec.id}: {before} before this checkpoint")
        runs.append(_run_request(spec.id, spec.source, folder, verdict.known, cfg, stages,
                                 before))
    return new_keys, runs


def _run_request(model: str, source: str, folder: Folder, known: Known, cfg: AutomationConfig,
                 stages: set[str] | None, ready_before: str) -> dg.RunRequest:
    launch, run_assets = cfg.launch, cfg.discovery.run_assets
    return dg.RunRequest(
        partition_key=model,
        run_key=f"{model}@{known.content_id}",
        asset_selection=[dg.AssetKey(a) for a in run_assets] if run_assets else None,
        run_config=launch.run_config(launch.automatic_sweep, stages),
        tags={TRIGGER_TAG: "new_checkpoint", "onboarding/source": source,
              "onboarding/content_id": known.content_id,
              "onboarding/sweep": launch.automatic_sweep,
              # the verdict this run starts from (the readiness asset's words, as the
              # re-validation schedule tags its runs); the run's own verdict follows it
              "onboarding/ready_before": ready_before})


def _deleted_folder_events(context: dg.SensorEvaluationContext, cfg: AutomationConfig,
                           step: ScanStep, registered: set[str]) -> list[dg.AssetObservation]:
    d, events = cfg.discovery, []
    for name, known in step.deleted.items():
        uri = folder_uri(d.bucket, d.prefix, name)
        context.log.warning(f"{uri}: deleted from the bucket (was {known.state}, content id "
                            f"{known.content_id}, model {known.model or 'none'})")
        if known.state == "submitted" and known.model in registered:
            events.append(dg.AssetObservation(
                asset_key=CHECKPOINT, partition=known.model,
                metadata={"deleted_at_source": uri, "last_content_id": known.content_id,
                          "what_to_do": "The cached copy and results stay. Re-upload to "
                          "onboard again, or delete the partition if the model is retired."}))
    return events


def _broken_digest(broken: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(broken, sort_keys=True).encode()).hexdigest()[:16]


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Registers every catalog entry (configs/models and discovered specs) as "
           "a `models` partition, so the UI can launch any of them; records a `model_spec` "
           "materialization for each model whose entry changed; reports catalog files "
           "that do not validate, once per change.")
def catalog_partitions_sensor(context: dg.SensorEvaluationContext, configs: ConfigFiles):
    catalog = configs.catalog()
    broken = {path: str(err) for path, err in sorted(catalog.broken.items())}
    digest = _broken_digest(broken)
    if broken and context.cursor != digest:
        for err in broken.values():
            context.log.error(f"catalog file skipped (other models are unaffected): {err}")
    context.update_cursor(digest)
    existing = set(context.instance.get_dynamic_partitions(models_partitions.name))
    new = sorted(k for k in catalog.specs if k not in existing)
    # new partitions too: the daemon records a tick's asset events before it adds its
    # partitions (dagster/_daemon/sensor.py, 1.13), and an event of a partition not yet added
    # is stored like any other
    changed = spec_events(context.instance, configs, sorted({*existing, *new}))
    broken_note = f"; {len(broken)} broken catalog file(s): {', '.join(broken)}" if broken \
        else ""
    if not new and not changed:
        return dg.SkipReason(f"all {len(catalog.specs)} catalog models are registered, their "
                             "specs recorded" + broken_note)
    if new:
        context.log.info(f"registering {', '.join(new)}{broken_note}")
    if changed:
        context.log.info("model_spec changed for " + ", ".join(e.partition for e in changed))
    return dg.SensorResult(
        asset_events=changed,
        dynamic_partitions_requests=[models_partitions.build_add_request(new)] if new else [])


@dg.sensor(minimum_interval_seconds=AT_LOAD.stack_interval_s,
           default_status=dg.DefaultSensorStatus.RUNNING,
           description="Observes serving_stack and records a new observation when its "
           "fingerprint changes.")
def serving_stack_sensor(context: dg.SensorEvaluationContext, configs: ConfigFiles):
    if drift := AT_LOAD.drift(configs.automation()):
        context.log.warning(drift)
    fp, event = observation_event(context.instance, configs)
    if event is None:
        return dg.SkipReason(f"serving stack unchanged ({fp[:16]})")
    context.log.info(f"{STACK_FINGERPRINT_KEY} is now {fp}")
    return dg.SensorResult(asset_events=[event])


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Registers every node of configs/acceptance.yaml `nodes` as a `nodes` "
           "partition, so node acceptance can be launched for it.")
def node_partitions_sensor(context: dg.SensorEvaluationContext, configs: ConfigFiles):
    listed = configs.acceptance().nodes
    existing = set(context.instance.get_dynamic_partitions(nodes_partitions.name))
    new = sorted(n for n in listed if n not in existing)
    if not new:
        return dg.SkipReason(f"all {len(listed)} node(s) of acceptance.yaml are registered")
    context.log.info(f"registering node(s) {', '.join(new)}")
    return dg.SensorResult(dynamic_partitions_requests=[nodes_partitions.build_add_request(new)])


sensors = [new_checkpoint_sensor, catalog_partitions_sensor, serving_stack_sensor,
           node_partitions_sensor]
