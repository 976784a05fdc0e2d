"""Op tags for GPU-bound steps: Kubernetes pod config for step pods and the local GPU slot.

Assets call `gpu_step_tags("<asset name>")` at decoration time. `checkpoint` calls
`cache_step_tags("checkpoint")`: it needs the NVMe cache on the GPU node type but no GPU. The other
CPU assets call nothing, so their step pods get no GPU, no GPU node selector and no toleration.

Only op tags reach step pods: the k8s executor builds each step's pod from run launcher <
executor `step_k8s_config` < this op tag < executor `per_step_k8s_config`, and it deliberately
leaves job-level `dagster-k8s/config` tags out of step pods.
"""

from __future__ import annotations

import json

from onboarding.cluster import (
    CACHE_STAGES,
    GPU_BOUND_STAGES,
    NodeType,
    cache_step_pod_config,
    executor_kind,
    gpu_step_pod_config,
    load_cluster_config,
    load_node_type,
    node_type_name,
)
from onboarding.paths import config_dir

GPU_BOUND_ASSETS = GPU_BOUND_STAGES
CACHE_ASSETS = CACHE_STAGES
K8S_CONFIG_TAG = "dagster-k8s/config"
GPU_SLOT_TAG = "onboarding/gpu"
"""Executors limit steps carrying this tag to the local GPU slots (pipelines.executors)."""


def _node() -> NodeType | None:
    """The step pods' node type; None only for a local run without `configs/nodes.yaml`.

    Without that file a local run still works, since nothing schedules pods; with the k8s
    executor a missing file is an error, never a GPU step without a node selector.
    """
    cfg = load_cluster_config()
    if executor_kind(cfg) != "k8s" and not (config_dir() / "nodes.yaml").is_file():
        return None
    return load_node_type(node_type_name(cfg))


def gpu_step_tags(stage: str) -> dict[str, str]:
    """Tags for a GPU-bound asset's step: the local GPU slot and its pod on a GPU node."""
    if stage not in GPU_BOUND_ASSETS:
        raise ValueError(f"{stage!r} is not a GPU-bound asset ({', '.join(GPU_BOUND_ASSETS)})")
    tags = {GPU_SLOT_TAG: "true"}
    node = _node()
    if node is not None:
        config = gpu_step_pod_config(stage, load_cluster_config(), node)
        tags[K8S_CONFIG_TAG] = json.dumps(config, sort_keys=True)
    return tags


def cache_step_tags(stage: str) -> dict[str, str]:
    """Tags for `checkpoint`: no GPU, but on the GPU node type with the NVMe cache mounted,
    since the GPU-bound steps read what it fetched from that cache."""
    if stage in GPU_BOUND_ASSETS or stage not in CACHE_ASSETS:
        raise ValueError(f"{stage!r} is not a CPU step that uses the cache; GPU-bound assets "
                         "call gpu_step_tags")
    node = _node()
    if node is None:
        return {}
    config = cache_step_pod_config(stage, load_cluster_config(), node)
    return {K8S_CONFIG_TAG: json.dumps(config, sort_keys=True)}
