"""Typed hand-offs between assets whose upstream may never run for a partition.

Plan-only models are never fetched, quantized or benchmarked, yet they are planned and
rendered. Their planning assets take the upstream results as ordinary inputs through this input
manager: the value the upstream asset stored (a `CheckpointRef`, a `LoadTimingResult`, ...) when
that partition was materialized, `None` when it never was. A partition that was materialized
but whose stored value is gone is an error, never a silent `None`.
"""

from __future__ import annotations

from typing import Any

import dagster as dg


def by_model(value: Any) -> dict[str, Any]:
    """partition -> stored value of a fan-in input over every model partition: the IO manager
    hands over the bare value when one partition exists, and None when it was never
    materialized."""
    if value is None:
        return {}
    items = value.values() if isinstance(value, dict) else [value]
    return {v.model: v for v in items if v is not None}


def by_cell(value: Any) -> dict[str, Any]:
    """cell key (`<model>|<node type>`) -> stored value of a fan-in input over every cell: the
    IO manager hands over the bare value when one partition exists (keyed by its model then,
    the one thing every stored value names), and None when none was materialized."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items() if v is not None}
    return {str(getattr(value, "model", "")): value}


def _latest_record(instance: dg.DagsterInstance, asset: dg.AssetKey | str,
                   partition: str | None) -> dg.EventLogRecord | None:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey.from_coercible(asset),
                              asset_partitions=[partition] if partition else None),
        limit=1).records
    return records[0] if records else None


def latest_materialization(instance: dg.DagsterInstance, asset: dg.AssetKey | str,
                           partition: str | None) -> dg.AssetMaterialization | None:
    """The newest materialization of `asset` for `partition` (None: unpartitioned or never)."""
    record = _latest_record(instance, asset, partition)
    return record.asset_materialization if record else None


def materialized_at(instance: dg.DagsterInstance, asset: dg.AssetKey | str,
                    partition: str | None) -> float | None:
    """When the newest materialization of `asset` for `partition` was stored (unix seconds)."""
    record = _latest_record(instance, asset, partition)
    return record.timestamp if record else None


def stored_value(io_manager: dg.IOManager, instance: dg.DagsterInstance,
                 asset: dg.AssetKey | str, partition: str,
                 partitions_def: dg.PartitionsDefinition) -> Any:
    """The value `asset` stored for `partition`, read outside the asset graph's edges: an
    asset's own previous value, or a value of another partition set (node assets seen from
    a model's report). None when that partition was never materialized; a materialized one
    whose stored value is gone is an error, as for `optional_upstream`."""
    key = dg.AssetKey.from_coercible(asset)
    if latest_materialization(instance, key, partition) is None:
        return None
    return io_manager.load_input(dg.build_input_context(
        asset_key=key, partition_key=partition, asset_partitions_def=partitions_def,
        instance=instance))


@dg.input_manager(required_resource_keys={"io_manager"},
                  description="The upstream asset's stored value for this partition, or None "
                  "when that partition was never materialized.")
def optional_upstream(context: dg.InputContext):
    partition = context.asset_partition_key if context.has_asset_partitions else None
    if latest_materialization(context.instance, context.asset_key, partition) is None:
        context.log.info(f"{context.asset_key.to_user_string()}[{partition}]: never "
                         "materialized; planning without it")
        return None
    return context.resources.io_manager.load_input(context)
