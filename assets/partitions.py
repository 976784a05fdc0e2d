"""Partitions beside the assets that use them (the top floor, pipelines/, imports them here).

- `models`: one partition per model; keys are DNS-1123 model ids resolved by the catalog. The
  stages that do not depend on the GPU they run on are partitioned by model alone: the spec,
  the checkpoint, its quantized variants and their in-process accuracy, the serving plan, the
  published variants, the predictions.
- `node_types`: one partition per node type of the fleet: deploy.yaml `target_node_types`
  (the GPU pools) and `cpu`, the embedded engine; `fleet_partitions_sensor` registers them.
- `cells`: model x node type. Everything measured on a GPU, or judged from such a measurement,
  is kept per cell (load timing, served accuracy, serving benchmark, manifest, operations,
  readiness and its report), so measuring a model on one node type never changes what is known
  on another. Dagster's multi-partition key names both dimensions; its string form is
  `<model>|<node type>` (dimensions in name order).
- `nodes`: one partition per GPU node under acceptance; keys are Kubernetes node names.
  A node registers by name, with its node type, in configs/acceptance.yaml `nodes` (a
  declarative inventory like the model catalog, read through ConfigFiles.acceptance());
  `node_partitions_sensor` adds every listed node as a partition, so the node assets can be
  launched for it from the UI.
"""

from __future__ import annotations

import dagster as dg

MODEL_DIM = "model"
NODE_TYPE_DIM = "node_type"
LOCAL_NODE_TYPE = "cpu"  # the embedded engine's node type (resources/engine.py)

models_partitions = dg.DynamicPartitionsDefinition(name="models")
node_types_partitions = dg.DynamicPartitionsDefinition(name="node_types")
cells_partitions = dg.MultiPartitionsDefinition(
    {MODEL_DIM: models_partitions, NODE_TYPE_DIM: node_types_partitions})
nodes_partitions = dg.DynamicPartitionsDefinition(name="nodes")


def cell_key(model: str, node_type: str) -> dg.MultiPartitionKey:
    """The partition key of one (model, node type) cell."""
    return dg.MultiPartitionKey({MODEL_DIM: model, NODE_TYPE_DIM: node_type})


def split_cell(key: str) -> tuple[str, str]:
    """(model, node type) of a cell key, given as a MultiPartitionKey or its string form."""
    if isinstance(key, dg.MultiPartitionKey):
        dims = key.keys_by_dimension
        return dims[MODEL_DIM], dims[NODE_TYPE_DIM]
    model, sep, node_type = str(key).partition("|")
    if not sep or not model or not node_type or "|" in node_type:
        raise ValueError(f"{key!r} is not a cell key (<model>|<node type>)")
    return model, node_type


def model_of(context: dg.AssetExecutionContext) -> str:
    """The model a run of a per-model or per-cell asset is for."""
    key = context.partition_key
    return split_cell(key)[0] if isinstance(key, dg.MultiPartitionKey) or "|" in key else key


def node_type_of(context: dg.AssetExecutionContext) -> str:
    """The node type of a per-cell asset's partition."""
    return split_cell(context.partition_key)[1]



def materialized_cells(instance: dg.DagsterInstance, asset: str, model: str | None = None
                       ) -> list[str]:
    """Cell keys `asset` has materialized (only `model`'s when given), in (model, node type)
    order. Keys stored under the per-model partitioning are left out (docs/upgrading.md)."""
    cells = []
    for key in instance.get_materialized_partitions(dg.AssetKey(asset)):
        try:
            cell = split_cell(key)
        except ValueError:
            continue
        if model is None or cell[0] == model:
            cells.append((cell, str(key)))
    return [key for _, key in sorted(cells)]

# Which level an asset lives at, as an asset tag: jobs select by it (a selection by tag is
# empty where a code location lacks the asset; one by name fails), and a test holds every
# cells-partitioned asset to a cell level.
LEVEL_TAG = "onboarding/level"
CELL_MEASURED = {LEVEL_TAG: "cell-measured"}  # starts the engine on the cell's node type
CELL_DERIVED = {LEVEL_TAG: "cell"}  # judged or rendered from the cell's measurements
FLEET = {LEVEL_TAG: "fleet"}  # over every cell


def level_selection(*levels: dict[str, str]) -> dg.AssetSelection:
    """The assets tagged with any of `levels`."""
    out = dg.AssetSelection.tag(LEVEL_TAG, levels[0][LEVEL_TAG])
    for level in levels[1:]:
        out = out | dg.AssetSelection.tag(LEVEL_TAG, level[LEVEL_TAG])
    return out
