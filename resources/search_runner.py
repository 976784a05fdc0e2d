"""Runs the configuration search (onboarding/serving/config_search.py) on the engine at hand:
each candidate started by the `Engine` resource, measured by the rate verdict
(`measure_at_rate`, the serving benchmark's own load generator and prompts), then stopped.

Per candidate: `rate.repeats` runs at the target rate, each on prompts no earlier run sent (a
prompt sent again would be served from the prefix cache). The runs stop early when the
candidate cannot win: a run decided "not met" is not repeated, and neither is one whose worst
percentile is already at or past the search's bar (`config_search.win_bar`: the best so far,
and the plan's runs less the margin a challenger must win by). An engine that
fails to start, or exits while measured, is a crashed candidate (its reason kept), never the
end of the search.
`on_run(candidate, repetition, run, bodies)` sees each run's requests as they came back (and
how many bodies it had: the verdict's looks follow from it), for a record that the verdict can
be judged again from.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from onboarding.common.errors import ConfigError, OnboardingError
from onboarding.common.refs import VariantRef
from onboarding.serving.config_search import Candidate, Measured, SearchResult, search
from onboarding.serving.prompts import synthetic_prompts
from onboarding.serving.rate_verdict import (
    NOT_MET,
    RateSlo,
    RateVerdict,
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

    @classmethod
    def of(cls, scenario, sweep, template) -> Traffic:
        """A scenario's shapes with the profile's sweep settings and the engine's token count."""
        return cls(scenario.input_tokens, scenario.output_tokens, scenario.prefix_tokens,
                   sweep.warmup_requests, sweep.request_timeout_s,
                   template.load_generator.count_tokens_by)


def rate_bodies(tokenizer, served_name: str, traffic: Traffic, key: str, n: int
                ) -> list[bytes]:
    """`n` request bodies of the traffic's shapes, seeded by `key`: no two runs (and no sweep
    point) send the same prompt, which the prefix cache would serve."""
    prompts = synthetic_prompts(tokenizer, n, traffic.input_tokens, traffic.prefix_tokens,
                                seed=zlib.crc32(key.encode()))
    return completion_bodies(served_name, prompts, traffic.output_tokens,
                             count_tokens_by=traffic.count_tokens_by)


def runs_at_rate(loadgen: LoadGenerator, base_url: str, served_name: str, tokenizer,
                 traffic: Traffic, slo: Slo, rate: RateSlo, key: str,
                 log: Callable[[str], None] = print,
                 after_run: Callable[[int, PointRun, list[RateVerdict]], str] | None = None
                 ) -> tuple[list[RateVerdict], str]:
    """Up to `rate.repeats` runs of Poisson arrivals at the target rate on a running engine,
    fresh prompts each (`key` seeds them); and why it stopped before `repeats` ("" when all
    ran). After each run `after_run(i, run, runs)` may give a reason to stop; a run decided "not
    met" ends it too (the outcome is then not met whatever follows)."""
    per_run = requests_for(rate)
    runs: list[RateVerdict] = []
    for i in range(rate.repeats):
        warm = rate_bodies(tokenizer, served_name, traffic, f"{key}/warm",
                           traffic.warmup_requests) if i == 0 else ()
        run, v = measure_at_rate(
            loadgen, base_url, rate_bodies(tokenizer, served_name, traffic, f"{key}/{i}", per_run),
            slo, rate, seed=i, request_timeout_s=traffic.request_timeout_s, warmup_bodies=warm)
        runs.append(v)
        log(f"  run {i + 1}/{rate.repeats} at {rate.target_rate_rps:g} req/s: {v.says()} "
            f"(stopped: {run.stopped})")
        if after_run is not None and (why := after_run(i, run, runs)):
            return runs, why
        if v.outcome == NOT_MET:
            return runs, f"repetition {i + 1} not met (n={v.n}): not repeated"
    return runs, ""


def verdict_at_rate(loadgen: LoadGenerator, base_url: str, served_name: str, tokenizer,
                    traffic: Traffic, slo: Slo, rate: RateSlo, key: str,
                    log: Callable[[str], None] = print) -> RepeatedVerdict:
    """The rate verdict on a running engine (`runs_at_rate`'s runs, combined)."""
    runs, _ = runs_at_rate(loadgen, base_url, served_name, tokenizer, traffic, slo, rate, key,
                           log)
    return combine(runs, rate.confidence)


def candidate_cost_s(rate: RateSlo, start_s: float) -> float:
    """The most one candidate can take: an engine start and `repeats` runs to `max_seconds`."""
    return start_s + rate.repeats * rate.max_seconds


def _one_per(given, needed: set[str], node_type: str, what: str, fix: str) -> dict | None:
    """`given` as a name -> value mapping when it is one (None: one value serves every
    candidate), refusing before anything starts when a name the candidates need is missing."""
    if not isinstance(given, Mapping):
        return None
    missing = sorted(needed - set(given))
    if missing:
        raise ConfigError(f"search on {node_type}", f"{what} for {', '.join(missing)} (given: "
                          f"{', '.join(sorted(given)) or 'none'})", fix)
    return dict(given)


def run_search(engine, loadgen: LoadGenerator, variant: VariantRef | Mapping[str, VariantRef],
               cands: list[Candidate], basis: str, slo: Slo, rate: RateSlo, traffic: Traffic,
               tokenizer, budget_s: float, start_s: float, notes: tuple[str, ...] = (),
               min_margin: float = 0.0,
               log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
               on_run: Callable[[Candidate, int, PointRun, int], None] | None = None
               ) -> SearchResult:
    """`variant`: the weights every candidate serves, or one per precision where candidates
    differ in precision; `engine`: the `Engine` resource that starts every candidate, or one
    per engine name where candidates differ in engine (each candidate's must be there, checked
    before anything starts)."""
    node_type = cands[0].config.node_type if cands else "?"
    per_run = requests_for(rate)
    engines = _one_per(engine, {c.config.engine for c in cands}, node_type, "no engine at hand",
                       "Give an installed engine per engine the candidates run, or leave those "
                       "engines out of the search.")
    variants = _one_per(variant, {c.config.precision for c in cands}, node_type,
                        "no weights", "Give a variant per precision the candidates serve, or "
                        "leave those precisions out of the search.")

    def measure(c: Candidate, bar: float) -> Measured:
        t0 = clock()
        runs: list[RateVerdict] = []
        crashed = ""
        log(f"search on {node_type}: {c.label} ({c.config.hash})")
        try:
            weights = variants[c.config.precision] if variants is not None else variant
            starter = engines[c.config.engine] if engines is not None else engine
            with starter.serve(weights, c.config) as running:

                def after_run(i: int, run: PointRun, so_far: list[RateVerdict]) -> str:
                    nonlocal crashed
                    if on_run is not None:  # the run's requests, for a record of the search
                        on_run(c, i, run, per_run)
                    if running.exited({r.error: 1 for r in run.records if r.error}):
                        crashed = (f"engine exited (code {running.exit_code()}) during "
                                   f"repetition {i + 1}")
                        return crashed
                    now = Measured(combine(so_far)).headroom()
                    if so_far[-1].outcome != NOT_MET and i + 1 < rate.repeats and now >= bar:
                        return (f"after repetition {i + 1}: {now:.3f} of its bounds, at or past "
                                f"the {bar:.3f} it had to stay under to win (the best so far; "
                                f"the plan's runs less min_margin): not repeated")
                    return ""

                runs, stopped = runs_at_rate(loadgen, running.base_url, c.config.served_name,
                                             tokenizer, traffic, slo, rate, c.config.hash,
                                             log, after_run)
        except OnboardingError as exc:
            return Measured(combine(runs) if runs else None, crashed=str(exc)[:500],
                            seconds=clock() - t0)
        if crashed:
            return Measured(combine(runs), crashed=crashed, seconds=clock() - t0)
        return Measured(combine(runs, rate.confidence), stopped_early=stopped,
                        seconds=clock() - t0)

    return search(node_type, cands, measure, budget_s, candidate_cost_s(rate, start_s), basis,
                  clock=clock, notes=notes, min_margin=min_margin)
