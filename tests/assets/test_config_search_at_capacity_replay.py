"""The measured configuration search on an H100 at 26 req/s, past what the rule's configuration
can serve (tests/data/gpu/config-search-at-capacity/), judged again.

The plan serving_config gives the 8B twin in FP8 on h100 (`--max-num-seqs=32`, the SLO's target
concurrency) queues at this rate; the search measured it and three challengers and moved the
node type to the one with the most headroom. Replayed here: `config_search.search` over the
recorded runs picks the same winner for the same reasons, its goodput at the SLO is several
times the plan's (n stated). Each run judged again, the candidates rebuilt and the device's
record applied on the stack that ran are tests/assets/test_config_search_recordings.py's. Beside
it, vLLM's auto_tune over the same card type, engine and variant (`peer/`).

Skipped, with the reason, when the recording is absent (made on a GPU machine by
bench/gpu_search.sh; the README beside it has the command).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

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


BURST = re.compile(r"^(Request throughput \(req/s\)|P99 E2EL \(ms\)|Successful requests):\s+(\S+)",
                   re.MULTILINE)


def test_vllms_auto_tune_finished_its_grid_and_found_the_same_configuration():
    """vLLM's auto_tune over the same grid's 8192-token pair (`peer/`), on the same card type,
    engine and variant, ran to completion. Each configuration it accepted is read back from its
    own `vllm bench serve` log (not its summary line), and its best is the search's winner:
    two different procedures, one answer, each with what it rests on."""
    peer = json.loads((RECORDING.path / "peer" / "peer.json").read_text())
    rec = RECORDING.recorded()
    assert peer["rc"] == 0 and not peer["timed_out"] and not peer["missed"]
    assert "permutations_s" in peer
    bound = peer["variables"]["MAX_LATENCY_ALLOWED_MS"]
    for r in peer["results"]:
        log = RECORDING.path / "peer" / (f"bm_log_{r['max_num_seqs']}_"
                                         f"{r['max_num_batched_tokens']}_requestrate_"
                                         f"{r['request_rate']}.txt")
        stats = dict(BURST.findall(log.read_text()))
        assert float(stats["P99 E2EL (ms)"]) == r["p99_e2el_ms"] <= bound
        assert float(stats["Request throughput (req/s)"]) == r["throughput_rps"]
        assert int(stats["Successful requests"]) == 100  # a burst, not a sustained rate
        # the infinite-rate run before it missed the bound: that is why the rate was walked
        first = dict(BURST.findall(log.with_name(
            f"bm_log_{r['max_num_seqs']}_{r['max_num_batched_tokens']}_requestrate_inf.txt")
            .read_text()))
        assert float(first["P99 E2EL (ms)"]) > bound
    best = max(peer["results"], key=lambda r: r["throughput_rps"])
    assert peer["best"]["throughput_rps"] == best["throughput_rps"]
    won = next(r for r in rec["table"] if r["hash"] == rec["winner"])
    assert (best["max_num_seqs"], best["max_num_batched_tokens"]) == \
        (won["max_num_seqs"], won["max_num_batched_tokens"]) == (128, 8192)


def test_the_report_compares_the_bests_and_the_wall_time():
    out = subprocess.run([sys.executable, str(PROJECT_ROOT / "bench" / "search_vs_auto_tune.py"),
                          "report", str(RECORDING.path)], capture_output=True, text=True,
                         timeout=120, cwd=PROJECT_ROOT, check=True).stdout
    assert "best configuration: the same for both" in out
    assert "auto_tune: 2 of its configurations" in out and "ratio auto_tune/search" in out
