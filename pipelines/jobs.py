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

jobs = [onboard_model]
