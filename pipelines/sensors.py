"""Sensors: checkpoints that land in the bucket, catalog keys as partitions, the serving stack.

- `new_checkpoint_sensor` scans the watched prefix in bounded pages (onboarding.discovery),
  registers each complete model folder as a partition and requests one onboarding run per
  content id (run key `model@content-id`). Incomplete folders wait; a malformed spec beside the
  weights is logged as an error on the tick and remembered, other models carry on; deleted
  folders are reported on the `checkpoint` asset. A tick that requests runs also records a
  `serving_stack` observation when there is none yet or the stack changed, so the runs it
  launches record a fingerprint as their stack input version.
- `catalog_partitions_sensor` makes every catalogued model launchable from the UI.
- `serving_stack_sensor` records a `serving_stack` observation when the fingerprint changes, so
  the UI marks stack-dependent results stale without waiting for a run.
"""

import dagster as dg
from botocore.exceptions import BotoCoreError, ClientError

from assets.stack import observation_event
from onboarding.automation import load_automation
from onboarding.catalog import load_catalog
from onboarding.discovery import (
    Listed,
    ScanCursor,
    advance,
    evaluate,
    folder_uri,
    write_discovered_spec,
)
from onboarding.paths import discovered_dir, models_dir
from pipelines.jobs import onboard_model
from pipelines.launch import job_stages
from pipelines.partitions import models_partitions
from resources.s3 import S3ObjectStore

CHECKPOINT = dg.AssetKey("checkpoint")
TRIGGER_TAG = "onboarding/trigger"


def _lister(s3: S3ObjectStore, bucket: str, prefix: str):
    client = s3.client()

    def list_page(after: str, max_keys: int) -> tuple[list[Listed], bool]:
        kwargs = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": max_keys}
        if after:
            kwargs["StartAfter"] = after
        try:
            resp = client.list_objects_v2(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise s3._explain(exc, f"s3://{bucket}/{prefix} (listing after {after!r})") from None
        objects = [Listed(o["Key"], o["Size"], o.get("ETag", "").strip('"') or None)
                   for o in resp.get("Contents", [])]
        return objects, bool(resp.get("IsTruncated"))

    def read(key: str) -> bytes:
        try:
            return client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            raise s3._explain(exc, f"s3://{bucket}/{key}") from None

    return list_page, read


@dg.sensor(
    job=onboard_model,
    minimum_interval_seconds=load_automation().discovery.minimum_interval_s,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Onboards complete checkpoints dropped under the watched S3 prefix "
    "(configs/automation.yaml `discovery`).",
)
def new_checkpoint_sensor(context: dg.SensorEvaluationContext, s3: S3ObjectStore):
    cfg, launch = load_automation().discovery, load_automation().launch
    stages = job_stages(context.repository_def, onboard_model.name)
    cursor = ScanCursor.from_json(context.cursor, f"s3://{cfg.bucket}/{cfg.prefix}")
    list_page, read = _lister(s3, cfg.bucket, cfg.prefix)
    step = advance(cursor, list_page, cfg.prefix, cfg.completion_marker, cfg.page_size,
                   cfg.max_pages_per_tick)
    catalog = load_catalog(models_dir(), discovered=None)  # what people wrote, not the sensor
    discovered = load_catalog(discovered_dir(), discovered=None) \
        if discovered_dir().is_dir() else {}
    owners = {k.model: name for name, k in cursor.known.items() if k.state == "submitted"}
    registered = set(context.instance.get_dynamic_partitions(models_partitions.name))
    new_keys: list[str] = []
    runs: list[dg.RunRequest] = []
    for folder in step.closed:
        verdict = evaluate(folder, cursor.known.get(folder.name), bucket=cfg.bucket,
                           prefix=cfg.prefix, read=read, marker=cfg.completion_marker,
                           require_marker=cfg.require_marker, catalog=catalog,
                           discovered=discovered, owners=owners)
        if verdict is None:
            continue
        cursor.known[folder.name] = verdict.known
        (context.log.error if verdict.error else context.log.info)(verdict.message)
        spec = verdict.spec
        if spec is None:
            continue
        if verdict.write:
            write_discovered_spec(discovered_dir(), spec, spec.source)
            discovered[spec.id] = spec
        owners[spec.id] = folder.name
        if spec.id not in registered and spec.id not in new_keys:
            new_keys.append(spec.id)
        cid = verdict.known.content_id
        runs.append(dg.RunRequest(
            partition_key=spec.id,
            run_key=f"{spec.id}@{cid}",
            asset_selection=[dg.AssetKey(a) for a in cfg.run_assets] if cfg.run_assets else None,
            run_config=launch.run_config(launch.automatic_sweep, stages),
            tags={TRIGGER_TAG: "new_checkpoint", "onboarding/source": spec.source,
                  "onboarding/content_id": cid, "onboarding/sweep": launch.automatic_sweep},
        ))
    events = []
    for name, known in step.deleted.items():
        uri = folder_uri(cfg.bucket, cfg.prefix, name)
        context.log.warning(f"{uri}: deleted from the bucket (was {known.state}, content id "
                            f"{known.content_id}, model {known.model or 'none'})")
        if known.state == "submitted" and known.model in registered | set(new_keys):
            events.append(dg.AssetObservation(
                asset_key=CHECKPOINT, partition=known.model,
                metadata={"deleted_at_source": uri, "last_content_id": known.content_id,
                          "what_to_do": "The cached copy and results stay. Re-upload to "
                          "onboard again, or delete the partition if the model is retired."}))
    if runs:  # observed before the runs start (the daemon records events first)
        _, stack_event = observation_event(context.instance)
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
        run_requests=runs,
        dynamic_partitions_requests=[models_partitions.build_add_request(new_keys)]
        if new_keys else [],
        asset_events=events,
    )


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Registers every catalog entry (configs/models and discovered specs) as "
           "a `models` partition, so the UI can launch any of them.")
def catalog_partitions_sensor(context: dg.SensorEvaluationContext):
    existing = set(context.instance.get_dynamic_partitions(models_partitions.name))
    new = sorted(k for k in load_catalog(models_dir()) if k not in existing)
    if not new:
        return dg.SkipReason(f"all {len(existing)} catalog models are registered")
    context.log.info(f"registering {', '.join(new)}")
    return dg.SensorResult(dynamic_partitions_requests=[models_partitions.build_add_request(new)])


@dg.sensor(minimum_interval_seconds=load_automation().stack.observe_interval_s,
           default_status=dg.DefaultSensorStatus.RUNNING,
           description="Observes serving_stack and records a new observation when its "
           "fingerprint changes.")
def serving_stack_sensor(context: dg.SensorEvaluationContext):
    fp, event = observation_event(context.instance)
    if event is None:
        return dg.SkipReason(f"serving stack unchanged ({fp[:16]})")
    context.log.info(f"serving stack fingerprint is now {fp[:16]}")
    return dg.SensorResult(asset_events=[event])


sensors = [new_checkpoint_sensor, catalog_partitions_sensor, serving_stack_sensor]
