"""Gate arithmetic: tolerances, paired stderr, too-few-items, config validation."""

import pytest

from onboarding.accuracy_gate import (
    AccuracyGates,
    TaskScore,
    judge_task,
    judge_variant,
    load_accuracy_gates,
    scores_from_lm_eval,
)
from onboarding.errors import ConfigError

GATES = AccuracyGates.model_validate({
    "tolerance": {"max_abs_drop": 0.03, "max_rel_drop": 0.05}, "z": 1.645, "min_items": 10,
    "metric_preference": ["acc", "exact_match"],
    "tasks": {"loose": {"max_abs_drop": 0.5, "max_rel_drop": 1.0}}})


def score(values: list[float], task="t", stderr=None) -> TaskScore:
    mean = sum(values) / len(values)
    return TaskScore(task, "acc", mean, stderr, len(values), dict(enumerate(values)))


def test_identical_answers_pass_with_zero_paired_stderr():
    base = score([1, 0] * 50)
    v = judge_task(base, score([1, 0] * 50), GATES)
    assert v.passed and v.paired and v.se_delta == 0 and v.delta == 0


def test_significant_drop_fails_with_numbers_in_the_reason():
    base = score([1] * 80 + [0] * 20)
    var = score([1] * 50 + [0] * 50)
    v = judge_task(base, var, GATES)
    assert not v.passed
    assert v.delta == pytest.approx(-0.3)
    assert "exceeds allowed" in v.reason


def test_small_excess_within_noise_passes_and_says_so():
    base = score([1] * 50 + [0] * 50)
    # 4 items flip right->wrong, 1 wrong->right: drop 0.03 vs allowed min(0.03, 0.025)
    var_vals = [0] * 4 + [1] * 46 + [1] + [0] * 49
    v = judge_task(base, score(var_vals), GATES)
    assert v.passed and "noise" in v.reason


def test_relative_tolerance_binds_on_low_baselines():
    base = score([1] * 20 + [0] * 180)  # 0.10: relative 5% allows 0.005
    var = score([0] * 10 + [1] * 10 + [0] * 180)  # drop 0.05: inside 0.03 + noise, not 0.005
    v = judge_task(base, var, GATES)
    assert v.allowed_drop == pytest.approx(0.005)
    assert not v.passed
    assert judge_task(score([1] * 100 + [0] * 100), score([0] * 10 + [1] * 90 + [0] * 100),
                      GATES).passed  # the same drop at a 0.5 baseline is within noise


def test_too_few_items_fail_rather_than_pass_on_noise():
    v = judge_task(score([1, 0, 1]), score([1, 0, 1]), GATES)
    assert not v.passed and "too few" in v.reason


def test_unpaired_fallback_uses_lm_eval_stderrs():
    base = TaskScore("t", "acc", 0.60, 0.02, 200)
    var = TaskScore("t", "acc", 0.50, 0.02, 200)
    v = judge_task(base, var, GATES)
    assert not v.paired
    assert v.se_delta == pytest.approx((0.02**2 * 2) ** 0.5)
    assert not v.passed


def test_per_task_override_loosens_one_task():
    base = score([1] * 80 + [0] * 20, task="loose")
    var = score([1] * 50 + [0] * 50, task="loose")
    assert judge_task(base, var, GATES).passed


def test_variant_fails_when_a_task_is_missing_or_one_task_fails():
    base = {"a": score([1] * 20, "a"), "b": score([1] * 20, "b")}
    assert not judge_variant("fp8", base, {"a": base["a"]}, GATES).passed
    bad = {"a": base["a"], "b": score([0] * 20, "b")}
    r = judge_variant("nvfp4", base, bad, GATES)
    assert not r.passed and r.reason.startswith("b:")
    assert judge_variant("fp8", base, dict(base), GATES).passed


def test_scores_from_lm_eval_picks_metric_and_pairs_samples():
    results = {"gen": {"exact_match,first-number": 0.5, "exact_match_stderr,first-number": 0.1,
                       "sample_len": 2},
               "mc": {"acc,none": 1.0, "acc_stderr,none": "N/A", "acc_norm,none": 0.0}}
    samples = {"gen": [{"doc_id": 0, "exact_match": 1.0}, {"doc_id": 1, "exact_match": 0.0}]}
    s = scores_from_lm_eval(results, samples, GATES)
    assert (s["gen"].metric, s["gen"].value, s["gen"].stderr, s["gen"].n) == (
        "exact_match", 0.5, 0.1, 2)
    assert s["gen"].per_item == {0: 1.0, 1: 0.0}
    assert s["mc"].metric == "acc" and s["mc"].stderr is None


def test_scores_from_lm_eval_names_a_task_without_a_usable_metric():
    with pytest.raises(ConfigError, match="bleu"):
        scores_from_lm_eval({"x": {"bleu,none": 3.0}}, None, GATES)


def test_gate_config_with_unknown_key_names_the_field(tmp_path):
    p = tmp_path / "gates.yaml"
    p.write_text("accuracy:\n  tolerance: {max_abs_drop: 0.03, max_rel_drop: 0.05}\n  z: 2\n"
                 "  min_items: 5\n  metric_preference: [acc]\n  max_drop: 0.1\n"
                 "slo: {anything: 1}\n")
    with pytest.raises(ConfigError) as err:
        load_accuracy_gates(p)
    assert "max_drop" in str(err.value) and "unknown key" in str(err.value)


def test_shipped_gates_parse():
    from onboarding.paths import PROJECT_ROOT

    gates = load_accuracy_gates(PROJECT_ROOT / "configs" / "gates.yaml")
    assert gates.tolerance.max_abs_drop > 0
