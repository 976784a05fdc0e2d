"""Gate arithmetic: the three-way verdict, tolerance forms, paired stderr, re-evaluation on more
items and the inconclusive policy, config validation."""

import math
from statistics import NormalDist

import pytest

from onboarding.common.errors import ConfigError
from onboarding.quantize.accuracy_gate import (
    AccuracyGates,
    ScoreBook,
    TaskScore,
    apply_policy,
    decide,
    item_cap,
    judge_task,
    judge_variant,
    load_accuracy_gates,
    next_items,
    paired_difference,
    scores_from_lm_eval,
)
from onboarding.quantize.sequential import boundaries

BASE_CFG = {
    "tolerance": {"max_abs_drop": 0.03, "max_rel_drop": 0.05}, "z": 1.645, "min_items": 10,
    "metric_preference": ["acc", "exact_match"],
    "tasks": {"loose": {"max_abs_drop": 0.5, "max_rel_drop": 1.0},
              "mlperf": {"min_ratio": 0.99}}}
GATES = AccuracyGates.model_validate(BASE_CFG)


def gates_with(**changes) -> AccuracyGates:
    return AccuracyGates.model_validate({**BASE_CFG, **changes})


def score(values: list[float], task="t", stderr=None, size=0) -> TaskScore:
    mean = sum(values) / len(values)
    return TaskScore(task=task, metric="acc", value=mean, stderr=stderr, n=len(values),
                     per_item=dict(enumerate(values)), size=size)


def fp8_smollm2_arithmetic() -> tuple[list[float], list[float]]:
    """Per-item results shaped as SmolLM2's FP8 run on the H200 (docs/gpu.md): 280 arithmetic
    items, bf16 right on 122 (0.436), FP8 on 109 (0.389): 24 items flipped right -> wrong and 11
    wrong -> right, so the paired se of the drop is 0.021. The four kinds of item are spread
    evenly, so every prefix (lm-eval's `limit`) looks like the whole."""
    kinds = {"both": 98, "lost": 24, "gained": 11, "neither": 147}
    order = sorted((((k + 0.5) / count), kind) for kind, count in kinds.items()
                   for k in range(count))
    base = [1.0 if kind in ("both", "lost") else 0.0 for _, kind in order]
    var = [1.0 if kind in ("both", "gained") else 0.0 for _, kind in order]
    return base, var


def test_identical_answers_pass_on_enough_items_and_their_interval_is_not_zero_wide():
    """No item differs, yet 100 items cannot show a drop below ~1 %: the adjusted interval
    (one added to each discordant count) says so where the plain one was zero-wide."""
    base = score([1, 0] * 50)
    v = judge_task(base, score([1, 0] * 50), GATES)
    assert v.verdict == "pass" and v.passed and v.paired
    assert v.delta == 0 and v.se_delta == pytest.approx(math.sqrt(2) / 102)
    assert v.drop_high == pytest.approx(-v.drop_low) == pytest.approx(1.645 * v.se_delta)
    few = judge_task(score([1, 0] * 10), score([1, 0] * 10), GATES)
    assert few.verdict == "inconclusive" and few.drop_high > few.allowed_drop  # 20 items


def test_the_adjusted_interval_is_bonett_prices_on_0_1_items_and_plain_on_fractions():
    base, var = [1.0] * 60 + [0.0] * 40, [0.0] * 5 + [1.0] * 55 + [1.0] * 2 + [0.0] * 38
    d = paired_difference(score(base), score(var))  # 5 lost, 2 gained of 100
    assert d.diff == pytest.approx(-0.03) and d.center == pytest.approx((3 - 6) / 102)
    assert d.se == pytest.approx(math.sqrt((6 / 102 + 3 / 102 - (3 / 102) ** 2) / 102))
    plain = paired_difference(score(base), score(var), adjusted=False)  # the gate before
    assert plain.center is None and plain.diff == d.diff
    assert plain.se == pytest.approx(math.sqrt((7 / 100 - 0.03 ** 2) * 100 / 99 / 100))
    partial = paired_difference(score([0.5, 1.0, 0.0, 1.0]), score([0.25, 1.0, 0.0, 0.5]))
    assert partial.center is None
    assert partial.interval(1.0) == pytest.approx((partial.diff - partial.se,
                                                   partial.diff + partial.se))


def test_a_drop_whose_whole_interval_is_beyond_tolerance_fails_with_numbers():
    base = score([1] * 80 + [0] * 20)
    var = score([1] * 50 + [0] * 50)
    v = judge_task(base, var, GATES)
    assert v.verdict == "fail"
    assert v.delta == pytest.approx(-0.3)
    assert v.drop_low == pytest.approx(30 / 102 - 1.645 * v.se_delta)  # adjusted center
    assert v.drop_low > v.allowed_drop
    assert "entirely beyond allowed 0.0300" in v.reason and "[0.2" in v.reason


def test_a_small_excess_within_noise_is_inconclusive_not_a_pass():
    base = score([1] * 50 + [0] * 50)
    # 4 items flip right->wrong, 1 wrong->right: drop 0.03 against an allowed 0.025
    var_vals = [0] * 4 + [1] * 46 + [1] + [0] * 49
    v = judge_task(base, score(var_vals), GATES)
    assert v.verdict == "inconclusive" and not v.passed
    assert v.drop_low < v.allowed_drop < v.drop_high
    assert "straddles" in v.reason


def test_a_small_drop_passes_only_when_its_worst_plausible_value_is_within_tolerance():
    base = score([1] * 50 + [0] * 150)
    var = score([0] + [1] * 49 + [0] * 150)  # one item lost in 200: drop 0.005, se 0.005
    v = judge_task(base, var, gates_with(tolerance={"max_abs_drop": 0.03}))
    assert v.verdict == "pass" and v.drop_high <= v.allowed_drop


def test_fp8_smollm2_case_does_not_pass_on_noise():
    """The issue's case: FP8 lost 4.6 points of 43.6 on arithmetic and passed 'within noise'."""
    base, var = fp8_smollm2_arithmetic()
    b, v = score(base, "onb_arith_gen", size=280), score(var, "onb_arith_gen", size=280)
    assert (b.value, v.value) == (pytest.approx(0.4357, abs=1e-4), pytest.approx(0.3893, abs=1e-4))
    verdict = judge_task(b, v, GATES)
    assert verdict.drop == pytest.approx(0.0464, abs=1e-4)
    assert verdict.se_delta == pytest.approx(0.021, abs=5e-4)
    assert verdict.allowed_drop == pytest.approx(0.0218, abs=1e-4)
    # the older rule let it through: the drop is within allowed + z * se
    assert verdict.drop <= verdict.allowed_drop + GATES.z * verdict.se_delta
    assert verdict.verdict == "inconclusive"
    gate = apply_policy(judge_variant("fp8", {"onb_arith_gen": b}, {"onb_arith_gen": v},
                                      GATES), GATES)
    assert gate.verdict == "inconclusive" and not gate.passed
    assert gate.reason.startswith("inconclusive after 280 items (fails closed")
    assert "onb_arith_gen: drop 0.0464 [0.0109, 0.0813] straddles allowed 0.0218" in gate.reason


class FakeEvaluator:
    """Crafted per-item results served by `limit` (lm-eval takes a task's first items)."""

    def __init__(self, per_task: dict[str, list[float]], default_limit: int):
        self.per_task, self.default_limit, self.calls = per_task, default_limit, []

    def __call__(self, tasks: list[str], limit: int | None,
                 items: dict[str, list[int]] | None = None) -> dict[str, TaskScore]:
        tasks = tasks or sorted(self.per_task)
        n = limit or self.default_limit
        if items is None:
            self.calls.append((tuple(tasks), limit))
            return {t: score(self.per_task[t][:n], t, size=len(self.per_task[t])) for t in tasks}
        self.calls.append((tuple(tasks), {t: (min(i), max(i) + 1) for t, i in items.items()}))
        out = {}
        for t in tasks:
            got = {i: self.per_task[t][i] for i in items[t]}
            out[t] = TaskScore(task=t, metric="acc", value=sum(got.values()) / len(got),
                               stderr=None, n=len(got), per_item=got, size=len(self.per_task[t]))
        return out


def test_inconclusive_re_evaluates_only_that_task_up_to_its_size_then_fails_closed():
    base, var = fp8_smollm2_arithmetic()
    mc = [1.0, 0.0, 1.0] * 90
    base_eval = FakeEvaluator({"onb_arith_gen": base, "onb_facts_mc": mc}, 100)
    var_eval = FakeEvaluator({"onb_arith_gen": var, "onb_facts_mc": mc}, 100)
    baseline = ScoreBook.first(base_eval, [])
    logs: list[str] = []
    gate = decide("fp8", baseline, ScoreBook.first(var_eval, []), GATES, log=logs.append)
    assert not gate.passed and gate.verdict == "inconclusive"
    assert gate.reason.startswith("inconclusive after 280 items")
    by_task = {v.task: v for v in gate.verdicts}
    assert by_task["onb_facts_mc"].verdict == "pass" and by_task["onb_facts_mc"].n == 100
    assert by_task["onb_arith_gen"].n == 280
    # one jump: the interval at 100 items needed more than the task has, so straight to 280
    # (only the 180 items the first look did not score)
    assert base_eval.calls == var_eval.calls == [((("onb_arith_gen", "onb_facts_mc")), None),
                                                 (("onb_arith_gen",), {"onb_arith_gen": (100, 280)})]
    assert logs == ["fp8: inconclusive on onb_arith_gen; re-evaluating on 280 items"]
    # a second variant pairs with the grown baseline without evaluating it again
    decide("nvfp4", baseline, ScoreBook.first(
        FakeEvaluator({"onb_arith_gen": [0.0] * 280, "onb_facts_mc": mc}, 100), []), GATES)
    assert len(base_eval.calls) == 2


def test_an_early_look_is_judged_on_the_group_sequential_interval_not_the_single_look_one():
    """100 of 400 items, one lost and one gained: drop 0 ± 1.645 × 0.0196 would pass a 0.035
    allowance at the first look, but a first look that may be followed by more spends only part
    of α (z 2.10 here), so it is inconclusive and looked at again, where the second look's
    interval is the group-sequential one for looks at 25 % and 50 % of the task."""
    base = [1.0] * 60 + [0.0] * 40
    var = [0.0] + [1.0] * 59 + [1.0] + [0.0] * 39  # one lost, one gained in the first 100
    gates = gates_with(tolerance={"max_abs_drop": 0.035})
    single = judge_task(score(base), score(var), gates)  # the whole task: one look
    assert single.verdict == "pass" and single.z == gates.z
    first = judge_task(score(base, size=400), score(var, size=400), gates)
    assert first.fraction == 0.25 and first.z == pytest.approx(2.10, abs=0.01)
    assert first.verdict == "inconclusive" and "(look 1, 25% of the items, z 2.10)" in first.reason
    evals = (FakeEvaluator({"t": base * 4}, 100), FakeEvaluator({"t": var + base * 3}, 100))
    logs: list[str] = []
    gate = decide("fp8", ScoreBook.first(evals[0], []), ScoreBook.first(evals[1], []), gates,
                  log=logs.append)
    assert logs == ["fp8: inconclusive on t; re-evaluating on 200 items"]
    [v] = gate.verdicts
    alpha = 1 - NormalDist().cdf(gates.z)
    assert (v.n, v.fraction) == (200, 0.5) and v.z == pytest.approx(
        boundaries(alpha, [0.25, 0.5])[-1], abs=1e-9)
    assert gate.verdict == "pass" and "(look 2, 50% of the items" in v.reason


def test_the_cap_and_the_open_policy():
    base, var = fp8_smollm2_arithmetic()
    capped = gates_with(inconclusive={"max_items": 150, "policy": "pass"})
    evals = FakeEvaluator({"a": base}, 100), FakeEvaluator({"a": var}, 100)
    gate = decide("fp8", ScoreBook.first(evals[0], []), ScoreBook.first(evals[1], []), capped)
    assert gate.verdict == "inconclusive" and gate.passed  # open policy: passes, still flagged
    assert gate.items == 150 and "inconclusive after 150 items (passes open" in gate.reason
    assert evals[0].calls[-1] == (("a",), {"a": (100, 150)})


class RescoringEvaluator(FakeEvaluator):
    """Scores an item differently each time it is asked for it (as a batch of another shape
    can): what a look kept shows whether the earlier items were scored again."""

    def __call__(self, tasks, limit, items=None):
        got = super().__call__(tasks, limit, items)
        k = len(self.calls)
        return {t: TaskScore(task=t, metric=s.metric, value=s.value + k, stderr=s.stderr, n=s.n,
                             per_item={i: v + k for i, v in s.per_item.items()}, size=s.size)
                for t, s in got.items()}


def test_a_second_look_scores_only_the_new_items_and_keeps_the_first_looks():
    """The second look adds items 100-279 to the first look's 0-99 as they were scored then
    (a group-sequential look adds observations), and the score is their mean with lm-eval's
    mean stderr (sample stddev / sqrt n)."""
    base = [1.0, 0.0] * 140
    book = ScoreBook.first(RescoringEvaluator({"a": base}, 100), ["a"])
    book.ensure(["a"], 280)
    s = book.scores["a"]
    assert s.n == 280 and sorted(s.per_item) == list(range(280))
    assert {s.per_item[i] - base[i] for i in range(100)} == {1.0}  # the first call's, kept
    assert {s.per_item[i] - base[i] for i in range(100, 280)} == {2.0}
    values = list(s.per_item.values())
    mean = sum(values) / 280
    assert s.value == pytest.approx(mean)
    assert s.stderr == pytest.approx(
        math.sqrt(sum((x - mean) ** 2 for x in values) / 279) / math.sqrt(280))
    book.ensure(["a"], 280)  # nothing short: nothing asked
    assert len(book._evaluate.calls) == 2


def test_a_score_that_is_not_the_mean_of_its_items_is_scored_again_on_the_larger_prefix():
    """Growing by the new items alone is sound only for a mean over items; a task whose value
    is not that mean (another aggregation), or whose size is unknown, is asked again whole."""
    ev = FakeEvaluator({"a": [1.0, 0.0] * 100}, 100)
    book = ScoreBook.first(ev, ["a"])
    s = book.scores["a"]
    book.scores["a"] = TaskScore(task="a", metric=s.metric, value=0.7, stderr=s.stderr, n=s.n,
                                 per_item=s.per_item, size=s.size)
    book.ensure(["a"], 150)
    assert ev.calls[-1] == (("a",), 150) and book.scores["a"].n == 150
    unsized = ScoreBook(ev, {"a": TaskScore(task="a", metric="acc", value=0.5, stderr=None, n=2,
                                            per_item={0: 1.0, 1: 0.0}, size=0)})
    unsized.ensure(["a"], 20)
    assert ev.calls[-1] == (("a",), 20)


def test_a_variant_that_becomes_decisive_with_more_items_stops_there():
    base = [1.0, 0.0] * 200
    var = list(base)
    for i in range(0, 400, 10):  # a real 10-point loss on 20 % of the items
        var[i] = 0.0
    gate = decide("nvfp4", ScoreBook.first(FakeEvaluator({"a": base}, 12), []),
                  ScoreBook.first(FakeEvaluator({"a": var}, 12), []), GATES)
    assert gate.verdict == "fail" and 12 < gate.items < 400


def test_next_items_projects_from_the_spread_and_at_least_doubles():
    base, var = fp8_smollm2_arithmetic()
    v = judge_task(score(base[:100]), score(var[:100]), GATES)
    margin = abs(v.drop - v.allowed_drop)
    projected = math.ceil(100 * (GATES.z * v.se_delta / margin) ** 2)
    assert next_items(v, GATES, 10_000) == max(projected, 200)
    assert next_items(v, GATES, 280) == 280
    few = judge_task(score([1, 0, 1]), score([1, 0, 1]), gates_with(min_items=50))
    assert few.verdict == "inconclusive" and next_items(few, gates_with(min_items=50), 280) == 50
    assert item_cap(280, GATES) == 280 and item_cap(0, GATES) == 0
    assert item_cap(280, gates_with(inconclusive={"max_items": 100})) == 100


def test_relative_tolerance_binds_on_low_baselines():
    base = score([1] * 20 + [0] * 180)  # 0.10: relative 5% allows 0.005
    var = score([0] * 10 + [1] * 10 + [0] * 180)  # drop 0.05
    v = judge_task(base, var, GATES)
    assert v.allowed_drop == pytest.approx(0.005)
    assert v.verdict == "fail"
    assert v.tolerance == "min(0.03 absolute, 5.0% of 0.1000)"


def test_mlperf_ratio_form_allows_one_percent_of_the_reference():
    base = score([1] * 500 + [0] * 500, task="mlperf")
    one_lost = score([0] + [1] * 499 + [0] * 500, task="mlperf")
    v = judge_task(base, one_lost, GATES)
    assert v.allowed_drop == pytest.approx(0.005) and v.tolerance.startswith(">= 99.0% of")
    assert v.verdict == "pass"  # drop 0.001, worst plausible 0.0026 < 0.005
    many_lost = score([0] * 40 + [1] * 460 + [0] * 500, task="mlperf")
    assert judge_task(base, many_lost, GATES).verdict == "fail"  # 0.04 vs 0.005
    everywhere = gates_with(tolerance={"min_ratio": 0.99})
    assert everywhere.tolerance_for("t").min_ratio == 0.99
    assert everywhere.tolerance_for("loose").max_abs_drop == 0.5


def test_too_few_items_are_inconclusive_rather_than_a_pass():
    v = judge_task(score([1, 0, 1]), score([1, 0, 1]), GATES)
    assert v.verdict == "inconclusive" and "only 3 items" in v.reason


def test_unpaired_fallback_uses_lm_eval_stderrs():
    base = TaskScore(task="t", metric="acc", value=0.60, stderr=0.02, n=200)
    var = TaskScore(task="t", metric="acc", value=0.50, stderr=0.02, n=200)
    v = judge_task(base, var, GATES)
    assert not v.paired
    assert v.se_delta == pytest.approx((0.02**2 * 2) ** 0.5)
    assert v.verdict == "fail"


def test_paired_means_are_over_the_items_both_answered():
    base = score([1.0] * 50 + [0.0] * 250)  # grown to 300 items for another variant
    var = score([1.0] * 49 + [0.0] * 51)  # scored on its first 100
    v = judge_task(base, var, GATES)
    assert v.n == 100 and v.baseline == 0.5 and v.variant == 0.49


def test_per_task_override_loosens_one_task():
    base = score([1] * 80 + [0] * 20, task="loose")
    var = score([1] * 50 + [0] * 50, task="loose")
    assert judge_task(base, var, GATES).passed


def test_variant_fails_when_a_task_is_missing_or_fails_and_fail_beats_inconclusive():
    base = {"a": score([1] * 200, "a"), "b": score([1] * 200, "b")}
    assert judge_variant("fp8", base, {"a": base["a"]}, GATES).verdict == "fail"
    bad = {"a": score([1] * 199 + [0], "a"), "b": score([0] * 200, "b")}
    r = judge_variant("nvfp4", base, bad, GATES)
    assert r.verdict == "fail" and r.reason.startswith("b:")
    assert judge_variant("fp8", base, dict(base), GATES).verdict == "pass"


def test_scores_from_lm_eval_picks_metric_pairs_samples_and_keeps_sizes():
    results = {"gen": {"exact_match,first-number": 0.5, "exact_match_stderr,first-number": 0.1,
                       "sample_len": 2},
               "mc": {"acc,none": 1.0, "acc_stderr,none": "N/A", "acc_norm,none": 0.0}}
    samples = {"gen": [{"doc_id": 0, "exact_match": 1.0}, {"doc_id": 1, "exact_match": 0.0}]}
    s = scores_from_lm_eval(results, samples, GATES, {"gen": 280})
    assert (s["gen"].metric, s["gen"].value, s["gen"].stderr, s["gen"].n) == (
        "exact_match", 0.5, 0.1, 2)
    assert s["gen"].per_item == {0: 1.0, 1: 0.0} and s["gen"].size == 280
    assert s["mc"].metric == "acc" and s["mc"].stderr is None and s["mc"].size == 0


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


def test_both_tolerance_forms_at_once_are_refused_naming_the_field(tmp_path):
    p = tmp_path / "gates.yaml"
    p.write_text("accuracy:\n  tolerance: {max_abs_drop: 0.03, min_ratio: 0.99}\n  z: 2\n"
                 "  min_items: 5\n  metric_preference: [acc]\n"
                 "  inconclusive: {policy: maybe}\n")
    with pytest.raises(ConfigError) as err:
        load_accuracy_gates(p)
    assert "'tolerance'" in str(err.value) and "not both" in str(err.value)
    assert "'inconclusive.policy'" in str(err.value)


def test_a_gates_file_without_an_inconclusive_section_loads_with_the_defaults(tmp_path):
    """A gates file that sets no `inconclusive` policy and no confidence keeps loading: it
    fails closed, no item cap, and z 1.645 reads as 90 % confidence."""
    p = tmp_path / "gates.yaml"
    p.write_text("accuracy:\n  tolerance: {max_abs_drop: 0.03, max_rel_drop: 0.05}\n"
                 "  z: 1.645\n  min_items: 100\n  metric_preference: [acc, exact_match]\n"
                 "  tasks: {onb_arith_gen: {metric: exact_match, max_abs_drop: 0.02}}\n")
    gates = load_accuracy_gates(p)
    assert gates.inconclusive.policy == "fail" and gates.inconclusive.max_items is None
    assert gates.tolerance_for("onb_arith_gen").max_abs_drop == 0.02
    assert gates.confidence == pytest.approx(0.90, abs=1e-3)


def test_shipped_gates_parse():
    from onboarding.common.paths import PROJECT_ROOT

    gates = load_accuracy_gates(PROJECT_ROOT / "configs" / "gates.yaml")
    assert gates.tolerance.max_abs_drop > 0 and gates.inconclusive.policy == "fail"
