"""The measured configuration search on an H100 at 13 req/s (tests/data/gpu/config-search/),
judged again: a rate the rule's configuration already serves.

Each run and candidate judged again, and the candidates rebuilt, are
tests/assets/test_config_search_recordings.py's (every search recording alike). Here: the winner
(`config_search.search` over the recorded runs, today's rule: the plan's configuration, which
the device's search, under the rule it had then, left for a challenger on one slow run). The
device's record applied on the stack that ran is the recordings test's too; here, vLLM's
auto_tune beside it (`peer/`).

Skipped, with the reason, when the recording is absent (it is made on a GPU machine by
bench/gpu_search.sh; the README beside it has the command).
"""

from __future__ import annotations

import json

import pytest

from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.config_search import Measured
from onboarding.serving.rate_verdict import MET, RateSlo, combine
from tests.search_recording import SearchRecording

RECORDING = SearchRecording(PROJECT_ROOT / "tests" / "data" / "gpu" / "config-search")

if why := RECORDING.missing():
    pytest.skip(why, allow_module_level=True)



def test_at_13_requests_a_second_the_rule_was_already_best(tmp_path):
    """Every candidate met every bound with every request inside it, so the goodput at the SLO
    is the same for all four (the offered rate, n stated). The device's search, which compared
    worst headrooms, moved to max-num-seqs 64 on one slow run of the plan; today's rule asks
    every run of a challenger to beat every run of the plan, and keeps the plan's
    configuration, saying each run's number."""
    rec = RECORDING.recorded()
    judged = RECORDING.runs_by_candidate()
    result = RECORDING.replayed_search(tmp_path, judged)
    table = {r["hash"]: r for r in result.table()}
    assert result.winner.hash == rec["baseline"] != rec["winner"]
    assert all(r["verdict"] == MET and r["good"] == r["n"] > 1200 for r in table.values())
    offered = RateSlo(**rec["rate"]).target_rate_rps
    assert all(0.9 * offered < r["goodput_rps"] < 1.1 * offered for r in table.values())
    assert "the plan's configuration kept" in result.margin
    assert "already the best" not in result.margin
    plan_runs = Measured(combine(judged[rec["baseline"]])).run_headrooms()
    assert f"every run of the plan's ({', '.join(f'{h:.3f}' for h in plan_runs)})" in \
        result.margin
    assert max(plan_runs) > 3 * min(plan_runs)  # the one slow run
    device = next(r for r in rec["table"] if r["hash"] == rec["winner"])
    assert device["chosen"] and table[rec["winner"]]["headroom"] == device["headroom"]


def test_the_recording_states_its_peer():
    peer = json.loads((RECORDING.path / "peer" / "peer.json").read_text())
    # vLLM's auto_tune on the same variant: each configuration it finished states its P99
    for r in peer["results"]:
        assert r["p99_e2el_ms"] <= peer["variables"]["MAX_LATENCY_ALLOWED_MS"]
