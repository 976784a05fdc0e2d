"""Node facts for the stack fingerprint, read on this node: absent tools are recorded, broken
ones are errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from onboarding.common.errors import OnboardingError
from onboarding.serving.stack import ABSENT
from resources.stack_facts import engine_facts, nvidia_facts


def test_engine_versions_come_from_the_engines_own_interpreter():
    facts = engine_facts(Path(sys.executable))
    assert facts["engine.torch"].startswith("2.") and "engine.pytest" not in facts
    assert engine_facts(Path("/nonexistent/python")) == {"engine": ABSENT}


def test_a_broken_engine_interpreter_is_an_error(tmp_path):
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(OnboardingError, match="boom"):
        engine_facts(broken)


def test_nvidia_smi_absent_or_failing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a node without the NVIDIA driver
    assert nvidia_facts() == {"nvidia_driver": ABSENT, "cuda_driver_api": ABSENT, "gpus": []}
    failing = tmp_path / "nvidia-smi"
    failing.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    failing.chmod(0o755)
    with pytest.raises(OnboardingError, match="present but failed"):
        nvidia_facts(smi=str(failing))


def test_nvidia_smi_output_is_parsed(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nif [ -n \"$1\" ]; then\n"
                   "echo '580.95.05, NVIDIA H200'\necho '580.95.05, NVIDIA H200'\nelse\n"
                   "echo '| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   "
                   "CUDA Version: 13.0 |'\nfi\n")
    smi.chmod(0o755)
    assert nvidia_facts(smi=str(smi)) == {"nvidia_driver": "580.95.05",
                                          "cuda_driver_api": "13.0",
                                          "gpus": ["NVIDIA H200", "NVIDIA H200"]}
