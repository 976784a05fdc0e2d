"""The measured configuration search on an H100 with a precision axis
(tests/data/gpu/config-search-precision/), judged again.

The plan serving_config gives the 8B twin on h100 serves FP8 with `--max-num-seqs=32`; the
search also started from the plan's configuration in BF16 (the twin's source precision, native
on Hopper, which needs no gate), each with 128 sequences x 8192 batched tokens, four candidates
at 26 req/s. Replayed here: `config_search.search` over the recorded runs picks the same
winner, FP8 beats BF16 at the same batching by a measured margin with n, and a BF16 winner
would move h100's memory plan. Each run judged again, the candidates rebuilt and the device's
record applied on the stack that ran are tests/assets/test_config_search_recordings.py's.

Skipped, with the reason, when the recording is absent (made on a GPU machine by
bench/gpu_search.sh; the README beside it has the command).
"""

from __future__ import annotations

import pytest

from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.rate_verdict import MET, NOT_MET
from onboarding.serving.searched import load_records
from tests.search_recording import MODEL, SearchRecording

RECORDING = SearchRecording(PROJECT_ROOT / "tests" / "data" / "gpu" / "config-search-precision")

if why := RECORDING.missing():
    pytest.skip(why, allow_module_level=True)


def _row(table: dict, precision: str, seqs: int) -> dict:
    return next(r for r in table.values()
                if (r["precision"], r["max_num_seqs"]) == (precision, seqs))


def test_fp8_wins_over_bf16_at_the_same_batching_and_both_beat_the_plan(tmp_path):
    """At 32 sequences both precisions queue ("not met" on their first run, not repeated; BF16
    worse: its decode is slower and its TTFT p99 higher); at 128 x 8192 both meet, and FP8, with
    the lower worst headroom, wins. BF16's one run was already past the bar FP8 had set, so it
    was not repeated (the early stop)."""
    rec = RECORDING.recorded()
    result = RECORDING.replayed_search(tmp_path, RECORDING.runs_by_candidate())
    table = {r["hash"]: r for r in result.table()}
    assert result.winner.hash == rec["winner"] != rec["baseline"]
    won = table[rec["winner"]]
    assert (won["precision"], won["max_num_seqs"], won["max_num_batched_tokens"]) == \
        ("fp8", 128, 8192)
    assert won["verdict"] == MET and won["runs"] == 2 and won["good"] == won["n"]
    plan, bf16_plan = table[rec["baseline"]], _row(table, "bf16", 32)
    assert plan["precision"] == "fp8" and plan["verdict"] == bf16_plan["verdict"] == NOT_MET
    assert bf16_plan["ttft_p99"] > plan["ttft_p99"]
    assert bf16_plan["tpot_mean"] > plan["tpot_mean"]
    bf16 = _row(table, "bf16", 128)
    device_row = next(r for r in rec["table"] if r["hash"] == bf16["hash"])
    assert bf16["verdict"] == MET and bf16["runs"] == 1 and "not repeated" in device_row["note"]
    assert won["headroom"] < bf16["headroom"] * (1 - rec["min_margin"])
    assert bf16["tpot_mean"] > 1.5 * won["tpot_mean"]  # the BF16 weights read per token
    assert won["goodput_rps"] > 4 * plan["goodput_rps"] > 0
    assert "next best bf16 TP 1, max_num_seqs=128" in result.margin


def test_a_bf16_winner_from_this_search_would_move_h100_to_bf16(tmp_path):
    """Had BF16 won, the same record format rebuilds it from the plan: the recorded BF16
    candidate's hash, and h100's memory plan at BF16 (the weights the manifest publishes)."""
    import dataclasses

    from bench.config_search import planned_serving
    from onboarding.deploy.serving_plan import with_searched
    from resources.config_files import ConfigFiles

    rec = RECORDING.recorded()
    bf16 = next(r for r in rec["table"] if (r["precision"], r["max_num_seqs"]) == ("bf16", 128))
    record = dataclasses.replace(load_records(RECORDING.path / "searched_configs.json")[0],
                                 winner_hash=bf16["hash"], precision="bf16")
    cf = ConfigFiles(config_dir=str(RECORDING.pinned_configs(tmp_path)))
    spec = cf.spec(MODEL)
    searched = with_searched(planned_serving(cf, spec), spec, cf.stack().templates, [record],
                             cf.nodes(), cf.stack())
    assert searched.config("h100").hash == bf16["hash"]
    assert searched.plan.node("h100").precision == "bf16"
