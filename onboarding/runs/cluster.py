"""Step-pod placement for a cluster: `configs/cluster.yaml` + `configs/nodes.yaml` -> pod config.

Pure logic, no Dagster: the result is the `dagster-k8s/config` shape (snake_case Kubernetes
fields under `container_config` / `pod_spec_config`) that `pipelines.step_tags` serializes into
op tags. A GPU-bound step asks for exactly its GPUs (requests = limits, which the device plugin
requires for extended resources), lands only on the configured GPU product, tolerates the GPU
taint, and sees the node's NVMe cache at the same path as the `NvmeCache` resource.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from onboarding.common.config import StrictConfig, format_validation_error, load_yaml
from onboarding.common.errors import ConfigError

GPU_BOUND_STAGES = ("quantized", "accuracy", "served_accuracy", "config_search",
                    "load_timing", "serving_benchmark")
# Steps that touch the node's NVMe cache: the fetch, the publish, and every GPU-bound step.
CACHE_STAGES = ("checkpoint", "published_variant", *GPU_BOUND_STAGES)
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME_LABEL = "kubernetes.io/hostname"
CACHE_VOLUME = "model-cache"
SHM_VOLUME = "dshm"

ExecutorKind = Literal["in_process", "multiprocess", "k8s"]
EXECUTOR_ENV = "ONBOARDING_EXECUTOR"
NODE_TYPE_ENV = "ONBOARDING_NODE_TYPE"
GPU_IMAGE_ENV = "ONBOARDING_GPU_IMAGE"


class K8sExecutorSettings(StrictConfig):
    job_namespace: str | None = None
    max_concurrent: int = Field(default=8, ge=1)
    retries: Literal["enabled", "disabled"] = "enabled"


class ExecutorSettings(StrictConfig):
    default: ExecutorKind = "multiprocess"
    local_gpu_slots: int = Field(default=1, ge=1)
    local_max_concurrent: int = Field(default=2, ge=1)
    k8s: K8sExecutorSettings = Field(default_factory=K8sExecutorSettings)


class ContainerResources(StrictConfig):
    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _no_gpus_here(self) -> ContainerResources:
        if GPU_RESOURCE in self.requests or GPU_RESOURCE in self.limits:
            raise ValueError(f"set {GPU_RESOURCE} per stage under step_pods.gpus, not here")
        return self


class CacheVolume(StrictConfig):
    mount_path: str = "/data/models"
    host_path: str | None = None
    pvc_claim_name: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> CacheVolume:
        if (self.host_path is None) == (self.pvc_claim_name is None):
            raise ValueError("set exactly one of host_path and pvc_claim_name")
        return self


class StepPodSettings(StrictConfig):
    node_type: str
    gpu_image: str | None = None
    gpus: dict[str, int]
    resources: ContainerResources = Field(default_factory=ContainerResources)
    shm_size: str = "32Gi"
    cache: CacheVolume

    @model_validator(mode="after")
    def _every_gpu_stage(self) -> StepPodSettings:
        unknown = sorted(set(self.gpus) - set(GPU_BOUND_STAGES))
        if unknown:
            raise ValueError(f"gpus names {unknown}, which are not GPU-bound stages")
        missing = [s for s in GPU_BOUND_STAGES if s not in self.gpus]
        if missing:
            raise ValueError(f"gpus lacks a count for {missing}")
        if any(n < 1 for n in self.gpus.values()):
            raise ValueError("every GPU count must be at least 1")
        return self


class ClusterConfig(StrictConfig):
    executor: ExecutorSettings = Field(default_factory=ExecutorSettings)
    step_pods: StepPodSettings


class NodeType(StrictConfig):
    """What step placement needs from one node type of nodes.yaml."""

    name: str
    gpu_product: str
    gpus_per_node: int
    taints: tuple[dict[str, str], ...] = ()


def _read(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(
            str(path), "does not exist",
            "Restore it from the repository or point ONBOARDING_CONFIG_DIR at a directory "
            "that has it (in a cluster: the onboarding-configs ConfigMap).",
        )
    return load_yaml(path)


def _mtime(path: Path) -> int:
    return path.stat().st_mtime_ns if path.is_file() else 0


@lru_cache(maxsize=8)
def _load_cluster_config(path: Path, mtime_ns: int) -> ClusterConfig:
    try:
        return ClusterConfig.model_validate(_read(path))
    except ValidationError as exc:
        fields = format_validation_error(path, exc).replace(f"{path}: ", "")
        raise ConfigError(str(path), fields, "Fix cluster.yaml.") from None


def load_cluster_config(path: Path) -> ClusterConfig:
    return _load_cluster_config(path, _mtime(path))


def executor_kind(cfg: Callable[[], ClusterConfig], override: str | None = None
                  ) -> ExecutorKind:
    """`override` (ONBOARDING_EXECUTOR), else cluster.yaml's `executor.default` (read only
    when there is no override)."""
    value = (override or "").strip() or cfg().executor.default
    allowed = ("in_process", "multiprocess", "k8s")
    if value not in allowed:
        raise ConfigError(
            f"{EXECUTOR_ENV}={value!r}", f"not one of {', '.join(allowed)}",
            f"Unset {EXECUTOR_ENV} to use cluster.yaml's executor.default, or set a valid one.",
        )
    return value  # type: ignore[return-value]


def node_type_name(cfg: ClusterConfig, override: str | None = None) -> str:
    """`override` (ONBOARDING_NODE_TYPE), else cluster.yaml's `step_pods.node_type`."""
    return (override or "").strip() or cfg.step_pods.node_type


def gpu_image(cfg: ClusterConfig, override: str | None = None) -> str | None:
    """`override` (ONBOARDING_GPU_IMAGE), else cluster.yaml's `step_pods.gpu_image`."""
    return (override or "").strip() or cfg.step_pods.gpu_image


def _node_entries(data: Any, path: Path) -> dict[str, dict[str, Any]]:
    """Node types by name; only the fields placement needs are read, the plan owns the rest."""
    entries = data.get("node_types") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise ConfigError(
            str(path), "field 'node_types': expected a mapping of node types by name",
            "List node types (b300, b200, h200, h100) under node_types.",
        )
    return {str(k): v for k, v in entries.items() if isinstance(v, dict)}


def _taints(entry: dict[str, Any]) -> tuple[dict[str, str], ...]:
    taints = entry.get("taints") or []
    out = []
    for t in taints if isinstance(taints, list) else []:
        if isinstance(t, dict) and t.get("key"):
            out.append({k: str(t[k]) for k in ("key", "value", "effect") if t.get(k) is not None})
    return tuple(out)


@lru_cache(maxsize=8)
def _load_node_type(path: Path, mtime_ns: int, name: str) -> NodeType:
    entries = _node_entries(_read(path), path)
    if name not in entries:
        raise ConfigError(
            f"{path}: node type {name!r}", f"not listed (known: {', '.join(sorted(entries))})",
            f"Set {NODE_TYPE_ENV} or cluster.yaml step_pods.node_type to a listed node type.",
        )
    entry = entries[name]
    product = entry.get("gpu_product")
    if not product:
        raise ConfigError(
            f"{path}: field 'node_types.{name}.gpu_product'", "required but missing",
            "Add the value gpu-feature-discovery sets on those nodes "
            f"(kubectl get nodes -L {GPU_PRODUCT_LABEL}).",
        )
    gpus = entry.get("gpus_per_node", 8)
    if not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(
            f"{path}: field 'node_types.{name}.gpus_per_node'", f"expected a count >= 1, got {gpus!r}",
            "Fix nodes.yaml.",
        )
    return NodeType(name=name, gpu_product=str(product), gpus_per_node=gpus, taints=_taints(entry))


def load_node_type(name: str, nodes_path: Path) -> NodeType:
    return _load_node_type(nodes_path, _mtime(nodes_path), name)


def _tolerations(node: NodeType) -> list[dict[str, str]]:
    """The GPU taint is always tolerated; every other taint the node type declares, too."""
    tolerations = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    for taint in node.taints:
        if taint["key"] == GPU_RESOURCE:
            continue
        tol = {"key": taint["key"], "operator": "Equal" if "value" in taint else "Exists"}
        if "value" in taint:
            tol["value"] = taint["value"]
        if "effect" in taint:
            tol["effect"] = taint["effect"]
        tolerations.append(tol)
    return tolerations


def cache_step_pod_config(stage: str, cfg: ClusterConfig, node: NodeType) -> dict[str, Any]:
    """Placement of a step that reads or writes the node's NVMe cache, without GPUs.

    `checkpoint` fetches into the cache that the GPU-bound steps then read, so it must run on
    the same kind of node, with the same volume at the same path.
    """
    if stage not in CACHE_STAGES:
        raise ValueError(f"{stage!r} does not use the NVMe cache ({', '.join(CACHE_STAGES)})")
    return _cache_pod(stage, cfg, node)


def _cache_pod(stage: str, cfg: ClusterConfig, node: NodeType) -> dict[str, Any]:
    cache = cfg.step_pods.cache
    cache_source: dict[str, Any] = (
        {"host_path": {"path": cache.host_path, "type": "DirectoryOrCreate"}}
        if cache.host_path
        else {"persistent_volume_claim": {"claim_name": cache.pvc_claim_name}}
    )
    return {
        "container_config": {
            "volume_mounts": [{"name": CACHE_VOLUME, "mount_path": cache.mount_path}],
            "env": [
                {"name": "ONBOARDING_CACHE_ROOT", "value": cache.mount_path},
                # The engine resource attributes its measurements to this node type.
                {"name": NODE_TYPE_ENV, "value": node.name},
            ],
        },
        "pod_spec_config": {
            "node_selector": {GPU_PRODUCT_LABEL: node.gpu_product},
            "tolerations": _tolerations(node),
            "volumes": [{"name": CACHE_VOLUME, **cache_source}],
        },
        "pod_template_spec_metadata": {
            "labels": {"onboarding/stage": stage, "onboarding/node-type": node.name}
        },
    }


def gpu_step_pod_config(
    stage: str, cfg: ClusterConfig, node: NodeType, gpus: int | None = None,
    image: str | None = None,
) -> dict[str, Any]:
    """The `dagster-k8s/config` mapping of one GPU-bound stage on `node`: the cache placement
    plus exactly `gpus` GPUs (requests = limits), /dev/shm and the GPU image.

    `gpus` overrides the stage's count from cluster.yaml (a run that needs TP > 1); `image`
    the GPU image (`gpu_image(cfg, override)`).
    """
    if stage not in GPU_BOUND_STAGES:
        raise ValueError(f"{stage!r} is not a GPU-bound stage ({', '.join(GPU_BOUND_STAGES)})")
    count = cfg.step_pods.gpus[stage] if gpus is None else gpus
    if not 1 <= count <= node.gpus_per_node:
        raise ConfigError(
            f"GPUs for step {stage!r}", f"{count} requested, a {node.name} node has "
            f"{node.gpus_per_node}", "Request between 1 and the node's GPU count.",
        )
    return _with_gpus(cache_step_pod_config(stage, cfg, node), cfg, count, image)


def node_acceptance_pod_config(node_name: str, gpus: int, cfg: ClusterConfig, node: NodeType,
                               image: str | None = None) -> dict[str, Any]:
    """The `dagster-k8s/config` of one node's acceptance run pod: the probe runs in the run's
    own pod, so it is pinned to that node (kubernetes.io/hostname) with every GPU it registers
    and the NVMe cache that storage_read reads."""
    config = _with_gpus(_cache_pod("accept_node", cfg, node), cfg, gpus, image)
    config["pod_spec_config"]["node_selector"][HOSTNAME_LABEL] = node_name
    return config


def _with_gpus(config: dict[str, Any], cfg: ClusterConfig, count: int, image: str | None
               ) -> dict[str, Any]:
    """A cache placement plus exactly `count` GPUs (requests = limits), /dev/shm, the image."""
    pods = cfg.step_pods
    container = config["container_config"]
    container["resources"] = {
        "requests": {**pods.resources.requests, GPU_RESOURCE: str(count)},
        "limits": {**pods.resources.limits, GPU_RESOURCE: str(count)},
    }
    container["volume_mounts"].insert(0, {"name": SHM_VOLUME, "mount_path": "/dev/shm"})
    config["pod_spec_config"]["volumes"].insert(
        0, {"name": SHM_VOLUME, "empty_dir": {"medium": "Memory", "size_limit": pods.shm_size}}
    )
    if image:
        container["image"] = image
    return config
