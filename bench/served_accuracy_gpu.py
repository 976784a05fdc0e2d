"""Served accuracy on a GPU: SmolLM2 bf16, FP8 and NVFP4 scored in process and
through vLLM, with the agreement of the two and the gate on each source.

    python3 bench/served_accuracy_gpu.py --out $OUT --checkpoint /tmp/smollm2
    python3 bench/served_accuracy_gpu.py --out OUT --precisions bf16 --limit 50   # CPU engine

The production code throughout: `ModelOptQuantizer.quantize` (the quantize stage), the accuracy
asset's in-process scoring and gate (`in_process_scorer`, `ScoreBook`, `decide`), the `Engine`
resource and `served_report` (the served_accuracy asset's code: one engine start per precision,
the same items, agreements, served gates), `choose_precision` (serving_variant). Writes
`served_accuracy_<name>.json` after every phase, so a run cut short keeps what it measured, with
every per-item result (tests/resources/test_accuracy_runs.py replays it from tests/data/).

On the H200: no `vllm` script on PATH, so a two-line wrapper in `<work>/bin` runs `python3 -m
vllm.entrypoints.cli.main`; VLLM_USE_FLASHINFER_SAMPLER=0 (FlashInfer does not travel). Hopper
has no FP4 tensor cores and configs/stack.yaml does not list NVFP4 as servable on sm90; vLLM
0.22 serves a Model Optimizer NVFP4 export there with Marlin weight-only FP4 kernels, so this
run adds nvfp4 to sm90 in its own copy of the configs and says so (`servable_override`).
About 5-6 min on one H200: three engine starts (about 75 s each with torch.compile and CUDA
graphs; `--eager` skips both) dominate. On a CPU machine the engine in .venv-engine serves bf16.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", flush=True)


def _require_tenacity() -> None:
    """lm-eval's API models (the served mode) import tenacity; the GPU site may lack it."""
    try:
        import tenacity  # noqa: F401
    except ImportError:
        raise SystemExit("tenacity is not installed: lm-eval's local-completions model needs it. "
                         "Carry its wheel (.gpu7, docs/gpu.md) and install it with "
                         "`bash bench/gpu_device.sh install`, or pip install tenacity==9.2.1 "
                         "--target /tmp/site.") from None


def engine_bin_dir(work: Path, given: str | None) -> Path:
    """The directory holding `vllm` and `python`: given, the CPU engine's venv, or wrappers."""
    if given:
        return Path(given)
    local = ROOT / ".venv-engine" / "bin"
    if (local / "vllm").is_file():
        return local
    from bench.gpu_serving import engine_bin  # `vllm` and `python`: the Engine reads the
    return engine_bin(work)                   # installed version through the latter


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def serve_all(engine, evaluator, spec, checkpoint, qset, accuracy, gates, report: dict):
    """`served_report` (the asset's code), all-or-nothing like the asset; on this one-off run an
    engine that fails to start for one precision is recorded and the others are served again
    without it, so one broken kernel path does not cost the other results."""
    from dataclasses import replace

    from resources.accuracy_runs import served_report
    from resources.engine import EngineError

    failed: dict[str, str] = report.setdefault("serve_errors", {})
    serving: list[str] = []

    def track(msg: str) -> None:
        if ": serving " in msg:
            serving.append(msg.split(":", 1)[0])
        log(msg)

    while True:
        serving.clear()
        try:
            served = served_report(engine, evaluator, spec, checkpoint, qset, accuracy, gates,
                                   log=track)
            served.not_served.update({p: "the engine did not start (serve_errors)"
                                      for p in failed})
            return served
        except EngineError as exc:
            if not serving or serving[-1] == "bf16" or serving[-1] in failed:
                raise
            failed[serving[-1]] = str(exc)[-2000:]
            log(f"{serving[-1]}: the engine did not start; serving the others without it")
            accuracy = replace(accuracy, records=tuple(
                r for r in accuracy.records if r.precision not in failed))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="SmolLM2 HF dir (default /tmp/smollm2, else .cache/smollm2-135m-instruct)")
    ap.add_argument("--name", default="smollm2")
    ap.add_argument("--work", type=Path, default=Path("/tmp/onb"))
    ap.add_argument("--precisions", default="bf16,fp8,nvfp4")
    ap.add_argument("--limit", type=int, default=None, help="items per task (default: all)")
    ap.add_argument("--engine-bin", default=None)
    ap.add_argument("--start-timeout", type=float, default=600.0)
    ap.add_argument("--eager", action="store_true", help="enforce_eager: faster starts, no "
                    "torch.compile or CUDA graphs (not the serving configuration)")
    args = ap.parse_args()
    for k, v in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                 "VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1",
                 "DO_NOT_TRACK": "1"}.items():
        os.environ.setdefault(k, v)
    from quantize_gpu import _dagster_stand_in

    _dagster_stand_in()
    _require_tenacity()
    import torch
    import yaml

    from onboarding.common.config import load_yaml
    from onboarding.common.refs import CheckpointRef
    from onboarding.fetch.catalog import parse_spec
    from onboarding.quantize.accuracy_gate import (
        ScoreBook,
        baseline_rows,
        decide,
        gate_rows,
        scores_to_json,
    )
    from onboarding.quantize.variants import (
        IN_PROCESS,
        AccuracyRecord,
        AccuracyReport,
        GateOutcome,
        QuantizedSet,
        QuantizedVariant,
        choose_precision,
        deciding_gate,
        variant_dir,
    )
    from resources.accuracy_runs import in_process_scorer
    from resources.config_files import ConfigFiles
    from resources.engine import Engine
    from resources.evaluator import LmEvalEvaluator
    from resources.quantizer import ModelOptQuantizer

    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    source = args.checkpoint or next(
        (p for p in (Path("/tmp/smollm2"), ROOT / ".cache/smollm2-135m-instruct")
         if (p / "model.safetensors").is_file()), None)
    if source is None:
        sys.exit("no SmolLM2 checkpoint: pass --checkpoint (scripts/build_smollm2.py builds it)")
    args.out.mkdir(parents=True, exist_ok=True)
    out_file = args.out / f"served_accuracy_{args.name}.json"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report: dict = {"machine": {
        "device": device, "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "torch": torch.__version__, "transformers": version("transformers"),
        "modelopt": version("nvidia-modelopt"), "lm_eval": version("lm_eval"),
        "vllm": version("vllm")}, "settings": {"precisions": precisions, "limit": args.limit,
                                               "eager": args.eager, "checkpoint": str(source)},
        "timings_s": {}}

    def save(phase: str, t_phase: float) -> None:
        report["timings_s"][phase] = round(time.perf_counter() - t_phase, 2)
        report["timings_s"]["total"] = round(time.perf_counter() - T0, 2)
        out_file.write_text(json.dumps(report, indent=1, default=str))
        log(f"{phase} done; wrote {out_file}")

    ckpt = args.work / args.name / "r0"
    shutil.rmtree(ckpt.parent, ignore_errors=True)
    shutil.copytree(source, ckpt)
    cfg_dir = args.work / "configs"
    shutil.rmtree(cfg_dir, ignore_errors=True)
    shutil.copytree(ROOT / "configs", cfg_dir)
    configs = ConfigFiles(config_dir=str(cfg_dir), discovered_dir=str(args.work / "found"))
    bin_dir = engine_bin_dir(args.work, args.engine_bin)
    hardware = Engine(configs=configs, bin_dir=str(bin_dir)).resolved_hardware()
    if hardware == "sm90" and "nvfp4" in precisions:
        stack = yaml.safe_load((cfg_dir / "stack.yaml").read_text())
        stack["engines"]["vllm"]["serves"]["sm90"].insert(0, "nvfp4")
        (cfg_dir / "stack.yaml").write_text(yaml.safe_dump(stack, sort_keys=False))
        report["settings"]["servable_override"] = (
            "nvfp4 added to sm90 for this run: vLLM 0.22 serves Model Optimizer NVFP4 on Hopper "
            "with Marlin weight-only FP4 kernels (activations stay bf16)")
    engine = Engine(configs=configs, bin_dir=str(bin_dir), hardware="auto",
                    gpus="0" if hardware != "cpu" else "", log_dir=str(args.out / "engine-logs"),
                    start_timeout_s=args.start_timeout)
    spec = parse_spec(load_yaml(ROOT / "configs/models/smollm2-135m.yaml"), "smollm2-135m.yaml")
    if args.eager:
        spec = spec.model_copy(update={"engine_args": {**spec.engine_args,
                                                       "enforce_eager": True}})
    gates = configs.accuracy_gates()
    report["settings"].update(hardware=hardware, engine_args=spec.engine_args,
                              engine_bin=str(bin_dir), gates=gates.model_dump())
    log(f"{device} ({report['machine']['gpu'] or hardware}); {source} -> {ckpt}; "
        f"precisions {precisions}; items per task {args.limit or 'all'}")

    t = time.perf_counter()
    quantizer = ModelOptQuantizer(device=device, configs=configs)
    variants = []
    for p in precisions:
        if p == "bf16":
            continue
        try:
            v = quantizer.quantize(args.name, ckpt, p, variant_dir(ckpt, p), "r0", log=log)
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on with the others
            v = QuantizedVariant(precision=p, path=None, state_path=None,
                                 error=f"{type(exc).__name__}: {exc}")
        variants.append(v)
        report.setdefault("quantize", {})[p] = {
            **{k: val for k, val in v.stats.items() if k != "hf_quant_config"},
            "export_valid": v.export_valid, "error": v.error}
        log(f"{p}: quantized, export valid {v.export_valid} {v.error or ''}")
    qset = QuantizedSet(args.name, str(ckpt), sum(f.stat().st_size for f in ckpt.iterdir()),
                        tuple(variants))
    save("quantize", t)

    t = time.perf_counter()
    evaluator = LmEvalEvaluator(limit=args.limit, batch_size=32, configs=configs)
    eval_s: dict[str, float] = {}
    baseline = ScoreBook.first(in_process_scorer(evaluator, gates, eval_s, "bf16", ckpt, None),
                               [])
    log(f"bf16 in process: { {k: round(s.value, 4) for k, s in baseline.scores.items()} }")
    records, outcomes, rows = [], [], []
    for v in variants:
        if not v.usable:
            outcomes.append(GateOutcome(precision=v.precision, passed=False,
                                        reason=f"not evaluated: {v.error}"))
            continue
        model, tok = quantizer.load_for_eval(ckpt, v)
        book = ScoreBook.first(in_process_scorer(evaluator, gates, eval_s, v.precision, model,
                                                 tok), [])
        gate = decide(v.precision, baseline, book, gates, log=log)
        del model
        outcomes.append(GateOutcome.of(gate, IN_PROCESS))
        rows += gate_rows(v.precision, gate)
        records.append(AccuracyRecord(v.precision, IN_PROCESS, v.content_hash, book.scores,
                                      eval_s[v.precision]))
        log(f"{v.precision} in process: {gate.verdict}: {gate.reason}")
    records.insert(0, AccuracyRecord("bf16", IN_PROCESS, "r0", baseline.scores, eval_s["bf16"]))
    accuracy = AccuracyReport(args.name, tuple(baseline_rows("bf16", baseline.scores) + rows),
                              tuple(outcomes), eval_s, tuple(records))
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()  # the engine claims gpu_memory_utilization of what is free
    report["in_process"] = {r.precision: {"seconds": round(r.seconds, 2),
                                          "tasks": scores_to_json(r.scores)} for r in records}
    report["in_process_gates"] = {o.precision: asdict(o) for o in outcomes}
    report["in_process_rows"] = list(accuracy.rows)
    save("in_process", t)

    t = time.perf_counter()
    checkpoint = CheckpointRef(model=args.name, source=str(source), revision="r0", path=str(ckpt),
                               content_hash="r0", total_bytes=qset.baseline_bytes)
    served = serve_all(engine, evaluator, spec, checkpoint, qset, accuracy, gates, report)
    report["served"] = {r.precision: {"seconds": r.seconds, "tasks": scores_to_json(r.scores)}
                        for r in served.records}
    report["served_gates"] = {o.precision: asdict(o) for o in served.gates}
    report["served_rows"] = list(served.rows)
    report["agreements"] = {a.precision: asdict(a) for a in served.agreements}
    report["not_served"] = served.not_served
    report["deciding"] = {}
    for v in variants:
        gate, why = deciding_gate(v.precision, v, accuracy, served)
        report["deciding"][v.precision] = {**(asdict(gate) if gate else {}), "why": why}
    chosen, skipped = choose_precision(spec.precision_ladder, qset, accuracy, served)
    report["serving_variant"] = {"precision": chosen, "skipped": skipped}
    save("served", t)
    for a in served.agreements:
        log(f"agreement {a.precision}: {a.verdict}: {a.reason}")
    for o in served.gates:
        log(f"served gate {o.precision}: {o.verdict} (passed {o.passed}): {o.reason}")
    log(f"serving_variant: {chosen}; skipped {skipped}")


if __name__ == "__main__":
    main()
