"""The evaluator: lm-eval's `simple_evaluate` on a model object, a checkpoint directory, or the
OpenAI-compatible endpoint of a running engine (the served mode).

Project tasks (configs/eval_tasks/*.yaml, local JSONL) are passed to lm-eval as config dicts with
their data paths made absolute, so they work from any working directory and offline. Any other
name is looked up in lm-eval's own registry (mmlu, gsm8k, ...), which needs hub access for data.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
from pydantic import Field

from onboarding.common.config import load_yaml
from onboarding.common.errors import ConfigError
from resources.config_files import ConfigFiles


class _LoadedModelNote(logging.Filter):
    """Drops lm-eval's warning that `pretrained` is not a str: the quantized variant is scored
    as it is in memory, by handing HFLM the loaded model on purpose (no accelerate launch, no
    parallelize, the two things that warning is about; lm_eval/models/huggingface.py)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("`pretrained` model kwarg is not of type")


_HFLM_NOTE = _LoadedModelNote()


@dataclass(frozen=True)
class EvalRun:
    results: dict  # lm-eval's results: task -> {"acc,none": ..., "acc_stderr,none": ...}
    samples: dict  # task -> per-item records with doc_id and metric values
    seconds: float
    items: int
    sizes: dict = field(default_factory=dict)  # task -> items it has in all


@functools.cache
def lm_eval_tasks(with_registry: bool):
    """lm-eval's TaskManager, built once per process. `simple_evaluate` builds one per call
    when given none, and building one indexes every task YAML lm-eval ships (about 13,000
    files: 9-11 s per call on a 2-core machine, measured 2026-12-03, most of a small
    evaluation); the project's own tasks are config dicts and need no index
    (`include_defaults=False`), a registry name (mmlu, ...) needs the full one."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_defaults=with_registry, metadata={})


def collect_env_once() -> None:
    """Make torch's environment report, which lm-eval adds to every result, a once-per-process
    read. `simple_evaluate` calls `add_env_info` (lm_eval/loggers/utils.py), which calls
    `torch.utils.collect_env.get_pretty_env_info`: `pip list` twice and more in subprocesses,
    0.45 s a call on a 2-core machine (2026-12-04), in every evaluation the gate runs (seven in
    the demo's quick pass). What it reports (the interpreter, torch, the installed packages)
    does not change while the process runs, so the first report is reused as it is."""
    from torch.utils import collect_env

    found = collect_env.get_pretty_env_info
    if getattr(found, "_collected_once", False):
        return
    once = functools.cache(found)
    once._collected_once = True
    collect_env.get_pretty_env_info = once


def _items_cover(tasks: list[str], items: dict[str, list[int]] | None) -> list[str]:
    """`tasks`, checked against `items`: lm-eval scores every item of a task its `samples`
    leaves out (or names with an empty list), so each task must name some."""
    if items is not None:
        bare = [t for t in tasks if not items.get(t)] if tasks else ["(the default tasks)"]
        if bare:
            raise ValueError(f"items name no item of {bare}: each task needs its indices")
    return tasks


class Evaluator(dg.ConfigurableResource):
    """Interface: score a model on named tasks."""

    def evaluate(self, model, tokenizer, tasks: list[str], limit: int | None = None,
                 items: dict[str, list[int]] | None = None) -> EvalRun:
        raise NotImplementedError

    def evaluate_served(self, base_url: str, served_name: str, tokenizer_dir: str | Path,
                        tasks: list[str], limit: int | None = None,
                        max_length: int | None = None,
                        items: dict[str, list[int]] | None = None) -> EvalRun:
        raise NotImplementedError


class LmEvalEvaluator(Evaluator):
    """lm-eval harness, HF backend, in this process."""

    limit: int | None = Field(
        default=None, description="items per task (None: all); small values make the gate "
                                  "fail for too few items unless gates.yaml min_items is lowered")
    batch_size: int = Field(default=32, ge=1)
    configs: ConfigFiles | None = Field(default=None, description="the project's task YAMLs "
                                        "live in its eval_tasks/; default: configs/")
    default_tasks: list[str] = Field(default_factory=lambda: ["onb_facts_mc", "onb_arith_gen"],
                                     description="used when a model spec lists no eval_tasks")
    # 32, not 8: the demo's served scoring (100 + 280 items, SmolLM2 on the CPU
    # engine, max-num-seqs 64) took 41.5 and 38.6 s at 32 against 59.3 and 45.5 s at 8, the same
    # scores (scratch A/B on one engine, 2026-12-04, docs/benchmarks.md)
    served_concurrency: int = Field(default=32, ge=1, description="requests in flight against "
                                    "the engine in the served mode (lm-eval num_concurrent)")
    served_max_retries: int = Field(default=3, ge=1, description="attempts per request")
    served_timeout_s: int = Field(default=300, ge=1, description="per request")

    def _task_dir(self) -> Path:
        return (self.configs or ConfigFiles()).eval_tasks_dir()

    def project_tasks(self) -> dict[str, Path]:
        d = self._task_dir()
        return {p.stem: p for p in sorted(d.glob("*.yaml"))} if d.is_dir() else {}

    def resolve_tasks(self, names: list[str]) -> list:
        """Task configs for lm-eval; unknown names fail before any model is loaded."""
        names = names or self.default_tasks
        local = self.project_tasks()
        resolved: list = []
        external = [n for n in names if n not in local]
        if external:
            known = set(lm_eval_tasks(True).all_tasks)
            unknown = [n for n in external if n not in known]
            if unknown:
                raise ConfigError(
                    f"eval_tasks {unknown}",
                    f"not a project task ({', '.join(local) or 'none'} in {self._task_dir()}) "
                    "and not an lm-eval task",
                    "Fix the name in the model's eval_tasks, or add <name>.yaml to "
                    "configs/eval_tasks/.")
        for name in names:
            if name in local:
                cfg = load_yaml(local[name])
                files = (cfg.get("dataset_kwargs") or {}).get("data_files")
                if isinstance(files, dict):
                    cfg["dataset_kwargs"]["data_files"] = {
                        split: str((local[name].parent / f).resolve()) for split, f in files.items()}
                resolved.append(cfg)
            else:
                resolved.append(name)
        return resolved

    def evaluate(self, model, tokenizer, tasks: list[str], limit: int | None = None,
                 items: dict[str, list[int]] | None = None) -> EvalRun:
        """`model` is an nn.Module (scored as it is in memory) or a checkpoint directory.
        `limit`: items per task for this call (None: the resource's `limit`); `items`: exactly
        these item indices per task instead (lm-eval's `samples`)."""
        import torch
        from lm_eval.models.huggingface import HFLM

        task_cfgs = self.resolve_tasks(_items_cover(tasks, items))
        if isinstance(model, str | Path):
            lm = HFLM(pretrained=str(model), dtype="bfloat16", batch_size=self.batch_size,
                      device="cuda" if torch.cuda.is_available() else "cpu")
        else:
            hflm_log = logging.getLogger(HFLM.__module__)
            hflm_log.addFilter(_HFLM_NOTE)  # once: a filter is kept only once per logger
            lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=self.batch_size)
        return self._run(lm, task_cfgs, limit, items)

    def evaluate_served(self, base_url: str, served_name: str, tokenizer_dir: str | Path,
                        tasks: list[str], limit: int | None = None,
                        max_length: int | None = None,
                        items: dict[str, list[int]] | None = None) -> EvalRun:
        """The same tasks against a running engine's OpenAI-compatible completions endpoint
        (lm-eval's `local-completions`): loglikelihoods from the prompt's echoed logprobs for
        multiple choice, greedy completions for generation. Requests carry token ids from the
        variant's own tokenizer (read offline from `tokenizer_dir`), so both modes score the
        same tokens; nothing but `base_url` (the engine on 127.0.0.1) is contacted."""
        from lm_eval.models.openai_completions import LocalCompletionsAPI

        task_cfgs = self.resolve_tasks(_items_cover(tasks, items))
        lm = LocalCompletionsAPI(
            base_url=base_url.rstrip("/") + "/v1/completions", model=served_name,
            tokenizer=str(tokenizer_dir), tokenizer_backend="huggingface",
            tokenized_requests=True, num_concurrent=self.served_concurrency,
            max_retries=self.served_max_retries, timeout=self.served_timeout_s,
            max_length=max_length or 2048, batch_size=1)
        return self._run(lm, task_cfgs, limit, items)

    def _run(self, lm, task_cfgs: list, limit: int | None,
             items: dict[str, list[int]] | None = None) -> EvalRun:
        import lm_eval

        collect_env_once()
        t0 = time.perf_counter()
        out = lm_eval.simple_evaluate(model=lm, tasks=task_cfgs,
                                      task_manager=lm_eval_tasks(
                                          any(isinstance(c, str) for c in task_cfgs)),
                                      limit=None if items is not None else
                                      self.limit if limit is None else limit,
                                      samples=None if items is None else
                                      {t: sorted(v) for t, v in items.items()},
                                      log_samples=True, bootstrap_iters=1000,
                                      random_seed=0, numpy_random_seed=0, torch_random_seed=0)
        seconds = time.perf_counter() - t0
        samples = {
            task: [{k: v for k, v in s.items()
                    if k == "doc_id" or isinstance(v, int | float) and not isinstance(v, bool)}
                   for s in rows]
            for task, rows in (out.get("samples") or {}).items()}
        items = sum(len(v) for v in samples.values())
        sizes = {task: int(c.get("original") or 0)
                 for task, c in (out.get("n-samples") or {}).items() if isinstance(c, dict)}
        return EvalRun(out["results"], samples, seconds, items, sizes)
