"""The measured configuration search on an H100 at 26 req/s, past what the rule's configuration
can serve (tests/data/gpu/config-search-at-capacity/), judged again.

The plan serving_config gives the 8B twin in FP8 on h100 (`--max-num-seqs=32`, the SLO's target
concurrency) queues at this rate; the search measured it and three challengers and moved the
node type to the one with the most headroom. Replayed here: `config_search.search` over the
recorded runs picks the same winner for the same reasons, its goodput at the SLO is several
times the plan's (n stated). Each run judged again, the candidates rebuilt and the device's
record applied on the stack that ran are tests/assets/test_config_search_recordings.py's.

Skipped, with the reason, when the recording is absent (made on a GPU machine by
bench/gpu_search.sh; the README beside it has the command).
"""

from __future__ import annotations

import pytest

from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.rate_verdict import MET, NOT_MET
from tests.search_recording import SearchRecording

RECORDING = SearchRecording(PROJECT_ROOT / "tests" / "data" / "gpu" / "config-search-at-capacity")

if why := RECORDING.missing():
    pytest.skip(why, allow_module_level=True)


def test_past_the_plans_capacity_the_search_moves_to_more_sequences(tmp_path):
    """The plan's configuration was decided "not met" on its first run (TTFT p99 over 2 s as
    its 32 slots queue) and not repeated; 64 sequences with a 2048-token batch budget missed
    too; 64 and 128 with 8192 met on both runs, and 128, with the lower worst headroom, won.
    Its goodput at the SLO (requests inside every bound per second) is more than four times
    the plan's, each with its n."""
    rec = RECORDING.recorded()
    result = RECORDING.replayed_search(tmp_path, RECORDING.runs_by_candidate())
    table = {r["hash"]: r for r in result.table()}
    assert result.winner.hash == rec["winner"] != rec["baseline"]
    plan, won = table[rec["baseline"]], table[rec["winner"]]
    assert plan["verdict"] == NOT_MET and plan["runs"] == 1 and plan["n"] >= 300
    assert won["verdict"] == MET and won["runs"] == 2 and won["good"] == won["n"]
    assert (won["max_num_seqs"], won["max_num_batched_tokens"]) == (128, 8192)
    assert won["goodput_rps"] > 4 * plan["goodput_rps"] > 0
    offered = RECORDING.settings()[1].target_rate_rps
    assert 0.9 * offered < won["goodput_rps"] <= offered
    missed = [r for r in table.values() if r["verdict"] != MET]
    assert {(r["max_num_seqs"], r["max_num_batched_tokens"]) for r in missed} == \
        {(32, "default"), (64, 2048)}
    # the margin says the winner's numbers with n, the next best's and the plan's
    assert f"n={plan['n']}, goodput {plan['goodput_rps']:.3g} req/s" in result.margin
    assert "next best max_num_seqs=64, max_num_batched_tokens=8192" in result.margin
    runner_up = table[next(h for h, r in table.items() if r["verdict"] == MET and h != won["hash"])]
    assert won["headroom"] < runner_up["headroom"] * (1 - rec["min_margin"])
