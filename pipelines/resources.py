"""Resources by key, built from environment variables so no secret is ever in code or logs.

Local runs read the embedded defaults set by `scripts/dev.sh`; a cluster sets the same variables
from a Secret/ConfigMap. Each resource is the production class, configured differently.
"""

from __future__ import annotations

import os

import dagster as dg

from resources.engine import Engine
from resources.evaluator import LmEvalEvaluator
from resources.huggingface import HuggingFaceStore
from resources.loadgen import LoadGenerator
from resources.manifest_validator import ManifestValidator
from resources.nvme_cache import NvmeCache
from resources.quantizer import ModelOptQuantizer
from resources.s3 import S3ObjectStore


def build_resources() -> dict[str, object]:
    return {
        "s3": S3ObjectStore(
            endpoint_url=dg.EnvVar("S3_ENDPOINT_URL"),
            access_key_id=dg.EnvVar("AWS_ACCESS_KEY_ID"),
            secret_access_key=dg.EnvVar("AWS_SECRET_ACCESS_KEY"),
        ),
        "hf": HuggingFaceStore(),
        "engine": Engine.from_env(),  # ENGINE_* env vars; default: vLLM CPU in .venv-engine
        "loadgen": LoadGenerator(),
        "nvme_cache": NvmeCache(root=dg.EnvVar("ONBOARDING_CACHE_ROOT")),
        "manifest_validator": ManifestValidator(),  # KSERVE_CRD_PATHS, ONBOARDING_KUBE_CONTEXT
        "quantizer": ModelOptQuantizer(),  # configs/quantization.yaml; cuda when present
        # configs/eval_tasks; all items per task unless ONBOARDING_EVAL_LIMIT caps them (the
        # demo's quick pass uses 100, the gates' min_items)
        "evaluator": LmEvalEvaluator(limit=int(os.environ["ONBOARDING_EVAL_LIMIT"])
                                     if os.environ.get("ONBOARDING_EVAL_LIMIT") else None),
    }
