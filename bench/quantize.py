"""Benchmark: our `quantized` step against Model Optimizer called directly, same run, same data.

    .venv/bin/python bench/quantize.py [--checkpoint DIR] [--precision nvfp4] [--rounds 2]
        [--eval-items-per-task 50]   (0: no eval timing)   [--config-dir DIR]  (default configs/)

Peer: load the checkpoint, `mtq.quantize` with the same config and calibration batches, then
`export_hf_checkpoint` (plus the CPU NVFP4 backend, without which the peer cannot run on a CPU).
Ours: `ModelOptQuantizer.quantize(verify=False)`, which adds the fused-layer scale sync before
saving state, the quantizer state file, tokenizer copy, manifest and atomic rename. Prints the
median wall-time ratio ours/peer (target <= 1.05), the export check's own cost as a ratio to the
peer, and lm-eval seconds per 100 items for the bf16 baseline and the NVFP4 variant.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def peer_run(quantizer, ckpt: Path, precision: str, out: Path) -> float:
    """Model Optimizer's documented PTQ flow, nothing else."""
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    from resources.quantizer import attach_cpu_backend, build_quant_cfg

    settings = quantizer.settings()
    t0 = time.perf_counter()
    model, tok = quantizer._load_baseline(ckpt)
    cal = settings.calibration
    batches = quantizer._batches(tok, cal.dataset, cal.samples, cal.seq_len, "calibration set")
    cfg = build_quant_cfg(settings.variant_for("bench", precision), "bench")

    def loop(m):
        with torch.no_grad():
            for i in range(0, len(batches), cal.batch_size):
                m(torch.cat(batches[i:i + cal.batch_size]).to(quantizer.torch_device()))

    model = mtq.quantize(model, cfg, loop)
    if quantizer.torch_device() == "cpu":
        attach_cpu_backend(model)
    export_hf_checkpoint(model, dtype=torch.bfloat16, export_dir=out)
    return time.perf_counter() - t0


def ours_run(quantizer, ckpt: Path, precision: str, out: Path, verify: bool) -> float:
    t0 = time.perf_counter()
    quantizer.quantize("bench", ckpt, precision, out, "bench", verify=verify)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path, default=ROOT / ".cache/smollm2-135m-instruct")
    ap.add_argument("--precision", default="nvfp4", choices=["nvfp4", "fp8"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--eval-items-per-task", type=int, default=50)
    ap.add_argument("--config-dir", default="", help="configs/ to read quantization.yaml from")
    args = ap.parse_args()

    from onboarding.quantize.variants import QuantizedVariant
    from resources.config_files import ConfigFiles
    from resources.evaluator import LmEvalEvaluator
    from resources.quantizer import STATE_SUFFIX, ModelOptQuantizer

    quantizer = ModelOptQuantizer(configs=ConfigFiles(config_dir=args.config_dir))
    work = Path(tempfile.mkdtemp(prefix="bench-quantize-"))
    try:
        ckpt = work / "model" / "rev"
        shutil.copytree(args.checkpoint, ckpt)
        peer_s, ours_s = [], []
        for r in range(args.rounds):  # alternate so drift hits both sides alike
            peer_s.append(peer_run(quantizer, ckpt, args.precision, work / f"peer{r}"))
            ours_s.append(ours_run(quantizer, ckpt, args.precision, work / f"ours{r}" / "v",
                                   verify=False))
            print(f"round {r}: peer {peer_s[-1]:.2f} s, ours {ours_s[-1]:.2f} s", flush=True)
        peer_med, ours_med = statistics.median(peer_s), statistics.median(ours_s)
        print(f"quantize+export ({args.precision}, {quantizer.torch_device()}): "
              f"ours {ours_med:.2f} s vs modelopt direct {peer_med:.2f} s: "
              f"ratio {ours_med / peer_med:.3f} (target <= 1.05)", flush=True)
        last = work / f"ours{args.rounds - 1}" / "v"
        state = last.parent / f"v{STATE_SUFFIX}"
        t0 = time.perf_counter()
        check = quantizer.verify_export(ckpt, last, state)
        check_s = time.perf_counter() - t0
        print(f"export check alone: {check_s:.2f} s = {check_s / peer_med:.2f}x the peer's "
              f"quantize+export (passed: {check.passed})", flush=True)
        v = QuantizedVariant(precision=args.precision, path=str(last), state_path=str(state),
                             export_valid=True)
        if args.eval_items_per_task == 0:
            return
        ev = LmEvalEvaluator(limit=args.eval_items_per_task)
        base = ev.evaluate(ckpt, None, [])
        model, tok = quantizer.load_for_eval(ckpt, v)
        quant = ev.evaluate(model, tok, [])
        for name, run in (("bf16 baseline (from disk)", base),
                          (f"{args.precision} (in memory)", quant)):
            print(f"eval {name}: {100 * run.seconds / run.items:.2f} s per 100 items "
                  f"({run.items} items, {run.seconds:.1f} s)")
        print(f"eval ratio {args.precision}/bf16: {quant.seconds / base.seconds:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
