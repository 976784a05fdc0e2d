"""One serving configuration per (model, node type, variant): its flags, its environment, what
the hardware drops, and a content hash that moves with anything that changes what is measured."""

from __future__ import annotations

import dataclasses

import pytest

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.plan import Measured, load_nodes, plan, plan_inputs, shape_from_hint
from onboarding.deploy.serving_plan import config_at_hand, serving_plan
from onboarding.fetch.catalog import ModelSpec, load_catalog
from onboarding.serving.engine_config import ConfigInputs, build_config, evidence
from onboarding.serving.stack import load_stack
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult

CONFIGS = PROJECT_ROOT / "configs"
TEMPLATES = load_stack(CONFIGS / "stack.yaml").templates
NODES = load_nodes(CONFIGS / "nodes.yaml")
STACK = load_stack(CONFIGS / "stack.yaml")
CATALOG = load_catalog(CONFIGS / "models")


def spec(**engine_args) -> ModelSpec:
    return ModelSpec(id="m", source="s3://models/m/", served_name="m-chat",
                     engine_args=engine_args)


def cpu(s: ModelSpec, **kw):
    return build_config(TEMPLATES["vllm"], ConfigInputs(
        spec=s, node_type="cpu", hardware="cpu", engine="vllm", engine_version="0.32.0+cpu",
        image="local", precision="bf16", **kw))


def test_cpu_configuration_drops_gpu_only_args_and_turns_telemetry_off():
    c = cpu(spec(kv_cache_dtype="fp8", max_num_seqs=8, enable_prefix_caching=False))
    args = c.args("/m", 8123, "127.0.0.1")
    assert args[:4] == ["/m", "--host=127.0.0.1", "--port=8123", "--served-model-name=m-chat"]
    assert "--enforce-eager" in args and "--no-enable-prefix-caching" in args
    assert "--max-num-seqs=8" in args and "--max-model-len=2048" in args  # cpu default
    assert not any(a.startswith("--kv-cache-dtype") for a in args)
    assert c.dropped == ("kv_cache_dtype",)
    assert c.env["VLLM_NO_USAGE_STATS"] == "1" and c.env["DO_NOT_TRACK"] == "1"
    assert c.env["HF_HUB_OFFLINE"] == "1" and "VLLM_CPU_KVCACHE_SPACE" in c.env


def test_planned_gpu_configuration_carries_the_plan_and_the_switches():
    qwen = CATALOG["qwen3-235b-a22b-instruct"]
    p = plan(plan_inputs(qwen, NODES, shape_from_hint(qwen.architecture, "t"), Measured()), NODES)
    splan = serving_plan(qwen, p, NODES, STACK)
    b300, h200 = splan.config("b300"), splan.config("h200")
    assert (b300.precision, b300.tensor_parallel) == ("nvfp4", 1)
    assert not any(a.startswith("--moe-backend") for a in b300.args("/mnt/models", 8080))
    pinned = dataclasses.replace(STACK, switches=tuple(
        s.model_copy(update={"pinned": "benchmarked"}) if s.kernel_choice else s
        for s in STACK.switches))
    forced = serving_plan(qwen, p, NODES, pinned).config("b300")
    assert "--moe-backend=flashinfer_cutlass" in forced.args("/mnt/models", 8080)
    assert forced.hash != b300.hash  # a kernel choice is part of what is measured
    assert "--tensor-parallel-size=1" in b300.param_args
    assert "enable_expert_parallel dropped: expert parallelism needs TP > 1" in b300.notes
    assert not any("expert-parallel" in a for a in b300.param_args)
    assert h200.tensor_parallel == 4 and "--enable-expert-parallel" in h200.param_args
    assert h200.max_num_seqs == 32 and h200.max_model_len == 16384
    assert b300.image == STACK.images["sm103"] and h200.image == STACK.images["sm90"]
    assert b300.hash != h200.hash


def test_the_hash_moves_with_what_is_measured_and_only_with_it():
    base = cpu(spec(max_num_seqs=8))
    assert base.hash == cpu(spec(max_num_seqs=8)).hash  # stable
    assert base.hash != cpu(spec(max_num_seqs=16)).hash
    assert base.hash != dataclasses.replace(base, engine_version="0.33.0").hash
    assert base.hash != dataclasses.replace(base, env={**base.env, "X": "1"}).hash
    assert base.hash != dataclasses.replace(base, image="other").hash
    assert base.hash == dataclasses.replace(base, notes=("a note",)).hash  # words only


def test_a_spec_cannot_set_what_the_plan_or_the_launcher_owns():
    for key in ("tensor_parallel_size", "port", "served_model_name"):
        with pytest.raises(ConfigError, match="set by the deployment plan and the launcher"):
            cpu(spec(**{key: 1}))
    with pytest.raises(ConfigError, match="credential"):
        cpu(spec(hf_token="x"))
    with pytest.raises(ConfigError, match="engine_args.max_num_seq"):
        cpu(spec(max_num_seq=8))


def test_the_engine_at_hand_runs_the_plans_configuration_only_when_it_is_that_one():
    llama = CATALOG["llama-3-1-70b-instruct"]
    p = plan(plan_inputs(llama, NODES, shape_from_hint(llama.architecture, "t"), Measured()),
             NODES)
    splan = serving_plan(llama, p, NODES, STACK)
    planned = splan.config("h200")
    local = {"node_type": "h200", "hardware": "sm90", "engine": "vllm",
             "engine_version": STACK.engine_version, "precision": planned.precision}
    assert config_at_hand(splan, llama, TEMPLATES["vllm"], local) is planned
    older = config_at_hand(splan, llama, TEMPLATES["vllm"], {**local, "engine_version": "0.22.0"})
    assert older.hash != planned.hash and older.param_args == planned.param_args
    assert older.image == "local"
    on_cpu = config_at_hand(splan, llama, TEMPLATES["vllm"], {
        **local, "node_type": "cpu", "hardware": "cpu", "precision": "bf16"})
    assert on_cpu.node_type == "cpu" and on_cpu.tensor_parallel == 1


def test_evidence_counts_only_measurements_at_exactly_this_configuration():
    c = cpu(spec())
    other = LoadTimingResult(model="m", precision="bf16", servable=True, reason="",
                             cold_start_p95_s=30.0, node_type="cpu", config_hash="000000000000")
    assert not evidence(c, other, None).measured
    assert "measured: cpu at 000000000000" in evidence(c, other, None).basis
    here = dataclasses.replace(other, config_hash=c.hash)
    bench = ServingBenchmarkResult(model="m", precision="bf16", node_type="cpu", gpus=0,
                                   servable=True, tokens_per_s_per_gpu=80.0,
                                   saturation_concurrency=4, slo_pass=True, config_hash=c.hash)
    ev = evidence(c, here, bench)
    assert ev.measured and ev.cold_start_p95_s == 30.0 and ev.tokens_per_s_per_gpu == 80.0
    elsewhere = dataclasses.replace(here, node_type="h200")
    assert not evidence(c, elsewhere, None).measured  # same hash, another node type


def test_node_types_not_at_hand_take_tp_and_max_num_seqs_from_the_sla_choice():
    """70B bf16 fits one B300 by memory, but its predicted TPOT misses the SLO there: the SLA
    choice (TP 2, 64 sequences) becomes the b300 configuration; h200 keeps the memory plan."""
    from onboarding.deploy.plan import plan_node
    from onboarding.deploy.serving_plan import with_sla_choices
    from onboarding.predictions.predict import SlaChoice, _with_tp

    llama = CATALOG["llama-3-1-70b-instruct"].model_copy(update={"precision_ladder": ["bf16"]})
    inputs = plan_inputs(llama, NODES, shape_from_hint(llama.architecture, "t"), Measured())
    p = plan(inputs, NODES)
    assert p.node("b300").tensor_parallel == 1  # memory alone
    at_tp2 = plan_node(inputs, "b300", NODES.node_types["b300"], _with_tp(NODES, 2))
    choice = SlaChoice(node_type="b300", precision="bf16", tensor_parallel=2, max_num_seqs=64,
                       basis="sla", sla_pass=True, reason="TP 2: TPOT 21 ms within 30 ms",
                       node_plan=at_tp2, prediction=None)
    chosen = with_sla_choices(p, [choice], ["b300"])
    splan = serving_plan(llama, chosen, NODES, STACK)
    b300 = splan.config("b300")
    assert b300.tensor_parallel == 2 and b300.max_num_seqs == 64
    assert chosen.node("b300").tp_basis.startswith("SLA (predicted): TP 2")
    assert splan.config("h200") == serving_plan(llama, p, NODES, STACK).config("h200")
    # A choice the predictions could not cover, or for a node type that is measured, is ignored.
    memory = dataclasses.replace(choice, basis="memory", sla_pass=None)
    assert with_sla_choices(p, [memory], ["b300"]).node("b300").tensor_parallel == 1
    assert with_sla_choices(p, [choice], ["b200"]).node("b300").tensor_parallel == 1
