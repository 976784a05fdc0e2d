"""Statistics of a serving benchmark, defined as vLLM's `benchmarks/serve` defines them.

- Tokens are counted per token, as the engine counts them: the client asks for vLLM's
  continuous usage stats (cumulative `completion_tokens` in every chunk), because a chunk can
  carry several tokens (vLLM merges a request's outputs when its API server lags) or a token
  with no text (a partial UTF-8 sequence). A server that sends usage only at the end is timed
  per text chunk, and the point says so (`itl_basis`).
- TTFT: request sent -> first chunk that carried a token. "Sent" is when the body left for
  the socket, not when the client decided to send: at high concurrency on few cores a client's
  own event loop queues requests for tens of ms, which is not the server's latency. That
  queueing is kept apart as `client_queue` so a loaded client is visible, not hidden.
- ITL: per token after the first, pooled over requests: a chunk's gap since the previous one is
  split evenly over the tokens it carried, so mean ITL = sum of gaps / (tokens - 1), the
  definition of the engine's `vllm:inter_token_latency_seconds`. Tokens beyond the first in the
  first chunk count as 0 gaps (their times cannot be seen).
- TPOT: (E2E - TTFT) / (n - 1) per request, n = output tokens from the server's `usage`.
- Throughputs over the point's wall time; errors counted by cause, never dropped.
Pure functions: the load generator produces `RequestRecord`s, everything else is here.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from onboarding.serving.kernels import KernelVerdict, StartKernels

PERCENTILES = (50, 90, 95, 99)

# The closed set of causes a failed request is counted under, each explained in docs/serving.md.
# `http_<status>` stands for every answer other than 200 (http_503, http_400, ...).
ERROR_CAUSES = ("http_<status>", "connect_failed", "connection_lost", "stream_dropped",
                "timeout", "malformed_sse", "server_error_event", "no_content", "bad_response",
                "client_error")
_HTTP_CAUSE = re.compile(r"http_[1-5][0-9][0-9]")


def is_documented_cause(cause: str | None) -> bool:
    return cause is not None and (cause in ERROR_CAUSES or bool(_HTTP_CAUSE.fullmatch(cause)))


@dataclass(kw_only=True)
class RequestRecord:
    """One request as the client saw it; times are seconds from the request's send."""

    ok: bool = False
    error: str | None = None  # a cause of ERROR_CAUSES
    detail: str | None = None  # what exactly happened (the exception, the error body), for logs
    start_s: float = 0.0  # send time relative to the point's start
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # one per token after the first
    content_chunks: int = 0  # chunks that carried a token (or text, without usage per chunk)
    stream_tokens: int = 0  # tokens counted as they arrived
    tokens_from_usage: bool = False  # counted from usage in every chunk, not one per text chunk
    prompt_tokens: int | None = None  # from the server's usage
    output_tokens: int | None = None  # from the server's usage
    client_queue_s: float | None = None  # decided to send -> body written to the socket

    @property
    def n_output(self) -> int:
        return self.output_tokens if self.output_tokens is not None else self.stream_tokens

    @property
    def tpot_s(self) -> float | None:
        n = self.n_output
        if not self.ok or self.ttft_s is None or self.e2e_s is None or n < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)


@dataclass(frozen=True)
class Dist:
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Dist:
        if len(values) == 0:
            nan = float("nan")
            return cls(nan, nan, nan, nan, nan)
        a = np.asarray(values, dtype=float)
        p = np.percentile(a, PERCENTILES)
        return cls(float(a.mean()), *(float(x) for x in p))

    def scaled(self, k: float) -> Dist:
        return Dist(*(v * k for v in asdict(self).values()))


@dataclass(frozen=True)
class Slo:
    """SLOs at one node type; see `configs/gates.yaml` section `slo`."""

    ttft_p95_s: float
    itl_mean_ms: float
    error_rate_max: float
    target_concurrency: int
    cold_start_p95_max_s: float | None = None


def parse_error_causes(text: object) -> dict[str, int]:
    """`connect_failed=3, no_content=1` (a table's `errors_by_cause`, as `PointStats.row`
    writes it) back to counts; empty or missing: none."""
    causes = "" if text is None else str(text)
    return {k.strip(): int(v) for k, _, v in (c.partition("=") for c in causes.split(","))
            if k.strip()}


@dataclass(frozen=True, kw_only=True)
class PointStats:
    """One load point (a concurrency or a request rate) of one scenario."""

    requests: int
    completed: int
    failed: int
    errors_by_cause: dict[str, int]
    duration_s: float
    request_throughput_rps: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    ttft_s: Dist
    itl_ms: Dist
    tpot_ms: Dist
    e2e_s: Dist
    goodput_rps: float | None = None
    client_queue_ms: Dist | None = None
    error_examples: dict[str, str] = field(default_factory=dict)  # cause -> one record's detail
    tokens_per_chunk: float = float("nan")  # > 1: the engine merged outputs into one chunk
    itl_basis: str = ""  # per token (usage in every chunk) or per text chunk; see itl_basis()

    @property
    def error_rate(self) -> float:
        return self.failed / self.requests if self.requests else 0.0

    def row(self) -> dict[str, float | int | str]:
        """Flat columns for a table: `ttft_p95_s`, `itl_mean_ms`, ..."""
        out: dict[str, float | int | str] = {
            "requests": self.requests, "completed": self.completed, "failed": self.failed,
            "error_rate": self.error_rate,
            "errors_by_cause": ", ".join(f"{k}={v}" for k, v in sorted(
                self.errors_by_cause.items())),
            "duration_s": self.duration_s,
            "request_throughput_rps": self.request_throughput_rps,
            "input_tokens_per_s": self.input_tokens_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "goodput_rps": self.goodput_rps if self.goodput_rps is not None else float("nan"),
            "tokens_per_chunk": self.tokens_per_chunk, "itl_basis": self.itl_basis,
        }
        if self.client_queue_ms is not None:
            out["client_queue_p50_ms"] = self.client_queue_ms.p50
            out["client_queue_p99_ms"] = self.client_queue_ms.p99
        for name, dist, unit in (("ttft", self.ttft_s, "s"), ("itl", self.itl_ms, "ms"),
                                 ("tpot", self.tpot_ms, "ms"), ("e2e", self.e2e_s, "s")):
            for stat, value in asdict(dist).items():
                out[f"{name}_{stat}_{unit}"] = value
        return out

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PointStats:
        """A point read back from its table row (`row()`, e.g. serving_benchmark.csv, where every
        value is text). What a row does not hold stays out: the client queue's mean and p90/p95
        (`client_queue_ms` None) and the error examples."""
        def num(key: str) -> float:
            text = row.get(key)
            return float(text) if text not in (None, "") else float("nan")

        def dist(name: str, unit: str) -> Dist:
            return Dist(*(num(f"{name}_{stat}_{unit}") for stat in ("mean", "p50", "p90", "p95",
                                                                     "p99")))

        errors = parse_error_causes(row.get("errors_by_cause"))
        goodput = num("goodput_rps")
        return cls(
            requests=int(num("requests")), completed=int(num("completed")),
            failed=int(num("failed")), errors_by_cause=errors, duration_s=num("duration_s"),
            request_throughput_rps=num("request_throughput_rps"),
            input_tokens_per_s=num("input_tokens_per_s"),
            output_tokens_per_s=num("output_tokens_per_s"),
            ttft_s=dist("ttft", "s"), itl_ms=dist("itl", "ms"), tpot_ms=dist("tpot", "ms"),
            e2e_s=dist("e2e", "s"), goodput_rps=None if math.isnan(goodput) else goodput,
            tokens_per_chunk=num("tokens_per_chunk"), itl_basis=str(row.get("itl_basis") or ""))


PER_TEXT_CHUNK = "per text chunk (the server sends usage only at the end)"


def itl_basis(ok: Sequence[RequestRecord]) -> str:
    """How the completed requests' ITL was counted: per token, or one token per text chunk
    (which reads a chunk of k tokens as one gap k times too long)."""
    if not ok:
        return ""
    per_token = sum(r.tokens_from_usage for r in ok)
    if per_token == len(ok):
        return "per token"
    if per_token == 0:
        return PER_TEXT_CHUNK
    return f"per token for {per_token} of {len(ok)} requests, the rest per text chunk"


def within(rec: RequestRecord, ttft_s: float, tpot_ms: float) -> bool:
    """One request inside a TTFT and a TPOT limit, what goodput counts: a failed request never
    is; one without a TPOT (a single output token) is held to its TTFT alone."""
    return rec.ok and rec.ttft_s is not None and rec.ttft_s <= ttft_s and (
        rec.tpot_s is None or rec.tpot_s * 1e3 <= tpot_ms)


def summarize(records: Sequence[RequestRecord], duration_s: float,
              slo: Slo | None = None) -> PointStats:
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    if undocumented := sorted({str(r.error) for r in failed if not is_documented_cause(r.error)}):
        raise ValueError(f"error causes {undocumented} are not in ERROR_CAUSES: the load "
                         "generator must map every failure to a documented cause")
    errors = Counter(r.error for r in failed)
    examples: dict[str, str] = {}
    for r in failed:
        examples.setdefault(r.error, r.detail or "")
    itl = [g for r in ok for g in r.itl_s]
    tpot = [t for r in ok if (t := r.tpot_s) is not None]
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    out_tokens = sum(r.n_output for r in ok)
    chunks = sum(r.content_chunks for r in ok)
    dur = duration_s if duration_s > 0 else float("nan")
    goodput = None
    if slo is not None:
        goodput = sum(within(r, slo.ttft_p95_s, slo.itl_mean_ms) for r in ok) / dur
    return PointStats(
        requests=len(records), completed=len(ok), failed=len(records) - len(ok),
        errors_by_cause=dict(errors), duration_s=duration_s,
        request_throughput_rps=len(ok) / dur,
        input_tokens_per_s=in_tokens / dur, output_tokens_per_s=out_tokens / dur,
        ttft_s=Dist.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl_ms=Dist.of(itl).scaled(1e3), tpot_ms=Dist.of(tpot).scaled(1e3),
        e2e_s=Dist.of([r.e2e_s for r in ok if r.e2e_s is not None]),
        goodput_rps=goodput,
        client_queue_ms=Dist.of([r.client_queue_s for r in records
                                 if r.client_queue_s is not None]).scaled(1e3),
        error_examples=examples,
        tokens_per_chunk=out_tokens / chunks if chunks else float("nan"),
        itl_basis=itl_basis(ok),
    )


def slo_violations(stats: PointStats, slo: Slo) -> list[str]:
    """Why a point misses the SLOs, with the numbers; empty when it meets them."""
    out = []
    if stats.completed == 0:
        out.append("no request completed")
    if not stats.ttft_s.p95 <= slo.ttft_p95_s:
        out.append(f"TTFT p95 {stats.ttft_s.p95:.3f} s > {slo.ttft_p95_s} s")
    if not stats.itl_ms.mean <= slo.itl_mean_ms:
        out.append(f"mean ITL {stats.itl_ms.mean:.1f} ms > {slo.itl_mean_ms} ms")
    if stats.error_rate > slo.error_rate_max:
        out.append(f"error rate {stats.error_rate:.2%} > {slo.error_rate_max:.2%}")
    return out


def saturation_concurrency(points: Iterable[tuple[int, PointStats]], slo: Slo) -> int:
    """Highest concurrency such that it and every lower measured one meet the SLOs; 0 if none.

    Requiring the whole prefix keeps one lucky high point from overstating capacity.
    """
    best = 0
    for conc, stats in sorted(points, key=lambda p: p[0]):
        if slo_violations(stats, slo):
            break
        best = conc
    return best


def nearest_point(points: Sequence[tuple[int, PointStats]], concurrency: int
                  ) -> tuple[int, PointStats] | None:
    """The measured point at `concurrency`, else the highest one below it (for throughput at a
    saturation point, never for an SLO verdict: see `point_at_or_above`)."""
    below = [p for p in points if p[0] <= concurrency]
    return max(below, key=lambda p: p[0]) if below else None


NOT_AT_TARGET = "not measured at target concurrency"


def point_at_or_above(points: Sequence[tuple[int, PointStats]], concurrency: int
                      ) -> tuple[int, PointStats] | None:
    """The measured point at `concurrency`, else the lowest one above it; None when the sweep
    stops below. Latency grows with load, so a point below the target cannot vouch for it."""
    above = [p for p in points if p[0] >= concurrency]
    return min(above, key=lambda p: p[0]) if above else None


# ---- Prometheus /metrics: a server-side cross-check of the client ----

def parse_metrics(text: str) -> dict[str, float]:
    """Sample name -> value summed over label sets (engines, models); `_created` dropped."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def histogram_mean_delta(before: dict[str, float], after: dict[str, float],
                         name: str) -> float | None:
    """Mean of the observations added between two scrapes (`_sum`/`_count` differences)."""
    count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    if count <= 0:
        return None
    return (after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)) / count


def counter_ratio_delta(before: dict[str, float], after: dict[str, float], part: str | None,
                        whole: str | None) -> float | None:
    """What counter `part` grew by between two scrapes over what counter `whole` grew by (a
    prefix cache's hits over its queries); None when a name is not given or `whole` did not
    grow."""
    if not part or not whole:
        return None
    grew = after.get(whole, 0.0) - before.get(whole, 0.0)
    if grew <= 0:
        return None
    return (after.get(part, 0.0) - before.get(part, 0.0)) / grew


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else math.nan


# ---- Results the plan stage reads (also emitted as metadata with these names) ----

START_KINDS = ("fully_cold", "cold_weights", "warm")
"""fully_cold: weights evicted and the engine's compile/kernel caches empty (a new pod on a
node that never ran this configuration); cold_weights: weights evicted, caches warm (a restart
after the page cache was dropped); warm: weights in the page cache."""


@dataclass(frozen=True, kw_only=True)
class LoadTimingResult:
    model: str
    precision: str  # the precision measured (the baseline's when it stood in)
    servable: bool
    reason: str  # why the serving variant is not servable here; "" when it is
    cold_start_p50_s: float | None = None  # fully cold
    cold_start_p95_s: float | None = None  # fully cold: what a new pod waits (probe basis)
    warm_start_p50_s: float | None = None
    weight_bytes: int = 0
    weights_load_gbps: float | None = None
    raw_read_gbps: float | None = None
    cold_weights_p50_s: float | None = None
    cold_weights_p95_s: float | None = None
    node_type: str = ""
    config_hash: str = ""
    random_weights: bool = False  # a performance twin: the starts read no weights
    cold_start_samples: int = 0  # fully cold starts behind cold_start_p95_s (its n)
    cold_start_max_s: float | None = None  # fully cold: the slowest start
    # the kernels each start chose, in the order of the starts, and the gate's reading of them
    # (onboarding/serving/kernels.py); () / None: not read (a result from before, or no start)
    kernels: tuple[StartKernels, ...] = ()
    kernel_verdict: KernelVerdict | None = None


@dataclass(frozen=True, kw_only=True)
class ServingBenchmarkResult:
    model: str
    precision: str
    node_type: str
    gpus: int
    servable: bool
    tokens_per_s_per_gpu: float
    saturation_concurrency: int
    slo_pass: bool
    slo_violations: tuple[str, ...] = ()
    config_hash: str = ""
    slo_blocking: bool = False  # judged as a blocking gate (gpu profile) or a warning (cpu)
    # at the point the SLO was judged (the target concurrency or the next above), the slowest
    # scenario's: what a gateway route's timeouts are sized from
    e2e_p99_s: float | None = None
    ttft_p99_s: float | None = None
    judged_at: int | None = None
    # the open-loop verdict at the node type's target rate ("" when the profile asks none)
    rate_verdict: str = ""
    rate_target_rps: float | None = None
    rate_n: int = 0
    rate_goodput_rps: float | None = None


THROUGHPUT_BASIS = "output tokens/s at each scenario's saturation concurrency (min over scenarios)"


def headline(model: str, precision: str, node_type: str, gpus: int, slo: Slo,
             points: dict[str, list[tuple[int, PointStats]]], by_concurrency: bool
             ) -> tuple[ServingBenchmarkResult, str, list[str]]:
    """A sweep's result, conservative across scenarios: the lowest saturation and the lowest
    tokens/s there. Returns (result, the throughput's basis, the SLO violations).

    SLOs are judged at the target concurrency, or the next measured point above it (named, not
    counted as a violation); a sweep with no point at or above the target is "not measured at
    target concurrency", a violation (latency grows with load).
    """
    violations: list[str] = []
    sats: list[int] = []
    tps: list[float] = []
    judged: list[tuple[int, PointStats]] = []
    basis = THROUGHPUT_BASIS
    for name, pts in points.items():
        if not by_concurrency:
            violations.append(f"{name}: rate mode has no concurrency to judge the SLOs at")
            continue
        sat = saturation_concurrency(pts, slo)
        sats.append(sat)
        at = nearest_point(pts, sat) if sat else None
        if at is None:
            at = min(pts, key=lambda p: p[0])
            basis = "lowest measured concurrency: no point met the SLOs"
        tps.append(at[1].output_tokens_per_s)
        target = point_at_or_above(pts, slo.target_concurrency)
        if target is None:
            violations.append(f"{name}: {NOT_AT_TARGET} {slo.target_concurrency} (highest "
                              f"point {max(p[0] for p in pts)})")
            continue
        if target[0] != slo.target_concurrency:
            violations.append(f"{name}: target concurrency {slo.target_concurrency} not in the "
                              f"sweep; judged at {target[0]}, the next point above")
        violations += [f"{name} @ {target[0]}: {v}" for v in slo_violations(target[1], slo)]
        judged.append(target)
    hard = [v for v in violations if "judged at" not in v]

    def slowest(values: list[float]) -> float | None:
        finite = [v for v in values if not math.isnan(v)]
        return max(finite) if finite else None

    result = ServingBenchmarkResult(
        model=model, precision=precision, node_type=node_type, gpus=gpus,
        servable=True, tokens_per_s_per_gpu=(min(tps) / max(gpus, 1)) if tps else 0.0,
        saturation_concurrency=min(sats) if sats else 0, slo_pass=not hard,
        slo_violations=tuple(violations),
        e2e_p99_s=slowest([p.e2e_s.p99 for _, p in judged]),
        ttft_p99_s=slowest([p.ttft_s.p99 for _, p in judged]),
        judged_at=max(c for c, _ in judged) if judged else None)
    return result, basis, violations


@dataclass(frozen=True, kw_only=True)
class StartSample:
    """One engine start of a kind in START_KINDS."""

    kind: str  # fully_cold | cold_weights | warm
    resident_fraction: float  # of the weight files, just before the start
    weights_loaded_s: float | None
    engine_weights_load_s: float | None
    health_ready_s: float | None
    first_token_s: float
    # fact -> values the start's log named (onboarding/serving/kernels.py); not a timing
    kernels: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    def describe(self) -> str:
        """The start for a log line: its phases in seconds, the page cache before it, the
        kernels it chose (the dataclass's repr printed unrounded floats and field names)."""
        def s(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f} s"

        phases = (f"weights loaded {s(self.weights_loaded_s)}"
                  + (f" (the engine says {s(self.engine_weights_load_s)})"
                     if self.engine_weights_load_s is not None else "")
                  + f", healthy {s(self.health_ready_s)}, first token {s(self.first_token_s)}")
        kernels = "; ".join(f"{k} {', '.join(v)}" for k, v in sorted(self.kernels.items()) if v)
        return (f"{phases}; {self.resident_fraction:.0%} of the weights in the page cache "
                "before it" + (f"; kernels: {kernels}" if kernels else ""))


def summarize_load_timing(model: str, precision: str, samples: Sequence[StartSample],
                          weight_bytes: int, raw_read_gbps: float | None) -> LoadTimingResult:
    """p50/p95 per kind of start; weight GB/s from the weight-cold starts' load phase.

    The load phase is the engine's own "weights took X s" when it logs one, else process start
    to that log line (which then includes interpreter and framework import time).
    """
    def firsts(kind: str) -> list[float]:
        return [s.first_token_s for s in samples if s.kind == kind]

    cold, cold_w, warm = firsts("fully_cold"), firsts("cold_weights"), firsts("warm")
    loads = [s.engine_weights_load_s if s.engine_weights_load_s else s.weights_loaded_s
             for s in samples if s.kind in ("fully_cold", "cold_weights")]
    loads = [x for x in loads if x]
    load_s = percentile(loads, 50) if loads else None
    return LoadTimingResult(
        model=model, precision=precision, servable=True, reason="",
        cold_start_p50_s=percentile(cold, 50) if cold else None,
        cold_start_p95_s=percentile(cold, 95) if cold else None,
        warm_start_p50_s=percentile(warm, 50) if warm else None,
        weight_bytes=weight_bytes,
        weights_load_gbps=weight_bytes / load_s / 1e9 if load_s and weight_bytes else None,
        raw_read_gbps=raw_read_gbps,
        cold_weights_p50_s=percentile(cold_w, 50) if cold_w else None,
        cold_weights_p95_s=percentile(cold_w, 95) if cold_w else None,
        cold_start_samples=len(cold), cold_start_max_s=max(cold) if cold else None,
    )
