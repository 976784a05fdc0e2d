"""Prometheus input series for `promtool test rules`, shaped from what real runs recorded.

- An H200 sweep point (tests/data/gpu/h200/serving_benchmark.csv): the engine's own peaks over
  the point as its /metrics said (`peak_running`, `peak_waiting`, `peak_kv_cache_usage`), the TTFT
  distribution (p50/p90/p95/p99) laid into the engine's histogram buckets, and the mean ITL over
  the output tokens per second, each held for the test's length.
- The CPU engine's /metrics before and after one point (tests/data/operations/cpu-engine/,
  bench/record_engine_metrics.py): every histogram bucket, sum and count grows at the rate it
  grew between the two scrapes, the gauges stay at their recorded values.

The bucket bounds are the ones the real engine exposed in that scrape, never chosen here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.stack import MetricNames

CPU_SCRAPES = PROJECT_ROOT / "tests" / "data" / "operations" / "cpu-engine"


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def _series(name: str, labels: Mapping[str, str], values: list[float]) -> dict[str, str]:
    return {"series": f"{name}{{{_labels(labels)}}}",
            "values": " ".join(f"{v:.6g}" for v in values)}


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if not s.name.endswith("_created")]


def recorded_buckets(histogram: str) -> list[float]:
    """The bucket bounds (+Inf last) of `histogram` in the recorded CPU engine scrape."""
    les = sorted({float(lbl["le"]) for name, lbl, _ in samples(
        (CPU_SCRAPES / "metrics-after.prom").read_text()) if name == f"{histogram}_bucket"})
    if not les:
        raise AssertionError(f"{histogram}_bucket is not in the recorded scrape")
    return les


def _le(v: float) -> str:
    return "+Inf" if v == float("inf") else f"{v:g}"


def sweep_point_series(row: Mapping[str, str], m: MetricNames, labels: Mapping[str, str],
                       minutes: int, *, running: float | None = None,
                       waiting: float | None = None, kv_usage: float | None = None,
                       up: float = 1.0) -> list[dict[str, str]]:
    """One recorded sweep point held for `minutes` at one sample a minute. The keyword
    arguments replace a recorded gauge (an injected breach no recording reached)."""
    rps = float(row["request_throughput_rps"])
    qs = [float(row[f"ttft_{p}_s"]) for p in ("p50", "p90", "p95", "p99")]
    # the recorded quantiles as a cumulative distribution: linear between them, all requests
    # done by the p99 (the recording has no maximum)
    xs, ys = [0.0, *qs], [0.0, 0.50, 0.90, 0.95, 0.99]
    per_min = rps * 60
    out = []
    for le in recorded_buckets(m.ttft_histogram):
        frac = 1.0 if le >= qs[-1] else float(np.interp(le, xs, ys))
        out.append(_series(f"{m.ttft_histogram}_bucket", {**labels, "le": _le(le)},
                           [per_min * frac * k for k in range(minutes)]))
    tokens_per_min = float(row["output_tokens_per_s"]) * 60
    itl_s = float(row["itl_mean_ms"]) / 1e3
    out += [_series(f"{m.itl_histogram}_count", labels,
                    [tokens_per_min * k for k in range(minutes)]),
            _series(f"{m.itl_histogram}_sum", labels,
                    [tokens_per_min * itl_s * k for k in range(minutes)])]
    gauges = ((m.running, float(row["peak_running"]) if running is None else running),
              (m.waiting, float(row["peak_waiting"]) if waiting is None else waiting),
              (m.kv_cache_usage, float(row["peak_kv_cache_usage"]) if kv_usage is None
               else kv_usage))
    out += [_series(name, labels, [value] * minutes) for name, value in gauges]
    out.append(_series("up", {k: v for k, v in labels.items() if k not in ("model_name",
                                                                           "engine")},
                       [up] * minutes))
    return out


def cpu_scrape_series(m: MetricNames, labels: Mapping[str, str], minutes: int,
                      duration_s: float, directory: Path = CPU_SCRAPES
                      ) -> list[dict[str, str]]:
    """The CPU engine's recorded point repeated: each histogram series grows per minute by what
    it grew between the two scrapes x 60 / the point's duration; the gauges as recorded after."""
    before = {(n, tuple(sorted(lbl.items()))): v for n, lbl, v in
              samples((directory / "metrics-before.prom").read_text())}
    after = samples((directory / "metrics-after.prom").read_text())
    out = []
    wanted_hist = {f"{h}_{s}" for h in (m.ttft_histogram, m.itl_histogram)
                   for s in ("bucket", "sum", "count")}
    for name, lbl, value in after:
        keep = {k: v for k, v in lbl.items() if k == "le"}
        if name in wanted_hist:
            grew = value - before.get((name, tuple(sorted(lbl.items()))), 0.0)
            per_min = grew * 60 / duration_s
            out.append(_series(name, {**labels, **keep}, [per_min * k for k in range(minutes)]))
        elif name in (m.running, m.waiting, m.kv_cache_usage):
            out.append(_series(name, labels, [value] * minutes))
    out.append(_series("up", {k: v for k, v in labels.items() if k not in ("model_name",
                                                                           "engine")},
                       [1.0] * minutes))
    return out


def gauge_series(name: str, labels: Mapping[str, str], values: list[float]) -> dict[str, str]:
    return _series(name, labels, values)
