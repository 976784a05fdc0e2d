"""lm-eval on the project's offline tasks with a tiny model; task-name validation."""

import logging
from pathlib import Path

import pytest
import torch

from onboarding.common.errors import ConfigError
from resources.evaluator import LmEvalEvaluator
from tests.quantize_support import build_tiny_causal_lm


def test_project_tasks_resolve_to_absolute_data_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # lm-eval would otherwise read data_files relative to the cwd
    cfgs = LmEvalEvaluator().resolve_tasks([])
    assert [c["task"] for c in cfgs] == ["onb_facts_mc", "onb_arith_gen"]
    for c in cfgs:
        for f in c["dataset_kwargs"]["data_files"].values():
            assert Path(f).is_absolute() and Path(f).is_file()


@pytest.mark.slow
def test_unknown_task_name_fails_before_any_model_is_loaded():
    with pytest.raises(ConfigError) as err:
        LmEvalEvaluator().resolve_tasks(["onb_facts_mc", "no_such_task_xyz"])
    assert "no_such_task_xyz" in str(err.value) and "eval_tasks" in err.value.fix


@pytest.mark.slow
def test_evaluate_a_model_object_and_a_directory_agree(tmp_path, caplog):
    ckpt = build_tiny_causal_lm(tmp_path / "m")
    ev = LmEvalEvaluator(limit=6, batch_size=4)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).eval()
    with caplog.at_level(logging.WARNING, logger="lm_eval"):
        in_memory = ev.evaluate(model, AutoTokenizer.from_pretrained(ckpt), [])
    # handing HFLM the loaded model is the point: lm-eval's warning about it is not shown
    assert not [r for r in caplog.records if "`pretrained` model kwarg" in r.getMessage()]
    from_disk = ev.evaluate(ckpt, None, [])
    assert set(in_memory.results) == {"onb_facts_mc", "onb_arith_gen"}
    assert in_memory.items == 12
    assert [s["doc_id"] for s in in_memory.samples["onb_facts_mc"]] == list(range(6))
    assert in_memory.results["onb_facts_mc"]["acc,none"] == from_disk.results[
        "onb_facts_mc"]["acc,none"]


@pytest.mark.slow
def test_named_items_are_scored_under_their_own_ids_as_the_prefix_scores_them(tmp_path):
    """The gate's later look asks for the items after the first look's (lm-eval's `samples`):
    they come back under their indices in the task, with the results the longer prefix gives
    them (the few-shot sampler is `first_n`, so an item's prompt does not depend on which
    items run beside it)."""
    from onboarding.quantize.accuracy_gate import AccuracyGates

    ckpt = build_tiny_causal_lm(tmp_path / "m")
    ev = LmEvalEvaluator(limit=6, batch_size=1)
    gates = AccuracyGates.model_validate({
        "tolerance": {"max_abs_drop": 0.03}, "z": 1.645, "min_items": 2,
        "metric_preference": ["acc", "exact_match"]})
    tasks = ["onb_facts_mc", "onb_arith_gen"]
    whole = _scores(ev.evaluate(ckpt, None, tasks), gates)
    later = ev.evaluate(ckpt, None, tasks, items={t: [3, 4, 5] for t in tasks})
    assert later.items == 6
    part = _scores(later, gates)
    for t in tasks:
        assert sorted(part[t].per_item) == [3, 4, 5]
        assert part[t].per_item == {i: whole[t].per_item[i] for i in (3, 4, 5)}
        assert part[t].size == whole[t].size > 6  # the task's own size, not the three asked
    with pytest.raises(ValueError, match="onb_arith_gen"):
        ev.evaluate(ckpt, None, tasks, items={"onb_facts_mc": [1]})


def _scores(run, gates):
    from onboarding.quantize.accuracy_gate import scores_from_lm_eval

    return scores_from_lm_eval(run.results, run.samples, gates, run.sizes)


def test_project_tasks_are_loaded_without_indexing_lm_evals_registry():
    """lm-eval's own TaskManager indexes every task YAML it ships (9-11 s per call here,
    bench/eval_call.py); the project's tasks are config dicts and load from an empty index,
    while a registry name still resolves through the full one."""
    from resources.evaluator import lm_eval_tasks

    bare = lm_eval_tasks(False)
    assert bare is lm_eval_tasks(False)  # built once per process
    assert "mmlu" not in bare.all_tasks
    loaded = bare.load(LmEvalEvaluator().resolve_tasks([]))
    assert sorted(loaded["tasks"]) == ["onb_arith_gen", "onb_facts_mc"]


def test_torchs_environment_report_is_collected_once_per_process(tmp_path, monkeypatch):
    """lm-eval adds torch's `collect_env` report to every result (`add_env_info`, which runs
    `pip list` in subprocesses: 0.45 s a call here); the evaluator collects it once and every
    later result carries the same report."""
    from torch.utils import collect_env

    calls = []

    def counted() -> str:
        calls.append(1)
        return f"report {len(calls)}"

    monkeypatch.setattr(collect_env, "get_pretty_env_info", counted)
    ckpt = build_tiny_causal_lm(tmp_path / "m")
    ev = LmEvalEvaluator(limit=2, batch_size=2)
    runs = [ev.evaluate(ckpt, None, ["onb_facts_mc"]) for _ in range(2)]
    assert len(calls) == 1
    assert all(r.items == 2 for r in runs)


def test_in_process_scoring_says_what_it_scores_and_each_tasks_score(tmp_path):
    """The `accuracy` step's lines in the event log: what is scored, then per task its score
    and items (lm-eval's own progress bars only reach stderr)."""
    from onboarding.quantize.accuracy_gate import AccuracyGates
    from resources.accuracy_runs import in_process_scorer
    from resources.config_files import ConfigFiles

    ckpt = build_tiny_causal_lm(tmp_path / "m")
    lines: list[str] = []
    eval_s: dict[str, float] = {}
    gates: AccuracyGates = ConfigFiles().accuracy_gates()
    scores = in_process_scorer(LmEvalEvaluator(batch_size=4), gates, eval_s, "bf16", ckpt, None,
                               lines.append)(["onb_facts_mc"], 5)
    assert lines[0] == "bf16: scoring onb_facts_mc (5 items each) in process"
    value = scores["onb_facts_mc"].value
    assert lines[-1].startswith(f"bf16: scored onb_facts_mc {value:.3f} on 5 items in ")
