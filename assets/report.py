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
from assets.partitions import (
    CELL_DERIVED,
    FLEET,
    LOCAL_NODE_TYPE,
    cells_partitions,
    materialized_cells,
    model_of,
    node_type_of,
    node_types_partitions,
    nodes_partitions,
    split_cell,
)
from onboarding.common.errors import OnboardingError
from onboarding.common.files import write_atomic
from onboarding.deploy.readiness import Readiness
from onboarding.deploy.serving_plan import ManifestSet, with_cell_search
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
from resources.upstream import materialized_at, stored_value

GROUP = "report"
OPTIONAL = "optional_upstream"
UPSTREAM = ("readiness", "checkpoint", "quantized", "accuracy", "serving_variant",
            "serving_config", "load_timing", "serving_benchmark", "published_variant",
            "kserve_manifest", "predictions", "config_search")
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
                up: dict[str, Any], node_type: str) -> ModelFacts:
    """The typed upstream values and the config the page needs, for one cell."""
    spec, section = configs.spec(verdict.model), configs.slo_section()
    targets = (node_type,)
    measured_on = {r.node_type for r in (up["load_timing"], up["serving_benchmark"]) if r}
    _, skipped = choose_precision(spec.precision_ladder, up["quantized"], up["accuracy"])
    sweep = outputs.reports / spec.id / node_type / "serving_benchmark.csv"
    manifests: ManifestSet | None = up["kserve_manifest"]
    return ModelFacts(
        model=spec.id, description=spec.description, verdict=verdict, targets=targets,
        ladder=tuple(spec.precision_ladder), gates=configs.accuracy_gates(),
        checkpoint=up["checkpoint"], quantized=up["quantized"], accuracy=up["accuracy"],
        serving_variant=up["serving_variant"], skipped=skipped,
        serving_plan=with_cell_search(up["serving_config"], spec, up["config_search"],
                                      configs.nodes(), configs.stack())
        if up["serving_config"] is not None else None, load_timing=up["load_timing"],
        benchmark=up["serving_benchmark"],
        slos={nt: resolve_slo(section, nt, spec) for nt in {*targets, *measured_on}},
        sweep_rows=read_sweep_csv(sweep), sweep_source=str(sweep),
        published=up["published_variant"], manifests=_manifest_rows(manifests),
        manifest_skipped=dict(manifests.skipped) if manifests else {},
        predictions=up["predictions"],
        min_p95_samples=configs.deploy().probes.min_p95_samples)


@dg.asset(
    tags=CELL_DERIVED,
    partitions_def=cells_partitions,
    ins={n: dg.AssetIn(input_manager_key=OPTIONAL) for n in UPSTREAM},
    deps=[MODEL_SPEC],
    group_name=GROUP,
    description="One self-contained HTML page per (model, node type) cell "
    "(reports/<model>/<node type>/readiness.html; its "
    "latest materialization links it as `report_link`): "
    "what was fetched, the variants and the accuracy each lost, which precision serves and "
    "why, per node type its configuration, numbers and where they came from, start times, "
    "latency-throughput curves, manifests, and the verdict since when.",
)
def readiness_report(context: dg.AssetExecutionContext, configs: ConfigFiles,
                     outputs: OutputDirs, io_manager: dg.ResourceParam[dg.IOManager],
                     **upstream: Any) -> dg.Output[ModelReport]:
    model, node_type, cell = model_of(context), node_type_of(context), context.partition_key
    readiness: Readiness | None = upstream["readiness"]
    if readiness is None:
        raise OnboardingError(f"readiness_report of {model!r} on {node_type}", "`readiness` "
                              "was never materialized for this cell, so there is no verdict "
                              "to report", "Materialize readiness (onboard_cell runs it) first.")
    previous = stored_value(io_manager, context.instance, context.asset_key, cell,
                            cells_partitions)
    verdict = carry_since(previous, readiness,
                          materialized_at(context.instance, "readiness", cell) or 0.0)
    page = model_page(model_facts(configs, outputs, verdict, upstream, node_type))
    path = write_atomic(outputs.reports / model / node_type / MODEL_PAGE, to_html(page))
    value = dataclasses.replace(verdict, html_path=str(path))
    context.log.info(f"{model} on {node_type}: {verdict.summary} (since {verdict.since:.0f}); "
                     f"report {path}")
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


def cell_reports(io_manager: dg.IOManager, instance: dg.DagsterInstance
                 ) -> dict[tuple[str, str], ModelReport]:
    """(model, node type) -> the cell's stored `readiness_report`, cells never reported left
    out. Read per cell that has a materialization, not through a fan-in input that allows
    missing partitions: that input logs a warning for each cell without a report (every
    plan-only entry, on every run)."""
    out = {}
    for key in materialized_cells(instance, "readiness_report"):
        value = stored_value(io_manager, instance, "readiness_report", key, cells_partitions)
        if value is not None:
            out[split_cell(key)] = value
    return out


def fleet_node_types(targets: list[str], registered: list[str]) -> list[str]:
    """The grid's columns: the deployment targets in deploy.yaml's order, then every other
    registered node type (the embedded `cpu` last)."""
    rest = sorted(n for n in registered if n not in targets)
    return [*targets, *[n for n in rest if n != LOCAL_NODE_TYPE],
            *[n for n in rest if n == LOCAL_NODE_TYPE]]


@dg.asset(
    tags=FLEET,
    deps=[dg.AssetDep("readiness_report", partition_mapping=dg.AllPartitionMapping())],
    group_name=GROUP,
    description="The readiness grid (reports/fleet.html): every catalogued model x node type "
    "of the fleet, each cell's verdict, why and since when, linked to the cell's page; the GPU "
    "nodes' acceptance where node_acceptance exists.",
)
def fleet_report(context: dg.AssetExecutionContext, configs: ConfigFiles, outputs: OutputDirs,
                 io_manager: dg.ResourceParam[dg.IOManager]) -> dg.Output[FleetReport]:
    reports = cell_reports(io_manager, context.instance)
    specs = configs.catalog().specs
    columns = fleet_node_types(list(configs.deploy().target_node_types),
                               context.instance.get_dynamic_partitions(
                                   node_types_partitions.name))
    models = sorted({*specs, *(m for m, _ in reports)})
    entries = [FleetEntry(m, bool(specs[m].plan_only) if m in specs else False,
                          {nt: r for (mm, nt), r in reports.items() if mm == m},
                          {nt: f"{m}/{nt}/{MODEL_PAGE}" for (mm, nt) in reports if mm == m})
               for m in models]
    path = outputs.reports / FLEET_PAGE
    value = FleetReport(fleet_rows(entries, columns), str(path),
                        node_acceptances(io_manager, context.instance))
    page = fleet_page(value, columns)
    write_atomic(path, to_html(page))
    return dg.Output(value, metadata={
        "models": len(entries), "node_types": dg.MetadataValue.json(columns),
        "cells_judged": len(reports),
        "ready_models": dg.MetadataValue.json(value.ready_models()),
        "page": dg.MetadataValue.path(str(path)),
        "node_section": "absent (no node partitions)" if value.nodes is None
        else f"{len(value.nodes)} nodes",
        "report": dg.MetadataValue.md(to_markdown(page))})


defs = dg.Definitions(assets=[readiness_report, fleet_report])
