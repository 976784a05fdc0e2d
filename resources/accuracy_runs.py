"""Scoring runs for the accuracy gate: a model in process, or a variant through the engine.

The gate (onboarding/quantize/accuracy_gate.py) asks for scores through `Evaluate` callables, so it can
re-evaluate an inconclusive task on more items without knowing how a score is made; these build
them from the `Evaluator` resource (lm-eval) and, for the served mode, the `Engine` resource.
Used by the `accuracy` and `served_accuracy` assets and by bench/served_accuracy_gpu.py, so the
GPU run exercises the same code.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from onboarding.common.errors import OnboardingError
from onboarding.common.progress import heartbeat
from onboarding.common.refs import CheckpointRef, VariantRef
from onboarding.fetch.catalog import ModelSpec
from onboarding.quantize.accuracy_gate import (
    AccuracyGates,
    Evaluate,
    ScoreBook,
    TaskScore,
    decide,
    gate_rows,
    scores_from_lm_eval,
)
from onboarding.quantize.served_accuracy import agreement
from onboarding.quantize.variants import (
    SERVED,
    AccuracyRecord,
    AccuracyReport,
    GateOutcome,
    QuantizedSet,
    ServedAccuracyReport,
    variant_ref,
)
from onboarding.serving.stack import effective_max_model_len
from resources.engine import Engine, RunningEngine
from resources.evaluator import Evaluator

Log = Callable[[str], None] | None


def scored_note(precision: str, scores: dict[str, TaskScore], seconds: float) -> str:
    """One log line per scoring call: each task's score and items, and the time."""
    return (f"{precision}: scored " + "; ".join(
        f"{t} {s.value:.3f} on {s.n} items" for t, s in sorted(scores.items()))
        + f" in {seconds:.0f} s")


def _asked(tasks: list[str], limit: int | None, items: dict[str, list[int]] | None) -> str:
    if items:
        return ", ".join(f"{t} ({len(items[t])} items)" for t in sorted(items))
    return f"{', '.join(tasks) or 'the default tasks'} ({limit or 'all'} items each)"


def in_process_scorer(evaluator: Evaluator, gates: AccuracyGates, eval_s: dict[str, float],
                      precision: str, model, tokenizer, log: Log = None) -> Evaluate:
    """Scores of one model in process (a checkpoint dir, or a module in memory with its
    tokenizer); seconds add up in `eval_s[precision]`. `log` gets what is scored, lm-eval's
    progress every 10 s while it runs, and the scores."""
    def evaluate(tasks: list[str], limit: int | None,
                 items: dict[str, list[int]] | None = None) -> dict[str, TaskScore]:
        if log:
            log(f"{precision}: scoring {_asked(tasks, limit, items)} in process")
        with heartbeat(log, f"{precision}: scoring"):
            run = evaluator.evaluate(model, tokenizer, tasks, limit=limit, items=items)
        eval_s[precision] = eval_s.get(precision, 0.0) + run.seconds
        scores = scores_from_lm_eval(run.results, run.samples, gates, run.sizes)
        if log:
            log(scored_note(precision, scores, run.seconds))
        return scores
    return evaluate


@contextlib.contextmanager
def serve_for_eval(engine: Engine, variant: VariantRef, spec: ModelSpec
                   ) -> Iterator[tuple[RunningEngine, int | None]]:
    """The engine serving `variant` as it will be served, and its max model length.

    The configuration is the engine at hand's own for this precision (`local_config`: the
    hardware defaults and the model's production parameters), built the
    way `serving_config` builds it; TP and --max-num-seqs of a plan change throughput, not the
    numbers an evaluation scores. Its hash is logged with the engine start.
    """
    config = engine.local_config(spec, variant.precision)
    with engine.serve(variant, config) as running:
        yield running, effective_max_model_len(engine.template(), config.hardware,
                                                dict(config.params))


def score_served(engine: Engine, evaluator: Evaluator, spec: ModelSpec, ref: VariantRef,
                 gates: AccuracyGates, plan: dict[int | None, list[str]],
                 eval_s: dict[str, float], log: Log = None,
                 items: dict[str, list[int]] | None = None) -> dict[str, TaskScore]:
    """One engine start for `ref`, then each group of tasks on its item count (`plan`), or on
    exactly the `items` named per task."""
    t0 = time.perf_counter()
    scores: dict[str, TaskScore] = {}
    if log:
        what = ", ".join(f"{t} ({len(items[t]) if items else n or 'default'} items)"
                         for n, ts in plan.items() for t in ts)
        log(f"{ref.precision}: serving {ref.path} for {what}")
    with serve_for_eval(engine, ref, spec) as (running, max_len):
        if log:
            log(f"{ref.precision}: engine ready in {running.phases.first_token_s:.1f} s")
        for limit, tasks in plan.items():
            with heartbeat(log, f"{ref.precision}: scoring served"):
                run = evaluator.evaluate_served(
                    running.base_url, running.served_name, ref.path, tasks, limit=limit,
                    max_length=max_len, items={t: items[t] for t in tasks} if items else None)
            got = scores_from_lm_eval(run.results, run.samples, gates, run.sizes)
            if log:
                log(scored_note(f"{ref.precision} served", got, run.seconds))
            scores.update(got)
    eval_s[ref.precision] = eval_s.get(ref.precision, 0.0) + time.perf_counter() - t0
    return scores


def served_scorer(engine: Engine, evaluator: Evaluator, spec: ModelSpec, ref: VariantRef,
                  gates: AccuracyGates, eval_s: dict[str, float], log: Log = None) -> Evaluate:
    """More items for the gate's ScoreBook: the engine starts again for them."""
    def evaluate(tasks: list[str], limit: int | None,
                 items: dict[str, list[int]] | None = None) -> dict[str, TaskScore]:
        return score_served(engine, evaluator, spec, ref, gates, {limit: tasks}, eval_s, log,
                            items)
    return evaluate


def served_report(engine: Engine, evaluator: Evaluator, spec: ModelSpec,
                  checkpoint: CheckpointRef, quantized: QuantizedSet, accuracy: AccuracyReport,
                  gates: AccuracyGates, log: Log = None) -> ServedAccuracyReport:
    """Serve each precision `accuracy` scored in process and this engine can serve, once, on
    the same items; then each one's agreement with its in-process score, and the served gates
    against bf16 served (which start engines again only when they need more items)."""
    if not accuracy.records:
        raise OnboardingError(f"accuracy of {spec.id}", "holds no per-item records (it was "
                              "materialized before served accuracy existed)",
                              "Re-materialize `accuracy` for this model.")
    books: dict[str, ScoreBook] = {}
    refs: dict[str, VariantRef] = {}
    not_served: dict[str, str] = {}
    eval_s: dict[str, float] = {}
    for record in accuracy.records:
        p = record.precision
        ok, why = engine.can_serve(p)
        if not ok:
            not_served[p] = why
            continue
        refs[p] = variant_ref(spec.id, p, checkpoint, quantized)
        plan: dict[int | None, list[str]] = {}
        for task, score in record.scores.items():
            plan.setdefault(score.n, []).append(task)
        books[p] = ScoreBook(served_scorer(engine, evaluator, spec, refs[p], gates, eval_s, log),
                             score_served(engine, evaluator, spec, refs[p], gates, plan, eval_s,
                                          log))
    outcomes, rows = [], []
    for p, book in books.items():
        if p == "bf16":
            continue
        if "bf16" not in books:
            not_served.setdefault(p, f"no served bf16 baseline ({not_served.get('bf16')})")
            continue
        gate = decide(p, books["bf16"], book, gates, log=log)
        outcomes.append(GateOutcome.of(gate, SERVED))
        rows += gate_rows(p, gate)
    for v in quantized.variants:
        if v.precision not in books and v.precision not in not_served:
            why = v.error or "export check failed"
            not_served[v.precision] = f"not evaluated in process ({why})"
    return ServedAccuracyReport(
        model=spec.id,
        records=tuple(AccuracyRecord(p, SERVED, refs[p].content_hash, b.scores, round(eval_s[p], 2))
                      for p, b in books.items()),
        agreements=tuple(agreement(p, accuracy.record(p).scores, b.scores, gates)
                         for p, b in books.items()),
        gates=tuple(outcomes), rows=tuple(rows), not_served=not_served,
        eval_s={p: round(s, 2) for p, s in eval_s.items()})
