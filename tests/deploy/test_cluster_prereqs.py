"""The files a platform engineer applies once (onboarding/deploy/cluster_prereqs.py), each held
to the upstream rule it answers: KServe v0.20.0 (the release versions.kserve pins), the GPU
operator, the kubelet. Rendered from the shipped configs, so a change there that breaks a rule
fails here."""

from __future__ import annotations

import json

import pytest
import yaml

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.cluster_prereqs import (
    DEFAULT_TOLERATIONS,
    MIG_CONFIG_NAME,
    TOPOLOGY_POLICY,
    agent_values,
    gpu_operator_objects,
    kserve_local_model_config,
    render_prerequisites,
)
from onboarding.deploy.kserve import CacheNode, inline_secret_findings, load_deploy
from onboarding.deploy.plan import load_nodes
from onboarding.layouts.render import check_configmap, check_priority_class, mig_entries
from onboarding.serving.stack import load_stack

CONFIGS = PROJECT_ROOT / "configs"
DEPLOY = load_deploy(CONFIGS / "deploy.yaml")
NODES = load_nodes(CONFIGS / "nodes.yaml")
KSERVE = load_stack(CONFIGS / "stack.yaml").kserve_version


def _files() -> dict[str, list]:
    return {n: [d for d in yaml.safe_load_all(t) if d is not None]
            for n, t in render_prerequisites(DEPLOY, NODES, KSERVE).items()}


def _taint_tolerated(taint, tolerations) -> bool:
    """Kubernetes' ToleratesTaint (k8s.io/api core/v1 toleration.go): key matches (or empty key
    with Exists), effect matches (or empty), Exists or an equal value."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.effect:
            continue
        if t.get("key") and t["key"] != taint.key:
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value") == taint.value:
            return True
    return False


def test_cache_downloads_tolerate_every_taint_of_the_cache_nodes():
    """KServe's download Job has a hostname selector and no tolerations (kserve v0.20.0
    pkg/controller/v1alpha1/localmodelnode/controller.go launchJob; platform_default.go
    enhanceDownloadJob adds nothing), and the node agent's chart values have none
    (charts/kserve-localmodel-resources/values.yaml): both get them here, the Job through its
    namespace's PodTolerationRestriction default."""
    files = _files()
    job_ns = next(d for d in files["00-namespaces.yaml"]
                  if d["metadata"]["name"] == DEPLOY.local_model_cache.job_namespace)
    job_tolerations = json.loads(job_ns["metadata"]["annotations"][DEFAULT_TOLERATIONS])
    agent = files["02-localmodel-agent-values.yaml"][0]["kserve"]["localmodel"]["agent"]
    assert DEPLOY.local_model_cache.node_types
    for nt in DEPLOY.local_model_cache.node_types:
        taints = NODES.node_types[nt].taints
        assert taints, nt  # the fleet's GPU nodes are tainted: the case that stalled
        for taint in taints:
            assert _taint_tolerated(taint, job_tolerations), (nt, taint)
            assert _taint_tolerated(taint, agent["tolerations"]), (nt, taint)


def test_local_models_on_with_the_cache_root_and_one_uid():
    """`localModel.enabled` is false in KServe's shipped ConfigMap (config/configmap/
    inferenceservice.yaml); the agent's hostPath must be the root the LocalModelNodeGroup's PV
    uses, and the agent's UID, the Jobs' fsGroup and the images' user must agree (the chart
    defaults 1000, the images run as 10001)."""
    cfg = json.loads(kserve_local_model_config(DEPLOY, KSERVE)["data"]["localModel"])
    assert cfg["enabled"] is True
    assert cfg["jobNamespace"] == DEPLOY.local_model_cache.job_namespace
    values = agent_values(DEPLOY, NODES)["kserve"]["localmodel"]
    roots = {c.cache_root for c in DEPLOY.local_model_cache.node_types.values()}
    assert {values["agent"]["hostPath"]} == roots
    dockerfile = (PROJECT_ROOT / "deploy" / "Dockerfile.gpu").read_text()
    assert f"USER {DEPLOY.local_model_cache.cache_uid}" in dockerfile
    assert values["agent"]["securityContext"]["runAsUser"] == DEPLOY.local_model_cache.cache_uid
    assert cfg["fsGroup"] == values["securityContext"]["fsGroup"] == \
        DEPLOY.local_model_cache.cache_uid


def test_different_cache_roots_are_refused():
    nts = dict(DEPLOY.local_model_cache.node_types)
    first = min(nts)
    nts[first] = CacheNode(cache_root="/elsewhere", storage_limit_gib=100)
    bad = DEPLOY.model_copy(update={"local_model_cache": DEPLOY.local_model_cache.model_copy(
        update={"node_types": nts})})
    with pytest.raises(ConfigError, match="cache roots differ"):
        agent_values(bad, NODES)


def test_credentials_live_where_kserve_looks_them_up():
    """The download Job reads LocalModelCache.serviceAccountName in the job namespace
    (controller.go launchJob, jobNs), the predictor's in the model namespace: the account is
    rendered in both, naming the secrets, never their values."""
    sas = _files()["03-service-accounts.yaml"]
    assert {(d["metadata"]["name"], d["metadata"]["namespace"]) for d in sas} == {
        (DEPLOY.service_account, DEPLOY.namespace),
        (DEPLOY.service_account, DEPLOY.local_model_cache.job_namespace)}
    for d in sas:
        assert {"name": DEPLOY.storage_secret} in d["secrets"]
    assert inline_secret_findings(list(_files().values())) == []


def test_priority_class_is_the_one_the_manifests_name():
    [pc] = _files()["04-priority-class.yaml"]
    assert pc["metadata"]["name"] == DEPLOY.lifecycle.priority_class
    assert check_priority_class(pc) == []


def test_one_merged_mig_config_and_the_mixed_strategy():
    """The MIG manager applies the ConfigMap the ClusterPolicy's migManager.config.name names
    (NVIDIA gpu-operator controllers/object_controls.go), so every layout's config and
    all-disabled go into that one; nvidia.com/mig-<profile> resources exist only with
    mig.strategy mixed (k8s-device-plugin, MIG strategies)."""
    from tests.onboarding.test_layout import CFG, planned

    plans = {n: planned(n) for n in ("b300-mixed", "h200-mixed")}
    entries = {n: e for n, p in plans.items() for e in [mig_entries(p, CFG, NODES)] if e}
    assert entries  # the shipped layouts cut a GPU
    cm, patch = gpu_operator_objects(entries)
    assert check_configmap(cm) == []
    configs = yaml.safe_load(cm["data"]["config.yaml"])["mig-configs"]
    assert set(configs) == {"all-disabled", *entries}
    assert cm["metadata"]["name"] == MIG_CONFIG_NAME
    assert patch["spec"]["migManager"]["config"]["name"] == MIG_CONFIG_NAME
    assert patch["spec"]["mig"]["strategy"] == "mixed"


def test_kubelet_policy_admits_the_eight_gpu_pods_the_plans_render():
    """`single-numa-node` rejects a pod that cannot sit on one NUMA node (a Topology Affinity
    Error); `restricted` admits one spanning as few NUMA nodes as it needs
    (kubernetes.io/docs/tasks/administer-cluster/topology-manager/). The fleet's plans render
    8-GPU pods (TP 8), which span both halves of every node type."""
    from tests.onboarding.test_kserve import configured

    _, _, config = configured("deepseek-r1", "h200")
    assert config.tensor_parallel == 8 > max(len(h) for h in (
        NODES.node_types["h200"].numa_gpus or [[0, 1, 2, 3], [4, 5, 6, 7]]))
    kubelet = _files()["07-kubelet-config.yaml"][0]
    assert kubelet["topologyManagerPolicy"] == TOPOLOGY_POLICY == "restricted"
    assert kubelet["cpuManagerPolicy"] == "static"


def test_the_download_job_runs_the_projects_own_fetch_for_published_variants():
    """KServe picks the download Job's container from a ClusterStorageContainer of workload type
    localModelDownloadJob matching the source URI (kserve v0.20.0 localmodelnode/controller.go
    getContainerSpecForStorageUri) and appends (URI, folder); resources/cache_filler.py is the
    module that takes those two arguments (tests/resources/test_cache_filler.py runs it)."""
    import importlib

    from onboarding.deploy.cluster_prereqs import FILLER_MODULE

    [csc] = _files()["08-cache-filler.yaml"]
    spec = csc["spec"]
    assert spec["workloadType"] == "localModelDownloadJob"
    published_uri = DEPLOY.storage.variants_uri.format(model="m", precision="fp8") + "abc/"
    assert any(published_uri.startswith(f["prefix"]) for f in spec["supportedUriFormats"])
    assert spec["container"]["command"] == ["python", "-m", FILLER_MODULE]
    assert "args" not in spec["container"]  # KServe sets them
    assert callable(importlib.import_module(FILLER_MODULE).main)
    assert spec["container"]["securityContext"]["runAsUser"] == \
        DEPLOY.local_model_cache.cache_uid


def test_the_cache_filler_validates_against_kserves_own_crd():
    """The ClusterStorageContainer CRD ships with the other KServe CRDs of the pinned release
    (deploy/kserve-crds/SOURCE: config/crd/full/clusterstoragecontainer/ at v0.20.0), and the
    rendered object passes it under the API server's strict field rule; a field KServe does not
    knows not is refused by the same check."""
    from resources.manifest_validator import DEFAULT_CRD_DIR, ManifestValidator

    crd = DEFAULT_CRD_DIR / "serving.kserve.io_clusterstoragecontainers.yaml"
    assert "clusterstoragecontainer" in (DEFAULT_CRD_DIR / "SOURCE").read_text()
    validator = ManifestValidator(crd_paths=[str(crd)])
    [csc] = _files()["08-cache-filler.yaml"]
    assert validator.validate(csc) == []
    bad = json.loads(json.dumps(csc))
    bad["spec"]["container"]["mountPath"] = "/mnt/models"
    errors = validator.validate(bad)
    assert any("mountPath: unknown field" in e for e in errors), errors


def test_every_kserve_object_of_the_prerequisites_validates_by_default():
    """The validator's default CRDs cover every KServe kind the prerequisites render (the
    ClusterStorageContainer among them), so `gateway_routes` checks them as `kserve_manifest`
    checks the model's objects, with no CRD path configured."""
    from resources.manifest_validator import ManifestValidator

    validator = ManifestValidator()
    kserve = [d for docs in _files().values() for d in docs
              if str(d.get("apiVersion", "")).startswith("serving.kserve.io/")]
    assert {d["kind"] for d in kserve} >= {"ClusterStorageContainer"}
    for doc in kserve:
        assert validator.validate(doc) == [], doc["kind"]
