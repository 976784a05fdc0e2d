"""The serving stack's fingerprint: `configs/stack.yaml` plus what can be read off the node.

The fingerprint is the `serving_stack` asset's data version, so changing a version in the stack
file (or upgrading the engine in its virtualenv, or the driver) marks every stack-dependent
asset stale. The file is fingerprinted parsed, not as text: comments and key order do not count.
Node facts that cannot be read because the thing is absent (no `nvidia-smi` on a CPU node, no
engine virtualenv) are recorded as absent; a tool that is present but fails is an error.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from onboarding.common.config import load_yaml
from onboarding.common.errors import ConfigError, OnboardingError

ABSENT = "absent"
# Distributions whose version decides how a checkpoint is quantized, served or measured.
ENGINE_PACKAGES = ("vllm", "sglang", "flashinfer-python", "torch", "nvidia-nccl-cu12",
                   "nvidia-nccl-cu13", "nvidia-modelopt", "transformers")
_ENGINE_PROBE = (
    "import importlib.metadata as m, json, sys\n"
    "out = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        out[name] = m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        out[name] = None\n"
    "print(json.dumps(out))\n"
)
_CUDA_IN_SMI = re.compile(r"CUDA Version:\s*([0-9.]+)")


def read_stack_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(str(path), "does not exist",
                          "Restore configs/stack.yaml or point ONBOARDING_CONFIG_DIR at a copy.")
    data = load_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("versions"), dict):
        raise ConfigError(str(path), "field 'versions': expected a mapping of component to "
                          "version", "Keep the `versions:` section (see the repository's copy).")
    return data


def nvidia_facts(smi: str | None = None, timeout_s: float = 20.0) -> dict[str, Any]:
    """Driver, CUDA and GPU names from `nvidia-smi`; `absent` where the node has none."""
    smi = smi or shutil.which("nvidia-smi")
    if not smi:
        return {"nvidia_driver": ABSENT, "cuda_driver_api": ABSENT, "gpus": []}
    query = [smi, "--query-gpu=driver_version,name", "--format=csv,noheader"]
    try:
        listed = subprocess.run(query, capture_output=True, text=True, timeout=timeout_s,
                                check=True).stdout
        header = subprocess.run([smi], capture_output=True, text=True, timeout=timeout_s,
                                check=True).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise OnboardingError(f"{smi}", f"present but failed ({detail})",
                              "Fix the NVIDIA driver on this node (`nvidia-smi` must run), or "
                              "set stack.observe_node: false in configs/automation.yaml.") from None
    rows = [[c.strip() for c in line.split(",")] for line in listed.splitlines() if line.strip()]
    cuda = _CUDA_IN_SMI.search(header)
    return {"nvidia_driver": rows[0][0] if rows else ABSENT,
            "cuda_driver_api": cuda.group(1) if cuda else ABSENT,
            "gpus": sorted(r[1] for r in rows if len(r) > 1)}


def engine_facts(engine_python: Path, timeout_s: float = 60.0) -> dict[str, Any]:
    """Package versions inside the engine's virtualenv, read by its own interpreter."""
    if not engine_python.exists():
        return {"engine": ABSENT}
    try:
        out = subprocess.run([str(engine_python), "-I", "-c", _ENGINE_PROBE, *ENGINE_PACKAGES],
                             capture_output=True, text=True, timeout=timeout_s, check=True).stdout
        versions = json.loads(out)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError,
            ValueError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise OnboardingError(str(engine_python), f"cannot report its package versions ({detail})",
                              "Repair the engine virtualenv (scripts/setup_engine.sh) or point "
                              "stack.engine_python in configs/automation.yaml at a working "
                              "interpreter.") from None
    # The interpreter's path is left out: the same versions elsewhere are the same stack.
    return {f"engine.{k}": v for k, v in versions.items() if v is not None}


def torch_facts() -> dict[str, Any]:
    """The pipeline's own torch (quantization and evaluation run in it)."""
    import torch

    return {"pipeline.torch": torch.__version__, "pipeline.torch_cuda": torch.version.cuda or "cpu"}


def observe_node(engine_python: Path | None, smi: str | None = None) -> dict[str, Any]:
    facts = {**nvidia_facts(smi), **torch_facts()}
    if engine_python is not None:
        facts.update(engine_facts(engine_python))
    return facts


def fingerprint(config: dict[str, Any], node: dict[str, Any]) -> str:
    """sha256 over the parsed stack file and the node facts, canonical JSON."""
    blob = json.dumps({"config": config, "node": node}, sort_keys=True, separators=(",", ":"),
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """`{"versions": {"cuda": "13.0"}}` -> `{"versions.cuda": "13.0"}`; lists stay as values."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def diff(before: dict[str, Any] | None, after: dict[str, Any]) -> list[dict[str, Any]]:
    """Changed, added and removed leaves between two observations, sorted by field."""
    if before is None:
        return []
    old, new = flatten(before), flatten(after)
    rows = []
    for field in sorted(set(old) | set(new)):
        a, b = old.get(field, ABSENT), new.get(field, ABSENT)
        if a != b:
            rows.append({"field": field, "before": a, "after": b})
    return rows


def observation_body(config: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """What an observation stores (JSON metadata) so the next one can diff against it."""
    return {"config": config, "node": node}
