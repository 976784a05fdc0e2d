"""The onboarding graph's shape with trivial bodies: every stage name, edge and op tag is real.

GPU-bound stages call `gpu_step_tags` and `checkpoint` calls `cache_step_tags`, exactly as the
real asset modules do, so pod rendering is proven for every stage whichever modules exist.
"""

from __future__ import annotations

import dagster as dg

from assets.partitions import models_partitions
from assets.step_tags import CACHE_ASSETS, GPU_BOUND_ASSETS, cache_step_tags, gpu_step_tags
from pipelines.executors import onboarding_executor

EDGES = {
    "checkpoint": [],
    "quantized": ["checkpoint"],
    "accuracy": ["quantized"],
    "served_accuracy": ["accuracy"],
    "serving_variant": ["accuracy", "served_accuracy"],
    "serving_config": ["serving_variant"],
    "config_search": ["serving_variant", "serving_config"],
    "load_timing": ["serving_variant", "config_search"],
    "serving_benchmark": ["load_timing", "config_search"],
    "published_variant": ["serving_config"],
    "kserve_manifest": ["serving_config", "published_variant", "serving_benchmark"],
}


def _stage(name: str, deps: list[str]) -> dg.AssetsDefinition:
    gpu = name in GPU_BOUND_ASSETS
    tags = gpu_step_tags(name) if gpu else cache_step_tags(name) if name in CACHE_ASSETS \
        else None

    @dg.asset(
        name=name,
        deps=deps,
        partitions_def=models_partitions,
        op_tags=tags,
        pool="gpu" if gpu else None,
    )
    def _asset() -> None:
        return None

    return _asset


stages = [_stage(name, deps) for name, deps in EDGES.items()]
defs = dg.Definitions(
    assets=stages,
    jobs=[
        dg.define_asset_job("onboard_model", executor_def=onboarding_executor())
    ],
)
