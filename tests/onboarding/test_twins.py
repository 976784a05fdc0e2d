"""Performance twins (onboarding/fetch/twins.py) and what each stage's pure logic does with one: the
export marker, the precision measured on the node at hand, `load_format: dummy` in the
configuration and its hash, no manifest, never ready, no weight-read figure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from onboarding.common.errors import ConfigError, OnboardingError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import VariantRef
from onboarding.deploy.kserve import load_deploy
from onboarding.deploy.plan import Measured, load_nodes, plan, plan_inputs, shape_from_config
from onboarding.deploy.readiness import ManifestFacts, judge
from onboarding.deploy.serving_plan import render_targets, serving_plan
from onboarding.fetch.catalog import load_catalog
from onboarding.fetch.twins import (
    NOT_APPLICABLE,
    NOT_APPLICABLE_VERDICT,
    NOT_READY,
    accuracy_report,
    marker_hf_quant_config,
    marker_problems,
    served_report,
    split_weights,
    twin_precision,
    twin_tokenizer_json,
    unusable_marker,
    write_twin_variant,
)
from onboarding.quantize.variants import QuantizationError
from onboarding.serving.engine_config import ConfigInputs, build_config
from onboarding.serving.stack import load_stack
from onboarding.serving.stats import ServingBenchmarkResult, StartSample, summarize_load_timing

CONFIGS = PROJECT_ROOT / "configs"
TWINS = PROJECT_ROOT / "twins"
CATALOG = load_catalog(CONFIGS / "models")
NODES = load_nodes(CONFIGS / "nodes.yaml")
STACK = load_stack(CONFIGS / "stack.yaml")
VLLM = load_stack(CONFIGS / "stack.yaml").templates["vllm"]
TWIN_8B = CATALOG["llama-3-1-8b-instruct-twin"]


def twin_plan(model_id: str = "llama-3-1-8b-instruct-twin"):
    """As serving_config plans a fetched twin: the shape from its shipped config.json, the
    parameters from the catalog (there are no weights to count)."""
    spec = CATALOG[model_id]
    shape = shape_from_config(json.loads((TWINS / model_id / "config.json").read_text()), "t")
    return spec, plan(plan_inputs(spec, NODES, shape, Measured()), NODES)


def test_the_shipped_twins_carry_the_llama_3_1_config_and_a_tokenizer_below_its_vocabulary():
    from tokenizers import Tokenizer

    expected = {"llama-3-1-8b-instruct-twin": (4096, 32, 32, 14336),
                "llama-3-1-70b-instruct-twin": (8192, 80, 64, 28672)}
    for model_id, (hidden, layers, heads, mlp) in expected.items():
        cfg = json.loads((TWINS / model_id / "config.json").read_text())
        assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
                cfg["intermediate_size"]) == (hidden, layers, heads, mlp)
        assert (cfg["num_key_value_heads"], cfg["vocab_size"], cfg["rope_theta"],
                cfg["max_position_embeddings"], cfg["rms_norm_eps"]) == (8, 128256, 500000.0,
                                                                          131072, 1e-5)
        assert cfg["rope_scaling"] == {"factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192,
                                       "rope_type": "llama3"}
        assert cfg["tie_word_embeddings"] is False and cfg["architectures"] == [
            "LlamaForCausalLM"]
        assert not [p for p in (TWINS / model_id).iterdir() if "safetensors" in p.name]
        tok = Tokenizer.from_str(twin_tokenizer_json().decode())
        assert tok.get_vocab_size() <= cfg["vocab_size"]
        spec = CATALOG[model_id]
        assert spec.source.rstrip("/").endswith(model_id) and spec.architecture.hidden_size == \
            hidden and spec.architecture.intermediate_size == mlp


def test_a_twin_fetches_everything_but_the_weights():
    shard = "model-00001-of-00002.safetensors"
    keep, left = split_weights(["config.json", "tokenizer.json", shard,
                                "model.safetensors.index.json", "generation_config.json"])
    assert keep == ["config.json", "tokenizer.json", "generation_config.json"]
    assert left == [shard, "model.safetensors.index.json"]


def test_the_marker_declares_what_model_optimizers_export_declares():
    nvfp4 = marker_hf_quant_config("nvfp4", "NVFP4_DEFAULT_CFG", None, [], "0.47.0", "w")
    assert nvfp4 == {"producer": {"name": "modelopt", "version": "0.47.0"},
                     "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                                      "group_size": 16, "exclude_modules": ["lm_head"]}}
    fp8 = marker_hf_quant_config("fp8", "FP8_DEFAULT_CFG", "FP8_KV_CFG", [], "0.47.0", "w")
    assert fp8["quantization"] == {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                                   "exclude_modules": ["lm_head"]}


@pytest.mark.parametrize(("preset", "kv", "disable", "expected"), [
    ("NVFP4_MLP_ONLY_CFG", None, [], "preset NVFP4_MLP_ONLY_CFG is not one"),
    ("FP8_DEFAULT_CFG", "NVFP4_KV_CFG", [], "KV-cache preset NVFP4_KV_CFG"),
    ("FP8_DEFAULT_CFG", None, ["*mlp*"], "leaves layers unquantized"),
])
def test_a_marker_that_could_not_say_what_the_export_would_is_refused(preset, kv, disable,
                                                                       expected):
    with pytest.raises(QuantizationError, match=expected) as info:
        marker_hf_quant_config("fp8", preset, kv, disable, "0.47.0", "twin t at fp8")
    assert "twin t at fp8" in str(info.value)


def _quantization_config(algo: str, group: int | None = 16) -> dict:
    """config.json's quantization_config as Model Optimizer 0.47's converter writes it
    (tests/resources/test_quantizer.py checks the converter itself)."""
    weights = {"dynamic": False, "num_bits": 4 if algo == "NVFP4" else 8, "type": "float"}
    if algo == "NVFP4" and group:
        weights["group_size"] = group
    return {"config_groups": {"group_0": {"weights": weights, "targets": ["Linear"]}},
            "ignore": ["lm_head"], "quant_algo": algo, "quant_method": "modelopt"}


def _checkpoint(tmp_path: Path) -> Path:
    ckpt = tmp_path / "m" / "rev"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(
        (TWINS / "llama-3-1-8b-instruct-twin" / "config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(
        (TWINS / "tokenizer" / "tokenizer_config.json").read_text())
    (ckpt / "onboarding-manifest.json").write_text("{}")
    return ckpt


def test_the_twin_variant_is_config_tokenizer_and_marker_and_is_read_back(tmp_path):
    ckpt = _checkpoint(tmp_path)
    out = tmp_path / "m" / "rev.variants" / "nvfp4"
    hf = marker_hf_quant_config("nvfp4", "NVFP4_DEFAULT_CFG", None, [], "0.47.0", "w")
    manifest = write_twin_variant(ckpt, out, hf, _quantization_config("NVFP4"), "rev")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "hf_quant_config.json", "onboarding-manifest.json", "tokenizer_config.json"]
    assert {f.path for f in manifest.files} == {"config.json", "hf_quant_config.json",
                                                "tokenizer_config.json"}
    config = json.loads((out / "config.json").read_text())
    assert config["hidden_size"] == 4096 and config["quantization_config"]["quant_algo"] == "NVFP4"
    assert marker_problems(out, "NVFP4") == []
    assert "expected FP8" in marker_problems(out, "FP8")[0]
    assert not (out.parent / ".staging-nvfp4").exists()


def test_a_wrong_marker_is_named(tmp_path):
    ckpt = _checkpoint(tmp_path)
    out = tmp_path / "m" / "rev.variants" / "nvfp4"
    hf = marker_hf_quant_config("nvfp4", "NVFP4_DEFAULT_CFG", None, [], "0.47.0", "w")
    bad = {**_quantization_config("NVFP4", group=32), "ignore": [], "quant_method": "fp8"}
    bad["config_groups"]["group_0"]["weights"]["group_size"] = 32
    write_twin_variant(ckpt, out, hf, bad, "rev")
    (out / "model.safetensors").write_bytes(b"x")
    problems = "; ".join(marker_problems(out, "NVFP4"))
    for words in ("quant_method is 'fp8'", "group size 16 / [32]", "does not exclude lm_head",
                  "holds weights: model.safetensors"):
        assert words in problems
    (out / "config.json").write_text("{}")
    assert "cannot be read" in marker_problems(out, "NVFP4")[0]


def test_on_a_planned_node_type_the_twin_is_measured_at_the_plans_precision():
    spec, p = twin_plan()
    never = lambda precision: (False, "not asked")  # the plan decides, not the engine
    h200, why = twin_precision(spec.id, spec.precision_ladder, p, "h200", never)
    assert h200 == "fp8" and why.startswith("performance twin: no accuracy gate to climb; the "
                                            "plan serves fp8 on h200 (TP 1 fits")
    assert twin_precision(spec.id, spec.precision_ladder, p, "b300", never)[0] == "nvfp4"


def test_off_the_plan_the_twin_is_measured_at_what_the_engine_at_hand_serves():
    spec, p = twin_plan()
    cpu = lambda precision: (precision == "bf16", "the CPU build serves bf16")
    precision, why = twin_precision(spec.id, spec.precision_ladder, p, "cpu", cpu)
    assert precision == "bf16" and "cpu is no node type of the plan" in why
    with pytest.raises(OnboardingError, match="serves no precision of its ladder: nvfp4: no"):
        twin_precision(spec.id, spec.precision_ladder, p, "cpu", lambda _: (False, "no"))


def test_a_twin_the_plan_cannot_fit_on_the_node_at_hand_is_refused():
    spec = CATALOG["llama-3-1-70b-instruct-twin"]
    bf16_only = spec.model_copy(update={"precision_ladder": ["bf16"],
                                        "engine_args": {"max_model_len": 131072}})
    shape = shape_from_config(json.loads(
        (TWINS / spec.id / "config.json").read_text()), "t")
    tight = plan(plan_inputs(bf16_only, NODES, shape, Measured()), NODES)
    assert not tight.node("h100").feasible
    with pytest.raises(OnboardingError, match="the plan serves it nowhere on this node type"):
        twin_precision(spec.id, ["bf16"], tight, "h100", lambda _: (True, ""))


def test_a_twin_is_not_measured_at_a_precision_whose_marker_is_unusable():
    from onboarding.quantize.variants import QuantizedSet, QuantizedVariant

    good = QuantizedVariant(precision="fp8", path="/v/fp8", state_path=None, total_bytes=1,
                            content_hash="h", export_valid=True)
    bad = QuantizedVariant(precision="nvfp4", path=None, state_path=None,
                           error="preset NVFP4_MLP_ONLY_CFG is not one")
    quantized = QuantizedSet("t", "/c", 1, (good, bad))
    assert unusable_marker("t", "fp8", quantized) is None
    assert unusable_marker("t", "bf16", QuantizedSet("t", "/c", 1, ())) is None
    error = unusable_marker("t", "nvfp4", quantized)
    assert "export marker is unusable: preset NVFP4_MLP_ONLY_CFG" in str(error)
    assert "it was not made" in str(unusable_marker("t", "fp8", QuantizedSet("t", "/c", 1, ())))


def test_the_twins_configuration_loads_random_weights_and_hashes_apart_from_the_real_model():
    spec, p = twin_plan()
    twin = serving_plan(spec, p, NODES, STACK).config("h200")
    real_spec = spec.model_copy(update={"weights": "real"})
    real = serving_plan(real_spec, p, NODES, STACK).config("h200")
    assert twin.params["load_format"] == "dummy" and "--load-format=dummy" in twin.param_args
    assert "load_format" not in real.params
    assert twin.hash != real.hash
    assert {k: v for k, v in twin.content().items() if k not in ("params", "param_args")} == {
        k: v for k, v in real.content().items() if k not in ("params", "param_args")}
    cpu = build_config(VLLM, ConfigInputs(spec=spec, node_type="cpu", hardware="cpu",
                                          engine="vllm", engine_version="0.32.0+cpu",
                                          image="local", precision="bf16"))
    assert "--load-format=dummy" in cpu.args("/m", 8000)


def test_an_engine_template_without_a_load_format_flag_cannot_start_a_twin():
    sglang = load_stack(CONFIGS / "stack.yaml").templates["sglang"]
    inputs = ConfigInputs(spec=TWIN_8B, node_type="h200", hardware="sm90", engine="sglang",
                          engine_version="0.5.9", image="i", precision="fp8")
    assert "--load-format=dummy" in build_config(sglang, inputs).param_args  # SGLang takes it too
    args = {k: v for k, v in sglang.args.items() if k != "load_format"}
    with pytest.raises(ConfigError, match=r"engines.sglang.args"):
        build_config(sglang.model_copy(update={"args": args}), inputs)


def test_no_manifest_is_rendered_for_a_twin_and_it_is_never_ready():
    spec, p = twin_plan()
    splan = serving_plan(spec, p, NODES, STACK)
    deploy = load_deploy(CONFIGS / "deploy.yaml")
    rendered, skipped = render_targets(spec, splan, NODES, STACK, deploy, "bfloat16")
    assert rendered == [] and set(skipped) == set(deploy.target_node_types)
    assert all(why.startswith(NOT_READY) for why in skipped.values())
    h = splan.config("h200").hash
    measured = ServingBenchmarkResult(model=spec.id, precision="fp8", node_type="h200", gpus=1,
                                      servable=True, tokens_per_s_per_gpu=5000.0,
                                      saturation_concurrency=32, slo_pass=True, config_hash=h,
                                      slo_blocking=True)
    facts = ManifestFacts(True, {"h200": h}, {"h200": True})
    variant = VariantRef(spec.id, "fp8", "/c/fp8", 1, "x")
    assert judge(spec.id, ["h200"], variant, measured, facts).ready  # the same facts, real
    verdict = judge(spec.id, ["h200"], variant, measured, facts, twin=True)
    assert not verdict.ready and verdict.summary() == f"not ready: {NOT_READY}"


def test_accuracy_is_not_applicable_for_every_precision_and_never_passes():
    report = accuracy_report("t", ["nvfp4", "fp8", "bf16"])
    assert [(g.precision, g.passed, g.verdict, g.reason) for g in report.gates] == [
        (p, False, NOT_APPLICABLE_VERDICT, NOT_APPLICABLE) for p in ("nvfp4", "fp8", "bf16")]
    assert report.rows == () and report.records == ()
    served = served_report("t", ["fp8", "bf16"], ("bf16", "nvfp4", "fp8"))
    assert [g.precision for g in served.gates] == ["fp8"] and not served.gate("fp8").passed
    assert served.not_served == {p: NOT_APPLICABLE for p in ("bf16", "nvfp4", "fp8")}


def test_a_start_that_reads_no_weights_reports_no_weight_read_rate():
    samples = [StartSample(kind="fully_cold", resident_fraction=math.nan, weights_loaded_s=2.0,
                           engine_weights_load_s=1.5, health_ready_s=3.0, first_token_s=4.0),
               StartSample(kind="warm", resident_fraction=math.nan, weights_loaded_s=1.0,
                           engine_weights_load_s=0.5, health_ready_s=2.0, first_token_s=2.5)]
    result = summarize_load_timing("t", "bf16", samples, 0, None)
    assert result.weights_load_gbps is None and result.raw_read_gbps is None
    assert result.cold_start_p95_s == 4.0 and result.warm_start_p50_s == 2.5
    real = summarize_load_timing("t", "bf16", samples, 3_000_000_000, 1.0)
    assert real.weights_load_gbps == pytest.approx(2.0)
