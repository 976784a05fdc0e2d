"""Jobs: onboarding a model end to end, partitioned by model, and planning one without weights."""

from __future__ import annotations

import dagster as dg

from assets.model_spec import MODEL_SPEC
from assets.nodes import GROUP as NODES_GROUP
from assets.partitions import nodes_partitions
from assets.stack import SERVING_STACK
from pipelines.executors import node_run_tags, onboarding_executor

PLAN_ASSETS = ("serving_config", "kserve_manifest", "gateway_routes")
# Layouts span models: planned by their own job, never inside one model's onboarding or
# revalidation run (one infeasible layout must not fail a model's run).
LAYOUT_ASSETS = dg.AssetSelection.groups("layout")  # node_layout (assets/layout.py)
PREDICT_GROUP = "predict"  # assets/predict.py: AIConfigurator predictions and their calibration

# serving_stack is observed and model_spec recorded first in every onboarding run, so each
# result records the stack it was measured on and the spec it read (its input data versions),
# never Dagster's INITIAL marker.
MODEL_ASSETS = dg.AssetSelection.all() - dg.AssetSelection.groups(NODES_GROUP)

onboard_model = dg.define_asset_job(
    "onboard_model",
    selection=(MODEL_ASSETS - LAYOUT_ASSETS - dg.AssetSelection.groups(PREDICT_GROUP))
    | dg.AssetSelection.assets(SERVING_STACK, MODEL_SPEC),
    description="Observe the serving stack, record the model's spec, then fetch, quantize, "
    "evaluate, time, benchmark, plan and render one model.",
    executor_def=onboarding_executor(),
)

plan_model = dg.define_asset_job(
    "plan_model",
    selection=dg.AssetSelection.assets(*PLAN_ASSETS),
    description="Plan and render one model without fetching it: plan-only catalog entries, or "
    "re-rendering after a config change. Uses whatever upstream measurements exist.",
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

jobs = [onboard_model, plan_model, plan_layouts, predict_model, accept_node]
