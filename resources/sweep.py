"""The serving sweep: every scenario x load point against a running engine, outside Dagster.

`assets/serving.py` runs it inside the `serving_benchmark` step, and `bench/gpu_serving.py`
runs the same loop on a GPU machine without an asset context: both hand it a logger (anything
with `info` and `warning`: an asset's `context.log`, a `logging.Logger`) and, where the points
measured before an engine dies must be kept, a `keep_partial` callable.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Protocol

from onboarding.nodes.telemetry import point_columns
from onboarding.serving.frontend import FRONTEND_ADVICE, FRONTEND_BOUND_CORES, FrontendSampler
from onboarding.serving.prompts import synthetic_prompts
from onboarding.serving.stats import (
    PointStats,
    Slo,
    counter_ratio_delta,
    histogram_mean_delta,
    parse_metrics,
    slo_violations,
    summarize,
)
from resources.loadgen import LoadGenerator, PointRun, completion_bodies


class SweepLog(Protocol):
    def info(self, msg: str) -> None: ...

    def warning(self, msg: str) -> None: ...


# rows measured so far (the last one marked engine_exited) and the dying point -> where they
# were kept, as the engine error says it ("in reports/x/serving_benchmark.partial-1.csv")
KeepPartial = Callable[[list[dict], str], str]


def server_side(run: PointRun, engine_metrics) -> dict[str, float | None]:
    """Server-reported TTFT/ITL means, peak queue/KV usage and the share of the prompt tokens
    the prefix cache served, over the point's measured requests (its first scrape follows the
    warm-up)."""
    if run.metrics_before is None or run.metrics_after is None:
        return {}
    before, after = parse_metrics(run.metrics_before), parse_metrics(run.metrics_after)
    during = [parse_metrics(t) for t in run.metrics_during if t] or [after]
    ttft = histogram_mean_delta(before, after, engine_metrics.ttft_histogram)
    itl = histogram_mean_delta(before, after, engine_metrics.itl_histogram)
    return {
        "prefix_cache_hit_fraction": counter_ratio_delta(
            before, after, engine_metrics.prefix_cache_hits, engine_metrics.prefix_cache_queries),
        "server_ttft_mean_s": ttft,
        "server_itl_mean_ms": itl * 1e3 if itl is not None else None,
        "peak_running": max(m.get(engine_metrics.running, 0.0) for m in during),
        "peak_waiting": max(m.get(engine_metrics.waiting, 0.0) for m in during),
        "peak_kv_cache_usage": max(m.get(engine_metrics.kv_cache_usage, 0.0) for m in during),
    }


def run_sweep(log: SweepLog, loadgen: LoadGenerator, running, template, served_name: str,
              scenarios: dict, sweep, slo: Slo, tokenizer, sampler, frontend: FrontendSampler,
              keep_partial: KeepPartial | None = None
              ) -> tuple[list[dict], dict[str, list[tuple[int, PointStats]]]]:
    """Every scenario x load point against the running engine: table rows and stats, with the
    GPUs' power, energy, tokens per joule and clock events over each point's measured window
    (DCGM field names; "not checked: <why>" where no GPU can be read), and the engine's API
    server's share of a core over the same window (`frontend_bound` above 0.9: the point
    measured the frontend, not the GPU).

    An engine that exits mid-sweep stops it: the rows so far (the dying point marked
    `engine_exited`) go to `keep_partial`, and the engine's error names where they are."""
    loads = sweep.concurrency if sweep.mode == "concurrency" else sweep.rates
    rows: list[dict] = []
    points: dict[str, list[tuple[int, PointStats]]] = {}
    for name, sc in scenarios.items():
        # Each point its own prompts, none sent before in this sweep: a prompt sent again is
        # served from the engine's prefix cache and skips its prefill (every point
        # took the first N of one list, so each point after the first re-sent the earlier
        # points' prompts). `prefix_tokens` are the only tokens a scenario's prompts share.
        counts = [sweep.requests_at(int(max(load, 1))) for load in loads]
        prompts = synthetic_prompts(tokenizer, sweep.warmup_requests + sum(counts),
                                    sc.input_tokens, sc.prefix_tokens,
                                    seed=zlib.crc32(name.encode()))
        bodies = completion_bodies(served_name, prompts, sc.output_tokens,
                                   count_tokens_by=template.load_generator.count_tokens_by)
        # The scenario's warm-up requests go before its first point only, all in flight
        # together up to the sweep's widest concurrency: each later point follows a measured
        # point of the same shapes on the same engine, which warms it as much (warmed
        # again before every point, at that point's concurrency, they were a third of the quick
        # pass's benchmark on the CPU, and eight 2048-token codegen requests one after another
        # before the GPU profile's concurrency-1 point).
        warm, first = bodies[:sweep.warmup_requests], sweep.warmup_requests
        warm_width = int(max(loads)) if sweep.mode == "concurrency" else None
        for load, n in zip(loads, counts, strict=True):
            kw = ({"concurrency": int(load)} if sweep.mode == "concurrency"
                  else {"rate_rps": float(load)})
            point_bodies, first = bodies[first:first + n], first + n
            run = loadgen.run_point(
                running.base_url, point_bodies,
                max_seconds=sweep.max_seconds_per_point,
                request_timeout_s=sweep.request_timeout_s, warmup_bodies=warm,
                warmup_concurrency=warm_width, scrape_interval_s=sweep.scrape_interval_s,
                **kw)
            warm = ()
            end_s = sampler.elapsed_s()
            front = frontend.columns(run.duration_s)
            stats = summarize(run.records, run.duration_s, slo)
            gpu = point_columns(list(sampler.samples), end_s - run.duration_s, end_s,
                                stats.output_tokens_per_s * run.duration_s, sampler.unavailable)
            points.setdefault(name, []).append((int(load), stats))
            exited = running.exited(stats.errors_by_cause)
            rows.append({"scenario": name, "load": load, **stats.row(),
                         **server_side(run, template.metrics), **run.scrape_columns(),
                         **gpu, **front, "engine_exited": exited,
                         "meets_slo": not slo_violations(stats, slo)})
            log.info(f"{name} @ {load}: {stats.request_throughput_rps:.2f} req/s, "
                     f"TTFT p95 {stats.ttft_s.p95:.3f} s, ITL {stats.itl_ms.mean:.1f} "
                     f"ms, errors {stats.errors_by_cause} {stats.error_examples or ''}"
                     + (f", /metrics failed {run.scrape_failures}x (last: "
                        f"{run.scrape_last_error})" if run.scrape_failures else ""))
            if front["frontend_bound"]:
                log.warning(f"{name} @ {load}: frontend-bound, " + FRONTEND_ADVICE.format(
                    cores=FRONTEND_BOUND_CORES) + f" (it ran at {front['frontend_cpu_cores']:.2f})")
            if exited:
                point = f"{name} @ {load}"
                where = keep_partial(rows, point) if keep_partial else "not kept"
                raise running.exited_error(point, f"the {len(rows)} point(s) measured, the last "
                                           f"one marked engine_exited, are {where}")
    return rows, points
