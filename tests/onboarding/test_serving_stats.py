"""Serving statistics: definitions as vLLM's benchmark, SLO logic, /metrics deltas."""

import math

import pytest

from onboarding.serving.stats import (
    PointStats,
    RequestRecord,
    Slo,
    StartSample,
    histogram_mean_delta,
    parse_metrics,
    saturation_concurrency,
    slo_violations,
    summarize,
    summarize_load_timing,
)

SLO = Slo(ttft_p95_s=1.0, itl_mean_ms=30, error_rate_max=0.0, target_concurrency=4)


def ok(ttft, gaps, n=None, prompt=10, chunks=None, from_usage=False):
    e2e = ttft + sum(gaps)
    return RequestRecord(ok=True, ttft_s=ttft, e2e_s=e2e, itl_s=list(gaps),
                         content_chunks=chunks or len(gaps) + 1, stream_tokens=len(gaps) + 1,
                         tokens_from_usage=from_usage, prompt_tokens=prompt, output_tokens=n)


def test_tpot_uses_the_servers_token_count_not_chunks():
    # 3 chunks but the server says 5 tokens (chunks carried several tokens)
    r = ok(0.1, [0.04, 0.04], n=5)
    assert r.tpot_s == pytest.approx(0.08 / 4)
    assert ok(0.1, [0.04, 0.04]).tpot_s == pytest.approx(0.08 / 2)


def test_summarize_pools_itl_and_counts_errors_by_cause():
    recs = [ok(0.1, [0.01, 0.03], n=3), ok(0.3, [0.02], n=2),
            RequestRecord(error="http_503"), RequestRecord(error="stream_dropped"),
            RequestRecord(error="http_503")]
    s = summarize(recs, duration_s=2.0, slo=SLO)
    assert s.requests == 5 and s.completed == 2 and s.failed == 3
    assert s.errors_by_cause == {"http_503": 2, "stream_dropped": 1}
    assert s.error_rate == pytest.approx(0.6)
    assert s.itl_ms.mean == pytest.approx(20.0)
    assert s.ttft_s.p50 == pytest.approx(0.2)
    assert s.request_throughput_rps == pytest.approx(1.0)
    assert s.output_tokens_per_s == pytest.approx(2.5)
    assert s.input_tokens_per_s == pytest.approx(10.0)
    assert s.goodput_rps == pytest.approx(1.0)  # both meet ttft<=1s and tpot<=30ms
    row = s.row()
    assert row["itl_mean_ms"] == pytest.approx(20.0) and "ttft_p99_s" in row


def test_a_point_read_back_from_its_csv_row_is_the_point():
    """A recorded sweep (serving_benchmark.csv: every value text) reads back to the stats it
    was written from, less what a row does not hold (the client queue's other quantiles)."""
    recs = [ok(0.1, [0.01, 0.03], n=3), ok(0.3, [0.02], n=2), RequestRecord(error="http_503"),
            RequestRecord(error="stream_dropped")]
    s = summarize(recs, duration_s=2.0, slo=SLO)
    back = PointStats.from_row({k: str(v) for k, v in s.row().items()})
    assert back.errors_by_cause == {"http_503": 1, "stream_dropped": 1}
    assert (back.ttft_s, back.itl_ms, back.tpot_ms, back.e2e_s) == (
        s.ttft_s, s.itl_ms, s.tpot_ms, s.e2e_s)
    assert back.goodput_rps == s.goodput_rps and back.failed == 2 and back.requests == 4
    assert (back.tokens_per_chunk, back.itl_basis) == (s.tokens_per_chunk, s.itl_basis)
    assert slo_violations(back, SLO) == slo_violations(s, SLO)
    no_goodput = PointStats.from_row({**{k: str(v) for k, v in s.row().items()},
                                      "goodput_rps": ""})
    assert no_goodput.goodput_rps is None


def test_tokens_per_chunk_and_the_itl_basis_are_in_the_row():
    """Tokens per chunk > 1 is vLLM coalescing a request's outputs; the basis says whether ITL
    could be split per token (usage in every chunk) or is per text chunk."""
    per_token = [ok(0.1, [0.01] * 5, n=6, chunks=2, from_usage=True),
                 ok(0.1, [0.01] * 3, n=4, chunks=4, from_usage=True)]
    s = summarize(per_token + [RequestRecord(error="timeout")], 1.0)
    assert s.tokens_per_chunk == pytest.approx(10 / 6)
    assert s.itl_basis == "per token"
    assert s.row()["tokens_per_chunk"] == pytest.approx(10 / 6)
    assert summarize([ok(0.1, [0.01], n=8)], 1.0).itl_basis == \
        "per text chunk (the server sends usage only at the end)"
    mixed = summarize(per_token + [ok(0.1, [0.01], n=2)], 1.0)
    assert mixed.itl_basis == "per token for 2 of 3 requests, the rest per text chunk"
    none = summarize([RequestRecord(error="timeout")], 1.0)
    assert math.isnan(none.tokens_per_chunk) and none.itl_basis == ""


def test_goodput_excludes_requests_over_the_slo():
    recs = [ok(2.0, [0.01], n=2), ok(0.1, [0.05], n=2), ok(0.1, [0.01], n=2)]
    assert summarize(recs, 1.0, SLO).goodput_rps == pytest.approx(1.0)


def test_slo_violations_name_the_numbers():
    s = summarize([ok(2.0, [0.05], n=2), RequestRecord(error="timeout")], 1.0)
    v = slo_violations(s, SLO)
    assert any("TTFT p95 2.000 s > 1.0 s" in x for x in v)
    assert any("mean ITL 50.0 ms" in x for x in v)
    assert any("error rate 50.00%" in x for x in v)
    assert slo_violations(summarize([ok(0.1, [0.01], n=2)], 1.0), SLO) == []


def test_saturation_needs_every_lower_point_to_pass():
    good = summarize([ok(0.1, [0.01], n=2)], 1.0)
    bad = summarize([ok(5.0, [0.01], n=2)], 1.0)
    assert saturation_concurrency([(1, good), (4, good), (8, bad), (16, good)], SLO) == 4
    assert saturation_concurrency([(1, bad), (4, good)], SLO) == 0


def test_empty_point_has_nan_latencies_and_fails_slo():
    s = summarize([RequestRecord(error="connect_failed")], 1.0)
    assert math.isnan(s.ttft_s.p95)
    assert "no request completed" in slo_violations(s, SLO)


def test_histogram_delta_from_prometheus_text():
    text = ('# TYPE vllm:time_to_first_token_seconds histogram\n'
            'vllm:time_to_first_token_seconds_bucket{{le="+Inf",engine="0"}} {c}\n'
            'vllm:time_to_first_token_seconds_count{{engine="0"}} {c}\n'
            'vllm:time_to_first_token_seconds_sum{{engine="0"}} {s}\n'
            '# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{{engine="0"}} 3\n'
            'vllm:num_requests_running{{engine="1"}} 2\n')
    before = parse_metrics(text.format(c=2, s=1.0))
    after = parse_metrics(text.format(c=6, s=3.0))
    assert after["vllm:num_requests_running"] == 5  # summed over engines
    name = "vllm:time_to_first_token_seconds"
    assert histogram_mean_delta(before, after, name) == pytest.approx(0.5)
    assert histogram_mean_delta(after, after, name) is None


def test_load_timing_summary_prefers_the_engines_own_load_time():
    s = [StartSample(kind="fully_cold", resident_fraction=0.0, weights_loaded_s=10.0,
                     engine_weights_load_s=2.0, health_ready_s=20.0, first_token_s=21.0),
         StartSample(kind="fully_cold", resident_fraction=0.0, weights_loaded_s=12.0,
                     engine_weights_load_s=4.0, health_ready_s=22.0, first_token_s=25.0),
         StartSample(kind="cold_weights", resident_fraction=0.0, weights_loaded_s=9.0,
                     engine_weights_load_s=3.0, health_ready_s=17.0, first_token_s=18.0),
         StartSample(kind="warm", resident_fraction=1.0, weights_loaded_s=8.0,
                     engine_weights_load_s=1.0, health_ready_s=15.0, first_token_s=16.0)]
    r = summarize_load_timing("m", "bf16", s, weight_bytes=3_000_000_000, raw_read_gbps=2.0)
    assert r.cold_start_p50_s == pytest.approx(23.0)  # fully cold: what a new pod waits
    assert 23.0 < r.cold_start_p95_s <= 25.0
    assert r.cold_weights_p50_s == pytest.approx(18.0)
    assert r.warm_start_p50_s == pytest.approx(16.0)
    assert r.weights_load_gbps == pytest.approx(1.0)  # 3 GB / median(2, 4, 3) s


# ---- The SLO is judged at the target concurrency or above, never below ----

def _point(ttft_p95_s: float, itl_mean_ms: float = 10.0):
    from onboarding.serving.stats import Dist, PointStats

    d = Dist(ttft_p95_s, ttft_p95_s, ttft_p95_s, ttft_p95_s, ttft_p95_s)
    itl = Dist(itl_mean_ms, itl_mean_ms, itl_mean_ms, itl_mean_ms, itl_mean_ms)
    return PointStats(requests=100, completed=100, failed=0, errors_by_cause={}, duration_s=10.0,
                      request_throughput_rps=10.0, input_tokens_per_s=100.0,
                      output_tokens_per_s=1000.0, ttft_s=d, itl_ms=itl, tpot_ms=itl, e2e_s=d)


def _judge(points, target=32):
    from onboarding.serving.stats import Slo, headline

    slo = Slo(ttft_p95_s=1.0, itl_mean_ms=50.0, error_rate_max=0.01, target_concurrency=target)
    return headline("m", "bf16", "h200", 1, slo, {"chat": points}, True)


def test_a_target_missing_from_the_sweep_is_judged_at_the_next_point_above():
    # 16 meets the SLO, 64 does not: the verdict at the target (32) cannot be 16's
    result, _, violations = _judge([(1, _point(0.1)), (16, _point(0.5)), (64, _point(3.0))])
    assert not result.slo_pass
    assert any(v.startswith("chat @ 64: TTFT p95") for v in violations)
    assert "chat: target concurrency 32 not in the sweep; judged at 64" in violations[0]


def test_no_point_at_or_above_the_target_is_not_measured_at_target_concurrency():
    result, _, violations = _judge([(1, _point(0.1)), (16, _point(0.5))])
    assert not result.slo_pass  # fails closed
    assert violations == ["chat: not measured at target concurrency 32 (highest point 16)"]


def test_the_target_itself_is_judged_when_swept():
    result, _, violations = _judge([(16, _point(3.0)), (32, _point(0.5)), (64, _point(3.0))])
    assert result.slo_pass and violations == []


def test_a_blocking_profile_sweeps_the_target_concurrency():
    from onboarding.common.paths import PROJECT_ROOT
    from onboarding.serving.profiles import load_profiles

    profiles = load_profiles(PROJECT_ROOT / "configs" / "scenarios.yaml")
    gpu = profiles["gpu"]
    assert gpu.slo_severity == "error"
    swept = gpu.sweep_for(target_concurrency=48)
    assert 48 in swept.concurrency and set(gpu.sweep.concurrency) <= set(swept.concurrency)
    assert swept.concurrency == sorted(swept.concurrency)
    cpu = profiles["cpu"]  # warn-only: its sweep is what it says
    assert cpu.sweep_for(target_concurrency=48).concurrency == cpu.sweep.concurrency


def test_a_points_prefix_cache_hit_fraction_is_its_counters_growth():
    """The sweep row's `prefix_cache_hit_fraction`: hits over queries, both as the engine's
    counters grew during the point, so a point served from the cache shows it."""
    from onboarding.serving.stats import counter_ratio_delta

    before = {"vllm:prefix_cache_queries_total": 1000.0, "vllm:prefix_cache_hits_total": 900.0}
    after = {"vllm:prefix_cache_queries_total": 3000.0, "vllm:prefix_cache_hits_total": 1400.0}
    names = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
    assert counter_ratio_delta(before, after, *names) == 0.25
    assert counter_ratio_delta(before, before, *names) is None  # nothing queried
    assert counter_ratio_delta(before, after, None, None) is None  # an engine without them


def test_a_start_reads_as_rounded_phases_not_a_repr():
    """load_timing's line per engine start: seconds rounded, the page cache as a percentage,
    the kernels by name; the dataclass's repr (`StartSample(... 38.46513446400013 ...)`)
    was what the event log showed."""
    sample = StartSample(kind="fully_cold", resident_fraction=0.0, weights_loaded_s=38.46513446,
                         engine_weights_load_s=12.0049, health_ready_s=51.2345,
                         first_token_s=52.0, kernels={"attention_backend": ("FLASH_ATTN",)})
    assert sample.describe() == (
        "weights loaded 38.5 s (the engine says 12.0 s), healthy 51.2 s, first token 52.0 s; "
        "0% of the weights in the page cache before it; kernels: attention_backend FLASH_ATTN")
    cold = StartSample(kind="warm", resident_fraction=1.0, weights_loaded_s=None,
                       engine_weights_load_s=None, health_ready_s=None, first_token_s=3.25)
    assert cold.describe() == ("weights loaded -, healthy -, first token 3.2 s; 100% of the "
                               "weights in the page cache before it")
