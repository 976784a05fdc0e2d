"""The stack file and the node facts as the pure layer reads them; running the node's tools is
resources/stack_facts.py's (tests/resources/test_stack_facts.py)."""

from __future__ import annotations

import ast

import pytest

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.stack import ABSENT, nvidia_smi_facts, read_stack_config


def test_stack_file_needs_versions(tmp_path):
    assert read_stack_config(PROJECT_ROOT / "configs" / "stack.yaml")["versions"]["vllm"]
    bad = tmp_path / "stack.yaml"
    bad.write_text("images: {}\n")
    with pytest.raises(ConfigError, match="field 'versions'"):
        read_stack_config(bad)


def test_nvidia_smi_output_is_read_without_running_it():
    listed = "580.95.05, NVIDIA H200\n580.95.05, NVIDIA H200\n"
    header = "| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |"
    assert nvidia_smi_facts(listed, header) == {"nvidia_driver": "580.95.05",
                                                "cuda_driver_api": "13.0",
                                                "gpus": ["NVIDIA H200", "NVIDIA H200"]}
    assert nvidia_smi_facts("", "") == {"nvidia_driver": ABSENT, "cuda_driver_api": ABSENT,
                                        "gpus": []}


def test_the_stack_module_starts_no_process():
    """onboarding/ is the pure layer: the stack module parses facts, it does not run tools."""
    tree = ast.parse((PROJECT_ROOT / "onboarding" / "serving" / "stack.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"subprocess", "shutil", "os"}
