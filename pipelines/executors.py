"""The executor, chosen by `ONBOARDING_EXECUTOR` or cluster.yaml `executor.default`.

- `in_process`: one process, steps one after another (tests, debugging).
- `multiprocess`: local runs; steps tagged `onboarding/gpu` (assets.step_tags) are limited to
  `executor.local_gpu_slots` at once, so two GPU steps of one run never share the one local GPU.
  Across runs the instance's `gpu` pool does the same (configs/dagster.yaml, `pool="gpu"`).
- `k8s`: `dagster_k8s.k8s_job_executor`, one Kubernetes Job per step. Where each step's pod
  goes (GPUs, node selector, tolerations, the NVMe cache volume, the GPU image) is computed
  when the run starts, from cluster.yaml and nodes.yaml, as `per_step_k8s_config` defaults.

Only the kind is decided when the code location loads; everything else is read when a run
starts, so a broken cluster.yaml fails the runs (naming file and field) and never the code
location. Our defaults fill only what run config leaves unset, so a launch can still override
anything, e.g. `per_step_k8s_config` for a model that needs more GPUs (`step_run_config`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import dagster as dg

from assets.partitions import split_cell
from assets.step_tags import GPU_SLOT_TAG
from onboarding.common.config import deep_merge
from onboarding.common.errors import ConfigError
from onboarding.runs.cluster import (
    CACHE_STAGES,
    EXECUTOR_ENV,
    GPU_BOUND_STAGES,
    GPU_IMAGE_ENV,
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    NODE_TYPE_ENV,
    ExecutorKind,
    cache_step_pod_config,
    executor_kind,
    gpu_image,
    gpu_step_pod_config,
    node_acceptance_pod_config,
    node_type_name,
)
from pipelines.resources import config_files
from resources.config_files import ConfigFiles

K8S_CONFIG_TAG = "dagster-k8s/config"
# the GPU-bound steps of a cell run (pipelines/jobs.py CELL_ASSETS)
CELL_STEPS = ("served_accuracy", "config_search", "load_timing", "serving_benchmark")


def _with_defaults(base: dg.ExecutorDefinition, name: str,
                   defaults: Callable[[], dict[str, Any]], description: str
                   ) -> dg.ExecutorDefinition:
    """`base` with `defaults()` (computed when a run starts) under whatever the run config sets.

    Unlike `base.configured(...)`, the run config keeps the base executor's full schema.
    """

    def create(init_context: dg.InitExecutorContext):
        config = deep_merge(defaults(), dict(init_context.executor_config))
        return base.executor_creation_fn(  # type: ignore[misc]
            dg.InitExecutorContext(job=init_context.job, executor_def=init_context.executor_def,
                                   executor_config=config, instance=init_context.instance))

    return dg.ExecutorDefinition(name=name, config_schema=base.config_schema,
                                 requirements=base.get_requirements,
                                 executor_creation_fn=create, description=description)


def _failing(error: ConfigError) -> dg.ExecutorDefinition:
    """Stands in when the executor kind cannot be known: the code location loads, and every
    run says why it cannot start."""

    def create(_init_context: dg.InitExecutorContext):
        raise error

    return dg.ExecutorDefinition(name="onboarding_config_error", executor_creation_fn=create,
                                 description=f"No executor: {error}")


def local_gpu_limits(slots: int) -> list[dict[str, Any]]:
    return [{"key": GPU_SLOT_TAG, "value": "true", "limit": slots}]


def _multiprocess_defaults() -> dict[str, Any]:
    cfg = config_files().cluster()
    return {"max_concurrent": cfg.executor.local_max_concurrent,
            "tag_concurrency_limits": local_gpu_limits(cfg.executor.local_gpu_slots)}


def step_placements(configs: ConfigFiles | None = None, node_type: str | None = None
                    ) -> dict[str, dict[str, Any]]:
    """Step key -> `dagster-k8s/config` of every step that touches the NVMe cache or a GPU, on
    `node_type`'s pool (default: ONBOARDING_NODE_TYPE, else cluster.yaml `step_pods`)."""
    configs = configs or config_files()
    cfg = configs.cluster()
    node = configs.node_type(node_type or node_type_name(cfg, os.environ.get(NODE_TYPE_ENV)))
    image = gpu_image(cfg, os.environ.get(GPU_IMAGE_ENV))
    out = {s: cache_step_pod_config(s, cfg, node) for s in CACHE_STAGES
           if s not in GPU_BOUND_STAGES}
    out.update({s: gpu_step_pod_config(s, cfg, node, image=image) for s in GPU_BOUND_STAGES})
    return out


def _k8s_defaults() -> dict[str, Any]:
    k8s = config_files().cluster().executor.k8s
    defaults: dict[str, Any] = {"max_concurrent": k8s.max_concurrent,
                                "retries": {k8s.retries: {}},
                                "per_step_k8s_config": step_placements()}
    if k8s.job_namespace:
        defaults["job_namespace"] = k8s.job_namespace
    return defaults


def onboarding_executor(kind: ExecutorKind | None = None) -> dg.ExecutorDefinition:
    try:
        kind = kind or executor_kind(config_files().cluster, os.environ.get(EXECUTOR_ENV))
    except ConfigError as exc:
        return _failing(exc)
    if kind == "in_process":
        return dg.in_process_executor
    if kind == "multiprocess":
        return _with_defaults(dg.multiprocess_executor, "onboarding_multiprocess",
                              _multiprocess_defaults,
                              "Local subprocesses; GPU-bound steps limited to the local GPU "
                              "slots.")
    from dagster_k8s import k8s_job_executor

    return _with_defaults(k8s_job_executor, "onboarding_k8s", _k8s_defaults,
                          "One Kubernetes Job per step; GPU-bound steps on GPU nodes, placed "
                          "from cluster.yaml when the run starts.")


def step_run_config(gpus_by_stage: dict[str, int] | None = None, node_name: str | None = None,
                    configs: ConfigFiles | None = None) -> dict[str, Any]:
    """Run config for one onboarding run on the k8s executor (launchpad, sensor, schedule).

    - `gpus_by_stage`: GPU counts other than cluster.yaml's (a model that needs TP > 1).
    - `node_name`: pins every step that touches the NVMe cache (checkpoint and the GPU-bound
      steps) to one node, so that with a hostPath cache they all see the same disk.
    This run config is merged onto the placement defaults key by key, so only these fields
    change; GPU product selector, tolerations and volumes stay.
    """
    configs = configs or config_files()
    cfg = configs.cluster()
    node = configs.node_type(node_type_name(cfg, os.environ.get(NODE_TYPE_ENV)))
    per_step: dict[str, Any] = {}
    for stage, count in (gpus_by_stage or {}).items():
        if stage not in GPU_BOUND_STAGES:
            raise ValueError(f"{stage!r} is not a GPU-bound asset ({', '.join(GPU_BOUND_STAGES)})")
        if not 1 <= count <= node.gpus_per_node:
            raise ValueError(
                f"{count} GPUs for {stage!r}: a {node.name} node has {node.gpus_per_node}")
        gpus = {GPU_RESOURCE: str(count)}
        per_step[stage] = {"container_config": {"resources": {"requests": gpus, "limits": gpus}}}
    if node_name:
        for stage in CACHE_STAGES:
            per_step.setdefault(stage, {})["pod_spec_config"] = {
                "node_selector": {HOSTNAME_LABEL: node_name}}
    return {"execution": {"config": {"per_step_k8s_config": per_step}}}


def node_run_tags(node_name: str, configs: ConfigFiles | None = None) -> dict[str, str]:
    """Tags of one node's accept_node run (its partitioned config asks for them whenever a run
    is made: launchpad, backfill, sensor). On the k8s executor the run pod is the probe, so it
    is pinned to that node with every GPU acceptance.yaml registers for it; an unregistered
    node fails the launch naming the file. Local runs probe where they run: no tags."""
    configs = configs or config_files()
    if executor_kind(configs.cluster, os.environ.get(EXECUTOR_ENV)) != "k8s":
        return {}
    cfg = configs.cluster()
    setting = configs.node_setting(node_name)
    pod = node_acceptance_pod_config(node_name, setting.gpus_expected, cfg,
                                     configs.node_type(setting.node_type),
                                     gpu_image(cfg, os.environ.get(GPU_IMAGE_ENV)))
    return {K8S_CONFIG_TAG: json.dumps(pod, sort_keys=True)}


def cell_run_config(key: str, configs: ConfigFiles | None = None) -> dict[str, Any]:
    """Run config of one (model, node type) cell's run. On the k8s executor its GPU steps are
    placed on the partition's node type: that pool's GPU product selector, tolerations and GPU
    count, and ONBOARDING_NODE_TYPE in the pod, which the engine checks against the hardware
    it finds before measuring. Local runs measure where they run: none."""
    configs = configs or config_files()
    if executor_kind(configs.cluster, os.environ.get(EXECUTOR_ENV)) != "k8s":
        return {}
    _, node_type = split_cell(key)
    if node_type not in configs.nodes().node_types:
        return {}  # the embedded engine's `cpu`: no pool; the engine refuses a GPU pod
    placements = step_placements(configs, node_type)
    return {"execution": {"config": {"per_step_k8s_config": {
        s: placements[s] for s in CELL_STEPS if s in placements}}}}


def cell_run_tags(key: str) -> dict[str, str]:
    """The cell's model and node type as tags, to filter runs by either in the UI."""
    model, node_type = split_cell(key)
    return {"onboarding/model": model, "onboarding/node_type": node_type}
