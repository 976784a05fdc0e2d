"""Resources by key, wired from environment variables (the one place that reads them).

Local runs read the embedded defaults set by `scripts/dev.sh`; a cluster sets the same variables
from a Secret/ConfigMap. Each resource is the production class, configured differently. A
variable that is unset leaves the resource's own default (its description names the variable).
"""

from __future__ import annotations

import os

import dagster as dg

from resources.config_files import ConfigFiles, OutputDirs
from resources.engine import Engine
from resources.evaluator import LmEvalEvaluator
from resources.huggingface import HuggingFaceStore
from resources.loadgen import LoadGenerator
from resources.manifest_validator import ManifestValidator
from resources.node_probe import NodeProbe
from resources.nvme_cache import NvmeCache
from resources.predictor import AIConfiguratorPredictor
from resources.quantizer import ModelOptQuantizer
from resources.s3 import S3ObjectStore
from resources.telemetry import GpuTelemetry
from resources.upstream import optional_upstream


def _env(**fields: str) -> dict[str, dg.EnvVar]:
    """{field: EnvVar(name)} for each variable that is set; the value resolves at run time."""
    return {field: dg.EnvVar(name) for field, name in fields.items() if os.environ.get(name)}


def _env_int(**fields: str) -> dict[str, dg.EnvVar]:
    return {field: dg.EnvVar.int(name) for field, name in fields.items() if os.environ.get(name)}


# ConfigFiles field -> the variable that sets it
CONFIG_ENV = {"config_dir": "ONBOARDING_CONFIG_DIR", "discovered_dir": "ONBOARDING_DISCOVERED_DIR",
              "serving_profile": "ONBOARDING_SERVING_PROFILE",
              "discovery_bucket": "ONBOARDING_DISCOVERY_BUCKET",
              "discovery_prefix": "ONBOARDING_DISCOVERY_PREFIX",
              "engine_python": "ONBOARDING_ENGINE_PYTHON"}


def config_files() -> ConfigFiles:
    """The `configs` resource as the variables set it now, for what reads configuration
    outside a step or a tick: the executor when a run starts, run-config builders, scripts.
    The same fields from the same variables as the resource binding, so both doors are one."""
    return ConfigFiles(**{f: os.environ[n] for f, n in CONFIG_ENV.items() if os.environ.get(n)})


def config_resources() -> tuple[ConfigFiles, OutputDirs]:
    configs = ConfigFiles(**_env(**CONFIG_ENV))
    outputs = OutputDirs(**_env(manifests_dir="ONBOARDING_OUTPUT_DIR",
                                reports_dir="ONBOARDING_REPORTS_DIR"))
    return configs, outputs


def build_resources() -> dict[str, object]:
    configs, outputs = config_resources()
    telemetry = GpuTelemetry(**_env(dcgm_exporter_url="ONBOARDING_DCGM_EXPORTER_URL"))
    crd_paths = [p for p in os.environ.get("KSERVE_CRD_PATHS", "").split(os.pathsep) if p]
    return {
        "configs": configs,
        "outputs": outputs,
        "s3": S3ObjectStore(
            endpoint_url=dg.EnvVar("S3_ENDPOINT_URL"),
            access_key_id=dg.EnvVar("AWS_ACCESS_KEY_ID"),
            secret_access_key=dg.EnvVar("AWS_SECRET_ACCESS_KEY"),
        ),
        "hf": HuggingFaceStore(**_env(token="HF_TOKEN")),
        "engine": Engine(configs=configs, **_env(
            engine="ENGINE_KIND", bin_dir="ENGINE_BIN_DIR", hardware="ENGINE_HARDWARE",
            node_type="ONBOARDING_NODE_TYPE", node_name="ONBOARDING_NODE_NAME",
            gpus="ENGINE_GPUS", log_dir="ENGINE_LOG_DIR"),
            **_env_int(cpu_kvcache_space_gib="ENGINE_CPU_KVCACHE_SPACE_GIB", port="ENGINE_PORT"),
            **({"start_timeout_s": float(os.environ["ENGINE_START_TIMEOUT_S"])}
               if os.environ.get("ENGINE_START_TIMEOUT_S") else {})),
        "loadgen": LoadGenerator(),
        "telemetry": telemetry,
        # node acceptance: tools from PATH, GPU jobs in this interpreter unless
        # ONBOARDING_PROBE_PYTHON names one with CUDA torch
        "node_probe": NodeProbe(telemetry=telemetry, **_env(python="ONBOARDING_PROBE_PYTHON")),
        "nvme_cache": NvmeCache(root=dg.EnvVar("ONBOARDING_CACHE_ROOT")),
        "manifest_validator": ManifestValidator(
            crd_paths=crd_paths, **_env(kube_context="ONBOARDING_KUBE_CONTEXT")),
        "quantizer": ModelOptQuantizer(configs=configs),  # cuda when present
        # all items per task unless ONBOARDING_EVAL_LIMIT caps them (the demo's quick pass uses
        # 100, the gates' min_items)
        "evaluator": LmEvalEvaluator(configs=configs, **_env_int(limit="ONBOARDING_EVAL_LIMIT")),
        # Bound by name (not left to Dagster's implicit default) because `optional_upstream`
        # reads through it, and the sensor daemon resolves resources from these bindings only.
        # No base_dir: the instance's storage directory ($DAGSTER_HOME/storage; docs/cluster.md).
        "io_manager": dg.FilesystemIOManager(),
        "optional_upstream": optional_upstream,
        "predictor": AIConfiguratorPredictor(**_env(work_dir="ONBOARDING_PREDICT_WORK_DIR")),
    }
