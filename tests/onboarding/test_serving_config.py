"""Engine templates, traffic profiles and SLOs: the shipped files parse, bad ones are named."""

from pathlib import Path

import pytest

from onboarding.catalog import parse_spec
from onboarding.errors import ConfigError
from onboarding.paths import PROJECT_ROOT
from onboarding.serving_config import (
    Scenario,
    check_fits,
    effective_max_model_len,
    load_engine_templates,
    load_profiles,
    load_slo_section,
    render_command,
    resolve_slo,
    servable,
)

CONFIGS = PROJECT_ROOT / "configs"


@pytest.fixture(scope="module")
def templates():
    return load_engine_templates(CONFIGS / "stack.yaml")


def test_shipped_configs_parse(templates):
    assert {"vllm", "sglang"} <= set(templates)
    profiles = load_profiles(CONFIGS / "scenarios.yaml")
    assert {"chat", "rag", "codegen"} <= set(profiles["gpu"].scenarios)
    assert profiles["gpu"].scenarios["rag"].input_tokens == 4096
    assert set(profiles["gpu"].scenarios) == set(profiles["cpu"].scenarios)
    assert load_slo_section(CONFIGS / "gates.yaml").defaults.ttft_p95_s == 1.5


def test_cpu_render_drops_gpu_only_args_and_sets_telemetry_off(templates):
    argv, env, dropped = render_command(
        templates["vllm"], hardware="cpu", bin_dir="/venv/bin", model_path="/m",
        served_name="s", port=8123,
        engine_args={"kv_cache_dtype": "fp8", "max_num_seqs": 8, "enable_prefix_caching": False},
        precision="bf16")
    assert argv[:3] == ["/venv/bin/vllm", "serve", "/m"]
    assert "--enforce-eager" in argv and "--no-enable-prefix-caching" in argv
    assert argv[argv.index("--max-num-seqs") + 1] == "8"
    assert "--kv-cache-dtype" not in argv and dropped == ["kv_cache_dtype"]
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1" and "VLLM_CPU_KVCACHE_SPACE" in env


def test_gpu_render_keeps_production_args(templates):
    argv, env, dropped = render_command(
        templates["vllm"], hardware="sm100", bin_dir="/b", model_path="/m", served_name="s",
        port=1, engine_args={"tensor_parallel_size": 4, "kv_cache_dtype": "fp8"},
        precision="nvfp4")
    assert dropped == []
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.9"
    assert "--enable-chunked-prefill" in argv and "--enable-prefix-caching" in argv
    assert not any(k.startswith("VLLM_USE_FLASHINFER_MOE") for k in env)  # gone in vLLM 0.32
    sg, _, _ = render_command(templates["sglang"], hardware="sm90", bin_dir="/b",
                              model_path="/m", served_name="s", port=1,
                              engine_args={"enable_prefix_caching": False,
                                           "tensor_parallel_size": 2}, precision="fp8")
    assert "--disable-radix-cache" in sg and sg[sg.index("--tp-size") + 1] == "2"


def test_unknown_engine_arg_is_refused(templates):
    with pytest.raises(ConfigError, match="engine_args.max_num_seq"):
        render_command(templates["vllm"], hardware="cpu", bin_dir="/b", model_path="/m",
                       served_name="s", port=1, engine_args={"max_num_seq": 8}, precision="bf16")


@pytest.mark.parametrize("hw,precision,expected", [
    ("cpu", "bf16", True), ("cpu", "nvfp4", False), ("cpu", "fp8", False),
    ("sm90", "fp8", True), ("sm90", "nvfp4", False), ("sm100", "nvfp4", True),
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
