"""What a node layout becomes: InferenceServices, PriorityClasses, bare-metal launchers, one
LiteLLM gateway config and one Prometheus scrape config.

Pure rendering from a `LayoutPlan`. The InferenceServices are kserve.py's own (`render`), each
from a one-node `DeploymentPlan` built from the layout's choice, renamed per layout and given
the layout's annotations and PriorityClass. The launchers are what the seed runs on bare metal:
one shell script per engine with `CUDA_VISIBLE_DEVICES`, `numactl` onto the engine's NUMA half,
its port and the fixed `--gpu-memory-utilization`. Structural checks of the gateway and
Prometheus configs live here too; the real parsers (LiteLLM's, `promtool`) run in the tests.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from onboarding.common.config import format_validation_error
from onboarding.common.files import write_atomic
from onboarding.common.names import is_dns1123_subdomain, to_dns1123_label
from onboarding.deploy.cluster_prereqs import gpu_operator_objects
from onboarding.deploy.kserve import (
    ISVC_NAME_MAX,
    LABEL_PREFIX,
    MODEL_DIR,
    DeployConfig,
    RenderInputs,
    label_value,
    render,
    source_precision,
    storage_for,
    to_yaml,
)
from onboarding.deploy.plan import GIB, DeploymentPlan, NodesConfig, PlanInputs
from onboarding.deploy.serving_plan import planned_config
from onboarding.fetch.catalog import ModelSpec
from onboarding.layouts.placement import LayoutPlan, LayoutsConfig, Placement, QosClass
from onboarding.serving.engine_config import EngineConfig, evidence
from onboarding.serving.stack import Stack, launcher_variable

GATEWAY_MODE = {"generate": "chat", "embed": "embedding", "rerank": "rerank"}


@dataclass(frozen=True)
class ModelSource:
    """What a layout's manifest deploys from, as the pipeline found it: the checkpoint's
    config.json dtype (None: not fetched, the source precision unknown) and the variants
    `published_variant` published and verified (precision -> PublishedVariant)."""

    config_dtype: str | None = None
    published: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class RenderedLayout:
    """Every file of one layout (path relative to its directory -> text) and the objects."""

    name: str
    manifests: dict[str, tuple[dict[str, Any], ...]]  # model -> (ServingRuntime, InferenceService)
    priority_classes: tuple[dict[str, Any], ...]
    gateway: dict[str, Any]
    prometheus: dict[str, Any]
    launchers: dict[str, str]  # file name -> script
    gpu_sharing: tuple[dict[str, Any], ...] = ()  # the ConfigMap that makes a shared GPU
    grant_problems: tuple[str, ...] = ()  # why the cluster could not grant these requests


def layout_service_name(model_id: str, layout: str) -> str:
    """`<model>-<layout>`: a DNS-1035 label within kserve.py's limit, cut with a hash if long."""
    name = to_dns1123_label(f"{model_id}-{layout}", ISVC_NAME_MAX)
    return name if name[0].isalpha() else to_dns1123_label(f"m-{name}", ISVC_NAME_MAX)


def priority_class_name(qos: str) -> str:
    return f"model-{qos}"


def layout_spec(spec: ModelSpec, p: Placement) -> ModelSpec:
    """The spec as the layout serves it: expert parallelism is the layout's to decide, so the
    flag is set exactly where EP > 1 and dropped elsewhere."""
    args = {k: v for k, v in spec.engine_args.items() if k != "enable_expert_parallel"}
    if p.expert_parallel > 1:
        args["enable_expert_parallel"] = True
    return spec.model_copy(update={"engine_args": args})


def layout_deployment_plan(inputs: PlanInputs, p: Placement) -> DeploymentPlan:
    """A one-node plan carrying the layout's choice, for kserve.py's renderer."""
    return DeploymentPlan(dataclasses.replace(
        inputs, gpu_memory_utilization=p.gpu_memory_utilization), (p.node_plan,))


def _gpus(ids: tuple[int, ...]) -> str:
    return ",".join(map(str, ids))


LAYOUT_LABEL = f"{LABEL_PREFIX}/layout"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"  # the GPU operator's MIG manager reads it


def _mig_share(plan: LayoutPlan, cfg: LayoutsConfig):
    node = cfg.gpu_sharing.node_types.get(plan.node_type)
    return node.mig_share if node is not None else None


# NVIDIA k8s-device-plugin v0.20.0: with `replicas` > 1 and no rename, gpu-feature-discovery
# labels the node `nvidia.com/gpu.product=<product>-SHARED` (internal/lm/resource.go
# getProductName), which the manifests' product selector would never match; `renameByDefault:
# true` keeps the product label and advertises the replicas as `nvidia.com/gpu.shared`
# (api/config/v1/replicas.go, consts.go DefaultSharedResourceNameSuffix) instead of
# nvidia.com/gpu, on every GPU of the node. Replicas are handed out indiscriminately: a request
# for two may get two of the same GPU (README.md, "Shared Access to GPUs"), so
# failRequestsGreaterThanOne makes the kubelet refuse one rather than run it on half a GPU.
SHARED_GPU = "nvidia.com/gpu.shared"


def _device_plugin_shares(plan: LayoutPlan, cfg: LayoutsConfig) -> bool:
    """Time-slicing / MPS: the device plugin's config shares every GPU of the layout's node."""
    return cfg.gpu_sharing.mode != "mig" and any(p.shares_gpu_with for p in plan.placements)


def gpu_resource(plan: LayoutPlan, p: Placement, cfg: LayoutsConfig) -> tuple[str, int]:
    """What the engine's pod requests: a MIG slice when it shares a GPU in mig mode (mixed
    strategy resource name); on a node the device plugin time-slices (or runs MPS on), its
    renamed replicas `nvidia.com/gpu.shared`, for every member; else `tensor_parallel` x
    nvidia.com/gpu."""
    share = _mig_share(plan, cfg)
    if p.shares_gpu_with and cfg.gpu_sharing.mode == "mig" and share is not None:
        return f"nvidia.com/mig-{share.profile}", 1
    if _device_plugin_shares(plan, cfg):
        return SHARED_GPU, p.tensor_parallel
    return "nvidia.com/gpu", p.tensor_parallel


def _layout_annotations(plan: LayoutPlan, p: Placement, cfg: LayoutsConfig) -> dict[str, str]:
    resource, n = gpu_resource(plan, p, cfg)
    shared = (f"; shares GPU {_gpus(p.gpu_ids)} with {', '.join(p.shares_gpu_with)} on bare "
              f"metal; in the cluster {n} x {resource} ({cfg.gpu_sharing.mode}, "
              "gpu-sharing.yaml)") if p.shares_gpu_with else ""
    return {
        f"{LABEL_PREFIX}/layout": plan.name,
        f"{LABEL_PREFIX}/layout-gpus": (f"bare-metal GPUs {_gpus(p.gpu_ids)} (NUMA "
                                        f"{_gpus(p.numa_nodes)}); in a cluster the device plugin "
                                        f"picks which{shared}"),
        f"{LABEL_PREFIX}/layout-parallelism": f"TP {p.tensor_parallel}, EP {p.expert_parallel}",
        f"{LABEL_PREFIX}/layout-memory": (
            f"per GPU: weights {p.weight_bytes_per_gpu / GIB:.1f} GiB ({p.weight_basis}) + KV "
            f"{p.kv_bytes_per_gpu / GIB:.1f} GiB + reserve {p.reserve_bytes_per_gpu / GIB:.1f} GiB;"
            f" --gpu-memory-utilization {p.gpu_memory_utilization:g}"),
        f"{LABEL_PREFIX}/layout-throughput": (f"{p.tokens_per_s:.0f} tokens/s in this layout; "
                                              f"{p.throughput_detail}"),
        f"{LABEL_PREFIX}/layout-qos": f"{p.qos}: PriorityClass {priority_class_name(p.qos)}",
    }


def layout_config(plan: LayoutPlan, p: Placement, spec: ModelSpec, inputs: PlanInputs,
                  nodes: NodesConfig, stack: Stack) -> EngineConfig:
    """The one serving configuration of this engine in this layout (the same builder as a
    single-model manifest's), so its launcher and its InferenceService start the same list."""
    return planned_config(layout_spec(spec, p), layout_deployment_plan(inputs, p),
                          plan.node_type, nodes, stack)


def render_inference_service(plan: LayoutPlan, p: Placement, spec: ModelSpec,
                             inputs: PlanInputs, nodes: NodesConfig, stack: Stack,
                             deploy: DeployConfig, cfg: LayoutsConfig,
                             source: ModelSource | None = None
                             ) -> tuple[dict[str, Any], ...]:
    """kserve.py's ServingRuntime + InferenceService (+ its PodDisruptionBudget), named
    `<model>-<layout>`, with the layout's PriorityClass, labels and annotations, deploying the
    published variant or the source as the pipeline found them (`source`), never an assumed
    precision. Recreate: the layout's pods are pinned to one packed node, where a surge pod
    finds no GPU."""
    source = source or ModelSource()
    resource, n = gpu_resource(plan, p, cfg)
    mig = resource.startswith("nvidia.com/mig-")
    if mig:
        # a MIG slice is its own isolated GPU to the engine: the bare-metal split of a shared
        # GPU's memory would leave the rest of the slice unused, so the model's own fraction
        # applies there (the grant check holds the need within the slice)
        p = dataclasses.replace(p, gpu_memory_utilization=inputs.gpu_memory_utilization)
    config = layout_config(plan, p, spec, inputs, nodes, stack)
    served = layout_spec(spec, p)
    src_prec = source_precision(source.config_dtype, spec.source_precision)  # as kserve_manifest
    r = render(RenderInputs(spec=served, plan=layout_deployment_plan(inputs, p),
                            node_type=plan.node_type, node=nodes.node_types[plan.node_type],
                            stack=stack, deploy=deploy, config=config,
                            evidence=evidence(config, None, None),
                            storage=storage_for(served, config.precision, src_prec, deploy,
                                                source.published),
                            packed=True, priority_class=priority_class_name(p.qos)))
    by_kind = {d["kind"]: copy.deepcopy(d) for d in r.docs}
    runtime, isvc = by_kind["ServingRuntime"], by_kind["InferenceService"]
    extra = tuple(copy.deepcopy(d) for d in r.docs
                  if d["kind"] in ("LocalModelNodeGroup", "LocalModelCache"))
    name = layout_service_name(spec.id, plan.name)
    isvc["metadata"]["name"] = name
    labels = isvc["metadata"]["labels"]
    labels["app.kubernetes.io/name"] = name
    labels[f"{LABEL_PREFIX}/layout"] = label_value(plan.name)
    labels[f"{LABEL_PREFIX}/layout-qos"] = label_value(p.qos)
    labels[f"{LABEL_PREFIX}/throughput-basis"] = p.throughput_basis
    isvc["metadata"]["annotations"].update(_layout_annotations(plan, p, cfg))
    predictor = isvc["spec"]["predictor"]
    predictor["priorityClassName"] = priority_class_name(p.qos)
    # every member of the layout on the one node labelled for it
    predictor["nodeSelector"][LAYOUT_LABEL] = label_value(plan.name)
    if resource == SHARED_GPU:
        for side in ("requests", "limits"):
            res = predictor["model"]["resources"][side]
            res[SHARED_GPU] = res.pop("nvidia.com/gpu")
    if mig:
        # a MIG slice is a fraction of a GPU: its pod gets that fraction of the GPU's host share
        node, share = nodes.node_types[plan.node_type], _mig_share(plan, cfg)
        per = share.per_gpu if share is not None else 1
        for side in ("requests", "limits"):
            res = predictor["model"]["resources"][side]
            res.pop("nvidia.com/gpu", None)
            res[resource] = str(n)
            res["cpu"] = str(max(1, node.cpu_per_gpu // per))
            res["memory"] = f"{max(1, node.host_memory_gib_per_gpu // per)}Gi"
    pdb = by_kind["PodDisruptionBudget"]
    pdb["metadata"]["name"] = f"{name}-pdb"
    pdb["metadata"]["labels"][f"{LABEL_PREFIX}/layout"] = label_value(plan.name)
    pdb["spec"]["selector"]["matchLabels"]["serving.kserve.io/inferenceservice"] = name
    return (runtime, *extra, isvc, pdb)


def render_priority_classes(cfg: LayoutsConfig, used: set[str]) -> tuple[dict[str, Any], ...]:
    return tuple({
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": priority_class_name(name),
                     "labels": {"app.kubernetes.io/part-of": "model-onboarding",
                                f"{LABEL_PREFIX}/qos-class": name}},
        "value": q.priority_value,
        "preemptionPolicy": q.preemption_policy,
        "globalDefault": False,
        "description": q.description or f"model-onboarding QoS class {name}",
    } for name, q in sorted(cfg.qos_classes.items()) if name in used)


def launcher_script(plan: LayoutPlan, p: Placement, spec: ModelSpec, inputs: PlanInputs,
                    nodes: NodesConfig, cfg: LayoutsConfig, stack: Stack) -> str:
    """One engine on bare metal: its GPUs, its NUMA half, its port, its memory fraction.

    The engine's executable is the template's `container_command` run through a variable named
    after the engine (`launcher_variable`, e.g. `$VLLM`; default the command's first word),
    which may be a command with arguments; `NUMACTL` set to empty runs without binding (a
    machine without numactl); `MODEL_PATH` points at the weights; `ENGINE_EXTRA_ARGS` are
    appended (e.g. `--load-format dummy` for a performance twin)."""
    node = nodes.node_types[plan.node_type]
    switches = stack.switches_for(p.precision, inputs.shape.moe, node.arch)
    config = layout_config(plan, p, spec, inputs, nodes, stack)
    args = config.args(MODEL_DIR, p.port)[1:]  # the model path is the launcher's $MODEL_PATH
    var, (exe, *subcommand) = launcher_variable(stack.engine), config.container_command
    model = f'{config.model_arg}="$MODEL_PATH"' if config.model_arg else '"$MODEL_PATH"'
    command = " ".join([f"${var}", *subcommand, model, f"{config.host_flag}=127.0.0.1"])
    runner = f'{var}="${{{var}:-{exe}}}"'
    spans = len(p.numa_nodes) > 1
    numa = ("" if spans else
            f"numactl --cpunodebind={p.numa_nodes[0]} --membind={p.numa_nodes[0]}")
    env = {**stack.template.base_env,
           **{k: v for s in switches for k, v in sorted(s.env.items())}}
    model_path = f"{cfg.engine.model_root}/{spec.id}/{p.precision}"
    shared = f"; shares the GPU with {', '.join(p.shares_gpu_with)}" if p.shares_gpu_with else ""
    lines = [
        "#!/usr/bin/env bash",
        (f"# Rendered by model-onboarding: layout {plan.name} on {plan.node_type}, engine "
        f"{spec.id} ({p.task})."),
        f"# GPUs {_gpus(p.gpu_ids)}, NUMA node {_gpus(p.numa_nodes)}"
        + (" (TP spans both halves: no NUMA binding)" if spans else "")
        + f", TP {p.tensor_parallel}, EP {p.expert_parallel}, {p.precision}, port {p.port}, "
        f"QoS {p.qos}{shared}.",
        (f"# Memory per GPU: weights {p.weight_bytes_per_gpu / GIB:.1f} GiB + KV "
        f"{p.kv_bytes_per_gpu / GIB:.1f} GiB + reserve {p.reserve_bytes_per_gpu / GIB:.1f} GiB "
        f"within --gpu-memory-utilization {p.gpu_memory_utilization:g}."),
        "set -euo pipefail",
        f'MODEL_PATH="${{MODEL_PATH:-{model_path}}}"',
        runner,
        f'NUMACTL="${{NUMACTL-{numa}}}"',
        'ENGINE_EXTRA_ARGS="${ENGINE_EXTRA_ARGS:-}"',
        f"export CUDA_VISIBLE_DEVICES={_gpus(p.gpu_ids)}",
        *(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
        *([f"# {config.never_measured}"] if config.never_measured else []),
        f"# $NUMACTL, ${var} and $ENGINE_EXTRA_ARGS are split into words on purpose.",
        f"exec $NUMACTL {command} \\",
        *(f"  {shlex.quote(a)} \\" for a in args),
        "  $ENGINE_EXTRA_ARGS",
    ]
    return "\n".join(lines).rstrip() + "\n"


def gateway_script(plan: LayoutPlan, cfg: LayoutsConfig) -> str:
    return "\n".join([
        "#!/usr/bin/env bash",
        (f"# Rendered by model-onboarding: the LiteLLM gateway of layout {plan.name}; it routes "
        "each request by its `model` field to the engine's port."),
        "set -euo pipefail",
        'LITELLM="${LITELLM:-litellm}"',
        'here="$(cd "$(dirname "$0")" && pwd)"',
        "export LITELLM_LOCAL_MODEL_COST_MAP=True  # no download of the cost map at start",
        (f'exec $LITELLM --config "$here/../litellm-config.yaml" --host 0.0.0.0 '
        f"--port {cfg.engine.gateway_port}"),
    ]) + "\n"


def gateway_config(plan: LayoutPlan, cfg: LayoutsConfig, deploy: DeployConfig) -> dict[str, Any]:
    """LiteLLM proxy config: one model_name per engine, its QoS class's timeout and limit."""
    model_list = []
    for p in plan.placements:
        q: QosClass = cfg.qos_classes[p.qos]
        model_list.append({
            "model_name": p.served_name,
            "litellm_params": {
                "model": f"{deploy.gateway.provider}/{p.served_name}",
                "api_base": f"http://127.0.0.1:{p.port}/v1",
                "timeout": q.gateway_timeout_s,
                "stream_timeout": q.gateway_timeout_s,
                "max_parallel_requests": q.max_parallel_requests,
            },
            "model_info": {"id": f"{plan.name}/{p.model}", "mode": GATEWAY_MODE[p.task],
                           "qos_class": p.qos, "gpus": _gpus(p.gpu_ids),
                           "tensor_parallel": p.tensor_parallel, "precision": p.precision},
        })
    return {"model_list": model_list,
            "router_settings": {"routing_strategy": deploy.gateway.routing_strategy}}


def prometheus_config(plan: LayoutPlan, cfg: LayoutsConfig, stack: Stack) -> dict[str, Any]:
    """One scrape job per engine port (at the engine template's metrics path unless
    layouts.yaml overrides it), and dcgm-exporter with each GPU labelled by its model."""
    jobs: list[dict[str, Any]] = []
    path = cfg.engine.metrics_path or stack.template.metrics.path
    for p in plan.placements:
        jobs.append({
            "job_name": f"engine-{p.model}",
            "metrics_path": path,
            "static_configs": [{"targets": [f"127.0.0.1:{p.port}"], "labels": {
                "layout": plan.name, "model": p.served_name, "qos_class": p.qos,
                "gpus": _gpus(p.gpu_ids)}}],
        })
    models_on: dict[int, list[str]] = {}
    for p in plan.placements:
        for g in p.gpu_ids:
            models_on.setdefault(g, []).append(p.served_name)
    gpus_of: dict[str, list[int]] = {}  # "a+b" (engines sharing a GPU) -> GPU ids
    for g, names in sorted(models_on.items()):
        gpus_of.setdefault("+".join(names), []).append(g)
    relabel = [{"source_labels": ["gpu"], "regex": "|".join(map(str, ids)),
                "target_label": "model", "replacement": names}
               for names, ids in gpus_of.items()]
    jobs.append({
        "job_name": "dcgm-exporter",
        "static_configs": [{"targets": [f"127.0.0.1:{cfg.engine.dcgm_exporter_port}"],
                            "labels": {"layout": plan.name, "node_type": plan.node_type}}],
        "metric_relabel_configs": relabel,
    })
    return {"global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
            "scrape_configs": jobs}


def render_layout(plan: LayoutPlan, specs: dict[str, ModelSpec], inputs: dict[str, PlanInputs],
                  cfg: LayoutsConfig, nodes: NodesConfig, stack: Stack, deploy: DeployConfig,
                  sources: dict[str, ModelSource] | None = None) -> RenderedLayout:
    if not plan.feasible:
        raise ValueError(f"layout {plan.name} is infeasible: {plan.reason}")
    sources = sources or {}
    manifests = {p.model: render_inference_service(plan, p, specs[p.model], inputs[p.model],
                                                   nodes, stack, deploy, cfg,
                                                   sources.get(p.model))
                 for p in plan.placements}
    launchers = {f"{p.model}.sh": launcher_script(plan, p, specs[p.model], inputs[p.model],
                                                  nodes, cfg, stack)
                 for p in plan.placements}
    launchers["gateway.sh"] = gateway_script(plan, cfg)
    return RenderedLayout(
        name=plan.name, manifests=manifests,
        priority_classes=render_priority_classes(cfg, {p.qos for p in plan.placements}),
        gateway=gateway_config(plan, cfg, deploy), prometheus=prometheus_config(plan, cfg, stack),
        launchers=launchers, gpu_sharing=gpu_sharing_objects(plan, cfg, nodes),
        grant_problems=tuple(grant_problems(plan, manifests, cfg, nodes)))


def gpu_sharing_objects(plan: LayoutPlan, cfg: LayoutsConfig, nodes: NodesConfig
                        ) -> tuple[dict[str, Any], ...]:
    """The ConfigMap that makes the layout's shared GPU: the GPU operator's mig-parted config
    (shared GPUs cut into the MIG share, the others whole) or the device plugin's time-slicing
    / MPS config (`sharing.timeSlicing` / `sharing.mps`, `replicas` per GPU)."""
    shared = sorted({g for p in plan.placements if p.shares_gpu_with for g in p.gpu_ids})
    if not shared:
        return ()
    gs = cfg.gpu_sharing
    meta = {"namespace": "gpu-operator", "labels": {
        "app.kubernetes.io/part-of": "model-onboarding", LAYOUT_LABEL: label_value(plan.name)}}
    entries = mig_entries(plan, cfg, nodes)
    if entries is not None:
        # the one ConfigMap the ClusterPolicy names (cluster_prereqs), all-disabled kept: the
        # fleet's merged copy (node_layout's gpu-operator-mig-config.yaml) holds every layout
        cm, _ = gpu_operator_objects({plan.name: entries})
        cm["metadata"]["labels"][LAYOUT_LABEL] = label_value(plan.name)
        return (cm,)
    key = "timeSlicing" if gs.mode == "time-slicing" else "mps"
    config = {"version": "v1", "sharing": {key: {
        "renameByDefault": True, "failRequestsGreaterThanOne": True,
        "resources": [{"name": "nvidia.com/gpu", "replicas": gs.replicas}]}}}
    return ({"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": to_dns1123_label(f"{plan.name}-device-plugin-config"),
                          **meta},
             "data": {plan.name: to_yaml([config])}},)


def mig_entries(plan: LayoutPlan, cfg: LayoutsConfig, nodes: NodesConfig
                ) -> list[dict[str, Any]] | None:
    """The layout's mig-parted config (its shared GPUs cut into the MIG share, the others
    whole), or None where it cuts no GPU."""
    shared = sorted({g for p in plan.placements if p.shares_gpu_with for g in p.gpu_ids})
    share = _mig_share(plan, cfg)
    if not shared or cfg.gpu_sharing.mode != "mig" or share is None:
        return None
    whole = [g for g in range(nodes.node_types[plan.node_type].gpus_per_node) if g not in shared]
    return [{"devices": whole, "mig-enabled": False},
            {"devices": shared, "mig-enabled": True,
             "mig-devices": {share.profile: share.per_gpu}}]


def grant_problems(plan: LayoutPlan, manifests: dict[str, tuple[dict[str, Any], ...]],
                   cfg: LayoutsConfig, nodes: NodesConfig) -> list[str]:
    """Why a cluster could not grant the layout's pods on one node: whole GPUs requested plus
    GPUs cut into MIG slices above the node's, more slices than a cut GPU has, a sharing mode
    the node type lacks, or time-slicing / MPS (which shares every GPU of the node) beside an
    engine whose QoS class must own its GPUs."""
    node = nodes.node_types[plan.node_type]
    gs = cfg.gpu_sharing
    sharing = [p for p in plan.placements if p.shares_gpu_with]
    out: list[str] = []
    if sharing:
        kinds = gs.node_types.get(plan.node_type)
        if kinds is None or gs.mode not in kinds.modes:
            out.append(f"{plan.name}: gpu_sharing.mode {gs.mode!r} is not available on "
                       f"{plan.node_type} ({kinds.modes if kinds else 'no gpu_sharing entry'})")
        if gs.mode == "mig" and (kinds is None or kinds.mig_share is None):
            out.append(f"{plan.name}: no mig_share for {plan.node_type} in layouts.yaml")
        if gs.mode != "mig":
            owners = [p.model for p in plan.placements
                      if not cfg.qos_classes[p.qos].shares_gpu]
            if owners:
                out.append(f"{plan.name}: {gs.mode} shares every GPU of the node, also those "
                           f"of {', '.join(owners)} (QoS shares_gpu: false); use mig")
    if _device_plugin_shares(plan, cfg):
        many = [p.model for p in plan.placements if p.tensor_parallel > 1]
        if many:
            out.append(f"{plan.name}: {', '.join(many)} request more than one "
                       f"{SHARED_GPU}: {gs.mode} hands out replicas, not distinct GPUs, and "
                       "the rendered failRequestsGreaterThanOne refuses such a pod; use mig")
    whole = slices = 0
    for docs in manifests.values():
        req = next(d for d in docs if d["kind"] == "InferenceService")["spec"]["predictor"][
            "model"]["resources"]["requests"]
        whole += int(req.get("nvidia.com/gpu", 0)) + int(req.get(SHARED_GPU, 0))
        slices += sum(int(v) for k, v in req.items() if k.startswith("nvidia.com/mig-"))
    cut = len({g for p in sharing for g in p.gpu_ids}) if gs.mode == "mig" else 0
    allocatable = node.gpus_per_node * (gs.replicas if sharing and gs.mode != "mig" else 1)
    if whole + cut > allocatable:
        out.append(f"{plan.name}: {whole} whole GPU(s) + {cut} cut into MIG slices requested on "
                   f"one {plan.node_type} node of {allocatable} allocatable")
    cpus = mem_gib = 0.0
    for docs in manifests.values():
        req = next(d for d in docs if d["kind"] == "InferenceService")["spec"]["predictor"][
            "model"]["resources"]["requests"]
        cpus += _cpu(req.get("cpu", "0"))
        mem_gib += _gib(req.get("memory", "0"))
    node_cpus = node.gpus_per_node * node.cpu_per_gpu
    node_gib = node.gpus_per_node * node.host_memory_gib_per_gpu
    if cpus > node_cpus:
        out.append(f"{plan.name}: {cpus:g} CPUs requested on one {plan.node_type} node of "
                   f"{node_cpus} (nodes.yaml: {node.gpus_per_node} GPUs x cpu_per_gpu "
                   f"{node.cpu_per_gpu})")
    if mem_gib > node_gib:
        out.append(f"{plan.name}: {mem_gib:g} GiB of memory requested on one {plan.node_type} "
                   f"node of {node_gib} GiB (nodes.yaml: {node.gpus_per_node} GPUs x "
                   f"host_memory_gib_per_gpu {node.host_memory_gib_per_gpu})")
    share = _mig_share(plan, cfg)
    if cut and share is not None and slices > cut * share.per_gpu:
        out.append(f"{plan.name}: {slices} MIG slices of {share.profile} requested, {cut} GPU(s)"
                   f" x {share.per_gpu} exist")
    if cut and share is not None:
        for p in sharing:
            if p.need_bytes_per_gpu > share.memory_bytes:
                out.append(f"{plan.name}: {p.model} needs {p.need_bytes_per_gpu / 1e9:.1f} GB, a "
                           f"{share.profile} slice has {share.memory_bytes / 1e9:.0f} GB")
    return out


def _cpu(q: str) -> float:
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def _gib(q: str) -> float:
    units = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1, "Ti": 2**10}
    for u, f in units.items():
        if q.endswith(u):
            return float(q[:-2]) * f
    return float(q) / 2**30


# ---- structural checks (the real parsers run in the tests) ------------------------------------


class _LiteLLMParams(BaseModel):
    """The litellm_params keys this project renders, as LiteLLM's proxy docs define them
    (config.yaml `model_list[].litellm_params`); unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(pattern=r"^[a-z_]+/.+")
    api_base: str = Field(pattern=r"^https?://[^/\s]+(/\S*)?$")
    timeout: float = Field(gt=0)
    stream_timeout: float = Field(gt=0)
    max_parallel_requests: int = Field(ge=1)


class _Deployment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_name: str = Field(min_length=1)
    litellm_params: _LiteLLMParams
    model_info: dict[str, Any]


class _Router(BaseModel):
    model_config = ConfigDict(extra="forbid")
    routing_strategy: Literal["simple-shuffle", "least-busy", "usage-based-routing",
                              "usage-based-routing-v2", "latency-based-routing",
                              "cost-based-routing"]


class _GatewayDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_list: list[_Deployment] = Field(min_length=1)
    router_settings: _Router


def check_gateway(doc: dict[str, Any]) -> list[str]:
    try:
        _GatewayDoc.model_validate(doc)
    except ValidationError as exc:
        return format_validation_error("litellm-config.yaml", exc).split("; ")
    ids = [d["model_info"].get("id") for d in doc["model_list"]]
    names = [d["model_name"] for d in doc["model_list"]]
    errors = [f"model_info.id {i!r} appears twice" for i in set(ids) if ids.count(i) > 1]
    errors += [f"model_name {n!r} routes to two engines" for n in set(names) if names.count(n) > 1]
    return errors


_TARGET = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def check_prometheus(doc: dict[str, Any]) -> list[str]:
    """What promtool would refuse in what we render: duplicate job names, bad targets, label
    names, relabel regexes that do not compile."""
    errors: list[str] = []
    jobs = doc.get("scrape_configs") or []
    names = [j.get("job_name") for j in jobs]
    errors += [f"job_name {n!r} appears twice" for n in set(names) if names.count(n) > 1]
    for j in jobs:
        where = f"scrape_configs[{j.get('job_name')}]"
        if not str(j.get("metrics_path", "/")).startswith("/"):
            errors.append(f"{where}.metrics_path must start with /")
        for sc in j.get("static_configs") or []:
            errors += [f"{where}: target {t!r} is not host:port" for t in sc.get("targets", [])
                       if not _TARGET.match(t)]
            errors += [f"{where}: label name {k!r} is invalid" for k in sc.get("labels", {})
                       if not _LABEL_NAME.match(k)]
        for rc in j.get("metric_relabel_configs") or []:
            try:
                re.compile(rc.get("regex", "(.*)"))
            except re.error as exc:
                errors.append(f"{where}: relabel regex {rc.get('regex')!r}: {exc}")
    return errors


def check_configmap(doc: dict[str, Any]) -> list[str]:
    """A core/v1 ConfigMap as the Kubernetes API takes it: name a DNS-1123 subdomain, namespace
    a label, `data` string to string with keys of [-._a-zA-Z0-9]."""
    out = []
    if doc.get("apiVersion") != "v1" or doc.get("kind") != "ConfigMap":
        out.append("$: expected apiVersion v1, kind ConfigMap")
    meta = doc.get("metadata") or {}
    if not is_dns1123_subdomain(str(meta.get("name", ""))):
        out.append(f"$.metadata.name: {meta.get('name')!r} is not a DNS-1123 subdomain")
    if set(doc) - {"apiVersion", "kind", "metadata", "data", "binaryData", "immutable"}:
        out.append(f"$: unknown fields {sorted(set(doc) - {'apiVersion', 'kind', 'metadata', 'data'})}")
    for k, v in (doc.get("data") or {}).items():
        if not re.fullmatch(r"[-._a-zA-Z0-9]+", k) or not isinstance(v, str):
            out.append(f"$.data.{k}: keys are [-._a-zA-Z0-9]+ and values strings")
    return out


def check_priority_class(doc: dict[str, Any]) -> list[str]:
    """scheduling.k8s.io/v1 PriorityClass as the API server validates it."""
    errors = []
    name = (doc.get("metadata") or {}).get("name", "")
    if not is_dns1123_subdomain(name):
        errors.append(f"metadata.name {name!r} is not a DNS-1123 subdomain")
    if name.startswith("system-"):
        errors.append("metadata.name: the system- prefix is reserved")
    value = doc.get("value")
    if not isinstance(value, int) or isinstance(value, bool) or not (
            -2147483648 <= value <= 1000000000):
        errors.append(f"value {value!r}: an integer of at most 1000000000 for user classes")
    if doc.get("preemptionPolicy") not in ("PreemptLowerPriority", "Never"):
        errors.append(f"preemptionPolicy {doc.get('preemptionPolicy')!r}")
    unknown = set(doc) - {"apiVersion", "kind", "metadata", "value", "preemptionPolicy",
                          "globalDefault", "description"}
    if unknown:
        errors.append(f"unknown fields {sorted(unknown)}")
    return errors


def layout_summary(plan: LayoutPlan) -> dict[str, Any]:
    """layout.json: the placement and every option's verdict, for people and scripts."""
    return {
        "layout": plan.name, "node_type": plan.node_type, "feasible": plan.feasible,
        "reason": plan.reason, "mix_tokens_per_s": round(plan.mix_tokens_per_s, 1),
        "weighted_tokens_per_s": round(plan.weighted_tokens_per_s, 1),
        "gpu_memory_utilization": plan.gpu_memory_utilization,
        "assignments_searched": plan.assignments_searched,
        "placements": [{
            "model": p.model, "served_name": p.served_name, "task": p.task, "qos": p.qos,
            "traffic_share": p.traffic_share, "gpu_ids": list(p.gpu_ids),
            "numa_nodes": list(p.numa_nodes), "tensor_parallel": p.tensor_parallel,
            "expert_parallel": p.expert_parallel, "precision": p.precision,
            "weight_basis": p.weight_basis, "weight_bytes_per_gpu": p.weight_bytes_per_gpu,
            "kv_bytes_per_gpu": p.kv_bytes_per_gpu, "reserve_bytes_per_gpu":
            p.reserve_bytes_per_gpu, "gpu_memory_utilization": p.gpu_memory_utilization,
            "shares_gpu_with": list(p.shares_gpu_with), "port": p.port,
            "tokens_per_s": round(p.tokens_per_s, 1), "throughput_basis": p.throughput_basis,
            "throughput_detail": p.throughput_detail,
        } for p in plan.placements],
        "options": [{"model": o.model, "tensor_parallel": o.tensor_parallel, "ok": o.ok,
                     "reason": o.reason} for o in plan.options],
    }


def layout_files(plan: LayoutPlan, r: RenderedLayout) -> dict[str, str]:
    """Every text file of the layout's directory, by relative path."""
    head = f"Rendered by model-onboarding for layout {plan.name} on {plan.node_type}."
    files = {f"{model}.yaml": to_yaml(docs, head) for model, docs in r.manifests.items()}
    files["priority-classes.yaml"] = to_yaml(r.priority_classes, head)
    if r.gpu_sharing:
        files["gpu-sharing.yaml"] = to_yaml(r.gpu_sharing, f"{head}\nLabel the node "
                                            f"{LAYOUT_LABEL}={plan.name}"
                                            + (f" and {MIG_CONFIG_LABEL}={plan.name}"
                                               if cfg_mode(r) == "mig" else "") + ".")
    files["litellm-config.yaml"] = to_yaml(
        [r.gateway], f"{head}\nRun: launchers/gateway.sh (litellm --config litellm-config.yaml "
        "--port <gateway_port>).")
    files["prometheus.yml"] = to_yaml([r.prometheus], f"{head}\nCheck: promtool check config "
                                      "prometheus.yml")
    files.update({f"launchers/{name}": text for name, text in r.launchers.items()})
    files["layout.json"] = json.dumps(layout_summary(plan), indent=1) + "\n"
    return files


def cfg_mode(r: RenderedLayout) -> str:
    return "mig" if any("mig-parted" in d["metadata"]["name"] for d in r.gpu_sharing) else (
        "device-plugin")


def write_layout_files(directory: Path, plan: LayoutPlan, r: RenderedLayout) -> Path:
    """`layout_files` under `directory`, each written atomically; the launchers executable."""
    for rel, text in layout_files(plan, r).items():
        path = write_atomic(directory / rel, text)
        if rel.endswith(".sh"):
            path.chmod(0o755)
    return directory
