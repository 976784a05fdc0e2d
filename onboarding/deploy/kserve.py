"""KServe manifests from a deployment plan: InferenceService (+ ServingRuntime) and gateway routes.

Pure rendering, no Dagster and no cluster: every value comes from the plan, the model's spec,
`configs/deploy.yaml`, the `images:`/`engine_switches:` sections of `configs/stack.yaml`, or a
measurement, and the manifest's annotations say which. Credentials are only ever referenced
(service account, secretKeyRef); `inline_secret_findings` is the gate that proves it. The pod
KServe will create is predicted (`predicted_pod`), so its QoS class is computed, not claimed.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from packaging.version import Version
from pydantic import Field

from onboarding.common.config import StrictConfig, load_config_file
from onboarding.common.errors import ConfigError
from onboarding.common.names import to_dns1123_label
from onboarding.common.redact import secret_urls
from onboarding.deploy.observability import llm_inference_service_replicas
from onboarding.deploy.plan import GIB, DeploymentPlan, NodePlan, NodeType
from onboarding.fetch.catalog import ModelSpec
from onboarding.serving.engine_config import SECRET_NAME, EngineConfig, Evidence
from onboarding.serving.stack import EngineSwitch, Stack

LABEL_PREFIX = "model-onboarding.io"
ISVC_NAME_MAX = 45  # KServe appends "-predictor" (and Knative a revision) within 63
RUNTIME_CONTAINER = "kserve-container"
SHM_VOLUME = "dshm"
MODEL_DIR = "/mnt/models"  # where KServe puts the model for the runtime
# KServe 0.16 renamed RawDeployment to Standard and Serverless to Knative; both are accepted in
# deploy.yaml and rendered in the spelling of the KServe version in stack.yaml.
DeploymentMode = Literal["Standard", "RawDeployment", "Knative", "Serverless"]
_MODE_FAMILY = {"Standard": "raw", "RawDeployment": "raw", "Knative": "knative",
                "Serverless": "knative"}

_SECRET_NAME = SECRET_NAME


# ---- configuration ------------------------------------------------------------------------


class SecretRef(StrictConfig):
    name: str
    key: str


class StorageConfig(StrictConfig):
    variants_uri: str = Field(pattern=r"^(s3|pvc|gs|hf)://.*\{model\}.*\{precision\}")
    read_back_mib: int = Field(default=256, ge=1)


class StorageInitializerConfig(StrictConfig):
    """KServe's storage initializer as the cluster's `inferenceservice-config` ConfigMap sets it
    (key `storageInitializer`): the init container that pulls s3://, gs:// and hf:// URIs; a
    pvc:// source is mounted directly (kserve v0.20.0 pkg/webhook/admission/pod/
    storage_initializer_injector.go), and its ConfigMap has no `enableDirectPvcVolumeMount`
    (config/configmap/inferenceservice.yaml). Kubernetes counts init containers in a pod's QoS
    class, so these numbers decide whether a model pod can be Guaranteed."""

    cpu_request: str = "100m"
    cpu_limit: str = "1"
    memory_request: str = "100Mi"
    memory_limit: str = "1Gi"


class ProbeConfig(StrictConfig):
    safety_factor: float = Field(ge=1.0)
    min_startup_s: int = Field(ge=0)
    unmeasured_startup_s: int = Field(gt=0)
    period_s: int = Field(ge=1)
    timeout_s: int = Field(ge=1)
    path: str = Field(pattern=r"^/")
    readiness_failure_threshold: int = Field(ge=1)
    liveness_period_s: int = Field(ge=1)
    liveness_failure_threshold: int = Field(ge=1)
    include_pull_time: bool = True
    # fewer fully cold starts than this: no p95 is claimed, the window is max x safety_factor
    min_p95_samples: int = Field(default=3, ge=1)


class Replicas(StrictConfig):
    min: int = Field(ge=0)
    max: int = Field(ge=1)


class GatewayConfig(StrictConfig):
    """LiteLLM proxy routes. `timeout` limits a whole response and `stream_timeout` a streamed
    one's wait (LiteLLM proxy docs, "Timeouts"): both from what was measured at the target
    concurrency, x margin; a route nothing measured gets the labelled default."""

    provider: str = "openai"  # LiteLLM's generic OpenAI-compatible one; deploy.yaml names its own
    cluster_domain: str = "svc.cluster.local"
    routing_strategy: str = "simple-shuffle"
    timeout_margin: float = Field(default=1.5, ge=1.0)
    stream_timeout_margin: float = Field(default=2.0, ge=1.0)
    unmeasured_timeout_s: int = Field(default=600, ge=1)
    # LiteLLM applies stream_timeout to each read of a live stream, and the TTFT it is scaled
    # from was measured at the benchmark's prompt lengths, not at max-model-len: never below this
    min_stream_timeout_s: int = Field(default=60, ge=1)


class CacheNode(StrictConfig):
    """One node type's NVMe model cache, as KServe's LocalModelNodeGroup sees it."""

    cache_root: str = Field(pattern=r"^/", description="the NVMe cache root on the node")
    storage_limit_gib: int = Field(ge=1, description="what KServe may cache there per node")


class LocalModelCacheConfig(StrictConfig):
    """KServe LocalModelCache + LocalModelNodeGroup per node type (docs/deploy.md, "Weights on
    the node"): node types listed here deploy published variants from the node's cache."""

    storage_class: str = "local-nvme-models"
    node_types: dict[str, CacheNode] = Field(default_factory=dict)
    # KServe's localModel.jobNamespace: where the download Jobs run and where they look up
    # LocalModelCache.serviceAccountName (pkg/controller/v1alpha1/localmodelnode/controller.go)
    job_namespace: str = Field(default="kserve-localmodel-jobs",
                               pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    # who owns the cache root: the images' user (deploy/Dockerfile*), the node agent's runAsUser
    # and the download Jobs' fsGroup, so the pipeline's verified files and KServe's agree
    cache_uid: int = Field(default=10001, ge=1)
    # the image whose `python -m resources.cache_filler` KServe's download Job runs (the code
    # location image, deploy/Dockerfile): the project's verified fetch fills the node cache
    filler_image: str = Field(default="registry.example.com/model-onboarding:0.1.0",
                              min_length=1)


class LifecycleConfig(StrictConfig):
    """How a model pod lives and dies on the cluster (docs/deploy.md, "Pod lifecycle")."""

    # a PriorityClass the platform creates once (rendered with the cluster prerequisites)
    priority_class: str = Field(default="model-serving", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    priority_value: int = Field(default=100000, ge=0, le=1_000_000_000)
    # preStop sleep: the endpoints controller drops the pod from its Service before the engine
    # gets SIGTERM, so no new request reaches a stopping pod
    drain_s: int = Field(default=15, ge=0)
    # PodDisruptionBudget: at most this many of a model's pods evicted at once (drains, upgrades)
    max_unavailable: int = Field(default=1, ge=1)


class EphemeralStorageConfig(StrictConfig):
    """Where no cache is configured, the storage initializer downloads into an emptyDir: the
    pod requests ephemeral-storage of the weights x (1 + margin) + extra_gib."""

    margin: float = Field(default=0.1, ge=0)
    extra_gib: int = Field(default=20, ge=0)


class DeployConfig(StrictConfig):
    namespace: str
    target_node_types: list[str] = Field(min_length=1)
    deployment_mode: DeploymentMode = "Standard"
    replicas: Replicas
    service_account: str
    hf_token_secret: SecretRef | None = None
    # the S3 credentials secret the service account lists (AWS_ACCESS_KEY_ID /
    # AWS_SECRET_ACCESS_KEY and KServe's serving.kserve.io/s3-* annotations); named, never rendered
    storage_secret: str = "model-storage-s3"
    storage: StorageConfig
    storage_initializer: StorageInitializerConfig = Field(
        default_factory=StorageInitializerConfig)
    probes: ProbeConfig
    shm_gib_per_gpu: int = Field(ge=1)
    container_port: int = Field(ge=1, le=65535)
    # None: the engine template's metrics.path (configs/stack.yaml), where that engine serves
    # Prometheus text; set only to override it (e.g. behind a sidecar).
    metrics_path: str | None = Field(default=None, pattern=r"^/")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    # false: a node type whose configuration was never measured gets no manifest (only why)
    render_unmeasured: bool = True
    local_model_cache: LocalModelCacheConfig = Field(default_factory=LocalModelCacheConfig)
    # node types deployed as KServe's LLMInferenceService (llm-d) instead of an InferenceService:
    # one object per model and node type, never both (both would run the model twice)
    llm_inference_service_node_types: list[str] = Field(default_factory=list)
    lifecycle: LifecycleConfig = Field(default_factory=LifecycleConfig)
    ephemeral_storage: EphemeralStorageConfig = Field(default_factory=EphemeralStorageConfig)


def load_deploy(path: Path) -> DeployConfig:
    return load_config_file(DeployConfig, path, "Fix deploy.yaml.")


# ---- names --------------------------------------------------------------------------------


def service_name(model_id: str, node_type: str, max_len: int = ISVC_NAME_MAX) -> str:
    """InferenceService name: a DNS-1035 label (KServe wants a leading letter) ending in the node."""
    suffix = f"-{to_dns1123_label(node_type, 12)}"
    base = to_dns1123_label(model_id, max_len - len(suffix))
    if not base[0].isalpha():
        base = to_dns1123_label(f"m-{base}", max_len - len(suffix))
    return base + suffix


def label_value(value: str) -> str:
    """A Kubernetes label value (<= 63, alphanumeric at both ends, [-_.] inside)."""
    v = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", v)


# ---- the pieces -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StartupProbePlan:
    basis: Literal["measured", "default"]
    window_s: int
    failure_threshold: int
    explanation: str


def startup_probe_plan(cold_start_p95_s: float | None, cfg: ProbeConfig,
                       pull_s: float | None = None, samples: int | None = None,
                       max_s: float | None = None, cached: bool = False) -> StartupProbePlan:
    """window = max(min_startup_s, ceil(safety_factor x (fully cold p95 + pull))).

    With fewer than `probes.min_p95_samples` fully cold starts (`samples`) a p95 is not a
    p95 (of one start it is that start): the window is sized from the slowest start (`max_s`)
    instead, and the explanation says n. The pull (the storage initializer copying
    the published variant, at the GET throughput measured reading it back) is counted when
    `probes.include_pull_time`: Kubernetes starts the startup probe's clock after init
    containers finish, so this is conservative for KServe's initializer and exact when the
    runtime pulls the weights itself. Unmeasured: the default. Kubernetes allows a container
    `failureThreshold x periodSeconds` to start, so the threshold is the window divided by the
    period, rounded up.
    """
    if cold_start_p95_s is None:
        window = cfg.unmeasured_startup_s
        why = (f"default: never load-timed at this configuration, conservative {window} s "
               "(configs/deploy.yaml probes.unmeasured_startup_s)")
        basis: Literal["measured", "default"] = "default"
    else:
        few = samples is not None and samples < cfg.min_p95_samples
        start_s = (max_s if max_s is not None else cold_start_p95_s) if few else cold_start_p95_s
        pull = pull_s if (cfg.include_pull_time and pull_s is not None and not cached) else 0.0
        scaled = math.ceil(cfg.safety_factor * (start_s + pull))
        window = max(cfg.min_startup_s, scaled)
        pull_note = (" (weights cached on the node by LocalModelCache: no pull)" if cached else
                     f" + derived pull {pull:.1f} s" if pull else
                     " (pull not counted)" if not cfg.include_pull_time else
                     " (pull unknown: nothing published)")
        n = "" if samples is None else f" (n={samples})"
        stat = (f"max {start_s:.1f} s (n={samples}: fewer than {cfg.min_p95_samples} starts, "
                "too few for a percentile)" if few else f"p95 {start_s:.1f} s{n}")
        why = (f"measured: fully cold start {stat}{pull_note}, x safety "
               f"{cfg.safety_factor:g} = {scaled} s, floor {cfg.min_startup_s} s -> {window} s")
        basis = "measured"
    threshold = max(1, math.ceil(window / cfg.period_s))
    return StartupProbePlan(basis, threshold * cfg.period_s, threshold, why)


def checkpoint_dtype(config: dict[str, Any]) -> str | None:
    """The precision a checkpoint's config.json declares for its weights: a block-scaled FP8
    checkpoint (`quantization_config.quant_method: fp8`, as DeepSeek-R1 ships) keeps
    `torch_dtype: bfloat16` for the rest, so the quantization config decides; else its dtype."""
    qc = config.get("quantization_config") or {}
    if isinstance(qc, dict) and str(qc.get("quant_method", "")).lower() == "fp8":
        return "fp8"
    return config.get("dtype") or config.get("torch_dtype")


def source_precision(config_dtype: str | None, declared: str = "bf16") -> str:
    """Precision of the source checkpoint: from the fetched config.json's dtype when there is
    one (`checkpoint_dtype`), else the catalog's `source_precision` (`declared`; a plan_only
    entry is never fetched). Where both exist they must agree."""
    if config_dtype is None:
        return declared
    found = "bf16" if config_dtype in ("bfloat16", "float16", "float32") else config_dtype
    if found != declared:
        raise ConfigError(
            f"catalog source_precision: {declared}",
            f"the fetched checkpoint's config.json says {found} ({config_dtype})",
            f"Set source_precision: {found} in the model's catalog entry.")
    return found


@dataclass(frozen=True)
class Storage:
    """Where a manifest's pod gets its weights, and whether this graph published and verified
    them there."""

    uri: str
    published: bool
    why: str
    pull_s: float | None = None  # derived: published bytes / GET throughput measured
    total_bytes: int | None = None  # the published variant's bytes


def storage_for(spec: ModelSpec, precision: str, source_prec: str, cfg: DeployConfig,
                published: dict[str, Any] | None) -> Storage:
    """The published, verified variant of `precision` when there is one; otherwise the source
    itself when it is that precision, or the variants location, both marked unpublished."""
    p = (published or {}).get(precision)
    if p is not None:
        return Storage(p.uri, True, f"published and verified: {p.uri} (sha256 per file)",
                       p.pull_s, p.total_bytes)
    if precision == source_prec:
        ref = spec.source_ref
        uri = (f"hf://{ref.location}" + (f":{ref.revision}" if ref.revision else "")
               if ref.kind == "hf" else ref.uri)  # KServe's hf form: hf://org/name:revision
        return Storage(uri, False, "unpublished: the source itself, not published by this "
                       "graph")
    return Storage(cfg.storage.variants_uri.format(model=spec.id, precision=precision), False,
                   f"unpublished: no {precision} variant was published for this model")


# ---- weights on the node: KServe LocalModelCache ----------------------------------------------
# How KServe (kserve/kserve at commit aaac4e294dae) serves a cached model:
# - the ISVC defaulter (pkg/apis/serving/v1beta1/inference_service_defaults.go setLocalModelLabel)
#   matches the predictor's storageUri to a LocalModelCache's sourceModelUri (equal, or a "/"
#   below it: pkg/apis/serving/v1alpha1/storage_uri_utils.go MatchStorageURI) whose nodeGroups
#   hold the ISVC's `serving.kserve.io/nodegroup` annotation, and records the PVC
#   `<cache>-<node group>`;
# - the pod mutator (pkg/webhook/admission/pod/storage_initializer_injector.go) rewrites the
#   source to pvc://<pvc>/models/<storage key>/ and mounts it at /mnt/models: no init container;
# - the node agent (pkg/controller/v1alpha1/localmodelnode/controller.go) keeps the weights in
#   <node group PV root>/models/<storage key>/, storage key = sha256(sourceModelUri)[:16]
#   (local_model_cache_types.go GetStorageKey), and deletes any other folder under models/.
NODE_GROUP_ANNOTATION = "serving.kserve.io/nodegroup"  # pkg/constants NodeGroupAnnotationKey


# The node cache is complete only when the filler says so: resources/cache_filler.py writes this
# file into the folder as its last step (after every verified file is in place), just before
# KServe's download Job succeeds and the agent marks the model ModelDownloaded
# (localmodelnode/controller.go getModelStatusFromJobStatus). KServe itself starts a cached
# predictor on whatever the folder holds (storage_initializer_injector.go mounts the PVC, nothing
# waits), so every cached pod carries an init container that waits for this file: until then
# the pod is not Ready, its Service has no endpoint, and neither KServe's route nor the gateway
# reaches it.
CACHE_COMPLETE = ".onboarding-complete"
PVC_SOURCE_VOLUME = "kserve-pvc-source"  # pkg/constants PvcSourceMountName
CACHE_WAIT_CONTAINER = "wait-for-node-cache"
CACHE_WAIT_MOUNT = "/mnt/node-cache"


def cache_gate(pvc_name: str, source_uri: str, image: str, poll_s: int = 10
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The init container that holds a cached pod until the node's folder is complete, and the
    volume it reads. The volume has the name and claim KServe's pod mutator gives the model's
    own mount (utils.AddModelMount in pkg/utils/storage.go reuses a volume of that name; the
    claim is `<LocalModelCache>-<node group>`, inference_service_defaults.go
    setLocalModelLabel), so the pod holds one volume, mounted read-only; the init container
    sees exactly `models/<storage key>`, the folder the engine gets. Requests equal limits:
    the pod stays Guaranteed."""
    marker = f"{CACHE_WAIT_MOUNT}/{CACHE_COMPLETE}"
    script = (f'until [ -f {marker} ]; do echo "waiting for the node cache of {source_uri} '
              f'(KServe download Job)"; sleep {poll_s}; done; cat {marker}')
    init = {"name": CACHE_WAIT_CONTAINER, "image": image, "command": ["sh", "-c", script],
            "volumeMounts": [{"name": PVC_SOURCE_VOLUME, "mountPath": CACHE_WAIT_MOUNT,
                              "subPath": f"models/{storage_key(source_uri)}",
                              "readOnly": True}],
            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"},
                          "limits": {"cpu": "50m", "memory": "32Mi"}}}
    volume = {"name": PVC_SOURCE_VOLUME,
              "persistentVolumeClaim": {"claimName": pvc_name, "readOnly": True}}
    return init, volume


def storage_key(source_uri: str) -> str:
    return hashlib.sha256(source_uri.encode()).hexdigest()[:16]


def agent_model_dir(cache_root: str, source_uri: str) -> str:
    """Where the node holds a cached variant: KServe's agent layout under the cache root. The
    pipeline's own cache (`<root>/<model>/<revision>/`) lives beside it, never under models/."""
    return f"{cache_root.rstrip('/')}/models/{storage_key(source_uri)}"


def node_group_name(node_type: str) -> str:
    return to_dns1123_label(f"{node_type}-nvme-cache", 30)


def cache_name(model_id: str, precision: str, uri: str) -> str:
    """Cluster-scoped, one per published variant: KServe refuses a second LocalModelCache with
    the same sourceModelUri (pkg/webhook/admission/localmodelcache/localmodelcache_validator.go),
    so every node type serving it shares this one. KServe names the PVC `<cache>-<node group>`,
    so it stays short."""
    base = to_dns1123_label(f"{model_id}-{precision}", 24)
    return to_dns1123_label(f"{base}-{storage_key(uri)[:8]}", 33)


def _gi(n_bytes: int) -> int:
    return max(1, math.ceil(n_bytes / GIB))


def render_node_group(node_type: str, node: NodeType, cfg: LocalModelCacheConfig
                      ) -> dict[str, Any]:
    """The node type's NVMe cache root as KServe's LocalModelNodeGroup: a local PV at the root
    on the nodes of this GPU product, and the PVC spec KServe copies per namespace."""
    c = cfg.node_types[node_type]
    size = f"{c.storage_limit_gib}Gi"
    return {
        "apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelNodeGroup",
        "metadata": {"name": node_group_name(node_type),
                     "labels": {"app.kubernetes.io/part-of": "model-onboarding",
                                f"{LABEL_PREFIX}/node-type": node_type}},
        "spec": {
            "storageLimit": size,
            "persistentVolumeSpec": {
                "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                "capacity": {"storage": size}, "local": {"path": c.cache_root},
                "storageClassName": cfg.storage_class,
                "persistentVolumeReclaimPolicy": "Retain",
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{
                    "key": "nvidia.com/gpu.product", "operator": "In",
                    "values": [node.gpu_product]}]}]}}},
            "persistentVolumeClaimSpec": {
                "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                "resources": {"requests": {"storage": size}},
                "storageClassName": cfg.storage_class},
        },
    }


def render_local_model_cache(name: str, uri: str, total_bytes: int, groups: list[str],
                             service_account: str, model_id: str, precision: str
                             ) -> dict[str, Any]:
    return {
        "apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelCache",
        "metadata": {"name": name, "labels": {
            "app.kubernetes.io/part-of": "model-onboarding",
            f"{LABEL_PREFIX}/model": label_value(model_id),
            f"{LABEL_PREFIX}/precision": precision, f"{LABEL_PREFIX}/published": "true"}},
        "spec": {"sourceModelUri": uri, "modelSize": f"{_gi(total_bytes)}Gi",
                 "nodeGroups": groups, "serviceAccountName": service_account},
    }


def _cached(ri: RenderInputs) -> bool:
    """A published variant on a node type with a configured cache deploys from the cache."""
    return (ri.storage.published and ri.storage.total_bytes is not None
            and ri.node_type in ri.deploy.local_model_cache.node_types)


def _probe(path: str, port: int, period: int, threshold: int, timeout: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period,
            "failureThreshold": threshold, "timeoutSeconds": timeout, "successThreshold": 1}


def deployment_mode(cfg: DeployConfig, kserve_version: str) -> str:
    """deploy.yaml's mode in the spelling of this KServe version (0.16 renamed the modes)."""
    raw = _MODE_FAMILY[cfg.deployment_mode] == "raw"
    if Version(kserve_version) >= Version("0.16"):
        return "Standard" if raw else "Knative"
    return "RawDeployment" if raw else "Serverless"


# ---- the pod KServe will create, and its QoS class ------------------------------------------


def _uses_storage_initializer(uri: str) -> bool:
    """pvc:// is mounted, every remote scheme downloaded by the init container (kserve v0.20.0
    pkg/webhook/admission/pod/storage_initializer_injector.go)."""
    return uri.split("://", 1)[0] in ("s3", "gs", "hf", "http", "https", "azure")


def predicted_pod(isvc: dict[str, Any], cfg: DeployConfig, cached: bool = False
                  ) -> dict[str, Any]:
    """The predictor pod's containers as KServe builds them: the model container, and the
    storage-initializer init container when the storageUri needs one (its resources come from
    the cluster's ConfigMap, mirrored in deploy.yaml `storage_initializer`). A storageUri a
    LocalModelCache matches (`cached`) becomes a pvc:// source the mutator mounts directly."""
    model = isvc["spec"]["predictor"]["model"]
    pod: dict[str, Any] = {"containers": [{"name": RUNTIME_CONTAINER,
                                           "resources": model.get("resources", {})}]}
    si = cfg.storage_initializer
    own = [{"name": c["name"], "resources": c.get("resources", {})}
           for c in isvc["spec"]["predictor"].get("initContainers", [])]
    if own:
        pod["initContainers"] = own
    if not cached and _uses_storage_initializer(model.get("storageUri", "")):
        pod.setdefault("initContainers", []).append({"name": "storage-initializer", "resources": {
            "requests": {"cpu": si.cpu_request, "memory": si.memory_request},
            "limits": {"cpu": si.cpu_limit, "memory": si.memory_limit}}})
    return pod


def pod_qos_class(pod: dict[str, Any]) -> tuple[str, str]:
    """Kubernetes' QoS class of a pod spec (init containers included), and why.

    Guaranteed: every container sets cpu and memory limits equal to its requests. BestEffort:
    no container sets any. Burstable otherwise.
    """
    containers = [*pod.get("initContainers", []), *pod.get("containers", [])]
    if not any((c.get("resources") or {}).get(k) for c in containers
               for k in ("requests", "limits")):
        return "BestEffort", "no container sets requests or limits"
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        for r in ("cpu", "memory"):
            if r not in lim or req.get(r, lim[r]) != lim[r]:
                return "Burstable", (f"container {c['name']}: {r} request "
                                     f"{req.get(r, 'unset')} != limit {lim.get(r, 'unset')}")
    return "Guaranteed", "every container (init containers too) has requests = limits"


# ---- the documents --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RenderInputs:
    """Everything one model x node type manifest is rendered from."""

    spec: ModelSpec
    plan: DeploymentPlan
    node_type: str
    node: NodeType
    stack: Stack
    deploy: DeployConfig
    config: EngineConfig
    evidence: Evidence
    storage: Storage
    # node types whose manifests deploy this same published variant from a node cache: one
    # LocalModelCache holds all their node groups (empty: this node type alone)
    cache_node_types: tuple[str, ...] = ()
    # a packed layout: the pod is pinned to a node whose GPUs its neighbours hold (Recreate)
    packed: bool = False
    priority_class: str = ""  # empty: deploy.yaml lifecycle.priority_class


@dataclass(frozen=True, kw_only=True)
class Route:
    served_name: str
    service: str
    namespace: str
    node_type: str
    precision: str
    tensor_parallel: int
    published: bool = False  # the storageUri is a variant this graph published and verified
    measured: bool = False  # benchmarked or load-timed at exactly this configuration
    config_hash: str = ""
    e2e_p99_s: float | None = None  # measured at the target concurrency (slowest scenario)
    ttft_p99_s: float | None = None
    judged_at: int | None = None
    # an LLMInferenceService: KServe's own Gateway and scheduler front it, not this gateway
    via_router: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.service}"


def split_routes(routes: list[Route], require_measured: bool
                 ) -> tuple[list[Route], dict[str, str]]:
    """The routes a gateway may send traffic to, and why each other one is left out: a pod
    loads only a published, verified variant; a blocking (gpu) profile also wants the
    configuration measured at its hash."""
    routed, left_out = [], {}
    for r in routes:
        if r.via_router:
            left_out[r.key] = ("an LLMInferenceService: KServe's Gateway (HTTPRoute) and its "
                               "scheduler route to it, on port 8000 of its workload Service")
        elif not r.published:
            left_out[r.key] = (f"not published: no verified {r.precision} variant of "
                               f"{r.served_name} in the serving bucket; a pod could not load it")
        elif require_measured and not r.measured:
            left_out[r.key] = (f"not measured at configuration {r.config_hash} on {r.node_type} "
                               "(the gpu profile routes only what was measured)")
        else:
            routed.append(r)
    return routed, left_out


def route_timeouts(r: Route, gw: GatewayConfig) -> tuple[int, int, str]:
    """(timeout, stream_timeout, basis): measured E2E p99 x margin and TTFT p99 x margin at
    the target concurrency; the labelled default where nothing was measured."""
    if r.e2e_p99_s is None or r.ttft_p99_s is None:
        d = gw.unmeasured_timeout_s
        return d, d, (f"default {d} s (deploy.yaml gateway.unmeasured_timeout_s): no benchmark "
                      f"at configuration {r.config_hash}")
    timeout = math.ceil(r.e2e_p99_s * gw.timeout_margin)
    scaled = math.ceil(r.ttft_p99_s * gw.stream_timeout_margin)
    stream = max(scaled, gw.min_stream_timeout_s)
    floor = (f", floor {gw.min_stream_timeout_s} s (gateway.min_stream_timeout_s: the TTFT was "
             "measured at the benchmark's prompts, not at max-model-len)"
             if stream > scaled else "")
    return timeout, stream, (
        f"measured at concurrency {r.judged_at}: E2E p99 {r.e2e_p99_s:.1f} s x "
        f"{gw.timeout_margin:g}, TTFT p99 {r.ttft_p99_s:.2f} s x {gw.stream_timeout_margin:g}"
        f"{floor} (configuration {r.config_hash})")


@dataclass(frozen=True, kw_only=True)
class Rendered:
    node_type: str
    service: str
    runtime: str
    docs: tuple[dict[str, Any], ...]
    startup: StartupProbePlan
    route: Route
    switches: tuple[str, ...]
    qos_class: str = ""
    config_hash: str = ""
    measured: bool = False
    published: bool = False


def runtime_name(config: EngineConfig) -> str:
    digest = hashlib.sha256(config.image.encode()).hexdigest()[:6]
    return to_dns1123_label(f"{config.engine}-{config.engine_version}-{config.hardware}-{digest}")


def metrics_path(config: EngineConfig, stack: Stack, cfg: DeployConfig) -> str:
    """Where the pod's engine serves Prometheus text: deploy.yaml's override, else its
    template's."""
    if cfg.metrics_path:
        return cfg.metrics_path
    template = stack.templates.get(config.engine)
    if template is None:
        raise ConfigError(f"configuration {config.hash}: engine {config.engine!r}",
                          "has no template in stack.yaml engines",
                          "Re-materialize serving_config with the current stack.yaml.")
    return template.metrics.path


def render_servingruntime(config: EngineConfig, stack: Stack, cfg: DeployConfig
                          ) -> dict[str, Any]:
    runtime = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {
            "name": runtime_name(config),
            "namespace": cfg.namespace,
            "labels": {
                "app.kubernetes.io/part-of": "model-onboarding",
                f"{LABEL_PREFIX}/engine": config.engine,
                f"{LABEL_PREFIX}/engine-version": label_value(config.engine_version),
                f"{LABEL_PREFIX}/arch": config.hardware,
                f"{LABEL_PREFIX}/stack-fingerprint": stack.fingerprint,
            },
        },
        "spec": {
            "annotations": {"prometheus.kserve.io/port": str(cfg.container_port),
                            "prometheus.kserve.io/path": metrics_path(config, stack, cfg)},
            "supportedModelFormats": [{"name": config.engine, "version": "1",
                                       "autoSelect": False}],
            "multiModel": False,
            "containers": [{
                "name": RUNTIME_CONTAINER,
                "image": config.image,
                "command": list(config.container_command),
                "ports": [{"containerPort": cfg.container_port, "protocol": "TCP"}],
                "env": [{"name": "HF_HOME", "value": "/tmp/hf"},
                        {"name": "HF_HUB_OFFLINE", "value": "1"}],
            }],
        },
    }
    if config.never_measured:
        runtime["metadata"]["annotations"] = {f"{LABEL_PREFIX}/engine-measured":
                                              config.never_measured}
    return runtime


def _model(ri: RenderInputs, startup: StartupProbePlan) -> dict[str, Any]:
    """predictor.model: the configuration's args and env, resources (requests = limits) and the
    three probes."""
    cfg, node_t, c = ri.deploy, ri.node, ri.config
    port, probes, tp = cfg.container_port, cfg.probes, c.tensor_parallel
    # No credential here: the storage initializer, not the engine, reads the source, and KServe
    # gives it the secrets of the predictor's service account (HF_TOKEN, S3 keys: kserve v0.20.0
    # pkg/credentials/service_account_credentials.go); the engine runs offline.
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(c.env.items())]
    # the pod's share of its node: tp x the per-GPU host share (nodes.yaml), /dev/shm inside it
    # (a memory-backed emptyDir counts against the pod's memory), so pods that fill a node
    # together never ask for more than it has
    shm_gib = cfg.shm_gib_per_gpu * tp if tp > 1 else 0
    resources = {"cpu": str(tp * node_t.cpu_per_gpu),
                 "memory": f"{tp * node_t.host_memory_gib_per_gpu}Gi",
                 "nvidia.com/gpu": str(tp)}
    requests = dict(resources)
    if not _cached(ri) and _uses_storage_initializer(ri.storage.uri):
        requests["ephemeral-storage"] = f"{ephemeral_gib(ri)}Gi"
    model: dict[str, Any] = {
        "modelFormat": {"name": c.engine},
        "runtime": runtime_name(c),
        "storageUri": ri.storage.uri,
        "args": c.args(MODEL_DIR, port),
        "env": env,
        "resources": {"requests": requests, "limits": dict(resources)},
        "startupProbe": _probe(probes.path, port, probes.period_s, startup.failure_threshold,
                               probes.timeout_s),
        "readinessProbe": _probe(probes.path, port, probes.period_s,
                                 probes.readiness_failure_threshold, probes.timeout_s),
        "livenessProbe": _probe(probes.path, port, probes.liveness_period_s,
                                probes.liveness_failure_threshold, probes.timeout_s),
        "lifecycle": _pre_stop(cfg.lifecycle),
    }
    if not env:
        del model["env"]
    if shm_gib:
        model["volumeMounts"] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    return model


def _weight_bytes(ri: RenderInputs) -> int:
    return ri.storage.total_bytes or ri.plan.node(ri.node_type).weight_bytes or 0


def ephemeral_gib(ri: RenderInputs) -> int:
    """The storage initializer's emptyDir: the weights x (1 + margin) + extra, in GiB."""
    es = ri.deploy.ephemeral_storage
    return math.ceil(_weight_bytes(ri) * (1 + es.margin) / GIB) + es.extra_gib


def _weights_on_node(ri: RenderInputs) -> str:
    if _cached(ri):
        root = ri.deploy.local_model_cache.node_types[ri.node_type].cache_root
        return (f"cached: LocalModelCache on node group {node_group_name(ri.node_type)}, the "
                f"node's {agent_model_dir(root, ri.storage.uri)}; the pod mounts it, no pod "
                "downloads at start")
    if not _uses_storage_initializer(ri.storage.uri):
        return f"mounted from {ri.storage.uri.split('://')[0]}:// (no download)"
    es = ri.deploy.ephemeral_storage
    why = ("unpublished" if not ri.storage.published else
           f"no cache configured for {ri.node_type} in deploy.yaml local_model_cache")
    return (f"downloaded at every pod start by the storage initializer into an emptyDir "
            f"(no LocalModelCache: {why}); ephemeral-storage request {ephemeral_gib(ri)}Gi = "
            f"weights {gib(_weight_bytes(ri))} GiB x {1 + es.margin:g} + {es.extra_gib} GiB")


def _annotations(ri: RenderInputs, node: NodePlan, startup: StartupProbePlan,
                 switches: list[EngineSwitch], qos: tuple[str, str]) -> dict[str, str]:
    ev = ri.evidence
    throughput = (f"measured: {ev.tokens_per_s_per_gpu:g} tokens/s/GPU at configuration "
                  f"{ev.config_hash} on {ri.node_type}" if ev.tokens_per_s_per_gpu is not None
                  else f"absent: never benchmarked at configuration {ev.config_hash} on "
                  f"{ri.node_type}")
    annotations = {
        "serving.kserve.io/deploymentMode": deployment_mode(ri.deploy, ri.stack.kserve_version),
        "serving.kserve.io/enable-prometheus-scraping": "true",
        f"{LABEL_PREFIX}/served-model-name": ri.spec.served_name,
        f"{LABEL_PREFIX}/source": ri.spec.source,
        f"{LABEL_PREFIX}/configuration": ev.basis,
        f"{LABEL_PREFIX}/storage": ri.storage.why,
        f"{LABEL_PREFIX}/plan": node.reason,
        f"{LABEL_PREFIX}/weights": (f"{node.weight_basis}: {node.weight_bytes} bytes "
                                    f"{node.precision}"),
        f"{LABEL_PREFIX}/gpus": (f"{node.tensor_parallel} x {ri.node.gpu_product}; the device "
                                 "plugin picks which, and the kubelet's topology manager can "
                                 "align them with CPUs only for a Guaranteed pod (qos-class)"),
        f"{LABEL_PREFIX}/qos-class": f"{qos[0]}: {qos[1]}",
        f"{LABEL_PREFIX}/startup-probe": startup.explanation,
        f"{LABEL_PREFIX}/weights-on-node": _weights_on_node(ri),
        f"{LABEL_PREFIX}/throughput": throughput,
    }
    if ev.slo_pass is not None:
        annotations[f"{LABEL_PREFIX}/slo"] = (
            f"{'met' if ev.slo_pass else 'missed'} at configuration {ev.config_hash}")
    if switches:
        annotations[f"{LABEL_PREFIX}/engine-switches"] = "; ".join(
            f"{' '.join([*(f'{k}={v}' for k, v in sorted(s.env.items())), *s.args])}: {s.why}"
            + (f" (pinned: {s.pinned})" if s.pinned else "")
            for s in switches)
    if ri.config.notes:
        annotations[f"{LABEL_PREFIX}/configuration-notes"] = "; ".join(ri.config.notes)
    if ri.config.never_measured:
        annotations[f"{LABEL_PREFIX}/engine-measured"] = ri.config.never_measured
    if ev.kernels:  # what the measured starts ran, from the engine's log (serving/kernels.py)
        annotations[f"{LABEL_PREFIX}/kernels"] = ev.kernels
        annotations[f"{LABEL_PREFIX}/kernel-gate"] = ev.kernel_verdict
    return annotations


# ---- pod lifecycle ------------------------------------------------------------------------
# KServe v0.20.0 constants (pkg/constants/constants.go): the autoscaler class annotation and its
# values (hpa, external, keda, none; hpa the default, scaling on CPU), the predictor pod's label
# serving.kserve.io/inferenceservice=<name> and component=predictor; an LLMInferenceService's
# workload pods carry GetWorkloadLabelSelector's labels (pkg/controller/v1alpha2/llmisvc/
# workload.go).
AUTOSCALER_CLASS = "serving.kserve.io/autoscalerClass"
ISVC_POD_LABEL = "serving.kserve.io/inferenceservice"


def autoscaler_class(replicas: Replicas) -> str:
    """KServe's default class (hpa) scales on CPU, which says nothing of a GPU engine's load.
    Fixed replicas: `none` (KServe pins the Deployment to minReplicas). A range: `external`, so
    KServe creates no HPA and leaves the Deployment's replicas to the queue-based scaler
    (kserve v0.20.0 pkg/controller/v1beta1/inferenceservice/reconcilers/deployment/
    deployment_reconciler.go; hpa/hpa_reconciler.go)."""
    return "external" if replicas.max > replicas.min else "none"


def _pre_stop(lc: LifecycleConfig) -> dict[str, Any]:
    """A preStop sleep: the pod leaves its Service's endpoints before the engine is signalled."""
    return {"preStop": {"exec": {"command": ["sleep", str(lc.drain_s)]}}}


def termination_grace(ri: RenderInputs, route: Route) -> tuple[int, str]:
    """drain + the longest request the gateway lets run (its timeout): in-flight requests
    finish before the kubelet kills the engine."""
    timeout, _, basis = route_timeouts(route, ri.deploy.gateway)
    grace = ri.deploy.lifecycle.drain_s + timeout
    return grace, (f"{grace} s = preStop drain {ri.deploy.lifecycle.drain_s} s + the gateway's "
                   f"request timeout {timeout} s ({basis})")


def deployment_strategy(gpus: int, gpus_per_node: int, packed: bool = False
                        ) -> dict[str, Any] | None:
    """Recreate where a surge pod cannot be placed: a pod that takes every GPU of its node, or a
    packed layout whose pods are pinned to their node. Otherwise KServe's RollingUpdate."""
    if packed or gpus >= gpus_per_node:
        return {"type": "Recreate"}
    return None


def render_pdb(name: str, namespace: str, selector: dict[str, str], labels: dict[str, str],
               max_unavailable: int) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": f"{name}-pdb", "namespace": namespace, "labels": labels},
            "spec": {"maxUnavailable": max_unavailable,
                     "selector": {"matchLabels": dict(selector)}}}


def check_pdb(doc: dict[str, Any]) -> list[str]:
    """policy/v1 PodDisruptionBudget as the API server validates it (no CRD to read)."""
    errors = []
    meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta.get("name", "")) or len(
            meta.get("name", "")) > 253:
        errors.append(f"$.metadata.name: {meta.get('name')!r} is not a DNS-1123 subdomain")
    if ("minAvailable" in spec) == ("maxUnavailable" in spec):
        errors.append("$.spec: exactly one of minAvailable and maxUnavailable")
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    if not labels or not all(isinstance(v, str) for v in labels.values()):
        errors.append("$.spec.selector.matchLabels: required, string values")
    unknown = set(spec) - {"minAvailable", "maxUnavailable", "selector",
                           "unhealthyPodEvictionPolicy"}
    errors += [f"$.spec.{k}: unknown field" for k in sorted(unknown)]
    return errors


def render(ri: RenderInputs) -> Rendered:
    """ServingRuntime + InferenceService for one model on one node type: exactly `ri.config`."""
    spec, cfg, stack, node_t, c = ri.spec, ri.deploy, ri.stack, ri.node, ri.config
    node = ri.plan.node(ri.node_type)
    if not node.feasible or node.tensor_parallel is None or node.precision is None:
        raise ConfigError(
            f"model {spec.id!r} on {ri.node_type}", f"no feasible plan ({node.reason})",
            "Remove the node type from deploy.yaml target_node_types, or change the model's "
            "precision ladder, context or concurrency.",
        )
    if node_t.arch not in stack.images:
        raise ConfigError(
            f"stack.yaml images.cuda_major.{node_t.arch}", "required but missing",
            f"Add the CUDA major {ri.node_type} nodes ({node_t.arch}) run to images.cuda_major.",
        )
    if c.image != stack.images[node_t.arch]:
        raise ConfigError(
            f"configuration {c.hash} of {spec.id!r} on {ri.node_type}",
            f"image {c.image!r} is not the tag stack.yaml's image rule produces for "
            f"{stack.engine} {stack.engine_version} on {node_t.arch} "
            f"({stack.images[node_t.arch]!r})",
            "Re-materialize serving_config with the current stack.yaml.",
        )
    name = service_name(spec.id, ri.node_type)
    cached = _cached(ri)
    startup = startup_probe_plan(ri.evidence.cold_start_p95_s, cfg.probes, ri.storage.pull_s,
                                 ri.evidence.cold_start_samples, ri.evidence.cold_start_max_s,
                                 cached)
    switches = stack.switches_for(node.precision, ri.plan.inputs.shape.moe, node_t.arch)
    ev = ri.evidence
    via_router = ri.node_type in cfg.llm_inference_service_node_types
    route = Route(served_name=spec.served_name, service=name, namespace=cfg.namespace,
                  node_type=ri.node_type, precision=node.precision,
                  tensor_parallel=node.tensor_parallel, published=ri.storage.published,
                  measured=ev.measured, config_hash=c.hash, e2e_p99_s=ev.e2e_p99_s,
                  ttft_p99_s=ev.ttft_p99_s, judged_at=ev.judged_at, via_router=via_router)
    grace, grace_why = termination_grace(ri, route)
    priority = ri.priority_class or cfg.lifecycle.priority_class
    predictor: dict[str, Any] = {
        "minReplicas": cfg.replicas.min,
        "maxReplicas": cfg.replicas.max,
        "serviceAccountName": cfg.service_account,
        "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port":
                        str(cfg.container_port),
                        "prometheus.io/path": metrics_path(c, stack, cfg)},
        "nodeSelector": {"nvidia.com/gpu.product": node_t.gpu_product},
        "tolerations": node_tolerations(node_t),
        "priorityClassName": priority,
        "terminationGracePeriodSeconds": grace,
        "model": _model(ri, startup),
    }
    strategy = deployment_strategy(node.tensor_parallel, node_t.gpus_per_node, ri.packed)
    if strategy:
        predictor["deploymentStrategy"] = strategy
    if "volumeMounts" in predictor["model"]:
        predictor["volumes"] = [{"name": SHM_VOLUME, "emptyDir": {
            "medium": "Memory",
            "sizeLimit": f"{cfg.shm_gib_per_gpu * node.tensor_parallel}Gi"}}]
    if cached:  # held until the node's cache folder is complete (cache_gate)
        init, volume = cache_gate(
            f"{cache_name(spec.id, node.precision, ri.storage.uri)}-"
            f"{node_group_name(ri.node_type)}", ri.storage.uri,
            cfg.local_model_cache.filler_image)
        predictor["initContainers"] = [init]
        predictor.setdefault("volumes", []).append(volume)
    isvc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": cfg.namespace}, "spec":
            {"predictor": predictor}}
    qos = pod_qos_class(predicted_pod(isvc, cfg, cached))
    isvc["metadata"]["labels"] = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/part-of": "model-onboarding",
        f"{LABEL_PREFIX}/model": label_value(spec.id),
        f"{LABEL_PREFIX}/node-type": ri.node_type,
        f"{LABEL_PREFIX}/precision": node.precision,
        f"{LABEL_PREFIX}/tensor-parallel": str(node.tensor_parallel),
        f"{LABEL_PREFIX}/stack-fingerprint": stack.fingerprint,
        f"{LABEL_PREFIX}/config-hash": c.hash,
        f"{LABEL_PREFIX}/measured": "true" if ri.evidence.measured else "false",
        f"{LABEL_PREFIX}/published": "true" if ri.storage.published else "false",
        f"{LABEL_PREFIX}/weights-basis": node.weight_basis or "estimate",
        f"{LABEL_PREFIX}/probe-basis": startup.basis,
        f"{LABEL_PREFIX}/qos-class": qos[0],
    }
    isvc["metadata"]["annotations"] = _annotations(ri, node, startup, switches, qos)
    isvc["metadata"]["annotations"].update({
        AUTOSCALER_CLASS: autoscaler_class(cfg.replicas),
        f"{LABEL_PREFIX}/lifecycle": (
            f"termination grace {grace_why}; priority class {priority}; "
            f"at most {cfg.lifecycle.max_unavailable} pod(s) disrupted at once (PDB); "
            + ("Recreate: pinned to a packed layout node, a surge pod finds no GPU" if ri.packed
               else "Recreate: the pod takes every GPU of its node, a surge pod could not be "
               "placed" if strategy else "RollingUpdate (KServe's default)"))})
    cache_docs: list[dict[str, Any]] = []
    if cached:
        limit = cfg.local_model_cache.node_types[ri.node_type].storage_limit_gib
        if _gi(ri.storage.total_bytes or 0) > limit:
            raise ConfigError(
                f"deploy.yaml local_model_cache.node_types.{ri.node_type}.storage_limit_gib",
                f"{limit} GiB is less than the published {node.precision} variant of "
                f"{spec.id!r} ({_gi(ri.storage.total_bytes or 0)} GiB): KServe would never "
                "cache it on the node", "Raise storage_limit_gib to what the node's NVMe "
                "cache holds, or remove the node type from local_model_cache.")
        group = node_group_name(ri.node_type)
        isvc["metadata"]["annotations"][NODE_GROUP_ANNOTATION] = group
        cache_docs = [render_node_group(ri.node_type, node_t, cfg.local_model_cache),
                      render_local_model_cache(
                          cache_name(spec.id, node.precision, ri.storage.uri),
                          ri.storage.uri, ri.storage.total_bytes or 0,
                          sorted({group, *map(node_group_name, ri.cache_node_types)}),
                          cfg.service_account, spec.id, node.precision)]
    pdb_labels = {"app.kubernetes.io/part-of": "model-onboarding",
                  f"{LABEL_PREFIX}/model": label_value(spec.id),
                  f"{LABEL_PREFIX}/node-type": ri.node_type}
    if via_router:  # one serving object per model and node type, never both
        llm = render_llm_inference_service(ri, isvc, c)
        docs = [*cache_docs, llm, render_pdb(llm["metadata"]["name"], cfg.namespace, {
            "app.kubernetes.io/part-of": "llminferenceservice",
            "app.kubernetes.io/name": llm["metadata"]["name"], "kserve.io/component": "workload"},
            pdb_labels, cfg.lifecycle.max_unavailable)]
    else:
        docs = [render_servingruntime(c, stack, cfg), *cache_docs, isvc, render_pdb(
            name, cfg.namespace, {ISVC_POD_LABEL: name, "component": "predictor"}, pdb_labels,
            cfg.lifecycle.max_unavailable)]
    return Rendered(node_type=ri.node_type, service=name, runtime=runtime_name(c), docs=tuple(docs),
                    startup=startup, route=route, switches=tuple(s.why for s in switches),
                    qos_class=qos[0], config_hash=c.hash, measured=ri.evidence.measured,
                    published=ri.storage.published)


# KServe's LLMInferenceService at v0.20.0: its workload Service, InferencePool and HTTPRoute use
# port 8000 and KServe does not let it change (pkg/controller/v1alpha2/llmisvc/workload.go,
# reconcileWorkloadService); the preset `kserve-config-llm-template` (config/llmisvcconfig/
# config-llm-template.yaml) is the container's launcher: its command runs the engine on
# /mnt/models with --served-model-name from spec.model.name, --port 8000, the TLS flags and
# --tensor-parallel-size from spec.parallelism.tensor, then appends the container's args ($@);
# the service's template is merged over it by container name (config_merge.go).
LLM_ISVC_PORT = 8000


def llm_isvc_args(c: EngineConfig, template_flags: tuple[str, ...]) -> list[str]:
    """The configuration's engine arguments without those the preset's launcher sets itself
    (model path, port, served name, tensor parallelism): the launcher appends these."""
    return [a for a in (*c.param_args, *c.switch_args)
            if a.split("=", 1)[0] not in template_flags]


def render_llm_inference_service(ri: RenderInputs, isvc: dict[str, Any], c: EngineConfig
                                 ) -> dict[str, Any]:
    """KServe's LLMInferenceService (v1alpha2, the llm-d path) of exactly the configuration: the
    same image, engine arguments, env, resources, node selection, the same labels (measured /
    published / config hash) and the nodegroup annotation, which its defaulter matches to a
    LocalModelCache the same way (kserve pkg/webhook/admission/llminferenceservice/defaulter.go
    SetLocalModelLabel). No `command` (the preset's launcher stays), no port of its own: the
    preset's 8000. The startup probe carries the measured window; readiness, liveness and TLS
    come from the preset. The router is left to KServe's managed defaults."""
    pred, model = isvc["spec"]["predictor"], isvc["spec"]["predictor"]["model"]
    tp_flag = ri.stack.templates[c.engine].args["tensor_parallel_size"].flag \
        if c.engine in ri.stack.templates else None
    launcher_flags = tuple(f for f in (c.port_flag, c.served_name_flag, tp_flag) if f)
    startup = copy.deepcopy(model["startupProbe"])
    startup["httpGet"]["port"] = LLM_ISVC_PORT
    main: dict[str, Any] = {
        "name": "main", "image": c.image, "args": llm_isvc_args(c, launcher_flags),
        "resources": copy.deepcopy(model["resources"]), "startupProbe": startup,
        "lifecycle": copy.deepcopy(model["lifecycle"])}
    for k in ("env", "volumeMounts"):
        if k in model:
            main[k] = copy.deepcopy(model[k])
    template: dict[str, Any] = {"serviceAccountName": pred["serviceAccountName"],
                                "nodeSelector": dict(pred["nodeSelector"]),
                                "tolerations": copy.deepcopy(pred["tolerations"]),
                                "priorityClassName": pred["priorityClassName"],
                                "terminationGracePeriodSeconds":
                                    pred["terminationGracePeriodSeconds"],
                                "containers": [main]}
    if "volumes" in pred:
        template["volumes"] = copy.deepcopy(pred["volumes"])
    if "initContainers" in pred:  # the node-cache gate: the llmisvc controller mounts the same
        # volume name for a cached model (v1alpha2/llmisvc/workload_storage.go
        # attachPVCModelArtifact)
        template["initContainers"] = copy.deepcopy(pred["initContainers"])
    annotations = {k: v for k, v in isvc["metadata"]["annotations"].items()
                   if k.startswith(LABEL_PREFIX) or k == NODE_GROUP_ANNOTATION}
    return {
        "apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
        "metadata": {"name": f"{isvc['metadata']['name']}-llm",
                     "namespace": isvc["metadata"]["namespace"],
                     "labels": dict(isvc["metadata"]["labels"]), "annotations": annotations},
        "spec": {
            "model": {"uri": model["storageUri"], "name": ri.spec.served_name},
            **llm_inference_service_replicas(ri.deploy.replicas.min, ri.deploy.replicas.max),
            "parallelism": {"tensor": c.tensor_parallel},
            "router": {"route": {}, "gateway": {}, "scheduler": {}},
            "template": template,
        },
    }


def node_tolerations(node: NodeType) -> list[dict[str, str]]:
    """The GPU taint is always tolerated, plus every taint the node type declares."""
    out = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    for t in node.taints:
        tol = {"key": t.key, "operator": "Equal" if t.value else "Exists", "effect": t.effect}
        if t.value:
            tol["value"] = t.value
        if tol not in out:
            out.append(tol)
    return out


# ---- output ---------------------------------------------------------------------------------


def to_yaml(docs: tuple[dict[str, Any], ...] | list[dict[str, Any]], header: str = "") -> str:
    body = yaml.safe_dump_all(list(docs), sort_keys=False, default_flow_style=False, width=100)
    lines = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    return lines + body


def route_table(routes: list[Route], cfg: DeployConfig) -> dict[str, Any]:
    """LiteLLM proxy config: one model_name per served model, one deployment per service.

    Deployments sharing a model_name are load-balanced by LiteLLM, so a model served on two node
    types is one name behind the gateway.
    """
    gw = cfg.gateway
    model_list = []
    for r in sorted(routes, key=lambda r: (r.served_name, r.node_type, r.service)):
        timeout, stream_timeout, basis = route_timeouts(r, gw)
        model_list.append({
            "model_name": r.served_name,
            "litellm_params": {
                "model": f"{gw.provider}/{r.served_name}",
                "api_base": f"http://{r.service}-predictor.{r.namespace}.{gw.cluster_domain}/v1",
                "timeout": timeout,
                "stream_timeout": stream_timeout,
            },
            "model_info": {"id": f"{r.namespace}/{r.service}", "node_type": r.node_type,
                           "precision": r.precision, "tensor_parallel": r.tensor_parallel,
                           "timeout_basis": basis},
        })
    return {"model_list": model_list,
            "router_settings": {"routing_strategy": gw.routing_strategy}}


def inline_secret_findings(docs: Any, secret_values: tuple[str, ...] = ()) -> list[str]:
    """Every place a credential appears inline; empty means the output is safe to commit.

    Flags env vars whose name looks like a credential but carry a literal `value`, CLI flags of
    that kind, any occurrence of a known secret value (e.g. this process's AWS key), and any URL
    with userinfo or a query string (a pasted presigned URL), shown redacted.
    """
    found: list[str] = []
    values = tuple(v for v in secret_values if v and len(v) >= 8)

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("name"), str) and "value" in node and _SECRET_NAME.search(
                    node["name"]):
                found.append(f"{path}: env {node['name']} has an inline value")
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        elif isinstance(node, str):
            if re.match(r"^--[\w-]+=", node) and _SECRET_NAME.search(node.split("=", 1)[0]):
                found.append(f"{path}: argument {node.split('=', 1)[0]} carries a value")
            if any(v in node for v in values):
                found.append(f"{path}: contains a secret value from the environment")
            found.extend(f"{path}: URL {url} carries credentials or a signed query"
                         for url in secret_urls(node))

    walk(docs, "$")
    return found


def gib(n: int) -> float:
    return round(n / GIB, 2)
