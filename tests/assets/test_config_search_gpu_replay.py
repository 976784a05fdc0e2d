"""The measured configuration search on an H100 (tests/data/gpu/config-search/), judged again.

The recording is the search's table and every request of every run (samples.jsonl.gz: what the
rate verdict reads). Here the product's own code judges those requests again: each run's
verdict (`rate_verdict.judge` at the run's looks), each candidate's repeated verdict and
intervals (`combine`), the candidates and their hashes (`config_search.candidates` from the plan
serving_config gives the twin on h100, the stack pinned to the engine that ran), and the winner
(`config_search.search` over the recorded runs, today's rule: the plan's configuration, which
the device's search, under the rule it had then, left for a challenger on one slow run). The
record the device wrote still shows how a winner flows to the node type's configuration, the
way serving_config applies configs/searched_configs.json.

Skipped, with the reason, when the recording is absent (it is made on a GPU machine by
bench/gpu_search.sh; the README beside it has the command).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.config_search import RULE, Measured, candidates, search
from onboarding.serving.rate_verdict import MET, RateSlo, combine, judge, max_looks
from onboarding.serving.searched import load_records
from onboarding.serving.stats import RequestRecord, Slo

REC = PROJECT_ROOT / "tests" / "data" / "gpu" / "config-search"
MODEL = "llama-3-1-8b-instruct-twin"

if not (REC / "search.json").is_file() or not (REC / "samples.jsonl.gz").is_file():
    pytest.skip(f"no GPU recording of the configuration search in {REC} (made by "
                "bench/gpu_search.sh on a GPU machine)", allow_module_level=True)


def recorded() -> dict:
    return json.loads((REC / "search.json").read_text())


def settings(rec: dict) -> tuple[Slo, RateSlo]:
    return Slo(**rec["slo"]), RateSlo(**rec["rate"])


def runs_by_candidate(rec: dict):
    """Per candidate hash, its runs in order, each judged again from its requests."""
    slo, rate = settings(rec)
    runs: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    bodies: dict[tuple[str, int], int] = {}
    with gzip.open(REC / "samples.jsonl.gz", "rt") as fh:
        for line in fh:
            s = json.loads(line)
            runs[s["hash"]][s["repetition"]].append(RequestRecord(
                ok=s["ok"], error=s["error"], start_s=s["start_s"], ttft_s=s["ttft_s"],
                e2e_s=s["e2e_s"], output_tokens=s["output_tokens"],
                stream_tokens=s["stream_tokens"]))
            bodies[(s["hash"], s["repetition"])] = s["bodies"]
    return {h: [judge(recs, slo, rate, max_looks(bodies[(h, i)], rate))
                for i, recs in sorted(reps.items())] for h, reps in runs.items()}


def pinned_configs(tmp_path: Path) -> Path:
    """configs/ pinned to the engine, torch, CUDA and driver that ran (as the device did)."""
    from bench.gpu_serving import pinned_configs as pin

    versions = json.loads((REC / "versions.json").read_text())["versions"]
    cfg, _ = pin(tmp_path, versions)
    return cfg


def test_each_run_and_candidate_is_judged_again_from_its_requests():
    rec = recorded()
    _, rate = settings(rec)
    judged = runs_by_candidate(rec)
    assert len(rec["table"]) >= 4 and {r["hash"] for r in rec["table"]} == set(judged)
    for row in rec["table"]:
        runs = judged[row["hash"]]
        again = combine(runs, rate.confidence)
        assert again.outcome == row["verdict"] and again.n == row["n"] > 0, row["hash"]
        assert len(runs) == row["runs"]
        assert round(Measured(again).headroom(), 4) == row["headroom"]
        for iv in again.intervals:
            assert round(iv.mean, 4) == row[iv.name], (row["hash"], iv.name)
        # a met p99 needs enough requests: every run states its n, none is under the minimum
        assert all(r.n >= rate.min_requests for r in runs)


def recorded_candidates(tmp_path):
    """The plan's configuration on the pinned stack and the recorded grid around it, built the
    way the search built them."""
    from bench.config_search import planned_base
    from resources.config_files import ConfigFiles

    rec = recorded()
    slo, _ = settings(rec)
    cf = ConfigFiles(config_dir=str(pinned_configs(tmp_path)))
    base = planned_base(cf, cf.spec(MODEL), rec["node_type"])
    seqs = sorted({r["max_num_seqs"] for r in rec["table"] if not r["baseline"]})
    tokens = sorted({r["max_num_batched_tokens"] for r in rec["table"] if not r["baseline"]},
                    reverse=True)
    cands, _, basis = candidates(cf.stack().templates[base.engine], base, seqs, tokens,
                                 slo.target_concurrency, len(rec["table"]))
    return base, cands, basis


def test_the_candidates_are_the_plans_configuration_and_its_grid(tmp_path):
    rec = recorded()
    slo, _ = settings(rec)
    base, cands, basis = recorded_candidates(tmp_path)
    # the rule's configuration: as many sequences as the SLO's target concurrency, FP8 on H100
    assert base.max_num_seqs == slo.target_concurrency and base.precision == "fp8"
    assert [c.config.hash for c in cands] == [r["hash"] for r in rec["table"]]
    # ordered by the stated rule then and now (today's text adds the API-server axis, which
    # this grid does not vary): the same candidates in the same order
    assert cands[0].baseline and rec["baseline"] == base.hash
    assert basis == RULE and rec["basis"] != "predicted" and RULE.startswith(rec["basis"][:-1])


def replayed_search(tmp_path, judged):
    """`config_search.search` over the recorded runs (`judged`), today's rule deciding."""
    rec = recorded()
    _, rate = settings(rec)
    _, cands, basis = recorded_candidates(tmp_path)

    def measure(c, best):
        return Measured(combine(judged[c.config.hash], rate.confidence))

    ticks = iter(range(10_000))
    return search(rec["node_type"], cands, measure, rec["budget_s"], 1.0, basis,
                  clock=lambda: float(next(ticks)), min_margin=rec["min_margin"])


def test_at_13_requests_a_second_the_rule_was_already_best(tmp_path):
    """Every candidate met every bound with every request inside it, so the goodput at the SLO
    is the same for all four (the offered rate, n stated). The device's search, which compared
    worst headrooms, moved to max-num-seqs 64 on one slow run of the plan; today's rule asks
    every run of a challenger to beat every run of the plan, and keeps the plan's
    configuration, saying each run's number."""
    rec = recorded()
    judged = runs_by_candidate(rec)
    result = replayed_search(tmp_path, judged)
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
    from bench.config_search import planned_base
    from onboarding.deploy.plan import build_plan
    from onboarding.deploy.serving_plan import serving_plan, with_engine_choices, with_searched
    from resources.config_files import ConfigFiles

    rec = recorded()
    records = load_records(REC / "searched_configs.json")
    assert [(r.model, r.node_type, r.winner_hash) for r in records] == \
        [(MODEL, rec["node_type"], rec["winner"])]

    def planned(cf):
        spec, nodes, stack = cf.spec(MODEL), cf.nodes(), cf.stack()
        splan = with_engine_choices(serving_plan(spec, build_plan(spec, nodes, None, None),
                                                 nodes, stack), spec, stack.templates,
                                    cf.stack_config(), cf.engine_measurements(), stack.engine)
        return spec, stack, splan

    cf = ConfigFiles(config_dir=str(pinned_configs(tmp_path)))
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
    versions = json.loads((REC / "versions.json").read_text())["versions"]
    assert versions["vllm"] == "0.22.0" and "H100" in versions["gpu"]
    assert "H100" in (REC / "card.txt").read_text()
    peer = json.loads((REC / "peer" / "peer.json").read_text())
    # vLLM's auto_tune on the same variant: each configuration it finished states its P99
    for r in peer["results"]:
        assert r["p99_e2el_ms"] <= peer["variables"]["MAX_LATENCY_ALLOWED_MS"]
