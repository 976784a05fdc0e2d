"""The 8B twin's sweeps with fresh prompts per load point on an H200
(tests/data/gpu/h200-fresh-prompts/), replayed: each row is recomputed from the requests
PointRecorder kept; the prompts each point sent and the engine's own counters say the points
measured prefills, not the prefix cache; and the old sweeps, whose later points re-sent earlier
points' prompts (the calibration's before these), are judged against the fresh ones with
concurrency 1, fresh in both, as the control. docs/gpu.md says these things; this holds them to
the recordings."""

from __future__ import annotations

import itertools
import json
import statistics

from bench.gpu_recordings import (
    flattered_sweeps,
    fresh_prompt_sweeps,
    itl_mean_ms_of,
    resent_before_fix,
    stats_of_point,
)
from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.stats import Slo

LOADS = [1, 8, 32, 64]


def delta(line: dict, name: str) -> float:
    return line["counters_after"][f"{name}_total"] - line["counters_before"][f"{name}_total"]


def fresh(precision: str) -> list[dict]:
    return [step for _, step, _ in fresh_prompt_sweeps() if step["precision"] == precision]


def ratios(precision: str, load: int, key: str) -> list[float]:
    """Each fresh sweep's value at `load` over the flattered sweep's (per GPU, one GPU here)."""
    _, old = flattered_sweeps()[precision]
    (o,) = [r for r in old["rows"] if r["load"] == load]
    return [r[key] / o[key] for step in fresh(precision) for r in step["rows"]
            if r["load"] == load]


def test_the_run_swept_every_precision_at_the_old_configurations():
    counts = {p: len(fresh(p)) for p in ("fp8", "bf16", "nvfp4")}
    assert counts == {"fp8": 3, "bf16": 3, "nvfp4": 2}
    for precision, (_, old) in flattered_sweeps().items():
        for step in fresh(precision):
            assert step["config_hash"] == old["config_hash"]  # the same configuration
            assert step["argv_params"]["enable_prefix_caching"] is True  # the cache was on
            assert [r["load"] for r in step["rows"]] == LOADS == [r["load"] for r in old["rows"]]
            assert step["telemetry_unavailable"] == "" and "error" not in step


def test_every_row_is_its_recorded_requests_summarized_again():
    """The row's TTFT percentiles, TPOT, throughput and request counts are what `summarize`
    makes of the point's own request records (n = the point's requests, 10 to 200)."""
    for call, step, lines in fresh_prompt_sweeps():
        assert len(lines) == len(step["rows"]), call
        slo = Slo(**step["slo"])
        for line, row in zip(lines, step["rows"], strict=True):
            s = stats_of_point(line, slo)
            assert line["load"] == row["load"] and len(line["sent"]) == s.requests
            assert (s.requests, s.completed, s.failed) == (row["requests"], row["completed"],
                                                           row["failed"]) and s.failed == 0
            assert s.ttft_s.p50 == row["ttft_p50_s"] and s.ttft_s.p95 == row["ttft_p95_s"]
            assert s.output_tokens_per_s == row["output_tokens_per_s"]
            assert s.tpot_ms.mean == row["tpot_mean_ms"]
            assert abs(itl_mean_ms_of(line) - row["itl_mean_ms"]) < 1e-9
            assert 10 <= s.requests <= 200


def test_no_point_re_sent_a_prompt_and_the_engine_served_none_from_its_cache():
    """No prompt digest in two points of a sweep, warm-up prompts apart; over every point's
    measured requests the engine looked up each prompt token the client's records say it sent
    (512 a request) and found none in its prefix cache, as the row's fraction says."""
    for call, step, lines in fresh_prompt_sweeps():
        sent = [d for x in lines for d in x["sent"]]
        assert len(set(sent)) == len(sent), (call, step["precision"])
        assert not {d for x in lines for d in x["warmup"]} & set(sent)
        for line, row in zip(lines, step["rows"], strict=True):
            prompt = line["fields"].index("prompt_tokens")
            tokens = sum(v[prompt] for v in line["records"])
            assert tokens == 512 * len(line["sent"])
            assert delta(line, "prompt_tokens") == delta(line, "prefix_cache_queries") == tokens
            assert delta(line, "prefix_cache_hits") == 0
            assert row["prefix_cache_hit_fraction"] == 0.0


def test_the_warm_up_repeats_between_points_hit_the_cache():
    """The cache was on and working: the 8 warm-up prompts, re-sent before every point, were
    found there from the second point on, 31 of each prompt's 32 blocks (96.9 %, the doc's
    figure): what a re-sent prompt of the old sweeps got."""
    for _, _, lines in fresh_prompt_sweeps():
        for prev, x in itertools.pairwise(lines):
            hits = x["counters_before"]["prefix_cache_hits_total"] - \
                prev["counters_after"]["prefix_cache_hits_total"]
            queries = x["counters_before"]["prefix_cache_queries_total"] - \
                prev["counters_after"]["prefix_cache_queries_total"]
            assert queries == 8 * 512 and hits == 8 * 31 * 16


def test_the_old_sweeps_re_sent_what_the_doc_says():
    """From the old rows' request counts alone: 12-15 % of the prompts at 8, 36-52 % at 32,
    all 200 at 64; none at 1."""
    shares = {}
    for precision, (_, old) in flattered_sweeps().items():
        resent = resent_before_fix(old["rows"])
        shares[precision] = [r / int(row["requests"]) for r, row in zip(resent, old["rows"],
                                                                         strict=True)]
        assert resent[0] == 0 and resent[3] == 200 == old["rows"][3]["requests"]
    assert 0.12 <= min(s[1] for s in shares.values()) <= max(s[1] for s in shares.values()) <= 0.15
    assert 0.36 <= min(s[2] for s in shares.values()) <= max(s[2] for s in shares.values()) <= 0.52


def test_beyond_the_control_the_fresh_sweeps_are_slower_where_the_old_ones_re_sent_most():
    """Concurrency 1 sent fresh prompts in both, so how far its tokens/s moved (0.98-1.06x) is
    what another machine and start do alone. At 64, where every old prompt was a repeat, every
    fresh sweep's tokens/s moved further than that, downward; at 32 and 64 every fresh sweep's
    TTFT p50 and the engine's own mean TTFT are above the old; at 32 bf16's tokens/s stayed
    within the control, FP8's and NVFP4's did not."""
    control = {p: ratios(p, 1, "output_tokens_per_s") for p in ("fp8", "bf16", "nvfp4")}
    assert 0.98 <= min(min(v) for v in control.values())
    assert max(max(v) for v in control.values()) <= 1.065
    for precision, c1 in control.items():
        spread = max(abs(r - 1) for r in c1)
        at64 = ratios(precision, 64, "output_tokens_per_s")
        assert all(r < 1 - spread for r in at64), (precision, at64, spread)
        for load in (32, 64):
            assert min(ratios(precision, load, "ttft_p50_s")) > 1.1, (precision, load)
            assert min(ratios(precision, load, "server_ttft_mean_s")) > 1, (precision, load)
        assert min(ratios(precision, 64, "server_ttft_mean_s")) > 1.1, precision
        at32 = ratios(precision, 32, "output_tokens_per_s")
        within = max(abs(r - 1) for r in at32) <= spread
        assert within == (precision == "bf16"), (precision, at32, spread)
    assert [round(r, 2) for r in ratios("nvfp4", 64, "output_tokens_per_s")] == [0.68, 0.68]


def test_every_fresh_sweep_still_meets_the_slo_at_its_target_and_none_at_64():
    for precision in ("fp8", "bf16", "nvfp4"):
        for step in fresh(precision):
            by_load = {r["load"]: r for r in step["rows"]}
            assert by_load[32]["meets_slo"] and by_load[32]["ttft_p95_s"] <= 1.5
            assert not by_load[64]["meets_slo"]


def test_the_calibration_holds_the_first_fresh_sweep_of_each_precision():
    """configs/predict/h200_points.json: the 8B twin's points are the first fresh sweep's rows
    at 1, 8 and 32 (64 measured a queue: max-num-seqs 32), none of the old sweeps'."""
    points = json.loads((PROJECT_ROOT / "configs" / "predict" / "h200_points.json").read_text())
    twin = [p for p in points["points"] if p["model"] == "llama-3-1-8b-instruct-twin"]
    first = {"fp8": "vllm-twins-1", "bf16": "vllm-twins-1", "nvfp4": "vllm-twins-2"}
    steps = {}
    for call, step, _ in fresh_prompt_sweeps():
        steps.setdefault(step["precision"], (call, step))
    for precision, (call, step) in steps.items():
        assert call == first[precision]
        mine = {p["concurrency"]: p for p in twin if p["precision"] == precision}
        assert sorted(mine) == [1, 8, 32]
        rows = {r["load"]: r for r in step["rows"]}
        for conc, p in mine.items():
            assert f"h200-fresh-prompts/{call}.json" in p["source"]
            assert p["ttft_p50_ms"] == rows[conc]["ttft_p50_s"] * 1e3
            assert p["ttft_p95_ms"] == rows[conc]["ttft_p95_s"] * 1e3
            assert p["output_tokens_per_s"] == rows[conc]["output_tokens_per_s"]
    assert len(twin) == 9
    # the first sweep is the middle one of the fresh sweeps at 32 for FP8 and bf16 (TTFT p50)
    for precision in ("fp8", "bf16"):
        p50s = [r["ttft_p50_s"] for s in fresh(precision) for r in s["rows"] if r["load"] == 32]
        assert p50s[0] == statistics.median(p50s)
