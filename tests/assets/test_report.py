"""readiness -> readiness_report (one per (model, node type) cell) -> fleet_report in a real
Dagster instance.

The upstream stages are stand-ins that store the typed values the real stages store
(tests/report_facts.py), each at its level (per model, or in the cell it belongs to);
`readiness` is the real asset, so the pages are checked against the verdict it computed from
those values.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from assets.partitions import cell_key, nodes_partitions
from assets.report import fleet_report, readiness_report
from onboarding.common.paths import PROJECT_ROOT
from onboarding.reports.pages import FleetReport, readiness_grid
from resources.upstream import materialized_at
from tests.dagster_support import metadata, register, store_upstream, upstream_specs
from tests.report_facts import (
    BIG,
    TARGETS,
    cells_of,
    materialize_reports,
    ready_model,
    stand_in_model,
    store_model,
)

SMALL = "llama-3-1-8b-instruct"  # a second catalog entry, plan-only: never judged


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


@pytest.mark.slow
def test_model_and_fleet_pages_from_the_stored_values(instance, configs, outputs):
    shutil.copy(PROJECT_ROOT / "configs" / "models" / f"{SMALL}.yaml", configs.models_path)
    store_model(instance, ready_model(), configs, outputs)
    result = materialize_reports(instance, BIG, configs, outputs)
    assert result.success
    assert set(result.cells) == {"b300", "h200"} == set(TARGETS)
    for nt in TARGETS:
        verdict, report = result.verdict(nt), result.report(nt)
        assert [n.node_type for n in verdict.nodes] == [nt]  # the cell's own node type alone
        assert report.summary == verdict.summary() and report.ready == verdict.ready
        assert report.readiness_at == materialized_at(instance, "readiness",
                                                      str(cell_key(BIG, nt)))
        assert report.since == report.readiness_at  # the first verdict dates itself
        page = Path(report.html_path)
        assert page == outputs.reports / BIG / nt / "readiness.html"
        assert f'<span id="verdict">{verdict.summary()}</span>' in page.read_text()
        assert page.stat().st_mode & 0o777 == 0o644
        md = metadata(result.cells[nt], "readiness_report")
        assert md["verdict"] == verdict.summary()
        assert md["page"] == str(page)  # not "path": the IO manager writes its own there
    assert result.verdict("h200").summary() == "ready on h200"
    assert result.report("h200").ready and not result.report("b300").ready
    assert "SLOs never measured" in result.verdict("b300").summary()

    h200_page = Path(result.report("h200").html_path).read_text()
    assert h200_page.count('<img class="plot"') == 3
    h200 = metadata(result.cells["h200"], "readiness_report")
    assert h200["plots"] == 3
    for heading in ("## Verdict", "## What was fetched", "## Variants and accuracy",
                    "## Which precision serves, and why", "## h200",
                    "### h200: measured at configuration", "## Plan (every node type)",
                    "## Manifests"):
        assert heading in h200["report"], heading
    assert "## b300" not in h200["report"]  # b300 is its own cell, with its own page
    b300 = metadata(result.cells["b300"], "readiness_report")["report"]
    assert "## b300" in b300 and "## h200\n" not in b300
    assert "predicted by AIConfigurator 0.12.0" in b300  # b300's numbers
    assert "### b300: measured at configuration" not in b300  # measured on h200 only

    fleet: FleetReport = result.fleet_report()
    assert Path(fleet.html_path) == outputs.reports / "fleet.html"
    rows = {(r.model, r.node_type): r for r in fleet.rows}
    assert set(rows) == {(m, nt) for m in (BIG, SMALL) for nt in ("b300", "h200")}
    assert rows[(BIG, "h200")].ready and rows[(BIG, "h200")].href == f"{BIG}/h200/readiness.html"
    assert rows[(BIG, "b300")].href == f"{BIG}/b300/readiness.html"
    assert "SLOs never measured" in rows[(BIG, "b300")].why
    assert rows[(SMALL, "h200")].why.startswith("never judged: a plan-only catalog entry")
    assert list(readiness_grid(fleet, TARGETS)) == [
        {"model": BIG, "b300": "not ready", "h200": "ready"},
        {"model": SMALL, "b300": "plan only", "h200": "plan only"}]
    assert fleet.nodes is None  # no node partition: the section says node_acceptance is absent
    fleet_html = Path(fleet.html_path).read_text()
    for nt in TARGETS:
        assert f'href="{BIG}/{nt}/readiness.html"' in fleet_html
    fleet_md = metadata(result.fleet, "fleet_report")
    assert fleet_md["cells_judged"] == 2 and fleet_md["node_types"] == list(TARGETS)
    assert fleet_md["report"].index("## Readiness grid") < fleet_md["report"].index(
        "## Models x node types")  # the grid first
    assert "No node acceptance to show" in fleet_md["report"]

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    listed = subprocess.run(["bash", str(PROJECT_ROOT / "scripts" / "dev.sh"), "report"],
                            env={**env, "ONBOARDING_REPORTS_DIR": str(outputs.reports)},
                            capture_output=True, text=True, check=True, timeout=60)
    assert listed.stdout.split() == [fleet.html_path, result.report("b300").html_path,
                                     result.report("h200").html_path]


@pytest.mark.slow
def test_since_holds_while_the_state_holds_and_moves_when_it_changes(instance, configs,
                                                                     outputs):
    stored = ready_model()
    store_model(instance, stored, configs, outputs)
    first = materialize_reports(instance, BIG, configs, outputs)
    again = materialize_reports(instance, BIG, configs, outputs)
    for nt in TARGETS:
        # readiness ran again ...
        assert again.report(nt).readiness_at > first.report(nt).readiness_at
        # ... with the same verdict: still (not) ready since then
        assert again.report(nt).since == first.report(nt).since
        assert again.report(nt).node(nt).since == first.report(nt).node(nt).since
    assert again.report("h200").ready and not again.report("b300").ready

    missed = dataclasses.replace(stored.values["serving_benchmark"], slo_pass=False,
                                 slo_violations=("chat @ 32: TTFT p95 1.900 s > 1.5 s",))
    store_upstream(instance, BIG, serving_benchmark=missed)  # the h200 cell's, its node type
    changed = materialize_reports(instance, BIG, configs, outputs)
    h200 = changed.report("h200")
    assert not h200.ready and h200.since == h200.readiness_at > again.report("h200").readiness_at
    assert h200.node("h200").since == h200.readiness_at
    # b300 stayed not ready: the h200 cell's new measurement changes nothing there
    assert changed.report("b300").since == first.report("b300").since
    assert changed.report("b300").node("b300").since == first.report("b300").node("b300").since
    assert "SLOs missed: chat @ 32: TTFT p95 1.900 s > 1.5 s" in h200.node("h200").reasons
    fleet = materialize_reports(instance, BIG, configs, outputs).fleet_report()
    assert {r.node_type: r.since for r in fleet.rows if r.model == BIG} == {
        "b300": first.report("b300").since, "h200": h200.readiness_at}


@pytest.mark.slow
def test_a_not_ready_model_shows_each_reason(instance, configs, outputs):
    stored = stand_in_model()
    store_model(instance, stored, configs, outputs)
    assert cells_of(stored) == (*TARGETS, "cpu")  # measured on the embedded engine's cell
    result = materialize_reports(instance, BIG, configs, outputs, node_types=cells_of(stored))
    assert result.success
    for nt in cells_of(stored):
        verdict = result.verdict(nt)
        assert not verdict.ready, nt
        text = Path(result.report(nt).html_path).read_text()
        assert verdict.reasons or verdict.nodes, nt
        for reason in verdict.reasons:
            assert reason in text, (nt, reason)
        for node in verdict.nodes:
            for reason in node.reasons:
                assert reason in text, (nt, reason)
    cpu = Path(result.report("cpu").html_path).read_text()
    assert "Measured on cpu (not a target node type&#x27;s configuration)" in cpu
    assert "a warning only (a stand-in profile)" in cpu
    assert "no manifest: cpu is not a deployment target" in result.verdict("cpu").summary()
    for nt in TARGETS:  # the cpu measurement is the cpu cell's, shown on no other page
        text = Path(result.report(nt).html_path).read_text()
        assert "Measured on cpu" not in text and "Nothing measured" in text, nt


@dataclass(frozen=True)
class StandInAcceptance:
    """Stand-in of node acceptance's NodeAcceptance: the fields the fleet page reads."""

    node: str
    node_type: str
    qualified: bool
    reasons: tuple[str, ...]
    phases: tuple[dict, ...]
    accepted_at: float


@pytest.mark.slow
def test_the_fleet_shows_node_acceptance_from_its_stored_values(instance, configs, outputs):
    @dg.asset(name="node_acceptance", partitions_def=nodes_partitions)
    def node_acceptance(context) -> StandInAcceptance:
        return StandInAcceptance(context.partition_key, "h200", False,
                                 ("phase 2 gpu_health: XID 79 on GPU 3",),
                                 ({"phase": 1, "verdict": "go"}, {"phase": 2, "verdict": "no-go"}),
                                 1_764_000_000.0)

    instance.add_dynamic_partitions("nodes", ["gpu-node-1", "gpu-node-2"])
    assert dg.materialize([node_acceptance], instance=instance,
                          partition_key="gpu-node-1").success
    store_model(instance, ready_model(), configs, outputs)
    result = materialize_reports(instance, BIG, configs, outputs)
    assert result.success
    nodes = {n.node: n for n in result.fleet_report().nodes}
    assert nodes["gpu-node-1"].reasons == ("phase 2 gpu_health: XID 79 on GPU 3",)
    assert not nodes["gpu-node-1"].qualified and nodes["gpu-node-1"].node_type == "h200"
    assert nodes["gpu-node-2"].reasons == ("never accepted",)
    md = metadata(result.fleet, "fleet_report")["report"]
    assert "| gpu-node-1 | h200 | no | 1: go, 2: no-go |" in md


@pytest.mark.slow
def test_the_fleet_reads_the_reports_there_are_without_a_warning_per_missing_one(
        instance, configs, outputs):
    """A registered model never reported (a plan-only entry) is listed as never judged, and
    the run logs no "Couldn't load partition ... skipped it" for it (the fan-in input that
    allowed missing partitions logged one per such cell on every run)."""
    shutil.copy(PROJECT_ROOT / "configs" / "models" / f"{SMALL}.yaml", configs.models_path)
    instance.add_dynamic_partitions("models", [SMALL])
    store_model(instance, ready_model(), configs, outputs)
    result = materialize_reports(instance, BIG, configs, outputs)
    assert result.success
    fleet: FleetReport = result.fleet_report()
    assert {r.model for r in fleet.rows if r.href} == {BIG}
    assert {(r.model, r.node_type) for r in fleet.rows if r.model == SMALL} == {
        (SMALL, nt) for nt in TARGETS}
    assert all(r.why.startswith("never judged") for r in fleet.rows if r.model == SMALL)
    messages = [e.message for e in instance.all_logs(result.fleet.run_id)]
    assert not [m for m in messages if "Couldn't load partition" in m]


def test_no_verdict_no_report(instance, configs, outputs):
    shutil.copy(PROJECT_ROOT / "configs" / "models" / f"{BIG}.yaml", configs.models_path)
    register(instance, BIG, "h200")
    from resources.upstream import optional_upstream

    result = dg.materialize(
        [readiness_report, fleet_report, *upstream_specs(
            "readiness", "checkpoint", "quantized", "accuracy", "serving_variant",
            "serving_config", "load_timing", "serving_benchmark", "published_variant",
            "kserve_manifest", "predictions", "config_search")],
        instance=instance, partition_key=str(cell_key(BIG, "h200")), raise_on_error=False,
        selection=[readiness_report],
        resources={"configs": configs, "outputs": outputs, "optional_upstream": optional_upstream})
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    error = failure.step_failure_data.error
    assert "`readiness` was never materialized" in (error.cause or error).message
    assert not (outputs.reports / BIG / "h200" / "readiness.html").exists()


def test_a_fleet_without_any_report_lists_every_model_as_never_judged(instance, configs,
                                                                      outputs):
    shutil.copy(PROJECT_ROOT / "configs" / "models" / f"{SMALL}.yaml", configs.models_path)
    instance.add_dynamic_partitions("models", [SMALL])  # registered, never reported
    result = dg.materialize(
        [fleet_report, *upstream_specs("readiness_report")],
        instance=instance, resources={"configs": configs, "outputs": outputs})
    fleet = result.output_for_node("fleet_report")
    assert [(r.model, r.ready) for r in fleet.rows] == [(SMALL, False), (SMALL, False)]
    assert all(r.why.startswith("never judged") and not r.href for r in fleet.rows)
    assert "0 of 1 catalogued models ready" in Path(fleet.html_path).read_text()


def test_onboarding_and_revalidation_runs_write_the_reports():
    """The reports are cell-level: every cell job (onboard_cell, revalidate_cell, plan_cell)
    writes the cell's readiness and its page, then the fleet's grid; the model's own jobs
    cannot (one partition key per run), their cells follow them (pipelines/cells.py)."""
    from pipelines.definitions import defs

    reports = {"readiness", "readiness_report", "fleet_report"}
    for job in ("onboard_cell", "revalidate_cell", "plan_cell"):
        keys = {k.to_user_string() for k in
                defs.resolve_job_def(job).asset_layer.executable_asset_keys}
        assert reports <= keys, job
    for job in ("onboard_model", "revalidate_model"):
        keys = {k.to_user_string() for k in
                defs.resolve_job_def(job).asset_layer.executable_asset_keys}
        assert not reports & keys, job
