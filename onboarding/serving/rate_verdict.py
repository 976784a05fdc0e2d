"""Is the SLO met at a production rate? An open-loop verdict, the way MLPerf Inference's server
scenario judges an LLM.

MLPerf's server scenario sends Poisson arrivals at a target rate for at least a minimum
duration (`*.Server.min_duration = 600000` ms) and judges the 99th percentile
(`*.Server.target_latency_percentile = 99`) of TTFT and of TPOT against the benchmark's bounds
(`llama2-70b.Server.ttft_latency = 2000`, `tpot_latency = 200`, in ms): mlcommons/inference
`loadgen/mlperf.conf` at commit 982b2063. Its early stopping (`loadgen/early_stopping.cc` at
commit 51a4a7ea) asks, from how many queries ran over a latency bound, what percentile the
run can still claim at a confidence.

Here, for each bound "the q-th percentile of X is at most L", every finished request either
ran over L or not (a failed request counts as over every bound: fail closed). With k over of
n, the one-sided Clopper-Pearson interval on the true share over L decides: its upper end at
most 1 - q: met; its lower end above 1 - q: not met; else undecided. A mean bound (the
catalog's mean ITL) is judged by a t-interval on the per-request mean gap, and the error rate
the same binomial way as a percentile. The verdict is met only when every bound is met, not
met when any is not met, undecided otherwise, and it always says n.

The load generator looks at the verdict while it runs (every `look_every` finished requests)
and stops sending once it is decided. Each look is judged at `alpha / looks` (Bonferroni over
the most looks a run can make, the final judgement included), so looking often does not make
a wrong verdict likelier.
Repeated runs (other seeds) give each statistic an interval over the runs (`repeat_interval`).
Pure functions: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as sps

from onboarding.serving.stats import RequestRecord, Slo, within

MET, NOT_MET, UNDECIDED = "met", "not met", "undecided"


@dataclass(frozen=True, kw_only=True)
class RateSlo:
    """What the rate verdict judges at one node type (configs/search.yaml `rate_verdict`)."""

    target_rate_rps: float
    ttft_p_s: float  # TTFT bound at `percentile`
    tpot_p_ms: float  # TPOT bound at `percentile`
    percentile: float = 99.0
    confidence: float = 0.95
    min_requests: int = 50
    min_seconds: float = 0.0
    max_seconds: float = 600.0
    look_every: int = 10
    repeats: int = 3

    def __post_init__(self) -> None:
        if not self.target_rate_rps > 0:
            raise ValueError(f"target_rate_rps={self.target_rate_rps}: must be > 0")
        if not 50 <= self.percentile < 100:
            raise ValueError(f"percentile={self.percentile}: must be in [50, 100)")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence={self.confidence}: must be in [0.5, 1)")
        if self.min_requests < 1 or self.look_every < 1 or self.repeats < 1:
            raise ValueError("min_requests, look_every and repeats must be >= 1")


@dataclass(frozen=True)
class Bound:
    """One bound of the verdict: `stat` ("p99", "p95" or "mean") of `metric` at most `limit`."""

    metric: str  # "ttft_s" | "tpot_ms"
    stat: str
    limit: float
    source: str  # "rate" (configs/search.yaml) or "catalog" (the model's SLO, gates.yaml)

    @property
    def name(self) -> str:
        return f"{self.metric.split('_')[0]}_{self.stat}"

    @property
    def quantile(self) -> float | None:
        return float(self.stat[1:]) / 100 if self.stat.startswith("p") else None


def bounds(slo: Slo, rate: RateSlo) -> list[Bound]:
    """The rate's percentile bounds on TTFT and TPOT, and the catalog's TTFT p95 and mean ITL
    (judged on TPOT: per request, the mean gap between its tokens)."""
    pct = f"p{rate.percentile:g}"
    return [Bound("ttft_s", pct, rate.ttft_p_s, "rate"),
            Bound("tpot_ms", pct, rate.tpot_p_ms, "rate"),
            Bound("ttft_s", "p95", slo.ttft_p95_s, "catalog"),
            Bound("tpot_ms", "mean", slo.itl_mean_ms, "catalog")]


def _value(rec: RequestRecord, metric: str) -> float | None:
    if metric == "ttft_s":
        return rec.ttft_s
    t = rec.tpot_s
    return None if t is None else t * 1e3


@dataclass(frozen=True, kw_only=True)
class BoundVerdict:
    bound: Bound
    outcome: str
    n: int  # requests judged (failed ones included for a percentile, as over the bound)
    estimate: float  # the statistic measured (nan when nothing finished)
    low: float  # interval on the share over the bound (percentile) or on the mean
    high: float
    over: int = 0  # requests over the bound (percentile bounds)

    def says(self) -> str:
        b = self.bound
        unit = b.metric.rsplit("_", 1)[1]
        if b.quantile is not None:
            return (f"{b.name} {self.estimate:.4g} {unit} vs {b.limit:g} {unit}: {self.outcome} "
                    f"({self.over} of n={self.n} over; share over in [{self.low:.3f}, "
                    f"{self.high:.3f}], allowed {1 - b.quantile:.3f})")
        return (f"{b.name} {self.estimate:.4g} {unit} vs {b.limit:g} {unit}: {self.outcome} "
                f"(in [{self.low:.4g}, {self.high:.4g}], n={self.n})")


def _t_half_width(values: Sequence[float], quantile: float) -> float:
    """Student's t half-width of the mean of `values` (two or more) at `quantile`."""
    n = len(values)
    return float(sps.t.ppf(quantile, n - 1)) * float(np.std(values, ddof=1)) / math.sqrt(n)


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """One-sided bounds at `alpha` each side on a binomial share, k of n."""
    if n == 0:
        return 0.0, 1.0
    low = 0.0 if k == 0 else float(sps.beta.ppf(alpha, k, n - k + 1))
    high = 1.0 if k == n else float(sps.beta.ppf(1 - alpha, k + 1, n - k))
    return low, high


def judge_bound(bound: Bound, records: Sequence[RequestRecord], alpha: float) -> BoundVerdict:
    values = [v for r in records if r.ok and (v := _value(r, bound.metric)) is not None]
    if (q := bound.quantile) is not None:
        # a failed request, or one too short for a TPOT, is over the bound: never in its favour
        n = len(records) if bound.metric == "ttft_s" else len(
            [r for r in records if not r.ok or _value(r, bound.metric) is not None])
        over = n - sum(v <= bound.limit for v in values)
        low, high = clopper_pearson(over, n, alpha)
        allowed = 1 - q
        outcome = (UNDECIDED if n == 0 else MET if high <= allowed
                   else NOT_MET if low > allowed else UNDECIDED)
        est = float(np.percentile(values, q * 100)) if values else math.nan
        return BoundVerdict(bound=bound, outcome=outcome, n=n, estimate=est, low=low, high=high,
                            over=over)
    n = len(values)
    if n < 2:
        return BoundVerdict(bound=bound, outcome=UNDECIDED, n=n,
                            estimate=values[0] if values else math.nan,
                            low=-math.inf, high=math.inf)
    mean, half = float(np.mean(values)), _t_half_width(values, 1 - alpha)
    low, high = mean - half, mean + half
    outcome = MET if high <= bound.limit else NOT_MET if low > bound.limit else UNDECIDED
    return BoundVerdict(bound=bound, outcome=outcome, n=n, estimate=mean, low=low, high=high)


@dataclass(frozen=True, kw_only=True)
class RateVerdict:
    outcome: str
    n: int  # requests judged
    failed: int
    bounds: tuple[BoundVerdict, ...]
    error_outcome: str = MET
    alpha: float = 0.05
    good: int = 0  # requests inside every bound's limit (a failed one never is)
    span_s: float = math.nan  # first send to last finish of the judged requests

    @property
    def goodput_rps(self) -> float:
        """Requests inside every bound per second of the run: what serves users at the SLO.
        At a rate the configuration cannot keep up with, the queue stretches the span and
        pushes requests over their TTFT bound, so this falls below the offered rate."""
        return self.good / self.span_s if self.span_s > 0 else math.nan

    def says(self) -> str:
        why = "; ".join(b.says() for b in self.bounds)
        errs = f"; errors {self.failed} of n={self.n}: {self.error_outcome}"
        good = (f"; {self.good} of n={self.n} inside every bound, goodput "
                f"{self.goodput_rps:.3g} req/s" if self.n else "")
        return f"{self.outcome} (n={self.n}): {why}{errs}{good}"

    def stat(self, name: str) -> BoundVerdict:
        return next(b for b in self.bounds if b.bound.name == name)

    def row(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {"verdict": self.outcome, "n": self.n,
                                             "failed": self.failed}
        for b in self.bounds:
            out[f"{b.bound.name}_{b.bound.metric.rsplit('_', 1)[1]}"] = b.estimate
        out["goodput_rps"] = self.goodput_rps
        return out


def span_s(records: Sequence[RequestRecord]) -> float:
    ends = [r.start_s + r.e2e_s for r in records if r.e2e_s is not None]
    return max(ends) - min(r.start_s for r in records) if ends else math.nan


def judge(records: Sequence[RequestRecord], slo: Slo, rate: RateSlo, looks: int = 1
          ) -> RateVerdict:
    """The verdict on the finished requests so far; `looks`: how many looks the run may make
    in all (each judged at alpha / looks)."""
    alpha = (1 - rate.confidence) / max(looks, 1)
    all_bounds = bounds(slo, rate)
    verdicts = tuple(judge_bound(b, records, alpha) for b in all_bounds)
    n = len(records)
    failed = sum(not r.ok for r in records)
    if slo.error_rate_max <= 0:
        err = NOT_MET if failed else MET
    else:
        low, high = clopper_pearson(failed, n, alpha)
        err = (UNDECIDED if n == 0 else MET if high <= slo.error_rate_max
               else NOT_MET if low > slo.error_rate_max else UNDECIDED)
    outcomes = [v.outcome for v in verdicts] + [err]
    outcome = (NOT_MET if NOT_MET in outcomes else MET if all(o == MET for o in outcomes)
               else UNDECIDED)
    # inside every bound: the tightest TTFT and TPOT limits, read per request (the catalog's
    # mean-ITL bound too, as the serving benchmark's goodput reads it)
    good = sum(within(r, min(b.limit for b in all_bounds if b.metric == "ttft_s"),
                      min(b.limit for b in all_bounds if b.metric == "tpot_ms"))
               for r in records)
    return RateVerdict(outcome=outcome, n=n, failed=failed, bounds=verdicts, error_outcome=err,
                       alpha=alpha, good=good, span_s=span_s(records))


def max_looks(n_bodies: int, rate: RateSlo) -> int:
    """The most looks a run of `n_bodies` can make: one every `look_every` finished requests
    while it sends, and the judgement on every request once it is over."""
    return math.ceil(n_bodies / rate.look_every) + 1


def requests_for(rate: RateSlo) -> int:
    """Bodies to prepare for one run: enough for `max_seconds` at the target rate (with room for
    a Poisson count's spread), and never fewer than the minimum."""
    expected = rate.target_rate_rps * rate.max_seconds
    return max(rate.min_requests, math.ceil(expected + 4 * math.sqrt(expected) + 10))


def requests_to_meet(rate: RateSlo, catalog_percentile: float = 95.0) -> int:
    """The fewest requests that can show every percentile bound met (none over any), at the
    alpha each look is judged at: a run that cannot reach it can only end "undecided"."""
    alpha = (1 - rate.confidence) / max_looks(requests_for(rate), rate)
    return max(math.ceil(math.log(alpha) / math.log(q / 100))
               for q in (rate.percentile, catalog_percentile))


# ---- repeated runs ----

@dataclass(frozen=True)
class Interval:
    """A statistic over repeated runs: the runs' mean and its two-sided t-interval at
    `confidence` (over runs, each with its own n), and each run's value."""

    name: str
    runs: tuple[float, ...]
    ns: tuple[int, ...]
    mean: float
    low: float
    high: float

    def says(self, unit: str = "") -> str:
        return (f"{self.name} {self.mean:.4g}{unit} [{self.low:.4g}, {self.high:.4g}] over "
                f"{len(self.runs)} runs (n={'/'.join(map(str, self.ns))})")


def repeat_interval(name: str, runs: Sequence[RateVerdict], confidence: float = 0.95
                    ) -> Interval:
    values = [r.stat(name).estimate for r in runs]
    ns = tuple(r.stat(name).n for r in runs)
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return Interval(name, tuple(values), ns, math.nan, math.nan, math.nan)
    mean = float(np.mean(finite))
    if len(finite) < 2:
        return Interval(name, tuple(values), ns, mean, -math.inf, math.inf)
    half = _t_half_width(finite, 0.5 + confidence / 2)
    return Interval(name, tuple(values), ns, mean, mean - half, mean + half)


@dataclass(frozen=True)
class RepeatedVerdict:
    """Several runs at the same rate: met only when every run is met, not met when any run is
    not met, else undecided."""

    outcome: str
    runs: tuple[RateVerdict, ...]
    intervals: tuple[Interval, ...] = field(default=())

    @property
    def n(self) -> int:
        return sum(r.n for r in self.runs)

    @property
    def good(self) -> int:
        return sum(r.good for r in self.runs)

    @property
    def goodput_rps(self) -> float:
        """The runs' mean goodput (requests inside every bound per second)."""
        values = [g for r in self.runs if not math.isnan(g := r.goodput_rps)]
        return float(np.mean(values)) if values else math.nan

    def says(self) -> str:
        per = ", ".join(f"{r.outcome} (n={r.n})" for r in self.runs)
        ivs = "; ".join(i.says() for i in self.intervals)
        return f"{self.outcome} over {len(self.runs)} runs [{per}]; {ivs}"


def combine(runs: Sequence[RateVerdict], confidence: float = 0.95) -> RepeatedVerdict:
    if not runs:
        raise ValueError("no run to combine")
    outcomes = [r.outcome for r in runs]
    outcome = (NOT_MET if NOT_MET in outcomes else MET if all(o == MET for o in outcomes)
               else UNDECIDED)
    names = [b.bound.name for b in runs[0].bounds]
    return RepeatedVerdict(outcome, tuple(runs),
                           tuple(repeat_interval(n, runs, confidence) for n in names))
