"""Calibration arithmetic on crafted pairs, the measured-points format, coverage reading, and the
SLA-bound TP choice against plan.py's memory rule. Pure: no AIConfigurator needed.

Two kinds of predictions feed these tests, each named where used: crafted ones (made up to pin
one rule) and recorded ones (tests/data/predict/recorded_predictions.json: the library's real
answers, written by `bench/predictions.py --record`), replayed without the library.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from bench.gpu_recordings import folder
from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.plan import Measured, load_nodes, plan, plan_inputs, shape_from_hint
from onboarding.fetch.catalog import ArchitectureHint, ModelSpec
from onboarding.predictions.predict import (
    CalibrationPair,
    MeasuredPoint,
    Prediction,
    PredictionRequest,
    calibrate,
    calibrate_metric,
    calibrate_points,
    choose_by_sla,
    classify_coverage,
    config_from_hint,
    correct,
    load_points,
    load_predict_config,
    make_request,
    pair_points,
    pending_calibration,
    point_from_stats,
    predict_model,
    prediction_from_dict,
    slo_verdict,
)
from onboarding.serving.stats import Dist, PointStats, Slo

CONFIGS = PROJECT_ROOT / "configs"
NODES = load_nodes(CONFIGS / "nodes.yaml")
CFG = load_predict_config(CONFIGS / "predict.yaml")
RECORDED = json.loads((PROJECT_ROOT / "tests" / "data" / "predict" /
                       "recorded_predictions.json").read_text())
SLO = Slo(ttft_p95_s=1.5, itl_mean_ms=30, error_rate_max=0.0, target_concurrency=32)
LLAMA_70B = ModelSpec.model_validate(
    yaml.safe_load((CONFIGS / "models" / "llama-3-1-70b-instruct.yaml").read_text()))
DENSE = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
         "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 128}


def request(node_type="b300", precision="nvfp4", tp=1, batch=32, config=DENSE, **kw):
    return make_request(CFG, "m", config, node_type, precision, tp, batch, **kw)


def crafted(req: PredictionRequest, ttft_ms=100.0, tpot_ms=10.0, tput=1000.0,
            status="covered", notes=()) -> Prediction:
    """A made-up prediction (not the library's)."""
    covered = status in ("covered", "fallback")
    return Prediction(request=req, status=status, aic_version="0.12.0",
                      data_set=f"{req.system}/vllm/0.24.0", ttft_ms=ttft_ms if covered else None,
                      tpot_ms=tpot_ms if covered else None,
                      tokens_per_s_per_gpu=tput if covered else None, notes=tuple(notes))


def point(**kw) -> MeasuredPoint:
    base = {"model": "m", "config": "m", "precision": "fp8", "node_type": "h200",
            "tensor_parallel": 1, "scenario": "chat", "input_tokens": 512, "output_tokens": 256,
            "concurrency": 32, "gpus": 1, "output_tokens_per_s": 1000.0, "engine": "vllm 0.22.0",
            "source": "crafted for a test"}
    return MeasuredPoint(**{**base, **kw})


# ---- calibration arithmetic (crafted pairs) ----

def pair(ratio: float, metric="tpot_ms", predicted=10.0) -> CalibrationPair:
    return CalibrationPair(f"p{ratio}", metric, predicted, predicted * ratio, "mean TPOT")


def test_k_is_the_geometric_mean_and_spread_the_geometric_sd():
    m = calibrate_metric("tpot_ms", [pair(2.0), pair(8.0)])
    assert m.n == 2 and m.k == pytest.approx(4.0)  # sqrt(2 * 8), not (2 + 8) / 2
    # log ratios ln2, ln8 around ln4: sample sd = sqrt(2) ln2
    assert m.spread == pytest.approx(math.exp(math.sqrt(2) * math.log(2)) - 1)
    assert (m.ratio_min, m.ratio_max) == (2.0, 8.0)
    assert "×4.00, spread ±167% over 2 points" in m.phrase()


def test_one_point_has_no_spread_and_none_is_not_corrected():
    one = calibrate_metric("tpot_ms", [pair(0.5)])
    assert one.k == pytest.approx(0.5) and one.spread is None
    assert "spread unknown over 1 point" in one.phrase()
    none = calibrate_metric("ttft_p95_ms", [pair(0.5)])
    assert none.n == 0 and none.k is None and "not corrected" in none.phrase()


def test_pairs_take_each_metric_from_its_statistic_and_skip_what_is_not_covered():
    points = [point(ttft_p50_ms=300, tpot_mean_ms=None, itl_mean_ms=6.0,
                    output_tokens_per_s=4000, gpus=2, tensor_parallel=2),
              point(precision="nvfp4", ttft_p95_ms=500, tpot_mean_ms=5.0)]
    preds = [crafted(request(node_type="h200", precision="fp8", tp=2), ttft_ms=100, tpot_ms=5,
                     tput=1000),
             crafted(request(node_type="h200"), status="not_covered",
                     notes=["no NVFP4 GEMM data"])]
    pairs, skipped = pair_points(points, preds)
    got = {p.metric: (p.predicted, p.measured, p.stat) for p in pairs}
    assert got == {"ttft_p50_ms": (100, 300, "p50"), "tpot_ms": (5, 6.0, "mean ITL"),
                   "tokens_per_s_per_gpu": (1000, 2000, "output tokens/s / GPUs")}
    assert len(skipped) == 1 and "not_covered (no NVFP4 GEMM data)" in skipped[0]
    with pytest.raises(ValueError, match="2 points but 1 predictions"):
        pair_points(points, preds[:1])


def test_corrected_prediction_carries_the_sentence():
    cal = calibrate("h200", [pair(0.5), pair(0.5, predicted=20.0),
                             pair(2.0, "tokens_per_s_per_gpu")], "0.12.0", "h200_sxm/vllm/0.24.0")
    p = correct(crafted(request(), tpot_ms=12.0, tput=900.0, ttft_ms=200.0), cal)
    assert p.tpot_ms == pytest.approx(6.0) and p.tokens_per_s_per_gpu == pytest.approx(1800.0)
    assert p.ttft_ms == pytest.approx(200.0) and p.ttft_stat == "uncorrected"
    assert p.basis.startswith("predicted by AIConfigurator 0.12.0 from its b300_sxm vllm 0.24.0 "
                              "data, corrected by the H200 calibration (")
    assert "TPOT measured/predicted ×0.50, spread ±0% over 2 points" in p.basis
    assert "tokens/s measured/predicted ×2.00, spread unknown over 1 point" in p.basis


def test_ttft_prefers_the_p95_calibration_and_says_when_only_p50_exists():
    p50 = CalibrationPair("a", "ttft_p50_ms", 100, 400, "p50")
    p95 = CalibrationPair("a", "ttft_p95_ms", 100, 800, "p95")
    only_p50 = correct(crafted(request(), ttft_ms=100), calibrate("h200", [p50], "v", "d"))
    both = correct(crafted(request(), ttft_ms=100), calibrate("h200", [p50, p95], "v", "d"))
    assert (only_p50.ttft_ms, only_p50.ttft_stat) == (pytest.approx(400), "p50")
    assert (both.ttft_ms, both.ttft_stat) == (pytest.approx(800), "p95")
    assert "judged on a p50 calibration" in slo_verdict(only_p50, SLO)[1]


def test_pending_calibration_leaves_numbers_and_says_uncorrected():
    p = correct(crafted(request(), tpot_ms=12.0), pending_calibration("h200"))
    assert p.tpot_ms == 12.0
    assert "uncorrected: the H200 calibration has no measured point yet" in p.basis


def test_not_covered_is_reported_never_filled_in():
    p = correct(crafted(request(node_type="h200"), status="not_covered",
                        notes=["GEMM perf data missing for quant 'nvfp4_wo'"]),
                pending_calibration("h200"))
    assert p.ttft_ms is p.tpot_ms is p.tokens_per_s_per_gpu is None
    assert p.basis.startswith("not covered by AIConfigurator 0.12.0 (h200_sxm/vllm/0.24.0)")
    assert slo_verdict(p, SLO) == (None, "not covered")


def test_without_a_calibration_the_basis_claims_no_node_types_measurements():
    """No calibration given: uncorrected, and the sentence names no node type's calibration
    (which node type calibrates is configs/predict.yaml's `calibration.node_type`)."""
    p = correct(crafted(request(), ttft_ms=100, tpot_ms=12.0), None)
    assert p.ttft_ms == 100 and p.tpot_ms == 12.0
    assert p.basis.endswith("uncorrected: no calibration given"), p.basis


def test_slo_verdict_names_each_bound_missed():
    ok = correct(crafted(request(), ttft_ms=1400, tpot_ms=29), None)
    bad = correct(crafted(request(), ttft_ms=1600, tpot_ms=31), None)
    assert slo_verdict(ok, SLO) == (True, "meets the SLO")
    assert slo_verdict(bad, SLO) == (False, "TTFT 1.60 s > 1.5 s; TPOT 31.0 ms > 30 ms")


# ---- the measured-points format ----

def test_the_shipped_points_load_and_point_at_their_configs():
    points = load_points(CONFIGS / "predict" / "h200_points.json")
    assert len(points.points) >= 3 and {p.node_type for p in points.points} == {"h200"}
    for p in points.points:
        assert points.model_configs[p.config]["architectures"]


@pytest.mark.parametrize(("edit", "needles"), [
    (lambda d: d["points"][0].update(ttft_p50=1), ["points.0.ttft_p50", "unknown key"]),
    (lambda d: d["points"][0].update(config="nope"), ["points.0.config 'nope'"]),
    (lambda d: d["points"][0].pop("output_tokens_per_s"),
     ["points.0.output_tokens_per_s", "required"]),
    (lambda d: d.update(format="v0"), ["field 'format'"]),
])
def test_a_broken_points_file_names_file_and_field(tmp_path, edit, needles):
    data = json.loads((CONFIGS / "predict" / "h200_points.json").read_text())
    edit(data)
    path = tmp_path / "points.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        load_points(path)
    assert str(path) in str(err.value)
    for needle in needles:
        assert needle in str(err.value)


def test_a_point_from_the_serving_benchmark_stats_is_in_ms():
    d = Dist(0.2, 0.15, 0.3, 0.4, 0.5)
    stats = PointStats(requests=10, completed=10, failed=0, errors_by_cause={}, duration_s=10,
                       request_throughput_rps=1, input_tokens_per_s=1, output_tokens_per_s=6000,
                       ttft_s=d, itl_ms=Dist(5, 5, 5, 5, 5), tpot_ms=Dist(6, 6, 6, 6, 6), e2e_s=d)
    p = point_from_stats("m", "m", "fp8", "h200", 2, "chat", 512, 256, 32, 2, stats,
                         "vllm 0.22.0", "GPU run")
    assert (p.ttft_p50_ms, p.ttft_p95_ms, p.tpot_mean_ms) == (150.0, 400.0, 6.0)
    assert p.measured("tokens_per_s_per_gpu") == (3000.0, "output tokens/s / GPUs")


# ---- coverage ----

def test_coverage_covered_fallback_and_the_mode_the_library_ran():
    srcs = {"genonly_step": {"generation_qkv_gemm": "silicon", "generation_add_norm_1":
                             "empirical", "generation_attention": "silicon"}}
    lat = {"genonly_step": {"generation_qkv_gemm": 3.0, "generation_add_norm_1": 1.0,
                            "generation_attention": 4.0}}
    req = request()
    status, notes, share = classify_coverage(req, {"gemm": "nvfp4"}, srcs, lat)
    assert status == "covered" and share == pytest.approx(7 / 8)
    assert "1 elementwise ops" in notes[0] and "88% of the step time" in notes[0]
    status, notes, _ = classify_coverage(
        req, {"gemm": "nvfp4"}, {"genonly_step": {**srcs["genonly_step"],
                                                  "generation_qkv_gemm": "empirical"}}, lat)
    assert status == "fallback" and "generation_qkv_gemm by empirical" in notes[0]
    status, notes, _ = classify_coverage(req, {"gemm": "nvfp4_wo"}, srcs, lat)
    assert status == "fallback" and "gemm asked nvfp4, modelled as nvfp4_wo" in notes


def test_a_dense_model_ignores_the_moe_mode_a_moe_model_does_not():
    srcs, lat = {"s": {"x_gemm": "silicon"}}, {"s": {"x_gemm": 1.0}}
    assert classify_coverage(request(), {"gemm": "nvfp4", "moe": "bfloat16"}, srcs, lat)[0] \
        == "covered"
    moe = {**DENSE, "num_experts": 8, "num_experts_per_tok": 2}
    status, notes, _ = classify_coverage(request(config=moe), {"gemm": "nvfp4",
                                                               "moe": "bfloat16"}, srcs, lat)
    assert status == "fallback" and "moe asked nvfp4, modelled as bfloat16" in notes


def test_requests_follow_predict_yaml_and_expert_parallel_only_for_moe():
    r = request(node_type="b300", precision="fp8", tp=4, kv_cache_dtype="fp8_e4m3",
                expert_parallel=True)
    assert (r.system, r.gemm_mode, r.kv_cache_mode, r.expert_parallel) == \
        ("b300_sxm", "fp8", "fp8", 1)
    moe = {**DENSE, "num_experts": 8}
    assert request(config=moe, tp=4, expert_parallel=True).expert_parallel == 4
    with pytest.raises(ConfigError, match="no AIConfigurator system for node type 'cpu'"):
        request(node_type="cpu")


def test_a_hint_without_what_the_model_needs_is_named_not_guessed():
    hint = ArchitectureHint(params_billion=1, num_layers=2, num_kv_heads=2, head_dim=64,
                            num_attention_heads=4, hidden_size=256, vocab_size=100)
    with pytest.raises(ConfigError, match="lacks hf_architecture, intermediate_size"):
        config_from_hint(hint)
    cfg = config_from_hint(LLAMA_70B.architecture)
    assert (cfg["architectures"], cfg["intermediate_size"], cfg["num_key_value_heads"]) == \
        (["LlamaForCausalLM"], 28672, 8)


# ---- the SLA-bound plan ----

def inputs_for(spec: ModelSpec):
    return plan_inputs(spec, NODES, shape_from_hint(spec.architecture, spec.id), Measured())


def crafted_predictor(tpot_at_tp1_ms: float, calls: list | None = None, node_type="b300",
                      precision="nvfp4"):
    """Made up: TPOT falls as 1/TP, tokens/s/GPU too (TP1 is the most efficient)."""
    def predict(tp: int, batch: int) -> Prediction:
        if calls is not None:
            calls.append((tp, batch))
        req = request(node_type=node_type, precision=precision, tp=tp, batch=batch)
        return crafted(req, ttft_ms=200.0, tpot_ms=tpot_at_tp1_ms / tp * batch / 32,
                       tput=2000.0 / tp)
    return predict


def test_the_sla_not_memory_chooses_a_larger_tp():
    inputs = inputs_for(LLAMA_70B)
    assert plan(inputs, NODES).node("b300").tensor_parallel == 1  # the memory rule's choice
    choice = choose_by_sla(inputs, "b300", NODES, SLO, crafted_predictor(45.0), None)
    # memory alone fits nvfp4 70B on one B300; TPOT 45 ms there misses 30 ms, 22.5 ms at TP 2
    assert choice.basis == "sla" and choice.sla_pass is True and choice.tensor_parallel == 2
    assert "memory alone would take TP 1" in choice.reason
    assert choice.node_plan.feasible and choice.node_plan.tensor_parallel == 2
    assert any(c.startswith("TP 1: TPOT 45.0 ms > 30") for c in choice.considered)
    relaxed = choose_by_sla(inputs, "b300", NODES, SLO, crafted_predictor(20.0), None)
    assert relaxed.tensor_parallel == 1  # the SLA holds at TP 1: the most tokens/s/GPU wins


def test_memory_stays_a_hard_constraint():
    bf16 = LLAMA_70B.model_copy(update={"precision_ladder": ["bf16"]})
    calls: list = []
    choice = choose_by_sla(inputs_for(bf16), "h200", NODES, SLO,
                           crafted_predictor(5.0, calls, "h200", "bf16"), None)
    # every TP meets the crafted SLO and TP 1 would be the most efficient, but 141 GB of bf16
    # weights do not fit one H200: it is never even predicted
    assert choice.tensor_parallel == 2 and all(tp != 1 for tp, _ in calls)
    assert any(c.startswith("TP 1: memory:") for c in choice.considered)


def test_max_num_seqs_grows_until_the_slo_or_memory_stops_it():
    choice = choose_by_sla(inputs_for(LLAMA_70B), "b300", NODES, SLO, crafted_predictor(20.0),
                           None, (32, 64, 128, 256))
    # crafted TPOT 20 ms x batch/32: 40 ms at 64 sequences misses the SLO
    assert choice.max_num_seqs == 32 and "64 sequences: TPOT 40.0 ms > 30" in choice.reason
    roomy = choose_by_sla(inputs_for(LLAMA_70B), "b300", NODES, SLO, crafted_predictor(2.0),
                          None, (32, 64, 128, 256))
    limit = roomy.node_plan.max_sequences_at_context
    assert 64 <= roomy.max_num_seqs <= limit < 256


def test_without_a_covered_prediction_the_memory_rule_stands_and_says_so():
    def not_covered(tp, batch):
        return crafted(request(tp=tp, batch=batch), status="not_covered", notes=["no data"])

    choice = choose_by_sla(inputs_for(LLAMA_70B), "b300", NODES, SLO, not_covered, None)
    assert choice.basis == "memory" and choice.sla_pass is None and choice.tensor_parallel == 1
    assert "SLO not checked" in choice.reason


def test_when_no_tp_meets_the_slo_the_smallest_fitting_stands_failed():
    choice = choose_by_sla(inputs_for(LLAMA_70B), "b300", NODES, SLO, crafted_predictor(1e4),
                           None)
    assert choice.sla_pass is False and choice.tensor_parallel == 1
    assert "no TP meets the SLO" in choice.reason


# ---- the library's recorded answers, replayed ----

def replay(recorded: list[dict]):
    by_request = {}
    for d in recorded:
        p = prediction_from_dict(d)
        by_request[p.request] = p

    def predict(req: PredictionRequest) -> Prediction:
        return by_request[req]  # KeyError: a request the recording never saw
    return predict


TWINS_RECORDING = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200-performance-twins"


def test_the_performance_twin_points_are_their_recordings_table():
    """configs/predict/h200_points.json's points from the performance-twins recording are that
    README's table, row for row (TTFT p50, TPOT, tokens/s; one H200, concurrency 32)."""
    from onboarding.common.tables import read_md_table

    table = read_md_table((TWINS_RECORDING / "README.md").read_text())
    shipped = load_points(CONFIGS / "predict" / "h200_points.json")
    twins = [p for p in shipped.points if "h200-performance-twins/" in p.source]
    assert len(twins) == len(table) == 3
    for p, row in zip(twins, table, strict=True):
        assert p.config == row["shape"].lower() and row["precision"].lower().startswith(
            p.precision), (p.config, row)
        assert (p.concurrency, p.input_tokens, p.output_tokens) == (32, 512, 256)
        assert p.ttft_p50_ms == float(row["TTFT p50 ms"].replace(",", ""))
        assert p.tpot_mean_ms == float(row["TPOT mean ms"])
        assert p.output_tokens_per_s == float(row["output tok/s"].replace(",", ""))


def test_recorded_points_give_the_documented_calibration():
    """The three performance-twin points (points added later leave this as is)."""
    shipped = load_points(CONFIGS / "predict" / "h200_points.json")
    twins = [p for p in shipped.points if "h200-performance-twins/" in p.source]
    points = shipped.model_copy(update={"points": twins})
    cal, preds = calibrate_points(CFG, points, replay(RECORDED["points"]))
    assert [p.status for p in preds] == ["covered"] * 3
    assert cal.points == 3 and cal.data_set == "h200_sxm/vllm/0.24.0"
    assert cal.of("tpot_ms").k == pytest.approx(0.821, abs=0.005)
    assert cal.of("tokens_per_s_per_gpu").k == pytest.approx(1.027, abs=0.005)
    assert cal.of("ttft_p50_ms").k == pytest.approx(4.40, abs=0.02)
    assert cal.of("ttft_p95_ms").n == 0  # the twins recorded p50 only


def test_recorded_b300_predictions_choose_tp2_for_bf16_where_memory_takes_tp1():
    """Real library answers (uncorrected): 70B bf16 fits one B300, but its predicted TPOT at
    concurrency 32 is 35 ms; TP 2 predicts 21 ms."""
    bf16 = LLAMA_70B.model_copy(update={"precision_ladder": ["bf16"]})
    cfg = CFG.model_copy(update={"node_types": ["b300"]})
    table = predict_model(cfg, bf16, config_from_hint(bf16.architecture), inputs_for(bf16),
                          NODES, lambda nt: SLO, replay(RECORDED["predictions"]), None)
    (choice,) = table.choices
    assert choice.node_plan.tensor_parallel == 2 and choice.tensor_parallel == 2
    assert "memory alone would take TP 1" in choice.reason
    assert choice.max_num_seqs == 64  # 128 sequences predict TPOT 44 ms
    tput, basis = table.throughput_for(bf16.id, "b300", "bf16", 2)
    assert tput == pytest.approx(728, rel=0.01) and "uncorrected" in basis
    assert table.throughput_for(bf16.id, "b300", "nvfp4", 2) is None
    fits = {r.prediction.prediction.request.tensor_parallel: r.fits_memory for r in table.rows}
    assert fits == {1: True, 2: True, 4: True, 8: True}


def test_heads_that_do_not_split_are_not_applicable_and_never_asked():
    odd = {**DENSE, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    hint = ArchitectureHint(params_billion=0.135, num_layers=2, num_kv_heads=3, head_dim=64,
                            num_attention_heads=9)
    spec = ModelSpec(id="odd", source="s3://models/odd/", served_name="odd",
                     precision_ladder=["bf16"], architecture=hint)
    asked: list = []

    def predict(req):
        asked.append(req.tensor_parallel)
        return crafted(req, status="not_covered", notes=["no attention data for head_size 64"])

    cfg = CFG.model_copy(update={"node_types": ["b300"]})
    table = predict_model(cfg, spec, odd, inputs_for(spec), NODES, lambda nt: SLO, predict, None)
    statuses = {r.prediction.prediction.request.tensor_parallel: r.prediction.prediction.status
                for r in table.rows}
    assert statuses == {1: "not_covered", 2: "not_applicable", 4: "not_applicable",
                        8: "not_applicable"}
    assert set(asked) == {1}


# ---- a GPU sweep into the points file ----

def sweep_csv(tmp_path: Path) -> Path:
    """The serving benchmark's table as the asset writes it (PointStats.row() per point)."""
    from onboarding.common.tables import write_csv

    def stats(ttft_s, failed=0):
        d = Dist(ttft_s, ttft_s, ttft_s * 1.5, ttft_s * 2, ttft_s * 3)
        return PointStats(requests=100, completed=100 - failed, failed=failed,
                          errors_by_cause={"timeout": failed} if failed else {},
                          duration_s=10, request_throughput_rps=10, input_tokens_per_s=1,
                          output_tokens_per_s=5000, ttft_s=d, itl_ms=Dist(*[5.0] * 5),
                          tpot_ms=Dist(*[6.0] * 5), e2e_s=d)
    rows = [{"scenario": "chat", "load": 8, **stats(0.1).row(), "engine_exited": False},
            {"scenario": "chat", "load": 32, **stats(0.2).row(), "engine_exited": False},
            {"scenario": "rag", "load": 32, **stats(0.9, failed=3).row(), "engine_exited": False}]
    return write_csv(tmp_path / "serving_benchmark.csv", rows)


def test_a_sweep_table_becomes_measured_points_without_its_failed_points(tmp_path):
    import csv

    from onboarding.predictions.predict import Scenario, add_points, points_from_sweep_rows

    with sweep_csv(tmp_path).open(newline="") as f:
        rows = list(csv.DictReader(f))
    scenarios = {"chat": Scenario(input_tokens=512, output_tokens=256),
                 "rag": Scenario(input_tokens=4096, output_tokens=512)}
    new = points_from_sweep_rows(rows, scenarios, model="m", config="m", precision="fp8",
                                 node_type="h200", tensor_parallel=2, gpus=2,
                                 engine="vllm 0.22.0", source="test sweep")
    assert [(p.scenario, p.concurrency) for p in new] == [("chat", 8), ("chat", 32)]
    assert (new[1].ttft_p50_ms, new[1].ttft_p95_ms, new[1].tpot_mean_ms) == \
        pytest.approx((200.0, 400.0, 6.0))
    assert new[1].measured("tokens_per_s_per_gpu")[0] == pytest.approx(2500.0)
    shipped = load_points(CONFIGS / "predict" / "h200_points.json")
    merged = add_points(shipped, new, "m", DENSE)
    assert len(merged.points) == len(shipped.points) + 2 and merged.model_configs["m"] == DENSE
    again = add_points(merged, new[:1], "m", DENSE)  # the same configuration replaces, not adds
    assert len(again.points) == len(merged.points)


def test_client_accounting_errors_keep_latency_not_throughput_and_queued_loads_are_left_out():
    """The twins' no_content failures are the client's count, not the engine's: TTFT and TPOT
    of the completed requests stay, tokens/s (completed only) goes; a load above the engine's
    max-num-seqs measured a queue, and any other error still drops the row."""
    from onboarding.predictions.predict import Scenario, points_from_sweep_rows

    def row(load, causes):
        failed = sum(causes.values())
        d = Dist(0.2, 0.2, 0.3, 0.4, 0.5)
        st = PointStats(requests=100, completed=100 - failed, failed=failed,
                        errors_by_cause=causes, duration_s=10, request_throughput_rps=10,
                        input_tokens_per_s=1, output_tokens_per_s=4000, ttft_s=d,
                        itl_ms=Dist(*[7.0] * 5), tpot_ms=Dist(*[4.7] * 5), e2e_s=d)
        return {"scenario": "chat", "load": load, **st.row(), "engine_exited": False}

    rows = [row(8, {"no_content": 15}), row(32, {"no_content": 14, "timeout": 1}),
            row(64, {"no_content": 14}), row(16, {})]
    args = {"model": "m", "config": "m", "precision": "fp8", "node_type": "h200",
            "tensor_parallel": 1, "gpus": 1, "engine": "vllm 0.22.0", "source": "test"}
    chat = {"chat": Scenario(input_tokens=512, output_tokens=256)}
    assert [p.concurrency for p in points_from_sweep_rows(rows, chat, **args)] == [16]
    kept = points_from_sweep_rows(rows, chat, max_num_seqs=32,
                                  client_error_causes=frozenset({"no_content"}), **args)
    assert [p.concurrency for p in kept] == [8, 16]
    assert (kept[0].ttft_p95_ms, kept[0].tpot_mean_ms) == pytest.approx((400.0, 4.7))
    assert kept[0].output_tokens_per_s is None
    assert kept[0].measured("tokens_per_s_per_gpu")[0] is None
    assert kept[1].measured("tokens_per_s_per_gpu")[0] == pytest.approx(4000.0)


@pytest.mark.slow
def test_the_add_points_script_writes_a_file_the_loader_reads(tmp_path, config_dir):
    import subprocess
    import sys

    config = tmp_path / "config.json"
    config.write_text(json.dumps(DENSE))
    proc = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "scripts" / "add_measured_points.py"),
         "--csv", str(sweep_csv(tmp_path)), "--model", "m-twin", "--config-json", str(config),
         "--config-key", "m", "--precision", "fp8", "--tp", "1", "--gpus", "1",
         "--engine", "vllm 0.22.0", "--source", "test", "--config-dir", str(config_dir)],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "2 of 3 sweep rows added" in proc.stdout
    points = load_points(config_dir / "predict" / "h200_points.json")
    assert [p.model for p in points.points][-2:] == ["m-twin", "m-twin"]
    assert load_points(CONFIGS / "predict" / "h200_points.json").points[-1].model != "m-twin"


ENGINE_CHOICE_TWINS = folder("engine_choice") / "vllm-twins.json"


def add_points_script(tmp_path: Path, config_dir: Path, *source: str, precision="fp8",
                      extra=()):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "scripts" / "add_measured_points.py"), *source,
         "--model", "llama-3-1-8b-instruct-twin", "--config-json",
         str(PROJECT_ROOT / "twins" / "llama-3-1-8b-instruct-twin" / "config.json"),
         "--config-key", "llama-3.1-8b", "--precision", precision, "--tp", "1", "--gpus", "1",
         "--engine", "vllm 0.22.0", "--source", "test", "--measured-on", "2026-12-02",
         "--config-dir", str(config_dir), *extra],
        capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_a_twins_recording_becomes_the_points_of_its_rows_at_one_precision(tmp_path, config_dir):
    """`--twins-json`: the rows of a `bench/gpu_serving.py twins` step at --precision go
    through points_from_sweep_rows as a CSV's do (the same points, number for number); the c64
    row is above the engine's --max-num-seqs 32 and left out; the same configuration from the
    same engine replaces the earlier point."""
    step = json.loads(ENGINE_CHOICE_TWINS.read_text())["steps"]["llama-3-1-8b-instruct-twin:fp8"]
    before = load_points(config_dir / "predict" / "h200_points.json")
    proc = add_points_script(tmp_path, config_dir, "--twins-json", str(ENGINE_CHOICE_TWINS),
                             extra=["--max-num-seqs", "32"])
    assert proc.returncode == 0, proc.stderr
    assert "3 of 4 sweep rows added" in proc.stdout
    after = load_points(config_dir / "predict" / "h200_points.json")
    added = [p for p in after.points if p.source == "test"]
    rows = {r["load"]: r for r in step["rows"]}
    assert [p.concurrency for p in added] == [1, 8, 32]
    for p in added:
        r = rows[p.concurrency]
        assert (p.precision, p.tensor_parallel, p.scenario, p.input_tokens, p.output_tokens) == \
            ("fp8", 1, "chat", 512, 256)
        assert p.ttft_p50_ms == pytest.approx(r["ttft_p50_s"] * 1e3)
        assert p.ttft_p95_ms == pytest.approx(r["ttft_p95_s"] * 1e3)
        assert p.tpot_mean_ms == pytest.approx(r["tpot_mean_ms"])
        assert p.itl_mean_ms == pytest.approx(r["itl_mean_ms"])
        assert p.output_tokens_per_s == pytest.approx(r["output_tokens_per_s"])
    replaced = {p.key for p in added} & {p.key for p in before.points
                                          if p.engine == "vllm 0.22.0"}
    assert replaced and len(after.points) == len(before.points) + 3 - len(replaced)

    # the same rows as a serving_benchmark.csv give the same points
    from onboarding.common.tables import write_csv

    csv_dir = tmp_path / "csv-configs"
    shutil.copytree(config_dir, csv_dir)
    table = write_csv(tmp_path / "serving_benchmark.csv", step["rows"])
    proc = add_points_script(tmp_path, csv_dir, "--csv", str(table),
                             extra=["--max-num-seqs", "32"])
    assert proc.returncode == 0, proc.stderr
    via_csv = [p for p in load_points(csv_dir / "predict" / "h200_points.json").points
               if p.source == "test"]
    assert [p.key for p in via_csv] == [p.key for p in added]
    for a, b in zip(via_csv, added, strict=True):
        nums = {k for k, v in b.model_dump().items() if isinstance(v, float)}
        assert a.model_dump(exclude=nums) == b.model_dump(exclude=nums)
        assert a.model_dump(include=nums) == pytest.approx(b.model_dump(include=nums))


@pytest.mark.slow
def test_a_twins_recording_without_that_precision_or_malformed_is_refused(tmp_path, config_dir):
    shipped = (config_dir / "predict" / "h200_points.json").read_text()
    proc = add_points_script(tmp_path, config_dir, "--twins-json", str(ENGINE_CHOICE_TWINS),
                             precision="bf16")
    assert proc.returncode == 2
    assert "has no sweep rows at precision bf16" in proc.stderr
    assert "llama-3-1-8b-instruct-twin:fp8: 4 rows" in proc.stderr  # what it does hold
    proc = add_points_script(tmp_path, config_dir, "--twins-json", str(ENGINE_CHOICE_TWINS),
                             extra=["--max-num-seqs", "64"])
    assert proc.returncode == 2 and "--max-num-seqs 64 but it ran 32" in proc.stderr
    broken = tmp_path / "broken.json"
    for text, needle in [("{", "is not JSON"), ('{"phase": "twins"}', "no `steps` object"),
                         ('{"steps": {"t:fp8": {"precision": "fp8", "rows": [{"load": 1}]}}}',
                          "steps.t:fp8.rows.0: lacks scenario, completed")]:
        broken.write_text(text)
        proc = add_points_script(tmp_path, config_dir, "--twins-json", str(broken))
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    proc = add_points_script(tmp_path, config_dir, "--twins-json", str(ENGINE_CHOICE_TWINS),
                             "--csv", str(broken))
    assert proc.returncode == 2 and "not allowed with" in proc.stderr
    assert (config_dir / "predict" / "h200_points.json").read_text() == shipped


def test_a_pooling_model_is_not_covered_and_never_asked_and_its_sla_choice_is_memory():
    """AIConfigurator models generation (prefill + decode); an embedding model has no decode.
    Before, bge-m3's hint (no hf_architecture) failed the predictions asset and
    bench/predictions.py with a ConfigError; now its rows say why there is no prediction."""
    from onboarding.common.config import load_yaml
    from onboarding.fetch.catalog import parse_spec
    from onboarding.predictions.predict import model_config_for

    path = CONFIGS / "models" / "bge-m3.yaml"
    spec = parse_spec(load_yaml(path), str(path))
    model_config, origin = model_config_for(spec, None)
    assert model_config == {} and "pooling" in origin, origin

    def predict(req):
        raise AssertionError(f"asked AIConfigurator about a pooling model: {req}")

    cfg = CFG.model_copy(update={"node_types": ["b300"]})
    table = predict_model(cfg, spec, model_config, inputs_for(spec), NODES, lambda nt: SLO,
                          predict, None)
    assert table.rows and {r.prediction.prediction.status for r in table.rows} <= {
        "not_covered", "not_applicable"}
    assert any("pooling" in " ".join(r.prediction.prediction.notes) for r in table.rows)
    (choice,) = table.choices
    assert choice.basis == "memory" and choice.tensor_parallel == 1


def test_docs_predictions_b300_table_quotes_the_current_calibration():
    """The page said the B300 table was not regenerated with the calibration; its
    Basis lines quote the current TTFT p95 factor, which this holds."""
    import re

    text = (PROJECT_ROOT / "docs" / "predictions.md").read_text()
    calib = text[text.index("<!-- generated: calibration -->"):]
    k = float(re.search(r"\| ttft_p95_ms \| \d+ \| ([0-9.]+) \|", calib).group(1))
    table = text[text.index("<!-- generated: b300 table -->"):
                 text.index("<!-- end generated: b300 table -->")]
    quoted = set(re.findall(r"TTFT from p95 measured/predicted ×([0-9.]+)", table))
    # the Basis lines quote two decimals (×2.70), the table three significant digits (2.7)
    assert {float(q) for q in quoted} == {round(k, 2)} and len(quoted) == 1
    assert "not yet regenerated" not in text
