"""Served versus in-process accuracy of one variant: do the two agree?

The in-process score is Model Optimizer's fake quantization in transformers; the served score is
the engine's own kernels on the exported checkpoint. They answer the same items, so their
difference is paired per item (`served − in_process`, with the interval `diff ± z·se`). A
difference whose interval lies entirely beyond ± `served_agreement.max_abs_diff` is a
disagreement: an export the engine reads differently (a wrong scale, a format mismatch) or a
kernel with a numerical problem, not noise. The tolerance is there because two correct stacks
still round differently: bf16 in another kernel order flips a few near-tie items, and a handful
of flips that happen to fall one way already push a normal interval off zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from onboarding.quantize.accuracy_gate import AccuracyGates, TaskScore, paired_difference

AgreementVerdict = Literal["agree", "disagree", "unclear"]


@dataclass(frozen=True, kw_only=True)
class TaskAgreement:
    task: str
    metric: str
    in_process: float
    served: float
    diff: float  # served - in_process, over the items both scored
    diff_low: float
    diff_high: float
    se: float
    paired: bool
    n: int
    verdict: AgreementVerdict
    reason: str


@dataclass(frozen=True)
class Agreement:
    precision: str
    verdict: AgreementVerdict
    tasks: tuple[TaskAgreement, ...]
    reason: str

    @property
    def passed(self) -> bool:
        """Only a disagreement fails: an unclear one says more items would tell."""
        return self.verdict != "disagree"


def task_agreement(in_process: TaskScore, served: TaskScore, gates: AccuracyGates
                   ) -> TaskAgreement:
    tol = gates.served_agreement.max_abs_diff
    d = paired_difference(in_process, served)
    low, high = d.interval(gates.z)
    numbers = (f"served {d.mean_b:.4f} vs in process {d.mean_a:.4f} on {d.n} items: "
               f"diff {d.diff:+.4f} [{low:+.4f}, {high:+.4f}]")
    if low > tol + 1e-12 or high < -tol - 1e-12:
        verdict: AgreementVerdict = "disagree"
        reason = f"{numbers} lies beyond ±{tol:g}"
    elif low >= -tol - 1e-12 and high <= tol + 1e-12:
        verdict, reason = "agree", f"{numbers} within ±{tol:g}"
    else:
        verdict, reason = "unclear", f"{numbers} reaches beyond ±{tol:g}"
    return TaskAgreement(task=in_process.task, metric=in_process.metric, in_process=d.mean_a,
                         served=d.mean_b, diff=d.diff, diff_low=low, diff_high=high, se=d.se,
                         paired=d.paired, n=d.n, verdict=verdict, reason=reason)


def agreement(precision: str, in_process: dict[str, TaskScore], served: dict[str, TaskScore],
              gates: AccuracyGates) -> Agreement:
    """One precision, every task: disagree if any task does (or was not scored when served)."""
    missing = sorted(set(in_process) - set(served))
    tasks = tuple(task_agreement(in_process[t], served[t], gates)
                  for t in sorted(in_process) if t in served)
    if missing:
        return Agreement(precision, "disagree", tasks,
                         f"not scored when served: {', '.join(missing)}")
    for verdict in ("disagree", "unclear"):
        hit = [t for t in tasks if t.verdict == verdict]
        if hit:
            prefix = "export or kernel problem: " if verdict == "disagree" else ""
            return Agreement(precision, verdict, tasks,
                             prefix + "; ".join(f"{t.task}: {t.reason}" for t in hit))
    return Agreement(precision, "agree", tasks,
                     f"served and in-process scores agree on all {len(tasks)} tasks")


def agreement_rows(agreements: tuple[Agreement, ...] | list[Agreement]) -> list[dict]:
    return [{"precision": a.precision, "task": t.task, "metric": t.metric,
             "in_process": t.in_process, "served": t.served, "diff": t.diff,
             "diff_low": t.diff_low, "diff_high": t.diff_high, "n": t.n, "verdict": t.verdict}
            for a in agreements for t in a.tasks]
