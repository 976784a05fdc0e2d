"""Several models on one GPU node: where each sits, its memory budget, and why a set does not fit.

Pure planning over `configs/layouts.yaml`, `configs/nodes.yaml` and each model's plan inputs
(`onboarding.deploy.plan.PlanInputs`: shape, parameter count, precision ladder, what was measured).
The memory arithmetic is plan.py's own (`plan_node` at one TP at a time): weights at the served
precision with the parts Model Optimizer keeps in bf16, KV for target concurrency x context,
the per-GPU runtime reserve (activations, CUDA graphs, NCCL). Pooling models (embeddings,
rerankers) keep no KV cache, so theirs is zero.

The search enumerates every TP choice per model (1, 2, 4, 8 that fit and meet the SLO), every
grouping of GPU-sharing engines, and packs the GPU sets onto the node with backtracking:
contiguous, aligned sets that stay inside one NUMA half unless the set is larger than
`planning.numa_local_max_tp`. It keeps the placement that serves the most tokens/s of the
layout's traffic mix (each model receiving its share; ties broken by the next bottleneck, then
the fewest GPUs).
Throughput per model and TP is measured > predicted (`ThroughputFor`) > the stated rule, and
every placement says which.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from pydantic import Field, model_validator

from onboarding.common.config import StrictConfig, load_config_file
from onboarding.common.errors import ConfigError
from onboarding.common.names import is_dns1123_label
from onboarding.deploy.plan import GIB, NodePlan, NodesConfig, NodeType, PlanInputs, plan_node
from onboarding.fetch.catalog import ModelSpec
from onboarding.serving.profiles import SloSection, resolve_slo
from onboarding.serving.stats import ServingBenchmarkResult, Slo

ThroughputBasis = Literal["measured", "predicted", "rule"]

# ---- configs/layouts.yaml ---------------------------------------------------------------------


class EngineSettings(StrictConfig):
    gpu_memory_utilization: float = Field(ge=0.85, le=0.90)
    base_port: int = Field(ge=1024, le=65000)
    gateway_port: int = Field(ge=1, le=65535)
    dcgm_exporter_port: int = Field(default=9400, ge=1, le=65535)
    # None: the engine template's metrics.path (configs/stack.yaml); set only to override it.
    metrics_path: str | None = Field(default=None, pattern=r"^/")
    expert_parallel_min_tp: int = Field(default=8, ge=2)
    model_root: str = Field(default="/data/models", pattern=r"^/")


class QosClass(StrictConfig):
    priority_value: int = Field(ge=-2147483648, le=1000000000)  # above: system classes only
    preemption_policy: Literal["PreemptLowerPriority", "Never"] = "PreemptLowerPriority"
    gateway_timeout_s: float = Field(gt=0)
    max_parallel_requests: int = Field(ge=1)
    shares_gpu: bool = False
    description: str = ""


class RuleFacts(StrictConfig):
    hbm_tb_per_s: float = Field(gt=0)
    dense_bf16_tflops: float = Field(gt=0)


class ThroughputRule(StrictConfig):
    bandwidth_efficiency: float = Field(gt=0, le=1)
    compute_efficiency: float = Field(gt=0, le=1)
    node_types: dict[str, RuleFacts] = Field(default_factory=dict)


class LayoutModel(StrictConfig):
    model: str
    traffic_share: float = Field(gt=0, le=1)
    qos: str
    tensor_parallel: list[int] | None = Field(default=None, min_length=1)


class Layout(StrictConfig):
    node_type: str
    description: str = ""
    models: list[LayoutModel] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Layout:
        ids = [m.model for m in self.models]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a model is listed twice: {ids}")
        total = sum(m.traffic_share for m in self.models)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"traffic shares must sum to 1, got {total:g}")
        return self


SharingMode = Literal["mig", "time-slicing", "mps"]


class MigShare(StrictConfig):
    """The MIG profile a shared GPU is cut into (mixed strategy), and how many per GPU."""

    profile: str = Field(pattern=r"^[1-7]g\.[0-9]+gb$")
    per_gpu: int = Field(ge=1, le=7)

    @property
    def memory_bytes(self) -> int:
        return int(self.profile.split(".")[1].removesuffix("gb")) * 10**9


class SharingNode(StrictConfig):
    modes: list[SharingMode] = Field(min_length=1)
    mig_profiles: list[str] = Field(default_factory=list)  # the GPU's MIG profiles by name
    mig_share: MigShare | None = None

    @model_validator(mode="after")
    def _share_is_a_profile(self) -> SharingNode:
        if self.mig_share and self.mig_share.profile not in self.mig_profiles:
            raise ValueError(f"mig_share.profile {self.mig_share.profile!r} is not one of this "
                             f"GPU's MIG profiles {self.mig_profiles}")
        return self


class GpuSharing(StrictConfig):
    """How a cluster grants two engines one GPU: MIG slices of that GPU (the GPU
    operator's mixed strategy), or the device plugin's time-slicing / MPS replicas of
    `nvidia.com/gpu`, which apply to every GPU of the node."""

    mode: SharingMode = "mig"
    replicas: int = Field(default=2, ge=2)  # time-slicing / MPS
    node_types: dict[str, SharingNode] = Field(default_factory=dict)


class LayoutsConfig(StrictConfig):
    engine: EngineSettings
    qos_classes: dict[str, QosClass] = Field(min_length=1)
    throughput_rule: ThroughputRule
    layouts: dict[str, Layout] = Field(default_factory=dict)
    gpu_sharing: GpuSharing = Field(default_factory=GpuSharing)

    @model_validator(mode="after")
    def _consistent(self) -> LayoutsConfig:
        for name in [*self.layouts, *self.qos_classes]:
            if not is_dns1123_label(name):
                raise ValueError(f"{name!r} is not a DNS-1123 label (it names files and objects)")
        for name, layout in self.layouts.items():
            for i, m in enumerate(layout.models):
                if m.qos not in self.qos_classes:
                    raise ValueError(f"layouts.{name}.models.{i}.qos: {m.qos!r} is not under "
                                     f"qos_classes ({', '.join(self.qos_classes)})")
                bad = [t for t in m.tensor_parallel or [] if t < 1 or t & (t - 1)]
                if bad:
                    raise ValueError(f"layouts.{name}.models.{i}.tensor_parallel: powers of two "
                                     f"only, got {bad}")
        return self


def load_layouts(path: Path) -> LayoutsConfig:
    return load_config_file(LayoutsConfig, path, "Fix layouts.yaml.")


def check_references(cfg: LayoutsConfig, path: Path | str, nodes: NodesConfig,
                     known_models: set[str]) -> None:
    """What pydantic cannot see: node types in nodes.yaml, models in the catalog, rule facts."""
    for name, layout in cfg.layouts.items():
        if layout.node_type not in nodes.node_types:
            raise ConfigError(f"{path}: layouts.{name}.node_type",
                              f"{layout.node_type!r} is not a node type of nodes.yaml "
                              f"({', '.join(nodes.node_types)})", "Use a node type of nodes.yaml.")
        if layout.node_type not in cfg.throughput_rule.node_types:
            raise ConfigError(f"{path}: throughput_rule.node_types.{layout.node_type}",
                              f"required by layout {name!r} but missing",
                              "Add the node type's hbm_tb_per_s and dense_bf16_tflops.")
        for i, m in enumerate(layout.models):
            if m.model not in known_models:
                raise ConfigError(f"{path}: layouts.{name}.models.{i}.model",
                                  f"{m.model!r} is not in the catalog",
                                  "Add configs/models/<id>.yaml or fix the id.")


# ---- throughput sources -------------------------------------------------------------------------


class ThroughputFor(Protocol):
    """A throughput predictor (e.g. NVIDIA AIConfigurator): tokens/s/GPU of `model` at
    `precision` and TP `tp` on `node_type` while meeting its SLO, and a sentence saying where the
    number comes from; None when it cannot say."""

    def __call__(self, model: str, node_type: str, precision: str, tp: int
                 ) -> tuple[float, str] | None: ...


def no_prediction(model: str, node_type: str, precision: str, tp: int) -> None:
    """The default predictor until one is wired in: it never knows."""
    return


@dataclass(frozen=True, kw_only=True)
class LayoutEntry:
    """One model of a layout with everything its options are computed from."""

    spec: ModelSpec
    inputs: PlanInputs
    traffic_share: float
    qos: str
    slo: Slo
    benchmark: ServingBenchmarkResult | None = None
    tensor_parallel: tuple[int, ...] | None = None


def layout_entries(layout: Layout, specs: dict[str, ModelSpec], inputs: dict[str, PlanInputs],
                   slos: SloSection, benchmarks: dict[str, ServingBenchmarkResult]
                   ) -> list[LayoutEntry]:
    """The layout's models in its order, each with its plan inputs, SLO on the node type
    (gates.yaml < the model's own overrides) and its latest benchmark (or None)."""
    return [LayoutEntry(spec=specs[m.model], inputs=inputs[m.model], traffic_share=m.traffic_share,
                        qos=m.qos, slo=resolve_slo(slos, layout.node_type, specs[m.model]),
                        benchmark=benchmarks.get(m.model),
                        tensor_parallel=tuple(m.tensor_parallel) if m.tensor_parallel else None)
            for m in layout.models]


@dataclass(frozen=True, kw_only=True)
class Option:
    """One model at one TP on the node type: its memory per GPU, throughput, and SLO verdict."""

    model: str
    tensor_parallel: int
    ok: bool
    reason: str  # why it fits, or why not
    precision: str | None = None
    expert_parallel: int = 1
    weight_bytes_per_gpu: int = 0
    kv_bytes_per_gpu: int = 0
    reserve_bytes_per_gpu: int = 0
    tokens_per_s_per_gpu: float = 0.0
    throughput_basis: ThroughputBasis = "rule"
    throughput_detail: str = ""
    itl_ms: float | None = None  # the rule's decode step; None where not estimated
    node_plan: NodePlan | None = None

    @property
    def need_bytes_per_gpu(self) -> int:
        return self.weight_bytes_per_gpu + self.kv_bytes_per_gpu + self.reserve_bytes_per_gpu


def _measured(entry: LayoutEntry, node_type: str, precision: str, tp: int
              ) -> ServingBenchmarkResult | None:
    b = entry.benchmark
    if (b is not None and b.node_type == node_type and b.gpus == tp and b.precision == precision
            and b.servable and b.tokens_per_s_per_gpu > 0):
        return b
    return None


def _read_fraction(entry: LayoutEntry) -> tuple[float, str]:
    """Share of the weights one decode step reads at the target concurrency."""
    shape, arch = entry.inputs.shape, entry.spec.architecture
    if not shape.moe:
        return 1.0, "dense: all weights"
    conc = entry.inputs.target_concurrency
    if arch is None or not arch.active_params_billion:
        return 1.0, "MoE without active_params_billion: all weights (conservative)"
    active = arch.active_params_billion / arch.params_billion
    frac = 1 - (1 - active) ** conc
    return frac, (f"MoE: 1 - (1 - {arch.active_params_billion:g}/{arch.params_billion:g})^{conc}"
                  f" = {frac:.2f} of the weights per step")


def rule_throughput(entry: LayoutEntry, opt: Option, rule: ThroughputRule, node_type: str
                    ) -> tuple[float, float | None, str]:
    """(tokens/s/GPU, ITL ms or None, the rule as applied): see layouts.yaml throughput_rule."""
    facts = rule.node_types[node_type]
    if entry.spec.task != "generate":
        params = entry.inputs.param_count or 0.0
        flops = facts.dense_bf16_tflops * 1e12 * rule.compute_efficiency
        tps = flops / (2 * params) if params else 0.0
        return tps, None, (f"rule (compute roofline): {facts.dense_bf16_tflops:g} TFLOPS x "
                           f"{rule.compute_efficiency:g} / (2 x {params / 1e9:.3g} B params) "
                           "input tokens/s")
    conc, context = entry.inputs.target_concurrency, entry.inputs.context_tokens
    frac, why = _read_fraction(entry)
    per_token = opt.kv_bytes_per_gpu / (conc * context)
    read_bytes = opt.weight_bytes_per_gpu * frac + conc * (context / 2) * per_token
    step_s = read_bytes / (facts.hbm_tb_per_s * 1e12 * rule.bandwidth_efficiency)
    tps = conc / step_s / opt.tensor_parallel
    return tps, step_s * 1e3, (
        f"rule (HBM roofline): {read_bytes / 1e9:.1f} GB per step per GPU ({why} + KV at half "
        f"context) at {facts.hbm_tb_per_s:g} TB/s x {rule.bandwidth_efficiency:g} = ITL "
        f"{step_s * 1e3:.1f} ms at concurrency {conc}")


def _one_tp(nodes: NodesConfig, tp: int) -> NodesConfig:
    planning = nodes.planning.model_copy(update={"tensor_parallel_candidates": [tp]})
    return nodes.model_copy(update={"planning": planning})


def option(entry: LayoutEntry, tp: int, node_type: str, node: NodeType, nodes: NodesConfig,
           cfg: LayoutsConfig, predictor: ThroughputFor = no_prediction) -> Option:
    """The model at exactly TP `tp`: plan.py's memory arithmetic, then throughput and SLO."""
    name = entry.spec.id
    inputs = dataclasses.replace(entry.inputs,
                                 gpu_memory_utilization=cfg.engine.gpu_memory_utilization)
    np_ = plan_node(inputs, node_type, node, _one_tp(nodes, tp))
    if np_.tensor_parallel is None or np_.precision is None or np_.weight_bytes_per_gpu is None:
        return Option(model=name, tensor_parallel=tp, ok=False,
                      reason=np_.rejected[-1] if np_.rejected else np_.reason,
                      precision=np_.precision)
    pooling = entry.spec.task != "generate"
    kv = 0 if pooling else int(np_.kv_bytes_per_gpu or 0)
    headroom = np_.budget_bytes_per_gpu - (np_.weight_bytes_per_gpu + kv
                                           + np_.reserve_bytes_per_gpu)
    if pooling:
        np_ = dataclasses.replace(
            np_, feasible=headroom >= 0, kv_bytes_per_gpu=0, headroom_bytes_per_gpu=headroom,
            reason=(f"TP {tp} {'fits' if headroom >= 0 else 'does not fit'}: weights "
                    f"{_gib(np_.weight_bytes_per_gpu)} + no KV cache (pooling model) + reserve "
                    f"{_gib(np_.reserve_bytes_per_gpu)} within {_gib(np_.budget_bytes_per_gpu)} "
                    "per GPU"))
    ep = tp if entry.inputs.shape.moe and tp >= cfg.engine.expert_parallel_min_tp else 1
    opt = Option(model=name, tensor_parallel=tp, ok=False, reason="", precision=np_.precision,
                 expert_parallel=ep, weight_bytes_per_gpu=np_.weight_bytes_per_gpu,
                 kv_bytes_per_gpu=kv, reserve_bytes_per_gpu=np_.reserve_bytes_per_gpu,
                 node_plan=np_)
    if headroom < 0:
        return dataclasses.replace(opt, reason=(
            f"TP {tp}: needs {_gib(opt.need_bytes_per_gpu)} per GPU (weights "
            f"{_gib(opt.weight_bytes_per_gpu)} + KV {_gib(kv)} + reserve "
            f"{_gib(opt.reserve_bytes_per_gpu)}), budget {_gib(np_.budget_bytes_per_gpu)}: "
            f"short by {_gib(-headroom)}"))
    return _with_throughput(entry, opt, node_type, cfg, predictor)


def _with_throughput(entry: LayoutEntry, opt: Option, node_type: str, cfg: LayoutsConfig,
                     predictor: ThroughputFor) -> Option:
    tp, precision = opt.tensor_parallel, opt.precision or ""
    fits = (f"TP {tp} {precision}: {_gib(opt.need_bytes_per_gpu)} per GPU (weights "
            f"{_gib(opt.weight_bytes_per_gpu)} + KV {_gib(opt.kv_bytes_per_gpu)} + reserve "
            f"{_gib(opt.reserve_bytes_per_gpu)})")
    bench = _measured(entry, node_type, precision, tp)
    if bench is not None:
        detail = (f"measured: serving_benchmark on {node_type}, {tp} GPU(s), {precision}: "
                  f"{bench.tokens_per_s_per_gpu:g} tokens/s/GPU")
        opt = dataclasses.replace(opt, tokens_per_s_per_gpu=bench.tokens_per_s_per_gpu,
                                  throughput_basis="measured", throughput_detail=detail)
        if not bench.slo_pass:
            return dataclasses.replace(opt, reason=f"TP {tp}: measured SLO miss on {node_type} "
                                       f"({'; '.join(bench.slo_violations) or 'slo_pass false'})")
        return dataclasses.replace(opt, ok=True, reason=f"{fits}; {detail}")
    predicted = predictor(entry.spec.id, node_type, precision, tp)
    if predicted is not None:
        tps, source = predicted
        return dataclasses.replace(opt, ok=tps > 0, tokens_per_s_per_gpu=tps,
                                   throughput_basis="predicted",
                                   throughput_detail=f"predicted: {source}",
                                   reason=f"{fits}; predicted {tps:g} tokens/s/GPU ({source})")
    tps, itl_ms, detail = rule_throughput(entry, opt, cfg.throughput_rule, node_type)
    opt = dataclasses.replace(opt, tokens_per_s_per_gpu=tps, throughput_basis="rule",
                              throughput_detail=detail, itl_ms=itl_ms)
    if itl_ms is not None and itl_ms > entry.slo.itl_mean_ms:
        return dataclasses.replace(opt, reason=(
            f"TP {tp}: the rule's ITL {itl_ms:.1f} ms exceeds the SLO's {entry.slo.itl_mean_ms:g}"
            f" ms at concurrency {entry.inputs.target_concurrency}"))
    return dataclasses.replace(opt, ok=True, reason=f"{fits}; {detail}")


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# ---- GPU sets and packing -----------------------------------------------------------------------


def gpu_sets(node: NodeType, tp: int, numa_local_max_tp: int) -> list[tuple[int, ...]]:
    """Contiguous, aligned GPU sets of size `tp`; inside one NUMA socket for tp up to
    `numa_local_max_tp`, any aligned set above it (TP 8 spans the node)."""
    sockets = [set(s) for s in node.numa_layout()]
    out = []
    for start in range(0, node.gpus_per_node - tp + 1, tp):
        ids = tuple(range(start, start + tp))
        if tp > numa_local_max_tp or any(set(ids) <= s for s in sockets):
            out.append(ids)
    return out


@dataclass(frozen=True)
class _Engine:
    """What the packer places: one engine exclusive on `tp` GPUs, or a group sharing one GPU."""

    models: tuple[str, ...]
    tp: int


def _pack(engines: list[_Engine], node: NodeType, numa_local_max_tp: int
          ) -> dict[tuple[str, ...], tuple[int, ...]] | None:
    """GPU ids per engine, largest first, by backtracking over the aligned sets; None if none."""
    order = sorted(engines, key=lambda e: -e.tp)
    sets = {e.tp: gpu_sets(node, e.tp, numa_local_max_tp) for e in order}
    used: set[int] = set()
    placed: dict[tuple[str, ...], tuple[int, ...]] = {}

    def go(i: int) -> bool:
        if i == len(order):
            return True
        e = order[i]
        for ids in sets[e.tp]:
            if used.isdisjoint(ids):
                used.update(ids)
                placed[e.models] = ids
                if go(i + 1):
                    return True
                used.difference_update(ids)
                del placed[e.models]
        return False

    return placed if go(0) else None


def _set_partitions(items: list[str]) -> Iterator[list[list[str]]]:
    """Every way to group `items` (GPU-sharing engines onto GPUs)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _set_partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1:]]


# ---- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Placement:
    model: str
    served_name: str
    task: str
    qos: str
    traffic_share: float
    gpu_ids: tuple[int, ...]
    numa_nodes: tuple[int, ...]
    tensor_parallel: int
    expert_parallel: int
    precision: str
    weight_basis: str
    weight_bytes_per_gpu: int
    kv_bytes_per_gpu: int
    reserve_bytes_per_gpu: int
    gpu_memory_utilization: float  # this engine's --gpu-memory-utilization
    shares_gpu_with: tuple[str, ...]
    compute_fraction: float  # of its GPUs' time: 1, or 1/k for k engines on one GPU
    tokens_per_s_per_gpu: float  # the engine alone on its GPUs
    tokens_per_s: float  # what this engine serves in the layout
    throughput_basis: ThroughputBasis
    throughput_detail: str
    itl_ms: float | None
    port: int
    node_plan: NodePlan

    @property
    def need_bytes_per_gpu(self) -> int:
        return self.weight_bytes_per_gpu + self.kv_bytes_per_gpu + self.reserve_bytes_per_gpu


@dataclass(frozen=True, kw_only=True)
class LayoutPlan:
    name: str
    node_type: str
    gpus: int
    memory_bytes_per_gpu: int
    gpu_memory_utilization: float
    numa_gpus: tuple[tuple[int, ...], ...]
    feasible: bool
    reason: str
    placements: tuple[Placement, ...] = ()
    mix_tokens_per_s: float = 0.0  # tokens/s of the traffic mix (each model at its share)
    weighted_tokens_per_s: float = 0.0  # sum of share x tokens/s
    options: tuple[Option, ...] = ()
    assignments_searched: int = 0

    @property
    def free_gpus(self) -> tuple[int, ...]:
        used = {g for p in self.placements for g in p.gpu_ids}
        return tuple(g for g in range(self.gpus) if g not in used)

    def placement(self, model: str) -> Placement:
        for p in self.placements:
            if p.model == model:
                return p
        raise KeyError(model)


@dataclass(frozen=True)
class _Candidate:
    score: tuple[tuple[float, ...], int]  # (normalized rates ascending, -GPUs used)
    mix_tokens_per_s: float
    weighted_tokens_per_s: float
    choice: dict[str, Option]
    groups: list[list[str]]
    placed: dict[tuple[str, ...], tuple[int, ...]]


def _tp_choices(entry: LayoutEntry, nodes: NodesConfig, node: NodeType) -> list[int]:
    allowed = [t for t in nodes.planning.tensor_parallel_candidates if t <= node.gpus_per_node]
    if entry.tensor_parallel:
        allowed = [t for t in allowed if t in entry.tensor_parallel]
    return sorted(allowed)


def plan_layout(name: str, layout: Layout, entries: list[LayoutEntry], cfg: LayoutsConfig,
                nodes: NodesConfig, predictor: ThroughputFor = no_prediction) -> LayoutPlan:
    """Search every TP choice and GPU-sharing grouping; keep the placement serving the most
    tokens/s of the traffic mix (leximin over each model's tokens/s / share), then the fewest
    GPUs."""
    node_type = layout.node_type
    node = nodes.node_types[node_type]
    util = cfg.engine.gpu_memory_utilization
    budget = int(node.memory_bytes * util)
    base = {"name": name, "node_type": node_type, "gpus": node.gpus_per_node,
            "memory_bytes_per_gpu": node.memory_bytes, "gpu_memory_utilization": util,
            "numa_gpus": tuple(tuple(s) for s in node.numa_layout())}
    all_options = {e.spec.id: [option(e, t, node_type, node, nodes, cfg, predictor)
                               for t in _tp_choices(e, nodes, node)] for e in entries}
    flat = tuple(o for opts in all_options.values() for o in opts)
    ok = {m: [o for o in opts if o.ok] for m, opts in all_options.items()}
    if missing := [m for m, opts in ok.items() if not opts]:
        why = "; ".join(f"{m}: no TP fits its memory budget and SLO on {node_type} ("
                        + " | ".join(o.reason for o in all_options[m]) + ")" for m in missing)
        return LayoutPlan(**base, feasible=False, reason=why, options=flat)
    by_id = {e.spec.id: e for e in entries}
    shareable = {m for m, e in by_id.items() if cfg.qos_classes[e.qos].shares_gpu}
    best: _Candidate | None = None
    searched = 0
    ids = list(by_id)
    for combo in itertools.product(*(ok[m] for m in ids)):
        choice = dict(zip(ids, combo, strict=True))
        sharers = [m for m in ids if m in shareable and choice[m].tensor_parallel == 1]
        for groups in _set_partitions(sharers):
            searched += 1
            cand = _evaluate(choice, groups, by_id, node, nodes, budget)
            if cand is not None and (best is None or cand.score > best.score):
                best = cand
    if best is None:
        return LayoutPlan(**base, feasible=False, options=flat, assignments_searched=searched,
                          reason=why_not_placed(entries, ok, node_type, node, nodes))
    placements = _placements(best, by_id, cfg, node)
    return LayoutPlan(**base, feasible=True, placements=placements,
                      reason=(f"{len(placements)} engine(s) on {-best.score[1]} of "
                              f"{node.gpus_per_node} GPUs; {best.mix_tokens_per_s:.0f} tokens/s "
                              f"of the traffic mix ({searched} assignments searched)"),
                      mix_tokens_per_s=best.mix_tokens_per_s,
                      weighted_tokens_per_s=best.weighted_tokens_per_s,
                      options=flat, assignments_searched=searched)


def _evaluate(choice: dict[str, Option], groups: list[list[str]], by_id: dict[str, LayoutEntry],
              node: NodeType, nodes: NodesConfig, budget: int) -> _Candidate | None:
    for g in groups:
        if sum(choice[m].need_bytes_per_gpu for m in g) > budget:
            return None
    grouped = {m for g in groups for m in g}
    engines = [_Engine(tuple(g), 1) for g in groups]
    engines += [_Engine((m,), o.tensor_parallel) for m, o in choice.items() if m not in grouped]
    order = {m: i for i, m in enumerate(by_id)}  # equal sizes take GPUs in the layout's order
    engines.sort(key=lambda e: order[e.models[0]])
    if sum(e.tp for e in engines) > node.gpus_per_node:
        return None
    placed = _pack(engines, node, nodes.planning.numa_local_max_tp)
    if placed is None:
        return None
    share_of = {m: 1 / len(g) for g in groups for m in g}
    served = {m: o.tokens_per_s_per_gpu * o.tensor_parallel * share_of.get(m, 1.0)
              for m, o in choice.items()}
    # Tokens/s of the traffic mix each model could carry alone: the smallest is the mix the
    # node serves. Compared ascending (leximin): first the bottleneck, then the next one, so a
    # spare GPU goes to the model nearest to becoming the bottleneck, never to the model with
    # the largest raw tokens/s (an embedder's input tokens would win every sum).
    rates = tuple(sorted(round(served[m] / by_id[m].traffic_share, 6) for m in choice))
    weighted = sum(served[m] * by_id[m].traffic_share for m in choice)
    gpus_used = sum(e.tp for e in engines)
    return _Candidate((rates, -gpus_used), rates[0], weighted, choice, groups, placed)


def _placements(best: _Candidate, by_id: dict[str, LayoutEntry], cfg: LayoutsConfig,
                node: NodeType) -> tuple[Placement, ...]:
    util = cfg.engine.gpu_memory_utilization
    group_of = {m: g for g in best.groups for m in g}
    gpus_of = {m: ids for models, ids in best.placed.items() for m in models}
    layout_numa = node.numa_layout()
    out = []
    for i, (m, entry) in enumerate(by_id.items()):
        o = best.choice[m]
        np_ = o.node_plan
        assert np_ is not None
        group = group_of.get(m, [m])
        share = _shared_utilization(o, [best.choice[x] for x in group], node, util)
        ids = gpus_of[m]
        numa = tuple(i for i, s in enumerate(layout_numa) if set(s) & set(ids))
        np_ = dataclasses.replace(np_, gpu_ids=ids, numa_nodes=numa)
        fraction = 1 / len(group)
        out.append(Placement(
            model=m, served_name=entry.spec.served_name, task=entry.spec.task, qos=entry.qos,
            traffic_share=entry.traffic_share, gpu_ids=ids, numa_nodes=numa,
            tensor_parallel=o.tensor_parallel, expert_parallel=o.expert_parallel,
            precision=o.precision or "", weight_basis=np_.weight_basis or "estimate",
            weight_bytes_per_gpu=o.weight_bytes_per_gpu, kv_bytes_per_gpu=o.kv_bytes_per_gpu,
            reserve_bytes_per_gpu=o.reserve_bytes_per_gpu, gpu_memory_utilization=share,
            shares_gpu_with=tuple(x for x in group if x != m), compute_fraction=fraction,
            tokens_per_s_per_gpu=o.tokens_per_s_per_gpu,
            tokens_per_s=o.tokens_per_s_per_gpu * o.tensor_parallel * fraction,
            throughput_basis=o.throughput_basis, throughput_detail=o.throughput_detail,
            itl_ms=o.itl_ms, port=cfg.engine.base_port + i, node_plan=np_))
    return tuple(out)


def _shared_utilization(o: Option, group: list[Option], node: NodeType, util: float) -> float:
    """An engine alone keeps the layout's fraction; engines sharing a GPU split it, each its need
    plus a need-proportional part of what is left, rounded down to 0.01 (the sum stays within)."""
    if len(group) == 1:
        return util
    total_need = sum(g.need_bytes_per_gpu for g in group)
    spare = node.memory_bytes * util - total_need
    mine = o.need_bytes_per_gpu + spare * o.need_bytes_per_gpu / total_need
    return math.floor(mine / node.memory_bytes * 100) / 100


def why_not_placed(entries: list[LayoutEntry], ok: dict[str, list[Option]], node_type: str,
                   node: NodeType, nodes: NodesConfig) -> str:
    """The first model, in layout order, that no longer finds GPUs once every model before it
    takes its smallest fitting TP (GPU-sharing engines counted as sharing nothing)."""
    engines: list[_Engine] = []
    for e in entries:
        smallest = min(ok[e.spec.id], key=lambda o: o.tensor_parallel)
        trial = [*engines, _Engine((e.spec.id,), smallest.tensor_parallel)]
        if _pack(trial, node, nodes.planning.numa_local_max_tp) is None:
            taken = sum(x.tp for x in engines)
            left = node.gpus_per_node - taken
            before = ", ".join(f"{x.models[0]} TP {x.tp}" for x in engines) or "nothing"
            shape = "" if left < smallest.tensor_parallel else (
                f" (none an aligned set of {smallest.tensor_parallel} inside one NUMA half)")
            return (f"{e.spec.id} {smallest.precision} needs TP >= {smallest.tensor_parallel} "
                    f"on {node_type}; only {left} GPU{'s' if left != 1 else ''} left{shape} "
                    f"after {before} at their smallest fitting TP")
        engines = trial
    return (f"no placement satisfies every model on {node_type}: GPU-sharing engines do not fit "
            "together in one GPU's memory budget")


# ---- rows for people ----------------------------------------------------------------------------


def placement_rows(p: LayoutPlan) -> list[dict[str, object]]:
    return [{
        "model": x.model, "qos": x.qos, "share": x.traffic_share,
        "gpus": ",".join(map(str, x.gpu_ids)), "numa": ",".join(map(str, x.numa_nodes)),
        "tp": x.tensor_parallel, "ep": x.expert_parallel, "precision": x.precision,
        "weights_gib_per_gpu": round(x.weight_bytes_per_gpu / GIB, 1),
        "kv_gib_per_gpu": round(x.kv_bytes_per_gpu / GIB, 1),
        "reserve_gib_per_gpu": round(x.reserve_bytes_per_gpu / GIB, 1),
        "gpu_mem_util": x.gpu_memory_utilization,
        "tokens_per_s": round(x.tokens_per_s), "throughput": x.throughput_basis,
        "weights": x.weight_basis, "port": x.port,
    } for x in p.placements]



