"""Automation wired onto the merged stage definitions: the serving_stack dependency of every
stack-dependent stage, the re-validation job and schedule, and the sensors.

Done here, over whatever stages exist, so stage modules stay unaware of the stack and a stage
that is not written yet is simply not wired.
"""

from __future__ import annotations

import dagster as dg

from assets.stack import SERVING_STACK
from pipelines.launch import onboard_registered_model, register_model
from pipelines.schedules import (
    STACK_DEPENDENT,
    revalidate_job,
    revalidation_schedule,
    revalidation_verdict_sensors,
)
from pipelines.sensors import sensors


def add_stack_dep(assets_def: dg.AssetsDefinition) -> dg.AssetsDefinition:
    """`assets_def` with a non-argument dep on `serving_stack`.

    Dagster 1.13's `map_asset_specs` turns every existing argument input into a `Nothing` input
    when a dep is added (so `def kserve_manifest(deployment_plan)` breaks); this adds only the
    new input and keeps the others as they are.
    """
    from dagster._core.definitions.assets.definition.asset_dep import AssetDep

    specs = [s.replace_attributes(deps=[*s.deps, AssetDep(SERVING_STACK)])
             if s.key.to_user_string() in STACK_DEPENDENT and
             SERVING_STACK not in {d.asset_key for d in s.deps} else s
             for s in assets_def.specs]
    if all(a is b for a, b in zip(specs, assets_def.specs, strict=True)):
        return assets_def
    ins = {**assets_def.node_def.input_dict, "serving_stack": dg.In(dagster_type=dg.Nothing)}
    return assets_def.__class__.dagster_internal_init(**{
        **assets_def.get_attributes_dict(),
        "node_def": assets_def.op.with_replaced_properties(name=assets_def.op.name, ins=ins),
        "specs": specs,
    })


def depend_on_serving_stack(defs: dg.Definitions) -> dg.Definitions:
    """Add `serving_stack` to the deps of each stack-dependent asset present in `defs`."""
    keys = {dg.AssetKey(a) for a in STACK_DEPENDENT}
    assets = [add_stack_dep(a) if isinstance(a, dg.AssetsDefinition) and a.is_executable
              and keys & set(a.keys) else a for a in defs.assets or []]
    return dg.Definitions(
        assets=assets, asset_checks=defs.asset_checks, jobs=defs.jobs, schedules=defs.schedules,
        sensors=defs.sensors, resources=defs.resources, executor=defs.executor,
        loggers=defs.loggers, metadata=defs.metadata)


def with_automation(defs: dg.Definitions) -> dg.Definitions:
    wired = depend_on_serving_stack(defs)
    present = set(wired.resolve_asset_graph().get_all_asset_keys())
    revalidate = revalidate_job(present)
    return dg.Definitions.merge(wired, dg.Definitions(
        jobs=[revalidate, register_model], schedules=[revalidation_schedule],
        sensors=[*sensors, onboard_registered_model, *revalidation_verdict_sensors(revalidate)]))
