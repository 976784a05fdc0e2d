"""Recorded search winners applied to the real plan: the manifest renders the winner (one hash)
with the measurements at that hash; a stale record keeps the plan's configuration and says so."""

from __future__ import annotations

import dataclasses

import pytest

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.kserve import load_deploy
from onboarding.deploy.plan import Measured, load_nodes, plan, plan_inputs, shape_from_hint
from onboarding.deploy.serving_plan import (
    config_at_hand,
    render_targets,
    search_bases,
    serving_plan,
    with_searched,
)
from onboarding.fetch.catalog import load_catalog
from onboarding.serving.config_search import with_batching
from onboarding.serving.searched import SearchRecord, dump_records, load_records
from onboarding.serving.stack import load_stack
from onboarding.serving.stats import ServingBenchmarkResult

CONFIGS = PROJECT_ROOT / "configs"
NODES = load_nodes(CONFIGS / "nodes.yaml")
STACK = load_stack(CONFIGS / "stack.yaml")
DEPLOY = load_deploy(CONFIGS / "deploy.yaml")
LLAMA = load_catalog(CONFIGS / "models")["llama-3-1-70b-instruct"]
VLLM = STACK.templates["vllm"]


def planned():
    p = plan(plan_inputs(LLAMA, NODES, shape_from_hint(LLAMA.architecture, "t"), Measured()),
             NODES)
    return serving_plan(LLAMA, p, NODES, STACK)


def record(base, seqs=128, tokens=8192, servers=None, **kw):
    won = with_batching(VLLM, base, seqs, tokens, servers)
    return SearchRecord(model=LLAMA.id, node_type=base.node_type, base_hash=base.hash,
                        winner_hash=won.hash, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                        api_server_count=servers,
                        basis="rule", margin="winner ... (n=300)", candidates=4,
                        table=({"hash": won.hash, "chosen": True, "n": 300},), **kw)


def test_the_manifest_renders_the_searched_winner_with_its_measurements(tmp_path):
    splan = planned()
    base = splan.config("h200")
    rec = record(base)
    path = tmp_path / "searched_configs.json"
    path.write_text(dump_records([rec]))
    searched = with_searched(splan, LLAMA, STACK.templates, load_records(path))
    won = searched.config("h200")
    assert won.hash == rec.winner_hash != base.hash
    assert searched.config("b300") == splan.config("b300")  # no record there
    assert dict(searched.search_notes) == {"h200": f"searched: {base.hash} -> {won.hash}"}
    bench = ServingBenchmarkResult(model=LLAMA.id, precision=won.precision, node_type="h200",
                                   gpus=won.tensor_parallel, servable=True,
                                   tokens_per_s_per_gpu=1000.0, saturation_concurrency=64,
                                   slo_pass=True, config_hash=won.hash)
    rendered, _ = render_targets(LLAMA, searched, NODES, STACK, DEPLOY, None, None, bench)
    h200 = next(r for r in rendered if r.node_type == "h200")
    assert h200.config_hash == won.hash and h200.measured
    text = str(h200.docs)
    assert "--max-num-seqs=128" in text and "--max-num-batched-tokens=8192" in text
    assert f"--max-num-seqs={base.max_num_seqs}'" not in text


def test_a_stale_record_keeps_the_plans_configuration_and_says_why():
    splan = planned()
    base = splan.config("h200")
    other = dataclasses.replace(record(base), base_hash="0123456789ab")
    searched = with_searched(splan, LLAMA, STACK.templates, [other])
    assert searched.config("h200") == base
    assert "it started from 0123456789ab" in dict(searched.search_notes)["h200"]
    forged = dataclasses.replace(record(base), winner_hash="ffffffffffff")
    kept = with_searched(splan, LLAMA, STACK.templates, [forged])
    assert kept.config("h200") == base
    assert "not the recorded ffffffffffff" in dict(kept.search_notes)["h200"]


def test_the_engine_at_hand_starts_its_searched_winner():
    """No plan for the CPU node type: the local configuration's recorded winner is started."""
    local = {"node_type": "cpu", "hardware": "cpu", "engine": "vllm",
             "engine_version": "0.32.0+cpu", "precision": "bf16"}
    empty = serving_plan(LLAMA, plan(plan_inputs(LLAMA, NODES, shape_from_hint(
        LLAMA.architecture, "t"), Measured()), NODES), NODES, STACK)
    empty = dataclasses.replace(empty, configs={})
    base = config_at_hand(empty, LLAMA, VLLM, local)
    rec = record(base, seqs=8, tokens=2048)
    searched = with_searched(empty, LLAMA, STACK.templates, [rec])
    started = config_at_hand(searched, LLAMA, VLLM, local)
    assert started.hash == rec.winner_hash and started.max_num_seqs == 8


def test_a_broken_record_file_is_a_config_error(tmp_path):
    p = tmp_path / "searched_configs.json"
    p.write_text('{"searches": [{"model": "m"}]}')
    with pytest.raises(ConfigError, match="not a search record file"):
        load_records(p)
    assert load_records(tmp_path / "absent.json") == []


def test_the_report_shows_each_search_table_and_margin():
    from onboarding.reports.pages import Table, Text, _search_blocks

    splan = planned()
    searched = with_searched(splan, LLAMA, STACK.templates, [record(splan.config("h200"))])
    blocks = _search_blocks(searched)
    assert isinstance(blocks[1], Table) and blocks[1].rows[0]["chosen"]
    assert "4 candidates measured (0 crashed)" in blocks[0].text
    assert "searched:" in blocks[0].text and isinstance(blocks[2], Text)
    assert "n=300" in blocks[2].text
    assert _search_blocks(splan) == []


def test_a_winner_with_more_api_servers_is_rendered_with_them(tmp_path):
    splan = planned()
    base = splan.config("h200")
    rec = record(base, servers=4)
    path = tmp_path / "searched_configs.json"
    path.write_text(dump_records([rec]))
    won = with_searched(splan, LLAMA, STACK.templates, load_records(path)).config("h200")
    assert won.hash == rec.winner_hash
    assert "--api-server-count=4" in won.args("/m", 8000)
    # a record written before the API-server axis (no such field) still loads and applies
    old = tmp_path / "old.json"
    old.write_text(dump_records([record(base)]).replace('  "api_server_count": null,\n', ""))
    assert "api_server_count" not in old.read_text()
    again = with_searched(splan, LLAMA, STACK.templates, load_records(old)).config("h200")
    assert again.hash == record(base).winner_hash and "--api-server-count" not in \
        " ".join(again.args("/m", 8000))


def test_a_winner_at_another_precision_and_tp_moves_the_node_plan_and_the_manifest():
    splan = planned()
    plan_cfg = splan.config("h200")
    bases, left_out = search_bases(splan, LLAMA, NODES, STACK, "h200")
    assert (plan_cfg.precision, plan_cfg.tensor_parallel) == ("fp8", 2)
    assert ("bf16", 4) in {(b.precision, b.tensor_parallel) for b in bases}
    assert any(w.startswith("bf16 TP 1: infeasible") for w in left_out)  # 70B bf16 on one GPU
    _, at_hand = search_bases(splan, LLAMA, NODES, STACK, "h200", max_tensor_parallel=2)
    assert "bf16 TP 4: 2 GPU(s) at hand" in at_hand
    start = next(b for b in bases if (b.precision, b.tensor_parallel) == ("bf16", 4))
    won = with_batching(VLLM, start, 64, 8192)
    rec = SearchRecord(model=LLAMA.id, node_type="h200", base_hash=plan_cfg.hash,
                       winner_hash=won.hash, max_num_seqs=64, max_num_batched_tokens=8192,
                       precision="bf16", tensor_parallel=4, candidates=3, margin="m")
    searched = with_searched(splan, LLAMA, STACK.templates, [rec], NODES, STACK)
    cfg = searched.config("h200")
    assert cfg.hash == won.hash and (cfg.precision, cfg.tensor_parallel) == ("bf16", 4)
    node = searched.plan.node("h200")
    assert (node.precision, node.tensor_parallel) == ("bf16", 4) and "measured search" in \
        node.tp_basis
    assert searched.plan.node("h100") == splan.plan.node("h100")
    rendered, _ = render_targets(LLAMA, searched, NODES, STACK, DEPLOY, None, None, None)
    h200 = next(r for r in rendered if r.node_type == "h200")
    assert h200.config_hash == won.hash
    text = str(h200.docs)
    assert "'nvidia.com/gpu': 4" in text or "'nvidia.com/gpu': '4'" in text
    assert "--tensor-parallel-size=4" in text
    # without the memory plan (nodes, stack) the record cannot be rebuilt: kept, and said
    kept = with_searched(splan, LLAMA, STACK.templates, [rec])
    assert kept.config("h200") == plan_cfg and "bf16 at TP 4" in dict(kept.search_notes)["h200"]


def test_a_winner_at_a_precision_the_gate_failed_since_is_not_applied():
    p = plan(plan_inputs(LLAMA, NODES, shape_from_hint(LLAMA.architecture, "t"),
                         Measured(passed_precisions=("bf16",))), NODES)
    gated = serving_plan(LLAMA, p, NODES, STACK)
    ungated = planned()
    start = next(b for b in search_bases(ungated, LLAMA, NODES, STACK, "b300")[0]
                 if (b.precision, b.tensor_parallel) == ("fp8", 1))
    won = with_batching(VLLM, start, 64, 8192)
    base_cfg = gated.config("b300")
    assert base_cfg.precision == "bf16"  # nvfp4 and fp8 failed the gate
    rec = SearchRecord(model=LLAMA.id, node_type="b300", base_hash=base_cfg.hash,
                       winner_hash=won.hash, max_num_seqs=64, max_num_batched_tokens=8192,
                       precision="fp8", tensor_parallel=1)
    kept = with_searched(gated, LLAMA, STACK.templates, [rec], NODES, STACK)
    assert kept.config("b300") == base_cfg
    assert "no longer a starting point" in dict(kept.search_notes)["b300"]


def test_a_cells_search_moves_only_its_node_type():
    """A cell's `config_search` winner applies to that cell's node type; the others keep what
    serving_config gave them (here a file record's winner on b300), and a search that did not
    run changes nothing."""
    from onboarding.deploy.serving_plan import with_cell_search
    from onboarding.serving.searched import CellSearch

    splan = planned()
    filed = with_searched(splan, LLAMA, STACK.templates, [record(splan.config("b300"))],
                          NODES, STACK)
    cell = record(filed.config("h200"), seqs=64)
    moved = with_cell_search(filed, LLAMA, CellSearch(cell, "m"), NODES, STACK)
    assert moved.config("h200").hash == cell.winner_hash != filed.config("h200").hash
    assert moved.config("b300") == filed.config("b300") != splan.config("b300")
    assert moved.searched == (*filed.searched, cell)
    assert dict(moved.search_notes)["h200"].startswith("searched:")
    assert "b300" in dict(moved.search_notes)
    assert with_cell_search(filed, LLAMA, CellSearch(None, "not run"), NODES, STACK) is filed
    assert with_cell_search(filed, LLAMA, None, NODES, STACK) is filed


def test_the_other_engines_start_the_grid_in_their_own_flags():
    """The plan's h200 configuration in every other engine template with kernels for FP8 on
    Hopper (as the engine choice builds it), at that engine's pin; an engine not installed where
    the search runs is left out, said. The grid from an SGLang start is rendered in SGLang's
    flags, and SGLang takes no API-server count (left out, said)."""
    from onboarding.deploy.serving_plan import engine_bases
    from onboarding.serving.config_search import candidates

    splan = planned()
    base = splan.config("h200")
    starts, _ = engine_bases(splan, LLAMA, STACK, "h200")
    sglang = next(s for s in starts if s.engine == "sglang")
    assert (sglang.precision, sglang.tensor_parallel) == (base.precision, base.tensor_parallel)
    assert sglang.engine_version == STACK.versions["sglang"] and sglang.hash != base.hash
    assert sglang.max_num_seqs == base.max_num_seqs
    none, at_hand = engine_bases(splan, LLAMA, STACK, "h200", at_hand=frozenset({"vllm"}))
    assert none == [] and any(w.startswith(f"engine sglang {STACK.versions['sglang']}: not "
                                           "installed where this search runs") for w in at_hand)
    cands, grid_left_out, _ = candidates(VLLM, base, [128], [8192], 32, 10,
                                         api_server_count=[1, 2], starts=[sglang],
                                         templates=STACK.templates)
    theirs = [c for c in cands if c.config.engine == "sglang"]
    assert [c.label for c in theirs] == [
        (f"sglang fp8 TP 2, max_num_seqs={base.max_num_seqs}, max_num_batched_tokens=engine "
         "default"), "sglang fp8 TP 2, max_num_seqs=128, max_num_batched_tokens=8192"]
    argv = " ".join(theirs[1].config.param_args)
    assert "--max-running-requests 128" in argv or "--max-running-requests=128" in argv
    assert "chunked-prefill-size" in argv and "max-num-seqs" not in argv
    assert "api_server_count [2]: engine sglang has no API-server count flag" in \
        "; ".join(grid_left_out)
    ours = [c for c in cands if c.config.engine == "vllm"]
    assert any(c.config.param("api_server_count") == 2 for c in ours)
    # at equal numbers the plan's engine comes first
    assert cands.index(ours[1]) < cands.index(theirs[1])


def test_a_winner_in_another_engine_moves_the_engine_choice_and_the_manifest():
    """A recorded winner in SGLang is rebuilt from the plan's configuration in SGLang's template
    (same hash), replaces the node type's engine choice (basis: the measured search, its margin
    said), and the manifest runs SGLang's image and flags; without the stack it is kept out."""
    from onboarding.deploy.engine_choice import SEARCHED
    from onboarding.deploy.serving_plan import engine_bases, with_engine_choices
    from resources.config_files import ConfigFiles

    cf = ConfigFiles()
    splan = with_engine_choices(planned(), LLAMA, STACK.templates, cf.stack_config(), [],
                                STACK.engine)
    base = splan.config("h200")
    sglang = next(s for s in engine_bases(splan, LLAMA, STACK, "h200")[0]
                  if s.engine == "sglang")
    won = with_batching(STACK.templates["sglang"], sglang, 128, 8192)
    rec = SearchRecord(model=LLAMA.id, node_type="h200", base_hash=base.hash,
                       winner_hash=won.hash, max_num_seqs=128, max_num_batched_tokens=8192,
                       engine="sglang", candidates=4, margin="sglang ahead (n=1300)")
    searched = with_searched(splan, LLAMA, STACK.templates, [rec], NODES, STACK)
    cfg = searched.config("h200")
    assert cfg.hash == won.hash and cfg.engine == "sglang"
    choice = searched.engine_choice("h200")
    assert choice.engine == "sglang" and choice.basis == SEARCHED
    assert "sglang ahead (n=1300)" in choice.reason and choice.config_hash == won.hash
    assert searched.engine_choice("b300") == splan.engine_choice("b300")
    rendered, _ = render_targets(LLAMA, searched, NODES, STACK, DEPLOY, None, None, None)
    text = str(next(r for r in rendered if r.node_type == "h200").docs)
    assert "sglang.launch_server" in text and "--max-running-requests=128" in text
    assert "--chunked-prefill-size=8192" in text and "--max-num-seqs" not in text
    assert won.image in text
    kept = with_searched(splan, LLAMA, STACK.templates, [rec])
    assert kept.config("h200") == base and "no stack at hand" in dict(kept.search_notes)["h200"]
