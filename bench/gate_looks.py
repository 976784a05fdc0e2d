"""The accuracy gate's error rate over repeated looks: group-sequential vs one z at every look.

A variant whose true drop sits exactly at the allowed drop should pass at most α of the time
(5 % at the shipped z 1.645). `decide` judges, and while inconclusive re-evaluates on more
items and judges again. Simulated here through `decide` itself (the project's code, nested item
sets as lm-eval's `limit` gives), once as shipped (each look spends part of α,
`onboarding.sequential`) and once with the peer rule the gate had before: every look at the
single-look z. Printed: the pass rate of each at the limit (the error), the pass rate of a
variant with no loss (the power), and the items each used on average; the ratio is the
shipped rule's error over the peer's. For reference, the error of one look at a fixed item
count (the interval's own error, with no repeated looks).

    .venv/bin/python bench/gate_looks.py [--runs 2000] [--size 400] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onboarding import accuracy_gate
from onboarding.accuracy_gate import AccuracyGates, ScoreBook, TaskScore, decide

BASELINE_P = 0.6  # the baseline's accuracy
GAIN = 0.05  # chance a wrong baseline answer is right in the variant (rounding both ways)


def items(rng: np.random.Generator, size: int, true_drop: float) -> tuple[list[float], list[float]]:
    """Paired per-item scores with E[baseline − variant] = true_drop."""
    base = (rng.random(size) < BASELINE_P).astype(float)
    lose = (true_drop + (1 - BASELINE_P) * GAIN) / BASELINE_P
    u = rng.random(size)
    var = np.where(base == 1.0, (u >= lose).astype(float), (u < GAIN).astype(float))
    return base.tolist(), var.tolist()


def evaluator(values: list[float], first: int):
    def evaluate(tasks: list[str], limit: int | None) -> dict[str, TaskScore]:
        n = limit or first
        got = values[:n]
        return {"t": TaskScore("t", "acc", sum(got) / n, None, n, dict(enumerate(got)),
                               len(values))}
    return evaluate


def run(gates: AccuracyGates, runs: int, size: int, true_drop: float, seed: int,
        single_look: bool, first: int | None = None) -> dict:
    """`runs` simulated variants through `decide`, its first look at `first` items (default
    `min_items`)."""
    first = first or gates.min_items
    rng = np.random.default_rng(seed)
    passed, used, looks = 0, [], []
    with (mock.patch.object(accuracy_gate, "look_z", lambda z, earlier, now: z)
          if single_look else contextlib.nullcontext()):
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
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--size", type=int, default=400, help="items the task has")
    ap.add_argument("--json")
    a = ap.parse_args()
    gates = AccuracyGates.model_validate({
        "tolerance": {"max_abs_drop": 0.03}, "z": 1.645, "min_items": 100,
        "metric_preference": ["acc"], "inconclusive": {"policy": "fail"}})
    out: dict = {"runs": a.runs, "size": a.size, "z": gates.z, "allowed_drop": 0.03}
    t0 = time.perf_counter()
    for label, drop in (("at_limit", 0.03), ("no_loss", 0.0)):
        for rule, single in (("group_sequential", False), ("single_look_z", True)):
            out[f"{label}/{rule}"] = run(gates, a.runs, a.size, drop, seed=7, single_look=single)
    # the interval's own error without repeated looks: one look at the first look's items and
    # one at all of them (the Wald interval on few discordant items runs above α)
    for n in (gates.min_items, a.size):
        out[f"at_limit/one_look_{n}"] = run(gates, a.runs, n, 0.03, seed=7,
                                            single_look=False, first=n)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    se = (0.05 * 0.95 / a.runs) ** 0.5
    print(f"{a.runs} simulated variants per cell, task of {a.size} items, first look at "
          f"{gates.min_items}, allowed drop 0.03, z {gates.z} (one-sided α 0.05 ± {se:.3f} "
          "simulation error)")
    print(f"{'true drop':<12}{'rule':<20}{'pass rate':>10}{'mean items':>12}{'mean looks':>12}")
    for label in ("at_limit", "no_loss"):
        for rule in ("group_sequential", "single_look_z"):
            r = out[f"{label}/{rule}"]
            print(f"{label:<12}{rule:<20}{r['pass_rate']:>10.3f}{r['mean_items']:>12.1f}"
                  f"{r['mean_looks']:>12.2f}")
    for n in (gates.min_items, a.size):
        r = out[f"at_limit/one_look_{n}"]
        print(f"{'at_limit':<12}{f'one look at {n}':<20}{r['pass_rate']:>10.3f}"
              f"{r['mean_items']:>12.1f}{r['mean_looks']:>12.2f}")
    ours, peer = out["at_limit/group_sequential"], out["at_limit/single_look_z"]
    print(f"error at the limit, ours ÷ single-look z: {ours['pass_rate'] / peer['pass_rate']:.2f}"
          f" ({ours['pass_rate']:.3f} vs {peer['pass_rate']:.3f}); power with no loss, ours ÷ "
          f"peer: {out['no_loss/group_sequential']['pass_rate']:.3f} vs "
          f"{out['no_loss/single_look_z']['pass_rate']:.3f}; {out['seconds']} s")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
