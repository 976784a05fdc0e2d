"""`readiness`: ready or not, and why, per model and target node type (onboarding/deploy/readiness.py).

Fed by the stored results (None where an upstream never ran for the model), so it says exactly
which gate is missing: accuracy, the SLOs at the deployed configuration, publication, or the
manifest. The re-validation schedule and the verdict sensors report the same verdict.
"""

import dagster as dg

from assets.model_spec import MODEL_SPEC, spec_metadata
from assets.partitions import CELL_DERIVED, cells_partitions, model_of, node_type_of
from onboarding.common.refs import VariantRef
from onboarding.common.tables import md_table
from onboarding.deploy.readiness import ManifestFacts, Readiness, cold_start_budgets, judge
from onboarding.deploy.serving_plan import ManifestSet
from onboarding.quantize.variants import ServedAccuracyReport
from onboarding.reports.verdict import sentence
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult
from resources.config_files import ConfigFiles

OPTIONAL = "optional_upstream"


@dg.asset(
    tags=CELL_DERIVED,
    partitions_def=cells_partitions,
    ins={n: dg.AssetIn(input_manager_key=OPTIONAL)
         for n in ("serving_variant", "load_timing", "serving_benchmark", "kserve_manifest",
                   "served_accuracy")},
    deps=[MODEL_SPEC],
    group_name="report",
    description="Ready / not ready (why) of one (model, node type) cell: accuracy gate passed, SLOs met "
    "and the cold start within budget at the deployed configuration, weights published and "
    "verified, manifest valid.",
)
def readiness(context: dg.AssetExecutionContext, configs: ConfigFiles,
              serving_variant: VariantRef | None, load_timing: LoadTimingResult | None,
              serving_benchmark: ServingBenchmarkResult | None,
              kserve_manifest: ManifestSet | None,
              served_accuracy: ServedAccuracyReport | None) -> dg.Output[Readiness]:
    facts = None if kserve_manifest is None else ManifestFacts(
        kserve_manifest.valid, kserve_manifest.config_hashes, kserve_manifest.published,
        dict(kserve_manifest.skipped))
    model, node_type = model_of(context), node_type_of(context)
    spec = configs.spec(model)
    targets = [node_type]  # this cell's; another cell's verdict is its own
    verdict = judge(model, targets, serving_variant, serving_benchmark, facts,
                    twin=spec.is_twin, timing=load_timing, served=served_accuracy,
                    cold_start_budgets_s=cold_start_budgets(configs.slo_section(), spec, targets))
    said, next_step = sentence(verdict.ready, verdict.reasons,
                               [(n.node_type, n.ready, n.reasons) for n in verdict.nodes])
    context.log.info(f"{model} on {node_type}: {said} {next_step}")
    return dg.Output(verdict, metadata={
        "ready": verdict.ready,
        "verdict": said,
        "next_step": next_step,
        "reasons": verdict.summary(),
        "per_node_type": dg.MetadataValue.md(md_table(verdict.rows(), empty="(no node type)")),
        **spec_metadata(spec),
    })


defs = dg.Definitions(assets=[readiness])
