"""Op tags for GPU-bound steps: Kubernetes pod config for step pods and the local GPU slot.

Assets call `gpu_step_tags("<asset name>")` at decoration time; CPU assets call nothing, so
their step pods get no GPU, no GPU node selector and no toleration.

Only op tags reach step pods: the k8s executor builds each step's pod from run launcher <
executor `step_k8s_config` < this op tag < executor `per_step_k8s_config`, and it deliberately
leaves job-level `dagster-k8s/config` tags out of step pods.
"""

from __future__ import annotations

import json

from onboarding.cluster import (
    GPU_BOUND_STAGES,
    executor_kind,
    gpu_step_pod_config,
    load_cluster_config,
    load_node_type,
    node_type_name,
)
from onboarding.paths import config_dir

GPU_BOUND_ASSETS = GPU_BOUND_STAGES
K8S_CONFIG_TAG = "dagster-k8s/config"
GPU_SLOT_TAG = "onboarding/gpu"
"""Executors limit steps carrying this tag to the local GPU slots (pipelines.executors)."""


def gpu_step_tags(stage: str) -> dict[str, str]:
    """Tags for a GPU-bound asset's step.

    The pod config needs `configs/nodes.yaml` (the GPU product label of the node type). Without
    that file a local run still works, since nothing schedules pods; with the k8s executor a
    missing file is an error, never a GPU step without a node selector.
    """
    if stage not in GPU_BOUND_ASSETS:
        raise ValueError(f"{stage!r} is not a GPU-bound asset ({', '.join(GPU_BOUND_ASSETS)})")
    cfg = load_cluster_config()
    tags = {GPU_SLOT_TAG: "true"}
    if executor_kind(cfg) != "k8s" and not (config_dir() / "nodes.yaml").is_file():
        return tags
    node = load_node_type(node_type_name(cfg))
    tags[K8S_CONFIG_TAG] = json.dumps(gpu_step_pod_config(stage, cfg, node), sort_keys=True)
    return tags
