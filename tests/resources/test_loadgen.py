"""The load generator against the fake streaming server (a test fixture with ground truth)."""

import json
import statistics
import urllib.request

import pytest

from onboarding.serving_stats import parse_metrics, summarize
from resources.loadgen import LoadGenerator, completion_bodies
from tests.fakes.openai_stream_server import running_fake_server


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
    from tests.fakes.openai_stream_server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    r = LoadGenerator(metrics_path="").run_point(url, completion_bodies("fake", ["x"] * 3, 2),
                                                 concurrency=1, max_seconds=5,
                                                 request_timeout_s=2)
    assert [rec.error for rec in r.records] == ["connect_failed"] * 3
