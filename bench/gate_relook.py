"""The gate's later look: scoring only the new items against scoring the longer prefix again.

When a task is inconclusive at its first look (100 items), `decide` asks for more; since
2026-12-03 `ScoreBook.ensure` scores only the items after those already scored (lm-eval's
`samples`) instead of the whole longer prefix (`limit`). Both are timed here on the demo's
model (SmolLM2-135M-Instruct, bf16, in process, on the CPU) and task (onb_arith_gen), the way
the demo's FP8 look goes (100 -> 280 items): the peer is the prefix (`limit=280`), measured in
the same run, turns alternating, order swapped each repeat. It also checks that both give the
same per-item results on the items they share (greedy decoding: they should).

    .venv/bin/python bench/gate_relook.py [--repeats 2] [--first 100] [--upto 280]
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

TASK = "onb_arith_gen"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--first", type=int, default=100, help="items the first look scored")
    ap.add_argument("--upto", type=int, default=280, help="items the later look needs")
    ap.add_argument("--model", type=Path, default=ROOT / ".cache" / "smollm2-135m-instruct")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from resources.evaluator import LmEvalEvaluator

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).eval()
    tok = AutoTokenizer.from_pretrained(a.model)
    ev = LmEvalEvaluator()  # the demo's resource: its batch size (32)

    def metric(run) -> dict[int, float]:
        return {int(s["doc_id"]): float(s["exact_match"]) for s in run.samples[TASK]}

    def new_items():
        return ev.evaluate(model, tok, [TASK], items={TASK: list(range(a.first, a.upto))})

    def prefix():
        return ev.evaluate(model, tok, [TASK], limit=a.upto)

    seconds: dict[str, list[float]] = {"new items": [], "prefix": []}
    got: dict[str, dict[int, float]] = {}
    for k in range(a.repeats):
        turns = [("new items", new_items), ("prefix", prefix)]
        for name, fn in turns if k % 2 == 0 else turns[::-1]:
            t0 = time.perf_counter()
            run = fn()
            seconds[name].append(time.perf_counter() - t0)
            got[name] = metric(run)
            print(f"repeat {k} {name}: {seconds[name][-1]:.1f} s, {len(got[name])} items",
                  flush=True)
    shared = sorted(set(got["new items"]) & set(got["prefix"]))
    same = sum(got["new items"][i] == got["prefix"][i] for i in shared)
    med = {n: statistics.median(v) for n, v in seconds.items()}
    ratio = med["prefix"] / med["new items"]
    out = {"first": a.first, "upto": a.upto, "repeats": a.repeats, "seconds": seconds,
           "median_s": med, "speedup_vs_prefix": ratio,
           "items_agree": f"{same} of {len(shared)}"}
    print(json.dumps(out, indent=1))
    print(f"new items {med['new items']:.1f} s vs prefix {med['prefix']:.1f} s (medians of "
          f"{a.repeats}): {ratio:.2f}x faster per model (items {a.first}-{a.upto - 1}); "
          f"per-item results agree on {same} of {len(shared)} shared items")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
