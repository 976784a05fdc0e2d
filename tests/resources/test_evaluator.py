"""lm-eval on the project's offline tasks with a tiny model; task-name validation."""

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


def test_unknown_task_name_fails_before_any_model_is_loaded():
    with pytest.raises(ConfigError) as err:
        LmEvalEvaluator().resolve_tasks(["onb_facts_mc", "no_such_task_xyz"])
    assert "no_such_task_xyz" in str(err.value) and "eval_tasks" in err.value.fix


def test_evaluate_a_model_object_and_a_directory_agree(tmp_path):
    ckpt = build_tiny_causal_lm(tmp_path / "m")
    ev = LmEvalEvaluator(limit=6, batch_size=4)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).eval()
    in_memory = ev.evaluate(model, AutoTokenizer.from_pretrained(ckpt), [])
    from_disk = ev.evaluate(ckpt, None, [])
    assert set(in_memory.results) == {"onb_facts_mc", "onb_arith_gen"}
    assert in_memory.items == 12
    assert [s["doc_id"] for s in in_memory.samples["onb_facts_mc"]] == list(range(6))
    assert in_memory.results["onb_facts_mc"]["acc,none"] == from_disk.results[
        "onb_facts_mc"]["acc,none"]
