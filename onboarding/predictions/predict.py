"""Predicted serving performance for node types not at hand, corrected by our own measurements.

NVIDIA's AIConfigurator estimates TTFT, TPOT and tokens/s/GPU from measured kernel data per GPU
and engine version (resources/predictor.py runs it). This module is the pure part around it:

- what to ask (`PredictionRequest`: a model's config.json, or the catalog's architecture hint
  turned into one, on a system, at a precision, TP/EP, batch and input/output length) and how to
  read the answer's coverage (`classify_coverage`): a mode its data set lacks is "not covered",
  a result in its own right, never a guess;
- the calibration: measured H200 points (a JSON file, `load_points`) paired with the predictions
  for the same configuration, a correction factor k = geometric mean of measured/predicted and
  its spread per metric, and corrected predictions that carry where they came from;
- the SLA-bound plan: `choose_by_sla` picks TP and --max-num-seqs for a node type by the
  predicted SLOs, with plan.py's memory arithmetic as a hard constraint.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from onboarding.common.config import StrictConfig, load_config_file, validate_config
from onboarding.common.errors import ConfigError
from onboarding.common.tables import md_table
from onboarding.deploy.plan import NodePlan, NodesConfig, PlanInputs, plan_node
from onboarding.fetch.catalog import ArchitectureHint, ModelSpec, Precision
from onboarding.serving.stats import PointStats, Slo, parse_error_causes

Status = Literal["covered", "fallback", "not_covered", "oom", "not_applicable"]
METRICS = ("ttft_p50_ms", "ttft_p95_ms", "tpot_ms", "tokens_per_s_per_gpu")
POINTS_FORMAT = "onboarding-measured-points/1"

# Ops whose time AIConfigurator should read from measured tables; elementwise ops (norms,
# activations, embedding) are always modelled by formula ("empirical") and are not a fallback.
_KEY_OP = re.compile(r"gemm|attention|moe|_ar(_|$)|p2p|dispatch|allreduce|all2all|alltoall")
_MEASURED_SOURCES = ("silicon", "mixed")


# ---- configs/predict.yaml ----

class EngineChoice(StrictConfig):
    # AIConfigurator's name for the engine whose data set it reads (its vocabulary, not this
    # project's engine templates); configs/predict.yaml names it, AIConfigurator refuses one it
    # has no data for.
    backend: str = Field(min_length=1)
    version: str = ""  # "" = the data set's current version for each system


class QuantModes(StrictConfig):
    gemm: str = Field(min_length=1)
    moe: str = Field(min_length=1)


class Scenario(StrictConfig):
    input_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1)


class CalibrationSource(StrictConfig):
    points: str = Field(min_length=1)
    node_type: str = Field(min_length=1)


class PredictConfig(StrictConfig):
    engine: EngineChoice
    systems: dict[str, str] = Field(min_length=1)
    node_types: list[str] = Field(min_length=1)
    precisions: dict[Precision, QuantModes]
    sla_scenario: Scenario
    max_num_seqs_candidates: list[int] = Field(min_length=1)
    calibration: CalibrationSource
    # Node types not at hand whose serving configuration takes TP and --max-num-seqs from the
    # SLA choice (when the `predictions` asset has one covered by the data) instead of the
    # smallest TP that fits memory; the memory rule stays a hard constraint.
    plan_node_types: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> PredictConfig:
        unknown = [n for n in [*self.node_types, self.calibration.node_type]
                   if n not in self.systems]
        if unknown:
            raise ValueError(f"node types {unknown} have no AIConfigurator system under systems")
        if any(c < 1 for c in self.max_num_seqs_candidates):
            raise ValueError("max_num_seqs_candidates must be positive")
        return self


def load_predict_config(path: Path) -> PredictConfig:
    return load_config_file(PredictConfig, path, "Fix predict.yaml.")


# ---- what to ask ----

def config_from_hint(hint: ArchitectureHint, max_model_len: int | None = None) -> dict[str, Any]:
    """The config.json fields a performance model reads, from the catalog's architecture hint.

    Raises ConfigError naming the hint fields that are missing (a guess would be a wrong model).
    """
    need = ["hf_architecture", "intermediate_size"]
    if hint.num_experts:
        need += ["moe_intermediate_size", "num_experts_per_tok"]
    if hint.hidden_size is None:
        need.append("hidden_size")
    if hint.vocab_size is None:
        need.append("vocab_size")
    if hint.num_attention_heads is None:
        need.append("num_attention_heads")
    missing = [n for n in need if getattr(hint, n) is None]
    if missing:
        raise ConfigError(
            "catalog architecture hint", f"lacks {', '.join(missing)}, which the performance "
            "model needs", "Add them under `architecture:` from the model's config.json.")
    cfg: dict[str, Any] = {
        "architectures": [hint.hf_architecture],
        "num_hidden_layers": hint.num_layers,
        "hidden_size": hint.hidden_size,
        "num_attention_heads": hint.num_attention_heads,
        "num_key_value_heads": hint.num_kv_heads,
        "head_dim": hint.head_dim,
        "intermediate_size": hint.intermediate_size,
        "vocab_size": hint.vocab_size,
        "max_position_embeddings": hint.max_position_embeddings or max_model_len or 8192,
        "tie_word_embeddings": hint.tie_word_embeddings,
        "torch_dtype": "bfloat16",
    }
    if hint.num_experts:
        cfg.update(num_experts=hint.num_experts, num_experts_per_tok=hint.num_experts_per_tok,
                   moe_intermediate_size=hint.moe_intermediate_size)
    if hint.first_dense_layers:
        cfg["first_k_dense_replace"] = hint.first_dense_layers
    if hint.kv_lora_rank:
        cfg.update(kv_lora_rank=hint.kv_lora_rank, qk_rope_head_dim=hint.qk_rope_head_dim)
    return cfg


def kv_cache_mode(kv_cache_dtype: str | None) -> str:
    """vLLM's --kv-cache-dtype as AIConfigurator's KV mode: auto keeps bf16, fp8* is fp8."""
    return "fp8" if kv_cache_dtype and kv_cache_dtype.startswith("fp8") else "bfloat16"


def is_moe(model_config: dict[str, Any]) -> bool:
    cfg = model_config.get("text_config") or model_config
    return any(int(cfg.get(k) or 0) > 1 for k in
               ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"))


@dataclass(frozen=True, kw_only=True)
class PredictionRequest:
    """One configuration to predict; `model_config` is the config.json the library reads."""

    model: str
    node_type: str
    system: str  # AIConfigurator's name, e.g. b300_sxm
    backend: str
    backend_version: str  # "" = the data set's current one
    precision: str
    gemm_mode: str
    moe_mode: str
    kv_cache_mode: str
    tensor_parallel: int
    expert_parallel: int  # 1: experts split by TP; = TP: --enable-expert-parallel
    batch_size: int
    input_tokens: int
    output_tokens: int
    model_config: dict[str, Any] = field(compare=False, repr=False)

    @property
    def config_digest(self) -> str:
        blob = json.dumps(self.model_config, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def moe(self) -> bool:
        return is_moe(self.model_config)


def make_request(cfg: PredictConfig, model: str, model_config: dict[str, Any], node_type: str,
                 precision: str, tensor_parallel: int, batch_size: int,
                 kv_cache_dtype: str | None = None, expert_parallel: bool = False,
                 input_tokens: int | None = None, output_tokens: int | None = None
                 ) -> PredictionRequest:
    """A request under predict.yaml's engine, system names and quantization modes."""
    if node_type not in cfg.systems:
        raise ConfigError("predict.yaml systems", f"no AIConfigurator system for node type "
                          f"{node_type!r}", "Add it under systems (e.g. b300: b300_sxm).")
    if precision not in cfg.precisions:
        raise ConfigError("predict.yaml precisions", f"no quantization modes for {precision!r}",
                          "Add it under precisions.")
    modes = cfg.precisions[precision]  # type: ignore[index]
    return PredictionRequest(
        model=model, node_type=node_type, system=cfg.systems[node_type],
        backend=cfg.engine.backend, backend_version=cfg.engine.version, precision=precision,
        gemm_mode=modes.gemm, moe_mode=modes.moe, kv_cache_mode=kv_cache_mode(kv_cache_dtype),
        tensor_parallel=tensor_parallel,
        expert_parallel=tensor_parallel if expert_parallel and is_moe(model_config) else 1,
        batch_size=batch_size, input_tokens=input_tokens or cfg.sla_scenario.input_tokens,
        output_tokens=output_tokens or cfg.sla_scenario.output_tokens, model_config=model_config)


# ---- what came back ----

@dataclass(frozen=True, kw_only=True)
class Prediction:
    """AIConfigurator's answer for one request; numbers are None unless covered."""

    request: PredictionRequest
    status: Status
    aic_version: str
    data_set: str  # e.g. "b300_sxm/vllm/0.24.0"
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    tokens_per_s_per_gpu: float | None = None
    memory_gib: float | None = None
    silicon_share: float | None = None  # of the predicted step time, from measured tables
    executed_modes: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def covered(self) -> bool:
        return self.status in ("covered", "fallback")

    def value(self, metric: str) -> float | None:
        if metric in ("ttft_p50_ms", "ttft_p95_ms"):
            return self.ttft_ms
        return getattr(self, metric)

    def row(self) -> dict[str, Any]:
        r = self.request
        return {"node_type": r.node_type, "precision": r.precision, "tp": r.tensor_parallel,
                "ep": r.expert_parallel, "batch": r.batch_size, "status": self.status,
                "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "memory_gib": self.memory_gib, "data_set": self.data_set,
                "notes": "; ".join(self.notes)}


def prediction_to_dict(p: Prediction) -> dict[str, Any]:
    """A prediction as JSON-able data (recorded library outputs for tests and reports)."""
    out = asdict(p)
    out["notes"] = list(p.notes)
    return out


def prediction_from_dict(data: dict[str, Any]) -> Prediction:
    fields = dict(data)
    request = PredictionRequest(**fields.pop("request"))
    return Prediction(request=request, notes=tuple(fields.pop("notes", ())), **fields)


def classify_coverage(request: PredictionRequest, executed: dict[str, str],
                      sources: dict[str, dict[str, str]],
                      latency_ms: dict[str, dict[str, float]]
                      ) -> tuple[Status, tuple[str, ...], float | None]:
    """covered, or fallback with the reasons, from the per-op data sources the library reports.

    A fallback is a mode run in place of the one asked for (NVFP4 modelled as weight-only), or a
    GEMM/attention/MoE/communication op timed by formula instead of measured tables.
    """
    notes: list[str] = []
    asked = {"gemm": request.gemm_mode, "kvcache": request.kv_cache_mode}
    if request.moe:
        asked["moe"] = request.moe_mode
    for kind, mode in asked.items():
        ran = executed.get(kind)
        if ran is not None and ran != mode:
            notes.append(f"{kind} asked {mode}, modelled as {ran}")
    total = measured = 0.0
    formula_ops: list[str] = []
    for phase, ops in sources.items():
        for op, source in ops.items():
            ms = float((latency_ms.get(phase) or {}).get(op) or 0.0)
            total += ms
            if source == "silicon":
                measured += ms
            elif source not in _MEASURED_SOURCES:
                if _KEY_OP.search(op) and ms > 0:
                    notes.append(f"{phase}.{op} by {source}, not measured data")
                else:
                    formula_ops.append(op)
    status: Status = "fallback" if notes else "covered"
    share = measured / total if total > 0 else None
    if formula_ops and share is not None:
        notes.append(f"{len(set(formula_ops))} elementwise ops (norms, activations, embedding) "
                     f"by formula; {share:.0%} of the step time from measured tables")
    return status, tuple(notes), share


# ---- measured points (the JSON format) ----

class MeasuredPoint(StrictConfig):
    """One serving point measured on a GPU: what a ServingBenchmarkResult's sweep records."""

    model: str = Field(min_length=1)
    config: str = Field(min_length=1, description="key under the file's model_configs")
    precision: Precision
    node_type: str = Field(min_length=1)
    tensor_parallel: int = Field(ge=1)
    expert_parallel: int = Field(default=1, ge=1)
    scenario: str = Field(min_length=1)
    input_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1)
    concurrency: int = Field(ge=1)
    gpus: int = Field(ge=1)
    kv_cache_dtype: str | None = None
    ttft_p50_ms: float | None = Field(default=None, gt=0)
    ttft_p95_ms: float | None = Field(default=None, gt=0)
    tpot_mean_ms: float | None = Field(default=None, gt=0)
    itl_mean_ms: float | None = Field(default=None, gt=0)
    output_tokens_per_s: float | None = Field(
        gt=0, description="null where the client's count is known to be short")
    engine: str = Field(min_length=1, description="engine and version, '<engine> <version>'")
    measured_on: str = ""
    source: str = Field(min_length=1, description="the run or document it comes from")

    @property
    def key(self) -> str:
        return (f"{self.model} {self.precision} TP{self.tensor_parallel} {self.scenario} "
                f"c{self.concurrency}")

    def measured(self, metric: str) -> tuple[float | None, str]:
        """The measured value of a calibration metric and the statistic it is."""
        if metric == "ttft_p50_ms":
            return self.ttft_p50_ms, "p50"
        if metric == "ttft_p95_ms":
            return self.ttft_p95_ms, "p95"
        if metric == "tpot_ms":
            if self.tpot_mean_ms is not None:
                return self.tpot_mean_ms, "mean TPOT"
            return self.itl_mean_ms, "mean ITL"
        if metric == "tokens_per_s_per_gpu":
            if self.output_tokens_per_s is None:
                return None, "output tokens/s / GPUs"
            return self.output_tokens_per_s / self.gpus, "output tokens/s / GPUs"
        raise KeyError(metric)


class PointsFile(StrictConfig):
    format: Literal["onboarding-measured-points/1"]
    description: str = ""
    model_configs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    points: list[MeasuredPoint] = Field(default_factory=list)

    @model_validator(mode="after")
    def _configs_present(self) -> PointsFile:
        for i, p in enumerate(self.points):
            if p.config not in self.model_configs:
                raise ValueError(f"points.{i}.config {p.config!r} is not under model_configs "
                                 f"(known: {', '.join(sorted(self.model_configs)) or 'none'})")
        return self


def load_points(path: Path) -> PointsFile:
    """The recorded measured points; errors name the file and the field."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(str(path), f"cannot be read ({exc.strerror})",
                          "Check calibration.points in predict.yaml.") from None
    except ValueError as exc:
        raise ConfigError(str(path), f"is not JSON ({exc})", "Fix the file.") from None
    return validate_config(PointsFile, data, path, path,
                           f"Fix the file (format {POINTS_FORMAT}, docs/predictions.md).")


def point_from_stats(model: str, config: str, precision: str, node_type: str,
                     tensor_parallel: int, scenario: str, input_tokens: int, output_tokens: int,
                     concurrency: int, gpus: int, stats: PointStats, engine: str, source: str,
                     measured_on: str = "", kv_cache_dtype: str | None = None) -> MeasuredPoint:
    """A measured point from one load point of the serving benchmark (seconds -> ms)."""
    return MeasuredPoint(
        model=model, config=config, precision=precision, node_type=node_type,
        tensor_parallel=tensor_parallel, scenario=scenario, input_tokens=input_tokens,
        output_tokens=output_tokens, concurrency=concurrency, gpus=gpus,
        kv_cache_dtype=kv_cache_dtype, ttft_p50_ms=stats.ttft_s.p50 * 1e3,
        ttft_p95_ms=stats.ttft_s.p95 * 1e3, tpot_mean_ms=stats.tpot_ms.mean,
        itl_mean_ms=stats.itl_ms.mean, output_tokens_per_s=stats.output_tokens_per_s,
        engine=engine, measured_on=measured_on, source=source)


def point_request(cfg: PredictConfig, points: PointsFile, point: MeasuredPoint
                  ) -> PredictionRequest:
    """The prediction request for exactly the configuration a point measured."""
    return make_request(cfg, point.model, points.model_configs[point.config], point.node_type,
                        point.precision, point.tensor_parallel, point.concurrency,
                        kv_cache_dtype=point.kv_cache_dtype,
                        expert_parallel=point.expert_parallel > 1,
                        input_tokens=point.input_tokens, output_tokens=point.output_tokens)


# ---- calibration ----

@dataclass(frozen=True)
class CalibrationPair:
    point: str  # MeasuredPoint.key
    metric: str
    predicted: float
    measured: float
    stat: str

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted


def pair_points(points: Sequence[MeasuredPoint], predictions: Sequence[Prediction]
                ) -> tuple[list[CalibrationPair], list[str]]:
    """(predicted, measured) per point and metric; points the prediction does not cover are
    listed with the reason, never paired."""
    if len(points) != len(predictions):
        raise ValueError(f"{len(points)} points but {len(predictions)} predictions")
    pairs: list[CalibrationPair] = []
    skipped: list[str] = []
    for point, pred in zip(points, predictions, strict=True):
        if not pred.covered:
            skipped.append(f"{point.key}: {pred.status} ({'; '.join(pred.notes)})")
            continue
        for metric in METRICS:
            measured, stat = point.measured(metric)
            predicted = pred.value(metric)
            if measured is not None and predicted:
                pairs.append(CalibrationPair(point.key, metric, float(predicted),
                                             float(measured), stat))
    return pairs, skipped


@dataclass(frozen=True, kw_only=True)
class MetricCalibration:
    """measured/predicted over n points: k is their geometric mean; `spread` the geometric
    standard deviation minus one (0.2: a typical point lies within x/÷1.2 of k)."""

    metric: str
    n: int
    k: float | None
    spread: float | None
    ratio_min: float | None
    ratio_max: float | None
    stats: tuple[str, ...] = ()

    def phrase(self) -> str:
        if not self.n or self.k is None:
            return "not corrected (no measured point yet)"
        spread = (f"spread ±{self.spread:.0%}" if self.spread is not None
                  else "spread unknown")
        return f"measured/predicted ×{self.k:.2f}, {spread} over {self.n} point" \
            + ("s" if self.n != 1 else "")


def calibrate_metric(metric: str, pairs: Iterable[CalibrationPair]) -> MetricCalibration:
    ratios = [p.ratio for p in pairs if p.metric == metric]
    stats = tuple(sorted({p.stat for p in pairs if p.metric == metric}))
    if not ratios:
        return MetricCalibration(metric=metric, n=0, k=None, spread=None, ratio_min=None,
                                 ratio_max=None, stats=stats)
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / len(logs)
    spread = None
    if len(logs) >= 2:
        var = sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)
        spread = math.exp(math.sqrt(var)) - 1
    return MetricCalibration(metric=metric, n=len(ratios), k=math.exp(mean), spread=spread,
                             ratio_min=min(ratios), ratio_max=max(ratios), stats=stats)


@dataclass(frozen=True)
class Calibration:
    """The correction per metric from one node type's measured points."""

    node_type: str
    aic_version: str
    data_set: str
    metrics: dict[str, MetricCalibration]
    pairs: tuple[CalibrationPair, ...] = ()
    skipped: tuple[str, ...] = ()

    @property
    def points(self) -> int:
        return len({p.point for p in self.pairs})

    def of(self, metric: str) -> MetricCalibration:
        return self.metrics.get(metric) or MetricCalibration(metric=metric, n=0, k=None,
                                                             spread=None, ratio_min=None,
                                                             ratio_max=None)

    def rows(self) -> list[dict[str, Any]]:
        return [{"metric": m.metric, "n": m.n, "k_measured_over_predicted": m.k,
                 "spread": m.spread, "ratio_min": m.ratio_min, "ratio_max": m.ratio_max,
                 "measured_stat": ", ".join(m.stats)} for m in self.metrics.values()]

    def pair_rows(self) -> list[dict[str, Any]]:
        return [{"point": p.point, "metric": p.metric, "predicted": p.predicted,
                 "measured": p.measured, "ratio": p.ratio, "stat": p.stat}
                for p in self.pairs]


def calibrate(node_type: str, pairs: Sequence[CalibrationPair], aic_version: str,
              data_set: str, skipped: Sequence[str] = ()) -> Calibration:
    return Calibration(node_type, aic_version, data_set,
                       {m: calibrate_metric(m, pairs) for m in METRICS}, tuple(pairs),
                       tuple(skipped))


def pending_calibration(node_type: str, aic_version: str = "", data_set: str = ""
                        ) -> Calibration:
    """No measured point yet: every metric uncorrected, and saying so."""
    return calibrate(node_type, [], aic_version, data_set)


# ---- corrected predictions and their verdicts ----

@dataclass(frozen=True)
class CorrectedPrediction:
    prediction: Prediction
    ttft_ms: float | None  # the TTFT the SLO is judged on (p95 calibration, else p50's)
    ttft_stat: str  # which calibration produced it: "p95", "p50" or "uncorrected"
    tpot_ms: float | None
    tokens_per_s_per_gpu: float | None
    basis: str  # the sentence every number carries

    @property
    def covered(self) -> bool:
        return self.prediction.covered


def _data_set_words(prediction: Prediction) -> str:
    system, _, rest = prediction.data_set.partition("/")
    backend, _, version = rest.partition("/")
    return f"its {system} {backend} {version} data".replace("  ", " ").strip()


def correct(prediction: Prediction, calibration: Calibration | None) -> CorrectedPrediction:
    """Predicted values times k per metric, with the sentence that says how they were made."""
    head = (f"predicted by AIConfigurator {prediction.aic_version} from "
            f"{_data_set_words(prediction)}")
    if prediction.status == "not_applicable":
        return CorrectedPrediction(prediction, None, "uncorrected", None, None,
                                   f"not applicable: {'; '.join(prediction.notes)}")
    if not prediction.covered:
        return CorrectedPrediction(prediction, None, "uncorrected", None, None,
                                   f"not covered by AIConfigurator {prediction.aic_version} "
                                   f"({prediction.data_set}): {'; '.join(prediction.notes)}")
    if calibration is None:
        return CorrectedPrediction(prediction, prediction.ttft_ms, "uncorrected",
                                   prediction.tpot_ms, prediction.tokens_per_s_per_gpu,
                                   f"{head}, uncorrected: no calibration given")
    cal = calibration
    p95, p50 = cal.of("ttft_p95_ms"), cal.of("ttft_p50_ms")
    ttft_cal, ttft_stat = (p95, "p95") if p95.k else (p50, "p50") if p50.k else (p95,
                                                                                 "uncorrected")

    def times(value: float | None, m: MetricCalibration) -> float | None:
        return value * m.k if value is not None and m.k else value

    tpot, tput = cal.of("tpot_ms"), cal.of("tokens_per_s_per_gpu")
    ttft_from = f"from {ttft_stat} " if ttft_stat != "uncorrected" else ""
    parts = [f"TTFT {ttft_from}{ttft_cal.phrase()}", f"TPOT {tpot.phrase()}",
             f"tokens/s {tput.phrase()}"]
    basis = f"{head}, corrected by the {cal.node_type.upper()} calibration ({'; '.join(parts)})"
    if not any(m.k for m in (ttft_cal, tpot, tput)):
        basis = (f"{head}, uncorrected: the {cal.node_type.upper()} calibration has no measured "
                 "point yet")
    return CorrectedPrediction(prediction, times(prediction.ttft_ms, ttft_cal), ttft_stat,
                               times(prediction.tpot_ms, tpot),
                               times(prediction.tokens_per_s_per_gpu, tput), basis)


def slo_verdict(p: CorrectedPrediction, slo: Slo) -> tuple[bool | None, str]:
    """Whether the corrected prediction meets the SLO; None when nothing was predicted."""
    if not p.covered or p.ttft_ms is None or p.tpot_ms is None:
        return None, "not covered"
    why = []
    if p.ttft_ms / 1e3 > slo.ttft_p95_s:
        why.append(f"TTFT {p.ttft_ms / 1e3:.2f} s > {slo.ttft_p95_s} s")
    if p.tpot_ms > slo.itl_mean_ms:
        why.append(f"TPOT {p.tpot_ms:.1f} ms > {slo.itl_mean_ms} ms")
    caveat = (" (TTFT judged on a p50 calibration: no p95 measured yet)"
              if p.ttft_stat == "p50" else "")
    return (not why), ("; ".join(why) or "meets the SLO") + caveat


# ---- the SLA-bound plan ----

PredictFn = Callable[[int, int], Prediction]  # (tensor_parallel, batch_size) -> prediction


@dataclass(frozen=True, kw_only=True)
class SlaChoice:
    """TP and --max-num-seqs for one node type, chosen by the predicted SLOs within memory."""

    node_type: str
    precision: str | None
    tensor_parallel: int | None
    max_num_seqs: int | None
    basis: Literal["sla", "memory"]  # memory: no prediction covered it, plan.py's rule alone
    sla_pass: bool | None
    reason: str
    node_plan: NodePlan | None  # plan.py's arithmetic at the chosen TP
    prediction: CorrectedPrediction | None
    considered: tuple[str, ...] = ()

    def row(self) -> dict[str, Any]:
        p = self.prediction
        return {"node_type": self.node_type, "precision": self.precision or "-",
                "tp": self.tensor_parallel, "max_num_seqs": self.max_num_seqs,
                "basis": self.basis, "sla_pass": self.sla_pass,
                "ttft_ms": p.ttft_ms if p else None, "tpot_ms": p.tpot_ms if p else None,
                "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu if p else None,
                "reason": self.reason}


def _with_tp(nodes: NodesConfig, tp: int) -> NodesConfig:
    planning = nodes.planning.model_copy(update={"tensor_parallel_candidates": [tp]})
    return nodes.model_copy(update={"planning": planning})


def memory_feasible_tps(inputs: PlanInputs, node_type: str, nodes: NodesConfig
                        ) -> list[tuple[int, NodePlan]]:
    """Every TP candidate with plan.py's verdict at exactly that TP (feasible or not)."""
    node = nodes.node_types[node_type]
    out = []
    for tp in sorted(t for t in nodes.planning.tensor_parallel_candidates
                     if t <= node.gpus_per_node):
        out.append((tp, plan_node(inputs, node_type, node, _with_tp(nodes, tp))))
    return out


def choose_by_sla(inputs: PlanInputs, node_type: str, nodes: NodesConfig, slo: Slo,
                  predict: PredictFn, calibration: Calibration | None,
                  max_num_seqs_candidates: Sequence[int] = (32, 64, 128, 256)) -> SlaChoice:
    """The TP with the most corrected tokens/s/GPU among those that fit memory (plan.py) and
    whose corrected prediction meets the SLO at the target concurrency; then the largest
    --max-num-seqs that still meets it and whose sequences fit at full context.

    Without a covered prediction the smallest TP that fits memory stands (basis `memory`); when
    no TP meets the SLO the smallest fitting one stands with sla_pass False and the reasons.
    """
    base = plan_node(inputs, node_type, nodes.node_types[node_type], nodes)
    target = inputs.target_concurrency
    if not base.feasible:
        return SlaChoice(node_type=node_type, precision=base.precision, tensor_parallel=None,
                         max_num_seqs=None, basis="memory", sla_pass=None, reason=base.reason,
                         node_plan=base, prediction=None)
    considered: list[str] = []
    passing: list[tuple[int, NodePlan, CorrectedPrediction]] = []
    covered_any = False
    for tp, at_tp in memory_feasible_tps(inputs, node_type, nodes):
        if not at_tp.feasible:
            considered.append(f"TP {tp}: memory: {at_tp.reason}")
            continue
        p = correct(predict(tp, target), calibration)
        if not p.covered:
            considered.append(f"TP {tp}: {p.basis}")
            continue
        covered_any = True
        ok, why = slo_verdict(p, slo)
        considered.append(f"TP {tp}: {why} at concurrency {target} "
                          f"({p.tokens_per_s_per_gpu:.0f} tokens/s/GPU)")
        if ok:
            passing.append((tp, at_tp, p))
    if not passing:  # the memory rule's plan (it sizes KV for the target concurrency) stands
        why = ("no TP meets the SLO by prediction; the smallest that fits memory stands"
               if covered_any else "SLO not checked: no covered prediction; the smallest TP "
               "that fits memory stands")
        return SlaChoice(node_type=node_type, precision=base.precision,
                         tensor_parallel=base.tensor_parallel, max_num_seqs=target,
                         basis="sla" if covered_any else "memory",
                         sla_pass=False if covered_any else None, reason=why, node_plan=base,
                         prediction=None, considered=tuple(considered))
    tp, at_tp, best = max(passing, key=lambda x: (x[2].tokens_per_s_per_gpu or 0.0, -x[0]))
    seqs, seq_notes = target, []
    limit = at_tp.max_sequences_at_context or target
    for c in sorted(c for c in max_num_seqs_candidates if c > target):
        if c > limit:
            seq_notes.append(f"{c} sequences: memory holds {limit} at full context")
            break
        ok, why = slo_verdict(correct(predict(tp, c), calibration), slo)
        if not ok:
            seq_notes.append(f"{c} sequences: {why}")
            break
        seqs = c
    reason = (f"TP {tp}: {best.tokens_per_s_per_gpu:.0f} tokens/s/GPU at concurrency {target}, "
              f"TTFT {best.ttft_ms / 1e3:.2f} s, TPOT {best.tpot_ms:.1f} ms within the SLO "
              f"(TTFT {slo.ttft_p95_s} s, ITL {slo.itl_mean_ms} ms); max-num-seqs {seqs}"
              + (f" ({seq_notes[0]})" if seq_notes else ""))
    if tp != base.tensor_parallel:
        reason += f"; memory alone would take TP {base.tensor_parallel}"
    return SlaChoice(node_type=node_type, precision=base.precision, tensor_parallel=tp,
                     max_num_seqs=seqs, basis="sla", sla_pass=True, reason=reason, node_plan=at_tp,
                     prediction=best, considered=tuple(considered + seq_notes))


# ---- the predicted table of one model ----

@dataclass(frozen=True)
class PredictedRow:
    """One configuration: the corrected prediction, its SLO verdict and plan.py's memory one."""

    prediction: CorrectedPrediction
    slo_pass: bool | None
    slo_why: str
    fits_memory: bool | None = None
    memory_why: str = ""

    def row(self) -> dict[str, Any]:
        p, pred = self.prediction, self.prediction.prediction
        r = pred.request
        return {"node_type": r.node_type, "precision": r.precision, "tp": r.tensor_parallel,
                "fits_memory": self.fits_memory, "status": pred.status,
                "ttft_s": p.ttft_ms / 1e3 if p.ttft_ms is not None else None,
                "tpot_ms": p.tpot_ms, "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
                "slo": "-" if self.slo_pass is None else ("pass" if self.slo_pass else "fail"),
                "why": self.slo_why if self.slo_pass is not None else "; ".join(pred.notes)}


@dataclass(frozen=True)
class PredictionTable:
    """What the `predictions` asset stores: rows per node type x precision x TP at the SLA
    scenario, each corrected and judged, and the SLA-bound choice per node type."""

    model: str
    input_tokens: int
    output_tokens: int
    concurrency: int
    rows: tuple[PredictedRow, ...]
    choices: tuple[SlaChoice, ...] = ()

    def throughput_for(self, model: str, node_type: str, precision: str, tp: int
                       ) -> tuple[float, str] | None:
        """Corrected tokens/s/GPU and its basis sentence; None where nothing was predicted
        (the hook the multi-model layout asks before falling back to a stated rule)."""
        if model != self.model:
            return None
        for row in self.rows:
            p = row.prediction
            r = p.prediction.request
            if (r.node_type, r.precision, r.tensor_parallel) == (node_type, precision, tp) \
                    and p.covered and p.tokens_per_s_per_gpu is not None:
                return p.tokens_per_s_per_gpu, p.basis
        return None

    def table_rows(self, node_type: str | None = None) -> list[dict[str, Any]]:
        return [r.row() for r in self.rows
                if node_type is None or r.prediction.prediction.request.node_type == node_type]

    def markdown(self) -> str:
        """The report: every row, the SLA choice per node type, and the basis sentence."""
        covered = [r.prediction.basis for r in self.rows if r.prediction.covered]
        title = (f"# {self.model}: predicted at {self.input_tokens} input / {self.output_tokens} "
                 f"output tokens, concurrency {self.concurrency}")
        return "\n\n".join([title, md_table(self.table_rows()), "## SLA choice per node type",
                             md_table([c.row() for c in self.choices]),
                             f"Basis: {covered[0] if covered else 'nothing covered'}."]) + "\n"


def tabulate(model: str, predictions: Sequence[Prediction], calibration: Calibration | None,
             slo_for: Callable[[str], Slo], choices: Sequence[SlaChoice] = (),
             memory: dict[tuple[str, str, int], NodePlan] | None = None) -> PredictionTable:
    """Correct and judge each prediction at its node type's SLO, beside its memory verdict."""
    rows = []
    for pred in predictions:
        p = correct(pred, calibration)
        ok, why = slo_verdict(p, slo_for(pred.request.node_type))
        r = pred.request
        at = (memory or {}).get((r.node_type, r.precision, r.tensor_parallel))
        rows.append(PredictedRow(p, ok, why, at.feasible if at else None,
                                 at.reason if at else ""))
    first = predictions[0].request if predictions else None
    return PredictionTable(model, first.input_tokens if first else 0,
                           first.output_tokens if first else 0,
                           first.batch_size if first else 0, tuple(rows), tuple(choices))


POOLING_NOT_COVERED = ("not predicted: a pooling model (embed/rerank) has no decode, and "
                       "AIConfigurator models generation (prefill + decode)")


def _pooling_not_predicted(req: PredictionRequest) -> Prediction:
    return Prediction(request=req, status="not_covered", aic_version="", data_set="",
                      notes=(POOLING_NOT_COVERED,))


def model_config_for(spec: ModelSpec, checkpoint_config: dict[str, Any] | None
                     ) -> tuple[dict[str, Any], str]:
    """The config the library reads: the fetched checkpoint's config.json, else the catalog's
    architecture hint turned into one; with where it came from. A pooling model gets none:
    it is never asked about (`predict_model`)."""
    if spec.task != "generate":
        return {}, POOLING_NOT_COVERED
    if checkpoint_config is not None:
        return checkpoint_config, "checkpoint config.json"
    if spec.architecture is None:
        raise ConfigError(
            f"model {spec.id!r}", "no checkpoint config.json and no architecture hint to "
            "predict from", "Materialize `checkpoint`, or add `architecture:` to the catalog "
            "entry.")
    try:
        return (config_from_hint(spec.architecture, spec.engine_args.get("max_model_len")),
                "catalog architecture hint")
    except ConfigError as exc:
        raise ConfigError(f"model {spec.id!r}: {exc.what}", exc.cause, exc.fix) from None


# ---- the orchestration the assets and the bench script share ----

PredictRequestFn = Callable[[PredictionRequest], Prediction]


def calibrate_points(cfg: PredictConfig, points: PointsFile, predict: PredictRequestFn,
                     aic_version: str = "") -> tuple[Calibration, list[Prediction]]:
    """Predict every measured point of the calibration node type, pair and summarise."""
    node_type = cfg.calibration.node_type
    chosen = [p for p in points.points if p.node_type == node_type]
    predictions = [predict(point_request(cfg, points, p)) for p in chosen]
    pairs, skipped = pair_points(chosen, predictions)
    data_sets = sorted({p.data_set for p in predictions if p.covered})
    version = aic_version or next((p.aic_version for p in predictions), "")
    return calibrate(node_type, pairs, version, ", ".join(data_sets), skipped), predictions


def _ladder_inputs(inputs: PlanInputs, precision: str) -> PlanInputs:
    return replace(inputs, precision_ladder=(precision,))


def predict_model(cfg: PredictConfig, spec: ModelSpec, model_config: dict[str, Any],
                  inputs: PlanInputs, nodes: NodesConfig, slo_for: Callable[[str], Slo],
                  predict: PredictRequestFn, calibration: Calibration | None) -> PredictionTable:
    """Every node type x ladder precision x TP candidate at the SLA scenario and the model's
    target concurrency, each with plan.py's memory verdict; and the SLA choice per node type."""
    cache: dict[PredictionRequest, Prediction] = {}
    if spec.task != "generate":
        predict = _pooling_not_predicted  # never ask the library about a model with no decode
    ep = bool(spec.engine_args.get("enable_expert_parallel"))
    kv = spec.engine_args.get("kv_cache_dtype")

    def run(node_type: str, precision: str, tp: int, batch: int) -> Prediction:
        req = make_request(cfg, spec.id, model_config, node_type, precision, tp, batch,
                           kv_cache_dtype=kv, expert_parallel=ep)
        if req not in cache:
            cache[req] = predict(req)
        return cache[req]

    predictions, memory = [], {}
    for node_type in cfg.node_types:
        if node_type not in nodes.node_types:
            raise ConfigError("predict.yaml node_types", f"{node_type!r} is not in nodes.yaml",
                              "List node types nodes.yaml defines.")
        for precision in [p for p in spec.precision_ladder if p in cfg.precisions]:
            for tp, at in memory_feasible_tps(_ladder_inputs(inputs, precision), node_type,
                                              nodes):
                memory[(node_type, precision, tp)] = at
                if at.precision is not None and at.tensor_parallel != tp:
                    # heads do not split over TP, or NUMA: no such configuration to ask about
                    req = make_request(cfg, spec.id, model_config, node_type, precision, tp,
                                       inputs.target_concurrency, kv_cache_dtype=kv,
                                       expert_parallel=ep)
                    predictions.append(Prediction(request=req, status="not_applicable",
                                                  aic_version="", data_set="",
                                                  notes=(at.rejected[-1] if at.rejected
                                                         else at.reason,)))
                    continue
                predictions.append(run(node_type, precision, tp, inputs.target_concurrency))
    choices = []
    for node_type in cfg.node_types:
        # choose_by_sla predicts only at the precision the plan found (never when it found none)
        precision = plan_node(inputs, node_type, nodes.node_types[node_type], nodes).precision
        choices.append(choose_by_sla(
            inputs, node_type, nodes, slo_for(node_type),
            lambda tp, batch, nt=node_type, pr=precision: run(nt, str(pr), tp, batch),
            calibration, cfg.max_num_seqs_candidates))
    return tabulate(spec.id, predictions, calibration, slo_for, choices, memory)


def points_from_sweep_rows(rows: Iterable[dict[str, Any]], scenarios: dict[str, Scenario],
                           *, model: str, config: str, precision: str, node_type: str,
                           tensor_parallel: int, gpus: int, engine: str, source: str,
                           measured_on: str = "", expert_parallel: int = 1,
                           kv_cache_dtype: str | None = None, max_num_seqs: int | None = None,
                           client_error_causes: frozenset[str] = frozenset()
                           ) -> list[MeasuredPoint]:
    """Measured points from the serving benchmark's sweep table (`serving_benchmark.csv`: one
    row per scenario x concurrency, the columns of `PointStats.row()`); rows of a failed or
    errored point, or of a request-rate sweep, are left out: they measure no steady load. So
    are rows above the engine's `max_num_seqs`: a batch that size never ran, the rest queued.
    A row whose failures are all of `client_error_causes` (the client's accounting, not the
    engine's: the twins' random weights emit ids their tokenizer shows as no text) is kept for
    its TTFT and TPOT, which completed requests measure under the full load; its tokens/s
    counts completed requests only, so it is left out."""
    out = []
    for row in rows:
        def num(key: str, row: dict[str, Any] = row) -> float | None:
            value = row.get(key)
            return None if value in (None, "") or math.isnan(float(value)) else float(value)

        scenario = scenarios.get(str(row["scenario"]))
        if scenario is None:
            raise ConfigError(f"sweep row {row['scenario']!r}", "a scenario not in the profile "
                              f"({', '.join(scenarios)})", "Pass the profile the sweep ran.")
        load = float(row["load"])
        causes = set(parse_error_causes(row.get("errors_by_cause")))
        client_only = bool(causes) and causes <= client_error_causes
        if not load.is_integer() or not num("completed") \
                or ((num("failed") or 0) > 0 and not client_only) \
                or (max_num_seqs is not None and load > max_num_seqs) \
                or str(row.get("engine_exited", "")).lower() in ("true", "yes", "1"):
            continue
        out.append(MeasuredPoint(
            model=model, config=config, precision=precision, node_type=node_type,
            tensor_parallel=tensor_parallel, expert_parallel=expert_parallel,
            scenario=str(row["scenario"]), input_tokens=scenario.input_tokens,
            output_tokens=scenario.output_tokens, concurrency=int(load), gpus=gpus,
            kv_cache_dtype=kv_cache_dtype,
            ttft_p50_ms=_ms(num("ttft_p50_s")), ttft_p95_ms=_ms(num("ttft_p95_s")),
            tpot_mean_ms=num("tpot_mean_ms"), itl_mean_ms=num("itl_mean_ms"),
            output_tokens_per_s=None if client_only else float(row["output_tokens_per_s"]),
            engine=engine, measured_on=measured_on, source=source))
    return out


def _ms(seconds: float | None) -> float | None:
    return seconds * 1e3 if seconds is not None else None


def add_points(points: PointsFile, new: Sequence[MeasuredPoint], config_key: str,
               model_config: dict[str, Any]) -> PointsFile:
    """The file with `new` appended (a point of the same configuration replaced)."""
    keys = {(p.key, p.node_type, p.engine) for p in new}
    kept = [p for p in points.points if (p.key, p.node_type, p.engine) not in keys]
    return PointsFile(format=points.format, description=points.description,
                      model_configs={**points.model_configs, config_key: model_config},
                      points=[*kept, *new])
