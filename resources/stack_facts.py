"""The node facts of the stack fingerprint, read on this node: the NVIDIA driver through
`nvidia-smi`, the engine virtualenv's package versions through its own interpreter, and the
pipeline's torch. onboarding/serving/stack.py parses what these print and fingerprints it; the
processes run here. A tool that is absent is recorded as absent; one present but failing is an
error that says what to fix.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from onboarding.common.errors import OnboardingError
from onboarding.serving.stack import (
    ABSENT,
    ENGINE_PROBE,
    NO_NVIDIA,
    STACK_PACKAGES,
    engine_versions_facts,
    nvidia_smi_facts,
)


def nvidia_facts(smi: str | None = None, timeout_s: float = 20.0) -> dict[str, Any]:
    """Driver, CUDA and GPU names from `nvidia-smi`; `absent` where the node has none."""
    smi = smi or shutil.which("nvidia-smi")
    if not smi:
        return dict(NO_NVIDIA, gpus=[])
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
    return nvidia_smi_facts(listed, header)


def engine_facts(engine_python: Path, packages: tuple[str, ...] = STACK_PACKAGES,
                 timeout_s: float = 60.0) -> dict[str, Any]:
    """Versions of `packages` inside the engine's virtualenv, read by its own interpreter
    (`Stack.fingerprint_packages`: the engines' distributions and the rest of the stack)."""
    if not engine_python.exists():
        return {"engine": ABSENT}
    try:
        out = subprocess.run([str(engine_python), "-I", "-c", ENGINE_PROBE, *packages],
                             capture_output=True, text=True, timeout=timeout_s, check=True).stdout
        versions = json.loads(out)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError,
            ValueError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise OnboardingError(str(engine_python), f"cannot report its package versions ({detail})",
                              "Repair the engine virtualenv (scripts/setup_engine.sh) or point "
                              "stack.engine_python in configs/automation.yaml at a working "
                              "interpreter.") from None
    return engine_versions_facts(versions)


def torch_facts() -> dict[str, Any]:
    """The pipeline's own torch (quantization and evaluation run in it)."""
    import torch

    return {"pipeline.torch": torch.__version__, "pipeline.torch_cuda": torch.version.cuda or "cpu"}


def observe_node(engine_python: Path | None, packages: tuple[str, ...] = STACK_PACKAGES,
                 smi: str | None = None) -> dict[str, Any]:
    """Every node fact of the fingerprint: driver, pipeline torch, and (when the node has an
    engine virtualenv to ask) the engine's packages."""
    facts = {**nvidia_facts(smi), **torch_facts()}
    if engine_python is not None:
        facts.update(engine_facts(engine_python, packages))
    return facts
