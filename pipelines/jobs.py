"""Jobs: onboarding a model end to end, partitioned by model."""

from __future__ import annotations

import dagster as dg

from pipelines.executors import onboarding_executor
from pipelines.partitions import models_partitions

onboard_model = dg.define_asset_job(
    "onboard_model",
    selection=dg.AssetSelection.all() - dg.AssetSelection.groups("plan_only"),
    partitions_def=models_partitions,
    description="Fetch, quantize, evaluate, time, benchmark, plan and render one model.",
    executor_def=onboarding_executor(),
)

plan_model = dg.define_asset_job(
    "plan_model",
    selection=dg.AssetSelection.assets("deployment_plan", "kserve_manifest", "gateway_routes"),
    partitions_def=models_partitions,
    description="Plan and render one model without fetching it: plan-only catalog entries, or "
    "re-rendering after a config change. Uses whatever upstream measurements exist.",
    executor_def=onboarding_executor(),
)

jobs = [onboard_model, plan_model]
