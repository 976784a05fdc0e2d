"""The executor, chosen by configuration: `ONBOARDING_EXECUTOR` or cluster.yaml `executor.default`.

- `in_process`: one process, steps one after another (tests, debugging).
- `multiprocess`: local runs; steps tagged `onboarding/gpu` (pipelines.step_tags) are limited to
  `executor.local_gpu_slots` at once, so two GPU steps of one run never share the one local GPU.
  Across runs the instance's `gpu` pool does the same (configs/dagster.yaml, `pool="gpu"`).
- `k8s`: `dagster_k8s.k8s_job_executor`, one Kubernetes Job per step; GPU steps get their pod
  config from their op tags, and Kubernetes schedules them onto free GPUs.

Our defaults fill only what run config leaves unset, so a launch can still override anything,
e.g. `per_step_k8s_config` for a model that needs more GPUs (`step_run_config`).
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from dagster._core.executor.init import InitExecutorContext

from onboarding.cluster import (
    GPU_RESOURCE,
    ExecutorKind,
    executor_kind,
    load_cluster_config,
    load_node_type,
    node_type_name,
)
from pipelines.step_tags import CACHE_ASSETS, GPU_BOUND_ASSETS, GPU_SLOT_TAG

HOSTNAME_LABEL = "kubernetes.io/hostname"


def _with_defaults(
    base: dg.ExecutorDefinition, name: str, defaults: dict[str, Any], description: str
) -> dg.ExecutorDefinition:
    """`base` with `defaults` under whatever the run config sets (run config wins per key).

    Unlike `base.configured(...)`, the run config keeps the base executor's full schema.
    """

    def create(init_context: InitExecutorContext):
        config = {**defaults, **dict(init_context.executor_config)}
        return base.executor_creation_fn(  # type: ignore[misc]
            InitExecutorContext(
                job=init_context.job,
                executor_def=init_context.executor_def,
                executor_config=config,
                instance=init_context.instance,
            )
        )

    return dg.ExecutorDefinition(
        name=name,
        config_schema=base.config_schema,
        requirements=base.get_requirements,
        executor_creation_fn=create,
        description=description,
    )


def local_gpu_limits(slots: int) -> list[dict[str, Any]]:
    return [{"key": GPU_SLOT_TAG, "value": "true", "limit": slots}]


def onboarding_executor(kind: ExecutorKind | None = None) -> dg.ExecutorDefinition:
    cfg = load_cluster_config()
    kind = kind or executor_kind(cfg)
    if kind == "in_process":
        return dg.in_process_executor
    if kind == "multiprocess":
        return _with_defaults(
            dg.multiprocess_executor,
            "onboarding_multiprocess",
            {
                "max_concurrent": cfg.executor.local_max_concurrent,
                "tag_concurrency_limits": local_gpu_limits(cfg.executor.local_gpu_slots),
            },
            "Local subprocesses; GPU-bound steps limited to the local GPU slots.",
        )
    from dagster_k8s import k8s_job_executor

    k8s = cfg.executor.k8s
    defaults: dict[str, Any] = {
        "max_concurrent": k8s.max_concurrent,
        "retries": {k8s.retries: {}},
    }
    if k8s.job_namespace:
        defaults["job_namespace"] = k8s.job_namespace
    return _with_defaults(
        k8s_job_executor,
        "onboarding_k8s",
        defaults,
        "One Kubernetes Job per step; GPU-bound steps on GPU nodes (dagster-k8s/config op tags).",
    )


def step_run_config(
    gpus_by_stage: dict[str, int] | None = None, node_name: str | None = None
) -> dict[str, Any]:
    """Run config for one onboarding run on the k8s executor (launchpad, sensor, schedule).

    - `gpus_by_stage`: GPU counts other than the op tags' (a model that needs TP > 1).
    - `node_name`: pins every step that touches the NVMe cache (checkpoint and the GPU-bound
      steps) to one node, so that with a hostPath cache they all see the same disk.
    `per_step_k8s_config` is the last word in dagster-k8s's merge order and the merge is deep,
    so only these fields change; GPU product selector, tolerations and volumes stay.
    """
    cfg = load_cluster_config()
    node = load_node_type(node_type_name(cfg))
    per_step: dict[str, Any] = {}
    for stage, count in (gpus_by_stage or {}).items():
        if stage not in GPU_BOUND_ASSETS:
            raise ValueError(f"{stage!r} is not a GPU-bound asset ({', '.join(GPU_BOUND_ASSETS)})")
        if not 1 <= count <= node.gpus_per_node:
            raise ValueError(
                f"{count} GPUs for {stage!r}: a {node.name} node has {node.gpus_per_node}"
            )
        gpus = {GPU_RESOURCE: str(count)}
        per_step[stage] = {"container_config": {"resources": {"requests": gpus, "limits": gpus}}}
    if node_name:
        for stage in CACHE_ASSETS:
            per_step.setdefault(stage, {})["pod_spec_config"] = {
                "node_selector": {HOSTNAME_LABEL: node_name}
            }
    return {"execution": {"config": {"per_step_k8s_config": per_step}}}
