"""Stand-ins and result readers the asset tests share: upstream stages stored as fixed values,
and what a materialization recorded."""

from __future__ import annotations

import dagster as dg

from assets.partitions import models_partitions


def stand_in(name: str, value, partitions_def: dg.PartitionsDefinition = models_partitions
             ) -> dg.AssetsDefinition:
    """An asset named like an upstream stage that stores exactly `value`."""
    @dg.asset(name=name, partitions_def=partitions_def)
    def _stand_in():
        return value

    return _stand_in


def store_upstream(instance: dg.DagsterInstance, key: str, **values) -> None:
    """Materialize stand-ins of the upstream stages that store exactly `values`."""
    assert dg.materialize([stand_in(n, v) for n, v in values.items()], instance=instance,
                          partition_key=key).success


def metadata(result: dg.ExecuteInJobResult, asset: str) -> dict:
    """The metadata values `asset`'s materialization recorded in this run."""
    for e in result.get_asset_materialization_events():
        if e.asset_key == dg.AssetKey(asset):
            return {k: getattr(v, "value", v) for k, v in e.materialization.metadata.items()}
    raise AssertionError(f"{asset} was not materialized")
