"""Every GPU recording of the measured configuration search (tests/data/gpu/config-search*/),
judged again by the product's own code: each run's verdict from its requests
(`rate_verdict.judge` at the run's looks), each candidate's repeated verdict and intervals
(`combine`) against the table the device printed, and the candidates and their hashes rebuilt
(`config_search.candidates` from the plan serving_config gives the twin on the recorded node
type, the stack pinned to the engine that ran).

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
