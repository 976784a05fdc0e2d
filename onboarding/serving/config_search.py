"""The measured search for the deployed configuration of one model on one node type.

The plan gives one configuration by rule (`--max-num-seqs` from the SLO's target concurrency,
the engine's default batch budget). The search measures a few around it and deploys the best
one measured at the SLO:

- Candidates: the plan's configuration and its grid over `max_num_seqs` x
  `max_num_batched_tokens` x `api_server_count` (configs/search.yaml `search`; more API
  servers where a point is frontend-bound, onboarding/serving/frontend.py); the same from
  each other start the caller gives (the plan's configuration at another precision the gate
  passed, or another TP that fits: serving_plan.search_bases; the plan's configuration in
  another engine template: serving_plan.engine_bases), every other setting as planned. A pair
  the engine refuses is left out and said (`max_num_batched_tokens` below `max_num_seqs`;
  below `max_model_len` without chunked prefill; an API-server count for an engine without
  the flag).
- Order: by a prediction where one is given (`predicted`, lower is better, e.g. a calibrated
  TTFT p99 at the target rate), else by the stated `RULE`. At most `max_candidates`.
- Each candidate is measured by the caller's `measure` (the rate verdict at the target rate,
  repeated), which is told the bar a run must stay under to win (`win_bar`: the best so far's
  worst run, and, once the plan's configuration met the SLO, every run of the plan's less
  `min_margin`): it stops a candidate once one run is past it (a run decided "not met" is not
  repeated either).
- Budget: minutes per node type, engine starts included; a budget shorter than the estimated
  cost of one candidate is an error, and no candidate starts that would end past it.
- A candidate whose engine crashed (failed to start or died) is counted and the search goes on.
- The winner is the met candidate on the fewest GPUs (TP: the target rate is what one replica
  must hold, and GPUs are what it costs), then with the most headroom (the lowest worst ratio
  of measured to bound over the percentile bounds); a candidate on more GPUs than a met one is
  not measured. None met: `SearchFailed`, "not met by any of N
  candidates", with the best one's numbers (fails closed).
- A met plan's configuration is replaced only by a candidate on fewer GPUs, or on as many
  whose every run beat every run of the plan's by more than `min_margin` (`separated`: with a runs against b, a one-sided rank
  test at p = 1 / C(a + b, a), 0.05 at three runs each); a plan that was not met is replaced by
  any met candidate. Each row says its goodput at the SLO (requests inside every bound per
  second), the number a deployment serves users at.

Pure: the engine and the load generator are behind `measure`; the clock is injected.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onboarding.common.errors import ConfigError, OnboardingError
from onboarding.serving.engine_config import EngineConfig, render_params
from onboarding.serving.rate_verdict import MET, NOT_MET, RepeatedVerdict
from onboarding.serving.stack import EngineTemplate

RULE = ("the plan's configuration first (the baseline every winner is compared with); then "
        "max-num-seqs from the SLO's target concurrency upward (a slot for every request in "
        "flight at the target first, then headroom), the larger max-num-batched-tokens first "
        "at equal max-num-seqs (fewer prefill chunks per prompt), one API server before more, "
        "the plan's precision and TP before the others at equal numbers, and the plan's engine "
        "before another's")


class SearchFailed(OnboardingError):
    """No candidate met the SLO at the target rate: nothing is deployed by this search."""


@dataclass(frozen=True)
class Candidate:
    config: EngineConfig
    predicted: float | None = None  # lower is better (the predictor's basis), None: by RULE
    baseline: bool = False  # the plan's own configuration
    other_start: bool = False  # from another precision, TP or engine than the plan's
    other_engine: bool = False  # in another engine than the plan's (`candidates`)

    @property
    def label(self) -> str:
        servers = self.config.param("api_server_count")
        start = (f"{self.config.engine + ' ' if self.other_engine else ''}"
                 f"{self.config.precision} TP {self.config.tensor_parallel}, "
                 if self.other_start else "")
        return (f"{start}max_num_seqs={self.config.param('max_num_seqs', 'engine default')}, "
                f"max_num_batched_tokens="
                f"{self.config.param('max_num_batched_tokens', 'engine default')}"
                + (f", api_server_count={servers}" if servers is not None else ""))


@dataclass(frozen=True)
class Measured:
    """What `measure` returns for one candidate."""

    verdict: RepeatedVerdict | None  # None: the engine crashed before a verdict
    crashed: str = ""  # why (exit code, log tail), "" when it ran
    stopped_early: str = ""  # why fewer runs than planned ("" when all ran)
    seconds: float = 0.0

    def headroom(self) -> float:
        """The worst measured/bound ratio over the percentile bounds and runs (lower is better;
        < 1 means every percentile is inside its bound); inf when nothing was measured."""
        return max(self.run_headrooms(), default=math.inf)

    def run_headrooms(self) -> list[float]:
        """Each run's worst measured/bound ratio over the percentile bounds."""
        if self.verdict is None:
            return []
        return [max((b.estimate / b.bound.limit for b in run.bounds
                     if b.bound.quantile is not None and not math.isnan(b.estimate)),
                    default=0.0) for run in self.verdict.runs]


def separated(challenger: Measured, plan: Measured, min_margin: float) -> bool:
    """Every run of `challenger` below every run of `plan` by more than `min_margin` of the
    plan's best run: a lead that no single run of either decides."""
    c, p = challenger.run_headrooms(), plan.run_headrooms()
    return bool(c and p) and max(c) < min(p) * (1 - min_margin)


def win_bar(best: Measured | None, plan: Measured | None, min_margin: float) -> float:
    """The worst-run headroom a candidate must stay under to still win: below the best so far's
    (`search` keeps the lowest), and, where the plan's configuration met the SLO, below each of
    its runs by more than `min_margin` (`separated`); inf when nothing bars it yet. A run at or
    past the bar decides that the candidate cannot win, whatever its later runs measure."""
    bar = best.headroom() if best is not None else math.inf
    if plan is not None and plan.verdict is not None and plan.verdict.outcome == MET \
            and (runs := plan.run_headrooms()):
        bar = min(bar, min(runs) * (1 - min_margin))
    return bar


def rank_p(a: int, b: int) -> float:
    """One-sided p of a runs all ranking below b runs when both come from one distribution."""
    return 1 / math.comb(a + b, a)


@dataclass(frozen=True)
class SearchRow:
    candidate: Candidate
    measured: Measured | None  # None: skipped (budget)
    skipped: str = ""

    def row(self) -> dict[str, Any]:
        c, m = self.candidate.config, self.measured
        v = m.verdict if m else None
        out: dict[str, Any] = {
            "hash": c.hash, "engine": c.engine, "precision": c.precision,
            "tensor_parallel": c.tensor_parallel,
            "max_num_seqs": c.param("max_num_seqs"),
            "max_num_batched_tokens": c.param("max_num_batched_tokens", "default"),
            "api_server_count": c.param("api_server_count", 1),
            "baseline": self.candidate.baseline,
            "predicted": self.candidate.predicted if self.candidate.predicted is not None
            else "rule",
            "verdict": v.outcome if v else ("crashed" if m and m.crashed else "skipped"),
            "n": v.n if v else 0, "runs": len(v.runs) if v else 0,
            "headroom": round(m.headroom(), 4) if m and v else None,
            "goodput_rps": round(v.goodput_rps, 3) if v else None,
            "good": v.good if v else 0,
        }
        for iv in (v.intervals if v else ()):
            out[iv.name] = round(iv.mean, 4)
        out["note"] = self.skipped or (m.crashed if m else "") or (m.stopped_early if m else "")
        return out


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    node_type: str
    winner: EngineConfig
    baseline: EngineConfig
    rows: tuple[SearchRow, ...]
    basis: str  # "predicted" or the RULE
    margin: str  # how the winner beat the next best (or the baseline)
    crashed: int = 0
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())

    @property
    def measured(self) -> int:
        return sum(1 for r in self.rows if r.measured is not None)

    def table(self) -> list[dict[str, Any]]:
        return [{**r.row(), "chosen": r.candidate.config.hash == self.winner.hash}
                for r in self.rows]

    def winner_row(self) -> SearchRow:
        return next(r for r in self.rows if r.candidate.config.hash == self.winner.hash)


def with_batching(template: EngineTemplate, base: EngineConfig, max_num_seqs: int | None,
                  max_num_batched_tokens: int | None, api_server_count: int | None = None
                  ) -> EngineConfig:
    """`base` with these numbers, every other setting (and the hash's other inputs) kept; None
    keeps the base's. One API server (the engine's own default) is not written, so the grid
    without that axis keeps its hashes."""
    params = dict(base.params)
    if max_num_seqs is not None:
        params["max_num_seqs"] = max_num_seqs
    if max_num_batched_tokens is not None:
        params["max_num_batched_tokens"] = max_num_batched_tokens
    if api_server_count is not None and api_server_count != 1:
        params["api_server_count"] = api_server_count
    params = {k: v for k, v in params.items() if k not in base.dropped}
    servers = f", api_server_count={api_server_count}" if "api_server_count" in params else ""
    return dataclasses.replace(
        base, params=params, param_args=tuple(render_params(template, params)),
        notes=(*base.notes, (f"searched: max_num_seqs={max_num_seqs or 'engine default'}, "
               f"max_num_batched_tokens="
               f"{max_num_batched_tokens or 'engine default'}{servers}")))


def refused_pair(base: EngineConfig, seqs: int, tokens: int) -> str:
    """Why vLLM would refuse this pair at start ("" when it takes it)."""
    if tokens < seqs:
        return f"max_num_batched_tokens {tokens} < max_num_seqs {seqs}"
    chunked = base.param("enable_chunked_prefill", True)
    mml = base.max_model_len
    if not chunked and mml is not None and tokens < mml:
        return f"max_num_batched_tokens {tokens} < max_model_len {mml} without chunked prefill"
    return ""


def candidates(template: EngineTemplate, base: EngineConfig, max_num_seqs: Sequence[int],
               max_num_batched_tokens: Sequence[int], target_concurrency: int,
               max_candidates: int, predict: Callable[[EngineConfig], float | None] | None = None,
               api_server_count: Sequence[int] = (1,), starts: Sequence[EngineConfig] = (),
               templates: Mapping[str, EngineTemplate] | None = None
               ) -> tuple[list[Candidate], list[str], str]:
    """The plan's configuration first, then the grid in the predictor's order (when it predicts
    every candidate) or the RULE's, at most `max_candidates` in all; and what was left out.
    `starts`: the plan's configuration at other precisions and TPs (serving_plan.search_bases)
    and in other engines (serving_plan.engine_bases), each a candidate itself and a start of
    the same grid, after the plan's at equal numbers; a start in another engine has its numbers
    rendered by that engine's template (`templates`; `template` is the plan's engine's)."""
    left_out: list[str] = []
    wanted = sorted(set(api_server_count)) or [1]
    grid: list[EngineConfig] = []
    rank: dict[str, int] = {}  # hash -> which start it came from (0: the plan's)
    for i, start in enumerate([base, *starts]):
        tmpl = template if start.engine == base.engine else (templates or {}).get(start.engine)
        if tmpl is None:
            left_out.append(f"engine {start.engine}: no template given for it")
            continue
        servers = wanted
        if any(n != 1 for n in servers) and "api_server_count" not in tmpl.args:
            why = (f"api_server_count {[n for n in servers if n != 1]}: engine "
                   f"{start.engine} has no API-server count flag in configs/stack.yaml")
            if why not in left_out:
                left_out.append(why)
            servers = [1]
        if i and start.hash not in rank and start.hash != base.hash:
            rank[start.hash] = i
            grid.append(start)
        for seqs in max_num_seqs:
            for tokens in max_num_batched_tokens:
                if why := refused_pair(start, seqs, tokens):
                    if why not in left_out:
                        left_out.append(why)
                    continue
                for n in servers:
                    c = with_batching(tmpl, start, seqs, tokens, n)
                    if c.hash not in rank and c.hash != base.hash:
                        rank[c.hash] = i
                        grid.append(c)
    preds = {c.hash: predict(c) for c in grid} if predict else {}
    if grid and preds and all(p is not None for p in preds.values()):
        basis = "predicted"
        grid.sort(key=lambda c: preds[c.hash])
    else:
        basis = RULE
        preds = {}

        def rule(c: EngineConfig) -> tuple:
            seqs = c.max_num_seqs or 0
            return (seqs < target_concurrency, seqs, -(c.param("max_num_batched_tokens") or 0),
                    c.param("api_server_count", 1), rank[c.hash])
        grid.sort(key=rule)
    out = [Candidate(base, predict(base) if basis == "predicted" and predict else None, True)]
    out += [Candidate(c, preds.get(c.hash), other_start=rank[c.hash] > 0,
                      other_engine=c.engine != base.engine) for c in grid]
    if len(out) > max_candidates:
        left_out.append(f"{len(out) - max_candidates} beyond max_candidates={max_candidates}")
    return out[:max_candidates], left_out, basis


def search(node_type: str, cands: Sequence[Candidate],
           measure: Callable[[Candidate, float], Measured], budget_s: float,
           cost_s: float, basis: str, clock: Callable[[], float] = time.monotonic,
           notes: Sequence[str] = (), min_margin: float = 0.0) -> SearchResult:
    """Measure the candidates in order within `budget_s` (`cost_s`: the estimated seconds of
    one candidate, engine start included), then pick the winner (see the module); `measure`
    is given `win_bar`, so it can stop a candidate that cannot win. A candidate
    replaces a met plan's configuration only when its headroom is lower by more than
    `min_margin` (a share of the plan's): a difference inside run-to-run noise keeps the plan's
    configuration, and says so."""
    if not cands:
        raise ConfigError(f"search on {node_type}", "no candidate", "Check configs/search.yaml.")
    if cost_s > budget_s:
        raise ConfigError(
            f"search on {node_type}", f"the budget ({budget_s / 60:.1f} min) is less than one "
            f"candidate (about {cost_s / 60:.1f} min: an engine start and the rate verdict's "
            f"runs)", "Raise configs/search.yaml search.budget_minutes, or lower "
            "rate_verdict.max_seconds / repeats for this node type.")
    start = clock()
    rows: list[SearchRow] = []
    best: tuple[Candidate, Measured] | None = None
    crashed = 0
    for c in cands:
        tp = c.config.tensor_parallel
        if best is not None and tp > best[0].config.tensor_parallel:
            rows.append(SearchRow(c, None, f"not measured: TP {tp} takes more GPUs than "
                                  f"{best[0].label}, which met the SLO on "
                                  f"{best[0].config.tensor_parallel}"))
            continue
        if clock() - start + cost_s > budget_s:
            rows.append(SearchRow(c, None, f"budget: {budget_s / 60:.1f} min would be passed"))
            continue
        plan = next((r for r in rows if r.candidate.baseline), None)
        m = measure(c, win_bar(
            best[1] if best and best[0].config.tensor_parallel == tp else None,
            plan.measured if plan and plan.candidate.config.tensor_parallel == tp else None,
            min_margin))
        rows.append(SearchRow(c, m))
        if m.crashed:
            crashed += 1
            continue
        if m.verdict is not None and m.verdict.outcome == MET and (
                best is None or (tp, m.headroom())
                < (best[0].config.tensor_parallel, best[1].headroom())):
            best = (c, m)
    elapsed = clock() - start
    measured = [r for r in rows if r.measured is not None and r.measured.verdict is not None]
    if best is None:
        tried = sum(1 for r in rows if r.measured is not None)
        closest = min(measured, key=lambda r: (r.measured.verdict.outcome == NOT_MET,
                                               r.measured.headroom()), default=None)
        said = (f"; the best, {closest.candidate.label} ({closest.candidate.config.hash}): "
                f"{closest.measured.verdict.says()}" if closest else "")
        raise SearchFailed(
            f"search on {node_type}", f"the SLO at the target rate was not met by any of "
            f"{tried} candidates ({crashed} crashed){said}",
            "Lower the target rate or relax the bounds only if the product allows it; else a "
            "larger node type, another precision or more replicas.")
    winner_c, winner_m = best
    base_row = next((r for r in rows if r.candidate.baseline), None)
    kept = ""
    if base_row is not None and base_row.candidate is not winner_c and base_row.measured \
            and base_row.measured.verdict is not None \
            and base_row.measured.verdict.outcome == MET \
            and winner_c.config.tensor_parallel == base_row.candidate.config.tensor_parallel \
            and not separated(winner_m, base_row.measured, min_margin):
        kept = (f"{winner_c.label}'s runs ({_runs(winner_m)}) did not all beat every run of the "
                f"plan's ({_runs(base_row.measured)}) by more than min_margin={min_margin:g}: "
                "the plan's configuration kept")
        winner_c, winner_m = base_row.candidate, base_row.measured
    others = sorted((r for r in measured if r.candidate.config.hash != winner_c.config.hash),
                    key=lambda r: r.measured.headroom())
    runner = others[0] if others else None
    margin = _margin(winner_c, winner_m, runner, base_row if not kept else None) + (
        f"; {kept}" if kept else "")
    return SearchResult(node_type=node_type, winner=winner_c.config, baseline=cands[0].config,
                        rows=tuple(rows), basis=basis, margin=margin, crashed=crashed,
                        seconds=elapsed, notes=tuple(notes))


def _margin(wc: Candidate, wm: Measured, runner: SearchRow | None, base: SearchRow | None
            ) -> str:
    w = wm.headroom()
    parts = [(f"winner {wc.label}: worst percentile at {w:.3f} of its bound, goodput "
              f"{wm.verdict.goodput_rps:.3g} req/s at the SLO "
              f"({wm.verdict.says() if wm.verdict else ''})")]
    if runner is not None:
        r = runner.measured
        parts.append(f"next best {runner.candidate.label}: {r.headroom():.3f} "
                     f"({r.verdict.outcome}, n={r.verdict.n})")
    if base is not None and base.candidate is not wc:
        b = base.measured
        if b is not None and b.verdict is not None:
            how = ""
            wtp, btp = wc.config.tensor_parallel, base.candidate.config.tensor_parallel
            if b.verdict.outcome == MET and wtp < btp:
                how = f"; the winner met the SLO on {wtp} GPU(s) a replica, the plan's on {btp}"
            elif b.verdict.outcome == MET:
                a, n = len(wm.run_headrooms()), len(b.run_headrooms())
                how = (f"; every one of its {a} runs ahead of every one of the plan's {n} "
                       f"(one-sided rank test p = {rank_p(a, n):.3g})")
            parts.append(f"the plan's configuration: {b.headroom():.3f} ({b.verdict.outcome}, "
                         f"n={b.verdict.n}, goodput {b.verdict.goodput_rps:.3g} req/s){how}")
        else:
            parts.append("the plan's configuration: not measured"
                         + (f" ({b.crashed})" if b and b.crashed else ""))
    elif base is not None:
        parts.append("the plan's configuration was already the best")
    return "; ".join(parts)


def _runs(m: Measured) -> str:
    return ", ".join(f"{h:.3f}" for h in m.run_headrooms())
