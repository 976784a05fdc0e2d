"""Runs the configuration search (onboarding/serving/config_search.py) on the engine at hand:
each candidate started by the `Engine` resource, measured by the rate verdict
(`measure_at_rate`, the serving benchmark's own load generator and prompts), then stopped.

Per candidate: `rate.repeats` runs at the target rate, each on prompts no earlier run sent (a
prompt sent again would be served from the prefix cache). The runs stop early when the
candidate cannot beat the best so far: a run decided "not met" is not repeated, and neither is
one whose worst percentile is already further from its bound than the best's. An engine that
fails to start, or exits while measured, is a crashed candidate (its reason kept), never the
end of the search.
`on_run(candidate, repetition, run, bodies)` sees each run's requests as they came back (and
how many bodies it had: the verdict's looks follow from it), for a record that the verdict can
be judged again from.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from onboarding.common.errors import OnboardingError
from onboarding.common.refs import VariantRef
from onboarding.serving.config_search import Candidate, Measured, SearchResult, search
from onboarding.serving.prompts import synthetic_prompts
from onboarding.serving.rate_verdict import (
    NOT_MET,
    RateSlo,
    RepeatedVerdict,
    combine,
    requests_for,
)
from onboarding.serving.stats import Slo
from resources.loadgen import LoadGenerator, PointRun, completion_bodies, measure_at_rate


@dataclass(frozen=True)
class Traffic:
    """What every candidate is sent: one scenario's shapes (exact token counts)."""

    input_tokens: int
    output_tokens: int
    prefix_tokens: int = 0
    warmup_requests: int = 2
    request_timeout_s: float = 120.0
    count_tokens_by: str = "usage"


def rate_bodies(tokenizer, served_name: str, traffic: Traffic, key: str, n: int
                ) -> list[bytes]:
    """`n` request bodies of the traffic's shapes, seeded by `key`: no two runs (and no sweep
    point) send the same prompt, which the prefix cache would serve."""
    prompts = synthetic_prompts(tokenizer, n, traffic.input_tokens, traffic.prefix_tokens,
                                seed=zlib.crc32(key.encode()))
    return completion_bodies(served_name, prompts, traffic.output_tokens,
                             count_tokens_by=traffic.count_tokens_by)


def verdict_at_rate(loadgen: LoadGenerator, base_url: str, served_name: str, tokenizer,
                    traffic: Traffic, slo: Slo, rate: RateSlo, key: str,
                    log: Callable[[str], None] = print) -> RepeatedVerdict:
    """The rate verdict on a running engine: `rate.repeats` runs of Poisson arrivals at the
    target rate, fresh prompts each, stopping after a run decided "not met" (the outcome is
    then not met whatever follows)."""
    per_run = requests_for(rate)
    runs = []
    for i in range(rate.repeats):
        warm = rate_bodies(tokenizer, served_name, traffic, f"{key}/warm",
                           traffic.warmup_requests) if i == 0 else ()
        run, v = measure_at_rate(
            loadgen, base_url, rate_bodies(tokenizer, served_name, traffic, f"{key}/{i}", per_run),
            slo, rate, seed=i, request_timeout_s=traffic.request_timeout_s, warmup_bodies=warm)
        runs.append(v)
        log(f"  at {rate.target_rate_rps:g} req/s, run {i + 1}/{rate.repeats}: {v.says()} "
            f"(stopped: {run.stopped})")
        if v.outcome == NOT_MET:
            break
    return combine(runs, rate.confidence)


def candidate_cost_s(rate: RateSlo, start_s: float) -> float:
    """The most one candidate can take: an engine start and `repeats` runs to `max_seconds`."""
    return start_s + rate.repeats * rate.max_seconds


def run_search(engine, loadgen: LoadGenerator, variant: VariantRef, cands: list[Candidate],
               basis: str, slo: Slo, rate: RateSlo, traffic: Traffic, tokenizer,
               budget_s: float, start_s: float, notes: tuple[str, ...] = (),
               min_margin: float = 0.0,
               log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
               on_run: Callable[[Candidate, int, PointRun, int], None] | None = None
               ) -> SearchResult:
    node_type = cands[0].config.node_type if cands else "?"
    per_run = requests_for(rate)

    def bodies(c: Candidate, i: int, n: int) -> list[bytes]:
        return rate_bodies(tokenizer, c.config.served_name, traffic, f"{c.config.hash}/{i}", n)

    def measure(c: Candidate, best: Measured | None) -> Measured:
        t0 = clock()
        runs = []
        stopped = ""
        log(f"search on {node_type}: {c.label} ({c.config.hash})")
        try:
            with engine.serve(variant, c.config) as running:
                for i in range(rate.repeats):
                    warm = bodies(c, -1, traffic.warmup_requests) if i == 0 else ()
                    run, v = measure_at_rate(
                        loadgen, running.base_url, bodies(c, i, per_run), slo, rate,
                        seed=i, request_timeout_s=traffic.request_timeout_s,
                        warmup_bodies=warm)
                    runs.append(v)
                    if on_run is not None:  # the run's requests, for a record of the search
                        on_run(c, i, run, per_run)
                    log(f"  repetition {i + 1}/{rate.repeats}: {v.says()} (stopped: {run.stopped})")
                    errors = {r.error: 1 for r in run.records if r.error}
                    if running.exited(errors):
                        return Measured(combine(runs), crashed=(
                            f"engine exited (code {running.exit_code()}) during repetition {i + 1}"),
                            seconds=clock() - t0)
                    if v.outcome == NOT_MET:
                        stopped = f"repetition {i + 1} not met (n={v.n}): not repeated"
                        break
                    if best is not None and i + 1 < rate.repeats and \
                            Measured(combine(runs)).headroom() > best.headroom():
                        stopped = (f"after repetition {i + 1}: {Measured(combine(runs)).headroom():.3f}"
                                   f" of its bounds vs the best's {best.headroom():.3f}: cannot "
                                   "beat it, not repeated")
                        break
        except OnboardingError as exc:
            return Measured(combine(runs) if runs else None, crashed=str(exc)[:500],
                            seconds=clock() - t0)
        return Measured(combine(runs, rate.confidence), stopped_early=stopped,
                        seconds=clock() - t0)

    return search(node_type, cands, measure, budget_s, candidate_cost_s(rate, start_s), basis,
                  clock=clock, notes=notes, min_margin=min_margin)
