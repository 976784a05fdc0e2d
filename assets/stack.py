"""`serving_stack`: the observed serving stack, whose data version is its fingerprint.

The stack-dependent stages name it in their decorators (`deps=[SERVING_STACK]`), so a new
version in configs/stack.yaml, a new engine in its virtualenv or a new driver marks them stale
per model. Observed by the `serving_stack_sensor`, first in every onboarding run (the
onboard_model job selects it), by the new-checkpoint sensor's ticks that launch runs, by
re-validation runs, and from the UI. Each stack-dependent stage also records the fingerprint it
ran on (`stack_metadata`): Dagster's own record is the observation in force, and only a marker
(`INITIAL`) for a run made before the first one (an ad-hoc materialization from the UI).
"""

import json
from typing import Any

import dagster as dg

from onboarding.common.tables import md_table
from onboarding.serving.stack import (
    diff,
    fingerprint,
    fingerprint_packages,
    observation_body,
)
from resources.config_files import ConfigFiles
from resources.stack_facts import observe_node

SERVING_STACK = dg.AssetKey("serving_stack")
BODY_KEY = "stack"
STACK_FINGERPRINT_KEY = "serving_stack_fingerprint"


def current_stack(configs: ConfigFiles) -> tuple[str, dict[str, Any]]:
    """(fingerprint, body) of the stack as this process sees it now."""
    config = configs.stack_config()
    observe = configs.automation().stack.observe_node
    node = observe_node(configs.engine_python_path(), fingerprint_packages(config)) \
        if observe else {}
    return fingerprint(config, node), observation_body(config, node)


def last_observation(instance: dg.DagsterInstance) -> tuple[str | None, dict[str, Any] | None]:
    """The latest recorded (fingerprint, body), or (None, None) before the first observation."""
    records = instance.fetch_observations(SERVING_STACK, limit=1).records
    if not records:
        return None, None
    obs = records[0].asset_observation
    body = obs.metadata.get(BODY_KEY)
    return obs.tags.get("dagster/data_version"), (body.value if body is not None else None)


def observation_metadata(body: dict[str, Any], previous: dict[str, Any] | None,
                         previous_fp: str | None, fp: str) -> dict[str, Any]:
    versions = body["config"].get("versions", {})
    changes = diff(previous, body)
    return {
        "fingerprint": fp,
        "previous_fingerprint": previous_fp or "none",
        "changed": previous_fp is not None and previous_fp != fp,
        "versions": dg.MetadataValue.md(md_table(
            {"component": k, "version": v} for k, v in sorted(versions.items()))),
        "node": dg.MetadataValue.json(body["node"] or {"observed": False}),
        "diff": dg.MetadataValue.md(md_table(changes, ["field", "before", "after"])
                                    if changes else "no change" if previous else
                                    "first observation"),
        BODY_KEY: dg.MetadataValue.json(json.loads(json.dumps(body, default=str))),
    }


def stack_observation(instance: dg.DagsterInstance, configs: ConfigFiles
                      ) -> tuple[str, dict[str, Any], bool]:
    """(fingerprint, metadata, changed since the last recorded observation)."""
    fp, body = current_stack(configs)
    prev_fp, prev_body = last_observation(instance)
    return fp, observation_metadata(body, prev_body, prev_fp, fp), prev_fp != fp


def observation_event(instance: dg.DagsterInstance, configs: ConfigFiles
                      ) -> tuple[str, dg.AssetObservation | None]:
    """(fingerprint, the observation to record), None when the recorded one is current."""
    fp, metadata, changed = stack_observation(instance, configs)
    if not changed:
        return fp, None
    return fp, dg.AssetObservation(asset_key=SERVING_STACK, metadata=metadata,
                                   tags={"dagster/data_version": fp})


def observe_stack(instance: dg.DagsterInstance, configs: ConfigFiles) -> tuple[str, bool]:
    """Record an observation when there is none yet or the stack changed; (fingerprint,
    recorded)."""
    fp, event = observation_event(instance, configs)
    if event is not None:
        instance.report_runless_asset_event(event)
    return fp, event is not None


def stack_metadata(configs: ConfigFiles) -> dict[str, str]:
    """Metadata entry for a stack-dependent asset: the fingerprint of the stack this step runs
    on, computed here, so what a result was measured on is known even when no observation
    preceded the run (the re-validation schedule compares it then)."""
    return {STACK_FINGERPRINT_KEY: current_stack(configs)[0]}


@dg.observable_source_asset(
    key=SERVING_STACK,
    group_name="stack",
    description="Fingerprint of configs/stack.yaml plus the versions read off the node "
    "(nvidia-smi, the engine's virtualenv, torch). A change marks stack-dependent results stale.",
    required_resource_keys={"configs"},
)
def serving_stack(context) -> dg.ObserveResult:
    fp, metadata, _ = stack_observation(context.instance, context.resources.configs)
    context.log.info(f"{STACK_FINGERPRINT_KEY} {fp}")
    return dg.ObserveResult(data_version=dg.DataVersion(fp), metadata=metadata)


defs = dg.Definitions(assets=[serving_stack])
