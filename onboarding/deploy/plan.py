"""GPU plan per node type: weight bytes + KV cache + reserve against HBM, smallest fitting TP.

Pure arithmetic over `configs/nodes.yaml`, the model's shape (its config.json, or the catalog's
architecture hint for plan-only entries) and what was measured upstream. Every number in a plan
says where it came from: `measured` (files or a benchmark) or `estimate` (a declared parameter
count times bytes per parameter); a throughput nobody measured is `absent`, never guessed.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from onboarding.common.config import StrictConfig, load_config_file
from onboarding.common.errors import ConfigError, OnboardingError
from onboarding.common.names import is_dns1123_label
from onboarding.common.refs import CheckpointRef, VariantRef
from onboarding.fetch.catalog import PRECISION_WIDTH, ArchitectureHint, ModelSpec
from onboarding.serving.kernels import KernelRule
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult

GIB = 1 << 30
MIB = 1 << 20
Basis = Literal["measured", "estimate"]


def _cc(value: str) -> tuple[int, int]:
    major, _, minor = value.partition(".")
    return int(major), int(minor or 0)


class PrecisionFacts(StrictConfig):
    bytes_per_param: float = Field(gt=0)
    min_compute_capability: str = Field(pattern=r"^\d+\.\d+$")


class Taint(StrictConfig):
    key: str
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class NodeType(StrictConfig):
    gpu_product: str = Field(min_length=1)
    memory_mib: int = Field(gt=0)
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")
    gpus_per_node: int = Field(default=8, ge=1)
    numa_gpus: list[list[int]] | None = None
    native_precisions: list[Literal["nvfp4", "fp8", "bf16"]]
    cpu_per_gpu: int = Field(ge=1)
    host_memory_gib_per_gpu: int = Field(ge=1)
    taints: list[Taint] = Field(default_factory=list)

    @model_validator(mode="after")
    def _numa_covers_every_gpu(self) -> NodeType:
        if self.numa_gpus is not None:
            flat = sorted(g for socket in self.numa_gpus for g in socket)
            if flat != list(range(self.gpus_per_node)):
                raise ValueError(
                    f"numa_gpus must list GPUs 0..{self.gpus_per_node - 1} exactly once, got "
                    f"{self.numa_gpus}"
                )
        return self

    @property
    def arch(self) -> str:
        """`sm103` for compute capability 10.3: the key of images in stack.yaml."""
        major, minor = _cc(self.compute_capability)
        return f"sm{major}{minor}"

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    def numa_layout(self) -> list[list[int]]:
        """GPU indices per CPU socket; default: contiguous halves (0-3 and 4-7 of 8)."""
        if self.numa_gpus is not None:
            return [sorted(s) for s in self.numa_gpus]
        half = math.ceil(self.gpus_per_node / 2)
        gpus = list(range(self.gpus_per_node))
        return [s for s in (gpus[:half], gpus[half:]) if s]

    def gfd_labels(self) -> dict[str, str]:
        """The labels gpu-feature-discovery sets on such a node."""
        major, minor = _cc(self.compute_capability)
        return {
            "nvidia.com/gpu.product": self.gpu_product,
            "nvidia.com/gpu.memory": str(self.memory_mib),
            "nvidia.com/gpu.compute.major": str(major),
            "nvidia.com/gpu.compute.minor": str(minor),
        }


class Planning(StrictConfig):
    gpu_memory_utilization: float = Field(gt=0, le=1)
    max_gpu_memory_utilization: float = Field(gt=0, le=1)
    runtime_reserve_gib_per_gpu: float = Field(ge=0)
    target_concurrency: int = Field(ge=1)
    context_tokens: int = Field(ge=1)
    tensor_parallel_candidates: list[int] = Field(min_length=1)
    numa_local_max_tp: int = Field(default=4, ge=1)

    @model_validator(mode="after")
    def _sane(self) -> Planning:
        if self.gpu_memory_utilization > self.max_gpu_memory_utilization:
            raise ValueError(
                f"gpu_memory_utilization {self.gpu_memory_utilization} exceeds "
                f"max_gpu_memory_utilization {self.max_gpu_memory_utilization}"
            )
        bad = [t for t in self.tensor_parallel_candidates if t < 1 or t & (t - 1)]
        if bad:
            raise ValueError(f"tensor_parallel_candidates must be powers of two, got {bad}")
        return self


class NodesConfig(StrictConfig):
    precisions: dict[Literal["nvfp4", "fp8", "bf16"], PrecisionFacts]
    planning: Planning
    node_types: dict[str, NodeType] = Field(min_length=1)
    # which kernels a precision must run on each node type's architecture (serving/kernels.py)
    kernel_gate: list[KernelRule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> NodesConfig:
        for name, node in self.node_types.items():
            if not is_dns1123_label(name):
                raise ValueError(f"node type name {name!r} is not a DNS-1123 label")
            for p in node.native_precisions:
                if p not in self.precisions:
                    raise ValueError(f"node_types.{name}: precision {p!r} not under precisions")
                need = self.precisions[p].min_compute_capability
                if _cc(node.compute_capability) < _cc(need):
                    raise ValueError(
                        f"node_types.{name}.native_precisions lists {p}, which needs compute "
                        f"capability {need}+, but the node has {node.compute_capability}"
                    )
        seen: dict[tuple[str, str, str], int] = {}
        for i, rule in enumerate(self.kernel_gate):
            for arch in rule.archs:
                key = (rule.engine, rule.precision, arch)
                if key in seen:
                    raise ValueError(f"kernel_gate[{i}] and kernel_gate[{seen[key]}] both rule "
                                     f"{rule.precision} on {arch} for {rule.engine}: keep one")
                seen[key] = i
        return self


def load_nodes(path: Path) -> NodesConfig:
    return load_config_file(NodesConfig, path, "Fix nodes.yaml.")


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What KV-cache arithmetic, TP divisibility and the weight estimate need from a model.

    MLA models (DeepSeek-V3/R1: `kv_lora_rank`) cache one compressed latent plus the rope dims
    per layer and token instead of K and V per head. `kept_bf16_params` are the parameters
    Model Optimizer leaves unquantized (embeddings, lm_head, MoE routers: its export's
    `exclude_modules`), so a quantized estimate counts them at 2 bytes.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_attention_heads: int | None
    moe: bool
    origin: str  # where these numbers were read
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    kept_bf16_params: int = 0
    num_experts: int = 0

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None


_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def shape_from_config(config: dict[str, Any], origin: str) -> ModelShape:
    """From a Hugging Face config.json (the text model's part for multimodal configs)."""
    cfg = config.get("text_config") or config
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            origin, f"config.json lacks what the KV arithmetic needs ({exc})",
            "The checkpoint's config.json must give num_hidden_layers, num_attention_heads and "
            "hidden_size or head_dim.",
        ) from None
    experts = max((int(cfg.get(k) or 0) for k in _MOE_KEYS), default=0)
    hidden = int(cfg.get("hidden_size") or heads * head_dim)
    vocab = int(cfg.get("vocab_size") or 0)
    moe_layers = layers - int(cfg.get("first_k_dense_replace") or 0) if experts > 1 else 0
    kept = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2) \
        + moe_layers * experts * hidden
    mla = cfg.get("kv_lora_rank")
    return ModelShape(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim,
                      num_attention_heads=heads, moe=experts > 1, origin=origin,
                      kv_lora_rank=int(mla) if mla else None,
                      qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0) if mla else None,
                      kept_bf16_params=kept, num_experts=experts if experts > 1 else 0)


def shape_from_checkpoint(checkpoint_dir: Path) -> ModelShape:
    path = checkpoint_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(str(path), f"cannot be read as JSON ({exc})",
                          "Re-materialize the checkpoint asset.") from None
    return shape_from_config(config, str(path))


def shape_from_hint(hint: ArchitectureHint, origin: str) -> ModelShape:
    hidden = hint.hidden_size or 0
    moe_layers = hint.num_layers - hint.first_dense_layers if hint.num_experts else 0
    kept = (hint.vocab_size or 0) * hidden * (1 if hint.tie_word_embeddings else 2) \
        + moe_layers * (hint.num_experts or 0) * hidden
    return ModelShape(num_layers=hint.num_layers, num_kv_heads=hint.num_kv_heads,
                      head_dim=hint.head_dim, num_attention_heads=hint.num_attention_heads,
                      moe=hint.moe or bool(hint.num_experts), origin=origin,
                      kv_lora_rank=hint.kv_lora_rank, qk_rope_head_dim=hint.qk_rope_head_dim,
                      kept_bf16_params=kept, num_experts=hint.num_experts or 0)


def kv_dtype_bytes(kv_cache_dtype: str | None) -> int:
    """vLLM's --kv-cache-dtype: `auto` keeps the model dtype (bf16: 2 bytes), fp8 variants 1."""
    if kv_cache_dtype is None or kv_cache_dtype == "auto":
        return 2
    if kv_cache_dtype.startswith("fp8"):
        return 1
    if kv_cache_dtype in ("bfloat16", "float16", "half", "bf16", "fp16"):
        return 2
    raise ConfigError(
        f"engine_args.kv_cache_dtype={kv_cache_dtype!r}", "not a KV cache dtype the planner knows",
        "Use auto, fp8, fp8_e4m3, fp8_e5m2, bfloat16 or float16.",
    )


def kv_bytes_per_token_per_gpu(shape: ModelShape, tp: int, dtype_bytes: int) -> int:
    """K and V for every layer; KV heads are split over TP ranks, replicated when TP > heads.

    MLA: one latent of `kv_lora_rank` plus `qk_rope_head_dim` per layer, which every TP rank
    holds whole (the latent is shared by all heads, so TP does not split it)."""
    if shape.mla:
        return shape.num_layers * (shape.kv_lora_rank + (shape.qk_rope_head_dim or 0)) \
            * dtype_bytes
    heads_per_gpu = math.ceil(shape.num_kv_heads / tp)
    return shape.num_layers * 2 * heads_per_gpu * shape.head_dim * dtype_bytes


@dataclass(frozen=True, kw_only=True)
class Measured:
    """What upstream assets recorded for this model; None where nothing was materialized."""

    variant_precision: str | None = None
    # Precisions whose accuracy gate passed (bf16, the baseline, always may be served); None
    # when no gate ran (plan-only): the ladder is then taken as declared.
    passed_precisions: tuple[str, ...] | None = None
    variant_weight_bytes: int | None = None
    benchmark_node_type: str | None = None
    benchmark_gpus: int | None = None
    tokens_per_s_per_gpu: float | None = None
    saturation_concurrency: int | None = None
    slo_pass: bool | None = None
    cold_start_p95_s: float | None = None
    warm_start_p50_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class PlanInputs:
    model: str
    served_name: str
    shape: ModelShape
    precision_ladder: tuple[str, ...]
    param_count: float | None  # None when neither a hint nor checkpoint headers give it
    param_count_origin: str
    target_concurrency: int
    context_tokens: int
    kv_cache_dtype: str | None
    gpu_memory_utilization: float
    measured: Measured = field(default_factory=Measured)
    # the source checkpoint's precision (catalog source_precision): the baseline that needs no
    # accuracy gate, and the widest precision a plan may serve
    source_precision: str = "bf16"


@dataclass(frozen=True, kw_only=True)
class NodePlan:
    node_type: str
    feasible: bool
    reason: str
    precision: str | None
    weight_bytes: int | None
    weight_basis: Basis | None
    tensor_parallel: int | None
    gpu_ids: tuple[int, ...]
    numa_nodes: tuple[int, ...]
    budget_bytes_per_gpu: int
    weight_bytes_per_gpu: int | None
    kv_bytes_per_gpu: int | None
    reserve_bytes_per_gpu: int
    headroom_bytes_per_gpu: int | None  # negative: short by that much
    max_sequences_at_context: int | None
    tokens_per_s_per_gpu: float | None
    throughput_basis: Literal["measured", "absent"]
    rejected: tuple[str, ...] = ()
    max_num_seqs: int | None = None  # set when chosen by the SLA; else the target concurrency
    tp_basis: str = "memory: the smallest TP that fits"


@dataclass(frozen=True)
class DeploymentPlan:
    inputs: PlanInputs
    nodes: tuple[NodePlan, ...]

    def node(self, node_type: str) -> NodePlan:
        for n in self.nodes:
            if n.node_type == node_type:
                return n
        raise KeyError(node_type)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_memory_utilization(spec: ModelSpec, planning: Planning) -> float:
    value = spec.engine_args.get("gpu_memory_utilization", planning.gpu_memory_utilization)
    if not isinstance(value, int | float) or not 0 < value <= planning.max_gpu_memory_utilization:
        raise ConfigError(
            f"model {spec.id!r}: engine_args.gpu_memory_utilization={value!r}",
            f"plans may use at most {planning.max_gpu_memory_utilization} of HBM",
            "Lower it, or raise planning.max_gpu_memory_utilization in nodes.yaml with a reason.",
        )
    return float(value)


def plan_inputs(
    spec: ModelSpec, nodes: NodesConfig, shape: ModelShape, measured: Measured,
    checkpoint_param_count: int | None = None,
) -> PlanInputs:
    """Everything a plan depends on, with per-model overrides applied to nodes.yaml defaults."""
    if checkpoint_param_count is not None:
        params, origin = float(checkpoint_param_count), "checkpoint safetensors headers"
    elif spec.architecture is not None:
        params = spec.architecture.params_billion * 1e9
        origin = "catalog architecture.params_billion (declared)"
    else:
        params, origin = None, "unknown"
    planning = nodes.planning
    return PlanInputs(
        model=spec.id,
        served_name=spec.served_name,
        shape=shape,
        precision_ladder=tuple(spec.precision_ladder),
        param_count=params,
        param_count_origin=origin,
        target_concurrency=spec.slo.target_concurrency or planning.target_concurrency,
        context_tokens=int(spec.engine_args.get("max_model_len", planning.context_tokens)),
        kv_cache_dtype=spec.engine_args.get("kv_cache_dtype"),
        gpu_memory_utilization=gpu_memory_utilization(spec, planning),
        measured=measured,
        source_precision=spec.source_precision,
    )


def servable_precisions(inputs: PlanInputs, node: NodeType) -> tuple[list[str], str]:
    """The ladder's precisions the node serves natively, in the ladder's order, never above the
    one that passed the gate; the source's own precision (bf16, or fp8 for an FP8 release) needs
    no gate, and none wider than it has weights. With none, why."""
    width = PRECISION_WIDTH[inputs.source_precision]
    ladder = [p for p in inputs.precision_ladder if PRECISION_WIDTH[p] <= width]
    m = inputs.measured
    if m.variant_precision is not None and m.variant_precision in ladder:
        ladder = ladder[ladder.index(m.variant_precision):]
    if m.passed_precisions is not None:
        failed = [p for p in ladder
                  if p != inputs.source_precision and p not in m.passed_precisions]
        ladder = [p for p in ladder if p not in failed]
    else:
        failed = []
    native = [p for p in ladder if p in node.native_precisions]
    if native:
        return native, ""
    gate = f"; {', '.join(failed)} failed the accuracy gate" if failed else ""
    return [], (f"no precision in {ladder} is native here (native: "
                f"{', '.join(node.native_precisions)}){gate}")


def _precision_for(inputs: PlanInputs, node: NodeType) -> tuple[str | None, str]:
    """The first servable precision (`servable_precisions`), or why there is none."""
    native, why = servable_precisions(inputs, node)
    return (native[0], "") if native else (None, why)


def _weights(inputs: PlanInputs, precision: str, nodes: NodesConfig) -> tuple[int | None, Basis]:
    m = inputs.measured
    if m.variant_precision == precision and m.variant_weight_bytes:
        return m.variant_weight_bytes, "measured"
    if inputs.param_count is None:
        return None, "estimate"
    return estimate_weight_bytes(inputs.param_count, inputs.shape, precision, nodes), "estimate"


def estimate_weight_bytes(params: float, shape: ModelShape, precision: str,
                          nodes: NodesConfig) -> int:
    """Parameters x bytes per parameter, with what quantization keeps in bf16 at 2 bytes."""
    bpp = nodes.precisions[precision].bytes_per_param
    kept = min(shape.kept_bf16_params, int(params)) if precision != "bf16" else 0
    return round((params - kept) * bpp + kept * nodes.precisions["bf16"].bytes_per_param)


def _gpu_ids(node: NodeType, tp: int, numa_local_max_tp: int) -> tuple[tuple[int, ...], str]:
    """GPUs for a TP group: within one socket for TP <= numa_local_max_tp, else the first TP."""
    layout = node.numa_layout()
    if tp <= numa_local_max_tp:
        for socket in layout:
            if len(socket) >= tp:
                return tuple(socket[:tp]), ""
        return (), (f"TP {tp} would cross NUMA nodes (at most {max(map(len, layout))} GPUs per "
                    "socket)")
    return tuple(range(tp)), ""


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _node_base(inputs: PlanInputs, name: str, node: NodeType, nodes: NodesConfig
               ) -> dict[str, Any]:
    """A node plan's fields that do not depend on the precision or TP."""
    m = inputs.measured
    measured_here = m.benchmark_node_type == name and m.tokens_per_s_per_gpu is not None
    return {
        "node_type": name,
        "budget_bytes_per_gpu": int(node.memory_bytes * inputs.gpu_memory_utilization),
        "reserve_bytes_per_gpu": int(nodes.planning.runtime_reserve_gib_per_gpu * GIB),
        "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu if measured_here else None,
        "throughput_basis": "measured" if measured_here else "absent",
    }


def plan_node(inputs: PlanInputs, name: str, node: NodeType, nodes: NodesConfig) -> NodePlan:
    base = _node_base(inputs, name, node, nodes)
    precision, why = _precision_for(inputs, node)
    if precision is None:
        return NodePlan(feasible=False, reason=why, precision=None, weight_bytes=None,
                        weight_basis=None, tensor_parallel=None, gpu_ids=(), numa_nodes=(),
                        weight_bytes_per_gpu=None, kv_bytes_per_gpu=None,
                        headroom_bytes_per_gpu=None, max_sequences_at_context=None, **base)
    return _fit(inputs, name, node, nodes, precision,
                nodes.planning.tensor_parallel_candidates, base)


def plan_node_at(inputs: PlanInputs, name: str, node: NodeType, nodes: NodesConfig,
                 precision: str, tensor_parallel: int) -> NodePlan:
    """The node's plan at this precision and exactly this TP (the configuration search's other
    starting points), feasible or not, with why; the precision must be servable there."""
    servable, why = servable_precisions(inputs, node)
    if precision not in servable:
        raise ValueError(f"{precision} is not servable on {name}: servable {servable} {why}")
    base = _node_base(inputs, name, node, nodes)
    return _fit(inputs, name, node, nodes, precision, [tensor_parallel], base)


def _fit(inputs: PlanInputs, name: str, node: NodeType, nodes: NodesConfig, precision: str,
         tensor_parallel: list[int], base: dict[str, Any]) -> NodePlan:
    """The smallest of these TPs at which the weights, the KV budget and the reserve fit."""
    planning = nodes.planning
    budget, reserve = base["budget_bytes_per_gpu"], base["reserve_bytes_per_gpu"]
    weight_bytes, basis = _weights(inputs, precision, nodes)
    if weight_bytes is None:
        return NodePlan(feasible=False, reason=f"no weight size for {precision}: neither exported "
                        "files nor a parameter count (add architecture.params_billion)",
                        precision=precision, weight_bytes=None, weight_basis=None,
                        tensor_parallel=None, gpu_ids=(), numa_nodes=(),
                        weight_bytes_per_gpu=None, kv_bytes_per_gpu=None,
                        headroom_bytes_per_gpu=None, max_sequences_at_context=None, **base)
    dtype = kv_dtype_bytes(inputs.kv_cache_dtype)
    tokens = inputs.target_concurrency * inputs.context_tokens
    shape = inputs.shape
    rejected: list[str] = []
    last: dict[str, Any] | None = None
    for tp in sorted(t for t in tensor_parallel if t <= node.gpus_per_node):
        if shape.num_attention_heads and shape.num_attention_heads % tp:
            rejected.append(f"TP {tp}: {shape.num_attention_heads} attention heads do not split "
                            f"over {tp} GPUs")
            continue
        if shape.num_kv_heads % tp and tp % shape.num_kv_heads:
            rejected.append(f"TP {tp}: {shape.num_kv_heads} KV heads neither split over nor "
                            f"replicate evenly onto {tp} GPUs")
            continue
        gpu_ids, numa_why = _gpu_ids(node, tp, planning.numa_local_max_tp)
        if numa_why:
            rejected.append(f"TP {tp}: {numa_why}")
            continue
        per_token = kv_bytes_per_token_per_gpu(shape, tp, dtype)
        w = math.ceil(weight_bytes / tp)
        kv = tokens * per_token
        headroom = budget - (w + kv + reserve)
        seqs = max(0, (budget - w - reserve) // (per_token * inputs.context_tokens))
        layout = node.numa_layout()
        numa = tuple(i for i, s in enumerate(layout) if set(s) & set(gpu_ids))
        last = {"tensor_parallel": tp, "gpu_ids": gpu_ids, "numa_nodes": numa,
                "weight_bytes_per_gpu": w, "kv_bytes_per_gpu": kv,
                "headroom_bytes_per_gpu": headroom, "max_sequences_at_context": int(seqs)}
        if headroom >= 0:
            reason = (f"TP {tp} fits: weights {_gib(w)} + KV {_gib(kv)} "
                      f"({inputs.target_concurrency} x {inputs.context_tokens} tokens) + reserve "
                      f"{_gib(reserve)} within {_gib(budget)} per GPU "
                      f"({inputs.gpu_memory_utilization:.2f} of {_gib(node.memory_bytes)})")
            return NodePlan(feasible=True, reason=reason, precision=precision,
                            weight_bytes=weight_bytes, weight_basis=basis,
                            rejected=tuple(rejected), **last, **base)
        rejected.append(f"TP {tp}: needs {_gib(w + kv + reserve)} per GPU (weights {_gib(w)} + "
                        f"KV {_gib(kv)} + reserve {_gib(reserve)}), budget {_gib(budget)}: short "
                        f"by {_gib(-headroom)}")
    reason = (rejected[-1] if rejected else "no tensor-parallel candidate fits this node")
    reason = f"infeasible on {name} at {precision}: {reason}"
    if last is None:
        last = {"tensor_parallel": None, "gpu_ids": (), "numa_nodes": (),
                "weight_bytes_per_gpu": None, "kv_bytes_per_gpu": None,
                "headroom_bytes_per_gpu": None, "max_sequences_at_context": None}
    return NodePlan(feasible=False, reason=reason, precision=precision, weight_bytes=weight_bytes,
                    weight_basis=basis, rejected=tuple(rejected), **last, **base)


def plan(inputs: PlanInputs, nodes: NodesConfig) -> DeploymentPlan:
    return DeploymentPlan(inputs, tuple(plan_node(inputs, n, t, nodes)
                                        for n, t in nodes.node_types.items()))


def plan_rows(p: DeploymentPlan) -> list[dict[str, Any]]:
    """One row per node type, for a metadata table."""
    rows = []
    for n in p.nodes:
        rows.append({
            "node_type": n.node_type,
            "feasible": n.feasible,
            "precision": n.precision or "-",
            "tp": n.tensor_parallel or 0,
            "weights_gib": round(n.weight_bytes / GIB, 2) if n.weight_bytes else 0.0,
            "weights_basis": n.weight_basis or "-",
            "kv_gib_per_gpu": round(n.kv_bytes_per_gpu / GIB, 2) if n.kv_bytes_per_gpu else 0.0,
            "headroom_gib_per_gpu": (round(n.headroom_bytes_per_gpu / GIB, 2)
                                     if n.headroom_bytes_per_gpu is not None else 0.0),
            "max_seqs_at_context": n.max_sequences_at_context or 0,
            "tokens_per_s_per_gpu": n.tokens_per_s_per_gpu,
            "throughput": n.throughput_basis,
            "reason": n.reason,
        })
    return rows


def measured_from_results(variant: VariantRef | None, timing: LoadTimingResult | None,
                          bench: ServingBenchmarkResult | None,
                          passed_precisions: tuple[str, ...] | None = None) -> Measured:
    """What upstream assets stored for this model (each None when never materialized).

    Absent results stay None: they are reported as absent, never filled in. A benchmark that
    measured nothing (an unservable variant with no stand-in) reports no throughput.
    """
    measured_bench = bench is not None and bench.tokens_per_s_per_gpu > 0
    return Measured(
        passed_precisions=passed_precisions,
        variant_precision=variant.precision if variant else None,
        variant_weight_bytes=(variant.weight_bytes or None) if variant else None,
        benchmark_node_type=bench.node_type if bench else None,
        benchmark_gpus=bench.gpus if bench else None,
        tokens_per_s_per_gpu=bench.tokens_per_s_per_gpu if measured_bench else None,
        saturation_concurrency=bench.saturation_concurrency if measured_bench else None,
        slo_pass=bench.slo_pass if bench else None,
        cold_start_p95_s=timing.cold_start_p95_s if timing else None,
        warm_start_p50_s=timing.warm_start_p50_s if timing else None,
    )


def param_count_from_safetensors(checkpoint_dir: Path) -> int | None:
    """Exact parameter count from the safetensors headers (no tensor data is read)."""
    from onboarding.fetch.checkpoint_manifest import read_safetensors_header

    files = sorted(checkpoint_dir.rglob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        for name, info in read_safetensors_header(f).items():
            if name != "__metadata__":
                total += math.prod(info.get("shape") or [1])
    return total


def fetched_checkpoint_dir(checkpoint: CheckpointRef | None) -> Path | None:
    """The checkpoint's directory when it was fetched with its config.json, else None."""
    if checkpoint is not None and (Path(checkpoint.path) / "config.json").is_file():
        return Path(checkpoint.path)
    return None


def build_plan(spec: ModelSpec, nodes: NodesConfig, checkpoint: CheckpointRef | None,
               variant: VariantRef | None, passed: tuple[str, ...] | None = None
               ) -> DeploymentPlan:
    """The model's plan, its shape from its checkpoint when fetched, else from the catalog's hint.

    A performance twin has no gate to climb and no weights to measure: every node type gets the
    first precision of the ladder it serves natively, sized from the declared parameters."""
    if spec.is_twin:
        variant, passed = None, None
    ckpt = fetched_checkpoint_dir(checkpoint)
    if ckpt is not None:
        shape, params = shape_from_checkpoint(ckpt), param_count_from_safetensors(ckpt)
    elif spec.architecture is not None:
        shape = shape_from_hint(spec.architecture, f"catalog {spec.id}: architecture (declared)")
        params = None
    else:
        raise OnboardingError(
            f"serving configuration of {spec.id!r}",
            "no checkpoint materialization with a config.json and no architecture hint",
            "Materialize `checkpoint` for this partition first, or add `architecture:` to the "
            "catalog entry (required for plan_only models).",
        )
    measured = measured_from_results(variant, None, None, passed)
    return plan(plan_inputs(spec, nodes, shape, measured, params), nodes)
