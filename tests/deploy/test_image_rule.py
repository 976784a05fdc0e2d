"""The serving image of each GPU architecture follows the registry's tag rule.

Sources, cited because the rule cannot be checked against a registry from CI:
- vLLM: since v0.20 the CUDA 13 build is the unsuffixed tag (`vllm/vllm-openai:v0.32.0`) and
  `-cu129` is the CUDA 12.9 opt-out; `-cu130` tags are no longer published
  (vllm-project/vllm issue 42738, NVIDIA/Model-Optimizer PR 2042, ai-dynamo/nixl PR 2140;
  llm-d/llm-d-kv-cache PR 584: "the plain :v0.20.2 tag now resolves to a cu130 build").
- SGLang: CUDA-suffixed tags (`-cu129`, `-cu130`) through 0.5.19, `v0.5.19-cu129` the last
  CUDA 12 one; from 0.5.20 the unsuffixed tag is the CUDA 13 build and no CUDA 12 is published
  (docs.sglang.io get-started/install; ishandhanani/srt-slurm PR 130 for `-cu130` tags).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.stack import load_stack

STACK_YAML = PROJECT_ROOT / "configs" / "stack.yaml"


def _stack_with(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(STACK_YAML.read_text())
    edit(data)
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_blackwell_and_hopper_get_the_unsuffixed_cuda13_vllm_build():
    stack = load_stack(STACK_YAML)
    assert stack.engine == "vllm" and stack.engine_version == "0.32.0"
    for arch in ("sm100", "sm103", "sm90"):
        assert stack.images[arch] == "docker.io/vllm/vllm-openai:v0.32.0", arch
    assert not any(i.endswith("-cu130") for i in stack.images.values())


@pytest.mark.parametrize(("engine", "version", "cuda", "tag"), [
    ("vllm", "0.32.0", 13, "v0.32.0"), ("vllm", "0.32.0", 12, "v0.32.0-cu129"),
    ("vllm", "0.20.0", 13, "v0.20.0"), ("vllm", "0.19.1", 13, "v0.19.1-cu130"),
    ("vllm", "0.19.1", 12, "v0.19.1"),
    ("sglang", "0.5.9", 13, "v0.5.9-cu130"), ("sglang", "0.5.9", 12, "v0.5.9-cu129"),
    ("sglang", "0.5.20", 13, "v0.5.20"),
])
def test_tag_rule_per_engine_version_and_cuda_major(tmp_path, engine, version, cuda, tag):
    def edit(data):
        data["versions"][engine] = version
        data["images"]["engine"] = engine
        data["images"]["cuda_major"] = {"sm90": cuda, "sm100": max(cuda, 13),
                                        "sm103": max(cuda, 13)}
    stack = load_stack(_stack_with(tmp_path, edit))
    assert stack.images["sm90"].rsplit(":", 1)[1] == tag


def test_a_cuda_major_the_rule_does_not_publish_is_refused(tmp_path):
    def edit(data):
        data["versions"]["sglang"] = "0.5.20"
        data["images"]["engine"] = "sglang"
        data["images"]["cuda_major"]["sm90"] = 12
    with pytest.raises(ConfigError, match=r"images\.sglang.*CUDA 12"):
        load_stack(_stack_with(tmp_path, edit))


def test_blackwell_on_a_cuda12_build_is_refused(tmp_path):
    def edit(data):
        data["images"]["cuda_major"]["sm103"] = 12
    with pytest.raises(ConfigError, match=r"images\.cuda_major\.sm103"):
        load_stack(_stack_with(tmp_path, edit))


def test_a_config_whose_image_the_rule_does_not_produce_is_not_rendered():
    from onboarding.deploy.kserve import RenderInputs, render, storage_for
    from onboarding.serving.engine_config import evidence
    from tests.onboarding.test_kserve import DEPLOY, NODES, configured

    spec, p, config = configured("llama-3-1-70b-instruct", "b300")
    stale = dataclasses.replace(config, image="docker.io/vllm/vllm-openai:v0.32.0-cu130")
    with pytest.raises(ConfigError, match=r"v0\.32\.0-cu130.*not the tag"):
        render(RenderInputs(
            spec=spec, plan=p, node_type="b300", node=NODES.node_types["b300"],
            stack=configured.__globals__["STACK"], deploy=DEPLOY, config=stale,
            evidence=evidence(stale, None, None),
            storage=storage_for(spec, stale.precision, "bf16", DEPLOY, None)))
