"""The measured configuration search: candidates, order, budget, crashes, the winner, failing
closed. `measure` here returns verdicts judged by the real rate verdict on made-up requests."""

from __future__ import annotations

import itertools
import math

import pytest

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.fetch.catalog import ModelSpec
from onboarding.serving.config_search import (
    RULE,
    Candidate,
    Measured,
    SearchFailed,
    candidates,
    search,
    win_bar,
)
from onboarding.serving.engine_config import ConfigInputs, build_config
from onboarding.serving.rate_verdict import RateSlo, combine, judge
from onboarding.serving.stack import load_stack
from onboarding.serving.stats import RequestRecord, Slo

TEMPLATE = load_stack(PROJECT_ROOT / "configs" / "stack.yaml").templates["vllm"]
SLO = Slo(ttft_p95_s=1.0, itl_mean_ms=100, error_rate_max=0.0, target_concurrency=4)
RATE = RateSlo(target_rate_rps=1, ttft_p_s=2.0, tpot_p_ms=200, percentile=90)


def base():
    spec = ModelSpec(id="m", source="s3://models/m/", served_name="m",
                     engine_args={"max_num_seqs": 4})
    return build_config(TEMPLATE, ConfigInputs(
        spec=spec, node_type="cpu", hardware="cpu", engine="vllm", engine_version="0.32.0+cpu",
        image="local", precision="bf16"))


def run(ttft: float, n: int = 60):
    return judge([RequestRecord(ok=True, start_s=float(i), ttft_s=ttft, e2e_s=ttft + 0.5,
                                output_tokens=11) for i in range(n)], SLO, RATE)


def verdict(ttft: float, n: int = 60):
    return combine([run(ttft, n)])


def runs(*ttfts: float):
    return combine([run(t) for t in ttfts])


def grid(**kw):
    kw = {"max_num_seqs": [2, 4, 8], "max_num_batched_tokens": [512, 2048],
          "target_concurrency": 4, "max_candidates": 3, **kw}
    return candidates(TEMPLATE, base(), **kw)


def test_candidates_start_with_the_plan_and_follow_the_stated_rule():
    cands, left_out, basis = grid(max_candidates=10)
    assert basis == RULE
    assert cands[0].baseline and cands[0].config.hash == base().hash
    pairs = [(c.config.max_num_seqs, c.config.param("max_num_batched_tokens")) for c in cands[1:]]
    assert pairs == [(4, 2048), (4, 512), (8, 2048), (8, 512), (2, 2048), (2, 512)]
    assert len({c.config.hash for c in cands}) == len(cands)
    assert "--max-num-seqs=8" in cands[3].config.args("/m", 1)
    assert "--max-num-batched-tokens=2048" in cands[3].config.args("/m", 1)
    assert not left_out
    few, left_out, _ = grid()
    assert len(few) == 3 and left_out == ["4 beyond max_candidates=3"]


def test_a_pair_the_engine_refuses_is_left_out_and_said():
    cands, left_out, _ = grid(max_num_seqs=[8], max_num_batched_tokens=[4, 512])
    assert [c.config.param("max_num_batched_tokens") for c in cands[1:]] == [512]
    assert left_out == ["max_num_batched_tokens 4 < max_num_seqs 8"]


def test_more_api_servers_follow_one_and_an_engine_without_the_flag_is_said():
    """The frontend axis: one API server (the engine's default, not written, so its hashes are
    the two-axis grid's) before more, each a separate candidate with the flag."""
    two_axes, _, _ = grid(max_num_seqs=[8], max_num_batched_tokens=[2048], max_candidates=10)
    cands, left_out, _ = grid(max_num_seqs=[8], max_num_batched_tokens=[2048],
                              api_server_count=[2, 1], max_candidates=10)
    assert [c.config.param("api_server_count") for c in cands[1:]] == [None, 2]
    assert cands[1].config.hash == two_axes[1].config.hash and not left_out
    assert "--api-server-count=2" in cands[2].config.args("/m", 1)
    assert "api_server_count=2" in cands[2].label and "api_server" not in cands[1].label
    assert cands[2].config.hash != cands[1].config.hash
    no_flag = TEMPLATE.model_copy(update={"args": {
        k: v for k, v in TEMPLATE.args.items() if k != "api_server_count"}})
    cands, left_out, _ = candidates(no_flag, base(), [8], [2048], 4, 10, api_server_count=[1, 2])
    assert len(cands) == 2 and left_out == [
        "api_server_count [2]: engine vllm has no API-server count flag in configs/stack.yaml"]


def test_a_prediction_orders_the_grid_when_it_covers_every_candidate():
    cands, _, basis = grid(max_candidates=10, predict=lambda c: -(c.max_num_seqs or 0))
    assert basis == "predicted"
    assert [c.config.max_num_seqs for c in cands[1:3]] == [8, 8]
    partial, _, basis = grid(predict=lambda c: None if c.max_num_seqs == 2 else 1.0)
    assert basis == RULE and partial[1].predicted is None


def clock():
    t = itertools.count(0, 10)
    return lambda: float(next(t))


def test_the_met_candidate_with_the_most_headroom_wins_and_says_by_how_much():
    cands, _, basis = grid()
    ttfts = {cands[0].config.hash: 0.9, cands[1].config.hash: 0.3, cands[2].config.hash: 0.5}
    seen_bars = []

    def measure(c: Candidate, bar):
        seen_bars.append(bar)
        return Measured(verdict(ttfts[c.config.hash]))

    r = search("cpu", cands, measure, budget_s=600, cost_s=60, basis=basis, clock=clock())
    assert r.winner.hash == cands[1].config.hash
    assert r.baseline.hash == base().hash
    # told the bar to win: nothing before the plan, then the best so far's headroom
    assert seen_bars == [math.inf, pytest.approx(0.9), pytest.approx(0.3)]
    table = r.table()
    assert [row["chosen"] for row in table] == [False, True, False]
    assert all(row["n"] == 60 and row["verdict"] == "met" for row in table)
    assert "the plan's configuration: 0.900" in r.margin  # TTFT p95 0.9 of 1 s and "next best" in r.margin
    assert "n=60" in r.margin


def test_a_budget_below_one_candidate_is_a_clear_error():
    cands, _, basis = grid()
    with pytest.raises(ConfigError, match="less than one candidate"):
        search("cpu", cands, lambda c, b: Measured(verdict(0.1)), budget_s=30, cost_s=60,
               basis=basis)


def test_candidates_past_the_budget_are_skipped_and_said():
    cands, _, basis = grid()
    t = iter([0.0, 0.0, 50.0, 100.0, 100.0])
    r = search("cpu", cands, lambda c, b: Measured(verdict(0.1)), budget_s=120, cost_s=60,
               basis=basis, clock=lambda: next(t))
    assert r.measured == 2
    assert r.table()[2]["verdict"] == "skipped" and "budget" in r.table()[2]["note"]


def test_a_crashed_candidate_is_counted_and_the_search_goes_on():
    cands, _, basis = grid()

    def measure(c, best):
        if c.config.hash == cands[1].config.hash:
            return Measured(None, crashed="engine exited with code 1: out of memory")
        return Measured(verdict(0.2))

    r = search("cpu", cands, measure, budget_s=600, cost_s=60, basis=basis, clock=clock())
    assert r.crashed == 1 and r.measured == 3
    assert r.table()[1]["verdict"] == "crashed" and "out of memory" in r.table()[1]["note"]
    assert r.winner.hash in (cands[0].config.hash, cands[2].config.hash)


def test_no_candidate_meeting_the_slo_fails_closed_with_the_best_ones_numbers():
    cands, _, basis = grid()
    slow = {cands[0].config.hash: 3.0, cands[1].config.hash: 2.5}

    def measure(c, best):
        if c.config.hash in slow:
            return Measured(verdict(slow[c.config.hash]))
        return Measured(None, crashed="engine exited with code 1")

    with pytest.raises(SearchFailed) as err:
        search("cpu", cands, measure, budget_s=600, cost_s=60, basis=basis, clock=clock())
    text = str(err.value)
    assert "not met by any of 3 candidates (1 crashed)" in text
    assert cands[1].label in text and "n=60" in text and "not met" in text


def test_a_lead_inside_min_margin_keeps_the_plans_configuration_and_says_so():
    """Two runs on a shared machine put max-num-seqs 4 ahead of the plan by 0.003 of a bound
    (docs/benchmarks.md): inside run-to-run noise, the plan's configuration stays."""
    cands, _, basis = grid()
    ttfts = {cands[0].config.hash: 0.362, cands[1].config.hash: 0.359, cands[2].config.hash: 0.9}

    def measure(c, best):
        return Measured(verdict(ttfts[c.config.hash]))

    kept = search("cpu", cands, measure, budget_s=600, cost_s=60, basis=basis, clock=clock(),
                  min_margin=0.05)
    assert kept.winner.hash == cands[0].config.hash
    assert "by more than min_margin=0.05" in kept.margin
    assert "the plan's configuration kept" in kept.margin
    assert [row["chosen"] for row in kept.table()] == [True, False, False]
    moved = search("cpu", cands, measure, budget_s=600, cost_s=60, basis=basis, clock=clock())
    assert moved.winner.hash == cands[1].config.hash
    ttfts[cands[1].config.hash] = 0.2  # well ahead: replaces the plan's
    assert search("cpu", cands, measure, budget_s=600, cost_s=60, basis=basis, clock=clock(),
                  min_margin=0.05).winner.hash == cands[1].config.hash


def test_one_slow_run_of_the_plan_does_not_hand_the_deployment_to_a_challenger():
    """The plan's two runs disagree (TTFT p90 0.3 s, then 0.9 s); a challenger at 0.35 s in
    both is ahead of the plan's worst run but not of its best: not a lead any single run
    decides, so the plan's configuration stays and the margin gives every run's number."""
    cands, _, basis = grid()
    ttfts = {cands[0].config.hash: (0.3, 0.9), cands[1].config.hash: (0.35, 0.35),
             cands[2].config.hash: (0.8, 0.8)}

    def measure(c, best):
        return Measured(runs(*ttfts[c.config.hash]))

    kept = search("cpu", cands, measure, budget_s=600, cost_s=60, basis=basis, clock=clock(),
                  min_margin=0.05)
    assert kept.winner.hash == cands[0].config.hash
    assert "(0.350, 0.350) did not all beat every run of the plan's (0.300, 0.900)" in kept.margin

    ttfts[cands[1].config.hash] = (0.2, 0.25)  # below every run of the plan's: it replaces it
    moved = search("cpu", cands, measure, budget_s=600, cost_s=60, basis=basis,
                   clock=clock(), min_margin=0.05)
    assert moved.winner.hash == cands[1].config.hash
    assert "every one of its 2 runs ahead of every one of the plan's 2" in moved.margin
    assert "p = 0.167" in moved.margin  # 1 / C(4, 2)


def test_a_plan_that_misses_the_slo_is_replaced_by_a_met_candidate_and_goodput_says_why():
    """At a rate the plan cannot keep up with, its requests queue past the TTFT bounds: not
    met, and its goodput (requests inside every bound per second) falls below the met one's."""
    cands, _, basis = grid()

    def measure(c, best):
        if c.baseline:  # a growing queue: each request waits 0.05 s longer than the one before
            recs = [RequestRecord(ok=True, start_s=float(i), ttft_s=0.2 + 0.05 * i,
                                  e2e_s=0.7 + 0.05 * i, output_tokens=11) for i in range(60)]
            return Measured(combine([judge(recs, SLO, RATE)]))
        return Measured(runs(0.3))

    r = search("cpu", cands, measure, budget_s=600, cost_s=60, basis=basis, clock=clock(),
               min_margin=0.05)
    table = {row["hash"]: row for row in r.table()}
    plan, won = table[cands[0].config.hash], table[r.winner.hash]
    assert plan["verdict"] == "not met" and won["verdict"] == "met" and not won["baseline"]
    assert plan["good"] == 17 and won["good"] == 60  # TTFT <= 1 s (the catalog's p95 bound)
    assert won["goodput_rps"] == round(60 / 59.8, 3) and plan["goodput_rps"] < won["goodput_rps"]
    assert "goodput" in r.margin and "rank test" not in r.margin  # not met: no test needed


def test_a_challenger_is_told_the_bar_the_plans_runs_and_the_margin_set():
    """Where the plan's configuration met the SLO, a challenger wins only with every run below
    every run of the plan's by more than min_margin: a run of it past the plan's best run less
    the margin already decides that it cannot win, even when it is ahead of the best so far."""
    cands, _, basis = grid()
    ttfts = {cands[0].config.hash: (0.3, 0.4), cands[1].config.hash: (0.2, 0.2),
             cands[2].config.hash: (0.25, 0.25)}
    bars = []

    def measure(c, bar):
        bars.append(bar)
        return Measured(runs(*ttfts[c.config.hash]))

    search("cpu", cands, measure, budget_s=600, cost_s=60, basis=basis, clock=clock(),
           min_margin=0.05)
    # the plan's best headroom (0.3) less 5 % before any challenger; then the best so far: 0.25, its
    # TPOT (50 ms of the 200 ms bound) now its worst percentile
    assert bars == [math.inf, pytest.approx(0.285), pytest.approx(0.25)]
    assert win_bar(None, Measured(runs(0.3, 0.4)), 0.05) == pytest.approx(0.285)
    # a plan that missed the SLO bars nothing: any met candidate replaces it
    missed = Measured(verdict(3.0))
    assert missed.verdict.outcome == "not met" and win_bar(None, missed, 0.05) == math.inf
    assert win_bar(Measured(runs(0.5)), missed, 0.05) == pytest.approx(0.5)


def at(config, precision: str, tp: int):
    """`config` as if planned at another precision and TP (a start: serving_plan.search_bases)."""
    import dataclasses

    return dataclasses.replace(config, precision=precision, tensor_parallel=tp)


def test_other_starts_are_candidates_and_start_the_grid_after_the_plans():
    b = base()
    fp8 = at(b, "fp8", 1)
    cands, left_out, basis = candidates(TEMPLATE, b, [8], [2048], target_concurrency=4,
                                        max_candidates=10, starts=[fp8])
    assert basis == RULE and not left_out
    assert [(c.config.precision, c.config.max_num_seqs, c.other_start) for c in cands] == [
        ("bf16", 4, False), ("fp8", 4, True), ("bf16", 8, False), ("fp8", 8, True)]
    assert cands[1].label.startswith("fp8 TP 1, ") and "bf16" not in cands[2].label
    assert cands[3].config.hash != cands[2].config.hash
    # a start that repeats the plan's configuration is not a second candidate
    same, _, _ = candidates(TEMPLATE, b, [8], [2048], target_concurrency=4, max_candidates=10,
                            starts=[b])
    assert len(same) == 2


def test_fewer_gpus_that_meet_the_slo_win_and_more_gpus_are_not_measured():
    b = at(base(), "fp8", 2)
    cands = [Candidate(b, baseline=True), Candidate(at(b, "bf16", 1), other_start=True),
             Candidate(at(b, "bf16", 4), other_start=True)]
    ttfts = {cands[0].config.hash: 0.2, cands[1].config.hash: 0.8}
    measured = []

    def measure(c: Candidate, bar):
        measured.append(c.config.hash)
        return Measured(runs(ttfts[c.config.hash], ttfts[c.config.hash]))

    r = search("h200", cands, measure, budget_s=600, cost_s=60, basis=RULE, clock=clock(),
               min_margin=0.05)
    # the TP 1 candidate met with less headroom than the plan's TP 2, and still won: one GPU
    assert r.winner.hash == cands[1].config.hash
    assert "on 1 GPU(s) a replica, the plan's on 2" in r.margin
    assert measured == [cands[0].config.hash, cands[1].config.hash]
    skipped = r.table()[2]
    assert skipped["verdict"] == "skipped" and "takes more GPUs" in skipped["note"]
    assert skipped["precision"] == "bf16" and skipped["tensor_parallel"] == 4


def test_a_kept_plan_without_max_num_seqs_is_recorded_and_rebuilt():
    """The engine at hand's own configuration may leave max-num-seqs to the engine: when it
    wins, its record says so (None) and applying it rebuilds the same hash."""
    from onboarding.serving.searched import SearchRecord, apply

    spec = ModelSpec(id="m", source="s3://models/m/", served_name="m")
    b = build_config(TEMPLATE, ConfigInputs(
        spec=spec, node_type="cpu", hardware="cpu", engine="vllm", engine_version="0.32.0+cpu",
        image="local", precision="bf16"))
    assert b.max_num_seqs is None
    r = search("cpu", [Candidate(b, baseline=True)], lambda c, bar: Measured(verdict(0.2)),
               budget_s=600, cost_s=60, basis=RULE, clock=clock())
    rec = SearchRecord.of("m", r)
    assert rec.max_num_seqs is None and rec.winner_hash == b.hash
    won, said = apply(b, TEMPLATE, [rec])
    assert won.hash == b.hash and said == f"searched: {b.hash} -> {b.hash}"
