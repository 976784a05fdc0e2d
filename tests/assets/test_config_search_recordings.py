"""Every GPU recording of the measured configuration search (tests/data/gpu/config-search*/),
judged again by the product's own code: each run's verdict from its requests
(`rate_verdict.judge` at the run's looks), each candidate's repeated verdict and intervals
(`combine`) against the table the device printed, and the candidates and their hashes rebuilt
(`config_search.candidates` from the plan serving_config gives the twin on the recorded node
type, the stack pinned to the engine that ran), the record the device wrote applied the way
serving_config applies configs/searched_configs.json, and each recording's card and versions.

A recording that is absent is skipped with the reason (they are made on a GPU machine by
bench/gpu_search.sh; each README has its command).
"""

from __future__ import annotations

import pytest

from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.config_search import RULE, Measured
from onboarding.serving.rate_verdict import combine
from tests.search_recording import SearchRecording

GPU = PROJECT_ROOT / "tests" / "data" / "gpu"
RECORDINGS = sorted(p.name for p in GPU.glob("config-search*") if p.is_dir())


@pytest.fixture(params=RECORDINGS)
def recording(request) -> SearchRecording:
    r = SearchRecording(GPU / request.param)
    if why := r.missing():
        pytest.skip(why)
    return r


def test_every_recording_is_here():
    assert RECORDINGS == ["config-search", "config-search-at-capacity",
                          "config-search-precision"]


def test_each_run_and_candidate_is_judged_again_from_its_requests(recording):
    rec = recording.recorded()
    _, rate = recording.settings()
    judged = recording.runs_by_candidate()
    assert len(rec["table"]) >= 4 and {r["hash"] for r in rec["table"]} == set(judged)
    for row in rec["table"]:
        runs = judged[row["hash"]]
        again = combine(runs, rate.confidence)
        assert again.outcome == row["verdict"] and again.n == row["n"] > 0, row["hash"]
        assert len(runs) == row["runs"]
        assert round(Measured(again).headroom(), 4) == row["headroom"]
        for iv in again.intervals:
            assert round(iv.mean, 4) == row[iv.name], (row["hash"], iv.name)
        # a verdict at p99 needs enough requests: every run states its n, none under the minimum
        assert all(r.n >= rate.min_requests for r in runs)


def test_the_candidates_are_the_plans_configuration_and_its_grid(recording, tmp_path):
    rec = recording.recorded()
    slo, _ = recording.settings()
    base, cands, basis = recording.candidates(tmp_path)
    # the rule's configuration: as many sequences as the SLO's target concurrency, FP8
    assert base.max_num_seqs == slo.target_concurrency and base.precision == "fp8"
    assert [c.config.hash for c in cands] == [r["hash"] for r in rec["table"]]
    # ordered by the stated rule then and now (later texts add the API-server axis and the
    # other starts' place, which the older grids do not vary): the same candidates in the same
    # order
    assert cands[0].baseline and rec["baseline"] == base.hash
    assert basis == RULE and rec["basis"] != "predicted" and RULE.startswith(rec["basis"][:-1])


def test_the_devices_record_is_what_the_node_type_deploys_on_the_stack_that_ran(recording,
                                                                                tmp_path):
    """searched_configs.json as the device wrote it, applied the way serving_config applies
    it (with the memory plan, so a winner at another precision or TP is rebuilt): on the stack
    that ran the node type's configuration is the winner, one hash, at the winner's precision
    and TP, with its numbers in the engine's arguments; on today's stack the plan's hash
    differs, so the record is not applied and says why."""
    from bench.config_search import planned_base, planned_serving
    from onboarding.deploy.serving_plan import with_searched
    from onboarding.serving.searched import load_records
    from resources.config_files import ConfigFiles
    from tests.search_recording import MODEL

    rec = recording.recorded()
    nt = rec["node_type"]
    records = load_records(recording.path / "searched_configs.json")
    assert [(r.model, r.node_type, r.winner_hash) for r in records] == \
        [(MODEL, nt, rec["winner"])]

    def searched(cf: ConfigFiles):
        spec, stack = cf.spec(MODEL), cf.stack()
        splan = planned_serving(cf, spec)
        return spec, splan, with_searched(splan, spec, stack.templates, records, cf.nodes(),
                                          stack)

    cf = ConfigFiles(config_dir=str(recording.pinned_configs(tmp_path)))
    spec, splan, applied = searched(cf)
    assert splan.config(nt).hash == rec["baseline"] == planned_base(cf, spec, nt).hash
    won, row = applied.config(nt), next(r for r in rec["table"] if r["hash"] == rec["winner"])
    assert won.hash == rec["winner"]
    assert dict(applied.search_notes)[nt] == f"searched: {rec['baseline']} -> {rec['winner']}"
    assert applied.plan.node(nt).precision == won.precision == row.get("precision", "fp8")
    args = won.args("/m", 8000, "127.0.0.1")
    assert f"--max-num-seqs={row['max_num_seqs']}" in args
    if row["max_num_batched_tokens"] != "default":
        assert f"--max-num-batched-tokens={row['max_num_batched_tokens']}" in args
    _, today, kept = searched(ConfigFiles())
    assert kept.config(nt) == today.config(nt)
    assert f"it started from {rec['baseline']}" in dict(kept.search_notes)[nt]


def test_the_recording_states_its_card_rate_and_versions(recording):
    versions = recording.versions()
    assert versions["vllm"] == "0.22.0" and "H100" in versions["gpu"]
    rate = recording.settings()[1].target_rate_rps
    card = (recording.path / "card.txt").read_text()
    assert "H100" in card and f"node type {recording.recorded()['node_type']}, rate {rate:g}" \
        in card
