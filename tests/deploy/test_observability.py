"""The day-two artifacts (onboarding/deploy/observability.py) from the H200 recording's measured
values: thresholds traced to their origin, every rule file accepted by `promtool check rules`,
`promtool test rules` on series shaped from recorded /metrics (alerts fire on the breaches the
recordings hold and stay quiet at the measured operating point), and every object valid against
the pinned prometheus-operator and KEDA CRDs (deploy/crds/).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bench import gpu_recordings as rec
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.dashboard import dashboard_queries, render_dashboard
from onboarding.deploy.observability import (
    NodeLimits,
    Operations,
    Target,
    load_operations,
    render_operations,
    target_label_values,
)
from onboarding.serving.profiles import resolve_slo
from resources.config_files import ConfigFiles
from resources.manifest_validator import ManifestValidator
from tests.deploy.recorded_series import (
    CPU_SCRAPES,
    cpu_scrape_series,
    gauge_series,
    sweep_point_series,
)

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian "
                                    "package `prometheus`: apt-get install prometheus; "
                                    "scripts/dev.sh setup installs it)")
CRDS = sorted(str(p) for p in (PROJECT_ROOT / "deploy" / "crds").glob("*/*.yaml"))
OPS = load_operations(PROJECT_ROOT / "configs" / "operations.yaml")
MINUTES = 30
EVAL_AT = "20m"


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    """The recording's configs, SLO, benchmark result and engine metric names."""
    configs = ConfigFiles(config_dir=str(rec.configs_at_run(tmp_path_factory.mktemp("c") /
                                                            "configs")))
    slo = rec.slo(configs)
    bench, _, _ = rec.benchmark_result(slo)
    stack = configs.stack()
    return configs, slo, bench, stack.templates[stack.engine].metrics


def limits(configs: ConfigFiles, node_type: str) -> NodeLimits:
    return NodeLimits.of(configs.acceptance().thresholds(node_type, "acceptance.yaml"))


def target(config_hash: str, node_type: str = rec.NODE_TYPE) -> Target:
    return Target(model=rec.MODEL, served_name=rec.MODEL, node_type=node_type, namespace="models",
                  service=f"{rec.MODEL}-{node_type}", precision="bf16", tensor_parallel=1,
                  config_hash=config_hash, port=8080, metrics_path="/metrics",
                  gpu_product="NVIDIA-H200")


def rendered(h200, config_hash: str | None = None) -> Operations:
    configs, slo, bench, m = h200
    return render_operations(target(config_hash or bench.config_hash), m, slo, bench,
                             limits(configs, rec.NODE_TYPE), OPS)


def rules_of(ops: Operations) -> dict[str, dict]:
    return {r.get("alert") or r["record"]: r for g in ops.rule["spec"]["groups"]
            for r in g["rules"]}


def test_thresholds_come_from_the_measurement_and_say_so(h200):
    _, slo, bench, m = h200
    assert bench.saturation_concurrency == 64 and bench.judged_at == 64  # the recording's
    ops = rendered(h200)
    rules = rules_of(ops)
    queue = rules["ModelQueueAboveSaturation"]
    assert queue["expr"].endswith(f"> {bench.saturation_concurrency}")
    assert "measured saturation concurrency 64" in queue["annotations"]["source"]
    assert bench.config_hash in queue["annotations"]["source"]
    assert rules["ModelTTFTOverSLO"]["expr"].endswith(f"> {slo.ttft_p95_s:g}")
    assert "gates.yaml slo for h200" in rules["ModelTTFTOverSLO"]["annotations"]["source"]
    assert rules["ModelITLOverSLO"]["expr"].endswith(f"> {slo.itl_mean_ms / 1e3:g}")
    p99 = bench.ttft_p99_s * OPS.alerts.ttft_p99_margin
    assert rules["ModelTTFTP99AboveMeasured"]["expr"].endswith(f"> {p99:.4g}")
    # in service: the procedure's production alarm (85 C), not the burn's stricter 83 C limit;
    # the annotation names both and which is which
    node = limits(h200[0], "h200")
    assert (node.temperature_alarm_c, node.temperature_max_c) == (85, 83)
    assert rules["GPUTemperatureHigh"]["expr"].endswith("> 85")
    temp_src = rules["GPUTemperatureHigh"]["annotations"]["source"]
    assert "gpu_temperature_alarm_c 85 C, the procedure's production alarm" in temp_src
    assert "burn.temperature_max_c 83 C, is stricter" in temp_src
    assert 'clock_event=~"hw_power_brake|hw_slowdown|hw_thermal|sw_thermal"' in \
        rules["GPUClocksThrottled"]["expr"]
    assert all(r["annotations"]["source"] for r in rules.values() if "alert" in r)
    tiers = {n: (rules[n]["labels"]["severity"], rules[n]["expr"].rsplit("> ", 1)[1]) for n in
             ("ModelKVCacheElevated", "ModelKVCacheHigh", "ModelKVCacheNearlyFull")}
    assert tiers == {"ModelKVCacheElevated": ("info", "0.7"), "ModelKVCacheHigh": ("warning", "0.8"),
                     "ModelKVCacheNearlyFull": ("critical", "0.9")}  # the notes' memory tiers
    assert "memory tiers 70-80 / 80-85 / > 90 %" in \
        rules["ModelKVCacheHigh"]["annotations"]["source"]
    trigger = ops.scaled_object["spec"]["triggers"][0]
    assert trigger["metadata"]["threshold"] == str(int(bench.saturation_concurrency *
                                                       OPS.scaling.target_fraction))
    assert m.waiting in trigger["metadata"]["query"]
    assert ops.scaled_object["spec"]["scaleTargetRef"]["name"] == f"{rec.MODEL}-h200-predictor"
    assert (ops.scaled_object["spec"]["minReplicaCount"],
            ops.scaled_object["spec"]["maxReplicaCount"]) == (OPS.scaling.min_replicas,
                                                              OPS.scaling.max_replicas)
    relabel = {r["targetLabel"]: r["replacement"] for r in
               ops.engine_monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    assert relabel == {"model": rec.MODEL, "node_type": "h200", "precision": "bf16", "tp": "1"}


def test_a_configuration_never_measured_gets_no_measured_threshold(h200):
    ops = rendered(h200, config_hash="0000unmeasured")
    rules = rules_of(ops)
    assert "ModelQueueAboveSaturation" not in rules and "ModelTTFTP99AboveMeasured" not in rules
    assert ops.scaled_object is None
    assert "no benchmark at this configuration" in ops.skipped["ScaledObject"]
    assert "ModelTTFTOverSLO" in rules  # the SLO needs no measurement


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120,
                          check=False)


@needs_promtool
def test_promtool_accepts_every_rendered_rule_file_and_refuses_a_broken_one(h200, tmp_path):
    configs, _, bench, m = h200
    cpu_slo = resolve_slo(configs.slo_section(), "cpu", configs.spec(rec.MODEL))
    cases = {"measured": rendered(h200), "unmeasured": rendered(h200, "0000unmeasured"),
             "cpu": render_operations(target(bench.config_hash, "cpu"), m, cpu_slo, None, None,
                                      OPS)}
    for name, ops in cases.items():
        path = tmp_path / f"{name}.yml"
        path.write_text(yaml.safe_dump(ops.rule_file(), sort_keys=False))
        proc = _promtool("check", "rules", str(path))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS" in proc.stdout
    broken = cases["measured"].rule_file()
    broken["groups"][1]["rules"][0]["expr"] += " >"
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(broken))
    proc = _promtool("check", "rules", str(path))
    assert proc.returncode != 0 and "parse error" in proc.stdout + proc.stderr


def test_objects_validate_against_the_pinned_crds_and_a_broken_one_does_not(h200):
    validator = ManifestValidator(crd_paths=CRDS)
    ops = rendered(h200)
    assert {d["kind"] for d in ops.docs} == {"PrometheusRule", "PodMonitor", "ScaledObject"}
    for doc in ops.docs:
        assert validator.validate(doc) == [], doc["kind"]
    bad = copy.deepcopy(ops.scaled_object)
    bad["spec"]["minReplicas"] = 1  # KEDA spells it minReplicaCount
    assert "$.spec.minReplicas: unknown field (not in the CRD schema)" in validator.validate(bad)
    bad_rule = copy.deepcopy(ops.rule)
    bad_rule["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    assert any("for" in e for e in validator.validate(bad_rule))


# ---- promtool test rules on recorded series ----

def _row(scenario: str, load: int) -> dict[str, str]:
    return next(r for r in rec.sweep_rows() if r["scenario"] == scenario and
                int(float(r["load"])) == load)


def _engine_labels(t: Target) -> dict[str, str]:
    return {"job": f"engine-{t.service}", "instance": "10.0.0.7:8080",
            **target_label_values(t), "model_name": t.served_name, "engine": "0"}


def _alert(ops: Operations, name: str, labels: dict[str, str]) -> dict:
    rule = rules_of(ops)[name]
    return {"exp_labels": {**labels, **rule["labels"]},
            "exp_annotations": dict(rule["annotations"])}


def _keys(t: Target, instance: bool = False) -> dict[str, str]:
    out = target_label_values(t)
    return {**out, "instance": "10.0.0.7:8080"} if instance else out


GPU = {"gpu": "0", "UUID": "GPU-4a1c", "modelName": "NVIDIA H200", "Hostname": "gpu-node-01"}


def _node_series(temp_c: float, xid: float, dbe: list[float]) -> list[dict[str, str]]:
    return [gauge_series("DCGM_FI_DEV_GPU_TEMP", GPU, [temp_c] * MINUTES),
            gauge_series("DCGM_FI_DEV_XID_ERRORS", GPU, [0.0] * 10 + [xid] * (MINUTES - 10)),
            gauge_series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", GPU, dbe)]


def unit_tests(h200, ops: Operations, t: Target, quiet_expectation: list[dict] | None = None
               ) -> dict:
    """The promtool test file: the operating point (chat @ 64, the highest SLO-meeting point)
    quiet; the overload (chat @ 256, the point that missed the SLOs) firing TTFT and queue; the
    CPU engine's recorded scrape against H200 SLOs firing ITL; an injected KV-cache fill (no
    recording reached 90 %), a dead target, and GPU faults at acceptance's limits."""
    _, _, bench, m = h200
    labels = _engine_labels(t)
    op = _row("chat", bench.saturation_concurrency)
    over = _row("chat", 256)
    temp = float(op["gpu_temp_max_c"])  # the GPU's temperature during the recorded point
    quiet = {"interval": "1m", "name": "operating point",
             "input_series": sweep_point_series(op, m, labels, MINUTES)
             + _node_series(temp, 0.0, [0.0] * MINUTES),
             "alert_rule_test": quiet_expectation or [
                 {"eval_time": EVAL_AT, "alertname": a, "exp_alerts": []}
                 for a in rules_of(ops) if not a.startswith(rec_prefix())]}
    overload = {"interval": "1m", "name": "overload",
                "input_series": sweep_point_series(over, m, labels, MINUTES)
                + _node_series(temp + 60, 79.0, [0.0] * 10 + [2.0] * (MINUTES - 10)),
                "alert_rule_test": [
                    {"eval_time": EVAL_AT, "alertname": "ModelTTFTOverSLO",
                     "exp_alerts": [_alert(ops, "ModelTTFTOverSLO", _keys(t))]},
                    {"eval_time": EVAL_AT, "alertname": "ModelTTFTP99AboveMeasured",
                     "exp_alerts": [_alert(ops, "ModelTTFTP99AboveMeasured", _keys(t))]},
                    {"eval_time": EVAL_AT, "alertname": "ModelQueueAboveSaturation",
                     "exp_alerts": [_alert(ops, "ModelQueueAboveSaturation",
                                           _keys(t, instance=True))]},
                    {"eval_time": EVAL_AT, "alertname": "ModelITLOverSLO", "exp_alerts": []},
                    {"eval_time": EVAL_AT, "alertname": "GPUXidError",
                     "exp_alerts": [_alert(ops, "GPUXidError", GPU)]},
                    {"eval_time": EVAL_AT, "alertname": "GPUUncorrectableECC",
                     "exp_alerts": [_alert(ops, "GPUUncorrectableECC", GPU)]},
                    {"eval_time": EVAL_AT, "alertname": "GPUTemperatureHigh",
                     "exp_alerts": [_alert(ops, "GPUTemperatureHigh", GPU)]}]}
    point = json.loads((CPU_SCRAPES / "point.json").read_text())
    cpu = {"interval": "1m", "name": "CPU engine's scrape on H200 rules",
           "input_series": cpu_scrape_series(m, labels, MINUTES, float(point["duration_s"])),
           "alert_rule_test": [
               {"eval_time": EVAL_AT, "alertname": "ModelITLOverSLO",
                "exp_alerts": [_alert(ops, "ModelITLOverSLO", _keys(t))]}]}
    injected = {"interval": "1m", "name": "KV cache filled, then the engine gone",
                "input_series": sweep_point_series(op, m, labels, MINUTES, kv_usage=0.95, up=0),
                "alert_rule_test": [
                    *({"eval_time": EVAL_AT, "alertname": name,
                       "exp_alerts": [_alert(ops, name, _keys(t))]}
                      for name in ("ModelKVCacheElevated", "ModelKVCacheHigh",
                                   "ModelKVCacheNearlyFull")),
                    {"eval_time": EVAL_AT, "alertname": "ModelEngineDown",
                     "exp_alerts": [_alert(ops, "ModelEngineDown", _keys(t))]}]}
    tier = {"interval": "1m", "name": "KV cache in the 80-85 % tier",
            "input_series": sweep_point_series(op, m, labels, MINUTES, kv_usage=0.82),
            "alert_rule_test": [
                {"eval_time": EVAL_AT, "alertname": "ModelKVCacheElevated",
                 "exp_alerts": [_alert(ops, "ModelKVCacheElevated", _keys(t))]},
                {"eval_time": EVAL_AT, "alertname": "ModelKVCacheHigh",
                 "exp_alerts": [_alert(ops, "ModelKVCacheHigh", _keys(t))]},
                {"eval_time": EVAL_AT, "alertname": "ModelKVCacheNearlyFull", "exp_alerts": []}]}
    recorded = {"interval": "1m", "name": "recording rules at the operating point",
                "input_series": sweep_point_series(op, m, labels, MINUTES),
                "promql_expr_test": [
                    {"expr": f'model_onboarding:requests_in_flight:per_instance{{model="{t.model}"}}',
                     "eval_time": EVAL_AT,
                     "exp_samples": [{"labels": "model_onboarding:requests_in_flight:per_instance"
                                      + "{" + ",".join(f'{k}="{v}"' for k, v in
                                                       _keys(t, instance=True).items()) + "}",
                                      "value": float(op["peak_running"])
                                      + float(op["peak_waiting"])}]}]}
    return {"rule_files": ["rules.yml"], "evaluation_interval": "1m",
            "tests": [quiet, overload, cpu, injected, tier, recorded]}


def rec_prefix() -> str:
    return "model_onboarding:"


def _run_unit_tests(tmp_path: Path, ops: Operations, tests: dict) -> subprocess.CompletedProcess:
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(ops.rule_file(), sort_keys=False))
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    return _promtool("test", "rules", str(tmp_path / "tests.yml"))


@pytest.mark.slow
@needs_promtool
def test_alerts_fire_on_recorded_breaches_and_stay_quiet_at_the_operating_point(h200, tmp_path):
    _, _, bench, _ = h200
    ops = rendered(h200)
    t = target(bench.config_hash)
    proc = _run_unit_tests(tmp_path, ops, unit_tests(h200, ops, t))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "SUCCESS" in proc.stdout


@pytest.mark.slow
@needs_promtool
def test_the_unit_tests_can_fail(h200, tmp_path):
    """Expecting the queue alert at the operating point, or the saturation threshold moved
    below the operating point's load, makes promtool fail: the quiet verdict is a verdict."""
    _, _, bench, _ = h200
    ops = rendered(h200)
    t = target(bench.config_hash)
    expect_fire = [{"eval_time": EVAL_AT, "alertname": "ModelQueueAboveSaturation",
                    "exp_alerts": [_alert(ops, "ModelQueueAboveSaturation",
                                          _keys(t, instance=True))]}]
    proc = _run_unit_tests(tmp_path, ops, unit_tests(h200, ops, t, expect_fire))
    assert proc.returncode != 0 and "ModelQueueAboveSaturation" in proc.stdout + proc.stderr
    lower = dataclasses.replace(bench, saturation_concurrency=16)
    configs, slo, _, m = h200
    ops16 = render_operations(t, m, slo, lower, limits(configs, "h200"), OPS)
    proc = _run_unit_tests(tmp_path, ops16, unit_tests(h200, ops16, t))
    assert proc.returncode != 0 and "ModelQueueAboveSaturation" in proc.stdout + proc.stderr


# ---- the dashboard ----

def test_dashboard_is_built_by_grafanas_types_with_the_slo_lines(h200):
    from grafana_foundation_sdk.models.dashboard import Dashboard

    _, slo, bench, _ = h200
    ops = rendered(h200)
    doc = render_dashboard(target(bench.config_hash), ops, OPS.evaluation.window)
    back = Dashboard.from_json(doc)  # the library's own model reads it back
    assert [p.title for p in back.panels] == [p["title"] for p in doc["panels"]]
    lines = {p["title"]: [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]
                          if s["value"] is not None] for p in doc["panels"]}
    assert slo.ttft_p95_s in lines["TTFT"]
    assert slo.itl_mean_ms / 1e3 in lines["Mean inter-token latency"]
    assert bench.saturation_concurrency in lines["Requests in flight per engine"]
    recorded = {r["record"] for g in ops.rule_file()["groups"] for r in g["rules"]
                if "record" in r}
    for expr in dashboard_queries(doc):  # every panel reads a series the rules record, or up
        assert expr.startswith("sum(up{") or expr.split("{")[0] in recorded, expr


@needs_promtool
def test_every_dashboard_query_parses_in_prometheus_and_a_broken_one_does_not(h200, tmp_path):
    """Prometheus's own parser (promtool check rules parses each expression as the server
    does); the end-to-end test also queries a running server with them."""
    _, _, bench, _ = h200
    ops = rendered(h200)
    queries = dashboard_queries(render_dashboard(target(bench.config_hash), ops,
                                                 OPS.evaluation.window))
    assert len(queries) >= 6
    for name, exprs in (("ok", queries), ("broken", [queries[0] + ")"])):
        path = tmp_path / f"{name}.yml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
            {"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]}]}))
        proc = _promtool("check", "rules", str(path))
        assert (proc.returncode == 0) == (name == "ok"), proc.stdout + proc.stderr


# ---- a node type deployed as an LLMInferenceService ----

def test_an_llm_inference_service_is_scraped_and_scaled_as_kserve_runs_it(h200):
    """Its engine runs in KServe's workload pods on port 8000, and its own `scaling` field (the
    Workload Variant Autoscaler) scales it: no second ScaledObject, the measured target said in
    `not rendered` and drawn on the dashboard."""
    configs, slo, bench, m = h200
    t = dataclasses.replace(target(bench.config_hash), llm_inference_service=True)
    ops = render_operations(t, m, slo, bench, limits(configs, "h200"), OPS)
    assert ops.scaled_object is None
    assert "scales through its own `scaling` field" in ops.skipped["ScaledObject"]
    assert "measured saturation concurrency 64" in ops.skipped["ScaledObject"]
    assert {x.name for x in ops.thresholds} >= {"queue_target_per_replica"}
    endpoint = ops.engine_monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["targetPort"] == 8000
    assert ops.engine_monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/part-of": "llminferenceservice",
        "app.kubernetes.io/name": f"{t.service}-llm", "kserve.io/component": "workload"}
    validator = ManifestValidator(crd_paths=CRDS)
    assert all(validator.validate(d) == [] for d in ops.docs)


@pytest.mark.slow
def test_the_llm_inference_service_scaling_field_is_kserves():
    """deploy.yaml's replicas as KServe v0.20.0's LLMInferenceService takes them: a fixed count
    is `replicas`, a range `scaling` (min/max, WVA with the KEDA actuator); valid against the
    pinned CRD's schema and its CEL rules, which the schema validator does not run."""
    from onboarding.deploy.observability import llm_inference_service_replicas

    crd = PROJECT_ROOT / "deploy" / "kserve-crds" / "serving.kserve.io_llminferenceservices.yaml"
    validator = ManifestValidator(crd_paths=[str(crd)])
    assert llm_inference_service_replicas(1, 1) == {"replicas": 1}
    ranged = llm_inference_service_replicas(0, 4)
    assert ranged == {"scaling": {"minReplicas": 1, "maxReplicas": 4, "wva": {"keda": {}}}}
    for fields in ({"replicas": 1}, ranged):
        doc = {"apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
               "metadata": {"name": "m-b300-llm", "namespace": "models"},
               "spec": {"model": {"uri": "s3://b/m/", "name": "m"}, **fields}}
        assert validator.validate(doc) == [], fields
    # the CRD's x-kubernetes-validations, by hand: replicas xor scaling; wva with exactly one
    # actuator; minReplicas <= maxReplicas
    rules = yaml.safe_load(crd.read_text())["spec"]["versions"]
    text = json.dumps(rules)
    for rule in ("!(has(self.replicas) && has(self.scaling))", "has(self.wva)",
                 "has(self.hpa) || has(self.keda)", "!(has(self.hpa) && has(self.keda))",
                 "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas"):
        assert rule in text, rule
    s = ranged["scaling"]
    assert "replicas" not in ranged and "wva" in s and list(s["wva"]) == ["keda"]
    assert s["minReplicas"] <= s["maxReplicas"]
    bad = {**ranged["scaling"], "maxReplicas": 0}
    doc["spec"] = {"model": {"uri": "s3://b/m/", "name": "m"}, "scaling": bad}
    assert any("maxReplicas" in e for e in validator.validate(doc))
