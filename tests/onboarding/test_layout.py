"""Node layouts: the seed's cases A and B on B300 and H200 as goldens, a set that cannot fit and
why, the search against the first fit, throughput precedence, NUMA sets, MLA/MoE sizing, QoS.

Regenerate the goldens after an intended change with
`UPDATE_GOLDEN=1 pytest tests/onboarding/test_layout.py` and review the diff.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.plan import (
    GIB,
    Measured,
    NodeType,
    load_nodes,
    plan_inputs,
    shape_from_hint,
)
from onboarding.fetch.catalog import load_catalog
from onboarding.layouts.placement import (
    Layout,
    LayoutEntry,
    check_references,
    gpu_sets,
    layout_entries,
    load_layouts,
    option,
    plan_layout,
)
from onboarding.layouts.render import layout_summary
from onboarding.serving.profiles import load_slo_section
from onboarding.serving.stats import ServingBenchmarkResult
from tests.conftest import assert_golden

CONFIGS = PROJECT_ROOT / "configs"
GOLDEN = PROJECT_ROOT / "tests" / "golden" / "layouts"
NODES = load_nodes(CONFIGS / "nodes.yaml")
CATALOG = load_catalog(CONFIGS / "models")
CFG = load_layouts(CONFIGS / "layouts.yaml")
SLOS = load_slo_section(CONFIGS / "gates.yaml")
INPUTS = {m: plan_inputs(s, NODES, shape_from_hint(s.architecture, m), Measured())
          for m, s in CATALOG.items() if s.architecture is not None}

CASE_A = {  # the seed: large MoE on 0-3, 32B on 4-5, 8B on 6, embeddings + reranker on 7
    "qwen3-235b-a22b-instruct": ((0, 1, 2, 3), 4, 1),
    "qwen3-32b": ((4, 5), 2, 1),
    "llama-3-1-8b-instruct": ((6,), 1, 1),
    "bge-m3": ((7,), 1, 1),
    "bge-reranker-v2-m3": ((7,), 1, 1),
}
CASE_B = {"deepseek-r1": ((0, 1, 2, 3, 4, 5, 6, 7), 8, 8)}


def entries(layout: Layout, benchmarks=None, catalog=CATALOG, inputs=INPUTS):
    return layout_entries(layout, catalog, inputs, SLOS, benchmarks or {})


def planned(name: str, layout: Layout | None = None, **kw):
    layout = layout or CFG.layouts[name]
    return plan_layout(name, layout, entries(layout, **kw), CFG, NODES)


def layout(node_type: str, *models: tuple[str, float, str], **tp) -> Layout:
    return Layout(node_type=node_type, models=[
        {"model": m, "traffic_share": s, "qos": q, **({"tensor_parallel": tp[m.replace(
            "-", "_")]} if m.replace("-", "_") in tp else {})} for m, s, q in models])


def shape_of(plan) -> dict[str, tuple]:
    return {p.model: (p.gpu_ids, p.tensor_parallel, p.expert_parallel) for p in plan.placements}


@pytest.mark.parametrize(("name", "expected", "precision"), [
    ("b300-mixed", CASE_A, "nvfp4"), ("h200-mixed", CASE_A, "fp8"),
    ("b300-deepseek", CASE_B, "nvfp4"), ("h200-deepseek", CASE_B, "fp8"),
])
def test_seed_cases_golden(name, expected, precision):
    p = planned(name)
    assert p.feasible, p.reason
    assert shape_of(p) == expected
    assert {x.precision for x in p.placements if x.task == "generate"} == {precision}
    assert {x.throughput_basis for x in p.placements} == {"rule"}, "nothing measured here"
    text = json.dumps(layout_summary(p), indent=1) + "\n"
    assert_golden(GOLDEN / f"{name}.json", text, f"the plan of {name} changed")


def test_every_placement_stays_in_its_numa_half_unless_tp8_and_memory_fits():
    for name in CFG.layouts:
        p = planned(name)
        used: dict[int, int] = {}
        for x in p.placements:
            halves = {i for i, s in enumerate(p.numa_gpus) if set(s) & set(x.gpu_ids)}
            assert len(halves) == 1 or x.tensor_parallel == 8, (name, x.model)
            assert x.gpu_ids == tuple(range(x.gpu_ids[0], x.gpu_ids[0] + x.tensor_parallel))
            for g in x.gpu_ids:
                used[g] = used.get(g, 0) + round(x.gpu_memory_utilization * 100)
            assert x.need_bytes_per_gpu <= x.gpu_memory_utilization * p.memory_bytes_per_gpu
        assert max(used.values()) <= 88, f"{name}: a GPU's engines ask for more than 0.88"


def test_a_set_that_cannot_fit_says_which_model_and_why():
    too_many = layout("b300", ("deepseek-r1", 0.3, "latency-critical"),
                      ("llama-3-1-70b-instruct", 0.2, "latency-critical"),
                      ("qwen3-32b", 0.2, "latency-critical"),
                      ("llama-3-1-8b-instruct", 0.1, "latency-critical"),
                      ("bge-m3", 0.05, "latency-critical"),
                      ("bge-reranker-v2-m3", 0.05, "latency-critical"),
                      ("qwen3-235b-a22b-instruct", 0.1, "latency-critical"))
    p = planned("too-many", too_many)
    assert not p.feasible and not p.placements
    assert p.reason.startswith(
        "qwen3-235b-a22b-instruct nvfp4 needs TP >= 2 on b300; only 1 GPU left after "
        "deepseek-r1 TP 2, llama-3-1-70b-instruct TP 1, qwen3-32b TP 1")
    assert p.assignments_searched > 0, "the search ran and found nothing, not a shortcut"


def test_batch_engines_share_a_gpu_latency_critical_ones_never():
    """The same five models with embeddings and reranker made latency-critical: they may no
    longer share GPU 7, so each takes a GPU of its own and the 32B model gives one back."""
    strict = CFG.layouts["b300-mixed"].model_copy(update={"models": [
        m.model_copy(update={"qos": "latency-critical"}) for m in CFG.layouts["b300-mixed"].models]})
    p = planned("strict", strict)
    assert p.feasible
    assert all(not x.shares_gpu_with for x in p.placements)
    assert shape_of(p)["bge-m3"][0] != shape_of(p)["bge-reranker-v2-m3"][0]
    assert shape_of(p)["qwen3-32b"][1] == 1
    shared = planned("b300-mixed")
    assert shared.placement("bge-m3").shares_gpu_with == ("bge-reranker-v2-m3",)
    assert shared.placement("bge-m3").compute_fraction == 0.5


def test_the_search_beats_the_first_fit():
    """First fit (every model at its smallest TP that fits and meets the SLO) would leave the
    32B model on one GPU; the search gives it two, and the traffic mix's second bottleneck
    rises, while the first (the 235B model at TP 4) stays where it is."""
    p = planned("b300-mixed")
    smallest = {}
    for o in p.options:
        if o.ok and o.model not in smallest:
            smallest[o.model] = o
    assert smallest["qwen3-32b"].tensor_parallel == 1
    assert p.placement("qwen3-32b").tensor_parallel == 2
    first_fit_32b = smallest["qwen3-32b"].tokens_per_s_per_gpu * 1 / 0.30
    assert p.placement("qwen3-32b").tokens_per_s / 0.30 > 1.9 * first_fit_32b
    assert p.mix_tokens_per_s == pytest.approx(
        p.placement("qwen3-235b-a22b-instruct").tokens_per_s / 0.45)
    assert p.assignments_searched > 100


def test_throughput_measured_beats_predicted_beats_rule_and_each_says_so():
    calls = []

    def predictor(model, node_type, precision, tp):
        calls.append((model, node_type, precision, tp))
        if model == "qwen3-32b":
            return 1000.0 * tp, "aiconfigurator stand-in (test)"
        return None

    bench = ServingBenchmarkResult(model="qwen3-32b", precision="nvfp4", node_type="b300",
                                   gpus=2, servable=True, tokens_per_s_per_gpu=777.0,
                                   saturation_concurrency=32, slo_pass=True)
    lay = CFG.layouts["b300-mixed"]
    es = entries(lay, benchmarks={"qwen3-32b": bench})
    p = plan_layout("b300-mixed", lay, es, CFG, NODES, predictor)
    by_tp = {o.tensor_parallel: o for o in p.options if o.model == "qwen3-32b"}
    assert by_tp[2].throughput_basis == "measured" and by_tp[2].tokens_per_s_per_gpu == 777.0
    assert by_tp[4].throughput_basis == "predicted" and by_tp[4].tokens_per_s_per_gpu == 4000.0
    assert "aiconfigurator stand-in" in by_tp[4].throughput_detail
    assert ("qwen3-32b", "b300", "nvfp4", 4) in calls
    assert ("qwen3-32b", "b300", "nvfp4", 2) not in calls, "measured: no prediction asked"
    llama = [o for o in p.options if o.model == "llama-3-1-8b-instruct"]
    assert {o.throughput_basis for o in llama} == {"rule"}
    assert all(o.throughput_detail.startswith("rule (HBM roofline)") for o in llama)


def test_a_measured_slo_miss_rules_that_tp_out():
    bench = ServingBenchmarkResult(model="qwen3-32b", precision="nvfp4", node_type="b300",
                                   gpus=2, servable=True, tokens_per_s_per_gpu=5000.0,
                                   saturation_concurrency=8, slo_pass=False,
                                   slo_violations=("TTFT p95 2.100 s > 1.5 s",))
    p = planned("b300-mixed", benchmarks={"qwen3-32b": bench})
    tp2 = next(o for o in p.options if o.model == "qwen3-32b" and o.tensor_parallel == 2)
    assert not tp2.ok and "measured SLO miss on b300 (TTFT p95 2.100 s > 1.5 s)" in tp2.reason
    assert p.placement("qwen3-32b").tensor_parallel != 2


def test_a_benchmark_elsewhere_is_not_taken_as_measured_here():
    for other in ({"node_type": "h200"}, {"gpus": 1}, {"precision": "fp8"}):
        bench = ServingBenchmarkResult(**{
            "model": "qwen3-32b", "precision": "nvfp4", "node_type": "b300", "gpus": 2,
            "servable": True, "tokens_per_s_per_gpu": 9999.0, "saturation_concurrency": 32,
            "slo_pass": True, **other})
        p = planned("b300-mixed", benchmarks={"qwen3-32b": bench})
        tp2 = next(o for o in p.options if o.model == "qwen3-32b" and o.tensor_parallel == 2)
        assert tp2.throughput_basis == "rule", other


def test_deepseek_r1_mla_kv_and_experts_at_tp8():
    p = planned("b300-deepseek")
    x = p.placement("deepseek-r1")
    per_token = 61 * (512 + 64) * 2  # latent + rope dims per layer, bf16, whole on every rank
    assert x.kv_bytes_per_gpu == 32 * 16384 * per_token
    params, kept = 671e9, 129280 * 7168 * 2 + (61 - 3) * 256 * 7168  # embed+lm_head, routers
    assert x.weight_bytes_per_gpu == pytest.approx(((params - kept) * 0.5625 + kept * 2) / 8,
                                                   rel=1e-6)
    assert (x.tensor_parallel, x.expert_parallel) == (8, 8)


def test_the_slo_decides_deepseek_on_h200():
    """At the default 30 ms ITL (the catalog sets 50 ms for R1), the rule's 37 ms decode step
    at TP 8 misses it, and TP 1-4 do not fit in memory: the set cannot be served, and says so."""
    spec = CATALOG["deepseek-r1"]
    strict = {**CATALOG, "deepseek-r1": spec.model_copy(update={"slo": spec.slo.model_copy(
        update={"itl_mean_ms": None})})}
    lay = CFG.layouts["h200-deepseek"]
    p = plan_layout("h200-deepseek", lay, entries(lay, catalog=strict), CFG, NODES)
    assert not p.feasible
    assert "TP 4: needs 195.0 GiB per GPU" in p.reason and "short by 71.4 GiB" in p.reason
    assert "TP 8: the rule's ITL 37.0 ms exceeds the SLO's 30 ms at concurrency 32" in p.reason


def test_pooling_models_keep_no_kv_cache():
    x = planned("b300-mixed").placement("bge-m3")
    assert x.kv_bytes_per_gpu == 0 and x.task == "embed"
    assert x.weight_bytes_per_gpu == round(0.568e9 * 2)
    assert x.reserve_bytes_per_gpu == 4 * GIB
    assert "compute roofline" in x.throughput_detail


def test_shared_gpu_splits_the_fixed_fraction():
    p = planned("h200-mixed")
    a, b = p.placement("bge-m3"), p.placement("bge-reranker-v2-m3")
    assert a.gpu_ids == b.gpu_ids == (7,)
    assert a.gpu_memory_utilization + b.gpu_memory_utilization <= 0.88
    assert a.gpu_memory_utilization >= a.need_bytes_per_gpu / p.memory_bytes_per_gpu
    assert {x.gpu_memory_utilization for x in p.placements if not x.shares_gpu_with} == {0.88}


def test_gpu_sets_are_aligned_and_numa_local():
    b300 = NODES.node_types["b300"]
    assert gpu_sets(b300, 2, 4) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert gpu_sets(b300, 4, 4) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert gpu_sets(b300, 8, 4) == [tuple(range(8))]
    interleaved = NodeType(**{**b300.model_dump(), "numa_gpus": [[0, 2, 4, 6], [1, 3, 5, 7]]})
    assert gpu_sets(interleaved, 2, 4) == [], "no contiguous pair inside one socket"
    assert gpu_sets(interleaved, 1, 4) == [(g,) for g in range(8)]


def test_tensor_parallel_pin_restricts_the_search():
    lay = CFG.layouts["b300-deepseek"]
    pinned = lay.model_copy(update={"models": [lay.models[0].model_copy(
        update={"tensor_parallel": [4]})]})
    x = planned("pinned", pinned).placement("deepseek-r1")
    assert (x.gpu_ids, x.tensor_parallel, x.expert_parallel) == ((0, 1, 2, 3), 4, 1)


def test_option_reports_the_memory_shortfall_in_plan_py_terms():
    e = LayoutEntry(spec=CATALOG["qwen3-235b-a22b-instruct"],
                    inputs=INPUTS["qwen3-235b-a22b-instruct"], traffic_share=1.0,
                    qos="latency-critical", slo=entries(CFG.layouts["h200-mixed"])[0].slo)
    o = option(e, 2, "h200", NODES.node_types["h200"], NODES, CFG)
    assert not o.ok
    assert o.reason == ("TP 2: needs 161.1 GiB per GPU (weights 110.1 GiB + KV 47.0 GiB + "
                        "reserve 4.0 GiB), budget 123.6 GiB: short by 37.5 GiB")


# ---- layouts.yaml --------------------------------------------------------------------------


def _write(tmp_path, mutate) -> object:
    data = yaml.safe_load((CONFIGS / "layouts.yaml").read_text())
    mutate(data)
    path = tmp_path / "layouts.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda d: d["engine"].update(gpu_memory_utilization=0.95),
     r"field 'engine.gpu_memory_utilization'.*less than or equal to 0.9"),
    (lambda d: d["layouts"]["b300-mixed"]["models"][0].update(traffic_share=0.9),
     r"field 'layouts.b300-mixed'.*shares must sum to 1"),
    (lambda d: d["layouts"]["b300-mixed"]["models"][0].update(qos="gold"),
     r"layouts.b300-mixed.models.0.qos: 'gold' is not under qos_classes"),
    (lambda d: d["qos_classes"]["batch"].update(max_parallel=3),
     r"field 'qos_classes.batch.max_parallel': unknown key"),
    (lambda d: d["layouts"]["b300-mixed"]["models"][0].update(tensor_parallel=[3]),
     r"tensor_parallel: powers of two only"),
])
def test_layouts_yaml_errors_name_file_and_field(tmp_path, mutate, expected):
    path = _write(tmp_path, mutate)
    with pytest.raises(ConfigError, match=expected) as err:
        load_layouts(path)
    assert str(path) in str(err.value)


def test_references_to_node_types_and_models_are_checked(tmp_path):
    path = _write(tmp_path, lambda d: d["layouts"]["b300-mixed"]["models"][1].update(
        model="qwen9-1t"))
    with pytest.raises(ConfigError, match=r"layouts.b300-mixed.models.1.model: 'qwen9-1t' is not "
                       "in the catalog"):
        check_references(load_layouts(path), path, NODES, set(CATALOG))
    path = _write(tmp_path, lambda d: d["throughput_rule"]["node_types"].pop("h200"))
    with pytest.raises(ConfigError, match=r"throughput_rule.node_types.h200: required by layout"):
        check_references(load_layouts(path), path, NODES, set(CATALOG))


def test_configs_resource_reads_layouts_through_one_door(configs, config_dir):
    for m in {m.model for lay in CFG.layouts.values() for m in lay.models}:
        (config_dir / "models" / f"{m}.yaml").write_text(
            (CONFIGS / "models" / f"{m}.yaml").read_text())
    assert set(configs.layouts().layouts) == set(CFG.layouts)
    (config_dir / "models" / "qwen3-32b.yaml").unlink()
    with pytest.raises(ConfigError, match="'qwen3-32b' is not in the catalog"):
        configs.layouts()


def test_entries_carry_the_models_own_slo():
    e = {x.spec.id: x for x in entries(CFG.layouts["b300-deepseek"])}
    assert e["deepseek-r1"].slo.itl_mean_ms == 50
    assert dataclasses.asdict(e["deepseek-r1"].slo)["ttft_p95_s"] == 1.5


def test_layouts_yaml_credits_its_bandwidth_figures_to_where_they_are():
    """configs/layouts.yaml credited the twins' step times to docs/gpu.md, which does
    not hold them; they are configs/predict/h200_points.json's mean TPOT."""
    import re

    text = (PROJECT_ROOT / "configs" / "layouts.yaml").read_text()
    note = text[text.index("# bandwidth_efficiency 0.5"):text.index("throughput_rule:")]
    assert "docs/gpu.md" not in note and "configs/predict/h200_points.json" in note
    points = json.loads((PROJECT_ROOT / "configs/predict/h200_points.json").read_text())
    tpots = {p["tpot_mean_ms"] for p in points["points"]} if isinstance(points, dict) else {
        p["tpot_mean_ms"] for p in points}
    for ms in re.findall(r"([0-9.]+) ms", note):
        assert float(ms) in tpots, ms
