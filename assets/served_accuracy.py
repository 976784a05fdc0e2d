"""`served_accuracy`: the eval tasks scored through the engine that will serve each variant.

`accuracy` scores Model Optimizer's fake quantization in transformers; users get the engine's
kernels on the exported checkpoint. This asset starts the engine (the `Engine` resource) on each
precision it can serve (`engine.can_serve`; vLLM's CPU build: bf16 only), runs the same lm-eval
tasks on the same items against its OpenAI-compatible endpoint, and records per precision:

- a served accuracy record with per-item results (beside `accuracy`'s in-process record);
- the agreement of the two (`served_agreement_<precision>`): a served score beyond the
  in-process one's interval is an export or kernel problem, a failed check with both numbers;
- for quantized precisions, when bf16 was served too, the three-way gate on served scores
  (`served_accuracy_gate_<precision>`), re-evaluated on more items while inconclusive.

`serving_variant` decides on the served gate where one exists, on the in-process gate otherwise.
A performance twin (random weights) is not served for scoring: every check says "not
applicable: random weights" (docs/twins.md).
The runs themselves, and `serve_for_eval` (the one place that decides how the engine is started
for an evaluation), are in resources/accuracy_runs.py.

Why an asset of its own between `accuracy` and `serving_variant`, not more work inside
`accuracy`: it needs the engine, the in-process step needs the model in the step's own memory.
As separate steps (the multiprocess or k8s executor runs each in its own process or pod) the
in-process model and its CUDA context are gone before the engine claims `gpu_memory_utilization`
of the GPU; each step holds the one local GPU slot (`pool="gpu"`) in turn; a step pod gets the
engine's GPU count from cluster.yaml `step_pods.gpus.served_accuracy`, as the serving steps do;
and an engine that fails to start fails this step, with its log, without discarding the
in-process scores.
"""


import dagster as dg

from assets.checks import QUANTIZED_PRECISIONS, gate_check, not_applicable_check
from assets.model_spec import MODEL_SPEC, spec_metadata
from assets.partitions import CELL_MEASURED, cells_partitions, model_of, node_type_of
from assets.stack import SERVING_STACK, stack_metadata
from assets.step_tags import gpu_step_tags
from onboarding.common.refs import CheckpointRef
from onboarding.common.tables import md_table
from onboarding.fetch import twins
from onboarding.quantize.served_accuracy import agreement_rows
from onboarding.quantize.variants import AccuracyReport, QuantizedSet, ServedAccuracyReport
from resources.accuracy_runs import served_report
from resources.config_files import ConfigFiles
from resources.engine import Engine
from resources.evaluator import Evaluator

PRECISIONS = ("bf16", *QUANTIZED_PRECISIONS)


def agreement_check_name(precision: str) -> str:
    return f"served_agreement_{precision}"


def served_gate_check_name(precision: str) -> str:
    return f"served_accuracy_gate_{precision}"


@dg.asset(
    tags=CELL_MEASURED,
    partitions_def=cells_partitions,
    group_name="quantize",
    deps=[SERVING_STACK, MODEL_SPEC],
    op_tags=gpu_step_tags("served_accuracy"),
    pool="gpu",
    check_specs=[
        *(dg.AssetCheckSpec(agreement_check_name(p), asset="served_accuracy", blocking=False,
                            partitions_def=cells_partitions,
                            description=f"{p} scores the same served as in process: the paired "
                                        "difference's interval lies within "
                                        "served_agreement.max_abs_diff")
          for p in PRECISIONS),
        *(dg.AssetCheckSpec(served_gate_check_name(p), asset="served_accuracy", blocking=False,
                            partitions_def=cells_partitions,
                            description=f"{p} served keeps every eval task within the "
                                        "tolerances of configs/gates.yaml against bf16 served")
          for p in QUANTIZED_PRECISIONS),
    ],
)
def served_accuracy(context: dg.AssetExecutionContext, configs: ConfigFiles,
                    checkpoint: CheckpointRef, quantized: QuantizedSet, accuracy: AccuracyReport,
                    engine: Engine, evaluator: Evaluator):
    """Each servable precision scored through the engine; agreement with the in-process score;
    the served gates."""
    spec = configs.spec(model_of(context))
    engine.require_node_type(node_type_of(context), configs.nodes(),
                             f"served_accuracy[{context.partition_key}]")
    gates = configs.accuracy_gates()
    report = twins.served_report(spec.id, spec.precision_ladder, PRECISIONS) if spec.is_twin \
        else served_report(engine, evaluator, spec, checkpoint, quantized, accuracy, gates,
                           log=context.log.info)
    records = [row for r in report.records for row in r.rows()]
    yield dg.Output(report, metadata={
        "served_scores": dg.MetadataValue.md(md_table(records, empty="nothing served here")),
        "agreement": dg.MetadataValue.md(md_table(agreement_rows(report.agreements))),
        "served_gates": dg.MetadataValue.md(md_table(report.rows, empty="no served gate")),
        "not_served": dg.MetadataValue.json(report.not_served),
        "eval_seconds": dg.MetadataValue.json(report.eval_s),
        "hardware": engine.resolved_hardware(),
        "engine": engine.kind(),
        **stack_metadata(configs),
        **spec_metadata(spec),
    })
    for p in PRECISIONS:
        yield not_applicable_check(agreement_check_name(p)) if spec.is_twin \
            else _agreement_check(report, p, spec.precision_ladder)
    for p in QUANTIZED_PRECISIONS:
        why = report.not_served.get(p) or "not in this model's precision ladder"
        yield gate_check(served_gate_check_name(p), report.gate(p), report.rows, p, gates,
                         not_checked=f"not checked: {why}; the in-process gate decides")


def _agreement_check(report: ServedAccuracyReport, precision: str, ladder: list[str]
                     ) -> dg.AssetCheckResult:
    name = agreement_check_name(precision)
    found = report.agreement(precision)
    if found is None:
        why = report.not_served.get(precision) or (
            "not in this model's precision ladder" if precision not in ladder
            else "not scored in process")
        return dg.AssetCheckResult(check_name=name, passed=True,
                                   metadata={"status": f"not checked: {why}"})
    meta: dict = {"verdict": found.verdict, "reason": found.reason}
    for t in found.tasks:
        meta[f"{t.task}_in_process"] = t.in_process
        meta[f"{t.task}_served"] = t.served
        meta[f"{t.task}_diff"] = t.diff
        meta[f"{t.task}_diff_interval"] = f"[{t.diff_low:+.4f}, {t.diff_high:+.4f}]"
        meta[f"{t.task}_items"] = t.n
        meta[f"{t.task}_verdict"] = t.verdict
    return dg.AssetCheckResult(check_name=name, passed=found.passed, metadata=meta,
                               severity=dg.AssetCheckSeverity.WARN)


defs = dg.Definitions(assets=[served_accuracy])
