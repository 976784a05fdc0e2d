"""The load generator against the fake streaming server (a test fixture with ground truth)."""

import json
import math
import statistics
import urllib.request

import aiohttp
import pytest
from scipy import stats as scipy_stats

from bench.openai_stream_server import running_fake_server
from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.rate_verdict import MET, NOT_MET, RateSlo
from onboarding.serving.stats import (
    ERROR_CAUSES,
    Slo,
    histogram_mean_delta,
    parse_metrics,
    summarize,
)
from resources.loadgen import (
    LoadGenerator,
    SseEvents,
    completion_bodies,
    error_cause,
    measure_at_rate,
    sse_data,
)


def truth(url: str) -> dict:
    with urllib.request.urlopen(url + "/truth") as r:
        return json.loads(r.read())


def run(url, n=40, out=16, **kw):
    kw.setdefault("concurrency", 8)
    return LoadGenerator().run_point(url, completion_bodies("fake", ["a b c"] * n, out),
                                     max_seconds=60, request_timeout_s=30, **kw)


def test_itl_ttft_and_tokens_match_the_servers_ground_truth():
    with running_fake_server(ttft_ms=50, itl_ms=10) as url:
        r = run(url, n=48, out=20, concurrency=16, scrape_interval_s=0.1)
        t = truth(url)
    s = summarize(r.records, r.duration_s)
    assert s.completed == 48 and s.failed == 0
    true_itl_ms = statistics.mean(t["itl_s"]) * 1e3
    assert s.itl_ms.mean == pytest.approx(true_itl_ms, rel=0.05)
    assert s.ttft_s.p50 >= statistics.median(t["ttft_s"])  # client adds transit, never less
    assert s.ttft_s.p50 - statistics.median(t["ttft_s"]) < 0.025
    assert all(rec.output_tokens == 20 and rec.prompt_tokens == 3 for rec in r.records)
    assert s.tpot_ms.mean == pytest.approx(true_itl_ms, rel=0.05)
    before, after = parse_metrics(r.metrics_before), parse_metrics(r.metrics_after)
    assert after["vllm:time_to_first_token_seconds_count"] - \
        before["vllm:time_to_first_token_seconds_count"] == 48
    assert r.metrics_during and max(
        parse_metrics(m)["vllm:num_requests_running"] for m in r.metrics_during) > 0


@pytest.mark.parametrize("fault,cause", [("5xx", "http_503"), ("drop", "stream_dropped"),
                                         ("malformed", "malformed_sse")])
def test_faults_are_counted_by_cause_and_the_run_finishes(fault, cause):
    with running_fake_server(itl_ms=1, fault=fault, fault_every=4) as url:
        r = run(url, n=40)
    s = summarize(r.records, r.duration_s)
    assert s.requests == 40
    assert s.errors_by_cause == {cause: 10}
    assert s.completed == 30


def test_warmup_requests_are_not_recorded():
    with running_fake_server() as url:
        r = LoadGenerator().run_point(url, completion_bodies("fake", ["x"] * 10, 4),
                                      concurrency=2, max_seconds=30, request_timeout_s=10,
                                      warmup_bodies=completion_bodies("fake", ["w"] * 5, 4))
        assert truth(url)["requests"] == 15
    assert len(r.records) == 10


def test_warmup_requests_run_warmup_concurrency_at_a_time():
    """The sweep warms a scenario once with its warm-ups together (assets/serving.py
    `run_sweep`); a point at concurrency 1 then sends them two at a time, not one by one."""
    for kw, most in (({}, 1), ({"warmup_concurrency": 2}, 2)):
        with running_fake_server(itl_ms=20) as url:
            r = LoadGenerator().run_point(url, completion_bodies("fake", ["x"] * 2, 4),
                                          concurrency=1, max_seconds=30, request_timeout_s=10,
                                          warmup_bodies=completion_bodies("fake", ["w"] * 2, 8),
                                          **kw)
            assert truth(url)["most_running"] == most, kw
        assert len(r.records) == 2


def test_a_point_is_bounded_in_seconds():
    with running_fake_server(itl_ms=50) as url:
        r = LoadGenerator().run_point(url, completion_bodies("fake", ["x"] * 1000, 10),
                                concurrency=2, max_seconds=0.5, request_timeout_s=10)
    assert 0 < len(r.records) < 20  # ~0.5 s of 0.45 s requests, not 1000


def test_request_timeout_is_an_error_with_cause():
    with running_fake_server(ttft_ms=2000) as url:
        r = LoadGenerator().run_point(url, completion_bodies("fake", ["x"] * 2, 2),
                                      concurrency=2, max_seconds=10, request_timeout_s=0.3)
    assert [rec.error for rec in r.records] == ["timeout", "timeout"]


def test_poisson_mode_sends_about_rate_times_seconds():
    with running_fake_server() as url:
        r = LoadGenerator().run_point(url, completion_bodies("fake", ["x"] * 1000, 2),
                                      rate_rps=40.0, max_seconds=1.0, request_timeout_s=5)
    assert 15 <= len(r.records) <= 80
    starts = sorted(rec.start_s for rec in r.records)
    assert starts[-1] < 1.0
    assert all(rec.ok for rec in r.records)


def test_connection_refused_is_an_error_not_a_crash():
    from bench.openai_stream_server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    r = LoadGenerator(metrics_path="").run_point(url, completion_bodies("fake", ["x"] * 3, 2),
                                                 concurrency=1, max_seconds=5,
                                                 request_timeout_s=2)
    assert [rec.error for rec in r.records] == ["connect_failed"] * 3


# ---- faults a real deployment shows: every one is a documented cause, and the point survives ----

@pytest.mark.parametrize("fault,causes", [
    ("reset", {"connection_lost"}),  # RST before any response, e.g. on a kept-alive connection
    ("reset_mid", {"stream_dropped"}),  # RST after two tokens
])
def test_resets_are_counted_under_documented_causes(fault, causes):
    with running_fake_server(itl_ms=1, fault=fault, fault_every=4) as url:
        r = run(url, n=40)
    s = summarize(r.records, r.duration_s)
    assert s.requests == 40 and s.completed == 30
    assert set(s.errors_by_cause) == causes and sum(s.errors_by_cause.values()) == 10
    assert all(rec.detail for rec in r.records if not rec.ok)  # the exception, for the logs


@pytest.mark.slow
@pytest.mark.waits
def test_a_stalled_stream_is_a_timeout():
    with running_fake_server(itl_ms=1, fault="stall", fault_every=2) as url:
        r = LoadGenerator().run_point(url, completion_bodies("fake", ["x"] * 4, 8),
                                      concurrency=4, max_seconds=10, request_timeout_s=1)
    assert sorted(rec.error or "ok" for rec in r.records) == ["ok", "ok", "timeout", "timeout"]


@pytest.mark.parametrize("separator", ["crlf", "cr"])
def test_sse_events_separated_by_crlf_or_cr_are_read(separator):
    """The SSE spec ends lines with CRLF, LF or CR; none of them is a dropped stream."""
    with running_fake_server(itl_ms=1, fault=separator, fault_every=1) as url:
        r = run(url, n=12)
    s = summarize(r.records, r.duration_s)
    assert s.errors_by_cause == {} and s.completed == 12
    assert {(rec.content_chunks, rec.output_tokens) for rec in r.records} == {(16, 16)}


def test_sse_splitter_handles_line_ends_split_across_reads():
    """Fed one byte at a time, a CR that ends one read and the LF that starts the next are one
    line end; comments and multi-line data follow the spec."""
    stream = (b'data: {"a": 1}\r\n\r\n: keep-alive comment\r\n\r\ndata: {"b":\r\ndata: 2}\r\r'
              b"data: [DONE]\n\n")
    splitter = SseEvents()
    events = [e for i in range(len(stream)) for e in splitter.feed(stream[i:i + 1])]
    assert [sse_data(e) for e in events] == [b'{"a": 1}', None, b'{"b":\n2}', b"[DONE]"]
    whole = SseEvents().feed(stream)
    assert whole == events
    tail = SseEvents()  # the last event ends with CR CR, the very last bytes of the stream
    assert tail.feed(b"data: [DONE]\r") == []
    assert [sse_data(e) for e in tail.feed(b"\r")] == [b"[DONE]"]


def _client_exceptions() -> list[type[BaseException]]:
    import aiohttp.client_exceptions as ce

    found = [getattr(ce, n) for n in ce.__all__]
    return [c for c in found if isinstance(c, type) and issubclass(c, aiohttp.ClientError)]


@pytest.mark.parametrize("started", [False, True])
def test_every_client_exception_maps_to_a_documented_cause(started):
    docs = (PROJECT_ROOT / "docs" / "serving.md").read_text()
    for cause in ERROR_CAUSES:
        assert f"`{cause}`" in docs, f"{cause} is not in docs/serving.md"
    classes = [*_client_exceptions(), TimeoutError, ConnectionResetError, OSError]
    assert len(classes) > 20
    for cls in classes:
        exc = cls.__new__(cls)  # mapping looks at the type only
        assert error_cause(exc, started) in ERROR_CAUSES, cls
    assert error_cause(aiohttp.ClientOSError(104, "Connection reset by peer"), False) == \
        "connection_lost"
    assert error_cause(aiohttp.ClientOSError(104, "Connection reset by peer"), True) == \
        "stream_dropped"


def test_an_undocumented_cause_is_refused_by_the_statistics():
    from onboarding.serving.stats import RequestRecord

    with pytest.raises(ValueError, match="client_ClientOSError"):
        summarize([RequestRecord(error="client_ClientOSError")], 1.0)
    assert summarize([RequestRecord(error="http_429")], 1.0).errors_by_cause == {"http_429": 1}


@pytest.mark.slow
@pytest.mark.parametrize("metrics_fault,said", [("404", "HTTP 404"), ("stall", "timed out"),
                                                ("garbage", "not Prometheus text")])
@pytest.mark.waits
def test_a_broken_metrics_endpoint_never_costs_the_point(metrics_fault, said):
    with running_fake_server(itl_ms=1, metrics_fault=metrics_fault) as url:
        r = LoadGenerator(scrape_timeout_s=0.5).run_point(
            url, completion_bodies("fake", ["a b c"] * 40, 16), concurrency=8, max_seconds=60,
            request_timeout_s=30, scrape_interval_s=0.05)
    s = summarize(r.records, r.duration_s)
    assert s.requests == 40 and s.completed == 40
    assert r.metrics_before is None and r.metrics_after is None and r.metrics_during == []
    assert r.scrape_failures >= 2 and said in r.scrape_last_error
    assert r.scrape_columns() == {"scrape_failures": r.scrape_failures,
                                  "scrape_last_error": r.scrape_last_error}


@pytest.mark.slow
@pytest.mark.waits
def test_a_stalled_metrics_endpoint_costs_a_point_one_scrape_timeout_not_one_per_scrape():
    """The scrape before the point times out; nothing more is asked of that
    /metrics in the point (neither during it nor after it), so the point ends within its
    bound plus that one timeout."""
    import time

    timeout_s = 3.0
    with running_fake_server(itl_ms=1, metrics_fault="stall") as url:
        started = time.monotonic()
        r = LoadGenerator(scrape_timeout_s=timeout_s).run_point(
            url, completion_bodies("fake", ["a b c"] * 20, 8), concurrency=4, max_seconds=60,
            request_timeout_s=30, scrape_interval_s=0.05)
        elapsed_s = time.monotonic() - started
        scrapes = truth(url)["metrics_scrapes"]
    assert summarize(r.records, r.duration_s).completed == 20
    assert scrapes == 1  # the first scrape timed out: none after it
    assert r.scrape_failures == 2 and "timed out" in r.scrape_last_error  # before; after, skipped
    # Before: a timeout before the point and another after it. Generous: one whole timeout.
    assert elapsed_s < r.duration_s + 2 * timeout_s


@pytest.mark.slow
@pytest.mark.waits
def test_a_metrics_endpoint_that_stalls_under_load_is_still_read_after_the_point():
    """/metrics answers before the point, hangs while requests stream (an API server busy with
    the load) and answers again once they are done: the scrapes during the point stop at the
    first timeout, but the one after the load is still taken, so the point keeps its
    engine-side delta (before and after), with the timeout counted."""
    with running_fake_server(itl_ms=20, metrics_fault="stall_busy") as url:
        r = LoadGenerator(scrape_timeout_s=0.5).run_point(
            url, completion_bodies("fake", ["a b c"] * 16, 32), concurrency=4, max_seconds=60,
            request_timeout_s=30, scrape_interval_s=0.05)
        scrapes = truth(url)["metrics_scrapes"]
    assert summarize(r.records, r.duration_s).completed == 16
    assert r.metrics_before is not None and r.metrics_after is not None
    assert r.metrics_during == [] and scrapes == 3  # before, the one that timed out, after
    assert r.scrape_failures == 1 and "timed out" in r.scrape_last_error


def test_a_server_that_exits_mid_stream_keeps_every_record():
    """The process dies during request 10: those in flight are dropped, the rest cannot
    connect, /metrics stops answering; every record is kept and the point ends."""
    with running_fake_server(itl_ms=5, fault="exit", fault_every=10) as url:
        r = run(url, n=40, concurrency=4, scrape_interval_s=0.05)
    s = summarize(r.records, r.duration_s)
    assert s.requests == 40 and 5 <= s.completed <= 9
    assert set(s.errors_by_cause) <= {"stream_dropped", "connection_lost", "connect_failed"}
    # The 4 in flight and those a worker sends while the dying process's socket still accepts
    # fail otherwise (two rounds of 4 when the machine is quiet, a round or two more under
    # load: the kernel's accept backlog outlives the process by a scheduling slice); once it is
    # gone every request finds nothing listening, so most failures are connect_failed.
    failed = s.requests - s.completed
    assert s.errors_by_cause.get("connect_failed", 0) >= failed // 2
    assert r.metrics_before is not None and r.metrics_after is None
    assert r.scrape_failures >= 1


# ---- per token, as the engine counts: chunks of several tokens, tokens without text ----

def test_itl_is_per_token_when_chunks_carry_several_tokens():
    """vLLM merges a request's outputs into one chunk when its API server lags: a chunk that
    carries 4 tokens after a 20 ms gap is 4 inter-token latencies of 5 ms, not one of 20."""
    with running_fake_server(ttft_ms=30, itl_ms=5, tokens_per_chunk=4) as url:
        r = run(url, n=24, out=21, concurrency=8)
        t = truth(url)
    s = summarize(r.records, r.duration_s)
    assert s.completed == 24 and t["tokens"] == 24 * 21 and t["chunks"] == 24 * 6
    true_itl_ms = statistics.mean(t["itl_s"]) * 1e3
    assert s.itl_ms.mean == pytest.approx(true_itl_ms, rel=0.05)
    assert s.tpot_ms.mean == pytest.approx(true_itl_ms, rel=0.05)
    assert s.ttft_s.p50 >= statistics.median(t["ttft_s"])  # the first token goes out alone
    assert s.ttft_s.p50 - statistics.median(t["ttft_s"]) < 0.025
    assert {(rec.content_chunks, rec.stream_tokens, rec.output_tokens)
            for rec in r.records} == {(6, 21, 21)}
    assert all(len(rec.itl_s) == 20 for rec in r.records)  # one gap per token after the first
    assert s.tokens_per_chunk == pytest.approx(21 / 6)
    assert s.itl_basis == "per token"
    row = s.row()
    assert row["tokens_per_chunk"] == pytest.approx(21 / 6) and row["itl_basis"] == "per token"
    # the engine's own histogram (here the fake's truth) is what the client must agree with
    server_itl_s = histogram_mean_delta(parse_metrics(r.metrics_before),
                                        parse_metrics(r.metrics_after),
                                        "vllm:inter_token_latency_seconds")
    assert s.itl_ms.mean == pytest.approx(server_itl_s * 1e3, rel=0.05)


def test_tokens_without_text_are_counted():
    """A token whose text is empty (a partial UTF-8 sequence, an id beyond a small tokenizer's
    vocabulary) still arrives as a chunk; counting only text would merge its gap into the
    next token's."""
    with running_fake_server(itl_ms=5, empty_every=3) as url:
        r = run(url, n=24, out=21, concurrency=8)
        t = truth(url)
    s = summarize(r.records, r.duration_s)
    assert s.completed == 24
    assert s.itl_ms.mean == pytest.approx(statistics.mean(t["itl_s"]) * 1e3, rel=0.05)
    assert {(rec.content_chunks, rec.stream_tokens) for rec in r.records} == {(21, 21)}


def test_a_response_of_only_tokens_without_text_is_ok_not_no_content():
    with running_fake_server(ttft_ms=20, itl_ms=2, empty_every=1) as url:
        r = run(url, n=8, out=10, concurrency=4)
        t = truth(url)
    assert [rec.error for rec in r.records] == [None] * 8
    s = summarize(r.records, r.duration_s)
    assert s.completed == 8 and {rec.stream_tokens for rec in r.records} == {10}
    assert s.ttft_s.p50 >= statistics.median(t["ttft_s"])
    assert s.itl_ms.mean == pytest.approx(statistics.mean(t["itl_s"]) * 1e3, rel=0.25)


def test_a_server_without_usage_per_chunk_is_timed_per_text_chunk_and_says_so():
    """Usage only at the end: one token per text chunk, the only count there is. Chunks of 4
    tokens then read as 4x the ITL; the row says which basis, and tokens per chunk (from the
    final usage) shows the coalescing. TPOT uses the final count and stays right."""
    with running_fake_server(itl_ms=5, tokens_per_chunk=4, continuous_usage=False) as url:
        r = run(url, n=16, out=21, concurrency=8)
        t = truth(url)
    s = summarize(r.records, r.duration_s)
    true_itl_ms = statistics.mean(t["itl_s"]) * 1e3
    assert s.completed == 16
    assert {(rec.content_chunks, rec.stream_tokens, rec.output_tokens)
            for rec in r.records} == {(6, 6, 21)}
    assert s.itl_basis == "per text chunk (the server sends usage only at the end)"
    assert s.tokens_per_chunk == pytest.approx(21 / 6)
    assert s.itl_ms.mean == pytest.approx(4 * true_itl_ms, rel=0.1)
    assert s.tpot_ms.mean == pytest.approx(true_itl_ms, rel=0.05)


def test_token_ids_per_chunk_count_tokens_without_continuous_usage():
    """`return_token_ids` (vLLM puts each chunk's own ids in its choice) counts the tokens of
    a merged chunk as exactly as continuous usage does, without a usage object per chunk."""
    bodies = completion_bodies("fake", ["a b c"] * 16, 21, count_tokens_by="token_ids")
    assert all(b'"return_token_ids": true' in b and b"continuous_usage_stats" not in b
               for b in bodies)
    with running_fake_server(itl_ms=5, tokens_per_chunk=4, continuous_usage=False) as url:
        r = LoadGenerator().run_point(url, bodies, concurrency=8, max_seconds=60,
                                      request_timeout_s=30)
        t = truth(url)
    s = summarize(r.records, r.duration_s)
    assert s.completed == 16
    assert {(rec.content_chunks, rec.stream_tokens, rec.output_tokens)
            for rec in r.records} == {(6, 21, 21)}
    assert s.itl_basis == "per token"
    assert s.itl_ms.mean == pytest.approx(statistics.mean(t["itl_s"]) * 1e3, rel=0.05)


def test_counting_by_text_ignores_a_servers_count_and_says_so():
    """`count_tokens_by="text"` asks for no count (`vllm bench serve`'s body): a chunk of 4
    tokens is one gap, and the basis says per text chunk."""
    bodies = completion_bodies("fake", ["a b c"] * 16, 21, count_tokens_by="text")
    assert not any(b"continuous_usage_stats" in b or b"return_token_ids" in b for b in bodies)
    with running_fake_server(itl_ms=5, tokens_per_chunk=4) as url:
        r = LoadGenerator().run_point(url, bodies, concurrency=8, max_seconds=60,
                                      request_timeout_s=30)
    s = summarize(r.records, r.duration_s)
    assert s.completed == 16 and s.itl_basis.startswith("per text chunk")
    with pytest.raises(ValueError, match="count_tokens_by"):
        completion_bodies("fake", ["a"], 4, count_tokens_by="logprobs")


def test_each_way_of_counting_sends_the_one_field_the_stack_says_it_sends():
    """The stack's COUNT_EXTENSION is what a template's request_extensions is checked against
    (onboarding/serving/stack.py); the bodies must send exactly that field beyond the text
    count's, or the check would vouch for a field the client does not send."""
    from onboarding.serving.stack import COUNT_EXTENSION

    def fields(body: dict, prefix: str = "") -> set[str]:
        return set().union(*(fields(v, f"{prefix}{k}.") if isinstance(v, dict)
                             else {f"{prefix}{k}"} for k, v in body.items()))

    plain = fields(json.loads(completion_bodies("m", ["p"], 4, count_tokens_by="text")[0]))
    for mode, field in COUNT_EXTENSION.items():
        sent = fields(json.loads(completion_bodies("m", ["p"], 4, count_tokens_by=mode)[0]))
        assert sent - plain == ({field} if field else set()), mode


def test_without_usage_per_chunk_tokens_without_text_are_no_content_and_say_why():
    with running_fake_server(itl_ms=1, empty_every=1, continuous_usage=False) as url:
        r = run(url, n=4, out=5, concurrency=2)
    assert [rec.error for rec in r.records] == ["no_content"] * 4
    assert "5 tokens" in r.records[0].detail and "usage only at the end" in r.records[0].detail


def test_poisson_arrivals_are_seeded_exponential_and_say_n():
    """Open loop at 50 req/s: the schedule is the seed's, its gaps exponential (mean 1/rate,
    coefficient of variation 1), every arrival sent (none early) and recorded."""
    rate, n = 50.0, 300
    with running_fake_server(itl_ms=1) as url:
        runs = [LoadGenerator().run_point(url, completion_bodies("fake", ["x"] * n, 4),
                                          rate_rps=rate, max_seconds=60, request_timeout_s=10,
                                          seed=seed) for seed in (7, 7, 8)]
    a, b, c = runs
    assert a.arrivals_s == b.arrivals_s != c.arrivals_s  # reproducible by seed
    assert len(a.arrivals_s) == len(a.records) == n and a.stopped == "bodies"
    gaps = [y - x for x, y in zip([0.0, *a.arrivals_s], a.arrivals_s, strict=False)]
    mean = statistics.mean(gaps)
    assert mean == pytest.approx(1 / rate, rel=4 / math.sqrt(n))  # 4 standard errors
    assert statistics.stdev(gaps) / mean == pytest.approx(1.0, abs=0.2)
    assert scipy_stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.001
    sent = sorted(r.start_s for r in a.records)
    # never sent ahead of its schedule (uvloop's timers count whole milliseconds and may wake
    # up to one early; the slack allows for that rounding, never for a late send)
    assert all(s >= t - 5e-3 for s, t in zip(sent, a.arrivals_s, strict=True))
    assert all(r.ok for r in a.records)


def test_a_rate_run_stops_once_its_verdict_is_decided():
    slo = Slo(ttft_p95_s=5.0, itl_mean_ms=1000, error_rate_max=0.0, target_concurrency=1)
    bodies = completion_bodies("fake", ["x"] * 400, 4)
    slow = RateSlo(target_rate_rps=40, ttft_p_s=0.1, tpot_p_ms=1000, percentile=99,
                   min_requests=20, look_every=5, max_seconds=30)
    with running_fake_server(ttft_ms=300) as url:
        run, v = measure_at_rate(LoadGenerator(), url, bodies, slo, slow, seed=1,
                                 request_timeout_s=10)
    assert run.stopped == "decided" and 20 <= len(run.records) < 400
    assert v.outcome == NOT_MET and v.n == len(run.records)  # in-flight ones judged too
    assert f"n={v.n}" in v.says()
    fast = RateSlo(target_rate_rps=40, ttft_p_s=2.0, tpot_p_ms=1000, percentile=90,
                   min_requests=20, look_every=5, max_seconds=30)
    with running_fake_server(itl_ms=1) as url:
        run, v = measure_at_rate(LoadGenerator(), url, bodies, slo, fast, seed=1,
                                 request_timeout_s=10)
    assert run.stopped == "decided" and len(run.records) < 400
    assert v.outcome == MET and v.stat("ttft_p90").n == len(run.records)
