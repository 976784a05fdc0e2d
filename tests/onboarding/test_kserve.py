"""Manifest rendering: goldens for a dense and an MoE model on B300 and H200, names, probes,
env switches, storage, secrets and the gateway route table.

Regenerate goldens after an intended change with `UPDATE_GOLDEN=1 pytest tests/onboarding/test_kserve.py`
and review the diff.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

import pytest
import yaml

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import PublishedVariant
from onboarding.deploy.kserve import (
    ISVC_NAME_MAX,
    RenderInputs,
    inline_secret_findings,
    load_deploy,
    pod_qos_class,
    predicted_pod,
    render,
    route_table,
    service_name,
    startup_probe_plan,
    storage_for,
    to_yaml,
)
from onboarding.deploy.plan import Measured, load_nodes, plan, plan_inputs, shape_from_hint
from onboarding.deploy.serving_plan import serving_plan
from onboarding.fetch.catalog import load_catalog
from onboarding.serving.engine_config import evidence
from onboarding.serving.stack import load_stack
from onboarding.serving.stats import LoadTimingResult
from tests.conftest import assert_golden

CONFIGS = PROJECT_ROOT / "configs"
GOLDEN = PROJECT_ROOT / "tests" / "golden"
NODES = load_nodes(CONFIGS / "nodes.yaml")
DEPLOY = load_deploy(CONFIGS / "deploy.yaml")
# A fixed fingerprint: goldens pin the rendering, not the current versions: section.
STACK = dataclasses.replace(load_stack(CONFIGS / "stack.yaml"), fingerprint="0123456789ab")
CATALOG = load_catalog(CONFIGS / "models")
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

NOTHING_MEASURED = Measured()


def configured(model_id: str, node_type: str, spec=None, stack=STACK,
               measured: Measured = NOTHING_MEASURED):
    spec = spec or CATALOG[model_id]
    shape = shape_from_hint(spec.architecture, f"catalog {spec.id}")
    p = plan(plan_inputs(spec, NODES, shape, measured), NODES)
    splan = serving_plan(spec, p, NODES, stack)
    return spec, p, splan.config(node_type)


def rendered(model_id: str, node_type: str, measured: Measured = NOTHING_MEASURED, spec=None,
             deploy=DEPLOY, stack=STACK, cold_p95_s: float | None = None,
             published: dict | None = None):
    """The manifest of one model on one node type; `cold_p95_s`: a load timing measured at
    exactly this configuration (its hash, this node type)."""
    spec, p, config = configured(model_id, node_type, spec, stack, measured)
    timing = None if cold_p95_s is None else LoadTimingResult(model=spec.id,
                                                              precision=config.precision,
                                                              servable=True, reason="",
                                                              cold_start_p50_s=cold_p95_s,
                                                              cold_start_p95_s=cold_p95_s,
                                                              node_type=node_type,
                                                              config_hash=config.hash)
    return render(RenderInputs(
        spec=spec, plan=p, node_type=node_type, node=NODES.node_types[node_type], stack=stack,
        deploy=deploy, config=config, evidence=evidence(config, timing, None),
        storage=storage_for(spec, config.precision, "bf16", deploy, published)))


def isvc(r):
    return next(d for d in r.docs if d["kind"] == "InferenceService")


@pytest.mark.parametrize("model_id", ["llama-3-1-70b-instruct", "qwen3-235b-a22b-instruct"])
@pytest.mark.parametrize("node_type", ["b300", "h200"])
def test_golden_manifests(model_id: str, node_type: str):
    text = to_yaml(rendered(model_id, node_type).docs)
    assert_golden(GOLDEN / f"{model_id}-{node_type}.yaml", text,
                  f"rendering of {model_id} on {node_type} changed")


def test_golden_manifest_from_the_node_cache():
    """A published variant on a node type with a cache: LocalModelNodeGroup, LocalModelCache and
    the InferenceService whose storageUri KServe's defaulter matches."""
    _, _, config = configured("qwen3-235b-a22b-instruct", "b300")
    pub = dataclasses.replace(_published("qwen3-235b-a22b-instruct", config.precision),
                              total_bytes=134 * 10**9)  # Qwen3-235B NVFP4's order of size
    text = to_yaml(rendered("qwen3-235b-a22b-instruct", "b300", cold_p95_s=300.0,
                            published={config.precision: pub}).docs)
    assert_golden(GOLDEN / "qwen3-235b-a22b-instruct-b300-cached.yaml", text,
                  "rendering of the cached qwen3 manifest on b300 changed")


def test_gpu_resources_selector_toleration_and_shm_follow_the_plan():
    for node_type, tp in (("b300", 1), ("h200", 2)):
        doc = isvc(rendered("llama-3-1-70b-instruct", node_type))
        pred = doc["spec"]["predictor"]
        res = pred["model"]["resources"]
        # requests = limits for cpu, memory and GPUs (Guaranteed); ephemeral-storage is a
        # request only (the storage initializer's download)
        assert {k: v for k, v in res["requests"].items() if k != "ephemeral-storage"} == \
            res["limits"]
        assert res["limits"]["nvidia.com/gpu"] == str(tp)
        assert f"--tensor-parallel-size={tp}" in pred["model"]["args"]
        product = NODES.node_types[node_type].gpu_product
        assert pred["nodeSelector"] == {"nvidia.com/gpu.product": product}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
            pred["tolerations"]
        assert doc["metadata"]["labels"]["model-onboarding.io/tensor-parallel"] == str(tp)
        if tp > 1:
            assert pred["volumes"][0]["emptyDir"] == {
                "medium": "Memory", "sizeLimit": f"{DEPLOY.shm_gib_per_gpu * tp}Gi"}
            assert pred["model"]["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
        else:
            assert "volumes" not in pred and "volumeMounts" not in pred["model"]


def _model(r):
    return isvc(r)["spec"]["predictor"]["model"]


def test_no_kernel_choice_flag_unless_benchmarked_or_pinned():
    """vLLM's `auto` MoE backend tries FlashInfer TRT-LLM-gen before CUTLASS and
    falls back; a named backend raises on a shape it does not support (vllm
    model_executor/layers/fused_moe/oracle/). The shipped stack pins none, so none renders."""
    assert STACK.engine_version == "0.32.0"
    qwen_b300 = _model(rendered("qwen3-235b-a22b-instruct", "b300"))
    assert not any(a.startswith("--moe-backend") for a in qwen_b300["args"])
    assert not any(e["name"].startswith("VLLM_USE_FLASHINFER") for e in qwen_b300.get("env", []))
    annotations = isvc(rendered("qwen3-235b-a22b-instruct", "b300"))["metadata"]["annotations"]
    assert "model-onboarding.io/engine-switches" not in annotations


def _pinned(stack, reason="benchmarked at configuration abc on b300 (docs/gpu.md)"):
    return dataclasses.replace(stack, switches=tuple(
        s.model_copy(update={"pinned": reason}) if s.kernel_choice else s
        for s in stack.switches))


def test_a_pinned_moe_backend_renders_only_for_quantized_moe_on_blackwell():
    stack = _pinned(STACK)
    qwen_b300 = _model(rendered("qwen3-235b-a22b-instruct", "b300", stack=stack))
    assert "--moe-backend=flashinfer_cutlass" in qwen_b300["args"]
    assert "--moe-backend=flashinfer_cutlass" not in _model(rendered(
        "qwen3-235b-a22b-instruct", "h200", stack=stack))["args"]  # Hopper: engine default
    assert not any(a.startswith("--moe-backend") for a in _model(
        rendered("llama-3-1-70b-instruct", "b300", stack=stack))["args"])  # dense
    annotation = isvc(rendered("qwen3-235b-a22b-instruct", "b300", stack=stack))["metadata"][
        "annotations"]["model-onboarding.io/engine-switches"]
    assert "--moe-backend=flashinfer_cutlass: FlashInfer" in annotation
    assert "pinned: benchmarked at configuration abc" in annotation


def test_a_kernel_choice_switch_pinned_without_a_reason_is_refused(tmp_path: Path):
    data = yaml.safe_load((CONFIGS / "stack.yaml").read_text())
    data["engine_switches"][0]["pinned"] = " "
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="pinned"):
        load_stack(path)


def test_switches_are_keyed_by_engine_version():
    """The same model and node on a seed-era vLLM gets the env switch, not the flag."""
    old = _pinned(dataclasses.replace(STACK, engine_version="0.20.0"))
    model = _model(rendered("qwen3-235b-a22b-instruct", "b300", stack=old))
    assert {"name": "VLLM_USE_FLASHINFER_MOE_FP4", "value": "1"} in model["env"]
    assert not any(a.startswith("--moe-backend") for a in model["args"])


def test_vllm_is_started_with_vllm_serve_and_the_model_as_positional():
    r = rendered("llama-3-1-70b-instruct", "h200")
    assert r.docs[0]["spec"]["containers"][0]["command"] == ["vllm", "serve"]
    args = _model(r)["args"]
    assert args[0] == "/mnt/models" and not any(a.startswith("--model=") for a in args)


def test_sglang_serves_metrics_where_the_runtime_advertises_them():
    sglang = dataclasses.replace(STACK, engine="sglang", engine_version="0.5.9",
                                 images={"sm90": "docker.io/lmsysorg/sglang:v0.5.9-cu129",
                                         "sm103": "docker.io/lmsysorg/sglang:v0.5.9-cu130"})
    r = rendered("llama-3-1-70b-instruct", "h200", stack=sglang)
    assert r.docs[0]["spec"]["annotations"]["prometheus.kserve.io/path"] == "/metrics"
    assert "--enable-metrics" in _model(r)["args"]


@pytest.mark.parametrize(("kserve", "configured", "rendered_mode"), [
    ("0.16.0", "RawDeployment", "Standard"), ("0.16.0", "Standard", "Standard"),
    ("0.15.2", "Standard", "RawDeployment"), ("0.15.2", "RawDeployment", "RawDeployment"),
    ("0.16.0", "Serverless", "Knative"), ("0.14.0", "Knative", "Serverless"),
])
def test_deployment_mode_is_spelled_for_the_kserve_version(kserve, configured, rendered_mode):
    deploy = DEPLOY.model_copy(update={"deployment_mode": configured})
    stack = dataclasses.replace(STACK, kserve_version=kserve)
    r = rendered("llama-3-1-70b-instruct", "h200", deploy=deploy, stack=stack)
    assert isvc(r)["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == rendered_mode


def test_pod_qos_counts_the_storage_initializer():
    """An s3:// model gets KServe's storage-initializer init container, whose default requests
    differ from its limits: the pod is Burstable and the manifest says so and why."""
    r = rendered("llama-3-1-70b-instruct", "h200")
    pod = predicted_pod(isvc(r), DEPLOY)
    assert [c["name"] for c in pod["initContainers"]] == ["storage-initializer"]
    assert pod_qos_class(pod)[0] == "Burstable"
    assert isvc(r)["metadata"]["labels"]["model-onboarding.io/qos-class"] == "Burstable"
    why = isvc(r)["metadata"]["annotations"]["model-onboarding.io/qos-class"]
    assert "storage-initializer" in why and "100m" in why
    # The initializer sized requests = limits (the cluster's ConfigMap): Guaranteed.
    equal = DEPLOY.model_copy(update={"storage_initializer": DEPLOY.storage_initializer.model_copy(
        update={"cpu_request": "1", "memory_request": "1Gi"})})
    r2 = rendered("llama-3-1-70b-instruct", "h200", deploy=equal)
    assert pod_qos_class(predicted_pod(isvc(r2), equal))[0] == "Guaranteed"
    # A pvc:// variant mounted directly has no initializer at all.
    pvc = DEPLOY.model_copy(update={
        "storage": DEPLOY.storage.model_copy(update={
            "variants_uri": "pvc://model-cache/{model}/{precision}/"}),
        "storage_initializer": DEPLOY.storage_initializer.model_copy(
            update={"direct_pvc_mount": True})})
    r3 = rendered("llama-3-1-70b-instruct", "b300", deploy=pvc)
    assert _model(r3)["storageUri"].startswith("pvc://")
    assert "initContainers" not in predicted_pod(isvc(r3), pvc)
    assert isvc(r3)["metadata"]["labels"]["model-onboarding.io/qos-class"] == "Guaranteed"


def test_qos_class_rules():
    guaranteed = {"containers": [{"name": "a", "resources": {
        "requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}}]}
    assert pod_qos_class(guaranteed)[0] == "Guaranteed"
    only_limits = {"containers": [{"name": "a", "resources": {
        "limits": {"cpu": "2", "memory": "1Gi"}}}]}
    assert pod_qos_class(only_limits)[0] == "Guaranteed"  # requests default to limits
    assert pod_qos_class({"containers": [{"name": "a"}]})[0] == "BestEffort"
    no_memory = {"containers": [{"name": "a", "resources": {"limits": {"cpu": "2"}}}]}
    assert pod_qos_class(no_memory) == (
        "Burstable", "container a: memory request unset != limit unset")


def test_gpu_annotation_claims_no_gpu_ids_or_numa_node():
    note = isvc(rendered("llama-3-1-70b-instruct", "b300"))["metadata"]["annotations"][
        "model-onboarding.io/gpus"]
    assert "device plugin picks" in note and "NUMA node(s)" not in note


def test_stack_image_per_architecture():
    b300 = rendered("llama-3-1-70b-instruct", "b300")
    h200 = rendered("llama-3-1-70b-instruct", "h200")
    image = {r.node_type: r.docs[0]["spec"]["containers"][0]["image"] for r in (b300, h200)}
    assert image["b300"] == STACK.images["sm103"] and not image["b300"].endswith("-cu130")
    assert image["h200"] == STACK.images["sm90"]
    assert isvc(b300)["spec"]["predictor"]["model"]["runtime"] == b300.docs[0]["metadata"]["name"]


def test_probes_from_measured_cold_start_and_a_labelled_default():
    cfg = DEPLOY.probes
    measured = startup_probe_plan(300.0, cfg)
    assert measured.basis == "measured"
    assert measured.failure_threshold * cfg.period_s >= cfg.safety_factor * 300.0
    assert measured.failure_threshold == -(-int(cfg.safety_factor * 300) // cfg.period_s)
    short = startup_probe_plan(1.0, cfg)
    assert short.window_s >= cfg.min_startup_s
    default = startup_probe_plan(None, cfg)
    assert default.basis == "default" and default.window_s >= cfg.unmeasured_startup_s
    assert "never load-timed" in default.explanation

    r = rendered("llama-3-1-70b-instruct", "h200", cold_p95_s=300.0)
    probe = isvc(r)["spec"]["predictor"]["model"]["startupProbe"]
    assert probe["failureThreshold"] == measured.failure_threshold
    assert isvc(r)["metadata"]["labels"]["model-onboarding.io/probe-basis"] == "measured"
    assert "300.0 s" in isvc(r)["metadata"]["annotations"]["model-onboarding.io/startup-probe"]


@pytest.mark.parametrize("model_id", [
    "Meta-Llama/Llama-3.1-70B_Instruct", "3B.Model/With.Dots", "a" * 80, "x--y__Z",
])
def test_any_model_id_becomes_a_valid_service_name(model_id: str):
    for node in ("b300", "h200"):
        name = service_name(model_id, node)
        assert DNS1035.match(name) and len(name) <= ISVC_NAME_MAX, name
        assert name.endswith(f"-{node}")


def test_long_ids_sharing_a_prefix_do_not_collide():
    a, b = "org/" + "x" * 70 + "-one", "org/" + "x" * 70 + "-two"
    assert service_name(a, "b300") != service_name(b, "b300")


def test_storage_is_the_published_variant_or_says_unpublished():
    spec = CATALOG["llama-3-1-70b-instruct"].model_copy(
        update={"source": "hf://meta-llama/Llama-3.1-70B-Instruct@abc123"})
    src = storage_for(spec, "bf16", "bf16", DEPLOY, None)
    assert src.uri == "hf://meta-llama/Llama-3.1-70B-Instruct:abc123" and not src.published
    nvfp4 = storage_for(spec, "nvfp4", "bf16", DEPLOY, None)
    assert nvfp4.uri == DEPLOY.storage.variants_uri.format(model=spec.id, precision="nvfp4")
    assert not nvfp4.published and "unpublished" in nvfp4.why
    pub = PublishedVariant(model=spec.id, precision="nvfp4",
                           uri="s3://model-serving/m/nvfp4/0123456789abcdef/",
                           content_hash="0123456789abcdef" * 4, total_bytes=40 * 10**9, files=12,
                           skipped=False, read_back_bytes=2 * 10**9, read_back_s=1.0)
    chosen = storage_for(spec, "nvfp4", "bf16", DEPLOY, {"nvfp4": pub})
    assert chosen.uri == pub.uri and chosen.published
    assert chosen.pull_s == pytest.approx(20.0)  # 40 GB at the 2 GB/s measured reading back
    s3 = spec.model_copy(update={"source": "s3://models/llama/"})
    assert storage_for(s3, "bf16", "bf16", DEPLOY, None).uri == "s3://models/llama/"


def test_the_startup_probe_counts_the_derived_pull_of_the_published_variant():
    spec, _, config = configured("llama-3-1-70b-instruct", "h200")
    pub = PublishedVariant(model=spec.id, precision=config.precision,
                           uri="s3://model-serving/x/fp8/0123/", content_hash="0123",
                           total_bytes=70 * 10**9, files=20, skipped=False, read_back_bytes=10**9,
                           read_back_s=1.0)
    no_cache = DEPLOY.model_copy(update={"local_model_cache": DEPLOY.local_model_cache.model_copy(
        update={"node_types": {}})})
    r = rendered("llama-3-1-70b-instruct", "h200", cold_p95_s=100.0,
                 published={config.precision: pub}, deploy=no_cache)
    cfg = DEPLOY.probes
    window = max(cfg.min_startup_s, math.ceil(cfg.safety_factor * (100.0 + 70.0)))
    assert r.startup.window_s == -(-window // cfg.period_s) * cfg.period_s
    assert "derived pull 70.0 s" in r.startup.explanation
    # from the node cache (h200 has one in deploy.yaml) the window drops the pull, and says so
    cached = rendered("llama-3-1-70b-instruct", "h200", cold_p95_s=100.0,
                      published={config.precision: pub})
    assert cached.startup.window_s == max(cfg.min_startup_s, 200)
    assert "cached on the node" in cached.startup.explanation
    labels = isvc(r)["metadata"]["labels"]
    assert labels["model-onboarding.io/published"] == "true"
    assert labels["model-onboarding.io/measured"] == "true"


def test_credentials_only_by_reference(monkeypatch):
    secret = "AKIA-very-secret-value-123"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", "hf_" + "q" * 30)
    spec = CATALOG["llama-3-1-70b-instruct"].model_copy(update={"precision_ladder": ["bf16"]})
    r = rendered(spec.id, "h200", spec=spec)
    text = to_yaml(r.docs)
    assert secret not in text and "hf_qqqq" not in text
    assert inline_secret_findings(list(r.docs), (secret, os.environ["HF_TOKEN"])) == []
    doc = isvc(r)
    assert doc["spec"]["predictor"]["serviceAccountName"] == DEPLOY.service_account
    # the storage initializer reads the source with the service account's secrets (kserve
    # v0.20.0 pkg/credentials/service_account_credentials.go, HF_TOKEN among them); the engine
    # container, which runs offline, gets no token
    assert r.docs and doc["spec"]["predictor"]["model"]["storageUri"].startswith("hf://")
    assert "HF_TOKEN" not in {e["name"] for e in doc["spec"]["predictor"]["model"]["env"]}


def test_secret_finder_flags_inline_credentials():
    bad = {"spec": {"containers": [{"env": [{"name": "HF_TOKEN", "value": "hf_abc"}],
                                    "args": ["--api-key=sk-123", "--port=8080"]}]},
           "note": "prefix-LEAKEDVALUE99-suffix"}
    found = inline_secret_findings(bad, ("LEAKEDVALUE99",))
    assert any("env HF_TOKEN" in f for f in found)
    assert any("--api-key" in f for f in found)
    assert any("$.note" in f for f in found)


def test_credential_in_engine_args_is_refused():
    spec = CATALOG["llama-3-1-70b-instruct"]
    bad = spec.model_copy(update={"engine_args": {**spec.engine_args, "hf_token": "hf_x"}})
    with pytest.raises(ConfigError, match="credential"):
        rendered(spec.id, "b300", spec=bad)


def test_plan_owned_engine_args_are_refused():
    spec = CATALOG["llama-3-1-70b-instruct"]
    bad = spec.model_copy(update={"engine_args": {"tensor_parallel_size": 8}})
    with pytest.raises(ConfigError, match="set by the deployment plan and the launcher"):
        rendered(spec.id, "b300", spec=bad)


def test_engine_args_pass_through_after_the_plan():
    args = isvc(rendered("qwen3-235b-a22b-instruct", "h200"))["spec"]["predictor"]["model"]["args"]
    assert "--enable-expert-parallel" in args
    assert "--max-model-len=16384" in args and "--tensor-parallel-size=4" in args


def test_sglang_gets_its_own_flags():
    stack = dataclasses.replace(STACK, engine="sglang", engine_version="0.5.9",
                                images={"sm90": "lmsysorg/sglang:v0.5.9-cu129"})
    r = rendered("llama-3-1-70b-instruct", "h200", stack=stack)
    args = isvc(r)["spec"]["predictor"]["model"]["args"]
    assert "--tp-size=2" in args and "--mem-fraction-static=0.9" in args
    assert r.docs[0]["spec"]["containers"][0]["command"][-1] == "sglang.launch_server"


def test_infeasible_node_type_is_not_rendered():
    base = CATALOG["llama-3-1-70b-instruct"]
    spec = base.model_copy(update={"precision_ladder": ["bf16"], "slo": base.slo.model_copy(
        update={"target_concurrency": 100000})})
    _, p, config = configured(spec.id, "h200", spec=spec)
    assert config is None and not p.node("h200").feasible  # no configuration, no manifest


def test_image_tag_must_carry_the_engine_version(tmp_path: Path):
    data = yaml.safe_load((CONFIGS / "stack.yaml").read_text())
    data["images"]["vllm"]["tags"][0]["cuda"][13] = "latest"
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"\{version\}"):
        load_stack(path)


def test_stack_fingerprint_follows_content(tmp_path: Path):
    data = yaml.safe_load((CONFIGS / "stack.yaml").read_text())
    a = tmp_path / "a.yaml"
    a.write_text(yaml.safe_dump(data))
    data["versions"]["nccl"] = "9.9.9"
    b = tmp_path / "b.yaml"
    b.write_text(yaml.safe_dump(data))
    assert load_stack(a).fingerprint != load_stack(b).fingerprint


def test_route_table_groups_node_types_under_one_model_name():
    routes = [rendered("llama-3-1-70b-instruct", nt).route for nt in ("h200", "b300")]
    routes.append(rendered("qwen3-235b-a22b-instruct", "b300").route)
    table = route_table(routes, DEPLOY)
    names = [m["model_name"] for m in table["model_list"]]
    assert names.count(CATALOG["llama-3-1-70b-instruct"].served_name) == 2
    bases = {m["litellm_params"]["api_base"] for m in table["model_list"]}
    assert len(bases) == 3
    for m in table["model_list"]:
        svc = m["model_info"]["id"].split("/")[1]
        assert m["litellm_params"]["api_base"] == (
            f"http://{svc}-predictor.{DEPLOY.namespace}.{DEPLOY.gateway.cluster_domain}/v1")
        assert m["litellm_params"]["model"].startswith(f"{DEPLOY.gateway.provider}/")


def test_a_start_p95_from_fewer_than_three_starts_is_labelled_and_the_probe_uses_the_max():
    """A p95 of one start is that start; below 3 starts the probe is sized from the
    maximum x margin, and the annotation says n."""
    from onboarding.serving.stats import StartSample, summarize_load_timing

    starts = [StartSample(kind="fully_cold", resident_fraction=0.0, weights_loaded_s=10.0,
                          engine_weights_load_s=9.0, health_ready_s=50.0, first_token_s=100.0),
              StartSample(kind="fully_cold", resident_fraction=0.0, weights_loaded_s=10.0,
                          engine_weights_load_s=9.0, health_ready_s=50.0, first_token_s=140.0)]
    timing = summarize_load_timing("m", "bf16", starts, 10**9, None)
    assert (timing.cold_start_samples, timing.cold_start_max_s) == (2, 140.0)
    cfg = DEPLOY.probes
    plan2 = startup_probe_plan(timing.cold_start_p95_s, cfg, samples=2, max_s=140.0)
    assert "max 140.0 s (n=2" in plan2.explanation and "p95" not in plan2.explanation
    assert plan2.window_s >= cfg.safety_factor * 140.0
    plan3 = startup_probe_plan(120.0, cfg, samples=3, max_s=140.0)
    assert "p95 120.0 s (n=3)" in plan3.explanation


def _published(model: str, precision: str) -> PublishedVariant:
    return PublishedVariant(model=model, precision=precision,
                            uri=f"s3://model-serving/{model}/{precision}/abc/", content_hash="abc",
                            total_bytes=10**9, files=3, skipped=False, bytes_uploaded=0,
                            read_back_bytes=10**8, read_back_s=0.1)


def _benched(model_id: str, node_type: str, e2e_p99_s: float, ttft_p99_s: float,
             published: bool = True):
    """A manifest benchmarked at exactly its configuration (gpu profile), published or not."""
    from onboarding.serving.stats import ServingBenchmarkResult

    spec, p, config = configured(model_id, node_type)
    bench = ServingBenchmarkResult(model=spec.id, precision=config.precision, node_type=node_type,
                                   gpus=config.tensor_parallel, servable=True,
                                   tokens_per_s_per_gpu=900.0, saturation_concurrency=32,
                                   slo_pass=True, slo_violations=(), config_hash=config.hash,
                                   slo_blocking=True)
    bench = dataclasses.replace(bench, e2e_p99_s=e2e_p99_s, ttft_p99_s=ttft_p99_s)
    pub = {config.precision: _published(spec.id, config.precision)} if published else None
    return render(RenderInputs(spec=spec, plan=p, node_type=node_type,
                               node=NODES.node_types[node_type], stack=STACK, deploy=DEPLOY,
                               config=config, evidence=evidence(config, None, bench),
                               storage=storage_for(spec, config.precision, "bf16", DEPLOY, pub)))


def test_route_timeouts_come_from_the_measured_e2e_and_ttft_not_a_constant():
    """LiteLLM's `timeout` limits the whole response (LiteLLM proxy docs,
    timeouts); a 2,048-token codegen answer at 30 ms/token needs 61 s, so the route's timeout
    is the measured E2E p99 at the target concurrency x margin, `stream_timeout` the TTFT's."""
    r = _benched("llama-3-1-70b-instruct", "h200", e2e_p99_s=61.4, ttft_p99_s=2.2)
    [entry] = route_table([r.route], DEPLOY)["model_list"]
    gw = DEPLOY.gateway
    assert entry["litellm_params"].get("timeout") == math.ceil(61.4 * gw.timeout_margin)
    assert entry["litellm_params"].get("stream_timeout") == max(
        math.ceil(2.2 * gw.stream_timeout_margin), gw.min_stream_timeout_s)
    assert "E2E p99 61.4 s" in entry["model_info"]["timeout_basis"]
    slow = _benched("llama-3-1-70b-instruct", "h200", e2e_p99_s=200.0, ttft_p99_s=45.0)
    [entry] = route_table([slow.route], DEPLOY)["model_list"]
    assert entry["litellm_params"]["stream_timeout"] == math.ceil(45.0 * gw.stream_timeout_margin)


def test_routes_only_to_what_is_published_and_measured():
    from onboarding.deploy.kserve import split_routes

    ok = _benched("llama-3-1-70b-instruct", "h200", 61.4, 2.2).route
    unpublished = _benched("llama-3-1-70b-instruct", "b300", 61.4, 2.2, published=False).route
    _, _, q = configured("qwen3-235b-a22b-instruct", "h200")
    unmeasured = rendered("qwen3-235b-a22b-instruct", "h200", published={
        q.precision: _published("qwen3-235b-a22b-instruct", q.precision)}).route
    routed, not_routed = split_routes([ok, unpublished, unmeasured], require_measured=True)
    assert routed == [ok]
    assert "not published" in not_routed[f"{DEPLOY.namespace}/{unpublished.service}"]
    assert "not measured at configuration" in not_routed[
        f"{DEPLOY.namespace}/{unmeasured.service}"]
    routed, _ = split_routes([ok, unpublished, unmeasured], require_measured=False)
    assert routed == [ok, unmeasured]


# ---- Weights from the node cache (KServe LocalModelCache) ---------------------

def _storage_key(uri: str) -> str:
    """kserve pkg/apis/serving/v1alpha1/local_model_cache_types.go GetStorageKey."""
    import hashlib

    return hashlib.sha256(uri.encode()).hexdigest()[:16]


def _webhook_matches(cached: str, storage: str) -> bool:
    """kserve pkg/apis/serving/v1alpha1/storage_uri_utils.go MatchStorageURI, as written."""
    cached, storage = cached.rstrip("/"), storage.rstrip("/")
    return storage == cached or (storage.startswith(cached) and storage[len(cached)] == "/")


def test_a_published_variant_deploys_from_the_node_cache_not_a_download():
    _, _, config = configured("llama-3-1-70b-instruct", "b300")
    pub = _published("llama-3-1-70b-instruct", config.precision)
    r = rendered("llama-3-1-70b-instruct", "b300", published={config.precision: pub},
                 cold_p95_s=100.0)
    kinds = [d["kind"] for d in r.docs]
    assert "LocalModelNodeGroup" in kinds and "LocalModelCache" in kinds
    group = next(d for d in r.docs if d["kind"] == "LocalModelNodeGroup")
    cache = next(d for d in r.docs if d["kind"] == "LocalModelCache")
    svc = isvc(r)
    # the ISVC defaulter (kserve pkg/apis/serving/v1beta1/inference_service_defaults.go
    # setLocalModelLabel) matches storageUri to sourceModelUri and the nodegroup annotation
    assert _webhook_matches(cache["spec"]["sourceModelUri"], _model(r)["storageUri"])
    assert svc["metadata"]["annotations"]["serving.kserve.io/nodegroup"] == \
        group["metadata"]["name"] == cache["spec"]["nodeGroups"][0]
    assert cache["spec"]["modelSize"] == f"{math.ceil(pub.total_bytes / 2**30)}Gi"
    # the agent fills <PV root>/models/<storage key>/ (kserve pkg/controller/v1alpha1/
    # localmodelnode/controller.go launchJob SubPath; its hostPath is the same root)
    root = DEPLOY.local_model_cache.node_types["b300"].cache_root
    assert group["spec"]["persistentVolumeSpec"]["local"]["path"] == root
    from onboarding.deploy.kserve import agent_model_dir
    assert agent_model_dir(root, pub.uri) == f"{root}/models/{_storage_key(pub.uri)}"
    # the pod mounts the PVC: no storage initializer (only the node-cache gate), no pull in the
    # startup window
    assert [c["name"] for c in predicted_pod(svc, DEPLOY, cached=True)["initContainers"]] == [
        "wait-for-node-cache"]
    assert "cached on the node by LocalModelCache: no pull" in r.startup.explanation
    assert "derived pull" not in r.startup.explanation
    assert "no pod downloads at start" in svc["metadata"]["annotations"][
        "model-onboarding.io/weights-on-node"]


def test_without_a_node_cache_the_pod_requests_ephemeral_storage_for_the_weights():
    import dataclasses as dc

    deploy = DEPLOY.model_copy(update={"local_model_cache": DEPLOY.local_model_cache.model_copy(
        update={"node_types": {}})})
    _, p, config = configured("llama-3-1-70b-instruct", "b300")
    pub = _published("llama-3-1-70b-instruct", config.precision)
    r = rendered("llama-3-1-70b-instruct", "b300", published={config.precision: pub},
                 deploy=deploy)
    assert not {"LocalModelCache", "LocalModelNodeGroup"} & {d["kind"] for d in r.docs}
    req = _model(r)["resources"]["requests"]["ephemeral-storage"]
    es = deploy.ephemeral_storage
    want = math.ceil(pub.total_bytes * (1 + es.margin) / 2**30) + es.extra_gib
    assert req == f"{want}Gi"
    del dc, p


# ---- A second deployment target, KServe's LLMInferenceService (llm-d) --------------

def test_llm_inference_service_is_rendered_from_the_same_configuration():
    """Where deploy.yaml asks for it, the LLMInferenceService replaces the InferenceService (one
    serving object per model and node type) and carries the same configuration, labels and
    nodegroup annotation; the preset's launcher sets the model path, port 8000, served name and
    TP (kserve v0.20.0 config/llmisvcconfig/config-llm-template.yaml), so they are not args."""
    _, _, config = configured("qwen3-235b-a22b-instruct", "b300")
    pub = _published("qwen3-235b-a22b-instruct", config.precision)
    deploy = DEPLOY.model_copy(update={"llm_inference_service_node_types": ["b300"]})
    r = rendered("qwen3-235b-a22b-instruct", "b300", published={config.precision: pub},
                 deploy=deploy, cold_p95_s=300.0)
    kinds = [d["kind"] for d in r.docs]
    assert "LLMInferenceService" in kinds
    assert "InferenceService" not in kinds and "ServingRuntime" not in kinds, kinds
    llm = next(d for d in r.docs if d["kind"] == "LLMInferenceService")
    svc = isvc(rendered("qwen3-235b-a22b-instruct", "b300", published={config.precision: pub},
                        cold_p95_s=300.0))
    model = svc["spec"]["predictor"]["model"]
    main = llm["spec"]["template"]["containers"][0]
    assert main["name"] == "main" and main["image"] == config.image and "command" not in main
    assert main["args"] == [a for a in model["args"][1:]
                            if not a.startswith(("--port=", "--served-model-name=",
                                                 "--tensor-parallel-size="))]
    assert main["resources"] == model["resources"]
    assert main["startupProbe"]["httpGet"]["port"] == 8000
    assert main["startupProbe"]["failureThreshold"] == model["startupProbe"]["failureThreshold"]
    assert llm["spec"]["model"]["uri"] == model["storageUri"]
    assert llm["spec"]["parallelism"]["tensor"] == config.tensor_parallel
    for k in ("measured", "published", "config-hash"):
        key = f"model-onboarding.io/{k}"
        assert llm["metadata"]["labels"][key] == svc["metadata"]["labels"][key]
    # the LLMInferenceService defaulter matches the node cache the same way
    # (kserve pkg/webhook/admission/llminferenceservice/defaulter.go SetLocalModelLabel)
    assert llm["metadata"]["annotations"]["serving.kserve.io/nodegroup"] == "b300-nvme-cache"
    assert r.route.via_router
    h200 = rendered("qwen3-235b-a22b-instruct", "h200", deploy=deploy)
    assert "LLMInferenceService" not in [d["kind"] for d in h200.docs]  # not asked for there


def test_golden_llm_inference_service():
    _, _, config = configured("qwen3-235b-a22b-instruct", "b300")
    pub = dataclasses.replace(_published("qwen3-235b-a22b-instruct", config.precision),
                              total_bytes=134 * 10**9)
    deploy = DEPLOY.model_copy(update={"llm_inference_service_node_types": ["b300"]})
    text = to_yaml(rendered("qwen3-235b-a22b-instruct", "b300", cold_p95_s=300.0, deploy=deploy,
                            published={config.precision: pub}).docs)
    assert_golden(GOLDEN / "qwen3-235b-a22b-instruct-b300-llm.yaml", text,
                  "rendering of the qwen3 LLMInferenceService on b300 changed")


def test_one_local_model_cache_per_published_variant_across_node_types():
    """KServe refuses a second LocalModelCache with the same sourceModelUri (kserve
    pkg/webhook/admission/localmodelcache/localmodelcache_validator.go ValidateCreate): a variant
    served on two node types is one cache whose nodeGroups hold both, the same document in
    both files."""
    from onboarding.deploy.serving_plan import render_targets

    spec = CATALOG["llama-3-1-70b-instruct"].model_copy(update={"precision_ladder": ["fp8"]})
    p = plan(plan_inputs(spec, NODES, shape_from_hint(spec.architecture, spec.id),
                         NOTHING_MEASURED), NODES)
    splan = serving_plan(spec, p, NODES, STACK)
    assert {splan.config(nt).precision for nt in ("b300", "h200")} == {"fp8"}
    rendered_, _ = render_targets(spec, splan, NODES, STACK, DEPLOY, None, None, None,
                                  {"fp8": _published(spec.id, "fp8")})
    caches = [next(d for d in r.docs if d["kind"] == "LocalModelCache") for r in rendered_]
    assert len(caches) == 2 and caches[0] == caches[1]
    assert sorted(caches[0]["spec"]["nodeGroups"]) == ["b300-nvme-cache", "h200-nvme-cache"]
    for r in rendered_:
        assert isvc(r)["metadata"]["annotations"]["serving.kserve.io/nodegroup"] == \
            f"{r.node_type}-nvme-cache"
