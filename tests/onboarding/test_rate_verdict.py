"""The open-loop verdict at a rate: percentile bounds judged by a binomial interval, n said."""

import dataclasses
import math

import pytest

from onboarding.serving.rate_verdict import (
    MET,
    NOT_MET,
    UNDECIDED,
    RateSlo,
    clopper_pearson,
    combine,
    judge,
    max_looks,
    requests_for,
)
from onboarding.serving.stats import RequestRecord, Slo

SLO = Slo(ttft_p95_s=1.0, itl_mean_ms=30, error_rate_max=0.0, target_concurrency=4)
RATE = RateSlo(target_rate_rps=2.0, ttft_p_s=2.0, tpot_p_ms=50, percentile=99)


def req(ttft=0.2, tpot_ms=20.0, n=11, ok=True):
    if not ok:
        return RequestRecord(error="http_503")
    e2e = ttft + tpot_ms / 1e3 * (n - 1)
    return RequestRecord(ok=True, ttft_s=ttft, e2e_s=e2e, output_tokens=n,
                         itl_s=[tpot_ms / 1e3] * (n - 1))


def test_clopper_pearson_matches_its_closed_forms():
    # k = 0: the upper end is 1 - alpha^(1/n); k = n: the lower end is alpha^(1/n)
    assert clopper_pearson(0, 100, 0.05)[1] == pytest.approx(1 - 0.05 ** (1 / 100))
    assert clopper_pearson(100, 100, 0.05)[0] == pytest.approx(0.05 ** (1 / 100))
    assert clopper_pearson(0, 0, 0.05) == (0.0, 1.0)


def test_few_fast_requests_leave_a_p99_undecided_and_say_n():
    v = judge([req() for _ in range(50)], SLO, RATE)
    assert v.outcome == UNDECIDED  # 0 of 50 over cannot show the share over is below 1 %
    assert v.n == 50
    assert "n=50" in v.says() and "ttft_p99" in v.says()


def test_enough_fast_requests_meet_a_p99():
    # 0 over of n: met once 1 - 0.05^(1/n) <= 0.01, i.e. n >= 299
    assert judge([req() for _ in range(298)], SLO, RATE).outcome == UNDECIDED
    v = judge([req() for _ in range(299)], SLO, RATE)
    assert v.outcome == MET, v.says()
    assert v.stat("ttft_p99").n == 299 and v.stat("ttft_p99").over == 0


def test_a_slow_tail_is_not_met_early():
    recs = [req() for _ in range(40)] + [req(ttft=3.0) for _ in range(5)]
    v = judge(recs, SLO, RATE)
    assert v.outcome == NOT_MET
    t = v.stat("ttft_p99")
    assert t.over == 5 and t.n == 45 and t.low > 0.01
    assert "5 of n=45 over" in t.says()


def test_a_failed_request_counts_over_every_bound_and_breaks_a_zero_error_slo():
    recs = [req() for _ in range(299)] + [req(ok=False)]
    v = judge(recs, SLO, RATE)
    assert v.stat("ttft_p99").over == 1 and v.stat("tpot_p99").over == 1
    assert v.error_outcome == NOT_MET and v.outcome == NOT_MET


def test_the_catalogs_mean_itl_is_judged_by_an_interval():
    slow = [req(tpot_ms=40 + (i % 3)) for i in range(30)]  # mean 41 ms > 30 ms, tight
    v = judge(slow, SLO, RATE)
    m = v.stat("tpot_mean")
    assert m.outcome == NOT_MET and m.low > 30 and m.n == 30
    assert v.outcome == NOT_MET


def test_more_looks_judge_each_look_stricter():
    recs = [req() for _ in range(400)]
    assert judge(recs, SLO, RATE, looks=1).outcome == MET
    # at alpha / 41 the upper end of 0 of 400 is 1 - (0.05/41)^(1/400) > 1 %
    assert judge(recs, SLO, RATE, looks=41).outcome == UNDECIDED
    assert max_looks(400, RATE) == 41  # 40 while sending, and the last judgement


def test_repeated_runs_give_an_interval_and_combine_fail_closed():
    runs = [judge([req(ttft=t) for _ in range(300)], SLO, RATE) for t in (0.2, 0.3, 0.4)]
    rep = combine(runs)
    assert rep.outcome == MET and rep.n == 900
    ttft = next(i for i in rep.intervals if i.name == "ttft_p99")
    assert ttft.mean == pytest.approx(0.3) and ttft.low < 0.3 < ttft.high
    assert ttft.ns == (300, 300, 300)
    assert "3 runs" in rep.says() and "n=300/300/300" in rep.says()
    bad = judge([req(ttft=3.0) for _ in range(20)], SLO, RATE)
    assert combine([*runs, bad]).outcome == NOT_MET
    assert combine([runs[0], judge([req()], SLO, RATE)]).outcome == UNDECIDED


def test_nothing_finished_is_undecided_not_met():
    v = judge([], SLO, RATE)
    assert v.outcome == UNDECIDED and v.n == 0
    assert math.isnan(v.stat("ttft_p99").estimate)


def test_bad_settings_are_refused_and_bodies_cover_the_time():
    with pytest.raises(ValueError, match="target_rate_rps"):
        RateSlo(target_rate_rps=0, ttft_p_s=1, tpot_p_ms=1)
    with pytest.raises(ValueError, match="percentile"):
        RateSlo(target_rate_rps=1, ttft_p_s=1, tpot_p_ms=1, percentile=100)
    r = RateSlo(target_rate_rps=10, ttft_p_s=1, tpot_p_ms=1, max_seconds=60, min_requests=50)
    assert requests_for(r) >= 600 + 4 * math.sqrt(600)


def test_goodput_counts_the_requests_inside_every_bound_over_the_runs_span():
    """Inside every bound: TTFT within both TTFT bounds (the catalog's p95 bound, 1 s, is the
    tighter), TPOT within the TPOT bound and the mean-ITL bound read per request; a failed
    request never; a one-token answer has no TPOT to hold against a bound."""
    recs = [dataclasses.replace(r, start_s=float(i)) for i, r in enumerate(
        [req(ttft=0.2), req(ttft=1.5), req(tpot_ms=40.0), req(ok=False), req(n=1)])]
    v = judge(recs, SLO, RATE)
    assert v.good == 2  # the first and the one-token answer
    last_end = max(r.start_s + r.e2e_s for r in recs if r.e2e_s is not None)
    assert v.span_s == pytest.approx(last_end) and v.goodput_rps == pytest.approx(2 / last_end)
    assert f"2 of n=5 inside every bound, goodput {2 / last_end:.3g} req/s" in v.says()
    assert math.isnan(judge([], SLO, RATE).goodput_rps)
