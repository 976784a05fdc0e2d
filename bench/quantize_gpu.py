"""GPU run of the quantize stage: Model Optimizer's native CUDA path on a random ~1.1B Llama.

    python bench/quantize_gpu.py --out $OUT [--tokenizer DIR] [--tiny] [--skip-eval]
    python bench/quantize_gpu.py --out $OUT --checkpoint <hf dir> --name smollm2

Builds a TinyLlama-shaped random model on the device (bf16), then runs the production code:
`ModelOptQuantizer.quantize` (calibrate, export, independent export check) for NVFP4 and FP8,
and `LmEvalEvaluator` + the accuracy gate on the baseline and both variants. Writes
gpu_<name>.json. `--tiny` shrinks the model so the script itself can be tested on a CPU.

The GPU image has no Dagster; when `import dagster` fails, a pydantic stand-in for
`ConfigurableResource` is installed (the resources' code paths are otherwise the production ones).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _dagster_stand_in() -> None:
    try:
        import dagster  # noqa: F401
    except ImportError:
        from pydantic import BaseModel, ConfigDict

        class ConfigurableResource(BaseModel):
            model_config = ConfigDict(extra="forbid", frozen=True)

        shim = types.ModuleType("dagster")
        shim.ConfigurableResource = ConfigurableResource
        sys.modules["dagster"] = shim


def build_random_llama(out: Path, tokenizer_dir: Path, tiny: bool, device: str) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    shape = ({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2} if tiny else
             {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                  "num_attention_heads": 32, "num_key_value_heads": 4})
    cfg = LlamaConfig(vocab_size=49152, max_position_embeddings=2048, **shape)
    t0 = time.perf_counter()
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(out)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy2(f, out / f.name)
    params = sum(p.numel() for p in model.parameters())
    del model
    return {"params": params, "build_and_save_s": round(time.perf_counter() - t0, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, default=ROOT / ".cache/smollm2-135m-instruct")
    ap.add_argument("--work", type=Path, default=Path("/tmp/onboarding-gpu"))
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--eval-limit", type=int, default=None)
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="quantize this checkpoint instead of building a random model")
    ap.add_argument("--name", default="random-llama")
    ap.add_argument("--skip-eval", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    _dagster_stand_in()
    import modelopt
    import torch
    import transformers

    from onboarding.quantize.accuracy_gate import (
        judge_variant,
        load_accuracy_gates,
        scores_from_lm_eval,
    )
    from onboarding.quantize.variants import variant_dir
    from resources.config_files import ConfigFiles
    from resources.evaluator import LmEvalEvaluator
    from resources.quantizer import ModelOptQuantizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    report: dict = {"torch": torch.__version__, "transformers": transformers.__version__,
                    "modelopt": modelopt.__version__, "device": device,
                    "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None}
    import modelopt.torch.kernels.quantization.gemm as mo_kernels

    # What runs NVFP4 fake quantization natively: Model Optimizer's Triton kernel (compute
    # capability >= 8.9) or, failing that, its CUDA extension; on a CPU our torch backend.
    report["modelopt_triton_fp4_kernel"] = bool(
        getattr(mo_kernels, "IS_AVAILABLE", False) and hasattr(mo_kernels, "fp4_fake_quant_block"))
    ckpt = args.work / args.name / "r0"
    shutil.rmtree(ckpt.parent, ignore_errors=True)
    if args.checkpoint:
        shutil.copytree(args.checkpoint, ckpt)
        report["model"] = {"checkpoint": str(args.checkpoint)}
    else:
        ckpt.mkdir(parents=True)
        report["model"] = build_random_llama(ckpt, args.tokenizer, args.tiny, device)
    print(json.dumps(report, indent=1), flush=True)

    quantizer = ModelOptQuantizer(device=device)
    evaluator = LmEvalEvaluator(limit=args.eval_limit, batch_size=32,
                                configs=ConfigFiles(config_dir=str(ROOT / "configs")))
    gates = load_accuracy_gates(ROOT / "configs/gates.yaml")
    variants = {}
    for precision in ("nvfp4", "fp8"):
        t0 = time.perf_counter()
        v = quantizer.quantize(args.name, ckpt, precision, variant_dir(ckpt, precision), "r0")
        stats = {k: val for k, val in v.stats.items() if k != "hf_quant_config"}
        stats.update(step_s=round(time.perf_counter() - t0, 2), export_valid=v.export_valid,
                     error=v.error)
        report[f"quantize_{precision}"] = stats
        variants[precision] = v
        print(precision, json.dumps(stats, indent=1), flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    out_file = args.out / f"gpu_{args.name}.json"
    out_file.write_text(json.dumps(report, indent=1, default=str))
    if args.skip_eval:
        return
    base = evaluator.evaluate(ckpt, None, [])
    baseline = scores_from_lm_eval(base.results, base.samples, gates)
    report["eval_bf16"] = {"seconds": round(base.seconds, 2), "items": base.items,
                           "s_per_100_items": round(100 * base.seconds / base.items, 3),
                           "scores": {t: [s.value, s.stderr, s.n] for t, s in baseline.items()}}
    for precision, v in variants.items():
        if not v.usable:
            continue
        model, tok = quantizer.load_for_eval(ckpt, v)
        run = evaluator.evaluate(model, tok, [])
        del model
        gate = judge_variant(precision, baseline,
                             scores_from_lm_eval(run.results, run.samples, gates), gates)
        report[f"eval_{precision}"] = {
            "seconds": round(run.seconds, 2), "items": run.items,
            "s_per_100_items": round(100 * run.seconds / run.items, 3),
            "gate_passed": gate.passed, "gate_reason": gate.reason,
            "rows": [[t.task, t.metric, t.baseline, t.variant, t.delta, t.se_delta, t.n]
                     for t in gate.verdicts]}
        print(precision, json.dumps(report[f"eval_{precision}"], indent=1), flush=True)
    out_file.write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
