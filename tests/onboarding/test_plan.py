"""The plan's memory/KV/TP arithmetic against hand-computed cases, and its honesty rules."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import VariantRef
from onboarding.deploy.plan import (
    GIB,
    Measured,
    NodesConfig,
    kv_bytes_per_token_per_gpu,
    load_nodes,
    measured_from_results,
    param_count_from_safetensors,
    plan,
    plan_inputs,
    shape_from_config,
    shape_from_hint,
)
from onboarding.fetch.catalog import ArchitectureHint, ModelSpec
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult

NODES = load_nodes(PROJECT_ROOT / "configs" / "nodes.yaml")
LLAMA_70B = ArchitectureHint(params_billion=70.6, num_layers=80, num_attention_heads=64,
                             num_kv_heads=8, head_dim=128)

NOTHING_MEASURED = Measured()


def spec(ladder=("bf16",), concurrency=32, context=8192, hint=LLAMA_70B, **engine_args):
    return ModelSpec(id="m", source="hf://org/m", served_name="m", plan_only=True,
                     precision_ladder=list(ladder), architecture=hint,
                     slo={"target_concurrency": concurrency},
                     engine_args={"max_model_len": context, **engine_args})


def plan_for(s: ModelSpec, measured: Measured = NOTHING_MEASURED, nodes: NodesConfig = NODES,
             params: int | None = None):
    shape = shape_from_hint(s.architecture, "test")
    return plan(plan_inputs(s, nodes, shape, measured, params), nodes)


def budget(node_type: str, util: float = 0.90) -> int:
    return int(NODES.node_types[node_type].memory_mib * (1 << 20) * util)


def test_70b_bf16_needs_tp2_on_h200_with_hand_computed_bytes():
    node = plan_for(spec()).node("h200")
    weights = 70.6e9 * 2
    assert weights > budget("h200"), "the premise: bf16 weights alone exceed one H200"
    assert node.feasible and node.tensor_parallel == 2 and node.precision == "bf16"
    kv_per_token_per_gpu = 80 * 2 * (8 // 2) * 128 * 2  # layers x K,V x heads/GPU x dim x bf16
    assert node.kv_bytes_per_gpu == 32 * 8192 * kv_per_token_per_gpu
    assert node.weight_bytes_per_gpu == math.ceil(weights / 2)
    assert node.reserve_bytes_per_gpu == 4 * GIB
    assert node.headroom_bytes_per_gpu == budget("h200") - (
        math.ceil(weights / 2) + 32 * 8192 * kv_per_token_per_gpu + 4 * GIB)
    assert "TP 1" in node.rejected[0] and "short by" in node.rejected[0]
    assert node.weight_basis == "estimate" and node.throughput_basis == "absent"


def test_70b_bf16_fits_tp1_on_b300_only_with_a_small_kv_budget():
    free_for_kv = budget("b300") - round(70.6e9 * 2) - 4 * GIB
    per_seq = 8192 * (80 * 2 * 8 * 128 * 2)
    max_seqs = free_for_kv // per_seq
    assert 16 <= max_seqs < 64, "the premise of this case"
    small = plan_for(spec(concurrency=16)).node("b300")
    assert small.tensor_parallel == 1 and small.max_sequences_at_context == max_seqs
    large = plan_for(spec(concurrency=64)).node("b300")
    assert large.tensor_parallel == 2
    assert large.rejected[0].startswith("TP 1: needs") and "short by" in large.rejected[0]


def test_infeasible_plan_says_why_and_by_how_much():
    hint = ArchitectureHint(params_billion=405, num_layers=126, num_attention_heads=128,
                            num_kv_heads=8, head_dim=128)
    node = plan_for(spec(hint=hint)).node("h100")
    assert not node.feasible
    assert "infeasible on h100 at bf16" in node.reason and "short by" in node.reason
    assert node.tensor_parallel == 8 and node.headroom_bytes_per_gpu < 0
    shortfall_gib = float(node.reason.rsplit("short by ", 1)[1].split()[0])
    assert shortfall_gib == pytest.approx(-node.headroom_bytes_per_gpu / GIB, abs=0.05)


def test_tp_up_to_four_stays_inside_one_numa_half():
    node = plan_for(spec(ladder=("fp8",), concurrency=32)).node("h100")
    assert node.tensor_parallel == 4
    assert node.gpu_ids == (0, 1, 2, 3) and node.numa_nodes == (0,)


def test_numa_layout_with_small_sockets_rejects_crossing_tp(tmp_path):
    data = yaml.safe_load((PROJECT_ROOT / "configs" / "nodes.yaml").read_text())
    data["node_types"]["h100"]["numa_gpus"] = [[0, 1], [2, 3], [4, 5], [6, 7]]
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(data))
    node = plan_for(spec(ladder=("fp8",)), nodes=load_nodes(path)).node("h100")
    assert node.tensor_parallel == 8
    assert any(r.startswith("TP 4:") and "NUMA" in r for r in node.rejected)


def test_precision_is_native_per_node_and_never_above_the_gated_variant():
    s = spec(ladder=("nvfp4", "fp8", "bf16"))
    p = plan_for(s)
    assert p.node("b300").precision == "nvfp4" and p.node("h200").precision == "fp8"
    gated = plan_for(s, Measured(variant_precision="fp8", variant_weight_bytes=71_000_000_000))
    b300 = gated.node("b300")
    assert b300.precision == "fp8" and b300.weight_basis == "measured"
    assert b300.weight_bytes == 71_000_000_000


def test_measured_bytes_only_for_the_measured_precision():
    s = spec(ladder=("nvfp4", "fp8", "bf16"))
    p = plan_for(s, Measured(variant_precision="nvfp4", variant_weight_bytes=40_000_000_000))
    assert p.node("b300").weight_basis == "measured"
    h200 = p.node("h200")
    assert h200.precision == "fp8" and h200.weight_basis == "estimate"
    assert h200.weight_bytes == round(70.6e9 * NODES.precisions["fp8"].bytes_per_param)


def test_throughput_is_measured_only_on_the_benchmarked_node_type():
    m = Measured(benchmark_node_type="h200", tokens_per_s_per_gpu=1234.5)
    p = plan_for(spec(), m)
    assert p.node("h200").tokens_per_s_per_gpu == 1234.5
    assert p.node("h200").throughput_basis == "measured"
    for other in ("b300", "b200", "h100"):
        assert p.node(other).tokens_per_s_per_gpu is None
        assert p.node(other).throughput_basis == "absent"


def test_kv_heads_replicate_when_tp_exceeds_them():
    shape = shape_from_hint(ArchitectureHint(params_billion=1, num_layers=2, num_kv_heads=4,
                                             head_dim=64), "t")
    assert kv_bytes_per_token_per_gpu(shape, 8, 2) == 2 * 2 * 1 * 64 * 2
    assert kv_bytes_per_token_per_gpu(shape, 2, 1) == 2 * 2 * 2 * 64 * 1


def test_fp8_kv_cache_halves_the_kv_budget():
    bf16 = plan_for(spec()).node("h200")
    fp8 = plan_for(spec(kv_cache_dtype="fp8")).node("h200")
    assert fp8.kv_bytes_per_gpu * 2 == bf16.kv_bytes_per_gpu


def test_utilization_past_the_seed_limit_is_refused():
    with pytest.raises(ConfigError, match="at most 0.92"):
        plan_for(spec(gpu_memory_utilization=0.95))


def test_nodes_yaml_rejects_fp4_on_hopper(tmp_path):
    data = yaml.safe_load((PROJECT_ROOT / "configs" / "nodes.yaml").read_text())
    data["node_types"]["h200"]["native_precisions"] = ["nvfp4", "fp8", "bf16"]
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_nodes(path)
    assert str(path) in str(err.value) and "node_types.h200.native_precisions" in str(err.value)


def test_nodes_yaml_unknown_key_names_the_field(tmp_path):
    data = yaml.safe_load((PROJECT_ROOT / "configs" / "nodes.yaml").read_text())
    data["node_types"]["b300"]["memory_gb"] = 288
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"node_types\.b300\.memory_gb': unknown key"):
        load_nodes(path)


def test_default_numa_halves_and_gfd_labels():
    b300 = NODES.node_types["b300"]
    assert b300.numa_layout() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert b300.arch == "sm103" and NODES.node_types["h200"].arch == "sm90"
    labels = b300.gfd_labels()
    assert labels["nvidia.com/gpu.compute.major"] == "10"
    assert labels["nvidia.com/gpu.memory"] == str(b300.memory_mib)


def test_real_small_model_config_and_attention_head_divisibility():
    ckpt = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"
    if not (ckpt / "config.json").is_file():
        pytest.skip("SmolLM2 not built (python scripts/build_smollm2.py .cache/smollm2-135m-instruct)")
    shape = shape_from_config(json.loads((ckpt / "config.json").read_text()), "smollm2")
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (30, 3, 64)
    params = param_count_from_safetensors(ckpt)
    s = ModelSpec(id="smollm2", source="s3://models/smollm2/", served_name="smollm2",
                  precision_ladder=["bf16"])
    p = plan(plan_inputs(s, NODES, shape, Measured(), params), NODES)
    h100 = p.node("h100")
    assert h100.tensor_parallel == 1 and h100.weight_bytes == params * 2
    # 9 attention heads: TP 2/4/8 never split evenly, whatever the memory says.
    s_big = s.model_copy(update={"slo": s.slo.model_copy(update={"target_concurrency": 4096})})
    big = plan(plan_inputs(s_big, NODES, shape, Measured(), params), NODES).node("h100")
    assert not big.feasible and all("attention heads" in r for r in big.rejected[1:])


def test_param_count_from_headers_matches_tensor_shapes(tiny_checkpoint: Path):
    from safetensors import safe_open

    expected = 0
    for f in tiny_checkpoint.glob("*.safetensors"):
        with safe_open(f, "np") as st:
            expected += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())  # noqa: SIM118
    assert param_count_from_safetensors(tiny_checkpoint) == expected > 0


def test_moe_config_is_detected():
    base = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
            "hidden_size": 512}
    assert shape_from_config({**base, "num_experts": 64}, "t").moe
    assert not shape_from_config(base, "t").moe
    assert shape_from_config(base, "t").head_dim == 64


def test_typed_results_leave_absent_values_absent():
    m = measured_from_results(None, LoadTimingResult(model="m", precision="bf16", servable=True,
                                                     reason="", cold_start_p95_s=41.5), None)
    assert m.cold_start_p95_s == 41.5
    assert m.tokens_per_s_per_gpu is None and m.variant_precision is None and m.slo_pass is None
    full = measured_from_results(
        VariantRef("m", "fp8", "/x", 200, "h", weight_bytes=123), None,
        ServingBenchmarkResult(model="m", precision="fp8", node_type="h200", gpus=1, servable=True,
                               tokens_per_s_per_gpu=9.5, saturation_concurrency=16, slo_pass=True))
    assert (full.variant_precision, full.variant_weight_bytes) == ("fp8", 123)
    assert full.benchmark_node_type == "h200" and full.slo_pass is True
    assert full.tokens_per_s_per_gpu == 9.5
    unmeasured = measured_from_results(
        None, None, ServingBenchmarkResult(model="m", precision="nvfp4", node_type="cpu", gpus=0,
                                           servable=False, tokens_per_s_per_gpu=0.0,
                                           saturation_concurrency=0, slo_pass=False))
    assert unmeasured.tokens_per_s_per_gpu is None  # nothing was measured: no throughput


def test_quantized_estimates_count_what_modelopt_keeps_in_bf16():
    """Model Optimizer's export keeps embeddings, lm_head and MoE routers in bf16
    (exclude_modules): an NVFP4 estimate that priced them at 4.5 bits missed ~3 GB on a 70B."""
    hint = LLAMA_70B.model_copy(update={"hidden_size": 8192, "vocab_size": 128256})
    node = plan_for(spec(ladder=("nvfp4",), hint=hint)).node("b300")
    kept = 128256 * 8192 * 2  # untied embeddings + lm_head
    expected = round((70.6e9 - kept) * 0.5625 + kept * 2.0)
    assert node.weight_bytes == expected
    naive = round(70.6e9 * 0.5625)
    assert 2.9e9 < node.weight_bytes - naive < 3.2e9
    bf16 = plan_for(spec(ladder=("bf16",), hint=hint)).node("b300")
    assert bf16.weight_bytes == round(70.6e9 * 2.0)  # nothing to keep: all bf16 anyway


def test_moe_routers_stay_bf16_in_the_estimate():
    base = {"num_hidden_layers": 10, "num_attention_heads": 8, "num_key_value_heads": 2,
            "hidden_size": 1024, "vocab_size": 1000, "tie_word_embeddings": True,
            "n_routed_experts": 64, "first_k_dense_replace": 2}
    shape = shape_from_config(base, "t")
    assert shape.moe and shape.num_experts == 64
    assert shape.kept_bf16_params == 1000 * 1024 + (10 - 2) * 64 * 1024


def test_mla_kv_cache_is_the_latent_and_rope_dims_on_every_rank():
    """DeepSeek-V3/R1: kv_lora_rank 512 + qk_rope_head_dim 64 per layer and token, held whole
    by every TP rank (the latent is shared by the heads)."""
    ds = {"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
          "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
          "n_routed_experts": 256, "first_k_dense_replace": 3, "vocab_size": 129280}
    shape = shape_from_config(ds, "deepseek-v3 config.json")
    assert shape.mla
    for tp in (1, 8):
        assert kv_bytes_per_token_per_gpu(shape, tp, 2) == 61 * (512 + 64) * 2
    assert kv_bytes_per_token_per_gpu(shape, 8, 1) == 61 * 576  # fp8 KV
