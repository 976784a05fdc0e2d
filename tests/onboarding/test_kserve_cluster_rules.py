"""What a KServe cluster does with the rendered objects, read from KServe's own code at the pinned
release (kserve/kserve v0.20.0, `versions.kserve` in configs/stack.yaml) and the engine's: each
test names the upstream file whose rule it holds. The schema alone admits every one of these
mistakes; these rules decide whether the model serves.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.kserve import (
    AUTOSCALER_CLASS,
    Replicas,
    check_pdb,
    deployment_strategy,
    load_deploy,
    route_table,
    split_routes,
)
from onboarding.serving.engine_config import GENERATE_ONLY_DEFAULTS
from onboarding.serving.stack import load_stack
from tests.onboarding.test_kserve import (
    CATALOG,
    DEPLOY,
    NODES,
    _published,
    configured,
    rendered,
)

SERVING_KINDS = {"InferenceService", "LLMInferenceService"}


def _kinds(r) -> list[str]:
    return [d["kind"] for d in r.docs]


def _doc(r, kind: str) -> dict:
    return next(d for d in r.docs if d["kind"] == kind)


def test_the_pin_is_a_release_with_what_the_manifests_use():
    """LocalModelCache.spec.serviceAccountName, the models/<sha256[:16]> layout and v1alpha2
    LLMInferenceService with its cache path all exist at kserve v0.20.0 (pkg/apis/serving/
    v1alpha1/local_model_cache_types.go GetStorageKey, pkg/controller/v1alpha2/llmisvc/
    workload_storage.go); 0.16 had none of the LLMInferenceService ones."""
    stack = load_stack(PROJECT_ROOT / "configs" / "stack.yaml")
    major, minor = (int(x) for x in stack.kserve_version.split(".")[:2])
    assert (major, minor) >= (0, 19)


@pytest.mark.parametrize("llm_on", [[], ["b300"], ["b300", "h200"]])
def test_one_serving_object_per_model_and_node_type(llm_on):
    """An InferenceService and an LLMInferenceService of the same model in one file run it twice
    on twice the GPUs: deploy.yaml chooses one per node type."""
    deploy = DEPLOY.model_copy(update={"llm_inference_service_node_types": llm_on})
    for node_type in ("b300", "h200"):
        kinds = _kinds(rendered("llama-3-1-70b-instruct", node_type, deploy=deploy))
        serving = [k for k in kinds if k in SERVING_KINDS]
        assert serving == (["LLMInferenceService"] if node_type in llm_on
                           else ["InferenceService"]), kinds


def test_llm_inference_service_listens_where_kserve_routes_and_keeps_the_launcher():
    """KServe's workload Service, InferencePool and HTTPRoute use port 8000 and it will not let
    that change (kserve v0.20.0 pkg/controller/v1alpha2/llmisvc/workload.go,
    reconcileWorkloadService); the preset's command (config/llmisvcconfig/
    config-llm-template.yaml) passes --port 8000, the served name, TP and the TLS flags, then
    the container's args: a `command` would replace that launcher, a --port arg would override
    8000."""
    _, _, config = configured("qwen3-235b-a22b-instruct", "b300")
    deploy = DEPLOY.model_copy(update={"llm_inference_service_node_types": ["b300"]})
    r = rendered("qwen3-235b-a22b-instruct", "b300", deploy=deploy,
                 published={config.precision: _published("qwen3-235b-a22b-instruct",
                                                         config.precision)})
    main = _doc(r, "LLMInferenceService")["spec"]["template"]["containers"][0]
    assert "command" not in main
    assert "ports" not in main  # the preset's 8000
    assert not [a for a in main["args"] if a.split("=")[0] in (
        "--port", "--served-model-name", "--tensor-parallel-size") or a == "/mnt/models"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe in main:
            assert main[probe]["httpGet"]["port"] == 8000, probe
    # KServe's Gateway fronts it: the LiteLLM table never points at a predictor that is not there
    routed, left_out = split_routes([r.route], require_measured=False)
    assert routed == [] and "8000" in left_out[r.route.key]


def test_kserve_cpu_autoscaler_is_off():
    """KServe's default autoscaler class is hpa on CPU (kserve v0.20.0 pkg/constants/
    constants.go DefaultAutoscalerClass; allowed: hpa, external, keda, none); CPU says nothing
    of a GPU engine's load. With `none` KServe pins the Deployment to minReplicas, with
    `external` it leaves replicas to another scaler (reconcilers/deployment/
    deployment_reconciler.go): fixed replicas get none, a range external."""
    assert AUTOSCALER_CLASS == "serving.kserve.io/autoscalerClass"
    assert DEPLOY.replicas.min == DEPLOY.replicas.max
    doc = _doc(rendered("llama-3-1-70b-instruct", "h200"), "InferenceService")
    assert doc["metadata"]["annotations"][AUTOSCALER_CLASS] == "none"
    scaled = DEPLOY.model_copy(update={"replicas": Replicas(min=1, max=4)})
    doc = _doc(rendered("llama-3-1-70b-instruct", "h200", deploy=scaled), "InferenceService")
    assert doc["metadata"]["annotations"][AUTOSCALER_CLASS] == "external"


def test_pod_lifecycle_pdb_priority_grace_and_drain():
    """The PDB selects the predictor pods by the labels KServe puts on them (v0.20.0
    pkg/constants/constants.go InferenceServicePodLabelKey, KServiceComponentLabel); the pod
    drains before SIGTERM and has the gateway's whole request timeout to finish."""
    r = rendered("llama-3-1-70b-instruct", "h200")
    isvc, pdb = _doc(r, "InferenceService"), _doc(r, "PodDisruptionBudget")
    pred = isvc["spec"]["predictor"]
    assert pdb["spec"]["selector"]["matchLabels"] == {
        "serving.kserve.io/inferenceservice": isvc["metadata"]["name"],
        "component": "predictor"}
    assert check_pdb(pdb) == []
    assert pdb["spec"]["maxUnavailable"] == DEPLOY.lifecycle.max_unavailable
    assert pred["priorityClassName"] == DEPLOY.lifecycle.priority_class
    pre_stop = pred["model"]["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop == ["sleep", str(DEPLOY.lifecycle.drain_s)]
    [entry] = route_table([r.route], DEPLOY)["model_list"]
    assert pred["terminationGracePeriodSeconds"] == (
        DEPLOY.lifecycle.drain_s + entry["litellm_params"]["timeout"])
    bad = {**pdb, "spec": {**pdb["spec"], "minAvailable": 1}}
    assert check_pdb(bad) == ["$.spec: exactly one of minAvailable and maxUnavailable"]


def test_recreate_where_a_surge_pod_cannot_be_placed():
    """KServe's raw Deployment rolls out with RollingUpdate unless deploymentStrategy says
    otherwise (kserve v0.20.0 ComponentExtensionSpec.DeploymentStrategy): a pod that takes every
    GPU of its node, or a pinned pod on a packed node, leaves no room for a surge pod."""
    assert deployment_strategy(8, 8) == {"type": "Recreate"}
    assert deployment_strategy(2, 8, packed=True) == {"type": "Recreate"}
    assert deployment_strategy(2, 8) is None
    r = rendered("llama-3-1-70b-instruct", "h200")
    tp = int(_doc(r, "InferenceService")["metadata"]["labels"][
        "model-onboarding.io/tensor-parallel"])
    pred = _doc(r, "InferenceService")["spec"]["predictor"]
    assert ("deploymentStrategy" in pred) == (tp >= NODES.node_types["h200"].gpus_per_node)


def test_direct_pvc_mount_is_not_an_option_kserve_has(tmp_path):
    """`enableDirectPvcVolumeMount` is not in kserve v0.20.0's inferenceservice-config
    (config/configmap/inferenceservice.yaml); pvc:// is mounted directly
    (pkg/webhook/admission/pod/storage_initializer_injector.go)."""
    data = yaml.safe_load((PROJECT_ROOT / "configs" / "deploy.yaml").read_text())
    data["storage_initializer"]["direct_pvc_mount"] = True
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="direct_pvc_mount"):
        load_deploy(path)


@pytest.mark.parametrize("model_id", ["bge-m3", "bge-reranker-v2-m3"])
def test_pooling_models_get_no_forced_chunked_prefill_or_prefix_caching(model_id):
    """vLLM 0.32.0 vllm/engine/arg_utils.py (_set_default_chunked_prefill_and_prefix_caching_args)
    warns that enabling either on a pooling model that does not support it "may cause the engine
    to crash or produce incorrect outputs"; left unset, the engine picks per model."""
    spec = CATALOG[model_id]
    assert spec.task != "generate"
    _, _, config = configured(model_id, "h200")
    for key in GENERATE_ONLY_DEFAULTS:
        assert key not in config.params or key in spec.engine_args, key
    assert not [a for a in config.param_args if "chunked-prefill" in a or "prefix-caching" in a]
    _, _, gen = configured("llama-3-1-70b-instruct", "h200")
    assert any("prefix-caching" in a for a in gen.param_args)  # a generating model keeps them


def test_a_cache_smaller_than_the_published_variant_is_refused_before_rendering():
    """KServe's LocalModelNodeGroup caps what the node may cache (storageLimit); a variant above
    it would never be cached and its pods would mount an empty directory."""
    _, _, config = configured("qwen3-235b-a22b-instruct", "b300")
    pub = dataclasses.replace(_published("qwen3-235b-a22b-instruct", config.precision),
                              total_bytes=200 * 2**30)
    nts = dict(DEPLOY.local_model_cache.node_types)
    nts["b300"] = nts["b300"].model_copy(update={"storage_limit_gib": 100})
    small = DEPLOY.model_copy(update={"local_model_cache": DEPLOY.local_model_cache.model_copy(
        update={"node_types": nts})})
    with pytest.raises(ConfigError, match="storage_limit_gib"):
        rendered("qwen3-235b-a22b-instruct", "b300", deploy=small,
                 published={config.precision: pub})
    assert rendered("qwen3-235b-a22b-instruct", "b300", published={config.precision: pub})
