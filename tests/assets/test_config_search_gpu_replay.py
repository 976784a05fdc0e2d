"""The measured configuration search on an H100 at 13 req/s (tests/data/gpu/config-search/),
judged again: a rate the rule's configuration already serves.

Each run and candidate judged again, and the candidates rebuilt, are
tests/assets/test_config_search_recordings.py's (every search recording alike). Here: the winner
(`config_search.search` over the recorded runs, today's rule: the plan's configuration, which
the device's search, under the rule it had then, left for a challenger on one slow run). The
record the device wrote still shows how a winner flows to the node type's configuration, the
way serving_config applies configs/searched_configs.json.

Skipped, with the reason, when the recording is absent (it is made on a GPU machine by
bench/gpu_search.sh; the README beside it has the command).
"""

from __future__ import annotations

import json

import pytest

from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.config_search import Measured
from onboarding.serving.rate_verdict import MET, RateSlo, combine
from onboarding.serving.searched import load_records
from tests.search_recording import MODEL, SearchRecording

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


def test_the_recorded_winner_is_what_the_node_type_would_deploy(tmp_path):
    """configs/searched_configs.json as the search wrote it, applied the way serving_config
    applies it: on the stack that ran, h100's configuration is the winner (one hash, its two
    numbers in the engine's arguments); on today's stack the plan's configuration hash differs,
    so the record is not applied and says why."""
    from bench.config_search import planned_base, planned_serving
    from onboarding.deploy.serving_plan import with_searched
    from resources.config_files import ConfigFiles

    rec = RECORDING.recorded()
    records = load_records(RECORDING.path / "searched_configs.json")
    assert [(r.model, r.node_type, r.winner_hash) for r in records] == \
        [(MODEL, rec["node_type"], rec["winner"])]

    def planned(cf):
        spec = cf.spec(MODEL)
        return spec, cf.stack(), planned_serving(cf, spec)

    cf = ConfigFiles(config_dir=str(RECORDING.pinned_configs(tmp_path)))
    spec, stack, splan = planned(cf)
    assert splan.config(rec["node_type"]).hash == rec["baseline"] == \
        planned_base(cf, spec, rec["node_type"]).hash
    searched = with_searched(splan, spec, stack.templates, records)
    won = searched.config(rec["node_type"])
    row = next(r for r in rec["table"] if r["chosen"])
    assert won.hash == rec["winner"]
    args = won.args("/m", 8000, "127.0.0.1")
    assert f"--max-num-seqs={row['max_num_seqs']}" in args
    if row["max_num_batched_tokens"] != "default":
        assert f"--max-num-batched-tokens={row['max_num_batched_tokens']}" in args
    assert dict(searched.search_notes)[rec["node_type"]] == \
        f"searched: {rec['baseline']} -> {rec['winner']}"

    today = ConfigFiles()
    spec, stack, splan = planned(today)
    kept = with_searched(splan, spec, stack.templates, records)
    assert kept.config(rec["node_type"]) == splan.config(rec["node_type"])
    assert f"it started from {rec['baseline']}" in dict(kept.search_notes)[rec["node_type"]]


def test_the_recording_states_its_card_versions_and_peer():
    versions = RECORDING.versions()
    assert versions["vllm"] == "0.22.0" and "H100" in versions["gpu"]
    assert "H100" in (RECORDING.path / "card.txt").read_text()
    peer = json.loads((RECORDING.path / "peer" / "peer.json").read_text())
    # vLLM's auto_tune on the same variant: each configuration it finished states its P99
    for r in peer["results"]:
        assert r["p99_e2el_ms"] <= peer["variables"]["MAX_LATENCY_ALLOWED_MS"]
