"""Op tags that say what a step needs: a GPU slot, or the node's NVMe cache.

Static on purpose: where a step's pod goes in a cluster (GPUs, node selector, tolerations, the
cache volume, the GPU image) depends on cluster.yaml and nodes.yaml, which the executor reads
when a run starts (pipelines/executors.py), so no config is read when this module is imported.
"""

from __future__ import annotations

from onboarding.runs.cluster import CACHE_STAGES, GPU_BOUND_STAGES

GPU_BOUND_ASSETS = GPU_BOUND_STAGES
CACHE_ASSETS = CACHE_STAGES
GPU_SLOT_TAG = "onboarding/gpu"
"""Executors limit steps carrying this tag to the local GPU slots (pipelines.executors)."""
CACHE_TAG = "onboarding/nvme-cache"


def gpu_step_tags(stage: str) -> dict[str, str]:
    """Tags for a GPU-bound asset's step: the local GPU slot (and, being a cache stage, the
    cache)."""
    if stage not in GPU_BOUND_ASSETS:
        raise ValueError(f"{stage!r} is not a GPU-bound asset ({', '.join(GPU_BOUND_ASSETS)})")
    return {GPU_SLOT_TAG: "true", CACHE_TAG: "true"}


def cache_step_tags(stage: str) -> dict[str, str]:
    """Tags for `checkpoint`: no GPU, but on the GPU node type with the NVMe cache mounted,
    since the GPU-bound steps read what it fetched from that cache."""
    if stage in GPU_BOUND_ASSETS or stage not in CACHE_ASSETS:
        raise ValueError(f"{stage!r} is not a CPU step that uses the cache; GPU-bound assets "
                         "call gpu_step_tags")
    return {CACHE_TAG: "true"}
