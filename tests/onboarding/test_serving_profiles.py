"""Engine templates, traffic profiles and SLOs: the shipped files parse, bad ones are named."""

from pathlib import Path

import pytest

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.fetch.catalog import parse_spec
from onboarding.serving.profiles import (
    Scenario,
    check_fits,
    load_profiles,
    load_slo_section,
    resolve_slo,
)
from onboarding.serving.stack import effective_max_model_len, load_stack, servable

CONFIGS = PROJECT_ROOT / "configs"


@pytest.fixture(scope="module")
def templates():
    return load_stack(CONFIGS / "stack.yaml").templates


def test_shipped_configs_parse(templates):
    assert {"vllm", "sglang"} <= set(templates)
    profiles = load_profiles(CONFIGS / "scenarios.yaml")
    assert {"chat", "rag", "codegen"} <= set(profiles["gpu"].scenarios)
    assert profiles["gpu"].scenarios["rag"].input_tokens == 4096
    assert set(profiles["gpu"].scenarios) == set(profiles["cpu"].scenarios)
    assert load_slo_section(CONFIGS / "gates.yaml").defaults.ttft_p95_s == 1.5


@pytest.mark.parametrize("hw,precision,expected", [
    ("cpu", "bf16", True), ("cpu", "nvfp4", False), ("cpu", "fp8", False),
    ("sm90", "fp8", True), ("sm90", "nvfp4", True),  # weight-only FP4 (Marlin) on Hopper
    ("sm100", "nvfp4", True),
    ("sm103", "nvfp4", True), ("sm89", "fp8", True), ("sm80", "fp8", False),
])
def test_servable_matrix(templates, hw, precision, expected):
    ok, reason = servable(templates["vllm"], "vllm", hw, precision)
    assert ok is expected
    if not ok:
        assert precision in reason and hw in reason


def test_nvfp4_reason_names_the_hardware_that_has_kernels(templates):
    _, reason = servable(templates["vllm"], "vllm", "cpu", "nvfp4")
    assert "sm100" in reason and "sm103" in reason
    _, reason = servable(templates["sglang"], "sglang", "cpu", "bf16")
    assert "no kernels listed for hardware 'cpu'" in reason


def test_scenario_longer_than_max_model_len_is_refused_before_the_run(templates):
    assert effective_max_model_len(templates["vllm"], "cpu", {}) == 2048
    assert effective_max_model_len(templates["vllm"], "cpu", {"max_model_len": 512}) == 512
    fits = {"chat": Scenario(input_tokens=128, output_tokens=32)}
    check_fits(fits, 512)
    with pytest.raises(ConfigError, match=r"max-model-len 2048 \(rag needs 4610"):
        check_fits({**fits, "rag": Scenario(input_tokens=4096, output_tokens=512)}, 2048)


def test_bad_profile_names_file_and_field(tmp_path: Path):
    p = tmp_path / "scenarios.yaml"
    text = (CONFIGS / "scenarios.yaml").read_text().replace(
        "chat: {input_tokens: 128", "chat: {input_tokns: 128")
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_profiles(p)
    assert str(p) in str(e.value) and "profiles.cpu.scenarios.chat" in str(e.value)
    assert "unknown key" in str(e.value)


def test_slo_precedence_defaults_node_type_model(tmp_path: Path):
    section = load_slo_section(CONFIGS / "gates.yaml")
    spec = parse_spec({"id": "m", "source": "s3://models/m/", "served_name": "m",
                       "slo": {"itl_mean_ms": 99}}, "test")
    slo = resolve_slo(section, "cpu", spec)
    assert slo.itl_mean_ms == 99  # model override wins
    assert slo.ttft_p95_s == section.node_types["cpu"].ttft_p95_s  # node type over defaults
    assert resolve_slo(section, "h200", spec).ttft_p95_s == section.defaults.ttft_p95_s
    bad = tmp_path / "gates.yaml"
    bad.write_text("slo:\n  defaults: {ttft_p95_s: 1.0}\n")
    with pytest.raises(ConfigError, match="slo.defaults"):
        load_slo_section(bad)
