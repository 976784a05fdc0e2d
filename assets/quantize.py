"""Stage 2: quantize (NVFP4, FP8), evaluate against the bf16 baseline, choose the served precision.

Gates vs fallback: a failing NVFP4 variant must not stop the FP8 fallback, so the per-variant
checks (export validity on `quantized`, the accuracy gate on `accuracy`) are non-blocking WARN
checks that carry the numbers; `serving_variant` takes the first precision of the ladder that
passed both (the accuracy gate on served scores where `served_accuracy` judged the variant,
in process otherwise), and records why each earlier one was skipped and which gate decided. When none passed, `serving_variant`
fails (nothing downstream runs, and its previous good materialization stays as it was); its
blocking check re-verifies the chosen variant's bytes on disk before anything consumes it.
"""


import hashlib
import json
from functools import partial
from pathlib import Path

import dagster as dg

from assets.checks import QUANTIZED_PRECISIONS, gate_check, not_applicable_check
from assets.model_spec import MODEL_SPEC, spec_metadata
from assets.partitions import (
    cells_partitions,
    materialized_cells,
    models_partitions,
    split_cell,
)
from assets.stack import SERVING_STACK, stack_metadata
from assets.step_tags import gpu_step_tags
from onboarding.common.errors import OnboardingError
from onboarding.common.refs import CheckpointRef, VariantRef
from onboarding.common.tables import md_table
from onboarding.deploy.plan import build_plan
from onboarding.fetch import twins
from onboarding.fetch.catalog import ModelSpec
from onboarding.fetch.twins import NOT_APPLICABLE
from onboarding.quantize.accuracy_gate import (
    AccuracyGates,
    GateResult,
    ScoreBook,
    baseline_rows,
    decide,
    gate_rows,
)
from onboarding.quantize.variants import (
    IN_PROCESS,
    AccuracyRecord,
    AccuracyReport,
    GateOutcome,
    QuantizationError,
    QuantizedSet,
    QuantizedVariant,
    ServedAccuracyReport,
    choose_across,
    deciding_gate,
    dir_manifest,
    variant_dir,
    variant_ref,
)
from onboarding.reports.pages import gates_table
from resources.accuracy_runs import in_process_scorer
from resources.config_files import ConfigFiles
from resources.engine import Engine
from resources.evaluator import Evaluator
from resources.quantizer import Quantizer
from resources.upstream import stored_value


def export_check_name(precision: str) -> str:
    return f"export_valid_{precision}"


def gate_check_name(precision: str) -> str:
    return f"accuracy_gate_{precision}"


SERVING_CHECK = "serving_variant_verified"


@dg.asset(
    partitions_def=models_partitions,
    group_name="quantize",
    kinds={"pytorch"},
    deps=[SERVING_STACK, MODEL_SPEC],
    op_tags=gpu_step_tags("quantized"),
    pool="gpu",
    check_specs=[
        dg.AssetCheckSpec(export_check_name(p), asset="quantized", blocking=False,
                          partitions_def=models_partitions,
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
    make = quantizer.twin_variant if spec.is_twin else partial(quantizer.quantize,
                                                               log=context.log.info)
    for precision in spec.precision_ladder:
        if precision not in QUANTIZED_PRECISIONS:
            continue
        try:
            v = make(spec.id, ckpt, precision, variant_dir(ckpt, precision), checkpoint.revision)
        except QuantizationError as exc:
            context.log.warning(f"{precision}: {exc}")
            v = QuantizedVariant(precision=precision, path=None, state_path=None, error=str(exc))
        variants.append(v)
    result = QuantizedSet(spec.id, checkpoint.path, checkpoint.total_bytes, tuple(variants))
    version = hashlib.sha256("".join(f"{v.precision}:{v.content_hash or v.error}\n"
                                     for v in variants).encode()).hexdigest()
    yield dg.Output(result, metadata={**_quantized_metadata(result), **stack_metadata(configs),
                                      **spec_metadata(spec), "weights": spec.weights},
                    data_version=dg.DataVersion(version))
    for precision in QUANTIZED_PRECISIONS:
        yield _export_check(result.get(precision), precision, spec.is_twin)


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


def _export_check(v: QuantizedVariant | None, precision: str, twin: bool = False
                  ) -> dg.AssetCheckResult:
    name = export_check_name(precision)
    if v is None:
        return dg.AssetCheckResult(check_name=name, passed=True,
                                   metadata={"status": "not in this model's precision ladder"})
    if twin and v.usable:
        return not_applicable_check(name, f"{NOT_APPLICABLE}: Model Optimizer's export marker "
                                    "only, no weights to dequantize", {
                                        "marker": "read back: quant_algo, quant_method "
                                        "modelopt, "
                                        + ("NVFP4 group size, " if precision == "nvfp4" else "")
                                        + "lm_head excluded",
                                        "content_hash": v.content_hash})
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
    deps=[SERVING_STACK, MODEL_SPEC],
    op_tags=gpu_step_tags("accuracy"),
    pool="gpu",
    check_specs=[
        dg.AssetCheckSpec(gate_check_name(p), asset="accuracy", blocking=False,
                          partitions_def=models_partitions,
                          description=f"{p} keeps every eval task within the tolerances of "
                                      "configs/gates.yaml: the drop's interval (paired per "
                                      "item) lies within the allowed drop")
        for p in QUANTIZED_PRECISIONS
    ],
)
def accuracy(context: dg.AssetExecutionContext, configs: ConfigFiles, checkpoint: CheckpointRef,
             quantized: QuantizedSet, quantizer: Quantizer, evaluator: Evaluator):
    """lm-eval scores of the bf16 baseline and of each usable variant (in process), per item,
    and the three-way gate verdicts; inconclusive variants are re-evaluated on more items."""
    spec = configs.spec(context.partition_key)
    gates = configs.accuracy_gates()
    if spec.is_twin:
        yield from _twin_accuracy(configs, spec, gates)
        return
    ckpt = Path(checkpoint.path)
    eval_s: dict[str, float] = {}
    baseline = ScoreBook.first(
        in_process_scorer(evaluator, gates, eval_s, "bf16", ckpt, None, context.log.info),
        spec.eval_tasks)
    rows, outcomes, records = [], [], []
    for v in quantized.variants:
        outcome, gate, record = _judge(context, v, ckpt, baseline, gates, spec.eval_tasks,
                                       quantizer, evaluator, eval_s)
        outcomes.append(outcome)
        rows += gate_rows(v.precision, gate) if gate else []
        records += [record] if record else []
    records.insert(0, AccuracyRecord("bf16", IN_PROCESS, checkpoint.content_hash,
                                     baseline.scores, eval_s["bf16"]))
    rows = baseline_rows("bf16", baseline.scores) + rows
    eval_s = {p: round(sec, 2) for p, sec in eval_s.items()}
    report = AccuracyReport(spec.id, tuple(rows), tuple(outcomes), eval_s, tuple(records))
    yield dg.Output(report, metadata={
        "accuracy_table": dg.MetadataValue.md(md_table(rows)),
        "eval_seconds": dg.MetadataValue.json(eval_s),
        "items_per_task": max((r["n"] for r in rows), default=0),
        "gates": dg.MetadataValue.md(gates_table(outcomes)),
        **stack_metadata(configs),
        **spec_metadata(spec),
    })
    for precision in QUANTIZED_PRECISIONS:
        yield gate_check(gate_check_name(precision), report.gate(precision), report.rows,
                         precision, gates)


def _twin_accuracy(configs: ConfigFiles, spec: ModelSpec, gates: AccuracyGates):
    """Nothing is scored: random weights answer at chance whatever the precision."""
    report = twins.accuracy_report(spec.id, spec.precision_ladder)
    yield dg.Output(report, metadata={
        "accuracy_table": dg.MetadataValue.md(f"{NOT_APPLICABLE}: a performance twin's outputs "
                                              "are noise; nothing was evaluated"),
        "weights": spec.weights,
        "gates": dg.MetadataValue.md(gates_table(report.gates)),
        **stack_metadata(configs),
        **spec_metadata(spec),
    })
    for precision in QUANTIZED_PRECISIONS:
        yield gate_check(gate_check_name(precision), report.gate(precision), (), precision, gates)


def _judge(context, v: QuantizedVariant, ckpt: Path, baseline: ScoreBook, gates: AccuracyGates,
           tasks: list[str], quantizer: Quantizer, evaluator: Evaluator, eval_s: dict
           ) -> tuple[GateOutcome, GateResult | None, AccuracyRecord | None]:
    """One variant: evaluated in process (fake-quantized as exported), gated, and re-evaluated
    on more items while inconclusive."""
    if not v.usable:
        return (GateOutcome(
            precision=v.precision, passed=False,
            reason=f"not evaluated: {v.error or 'export check failed'}"), None, None)
    model, tokenizer = quantizer.load_for_eval(ckpt, v)
    book = ScoreBook.first(
        in_process_scorer(evaluator, gates, eval_s, v.precision, model, tokenizer,
                          context.log.info), tasks)
    gate = decide(v.precision, baseline, book, gates, log=context.log.info)
    context.log.info(f"{v.precision}: {gate.verdict}"
                     f"{'' if gate.passed else ' (FAIL)'}: {gate.reason}")
    return (GateOutcome.of(gate, IN_PROCESS), gate,
            AccuracyRecord(v.precision, IN_PROCESS, v.content_hash, book.scores,
                           eval_s[v.precision]))


@dg.asset(
    partitions_def=models_partitions,
    group_name="quantize",
    # served accuracy is a cell's (kernels differ per GPU architecture): read per node type
    # that has one (`served_reports`), not as an input of one partition
    deps=[MODEL_SPEC, "served_accuracy"],
    check_specs=[dg.AssetCheckSpec(
        SERVING_CHECK, asset="serving_variant", partitions_def=models_partitions, blocking=True,
        description="the chosen variant passed its gates and its bytes on disk match the hash "
                    "that was evaluated")],
)
def serving_variant(context: dg.AssetExecutionContext, configs: ConfigFiles, engine: Engine,
                    checkpoint: CheckpointRef, quantized: QuantizedSet, accuracy: AccuracyReport,
                    io_manager: dg.ResourceParam[dg.IOManager]):
    """The first precision of the ladder whose export is valid and whose accuracy gate passed:
    the served gate on every node type where the variant was served (the strictest wins), else
    the in-process one. A performance twin has no gate to climb: the precision the plan serves
    on the node type at hand."""
    spec = configs.spec(context.partition_key)
    if spec.is_twin:
        yield from _twin_serving_variant(configs, engine, spec, checkpoint, quantized)
        return
    served = served_reports(io_manager, context.instance, spec.id)
    served_accuracy = next(iter(served.values()), None)  # for the metadata's deciding gate
    precision, skipped = choose_across(spec.precision_ladder, quantized, accuracy, served)
    if precision is None:
        raise OnboardingError(
            f"model {spec.id!r}", "no precision of the ladder "
            f"{spec.precision_ladder} may be served: "
            + "; ".join(f"{p}: {why}" for p, why in skipped.items()),
            "Add bf16 to the precision ladder, try an MLP-only NVFP4 preset under "
            "configs/quantization.yaml `models`, or review the tolerances in configs/gates.yaml.")
    ref = variant_ref(spec.id, precision, checkpoint, quantized)
    meta = {"precision": precision, "weight_bytes": ref.weight_bytes,
            "total_bytes": ref.total_bytes, "variant_path": dg.MetadataValue.path(ref.path),
            "content_hash": ref.content_hash, "ladder": " → ".join(spec.precision_ladder),
            **spec_metadata(spec)}
    for p, why in skipped.items():
        meta[f"skipped_{p}"] = why
    meta["served_on"] = dg.MetadataValue.json(sorted(served))
    for v in quantized.variants:
        gate, source = deciding_gate(v.precision, v, accuracy, served_accuracy)
        if gate is not None:
            meta[f"gate_{v.precision}"] = f"{gate.verdict}, decided {source}"
    yield dg.Output(ref, metadata=meta, data_version=dg.DataVersion(ref.content_hash))
    yield _verify_serving(ref, checkpoint)


def _twin_serving_variant(configs: ConfigFiles, engine: Engine, spec: ModelSpec,
                          checkpoint: CheckpointRef, quantized: QuantizedSet):
    plan = build_plan(spec, configs.nodes(), checkpoint, None)
    precision, why = twins.twin_precision(spec.id, spec.precision_ladder, plan, engine.node_type,
                                          engine.can_serve)
    if error := twins.unusable_marker(spec.id, precision, quantized):
        raise error
    ref = variant_ref(spec.id, precision, checkpoint, quantized)
    yield dg.Output(ref, data_version=dg.DataVersion(ref.content_hash), metadata={
        "precision": precision, "weights": f"random ({twins.NO_WEIGHTS})",
        "chosen_because": why, "node_type": engine.node_type,
        "accuracy_gate": NOT_APPLICABLE, "total_bytes": ref.total_bytes,
        "variant_path": dg.MetadataValue.path(ref.path), "content_hash": ref.content_hash,
        "ladder": " → ".join(spec.precision_ladder), **spec_metadata(spec)})
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


def served_reports(io_manager: dg.IOManager, instance: dg.DagsterInstance, model: str
                   ) -> dict[str, ServedAccuracyReport]:
    """node type -> the model's stored served_accuracy of that cell, where one exists."""
    out = {}
    for key in materialized_cells(instance, "served_accuracy", model):
        value = stored_value(io_manager, instance, "served_accuracy", key, cells_partitions)
        if value is not None:
            out[split_cell(key)[1]] = value
    return out
