"""The accuracy gate: does a quantized variant keep each task's score within tolerance?

Three-way, so that nothing passes on noise. Baseline and variant answer the same items, so the
drop's standard error comes from the per-item differences (paired) when lm-eval's samples are
there, and from lm-eval's two stderrs otherwise. The drop is reported with the interval
`drop ± z·se`; a task **passes** when the interval's upper end (the worst plausible drop) is
within the allowed drop, **fails** when its lower end is beyond it, and is **inconclusive**
otherwise. An inconclusive variant is re-evaluated on more items (`decide`) up to the task's
size or the configured cap, then the configured policy applies (default: fail closed). Each
such look spends part of the gate's α (`onboarding.quantize.sequential`), so looking again cannot make a
variant at the limit pass more often than one look at the configured `z` would.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from onboarding.common.config import StrictConfig, load_yaml, validate_config
from onboarding.common.errors import ConfigError
from onboarding.quantize.sequential import look_z, looks_before

Verdict = Literal["pass", "fail", "inconclusive"]
MAX_ROUNDS = 8  # re-evaluation rounds per variant; each round at least doubles the items


class Tolerance(StrictConfig):
    """How much a task may lose: `min(max_abs_drop, max_rel_drop × baseline)` (either bound
    alone is fine), or MLPerf's form `min_ratio`: the variant keeps at least that fraction of
    the baseline's score (0.99: "≥ 99 % of the reference")."""

    max_abs_drop: float | None = Field(default=None, ge=0, description="allowed drop, absolute")
    max_rel_drop: float | None = Field(default=None, ge=0, le=1,
                                       description="allowed drop relative to the baseline")
    min_ratio: float | None = Field(default=None, gt=0, le=1,
                                    description="MLPerf form: variant >= min_ratio x baseline")

    @model_validator(mode="after")
    def _one_form(self) -> Tolerance:
        drops = self.max_abs_drop is not None or self.max_rel_drop is not None
        if self.min_ratio is not None and drops:
            raise ValueError("give either min_ratio (MLPerf form) or max_abs_drop/max_rel_drop, "
                             "not both")
        if self.min_ratio is None and not drops:
            raise ValueError("give max_abs_drop and/or max_rel_drop, or min_ratio")
        return self

    def allowed_drop(self, baseline: float) -> float:
        if self.min_ratio is not None:
            return (1.0 - self.min_ratio) * abs(baseline)
        bounds = [b for b in (self.max_abs_drop, None if self.max_rel_drop is None
                              else self.max_rel_drop * abs(baseline)) if b is not None]
        return min(bounds)

    def describe(self, baseline: float) -> str:
        """The rule in words, for reasons and check metadata."""
        if self.min_ratio is not None:
            return f">= {self.min_ratio:.1%} of the baseline {baseline:.4f}"
        parts = ([f"{self.max_abs_drop:g} absolute"] if self.max_abs_drop is not None else []) + \
            ([f"{self.max_rel_drop:.1%} of {baseline:.4f}"] if self.max_rel_drop is not None
             else [])
        return parts[0] if len(parts) == 1 else f"min({', '.join(parts)})"


class TaskGate(StrictConfig):
    """Per-task overrides: the metric, and a tolerance (either form)."""

    metric: str | None = None
    max_abs_drop: float | None = Field(default=None, ge=0)
    max_rel_drop: float | None = Field(default=None, ge=0, le=1)
    min_ratio: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _one_form(self) -> TaskGate:
        if self.min_ratio is not None and (self.max_abs_drop is not None
                                           or self.max_rel_drop is not None):
            raise ValueError("give either min_ratio or max_abs_drop/max_rel_drop, not both")
        return self


class Inconclusive(StrictConfig):
    """What an inconclusive verdict does: more items, then the policy."""

    max_items: int | None = Field(default=None, ge=1, description="re-evaluate up to this many "
                                  "items per task; null: up to the task's size")
    policy: Literal["fail", "pass"] = Field(default="fail", description="after the last items: "
                                            "fail (closed) or pass (open, still reported "
                                            "inconclusive)")


class ServedAgreement(StrictConfig):
    """How far the served score of a variant may sit from its in-process score."""

    max_abs_diff: float = Field(default=0.02, ge=0, description="the served − in-process "
                                "interval must reach inside ± this for the two to agree")


class AccuracyGates(StrictConfig):
    tolerance: Tolerance
    z: float = Field(gt=0, description="half-width of the drop's interval in standard errors")
    min_items: int = Field(ge=1, description="fewer scored items than this are inconclusive")
    metric_preference: list[str] = Field(min_length=1)
    tasks: dict[str, TaskGate] = Field(default_factory=dict)
    inconclusive: Inconclusive = Field(default_factory=Inconclusive)
    served_agreement: ServedAgreement = Field(default_factory=ServedAgreement)

    def tolerance_for(self, task: str) -> Tolerance:
        t = self.tasks.get(task)
        if t is None or (t.min_ratio is None and t.max_abs_drop is None
                         and t.max_rel_drop is None):
            return self.tolerance
        if t.min_ratio is not None:
            return Tolerance(min_ratio=t.min_ratio)
        if self.tolerance.min_ratio is not None:
            return Tolerance(max_abs_drop=t.max_abs_drop, max_rel_drop=t.max_rel_drop)
        return Tolerance(
            max_abs_drop=self.tolerance.max_abs_drop if t.max_abs_drop is None else t.max_abs_drop,
            max_rel_drop=self.tolerance.max_rel_drop if t.max_rel_drop is None else t.max_rel_drop,
        )

    @property
    def confidence(self) -> float:
        """Two-sided coverage of `drop ± z·se` (z 1.645: 0.90, so a pass is one-sided 95 %)."""
        return math.erf(self.z / math.sqrt(2))


def load_accuracy_gates(path: Path) -> AccuracyGates:
    """The `accuracy:` section of gates.yaml (other sections belong to other stages)."""
    data = load_yaml(path)
    section = data.get("accuracy") if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: accuracy", "missing or not a mapping",
                          "Add the `accuracy:` section (see the shipped configs/gates.yaml).")
    return validate_config(AccuracyGates, section, path, "accuracy",
                           "Fix the accuracy gate section.")


@dataclass(frozen=True, kw_only=True)
class TaskScore:
    """One task's score for one model, with lm-eval's stderr and the per-item values."""

    task: str
    metric: str
    value: float
    stderr: float | None
    n: int
    per_item: dict[int, float] = field(default_factory=dict, compare=False, repr=False)
    size: int = 0  # items the task has in all (lm-eval's n-samples original); 0: unknown


def scores_to_json(scores: dict[str, TaskScore]) -> dict[str, dict]:
    """Task scores as JSON with every per-item result (a recorded run; `scores_from_json`)."""
    return {t: {"metric": s.metric, "value": s.value, "stderr": s.stderr, "n": s.n,
                "size": s.size, "per_item": {str(k): v for k, v in sorted(s.per_item.items())}}
            for t, s in scores.items()}


def scores_from_json(data: dict[str, dict]) -> dict[str, TaskScore]:
    return {t: TaskScore(task=t, metric=s["metric"], value=s["value"], stderr=s["stderr"], n=s["n"],
                         per_item={int(k): float(v) for k, v in s["per_item"].items()},
                         size=s["size"])
            for t, s in data.items()}


def pick_metric(result: dict, preference: list[str], forced: str | None = None
                ) -> tuple[str, str] | None:
    """(metric, lm-eval result key such as 'exact_match,first-number') for one task's results."""
    keys = [k for k in result if "," in k and "_stderr," not in k]
    for metric in ([forced] if forced else preference):
        for k in keys:
            if k.split(",", 1)[0] == metric:
                return metric, k
    return None


def scores_from_lm_eval(results: dict, samples: dict | None, gates: AccuracyGates,
                        sizes: dict[str, int] | None = None) -> dict[str, TaskScore]:
    """lm-eval's `results` (and `samples` when logged) -> one TaskScore per task."""
    out = {}
    for task, result in results.items():
        forced = gates.tasks[task].metric if task in gates.tasks else None
        picked = pick_metric(result, gates.metric_preference, forced)
        if picked is None:
            raise ConfigError(
                f"gates.yaml accuracy: task {task!r}",
                f"none of the metrics {[forced] if forced else gates.metric_preference} is "
                f"reported (reported: {sorted(k for k in result if ',' in k)})",
                "Set accuracy.tasks.<task>.metric to one the task reports.")
        metric, key = picked
        stderr_key = key.replace(",", "_stderr,", 1)
        stderr = result.get(stderr_key)
        stderr = float(stderr) if isinstance(stderr, int | float) and math.isfinite(stderr) else None
        per_item = {int(s["doc_id"]): float(s[metric]) for s in (samples or {}).get(task, [])
                    if metric in s}
        n = len(per_item) or int(result.get("sample_len") or 0)
        out[task] = TaskScore(task=task, metric=metric, value=float(result[key]), stderr=stderr,
                              n=n, per_item=per_item, size=int((sizes or {}).get(task) or 0))
    return out


@dataclass(frozen=True, kw_only=True)
class PairedDifference:
    """b − a over the items both answered (paired), or from the two stderrs (unpaired).

    `diff` is the observed difference; the interval is `center ± z·se`, where for 0/1 items
    `center` and `se` are Bonett and Price's adjusted ones (one added to each discordant
    count): the plain normal interval on a handful of discordant items is too narrow on the
    side that passes a variant (measured: bench/gate_looks.py)."""

    mean_a: float
    mean_b: float
    diff: float
    se: float
    paired: bool
    n: int
    center: float | None = None  # the interval's center; None: `diff`

    def interval(self, z: float) -> tuple[float, float]:
        """The interval for b − a at half-width z."""
        c = self.diff if self.center is None else self.center
        return c - z * self.se, c + z * self.se


def paired_difference(a: TaskScore, b: TaskScore, adjusted: bool = True) -> PairedDifference:
    """Paired when both logged the same items: the means are over those items only, so a
    baseline scored on more items than the variant is compared on the variant's items.
    `adjusted=False` keeps the plain interval for 0/1 items too (the gate before Bonett–Price;
    bench/gate_looks.py measures both)."""
    common = sorted(set(a.per_item) & set(b.per_item))
    if len(common) >= 2:
        n = len(common)
        mean_a = sum(a.per_item[i] for i in common) / n
        mean_b = sum(b.per_item[i] for i in common) / n
        if adjusted and all(a.per_item[i] in (0, 1) and b.per_item[i] in (0, 1) for i in common):
            lost = sum(1 for i in common if a.per_item[i] > b.per_item[i])
            gained = sum(1 for i in common if a.per_item[i] < b.per_item[i])
            p_lost, p_gained = (lost + 1) / (n + 2), (gained + 1) / (n + 2)
            center = p_gained - p_lost
            se = math.sqrt((p_lost + p_gained - center ** 2) / (n + 2))
            return PairedDifference(mean_a=mean_a, mean_b=mean_b, diff=(gained - lost) / n, se=se,
                                    paired=True, n=n, center=center)
        diffs = [b.per_item[i] - a.per_item[i] for i in common]
        mean = sum(diffs) / n
        var_d = sum((d - mean) ** 2 for d in diffs) / (n - 1)
        return PairedDifference(mean_a=mean_a, mean_b=mean_b, diff=mean, se=math.sqrt(var_d / n),
                                paired=True, n=n)
    se = math.sqrt((a.stderr or 0.0) ** 2 + (b.stderr or 0.0) ** 2)
    return PairedDifference(mean_a=a.value, mean_b=b.value, diff=b.value - a.value, se=se,
                            paired=False, n=min(a.n, b.n))


@dataclass(frozen=True, kw_only=True)
class TaskVerdict:
    task: str
    metric: str
    baseline: float
    variant: float
    delta: float  # variant - baseline
    stderr_baseline: float | None
    stderr_variant: float | None
    se_delta: float
    paired: bool
    n: int
    allowed_drop: float
    verdict: Verdict
    reason: str
    drop_low: float = 0.0  # the drop's interval: drop ± z·se
    drop_high: float = 0.0
    tolerance: str = ""  # the rule in words
    size: int = 0  # the task's items in all (0: unknown)
    z: float = 0.0  # the interval's half-width at this look, in standard errors
    fraction: float = 1.0  # this look's items ÷ the most the task may be judged on

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def drop(self) -> float:
        return -self.delta


def look_fraction(n: int, size: int, gates: AccuracyGates) -> float:
    """How far into the task's items a look at `n` is: 1 where no later look can add items."""
    cap = item_cap(size, gates)
    return 1.0 if cap <= 0 or n >= cap else n / cap


def judge_task(base: TaskScore, var: TaskScore, gates: AccuracyGates,
               earlier: Sequence[float] = ()) -> TaskVerdict:
    """The verdict at this look; `earlier` are the information fractions the task was already
    judged at (`decide` keeps them), which the look's interval is widened for."""
    tol = gates.tolerance_for(base.task)
    d = paired_difference(base, var)
    allowed = tol.allowed_drop(d.mean_a)
    drop = 0.0 - d.diff  # not -d.diff: no "-0.0000" when nothing moved
    size = max(base.size, var.size)
    t = look_fraction(d.n, size, gates)
    z = look_z(gates.z, earlier, t) if d.n >= gates.min_items else gates.z
    diff_low, diff_high = d.interval(z)
    low, high = -diff_high, -diff_low
    looks = 1 + len(looks_before(earlier, t))
    interval = (f"drop {drop:.4f} [{low:.4f}, {high:.4f}]"
                + ("" if z == gates.z else f" (look {looks}, {t:.0%} of the items, z {z:.2f})"))
    if d.n < gates.min_items:
        verdict: Verdict = "inconclusive"
        reason = (f"only {d.n} items scored, the gate needs {gates.min_items} to tell a drop "
                  "from noise")
    elif high <= allowed + 1e-12:
        verdict, reason = "pass", f"{interval} within allowed {allowed:.4f}"
    elif low > allowed + 1e-12:
        verdict, reason = "fail", f"{interval} entirely beyond allowed {allowed:.4f}"
    else:
        verdict, reason = "inconclusive", f"{interval} straddles allowed {allowed:.4f}"
    return TaskVerdict(task=base.task, metric=base.metric, baseline=d.mean_a, variant=d.mean_b,
                       delta=d.diff, stderr_baseline=base.stderr, stderr_variant=var.stderr,
                       se_delta=d.se, paired=d.paired, n=d.n, allowed_drop=allowed, verdict=verdict,
                       reason=reason, drop_low=low, drop_high=high,
                       tolerance=tol.describe(d.mean_a), size=size, z=z, fraction=t)


@dataclass(frozen=True)
class GateResult:
    precision: str
    verdict: Verdict  # what the evidence says
    verdicts: tuple[TaskVerdict, ...]
    reason: str
    passed: bool  # the decision: a pass, or an inconclusive verdict under policy `pass`
    # per task, the information fractions of the looks `decide` made (a replay passes them back)
    looks: dict[str, tuple[float, ...]] = field(default_factory=dict, compare=False)

    @property
    def items(self) -> int:
        """The most items any task was judged on."""
        return max((v.n for v in self.verdicts), default=0)


def judge_variant(precision: str, baseline: dict[str, TaskScore], variant: dict[str, TaskScore],
                  gates: AccuracyGates, looks: dict[str, list[float]] | None = None
                  ) -> GateResult:
    """The evidence as it stands: fail if a task fails, inconclusive if one is, else pass.
    `looks`: per task, the information fractions already judged (see `judge_task`)."""
    missing = sorted(set(baseline) - set(variant))
    if missing or not baseline:
        return GateResult(precision, "fail", (), "no scores for tasks: "
                          + (", ".join(missing) or "(no tasks evaluated)"), False)
    verdicts = tuple(judge_task(baseline[t], variant[t], gates, (looks or {}).get(t, ()))
                     for t in sorted(baseline))
    for verdict in ("fail", "inconclusive"):
        hit = [v for v in verdicts if v.verdict == verdict]
        if hit:
            return GateResult(precision, verdict, verdicts,
                              "; ".join(f"{v.task}: {v.reason}" for v in hit), False)
    return GateResult(precision, "pass", verdicts,
                      f"all {len(verdicts)} tasks within tolerance", True)


def apply_policy(gate: GateResult, gates: AccuracyGates) -> GateResult:
    """An inconclusive verdict with no items left to add: the configured policy decides."""
    if gate.verdict != "inconclusive":
        return gate
    policy = gates.inconclusive.policy
    how = "passes open" if policy == "pass" else "fails closed"
    return replace(gate, passed=policy == "pass",
                   reason=f"inconclusive after {gate.items} items ({how} by the inconclusive "
                          f"policy): {gate.reason}")


def item_cap(size: int, gates: AccuracyGates) -> int:
    """Most items a task may be re-evaluated on: its size, or the configured cap below it."""
    cap = gates.inconclusive.max_items
    if size <= 0:
        return cap or 0
    return min(size, cap) if cap else size


def next_items(v: TaskVerdict, gates: AccuracyGates, cap: int) -> int:
    """Items for an inconclusive task's next evaluation: as many as the interval needs to clear
    the allowed drop if the drop and its spread stay as measured (se shrinks as 1/sqrt(n)), at
    least twice as many as now and `min_items`, at most `cap`. Below `min_items` the spread is
    not projected (too few items to measure it): the next look is at `min_items`."""
    margin = abs(v.drop - v.allowed_drop)
    if v.n < gates.min_items:
        needed = gates.min_items
    elif v.se_delta > 0 and margin > 0:
        needed = math.ceil(v.n * (v.z * v.se_delta / margin) ** 2)
    elif margin == 0:
        needed = cap
    else:
        needed = gates.min_items
    return min(cap, max(needed, 2 * v.n, gates.min_items))


Evaluate = Callable[..., dict[str, TaskScore]]
"""`evaluate(tasks, limit, items=None)`: scores of `tasks` on their first `limit` items (None:
the evaluator's own count), or, with `items` ({task: item indices}), on exactly those items."""


def merge_scores(first: TaskScore, more: TaskScore) -> TaskScore:
    """A task's score over the items of both: the per-item results of each kept as they were
    scored, the mean and its standard error (lm-eval's `mean_stderr`: sample stddev / sqrt n)
    recomputed over all of them."""
    if more.metric != first.metric:
        raise ValueError(f"{first.task}: {first.metric} and {more.metric} do not add up")
    per_item = {**first.per_item, **more.per_item}
    values = list(per_item.values())
    n = len(values)
    mean = sum(values) / n
    stderr = (math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1)) / math.sqrt(n)
              if n > 1 else None)
    return TaskScore(task=first.task, metric=first.metric, value=mean, stderr=stderr, n=n,
                     per_item=per_item, size=first.size or more.size)


class ScoreBook:
    """One model's scores per task, grown by `ensure` while the gate needs more items.

    lm-eval's `limit` takes a task's first items, so the items scored are always a prefix: a
    baseline grown for one variant still pairs with another variant's fewer items. Growing
    scores only the items not scored yet and keeps the earlier ones (a later look of a
    group-sequential test adds observations to the earlier look's; it does not redraw them),
    where the task's score is the mean of its per-item results and its size is known.
    """

    def __init__(self, evaluate: Evaluate, scores: dict[str, TaskScore]):
        self._evaluate = evaluate
        self.scores: dict[str, TaskScore] = dict(scores)

    @classmethod
    def first(cls, evaluate: Evaluate, tasks: list[str]) -> ScoreBook:
        """Scored on the evaluator's own item count (`limit` None)."""
        return cls(evaluate, evaluate(tasks, None))

    def _growable(self, task: str) -> bool:
        s = self.scores.get(task)
        return bool(s and s.size and s.per_item and set(s.per_item) == set(range(s.n))
                    and math.isclose(s.value, sum(s.per_item.values()) / s.n, abs_tol=1e-9))

    def ensure(self, tasks: list[str], items: int) -> None:
        short = [t for t in tasks if t not in self.scores or self.scores[t].n < items]
        grow = {t: list(range(self.scores[t].n, min(items, self.scores[t].size)))
                for t in short if self._growable(t)}
        grow = {t: idx for t, idx in grow.items() if idx}
        again = [t for t in short if t not in grow]
        if grow:
            more = self._evaluate(sorted(grow), None, items=grow)
            for t in grow:
                self.scores[t] = merge_scores(self.scores[t], more[t])
        if again:
            self.scores.update(self._evaluate(again, items))


def decide(precision: str, baseline: ScoreBook, variant: ScoreBook, gates: AccuracyGates,
           log: Callable[[str], None] | None = None) -> GateResult:
    """Judge; while inconclusive, re-evaluate the inconclusive tasks (baseline and variant) on
    more items, up to each task's cap; then apply the inconclusive policy. Every look at a task
    is remembered, so the next one's interval is the group-sequential one."""
    asked: dict[str, int] = {}
    looks: dict[str, list[float]] = {}

    def judge() -> GateResult:
        gate = judge_variant(precision, baseline.scores, variant.scores, gates, looks)
        for v in gate.verdicts:
            seen = looks.setdefault(v.task, [])
            if v.n >= gates.min_items and v.fraction not in seen:  # a new look
                seen.append(v.fraction)
        return replace(gate, looks={t: tuple(f) for t, f in looks.items() if f})

    for _ in range(MAX_ROUNDS):
        gate = judge()
        if gate.verdict != "inconclusive":
            return gate
        plan: dict[int, list[str]] = {}
        for v in gate.verdicts:
            cap = item_cap(v.size, gates)
            items = next_items(v, gates, cap)
            if v.verdict == "inconclusive" and v.n < cap and items > asked.get(v.task, 0):
                plan.setdefault(items, []).append(v.task)
                asked[v.task] = items
        if not plan:
            break
        for items, tasks in sorted(plan.items()):
            if log:
                log(f"{precision}: inconclusive on {', '.join(tasks)}; re-evaluating on "
                    f"{items} items")
            baseline.ensure(tasks, items)
            variant.ensure(tasks, items)
    return apply_policy(judge(), gates)


def baseline_rows(precision: str, scores: dict[str, TaskScore]) -> list[dict]:
    """Rows of the accuracy table for the baseline itself (the reference of every verdict)."""
    return [{"task": s.task, "metric": s.metric, "precision": precision, "baseline": s.value,
             "variant": s.value, "delta": 0.0, "drop_low": None, "drop_high": None,
             "allowed_drop": None, "stderr": s.stderr, "se_delta": 0.0, "z": None, "n": s.n,
             "verdict": "reference", "passed": True} for s in scores.values()]


def gate_rows(precision: str, gate: GateResult) -> list[dict]:
    """Rows of the accuracy table for one variant's verdicts."""
    return [{"task": t.task, "metric": t.metric, "precision": precision, "baseline": t.baseline,
             "variant": t.variant, "delta": t.delta, "drop_low": t.drop_low,
             "drop_high": t.drop_high, "allowed_drop": t.allowed_drop,
             "stderr": t.stderr_variant, "se_delta": t.se_delta, "z": t.z, "n": t.n,
             "verdict": t.verdict, "passed": t.passed} for t in gate.verdicts]
