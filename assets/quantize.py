"""Stage 2: quantize (NVFP4, FP8), evaluate against the bf16 baseline, choose the served precision.

Gates vs fallback: a failing NVFP4 variant must not stop the FP8 fallback, so the per-variant
checks (export validity on `quantized`, the accuracy gate on `accuracy`) are non-blocking WARN
checks that carry the numbers; `serving_variant` takes the first precision of the ladder that
passed both, and records why each earlier one was skipped. When none passed, `serving_variant`
fails (nothing downstream runs, and its previous good materialization stays as it was); its
blocking check re-verifies the chosen variant's bytes on disk before anything consumes it.
"""


import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import dagster as dg

from assets.partitions import models_partitions
from assets.stack import SERVING_STACK, stack_metadata
from assets.step_tags import gpu_step_tags
from onboarding.accuracy_gate import (
    AccuracyGates,
    TaskScore,
    gate_rows,
    judge_variant,
    scores_from_lm_eval,
)
from onboarding.errors import OnboardingError
from onboarding.refs import CheckpointRef, VariantRef
from onboarding.tables import md_table
from onboarding.variants import (
    AccuracyReport,
    GateOutcome,
    QuantizationError,
    QuantizedSet,
    QuantizedVariant,
    choose_precision,
    dir_manifest,
    variant_dir,
)
from resources.config_files import ConfigFiles
from resources.evaluator import Evaluator
from resources.quantizer import Quantizer

QUANTIZED_PRECISIONS = ("nvfp4", "fp8")


def export_check_name(precision: str) -> str:
    return f"export_valid_{precision}"


def gate_check_name(precision: str) -> str:
    return f"accuracy_gate_{precision}"


SERVING_CHECK = "serving_variant_verified"


@dg.asset(
    partitions_def=models_partitions,
    group_name="quantize",
    kinds={"pytorch"},
    deps=[SERVING_STACK],
    op_tags=gpu_step_tags("quantized"),
    pool="gpu",
    check_specs=[
        dg.AssetCheckSpec(export_check_name(p), asset="quantized", blocking=False,
                          description=f"the {p} export, dequantized independently of Model "
                                      "Optimizer, reproduces the in-memory quantized model")
        for p in QUANTIZED_PRECISIONS
    ],
)
def quantized(context: dg.AssetExecutionContext, configs: ConfigFiles, checkpoint: CheckpointRef,
              quantizer: Quantizer):
    """The model's quantized variants (every quantized precision of its ladder) in the cache."""
    spec = configs.spec(context.partition_key)
    ckpt = Path(checkpoint.path)
    variants = []
    for precision in spec.precision_ladder:
        if precision not in QUANTIZED_PRECISIONS:
            continue
        try:
            v = quantizer.quantize(spec.id, ckpt, precision, variant_dir(ckpt, precision),
                                   checkpoint.revision, log=context.log.info)
        except QuantizationError as exc:
            context.log.warning(f"{precision}: {exc}")
            v = QuantizedVariant(precision=precision, path=None, state_path=None, error=str(exc))
        variants.append(v)
    result = QuantizedSet(spec.id, checkpoint.path, checkpoint.total_bytes, tuple(variants))
    version = hashlib.sha256("".join(f"{v.precision}:{v.content_hash or v.error}\n"
                                     for v in variants).encode()).hexdigest()
    yield dg.Output(result, metadata={**_quantized_metadata(result), **stack_metadata(configs)},
                    data_version=dg.DataVersion(version))
    for precision in QUANTIZED_PRECISIONS:
        yield _export_check(result.get(precision), precision)


def _quantized_metadata(result: QuantizedSet) -> dict:
    md: dict = {"baseline_bytes": result.baseline_bytes}
    rows = []
    for v in result.variants:
        s = v.stats
        rows.append({"precision": v.precision, "usable": v.usable,
                     "weight_bytes": s.get("weight_bytes"),
                     "compression_ratio": s.get("compression_ratio"),
                     "calibration_s": s.get("calibration_s"), "export_s": s.get("export_s"),
                     "peak_rss_bytes": s.get("peak_rss_bytes"),
                     "gpu_peak_allocated_bytes": s.get("gpu_peak_allocated_bytes"),
                     "error": v.error or ""})
        if v.path:
            md[f"{v.precision}_path"] = dg.MetadataValue.path(v.path)
            md[f"{v.precision}_hf_quant_config"] = dg.MetadataValue.json(
                json.loads(s.get("hf_quant_config", "{}")))
        for k in ("calibration_s", "export_s", "weight_bytes", "compression_ratio",
                  "peak_rss_bytes", "extension_build_s"):
            if k in s:
                md[f"{v.precision}_{k}"] = s[k]
    md["variants"] = dg.MetadataValue.md(md_table(rows,
                                                  empty="no quantized precision in the ladder"))
    return md


def _export_check(v: QuantizedVariant | None, precision: str) -> dg.AssetCheckResult:
    name = export_check_name(precision)
    if v is None:
        return dg.AssetCheckResult(check_name=name, passed=True,
                                   metadata={"status": "not in this model's precision ladder"})
    meta = {k: val for k, val in v.stats.items() if k.startswith("check_")}
    meta["content_hash"] = v.content_hash or "none"
    if v.error:
        meta["problem"] = v.error
    return dg.AssetCheckResult(check_name=name, passed=v.usable, metadata=meta,
                               severity=dg.AssetCheckSeverity.WARN)


@dg.asset(
    partitions_def=models_partitions,
    group_name="quantize",
    kinds={"pytorch"},
    deps=[SERVING_STACK],
    op_tags=gpu_step_tags("accuracy"),
    pool="gpu",
    check_specs=[
        dg.AssetCheckSpec(gate_check_name(p), asset="accuracy", blocking=False,
                          description=f"{p} keeps every eval task within the tolerances of "
                                      "configs/gates.yaml, judged with the drop's stderr")
        for p in QUANTIZED_PRECISIONS
    ],
)
def accuracy(context: dg.AssetExecutionContext, configs: ConfigFiles, checkpoint: CheckpointRef,
             quantized: QuantizedSet, quantizer: Quantizer, evaluator: Evaluator):
    """lm-eval scores of the bf16 baseline and of each usable variant, and the gate verdicts."""
    spec = configs.spec(context.partition_key)
    gates = configs.accuracy_gates()
    ckpt = Path(checkpoint.path)
    base_run = evaluator.evaluate(ckpt, None, spec.eval_tasks)
    baseline = scores_from_lm_eval(base_run.results, base_run.samples, gates)
    eval_s = {"bf16": round(base_run.seconds, 2)}
    rows, outcomes = gate_rows("bf16", baseline, None), []
    for v in quantized.variants:
        outcome, v_rows, seconds = _judge(context, v, ckpt, baseline, gates, spec.eval_tasks,
                                          quantizer, evaluator)
        outcomes.append(outcome)
        rows += v_rows
        if seconds is not None:
            eval_s[v.precision] = seconds
    report = AccuracyReport(spec.id, tuple(rows), tuple(outcomes), eval_s)
    yield dg.Output(report, metadata={
        "accuracy_table": dg.MetadataValue.md(md_table(rows)),
        "eval_seconds": dg.MetadataValue.json(eval_s),
        "items_per_task": max((r["n"] for r in rows), default=0),
        "gates": dg.MetadataValue.json({o.precision: asdict(o) for o in outcomes}),
        **stack_metadata(configs),
    })
    for precision in QUANTIZED_PRECISIONS:
        yield _gate_check(report, precision, gates)


def _judge(context, v: QuantizedVariant, ckpt: Path, baseline: dict[str, TaskScore],
           gates: AccuracyGates, tasks: list[str], quantizer: Quantizer, evaluator: Evaluator
           ) -> tuple[GateOutcome, list[dict], float | None]:
    """One variant: evaluated in process (fake-quantized as exported) and gated."""
    if not v.usable:
        return (GateOutcome(v.precision, False,
                            f"not evaluated: {v.error or 'export check failed'}"), [], None)
    model, tokenizer = quantizer.load_for_eval(ckpt, v)
    run = evaluator.evaluate(model, tokenizer, tasks)
    del model
    gate = judge_variant(v.precision, baseline,
                         scores_from_lm_eval(run.results, run.samples, gates), gates)
    context.log.info(f"{v.precision}: {'pass' if gate.passed else 'FAIL'}: {gate.reason}")
    return (GateOutcome(v.precision, gate.passed, gate.reason), gate_rows(v.precision, None, gate),
            round(run.seconds, 2))


def _gate_check(report: AccuracyReport, precision: str, gates: AccuracyGates
                ) -> dg.AssetCheckResult:
    outcome = report.gate(precision)
    if outcome is None:
        return dg.AssetCheckResult(check_name=gate_check_name(precision), passed=True,
                                   metadata={"status": "not in this model's precision ladder"})
    meta: dict = {"reason": outcome.reason}
    for r in report.rows:
        if r["precision"] == precision:
            meta[f"{r['task']}_actual"] = float(r["variant"])
            meta[f"{r['task']}_expected"] = float(r["baseline"])
            meta[f"{r['task']}_delta"] = float(r["delta"])
            meta[f"{r['task']}_se_delta"] = float(r["se_delta"])
    meta["tolerance"] = dg.MetadataValue.json(gates.tolerance.model_dump())
    return dg.AssetCheckResult(check_name=gate_check_name(precision), passed=outcome.passed,
                               metadata=meta, severity=dg.AssetCheckSeverity.WARN)


@dg.asset(
    partitions_def=models_partitions,
    group_name="quantize",
    check_specs=[dg.AssetCheckSpec(
        SERVING_CHECK, asset="serving_variant", blocking=True,
        description="the chosen variant passed its gates and its bytes on disk match the hash "
                    "that was evaluated")],
)
def serving_variant(context: dg.AssetExecutionContext, configs: ConfigFiles,
                    checkpoint: CheckpointRef, quantized: QuantizedSet, accuracy: AccuracyReport):
    """The first precision of the ladder whose export is valid and whose accuracy gate passed."""
    spec = configs.spec(context.partition_key)
    precision, skipped = choose_precision(spec.precision_ladder, quantized, accuracy)
    if precision is None:
        raise OnboardingError(
            f"model {spec.id!r}", "no precision of the ladder "
            f"{spec.precision_ladder} may be served: "
            + "; ".join(f"{p}: {why}" for p, why in skipped.items()),
            "Add bf16 to the precision ladder, try an MLP-only NVFP4 preset under "
            "configs/quantization.yaml `models`, or review the tolerances in configs/gates.yaml.")
    if precision == "bf16":
        weight_bytes = sum(p.stat().st_size for p in Path(checkpoint.path).glob("*.safetensors"))
        ref = VariantRef(spec.id, "bf16", checkpoint.path, checkpoint.total_bytes,
                         checkpoint.content_hash, weight_bytes)
    else:
        v = quantized.get(precision)
        ref = VariantRef(spec.id, precision, v.path, v.total_bytes, v.content_hash,
                         int(v.stats.get("weight_bytes", v.total_bytes)))
        weight_bytes = ref.weight_bytes
    meta = {"precision": precision, "weight_bytes": weight_bytes, "total_bytes": ref.total_bytes,
            "variant_path": dg.MetadataValue.path(ref.path), "content_hash": ref.content_hash,
            "ladder": " → ".join(spec.precision_ladder)}
    for p, why in skipped.items():
        meta[f"skipped_{p}"] = why
    yield dg.Output(ref, metadata=meta, data_version=dg.DataVersion(ref.content_hash))
    yield _verify_serving(ref, checkpoint)


def _verify_serving(ref: VariantRef, checkpoint: CheckpointRef) -> dg.AssetCheckResult:
    if ref.precision == "bf16":
        return dg.AssetCheckResult(check_name=SERVING_CHECK, passed=True, metadata={
            "precision": "bf16", "note": "the baseline checkpoint, verified by `checkpoint`"})
    on_disk = dir_manifest(Path(ref.path), "verify", checkpoint.revision).content_hash
    return dg.AssetCheckResult(check_name=SERVING_CHECK, passed=on_disk == ref.content_hash,
                               metadata={"expected_hash": ref.content_hash,
                                         "hash_on_disk": on_disk, "path": ref.path})


defs = dg.Definitions(assets=[quantized, accuracy, serving_variant])
