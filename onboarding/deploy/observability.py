"""Day-two artifacts of one model on one node type, from the values its manifest was rendered
from: a PrometheusRule (recording rules, alerts on the SLO, the measured saturation point, the
KV cache, the engine's target, and the node's dcgm-exporter fields at node acceptance's limits),
PodMonitors for the engine and dcgm-exporter, and a KEDA ScaledObject on the engine's queue.

Every threshold names its origin in the rule's annotations (`source`), so an operator paged at
night sees which measurement or config file a number came from. The engine's series are the
names its template in configs/stack.yaml gives (`metrics`), never written here. Pure: the asset
writes the files, the tests run promtool and a real Prometheus on them (docs/operations.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from onboarding.common.config import StrictConfig, load_config_file
from onboarding.serving.stack import MetricNames
from onboarding.serving.stats import ServingBenchmarkResult, Slo

RECORD_PREFIX = "model_onboarding"
# The labels every engine series carries once scraped (the PodMonitor's relabelings, the local
# scrape config's static labels): what rules, dashboards and KEDA select one deployment by.
TARGET_LABELS = ("model", "node_type", "precision", "tp")
_DURATION = r"^[0-9]+(ms|s|m|h)$"
# dcgm-exporter's fields (NVIDIA/dcgm-exporter etc/default-counters.csv at 4.5.3-4.8.2; the ECC
# and NVLink error counters are commented out there and must be enabled: `dcgm_counters_csv`)
DCGM_XID = "DCGM_FI_DEV_XID_ERRORS"
DCGM_GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
DCGM_ECC_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
DCGM_ECC_SBE = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
DCGM_CLOCK_EVENTS = "DCGM_EXP_CLOCK_EVENTS_COUNT"
DCGM_NVLINK_ERRORS = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                      "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                      "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                      "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")
# node acceptance's clock-event names (onboarding/nodes/telemetry.CLOCK_REASON_BITS) -> the
# `clock_event` label dcgm-exporter's clock-events collector writes
# (internal/pkg/collector/clock_events_collector.go at 4.5.3-4.8.2)
CLOCK_EVENT_LABELS = {"sw_power_cap": "power_cap", "hw_slowdown": "hw_slowdown",
                      "sync_boost": "sync_boost", "sw_thermal_slowdown": "sw_thermal",
                      "hw_thermal_slowdown": "hw_thermal",
                      "hw_power_brake_slowdown": "hw_power_brake", "gpu_idle": "gpu_idle",
                      "applications_clocks_setting": "clocks_setting",
                      "display_clocks_setting": "display_clocks"}


class Evaluation(StrictConfig):
    window: str = Field(default="5m", pattern=_DURATION)
    for_: str = Field(default="5m", alias="for", pattern=_DURATION)
    engine_down_for: str = Field(default="2m", pattern=_DURATION)
    scrape_interval: str = Field(default="15s", pattern=_DURATION)


class MemoryTiers(StrictConfig):
    """KV-cache usage (a fraction) at which each tier's alert fires; increasing."""

    info: float = Field(gt=0, le=1)
    warning: float = Field(gt=0, le=1)
    critical: float = Field(gt=0, le=1)

    @model_validator(mode="after")
    def _increasing(self) -> MemoryTiers:
        if not self.info < self.warning < self.critical:
            raise ValueError(f"tiers must increase: info {self.info:g} < warning "
                             f"{self.warning:g} < critical {self.critical:g}")
        return self


# tier -> (alert, what it means for the operator)
MEMORY_TIER_ALERTS = {
    "info": ("ModelKVCacheElevated", "plan capacity"),
    "warning": ("ModelKVCacheHigh", "scale out before the ceiling"),
    "critical": ("ModelKVCacheNearlyFull", "requests wait or are preempted"),
}


class AlertSettings(StrictConfig):
    memory_tiers: MemoryTiers
    ttft_p99_margin: float = Field(ge=1.0)


class Scaling(StrictConfig):
    min_replicas: int = Field(ge=0)
    max_replicas: int = Field(ge=1)
    target_fraction: float = Field(gt=0, le=1)
    polling_interval_s: int = Field(default=15, ge=1)
    cooldown_s: int = Field(default=300, ge=0)
    prometheus_url: str = Field(pattern=r"^https?://")


class DcgmExporter(StrictConfig):
    namespace: str
    pod_labels: dict[str, str] = Field(min_length=1)
    port: str
    ecc_sbe_per_hour_max: float = Field(ge=0)


class OperationsConfig(StrictConfig):
    """configs/operations.yaml."""

    selector_labels: dict[str, str] = Field(default_factory=dict)
    evaluation: Evaluation = Field(default_factory=Evaluation)
    alerts: AlertSettings
    scaling: Scaling
    dcgm_exporter: DcgmExporter

    @field_validator("scaling")
    @classmethod
    def _bounds(cls, v: Scaling) -> Scaling:
        if v.max_replicas < v.min_replicas:
            raise ValueError(f"max_replicas {v.max_replicas} < min_replicas {v.min_replicas}")
        return v


def load_operations(path: Path) -> OperationsConfig:
    return load_config_file(OperationsConfig, path, "Fix operations.yaml (see the repository's "
                            "configs/operations.yaml and docs/operations.md).")


@dataclass(frozen=True)
class NodeLimits:
    """What node acceptance holds a node type's GPUs to, as the node rules need it (from
    acceptance.yaml's thresholds for the node type). Two temperatures: `temperature_alarm_c`
    (the procedure's production alarm, 85 C) is what the in-service alert fires at;
    `temperature_max_c` (the burn's limit, 83 C) is stricter on purpose, since an hour at full
    load must stay below the throttle point to pass, and is cited beside it."""

    temperature_max_c: float
    forbidden_clock_reasons: tuple[str, ...]
    nvlinks_per_gpu: int | None = None
    temperature_alarm_c: float | None = None  # None: the burn's limit stands in

    @classmethod
    def of(cls, thresholds: Any) -> NodeLimits:
        """From acceptance.yaml's thresholds for one node type (AcceptanceConfig.thresholds)."""
        return cls(thresholds.burn.temperature_max_c,
                   tuple(thresholds.burn.forbidden_clock_reasons), thresholds.nvlinks_per_gpu,
                   thresholds.gpu_temperature_alarm_c)


@dataclass(frozen=True, kw_only=True)
class Target:
    """One deployment as its manifest names it."""

    model: str
    served_name: str
    node_type: str
    namespace: str
    service: str  # the InferenceService's name
    precision: str
    tensor_parallel: int
    config_hash: str
    port: int
    metrics_path: str
    gpu_product: str  # nodes.yaml gpu_product (gpu-feature-discovery's nvidia.com/gpu.product)
    # deployed as KServe's LLMInferenceService (deploy.yaml llm_inference_service_node_types):
    # its pods, port and scaling differ from an InferenceService's
    llm_inference_service: bool = False


@dataclass(frozen=True)
class Threshold:
    """A rendered number and where it came from (the `source` annotation)."""

    name: str
    value: float
    source: str


@dataclass
class Operations:
    """Everything rendered for one deployment; `skipped` says what was not and why."""

    rule: dict[str, Any]
    engine_monitor: dict[str, Any]
    dcgm_monitor: dict[str, Any]
    scaled_object: dict[str, Any] | None
    thresholds: list[Threshold]
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def docs(self) -> list[dict[str, Any]]:
        return [d for d in (self.rule, self.engine_monitor, self.dcgm_monitor,
                            self.scaled_object) if d is not None]

    def rule_file(self) -> dict[str, Any]:
        """The PrometheusRule's groups as a plain rule file (`promtool check rules`, or a
        Prometheus without the operator: `rule_files`)."""
        return {"groups": self.rule["spec"]["groups"]}


def selector(t: Target) -> str:
    return f'model="{t.model}", node_type="{t.node_type}"'


def target_label_values(t: Target) -> dict[str, str]:
    return dict(zip(TARGET_LABELS, (t.model, t.node_type, t.precision, str(t.tensor_parallel)),
                    strict=True))


def measured_at(bench: ServingBenchmarkResult | None, t: Target) -> ServingBenchmarkResult | None:
    """The benchmark only where it measured exactly this configuration on this node type."""
    if bench is None or not bench.servable:
        return None
    return bench if (bench.config_hash == t.config_hash and bench.node_type == t.node_type) \
        else None


def queue_target(bench: ServingBenchmarkResult | None, scaling: Scaling) -> tuple[int | None, str]:
    """Requests in flight per replica KEDA scales at, and why (None: no measured basis)."""
    if bench is None:
        return None, "no benchmark at this configuration: no measured saturation point"
    if bench.saturation_concurrency <= 0:
        return None, "no measured concurrency met the SLOs: no saturation point to scale at"
    value = max(1, int(bench.saturation_concurrency * scaling.target_fraction))
    return value, (f"measured saturation concurrency {bench.saturation_concurrency} "
                   f"(serving_benchmark at configuration {bench.config_hash}) x target_fraction "
                   f"{scaling.target_fraction:g} (operations.yaml scaling)")


def _names(t: Target) -> dict[str, str]:
    return {"rule": f"{t.service}-rules", "engine": f"{t.service}-engine",
            "dcgm": f"{t.service}-dcgm", "scaled": f"{t.service}-queue"}


def _meta(name: str, t: Target, ops: OperationsConfig, namespace: str | None = None
          ) -> dict[str, Any]:
    labels = {"app.kubernetes.io/part-of": "model-onboarding",
              "model-onboarding.io/model": t.model[:63].rstrip("-_."),
              "model-onboarding.io/node-type": t.node_type,
              "model-onboarding.io/config-hash": t.config_hash, **ops.selector_labels}
    return {"name": name, "namespace": namespace or t.namespace, "labels": labels}


def _rec(what: str) -> str:
    return f"{RECORD_PREFIX}:{what}"


def recording_rules(t: Target, m: MetricNames, ev: Evaluation) -> list[dict[str, Any]]:
    """Per deployment (the target labels kept): requests in flight per engine and in total,
    waiting, TTFT p95/p99, mean ITL, KV-cache usage."""
    sel, w = selector(t), ev.window
    by = ", ".join(TARGET_LABELS)
    return [
        {"record": _rec("requests_in_flight:per_instance"),
         "expr": f"sum by ({by}, instance) ({m.running}{{{sel}}}) + "
                 f"sum by ({by}, instance) ({m.waiting}{{{sel}}})"},
        {"record": _rec("requests_waiting:sum"),
         "expr": f"sum by ({by}) ({m.waiting}{{{sel}}})"},
        {"record": _rec(f"ttft_seconds:p95_{w}"),
         "expr": f"histogram_quantile(0.95, sum by ({by}, le) "
                 f"(rate({m.ttft_histogram}_bucket{{{sel}}}[{w}])))"},
        {"record": _rec(f"ttft_seconds:p99_{w}"),
         "expr": f"histogram_quantile(0.99, sum by ({by}, le) "
                 f"(rate({m.ttft_histogram}_bucket{{{sel}}}[{w}])))"},
        {"record": _rec(f"itl_seconds:mean_{w}"),
         "expr": f"sum by ({by}) (rate({m.itl_histogram}_sum{{{sel}}}[{w}])) / "
                 f"sum by ({by}) (rate({m.itl_histogram}_count{{{sel}}}[{w}]))"},
        {"record": _rec("kv_cache_usage:max"),
         "expr": f"max by ({by}) ({m.kv_cache_usage}{{{sel}}})"},
    ]


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, source: str,
           t: Target) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": for_,
            "labels": {"severity": severity, "model": t.model, "node_type": t.node_type},
            "annotations": {"summary": summary, "source": source}}


def engine_alerts(t: Target, slo: Slo, bench: ServingBenchmarkResult | None,
                  ops: OperationsConfig) -> tuple[list[dict[str, Any]], list[Threshold],
                                                  dict[str, str]]:
    """Alerts on the SLO the model was judged against, the measured saturation point and p99,
    the KV cache and the engine's target; with the thresholds and what was left out, why."""
    ev, a, sel, w = ops.evaluation, ops.alerts, selector(t), ops.evaluation.window
    judged = (f"judged by serving_benchmark at concurrency {bench.judged_at} on {t.node_type} "
              f"({'met' if bench.slo_pass else 'missed'})" if bench and bench.judged_at
              else "no benchmark at this configuration")
    slo_src = f"gates.yaml slo for {t.node_type} (the model's overrides applied); {judged}"
    th = [Threshold("ttft_p95_s", slo.ttft_p95_s, f"SLO ttft_p95_s: {slo_src}"),
          Threshold("itl_mean_s", slo.itl_mean_ms / 1e3, f"SLO itl_mean_ms {slo.itl_mean_ms:g}: "
                    f"{slo_src}"),
          *(Threshold("kv_cache_usage_max" if tier == "critical" else f"kv_cache_usage_{tier}",
                      getattr(a.memory_tiers, tier), f"operations.yaml alerts.memory_tiers.{tier} "
                      "(the serving-stack notes' memory tiers 70-80 / 80-85 / > 90 %, on the KV "
                      "cache: the engine reserves its GPU memory at start)")
            for tier in MEMORY_TIER_ALERTS)]
    skipped: dict[str, str] = {}
    alerts = [
        _alert("ModelTTFTOverSLO", f"{_rec(f'ttft_seconds:p95_{w}')}{{{sel}}} > "
               f"{slo.ttft_p95_s:g}", ev.for_, "critical",
               f"{t.model} on {t.node_type}: TTFT p95 over {w} above the SLO "
               f"{slo.ttft_p95_s:g} s", th[0].source, t),
        _alert("ModelITLOverSLO", f"{_rec(f'itl_seconds:mean_{w}')}{{{sel}}} > "
               f"{slo.itl_mean_ms / 1e3:g}", ev.for_, "critical",
               f"{t.model} on {t.node_type}: mean inter-token latency over {w} above the SLO "
               f"{slo.itl_mean_ms:g} ms", th[1].source, t),
        *(_alert(name, f"{_rec('kv_cache_usage:max')}{{{sel}}} > {x.value:g}", ev.for_, tier,
                 f"{t.model} on {t.node_type}: KV cache above {x.value:.0%} ({meaning})",
                 x.source, t)
          for (tier, (name, meaning)), x in zip(MEMORY_TIER_ALERTS.items(), th[2:5],
                                                strict=True)),
        _alert("ModelEngineDown", f"max by ({', '.join(TARGET_LABELS)}) (up{{{sel}}}) == 0 "
               f"or absent(up{{{sel}}})", ev.engine_down_for, "critical",
               f"{t.model} on {t.node_type}: no engine answering its /metrics",
               f"operations.yaml evaluation.engine_down_for {ev.engine_down_for}", t),
    ]
    if bench is not None and bench.saturation_concurrency > 0:
        sat = bench.saturation_concurrency
        src = (f"measured saturation concurrency {sat} (the highest concurrency at which it and "
               f"every lower one met the SLOs; serving_benchmark at configuration "
               f"{bench.config_hash} on {t.node_type})")
        th.append(Threshold("requests_in_flight_max", sat, src))
        alerts.append(_alert(
            "ModelQueueAboveSaturation",
            f"{_rec('requests_in_flight:per_instance')}{{{sel}}} > {sat}", ev.for_,
            "warning", f"{t.model} on {t.node_type}: more requests in flight on one engine "
            f"than the {sat} it was measured to serve within the SLOs", src, t))
    else:
        skipped["ModelQueueAboveSaturation"] = queue_target(bench, ops.scaling)[1]
    if bench is not None and bench.ttft_p99_s:
        p99 = bench.ttft_p99_s * a.ttft_p99_margin
        src = (f"measured TTFT p99 {bench.ttft_p99_s:.4g} s (slowest scenario at concurrency "
               f"{bench.judged_at}, configuration {bench.config_hash}) x operations.yaml "
               f"alerts.ttft_p99_margin {a.ttft_p99_margin:g}")
        th.append(Threshold("ttft_p99_s", round(p99, 4), src))
        alerts.append(_alert(
            "ModelTTFTP99AboveMeasured", f"{_rec(f'ttft_seconds:p99_{w}')}{{{sel}}} > "
            f"{p99:.4g}", ev.for_, "warning", f"{t.model} on {t.node_type}: TTFT p99 over {w} "
            f"above {p99:.4g} s, the measured p99 with margin", src, t))
    else:
        skipped["ModelTTFTP99AboveMeasured"] = "no TTFT p99 measured at this configuration"
    return alerts, th, skipped


def gpu_model_regex(gpu_product: str) -> str:
    """dcgm-exporter's `modelName` (NVML's name, 'NVIDIA H200') from gpu-feature-discovery's
    product label ('NVIDIA-H200'), which writes NVML's spaces as dashes."""
    return "[- ]".join(re.escape(part) for part in gpu_product.split("-"))


def node_alerts(t: Target, limits: NodeLimits | None, ops: OperationsConfig
                ) -> tuple[list[dict[str, Any]], list[Threshold], dict[str, str]]:
    """The GPU faults node acceptance refuses a node for, watched in service by dcgm-exporter:
    any XID, any new uncorrectable ECC error, a forbidden clock event, the burn's temperature
    limit; plus corrected ECC errors and NVLink errors."""
    if limits is None:
        return [], [], {"node rules": f"no acceptance thresholds for {t.node_type}"}
    gpu = f'modelName=~"{gpu_model_regex(t.gpu_product)}"'
    acc = f"acceptance.yaml thresholds for {t.node_type}"
    dcgm = ops.dcgm_exporter
    events = "|".join(sorted(CLOCK_EVENT_LABELS[r] for r in limits.forbidden_clock_reasons
                             if r in CLOCK_EVENT_LABELS))
    alarm = limits.temperature_alarm_c or limits.temperature_max_c
    th = [Threshold("gpu_temp_max_c", alarm, (
              f"{acc}: gpu_temperature_alarm_c {alarm:g} C, the procedure's production alarm "
              f"(acceptance's burn limit, burn.temperature_max_c {limits.temperature_max_c:g} C, "
              "is stricter: an hour at full load below the throttle point)")
              if limits.temperature_alarm_c else f"{acc}: burn.temperature_max_c"),
          Threshold("xid_max", 0, f"{acc}: burn_xid (no XID during the burn)"),
          Threshold("ecc_dbe_new_max", 0, f"{acc}: burn_ecc (0 new uncorrectable)"),
          Threshold("ecc_sbe_per_hour_max", dcgm.ecc_sbe_per_hour_max,
                    "operations.yaml dcgm_exporter.ecc_sbe_per_hour_max (acceptance judges "
                    "only uncorrectable errors)")]
    by = "by (Hostname, hostname, gpu, UUID, modelName)"
    alerts = [
        _alert("GPUXidError", f"max {by} ({DCGM_XID}{{{gpu}}}) > 0", "0m", "critical",
               f"{t.node_type} GPU reported an XID error", th[1].source, t),
        _alert("GPUUncorrectableECC", f"max {by} (increase({DCGM_ECC_DBE}{{{gpu}}}[1h])) > 0",
               "0m", "critical", f"{t.node_type} GPU: new uncorrectable ECC errors",
               th[2].source, t),
        _alert("GPUCorrectableECCRate", f"max {by} (increase({DCGM_ECC_SBE}{{{gpu}}}[1h])) > "
               f"{dcgm.ecc_sbe_per_hour_max:g}", "0m", "warning",
               f"{t.node_type} GPU: corrected ECC errors above "
               f"{dcgm.ecc_sbe_per_hour_max:g} per hour", th[3].source, t),
        _alert("GPUTemperatureHigh", f"max {by} ({DCGM_GPU_TEMP}{{{gpu}}}) > {alarm:g}",
               ops.evaluation.for_, "warning",
               f"{t.node_type} GPU above {alarm:g} C, the production temperature alarm",
               th[0].source, t),
        _alert("GPUNVLinkErrors", "max " + by + " (" + " + ".join(
            f"increase({n}{{{gpu}}}[15m])" for n in DCGM_NVLINK_ERRORS) + ") > 0", "0m",
            "warning", f"{t.node_type} GPU: NVLink CRC, replay or recovery errors",
            f"{acc}: nvlinks_per_gpu {limits.nvlinks_per_gpu} active links at acceptance; "
            "errors on a link are its degradation in service", t),
    ]
    if events:
        th.append(Threshold("clock_events_max", 0, f"{acc}: burn.forbidden_clock_reasons "
                            f"{', '.join(limits.forbidden_clock_reasons)}"))
        alerts.append(_alert(
            "GPUClocksThrottled", f'max {by} (increase({DCGM_CLOCK_EVENTS}{{{gpu}, '
            f'clock_event=~"{events}"}}[15m])) > 0', "0m", "warning",
            f"{t.node_type} GPU clocks held back by a fault, heat or the power brake",
            th[-1].source, t))
    return alerts, th, {}


def dcgm_counters_csv() -> str:
    """The dcgm-exporter counters file (`-f`) the node rules need: the default counters leave the
    ECC and NVLink error fields commented out."""
    rows = [(DCGM_GPU_TEMP, "gauge", "GPU temperature (in C)."),
            (DCGM_XID, "gauge", "Value of the last XID error encountered."),
            (DCGM_ECC_SBE, "counter", "Total number of single-bit volatile ECC errors."),
            (DCGM_ECC_DBE, "counter", "Total number of double-bit volatile ECC errors."),
            *((n, "counter", "NVLink errors.") for n in DCGM_NVLINK_ERRORS),
            ("DCGM_EXP_CLOCK_EVENTS_COUNT", "counter", "reported clock events"),
            ("DCGM_EXP_XID_ERRORS_COUNT", "counter", "reported XIDs during last window")]
    return "".join(f"{a}, {b}, {c}\n" for a, b, c in rows)


# KServe v0.20.0: an LLMInferenceService named <service>-llm (onboarding/deploy/kserve.py) runs
# its engine in workload pods labelled app.kubernetes.io/part-of=llminferenceservice,
# app.kubernetes.io/name=<its name>, kserve.io/component=workload (pkg/controller/v1alpha2/
# llmisvc/workload.go, GetWorkloadLabelSelector), serving on port 8000 (the preset's
# --port 8000; HTTPS only where KServe's ingress config sets enableLLMInferenceServiceTLS).
LLM_ISVC_PORT = 8000


def engine_pod_selector(t: Target) -> dict[str, str]:
    """The labels of the pods the engine runs in: an InferenceService's predictor pods (KServe
    labels them serving.kserve.io/inferenceservice=<name>) or an LLMInferenceService's
    workload pods."""
    if t.llm_inference_service:
        return {"app.kubernetes.io/part-of": "llminferenceservice",
                "app.kubernetes.io/name": f"{t.service}-llm", "kserve.io/component": "workload"}
    return {"serving.kserve.io/inferenceservice": t.service}


def engine_pod_monitor(t: Target, ops: OperationsConfig) -> dict[str, Any]:
    """The engine's /metrics on every pod of the deployment, with the target labels set."""
    relabel = [{"targetLabel": k, "replacement": v, "action": "replace"}
               for k, v in target_label_values(t).items()]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": _meta(_names(t)["engine"], t, ops),
            "spec": {"selector": {"matchLabels": engine_pod_selector(t)},
                     "namespaceSelector": {"matchNames": [t.namespace]},
                     "podMetricsEndpoints": [{
                         "targetPort": LLM_ISVC_PORT if t.llm_inference_service else t.port,
                         "path": t.metrics_path,
                         "interval": ops.evaluation.scrape_interval,
                         "relabelings": relabel}]}}


def dcgm_pod_monitor(t: Target, ops: OperationsConfig) -> dict[str, Any]:
    """dcgm-exporter on the node type's nodes, with the node type and the node's name."""
    d = ops.dcgm_exporter
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": _meta(_names(t)["dcgm"], t, ops, d.namespace),
            "spec": {"selector": {"matchLabels": dict(d.pod_labels)},
                     "namespaceSelector": {"matchNames": [d.namespace]},
                     "podMetricsEndpoints": [{
                         "port": d.port, "path": "/metrics",
                         "interval": ops.evaluation.scrape_interval,
                         "relabelings": [
                             {"sourceLabels": ["__meta_kubernetes_pod_node_name"],
                              "targetLabel": "node", "action": "replace"},
                             {"targetLabel": "node_type", "replacement": t.node_type,
                              "action": "replace"}]}]}}


def scaled_object(t: Target, m: MetricNames, bench: ServingBenchmarkResult | None,
                  ops: OperationsConfig) -> tuple[dict[str, Any] | None, Threshold | None, str]:
    """KEDA ScaledObject on the predictor Deployment KServe's Standard mode creates
    (<service>-predictor): replicas = ceil(requests in flight / target per replica)."""
    target, why = queue_target(bench, ops.scaling)
    if target is None:
        return None, None, why
    if t.llm_inference_service:
        return None, Threshold("queue_target_per_replica", target, why), (
            "an LLMInferenceService scales through its own `scaling` field (deploy.yaml "
            "replicas as a range; KServe creates the ScaledObject on the Workload Variant "
            f"Autoscaler's desired replicas): a second ScaledObject would fight it. {why}; "
            "set it as the per-replica queue threshold of WVA's saturation config")
    s, sel = ops.scaling, selector(t)
    query = (f"sum({m.running}{{{sel}}}) + sum({m.waiting}{{{sel}}})")
    doc = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
           "metadata": _meta(_names(t)["scaled"], t, ops),
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                       "name": f"{t.service}-predictor"},
                    "minReplicaCount": s.min_replicas, "maxReplicaCount": s.max_replicas,
                    "pollingInterval": s.polling_interval_s, "cooldownPeriod": s.cooldown_s,
                    "triggers": [{"type": "prometheus", "metricType": "AverageValue",
                                  "metadata": {"serverAddress": s.prometheus_url,
                                               "query": query, "threshold": str(target)}}]}}
    doc["metadata"]["annotations"] = {"model-onboarding.io/queue-target": why}
    return doc, Threshold("queue_target_per_replica", target, why), why


def llm_inference_service_replicas(min_replicas: int, max_replicas: int) -> dict[str, Any]:
    """An LLMInferenceService's replica fields for deploy.yaml's `replicas` (KServe v0.20.0,
    config/crd/full/llmisvc/serving.kserve.io_llminferenceservices.yaml, v1alpha2
    `spec.scaling`): a fixed count is `replicas`; a range is `scaling`, never both (the CRD's
    rule "replicas and scaling are mutually exclusive"). `scaling` needs `wva` with one actuator
    (hpa or keda); KEDA here, as for the InferenceService. KServe then creates a
    VariantAutoscaling and a KEDA ScaledObject on `wva_desired_replicas`
    (pkg/controller/v1alpha2/llmisvc/scaling.go, expectedScaledObject): the Workload Variant
    Autoscaler computes the replica count from the engine's saturation (its queue and KV cache)
    itself, and the CRD forbids setting its formula (`scalingModifiers`), so the measured
    saturation point is not a field here; it is the queue alert's threshold. minReplicas is at
    least 1 (the CRD's minimum)."""
    if max_replicas <= min_replicas:
        return {"replicas": min_replicas}
    return {"scaling": {"minReplicas": max(1, min_replicas), "maxReplicas": max_replicas,
                        "wva": {"keda": {}}}}


def render_operations(t: Target, m: MetricNames, slo: Slo, bench: ServingBenchmarkResult | None,
                      limits: NodeLimits | None, ops: OperationsConfig) -> Operations:
    """The artifacts of one deployment; `bench` counts only at exactly `t`'s configuration."""
    bench = measured_at(bench, t)
    eng, th, skipped = engine_alerts(t, slo, bench, ops)
    node, node_th, node_skipped = node_alerts(t, limits, ops)
    groups = [{"name": f"{t.service}.recording", "interval": ops.evaluation.scrape_interval,
               "rules": recording_rules(t, m, ops.evaluation)},
              {"name": f"{t.service}.engine", "rules": eng}]
    if node:
        groups.append({"name": f"{t.service}.node", "rules": node})
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": _meta(_names(t)["rule"], t, ops), "spec": {"groups": groups}}
    scaled, q_th, why = scaled_object(t, m, bench, ops)
    if scaled is None:
        skipped["ScaledObject"] = why
    return Operations(rule, engine_pod_monitor(t, ops), dcgm_pod_monitor(t, ops), scaled,
                      th + node_th + ([q_th] if q_th else []), {**skipped, **node_skipped})


def local_scrape_config(t: Target, engine_address: str, rule_files: list[str],
                        ops: OperationsConfig) -> dict[str, Any]:
    """prometheus.yml for one engine outside Kubernetes (the embedded default, a bare node):
    the same target labels the PodMonitor sets, and the rendered rule file."""
    return {"global": {"scrape_interval": ops.evaluation.scrape_interval,
                       "evaluation_interval": ops.evaluation.scrape_interval},
            "rule_files": list(rule_files),
            "scrape_configs": [{"job_name": f"engine-{t.service}", "metrics_path": t.metrics_path,
                                "static_configs": [{"targets": [engine_address],
                                                    "labels": target_label_values(t)}]}]}
