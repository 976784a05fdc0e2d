"""The recordings from two H200s of one host, re-judged on the CPU with the project's own rules
(bench/gpu_recordings_x2.py): the SLO verdict of each twin's sweep by `serving_stats.headline`,
TP 1 against TP 2, the noisy-neighbour rule, the interconnect at configs/acceptance.yaml's
thresholds, and the plan the run was expected to start (tests/data/gpu/h200x2/expected/).

A recording not yet made skips, naming the device step that makes it. Each re-judging function
is also run here on CRAFTED input (labelled so below): recorded one-GPU rows with one number
changed, and the crafted two-GPU acceptance sets of tests/data/acceptance/, so a rule that
stopped judging would fail here before any two-GPU data exists.
"""

from __future__ import annotations

import copy
import json

import pytest

from bench.gpu_recordings import folder
from bench.gpu_recordings_x2 import (
    DEVICE_STEPS,
    expected,
    judge_interconnect,
    judge_neighbour,
    judge_twin,
    recorded_interconnect_checks,
    recording,
    tp_gain,
    twin_steps,
)
from onboarding.common.paths import PROJECT_ROOT
from onboarding.predictions.predict import points_from_sweep_rows
from resources.config_files import ConfigFiles

ACCEPTANCE = PROJECT_ROOT / "tests" / "data" / "acceptance"
GREEDY_TWINS = folder("client_accounting") / "twins.json"


def recorded_or_skip(phase: str) -> dict:
    rec = recording(phase)
    if rec is None:
        pytest.skip(f"tests/data/gpu/h200x2/{phase}.json not recorded yet: it comes from "
                    f"`{DEVICE_STEPS[phase]}` on nvidia-h200-x2 (docs/gpu.md)")
    return rec


def one_gpu_bf16_step() -> dict:
    """The 8B bf16 twin's real one-GPU sweep (tests/data/gpu/h200-client-accounting): met at its target
    32 there."""
    return json.loads(GREEDY_TWINS.read_text())["steps"]["llama-3-1-8b-instruct-twin:bf16"]


# ---- the recordings, when present ----

@pytest.mark.parametrize("phase", ["x2-twins", "x2-tp"])
def test_twin_sweeps_rejudged_agree_with_the_rows_the_device_judged(phase):
    rec = recorded_or_skip(phase)
    steps = twin_steps(rec)
    assert steps, (f"{phase}.json holds no swept twin (dry run, skipped or failed: "
                   f"{ {k: v.get('error') or v.get('skipped') or 'dry run' for k, v in rec['steps'].items()} })")
    plan = expected()["configurations"]
    for item, step in steps.items():
        j = judge_twin(step)
        # the device judged the target's row with the same SLO; the headline must agree
        assert j["row_at_target_meets_slo"] == [j["slo_pass"]], (item, j["violations"])
        want = plan[item if item in plan else item.split("@")[0]]
        assert step["tensor_parallel"] == want["tensor_parallel"], item
        assert step["gpus"] == list(range(step["tensor_parallel"])), item
        assert step["config_hash"] == want["config_hash"], (
            f"{item}: ran {step['config_hash']}, the plan expected {want['config_hash']}")


def test_tp2_rows_become_calibration_points_and_tp_gain_is_computed():
    rec = recorded_or_skip("x2-tp")
    steps = sorted(twin_steps(rec).values(), key=lambda s: s["tensor_parallel"])
    assert [s["tensor_parallel"] for s in steps] == [1, 2]
    gain = tp_gain(steps[0], steps[1], 32)
    assert all(v > 0 for v in gain.values())
    scenarios = {"chat": ConfigFiles().profile("gpu", "sm90")[1].scenarios["chat"]}
    pts = points_from_sweep_rows(steps[1]["rows"], scenarios, model=steps[1]["model"],
                                 config="llama-3.1-8b", precision="fp8", node_type="h200",
                                 tensor_parallel=2, gpus=2, engine="vllm 0.22.0",
                                 source="x2-tp", max_num_seqs=32)
    assert pts and all(p.tensor_parallel == 2 and p.gpus == 2 for p in pts)


def test_neighbour_verdict_rejudged_is_the_scripts():
    rec = recorded_or_skip("x2-neighbour")
    res = rec.get("result") or {}
    assert "alone" in res, f"no measurement came back (rc {rec['rc']}): {rec['tail'][-800:]}"
    again = judge_neighbour(res, rec["bound"])
    assert again == res["verdict"]
    assert rec["bound"] == expected()["neighbour"]["bound"]
    assert (rec["rc"] == 0) == all(v["within"] for v in again.values())


def test_interconnect_rejudged_at_the_shipped_thresholds_is_what_the_device_said():
    rec = recorded_or_skip("x2-interconnect")
    assert rec["preflight"]["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert rec["interconnect"] is not None, f"no interconnect.json: {rec['probe']['tail'][-800:]}"
    again = judge_interconnect(rec["interconnect"])
    device = recorded_interconnect_checks(rec)
    assert device and {k: again[k] for k in device} == device


# ---- the re-judging functions on crafted input ----

def test_judge_twin_flips_when_crafted_ttft_p95_at_the_target_exceeds_the_slo():
    real = one_gpu_bf16_step()
    assert judge_twin(real)["slo_pass"] is True  # as recorded on the H200
    crafted = copy.deepcopy(real)  # CRAFTED: the real sweep, c=32's TTFT p95 set to 2.0 s
    for r in crafted["rows"]:
        if int(r["load"]) == 32:
            r["ttft_p95_s"] = 2.0
    j = judge_twin(crafted)
    assert j["slo_pass"] is False and any("32" in v and "TTFT" in v for v in j["violations"])


def test_judge_twin_counts_tokens_per_gpu_by_the_steps_tp():
    real = one_gpu_bf16_step()
    crafted = {**copy.deepcopy(real), "tensor_parallel": 2}  # CRAFTED: the same rows as TP 2
    assert judge_twin(crafted)["tokens_per_s_per_gpu"] == pytest.approx(
        judge_twin(real)["tokens_per_s_per_gpu"] / 2)


def test_tp_gain_on_crafted_steps():
    tp1 = one_gpu_bf16_step()
    tp2 = copy.deepcopy(tp1)  # CRAFTED: TP 2 with 1.5x the output and 0.8x the ITL at c=32
    tp2["tensor_parallel"] = 2
    for r in tp2["rows"]:
        if int(r["load"]) == 32:
            r["output_tokens_per_s"] = 1.5 * float(r["output_tokens_per_s"])
            r["itl_mean_ms"] = 0.8 * float(r["itl_mean_ms"])
    g = tp_gain(tp1, tp2, 32)
    assert g["tokens_per_s_per_gpu"] == pytest.approx(0.75)
    assert g["itl_mean"] == pytest.approx(0.8) and g["ttft_p95"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="smaller TP"):
        tp_gain(tp2, tp1, 32)
    with pytest.raises(KeyError, match="no point at concurrency 48"):
        tp_gain(tp1, tp2, 48)


def test_judge_neighbour_on_crafted_numbers():
    # CRAFTED: twin-b's TTFT p95 rises 15 % with its neighbour loaded, twin-a's ITL 5 %
    alone = {"p95_ttft_ms": 200.0, "mean_itl_ms": 5.0}
    result = {"alone": {"twin-a": alone, "twin-b": alone},
              "together": {"twin-a": {"p95_ttft_ms": 200.0, "mean_itl_ms": 5.25},
                           "twin-b": {"p95_ttft_ms": 230.0, "mean_itl_ms": 5.0}}}
    v = judge_neighbour(result, 0.10)
    assert v["twin-a"]["within"] and not v["twin-b"]["within"]
    assert v["twin-b"]["ratios"]["p95_ttft_ms"] == pytest.approx(1.15)
    assert judge_neighbour(result, 0.20)["twin-b"]["within"]


def test_judge_interconnect_on_the_crafted_two_gpu_sets():
    healthy = json.loads((ACCEPTANCE / "crafted-h200x2-healthy" / "interconnect.json")
                         .read_text())
    faulty = json.loads((ACCEPTANCE / "crafted-h200x2-faulty" / "interconnect.json")
                        .read_text())
    assert judge_interconnect(healthy) == {"allreduce_tp2": "pass", "p2p": "pass"}
    assert judge_interconnect(faulty) == {"allreduce_tp2": "fail", "p2p": "fail"}
    assert judge_interconnect(None)["interconnect"] == "not checked"
    assert judge_interconnect({"error": "NCCL error: unhandled system error"}) == {
        "interconnect": "fail"}
    rec = {"checks": [{"check": "allreduce_tp2", "result": "pass"},  # CRAFTED probe rows
                      {"check": "burn_tflops", "result": "pass"}]}
    assert recorded_interconnect_checks(rec) == {"allreduce_tp2": "pass"}


def test_a_crafted_tp2_row_becomes_a_calibration_point_per_gpu():
    real = one_gpu_bf16_step()["rows"]
    rows = [r for r in copy.deepcopy(real) if int(r["load"]) == 32]  # CRAFTED: labelled TP 2
    scenarios = {"chat": ConfigFiles().profile("gpu", "sm90")[1].scenarios["chat"]}
    [p] = points_from_sweep_rows(rows, scenarios, model="llama-3-1-8b-instruct-twin",
                                 config="llama-3.1-8b", precision="bf16", node_type="h200",
                                 tensor_parallel=2, gpus=2, engine="vllm 0.22.0",
                                 source="crafted", max_num_seqs=32)
    assert (p.tensor_parallel, p.gpus, p.concurrency) == (2, 2, 32)
    assert p.output_tokens_per_s == pytest.approx(float(rows[0]["output_tokens_per_s"]))


# ---- the expectations written before the run ----

def test_expected_plan_is_labelled_and_within_the_budget():
    e = expected()
    assert "nothing here measured" in e["written_by"]
    assert all(v.get("source") for v in e["plan"].values())
    assert all(v["planned_hash_matches_the_h200"] for v in e["configurations"].values())
    assert e["plan"]["llama-3-1-70b-instruct-twin"]["tensor_parallel"] == 2
    assert e["device_minutes_total"] == pytest.approx(
        sum(m["minutes"] for m in e["device_minutes"]))
    assert e["device_minutes_total"] <= 30 and all(m["basis"] for m in e["device_minutes"])
    for r in e["predictions"].get("rows", []):
        assert r["basis"].startswith("predicted by AIConfigurator")
