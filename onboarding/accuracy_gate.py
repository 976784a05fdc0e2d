"""The accuracy gate: does a quantized variant keep each task's score within tolerance?

Decided on evidence, not noise. Baseline and variant answer the same items, so the drop's
standard error is taken from the per-item differences (paired) when lm-eval's samples are there,
and from lm-eval's two stderrs otherwise. A variant fails a task only when its drop exceeds the
allowed drop by more than `z` standard errors, or when too few items were scored to tell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field

from onboarding.catalog import StrictConfig, load_yaml, validate_config
from onboarding.errors import ConfigError


class Tolerance(StrictConfig):
    max_abs_drop: float = Field(ge=0, description="allowed drop in the metric, absolute")
    max_rel_drop: float = Field(ge=0, description="allowed drop relative to the baseline")


class TaskGate(StrictConfig):
    metric: str | None = None
    max_abs_drop: float | None = Field(default=None, ge=0)
    max_rel_drop: float | None = Field(default=None, ge=0)


class AccuracyGates(StrictConfig):
    tolerance: Tolerance
    z: float = Field(gt=0, description="standard errors of slack before a drop counts")
    min_items: int = Field(ge=1, description="fewer scored items than this fail the gate")
    metric_preference: list[str] = Field(min_length=1)
    tasks: dict[str, TaskGate] = Field(default_factory=dict)

    def tolerance_for(self, task: str) -> Tolerance:
        t = self.tasks.get(task)
        if t is None:
            return self.tolerance
        return Tolerance(
            max_abs_drop=self.tolerance.max_abs_drop if t.max_abs_drop is None else t.max_abs_drop,
            max_rel_drop=self.tolerance.max_rel_drop if t.max_rel_drop is None else t.max_rel_drop,
        )


def load_accuracy_gates(path: Path) -> AccuracyGates:
    """The `accuracy:` section of gates.yaml (other sections belong to other stages)."""
    data = load_yaml(path)
    section = data.get("accuracy") if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: accuracy", "missing or not a mapping",
                          "Add the `accuracy:` section (see the shipped configs/gates.yaml).")
    return validate_config(AccuracyGates, section, path, "accuracy",
                           "Fix the accuracy gate section.")


@dataclass(frozen=True)
class TaskScore:
    """One task's score for one model, with lm-eval's stderr and the per-item values."""

    task: str
    metric: str
    value: float
    stderr: float | None
    n: int
    per_item: dict[int, float] = field(default_factory=dict, compare=False, repr=False)


def pick_metric(result: dict, preference: list[str], forced: str | None = None
                ) -> tuple[str, str] | None:
    """(metric, lm-eval result key such as 'exact_match,first-number') for one task's results."""
    keys = [k for k in result if "," in k and "_stderr," not in k]
    for metric in ([forced] if forced else preference):
        for k in keys:
            if k.split(",", 1)[0] == metric:
                return metric, k
    return None


def scores_from_lm_eval(results: dict, samples: dict | None, gates: AccuracyGates
                        ) -> dict[str, TaskScore]:
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
        out[task] = TaskScore(task, metric, float(result[key]), stderr, n, per_item)
    return out


@dataclass(frozen=True)
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
    passed: bool
    reason: str


def judge_task(base: TaskScore, var: TaskScore, gates: AccuracyGates) -> TaskVerdict:
    tol = gates.tolerance_for(base.task)
    allowed = min(tol.max_abs_drop, tol.max_rel_drop * abs(base.value))
    drop = base.value - var.value
    common = sorted(set(base.per_item) & set(var.per_item))
    if len(common) >= 2:
        diffs = [var.per_item[i] - base.per_item[i] for i in common]
        mean = sum(diffs) / len(diffs)
        var_d = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
        se, paired, n = math.sqrt(var_d / len(diffs)), True, len(common)
    else:
        se = math.sqrt((base.stderr or 0.0) ** 2 + (var.stderr or 0.0) ** 2)
        paired, n = False, min(base.n, var.n)
    if n < gates.min_items:
        passed = False
        reason = (f"only {n} items scored, gate needs {gates.min_items}: too few to tell a drop "
                  "from noise (raise the evaluator's limit)")
    elif drop > allowed + gates.z * se:
        passed = False
        reason = (f"drop {drop:.4f} exceeds allowed {allowed:.4f} by more than "
                  f"{gates.z}x stderr {se:.4f}")
    elif drop > allowed:
        passed = True
        reason = (f"drop {drop:.4f} above allowed {allowed:.4f} but within {gates.z}x "
                  f"stderr {se:.4f} (noise)")
    else:
        passed = True
        reason = f"drop {drop:.4f} within allowed {allowed:.4f}"
    return TaskVerdict(base.task, base.metric, base.value, var.value, var.value - base.value,
                       base.stderr, var.stderr, se, paired, n, allowed, passed, reason)


@dataclass(frozen=True)
class GateResult:
    precision: str
    passed: bool
    verdicts: tuple[TaskVerdict, ...]
    reason: str


def judge_variant(precision: str, baseline: dict[str, TaskScore], variant: dict[str, TaskScore],
                  gates: AccuracyGates) -> GateResult:
    missing = sorted(set(baseline) - set(variant))
    if missing or not baseline:
        return GateResult(precision, False, (), "no scores for tasks: "
                          + (", ".join(missing) or "(no tasks evaluated)"))
    verdicts = tuple(judge_task(baseline[t], variant[t], gates) for t in sorted(baseline))
    failed = [v for v in verdicts if not v.passed]
    reason = ("; ".join(f"{v.task}: {v.reason}" for v in failed) if failed
              else f"all {len(verdicts)} tasks within tolerance")
    return GateResult(precision, not failed, verdicts, reason)


def gate_rows(precision: str, baseline: dict[str, TaskScore] | None,
              gate: GateResult | None) -> list[dict]:
    """Rows of the accuracy table: the baseline's scores (`gate` None) or a variant's verdicts."""
    if gate is None:
        return [{"task": s.task, "metric": s.metric, "precision": precision,
                 "baseline": s.value, "variant": s.value, "delta": 0.0, "stderr": s.stderr,
                 "se_delta": 0.0, "n": s.n, "passed": True} for s in (baseline or {}).values()]
    return [{"task": t.task, "metric": t.metric, "precision": precision, "baseline": t.baseline,
             "variant": t.variant, "delta": t.delta, "stderr": t.stderr_variant,
             "se_delta": t.se_delta, "n": t.n, "passed": t.passed} for t in gate.verdicts]
