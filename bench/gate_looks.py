"""The accuracy gate's error at the limit: the shipped rule vs the rule it had before.

A variant whose true drop sits exactly at the allowed drop should pass at most α of the time
(5 % at the shipped z 1.645). `decide` judges, and while inconclusive re-evaluates on more
items and judges again. Simulated here through `decide` itself (the project's code, nested item
sets as lm-eval's `limit` gives), under four rules that cross the two parts of the gate's
interval:

- looks: group-sequential (shipped: each look spends part of α, `onboarding.quantize.sequential`) or
  one z at every look (before);
- interval: Bonett–Price's adjusted one for 0/1 items (shipped) or the plain normal one on the
  per-item differences (before).

The peer is the rule before both (plain interval, one z per look), on the same seeds in the same
run. Printed per rule: the pass rate at the limit (the error), the pass rate of a variant with
no loss (the power), the items and looks used on average; then one look at a fixed item count
for each interval (the interval's own error, no repeated looks), and the ratio of the shipped
rule's error to the peer's.

    .venv/bin/python bench/gate_looks.py [--runs 5000] [--size 400] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onboarding.quantize import accuracy_gate
from onboarding.quantize.accuracy_gate import AccuracyGates, ScoreBook, TaskScore, decide

BASELINE_P = 0.6  # the baseline's accuracy
GAIN = 0.05  # chance a wrong baseline answer is right in the variant (rounding both ways)
ALLOWED = 0.03
RULES = {  # name: (group-sequential looks, adjusted interval)
    "shipped": (True, True),
    "looks only": (True, False),
    "interval only": (False, True),
    "before (peer)": (False, False),
}


def items(rng: np.random.Generator, size: int, true_drop: float) -> tuple[list[float], list[float]]:
    """Paired per-item scores with E[baseline − variant] = true_drop."""
    base = (rng.random(size) < BASELINE_P).astype(float)
    lose = (true_drop + (1 - BASELINE_P) * GAIN) / BASELINE_P
    u = rng.random(size)
    var = np.where(base == 1.0, (u >= lose).astype(float), (u < GAIN).astype(float))
    return base.tolist(), var.tolist()


def evaluator(values: list[float], first: int):
    def evaluate(tasks: list[str], limit: int | None,
                 items: dict[str, list[int]] | None = None) -> dict[str, TaskScore]:
        idx = items["t"] if items else range(limit or first)
        got = {i: values[i] for i in idx}
        return {"t": TaskScore(task="t", metric="acc", value=sum(got.values()) / len(got),
                               stderr=None, n=len(got), per_item=got, size=len(values))}
    return evaluate


def run(gates: AccuracyGates, runs: int, size: int, true_drop: float, seed: int,
        sequential: bool, adjusted: bool, first: int | None = None) -> dict:
    """`runs` simulated variants through `decide`, its first look at `first` items (default
    `min_items`)."""
    first = first or gates.min_items
    rng = np.random.default_rng(seed)
    passed, used, looks = 0, [], []
    with contextlib.ExitStack() as stack:
        if not sequential:
            stack.enter_context(mock.patch.object(accuracy_gate, "look_z",
                                                  lambda z, earlier, now: z))
        if not adjusted:
            stack.enter_context(mock.patch.object(
                accuracy_gate, "paired_difference",
                functools.partial(accuracy_gate.paired_difference, adjusted=False)))
        for _ in range(runs):
            base, var = items(rng, size, true_drop)
            calls: list[str] = []  # one log line per re-evaluation
            gate = decide("x", ScoreBook.first(evaluator(base, first), ["t"]),
                          ScoreBook.first(evaluator(var, first), ["t"]), gates,
                          log=calls.append)
            passed += gate.passed
            used.append(gate.items)
            looks.append(1 + len(calls))
    return {"pass_rate": passed / runs, "mean_items": statistics.fmean(used),
            "mean_looks": statistics.fmean(looks)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5000)
    ap.add_argument("--size", type=int, default=400, help="items the task has")
    ap.add_argument("--json")
    a = ap.parse_args()
    gates = AccuracyGates.model_validate({
        "tolerance": {"max_abs_drop": ALLOWED}, "z": 1.645, "min_items": 100,
        "metric_preference": ["acc"], "inconclusive": {"policy": "fail"}})
    out: dict = {"runs": a.runs, "size": a.size, "z": gates.z, "allowed_drop": ALLOWED}
    t0 = time.perf_counter()
    for rule, (sequential, adjusted) in RULES.items():
        for label, drop in (("at_limit", ALLOWED), ("no_loss", 0.0)):
            out[f"{label}/{rule}"] = run(gates, a.runs, a.size, drop, 7, sequential, adjusted)
    for adjusted in (True, False):  # one look, no re-evaluation: the interval's own error
        for n in (gates.min_items, a.size):
            out[f"at_limit/one look at {n}, {'adjusted' if adjusted else 'plain'}"] = run(
                gates, a.runs, n, ALLOWED, 7, True, adjusted, first=n)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    se = (0.05 * 0.95 / a.runs) ** 0.5
    print(f"{a.runs} simulated variants per row, task of {a.size} items, first look at "
          f"{gates.min_items}, allowed drop {ALLOWED}, z {gates.z} (one-sided α 0.05; "
          f"simulation error ±{se:.3f})")
    print(f"{'true drop':<10}{'rule':<30}{'pass rate':>10}{'mean items':>12}{'mean looks':>12}")
    for key, r in out.items():
        if isinstance(r, dict):
            label, rule = key.split("/", 1)
            print(f"{label:<10}{rule:<30}{r['pass_rate']:>10.3f}{r['mean_items']:>12.1f}"
                  f"{r['mean_looks']:>12.2f}")
    ours, peer = out["at_limit/shipped"], out["at_limit/before (peer)"]
    print(f"error at the limit, shipped ÷ before: {ours['pass_rate'] / peer['pass_rate']:.2f} "
          f"({ours['pass_rate']:.3f} vs {peer['pass_rate']:.3f}); power with no loss "
          f"{out['no_loss/shipped']['pass_rate']:.3f} vs "
          f"{out['no_loss/before (peer)']['pass_rate']:.3f}; {out['seconds']} s")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
