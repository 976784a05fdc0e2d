"""What a cluster needs once before the rendered manifests can serve: files a platform engineer
applies (docs/deploy.md, "Deploy to your KServe cluster").

Pure rendering from deploy.yaml, nodes.yaml and the layouts' GPU sharing. Each object says which
upstream rule it answers (KServe v0.20.0, the release `versions.kserve` pins):
- KServe's local model cache is off until `inferenceservice-config`'s `localModel.enabled`
  (config/configmap/inferenceservice.yaml), and its download Job runs in `jobNamespace` with
  only a hostname selector and no tolerations (pkg/controller/v1alpha1/localmodelnode/
  controller.go launchJob; platform_default.go adds nothing): on GPU nodes tainted
  `nvidia.com/gpu:NoSchedule` it stays Pending unless the namespace hands its pods the
  tolerations. Kubernetes' PodTolerationRestriction admission plugin does that from the
  namespace annotation `scheduler.alpha.kubernetes.io/defaultTolerations`.
- The same launchJob reads LocalModelCache.serviceAccountName's secrets in `jobNamespace`, not
  in the model's namespace: the service account and its secrets must exist there too.
- The node agent DaemonSet (chart kserve-localmodel-resources, values `kserve.localmodel.agent`)
  has no tolerations by default, runs as UID 1000, and its hostPath must be the cache root.
- The GPU operator's MIG manager applies the one mig-parted ConfigMap the ClusterPolicy names,
  and `nvidia.com/mig-<profile>` resources exist only under `mig.strategy: mixed`.
No secret value is rendered: the secrets are named, and created by the platform engineer.
"""

from __future__ import annotations

import json
from typing import Any

from onboarding.common.errors import ConfigError
from onboarding.deploy.kserve import (
    LABEL_PREFIX,
    DeployConfig,
    node_tolerations,
    to_yaml,
)
from onboarding.deploy.plan import NodesConfig

PART_OF = {"app.kubernetes.io/part-of": "model-onboarding"}
DEFAULT_TOLERATIONS = "scheduler.alpha.kubernetes.io/defaultTolerations"
KSERVE_NAMESPACE = "kserve"
MIG_CONFIG_NAME = "model-onboarding-mig-parted-config"
# Kubelet topology manager: `restricted` admits a pod whose resources span no more NUMA nodes
# than the request needs (an 8-GPU pod: both halves) and rejects a worse one; `single-numa-node`
# rejects every pod that cannot sit on one NUMA node, so 8-GPU pods get a Topology Affinity
# Error (https://kubernetes.io/docs/tasks/administer-cluster/topology-manager/, "Topology
# manager policies").
TOPOLOGY_POLICY = "restricted"


def cache_node_types(deploy: DeployConfig) -> list[str]:
    return sorted(deploy.local_model_cache.node_types)


def cache_tolerations(deploy: DeployConfig, nodes: NodesConfig) -> list[dict[str, str]]:
    """Every toleration a cache node type's taints need (the model pods' own rule)."""
    out: list[dict[str, str]] = []
    for nt in cache_node_types(deploy):
        if nt not in nodes.node_types:
            raise ConfigError(f"deploy.yaml local_model_cache.node_types.{nt}",
                              "is not a node type of nodes.yaml",
                              "Name a node type from nodes.yaml, or remove the entry.")
        for t in node_tolerations(nodes.node_types[nt]):
            if t not in out:
                out.append(t)
    return out


def cache_root(deploy: DeployConfig) -> str:
    """The node agent has one hostPath for every node: the cache roots must agree."""
    roots = {c.cache_root for c in deploy.local_model_cache.node_types.values()}
    if len(roots) != 1:
        raise ConfigError(
            "deploy.yaml local_model_cache.node_types", f"cache roots differ ({sorted(roots)})"
            if roots else "no node type has a cache root",
            "KServe's node agent DaemonSet mounts one hostPath on every node: give every cache "
            "node type the same cache_root.")
    return roots.pop()


def kserve_local_model_config(deploy: DeployConfig, kserve_version: str) -> dict[str, Any]:
    """A merge patch for KServe's `inferenceservice-config` ConfigMap that turns the local model
    cache on (`kubectl patch configmap inferenceservice-config -n kserve --type merge
    --patch-file ...`); the keys are KServe's own (config/configmap/inferenceservice.yaml)."""
    lmc = deploy.local_model_cache
    return {"data": {"localModel": json.dumps({
        "enabled": True,
        "jobNamespace": lmc.job_namespace,
        "defaultJobImage": f"kserve/storage-initializer:v{kserve_version}",
        "fsGroup": lmc.cache_uid,
        "jobTTLSecondsAfterFinished": 3600,
        "reconcilationFrequencyInSecs": 60,
        "disableVolumeManagement": False,
    }, indent=2)}}


def agent_values(deploy: DeployConfig, nodes: NodesConfig) -> dict[str, Any]:
    """Helm values for KServe's kserve-localmodel-resources chart: the agent on the cache nodes
    (their taints tolerated), on the cache root, as the UID that owns it."""
    lmc = deploy.local_model_cache
    return {"kserve": {"localmodel": {
        "enabled": True,
        "jobNamespace": lmc.job_namespace,
        "securityContext": {"fsGroup": lmc.cache_uid},
        "agent": {
            "hostPath": cache_root(deploy),
            "tolerations": cache_tolerations(deploy, nodes),
            "securityContext": {"runAsUser": lmc.cache_uid, "runAsNonRoot": True},
        },
    }}}


def service_account(deploy: DeployConfig, namespace: str) -> dict[str, Any]:
    """The storage service account: KServe gives its secrets (S3 keys with the
    serving.kserve.io/s3-* annotations, HF_TOKEN) to the storage initializer and to the cache's
    download Job (pkg/credentials/service_account_credentials.go)."""
    secrets = [{"name": deploy.storage_secret}]
    if deploy.hf_token_secret is not None:
        secrets.append({"name": deploy.hf_token_secret.name})
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": deploy.service_account, "namespace": namespace,
                         "labels": dict(PART_OF)},
            "secrets": secrets}


def namespaces(deploy: DeployConfig, nodes: NodesConfig) -> list[dict[str, Any]]:
    """The model namespace, and KServe's job namespace whose pods get the cache nodes'
    tolerations from the PodTolerationRestriction admission plugin."""
    job_ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": deploy.local_model_cache.job_namespace, "labels": dict(PART_OF),
        "annotations": {DEFAULT_TOLERATIONS: json.dumps(cache_tolerations(deploy, nodes))}}}
    models = {"apiVersion": "v1", "kind": "Namespace",
              "metadata": {"name": deploy.namespace, "labels": dict(PART_OF)}}
    return [models, job_ns]


def priority_class(deploy: DeployConfig) -> dict[str, Any]:
    lc = deploy.lifecycle
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": lc.priority_class, "labels": dict(PART_OF)},
            "value": lc.priority_value, "preemptionPolicy": "PreemptLowerPriority",
            "globalDefault": False,
            "description": "model-onboarding: single-model serving pods"}


def merged_mig_config(layout_configs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One mig-parted config for the whole fleet: `all-disabled` plus every layout's named
    config (`layout_configs`: name -> list of device entries), since the MIG manager reads only
    the ConfigMap the ClusterPolicy names; a node picks one by `nvidia.com/mig.config`."""
    configs: dict[str, Any] = {"all-disabled": [
        {"devices": "all", "mig-enabled": False}]}
    for name, entries in sorted(layout_configs.items()):
        if name in configs:
            raise ConfigError(f"layout {name!r}", "collides with the all-disabled MIG config",
                              "Rename the layout in layouts.yaml.")
        configs[name] = entries
    return {"version": "v1", "mig-configs": configs}


def gpu_operator_objects(layout_configs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The merged mig-parted ConfigMap and the ClusterPolicy merge patch that names it and turns
    on the mixed strategy (`kubectl patch clusterpolicies.nvidia.com cluster-policy --type merge
    --patch-file ...`)."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": MIG_CONFIG_NAME, "namespace": "gpu-operator",
                       "labels": dict(PART_OF)},
          "data": {"config.yaml": to_yaml([merged_mig_config(layout_configs)])}}
    patch = {"spec": {"mig": {"strategy": "mixed"},
                      "migManager": {"config": {"name": MIG_CONFIG_NAME,
                                                "default": "all-disabled"}}}}
    return [cm, patch]


FILLER_MODULE = "resources.cache_filler"


def cache_filler(deploy: DeployConfig) -> dict[str, Any]:
    """KServe's download Job takes its container from the ClusterStorageContainer of workload
    type localModelDownloadJob whose URI formats match the cache's source (kserve v0.20.0
    pkg/controller/v1alpha1/localmodelnode/controller.go getContainerSpecForStorageUri,
    pkg/apis/serving/v1alpha1/storage_container_types.go): here the project's own fetch, for
    the serving bucket's published variants, so a folder already verified on the node is not
    fetched again. KServe appends the arguments (source URI, mounted folder)."""
    bucket = deploy.storage.variants_uri.split("://", 1)[1].split("/", 1)[0]
    lmc = deploy.local_model_cache
    return {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ClusterStorageContainer",
            "metadata": {"name": "model-onboarding-cache-filler", "labels": dict(PART_OF)},
            "spec": {
                "workloadType": "localModelDownloadJob",
                "supportedUriFormats": [{"prefix": f"s3://{bucket}/"}],
                "container": {
                    "name": "kserve-localmodel-download", "image": lmc.filler_image,
                    "command": ["python", "-m", FILLER_MODULE],
                    "securityContext": {"runAsUser": lmc.cache_uid, "runAsNonRoot": True},
                    "resources": {"requests": {"cpu": "2", "memory": "4Gi"},
                                  "limits": {"cpu": "4", "memory": "8Gi"}}}}}


def kubelet_config() -> dict[str, Any]:
    """The kubelet settings every GPU node needs for the rendered pods to be admitted."""
    return {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "cpuManagerPolicy": "static", "topologyManagerPolicy": TOPOLOGY_POLICY,
            "topologyManagerScope": "pod", "reservedSystemCPUs": "0-3"}


def render_prerequisites(deploy: DeployConfig, nodes: NodesConfig, kserve_version: str,
                         layout_configs: dict[str, list[dict[str, Any]]] | None = None
                         ) -> dict[str, str]:
    """File name -> text, in the order a platform engineer applies them."""
    header = f"Rendered by model-onboarding from configs/deploy.yaml and nodes.yaml ({LABEL_PREFIX})."
    job_ns = deploy.local_model_cache.job_namespace
    cm, patch = gpu_operator_objects(layout_configs or {})
    return {
        "00-namespaces.yaml": to_yaml(namespaces(deploy, nodes), header + "\nkubectl apply -f"),
        "01-kserve-localmodel-patch.yaml": to_yaml(
            [kserve_local_model_config(deploy, kserve_version)],
            header + f"\nkubectl patch configmap inferenceservice-config -n {KSERVE_NAMESPACE} "
            "--type merge --patch-file"),
        "02-localmodel-agent-values.yaml": to_yaml(
            [agent_values(deploy, nodes)],
            header + "\nhelm upgrade --install ... kserve-localmodel-resources -f"),
        "03-service-accounts.yaml": to_yaml(
            [service_account(deploy, deploy.namespace), service_account(deploy, job_ns)],
            header + f"\nkubectl apply -f; then create the secrets {deploy.storage_secret!r}"
            " (and the HF token's) in both namespaces"),
        "04-priority-class.yaml": to_yaml([priority_class(deploy)], header + "\nkubectl apply -f"),
        "05-gpu-operator-mig-config.yaml": to_yaml([cm], header + "\nkubectl apply -f"),
        "06-clusterpolicy-patch.yaml": to_yaml(
            [patch], header + "\nkubectl patch clusterpolicies.nvidia.com cluster-policy "
            "--type merge --patch-file"),
        "07-kubelet-config.yaml": to_yaml(
            [kubelet_config()], header + "\nmerge into each GPU node's kubelet configuration"),
        "08-cache-filler.yaml": to_yaml(
            [cache_filler(deploy)], header + "\nkubectl apply -f (before the first "
            "LocalModelCache: KServe's download Job then runs the project's verified fetch)"),
    }
