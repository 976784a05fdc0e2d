"""One lm-eval call's fixed cost: a TaskManager built once without lm-eval's registry against
`simple_evaluate`'s own (a new TaskManager per call, indexing every task YAML lm-eval ships).

The evaluator (resources/evaluator.py) passes `lm_eval_tasks(False)` for the project's tasks
since 2026-12-03; the peer is lm-eval's default (`task_manager=None`), on the same model, tasks
and items in the same run, turns alternating, order swapped each repeat. Printed: seconds per
call (median of the repeats), the ratio, and whether both scored the items alike.

    .venv/bin/python bench/eval_call.py [--repeats 3] [--limit 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=30, help="items per task per call")
    ap.add_argument("--model", type=Path, default=ROOT / ".cache" / "smollm2-135m-instruct")
    a = ap.parse_args()

    import lm_eval
    import torch
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from resources.evaluator import LmEvalEvaluator, lm_eval_tasks

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).eval()
    tok = AutoTokenizer.from_pretrained(a.model)
    ev = LmEvalEvaluator()
    cfgs = ev.resolve_tasks([])

    def call(manager):
        lm = HFLM(pretrained=model, tokenizer=tok, batch_size=ev.batch_size)
        out = lm_eval.simple_evaluate(model=lm, tasks=cfgs, limit=a.limit, task_manager=manager,
                                      log_samples=True, bootstrap_iters=1000, random_seed=0,
                                      numpy_random_seed=0, torch_random_seed=0)
        return {t: [s.get("acc", s.get("exact_match")) for s in rows]
                for t, rows in out["samples"].items()}

    t0 = time.perf_counter()  # built once, as the evaluator does: its cost is printed
    lm_eval_tasks.cache_clear()
    lm_eval_tasks(False)
    build_s = time.perf_counter() - t0
    seconds: dict[str, list[float]] = {"project TaskManager": [], "lm-eval default": []}
    got = {}
    for k in range(a.repeats):
        turns = [("project TaskManager", lambda: call(lm_eval_tasks(False))),
                 ("lm-eval default", lambda: call(None))]
        for name, fn in turns if k % 2 == 0 else turns[::-1]:
            t = time.perf_counter()
            got[name] = fn()
            seconds[name].append(time.perf_counter() - t)
            print(f"repeat {k} {name}: {seconds[name][-1]:.1f} s", flush=True)
    med = {n: statistics.median(v) for n, v in seconds.items()}
    ratio = med["lm-eval default"] / med["project TaskManager"]
    same = got["project TaskManager"] == got["lm-eval default"]
    print(json.dumps({"limit": a.limit, "repeats": a.repeats, "seconds": seconds,
                      "task_manager_build_s": build_s, "median_s": med,
                      "speedup_vs_default": ratio, "same_per_item_results": same}, indent=1))
    print(f"per call {med['project TaskManager']:.1f} s vs lm-eval's default "
          f"{med['lm-eval default']:.1f} s (medians of {a.repeats}, {a.limit} items x "
          f"{len(cfgs)} tasks): {ratio:.2f}x; the project TaskManager built once in "
          f"{build_s:.2f} s; per-item results {'identical' if same else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
