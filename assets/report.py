"""`readiness_report` (one page per model) and `fleet_report` (every catalogued model x target
node type): self-contained HTML under the reports directory, the same content as Markdown in
the metadata. The rendering is onboarding/reports/pages.py's; here the stored values are gathered.

Every upstream arrives as the value its asset stored (None where that stage never ran for the
model, through `optional_upstream`), so the page says what is absent instead of guessing.
"Since when" is carried over from the model's previous report (its own stored value, read with
`stored_value`): the readiness materialization that first had the current state.

Node acceptance is partitioned by node, not by model: the fleet report reads each
node's stored `node_acceptance` value when that asset has been materialized, never numbers from
its metadata. Without it the page says so.
"""

import dataclasses
from pathlib import Path
from typing import Any

import dagster as dg

from assets.model_spec import MODEL_SPEC, spec_metadata
from assets.partitions import models_partitions, nodes_partitions
from onboarding.common.errors import OnboardingError
from onboarding.common.files import write_atomic
from onboarding.deploy.readiness import Readiness
from onboarding.deploy.serving_plan import ManifestSet
from onboarding.quantize.variants import choose_precision
from onboarding.reports.pages import (
    FleetEntry,
    FleetReport,
    ManifestRow,
    ModelFacts,
    ModelReport,
    NodeAcceptanceRow,
    carry_since,
    fleet_page,
    fleet_rows,
    manifest_row,
    model_page,
    read_sweep_csv,
    to_html,
    to_markdown,
)
from onboarding.serving.profiles import resolve_slo
from resources.config_files import ConfigFiles, OutputDirs
from resources.upstream import by_model, materialized_at, stored_value

GROUP = "report"
OPTIONAL = "optional_upstream"
UPSTREAM = ("readiness", "checkpoint", "quantized", "accuracy", "serving_variant",
            "serving_config", "load_timing", "serving_benchmark", "published_variant",
            "kserve_manifest", "predictions")
MODEL_PAGE = "readiness.html"
FLEET_PAGE = "fleet.html"
# the node assets: partitioned by GPU node (assets/partitions.py `nodes_partitions` there)
NODE_ACCEPTANCE = dg.AssetKey("node_acceptance")


def _manifest_rows(m: ManifestSet | None) -> tuple[ManifestRow, ...] | None:
    if m is None:
        return None

    def text(path: str) -> str | None:
        return Path(path).read_text() if Path(path).is_file() else None

    return tuple(manifest_row(nt, path, m.services.get(nt, ""), m.config_hashes.get(nt, ""),
                              m.measured.get(nt, False), m.published.get(nt, False), m.valid,
                              text(path)) for nt, path in sorted(m.files.items()))


def model_facts(configs: ConfigFiles, outputs: OutputDirs, verdict: ModelReport,
                up: dict[str, Any]) -> ModelFacts:
    """The typed upstream values and the config the page needs, for one model."""
    spec, section = configs.spec(verdict.model), configs.slo_section()
    targets = tuple(configs.deploy().target_node_types)
    measured_on = {r.node_type for r in (up["load_timing"], up["serving_benchmark"]) if r}
    _, skipped = choose_precision(spec.precision_ladder, up["quantized"], up["accuracy"])
    sweep = outputs.reports / spec.id / "serving_benchmark.csv"
    manifests: ManifestSet | None = up["kserve_manifest"]
    return ModelFacts(
        model=spec.id, description=spec.description, verdict=verdict, targets=targets,
        ladder=tuple(spec.precision_ladder), gates=configs.accuracy_gates(),
        checkpoint=up["checkpoint"], quantized=up["quantized"], accuracy=up["accuracy"],
        serving_variant=up["serving_variant"], skipped=skipped,
        serving_plan=up["serving_config"], load_timing=up["load_timing"],
        benchmark=up["serving_benchmark"],
        slos={nt: resolve_slo(section, nt, spec) for nt in {*targets, *measured_on}},
        sweep_rows=read_sweep_csv(sweep), sweep_source=str(sweep),
        published=up["published_variant"], manifests=_manifest_rows(manifests),
        manifest_skipped=dict(manifests.skipped) if manifests else {},
        predictions=up["predictions"],
        min_p95_samples=configs.deploy().probes.min_p95_samples)


@dg.asset(
    partitions_def=models_partitions,
    ins={n: dg.AssetIn(input_manager_key=OPTIONAL) for n in UPSTREAM},
    deps=[MODEL_SPEC],
    group_name=GROUP,
    description="One self-contained HTML page per model (reports/<model>/readiness.html; its "
    "latest materialization links it as `report_link`): "
    "what was fetched, the variants and the accuracy each lost, which precision serves and "
    "why, per node type its configuration, numbers and where they came from, start times, "
    "latency-throughput curves, manifests, and the verdict since when.",
)
def readiness_report(context: dg.AssetExecutionContext, configs: ConfigFiles,
                     outputs: OutputDirs, io_manager: dg.ResourceParam[dg.IOManager],
                     **upstream: Any) -> dg.Output[ModelReport]:
    model = context.partition_key
    readiness: Readiness | None = upstream["readiness"]
    if readiness is None:
        raise OnboardingError(f"readiness_report of {model!r}", "`readiness` was never "
                              "materialized for this model, so there is no verdict to report",
                              "Materialize readiness (onboard_model runs it) first.")
    previous = stored_value(io_manager, context.instance, context.asset_key, model,
                            models_partitions)
    verdict = carry_since(previous, readiness,
                          materialized_at(context.instance, "readiness", model) or 0.0)
    page = model_page(model_facts(configs, outputs, verdict, upstream))
    path = write_atomic(outputs.reports / model / MODEL_PAGE, to_html(page))
    value = dataclasses.replace(verdict, html_path=str(path))
    context.log.info(f"{model}: {verdict.summary} (since {verdict.since:.0f}); report {path}")
    return dg.Output(value, metadata={
        "ready": verdict.ready, "verdict": verdict.summary,
        "since": dg.MetadataValue.timestamp(verdict.since),
        "page": dg.MetadataValue.path(str(path)),
        # a link the UI shows as one (the path above is for copying): the HTML page, plots
        # embedded (open it where the file is, e.g. beside `dagster dev`)
        "report_link": dg.MetadataValue.url(path.resolve().as_uri()),
        "plots": len(page.figures()),
        "report": dg.MetadataValue.md(to_markdown(page)),
        **spec_metadata(configs.spec(model))})


def node_acceptances(io_manager: dg.IOManager, instance: dg.DagsterInstance
                     ) -> tuple[NodeAcceptanceRow, ...] | None:
    """Every registered node's stored `node_acceptance` value; None when no node partition
    exists (the asset is not in this code location, or no node was ever registered)."""
    nodes = instance.get_dynamic_partitions(nodes_partitions.name)
    if not nodes:
        return None
    rows = []
    for node in sorted(nodes):
        value = stored_value(io_manager, instance, NODE_ACCEPTANCE, node, nodes_partitions)
        if value is None:
            rows.append(NodeAcceptanceRow(node, "", False, ("never accepted",), None))
            continue
        rows.append(NodeAcceptanceRow(
            str(getattr(value, "node", node)), str(getattr(value, "node_type", "")),
            bool(getattr(value, "qualified", False)), tuple(getattr(value, "reasons", ())),
            getattr(value, "accepted_at", None), tuple(getattr(value, "phases", ()))))
    return tuple(rows)


def model_reports(io_manager: dg.IOManager, instance: dg.DagsterInstance
                  ) -> dict[str, ModelReport]:
    """Every registered model's stored `readiness_report`, those never reported left out.
    Read per partition that has a materialization, not through a fan-in input that allows
    missing partitions: that input logs a warning for each model without a report (every
    plan-only entry, on every run)."""
    models = instance.get_dynamic_partitions(models_partitions.name)
    values = (stored_value(io_manager, instance, "readiness_report", m, models_partitions)
              for m in sorted(models))
    return by_model({i: v for i, v in enumerate(values)})


@dg.asset(
    deps=[dg.AssetDep("readiness_report", partition_mapping=dg.AllPartitionMapping())],
    group_name=GROUP,
    description="One HTML page over the fleet (reports/fleet.html): every catalogued model x "
    "target node type, ready or not, why, since when, linked to each model's page; the GPU "
    "nodes' acceptance where node_acceptance exists.",
)
def fleet_report(context: dg.AssetExecutionContext, configs: ConfigFiles, outputs: OutputDirs,
                 io_manager: dg.ResourceParam[dg.IOManager]) -> dg.Output[FleetReport]:
    reports = model_reports(io_manager, context.instance)
    specs = configs.catalog().specs
    targets = configs.deploy().target_node_types
    entries = [FleetEntry(m, bool(specs[m].plan_only) if m in specs else False, reports.get(m),
                          f"{m}/{MODEL_PAGE}" if m in reports else "")
               for m in sorted({*specs, *reports})]
    path = outputs.reports / FLEET_PAGE
    value = FleetReport(fleet_rows(entries, targets), str(path),
                        node_acceptances(io_manager, context.instance))
    page = fleet_page(value, targets)
    write_atomic(path, to_html(page))
    return dg.Output(value, metadata={
        "models": len(entries), "ready_models": dg.MetadataValue.json(value.ready_models()),
        "page": dg.MetadataValue.path(str(path)),
        "node_section": "absent (no node partitions)" if value.nodes is None
        else f"{len(value.nodes)} nodes",
        "report": dg.MetadataValue.md(to_markdown(page))})


defs = dg.Definitions(assets=[readiness_report, fleet_report])
