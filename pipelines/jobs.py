"""Jobs: a model's own stages (per model), its cells (per model x node type), planning without
weights, layouts, predictions and node acceptance."""

from __future__ import annotations

import dagster as dg

from assets.model_spec import MODEL_SPEC
from assets.nodes import GROUP as NODES_GROUP
from assets.partitions import (
    CELL_DERIVED,
    CELL_MEASURED,
    FLEET,
    cells_partitions,
    level_selection,
    nodes_partitions,
)
from assets.stack import SERVING_STACK
from pipelines.executors import (
    cell_run_config,
    cell_run_tags,
    node_run_tags,
    onboarding_executor,
)

# The (model, node type) cells: every asset measured on a GPU or judged from such a measurement
# (assets/partitions.py `cells_partitions`), selected by their level tag. A run has one
# partition key, so a model's stages and its cells are two jobs: the cells follow the model's
# run (pipelines/cells.py). The names, for what reads the graph by name (the schedule);
# tests/pipelines/test_cells.py holds them to the tags.
CELL_ASSETS = ("served_accuracy", "config_search", "load_timing", "serving_benchmark",
               "kserve_manifest", "operations", "readiness", "readiness_report")
# Over every cell: run after a cell's run, from whatever the other cells stored.
FLEET_ASSETS = ("gateway_routes", "fleet_report")
CELLS = level_selection(CELL_MEASURED, CELL_DERIVED)
# Layouts span models: planned by their own job, never inside one model's onboarding or
# revalidation run (one infeasible layout must not fail a model's run).
LAYOUT_ASSETS = dg.AssetSelection.groups("layout")  # node_layout (assets/layout.py)
PREDICT_GROUP = "predict"  # assets/predict.py: AIConfigurator predictions and their calibration

# serving_stack is observed and model_spec recorded first in every onboarding run, so each
# result records the stack it was measured on and the spec it read (its input data versions),
# never Dagster's INITIAL marker.
MODEL_ASSETS = (dg.AssetSelection.all() - dg.AssetSelection.groups(NODES_GROUP) - LAYOUT_ASSETS
                - dg.AssetSelection.groups(PREDICT_GROUP)
                - level_selection(CELL_MEASURED, CELL_DERIVED, FLEET))

onboard_model = dg.define_asset_job(
    "onboard_model",
    selection=MODEL_ASSETS | dg.AssetSelection.assets(SERVING_STACK, MODEL_SPEC),
    description="Observe the serving stack, record the model's spec, then fetch, quantize, "
    "evaluate in process, plan and publish one model: the stages that do not depend on the GPU "
    "they run on. Its cells (onboard_cell, one per node type) follow when it succeeds.",
    executor_def=onboarding_executor(),
)

onboard_cell = dg.define_asset_job(
    "onboard_cell",
    selection=level_selection(CELL_MEASURED, CELL_DERIVED, FLEET)
    | dg.AssetSelection.assets(SERVING_STACK),
    description="One (model, node type) cell on that node type: served accuracy, load timing, "
    "serving benchmark, manifest, operations, readiness and its report; then the gateway "
    "routes and the fleet's readiness grid. Needs the model's onboard_model run first.",
    executor_def=onboarding_executor(),
    config=dg.PartitionedConfig(partitions_def=cells_partitions,
                                run_config_for_partition_key_fn=cell_run_config,
                                tags_for_partition_key_fn=cell_run_tags),
)

plan_model = dg.define_asset_job(
    "plan_model",
    selection=dg.AssetSelection.assets("serving_config"),
    description="Plan one model without fetching it: plan-only catalog entries, or re-planning "
    "after a config change. Uses whatever upstream measurements exist; plan_cell renders.",
    executor_def=onboarding_executor(),
)

plan_cell = dg.define_asset_job(
    "plan_cell",
    selection=level_selection(CELL_DERIVED, FLEET),
    description="Render and judge one (model, node type) cell from whatever its measurements "
    "are (none: the manifest says unmeasured and readiness says why not): a node type not "
    "measured here, a plan-only entry, or re-rendering after a config change.",
    executor_def=onboarding_executor(),
)

plan_layouts = dg.define_asset_job(
    "plan_layouts",
    selection=LAYOUT_ASSETS,
    description="Plan and render every node layout of configs/layouts.yaml (several models on "
    "one GPU node) from whatever measurements of its models exist.",
    executor_def=onboarding_executor(),
)

predict_model = dg.define_asset_job(
    "predict_model",
    selection=dg.AssetSelection.groups(PREDICT_GROUP),
    description="Predict one model's serving performance per node type x precision x TP with "
    "AIConfigurator, corrected by the H200 calibration (no GPU, no weights needed).",
    executor_def=onboarding_executor(),
)


# On the node itself, one step after another: a burn beside a bandwidth test would measure both
# wrong. In a cluster the run's own pod is the probe: the partitioned config's tags pin it to the
# node (kubernetes.io/hostname = the partition key) with all its GPUs (node_run_tags).
accept_node = dg.define_asset_job(
    "accept_node",
    selection=dg.AssetSelection.groups(NODES_GROUP),
    description="Qualify one GPU node: inventory, GPU health (DCGM or burn), interconnect, "
    "memory bandwidth, storage read, and the go/no-go verdict with its report.",
    executor_def=dg.in_process_executor,
    config=dg.PartitionedConfig(partitions_def=nodes_partitions,
                                run_config_for_partition_key_fn=lambda _node: {},
                                tags_for_partition_key_fn=node_run_tags),
)

jobs = [onboard_model, onboard_cell, plan_model, plan_cell, plan_layouts, predict_model,
        accept_node]
