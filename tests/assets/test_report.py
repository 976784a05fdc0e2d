"""readiness -> readiness_report -> fleet_report in a real Dagster instance.

The upstream stages are stand-ins that store the typed values the real stages store
(tests/report_facts.py); `readiness` is the real asset, so the pages are checked against the
verdict it computed from those values.
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

from assets.partitions import nodes_partitions
from assets.report import fleet_report, readiness_report
from onboarding.common.paths import PROJECT_ROOT
from onboarding.reports.pages import FleetReport, ModelReport
from resources.upstream import materialized_at
from tests.dagster_support import metadata, store_upstream
from tests.report_facts import (
    BIG,
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


def output(result: dg.ExecuteInJobResult, asset: str):
    return result.output_for_node(asset)


@pytest.mark.slow
def test_model_and_fleet_pages_from_the_stored_values(instance, configs, outputs):
    shutil.copy(PROJECT_ROOT / "configs" / "models" / f"{SMALL}.yaml", configs.models_path)
    store_model(instance, ready_model(), configs, outputs)
    result = materialize_reports(instance, BIG, configs, outputs)
    assert result.success
    verdict = output(result, "readiness")
    report: ModelReport = output(result, "readiness_report")
    assert verdict.summary() == "ready on h200"
    assert report.summary == verdict.summary() and report.ready
    assert report.readiness_at == materialized_at(instance, "readiness", BIG)
    assert report.since == report.readiness_at  # the first verdict dates itself
    page = Path(report.html_path)
    assert page == outputs.reports / BIG / "readiness.html"
    text = page.read_text()
    assert f'<span id="verdict">{verdict.summary()}</span>' in text
    assert text.count('<img class="plot"') == 3
    assert page.stat().st_mode & 0o777 == 0o644
    md = metadata(result, "readiness_report")
    assert md["verdict"] == verdict.summary() and md["plots"] == 3
    assert md["page"] == str(page)  # not "path": the IO manager writes its own there
    for heading in ("## Verdict", "## What was fetched", "## Variants and accuracy",
                    "## Which precision serves, and why", "## b300", "## h200",
                    "### h200: measured at configuration", "## Plan (every node type)",
                    "## Manifests"):
        assert heading in md["report"], heading
    assert "predicted by AIConfigurator 0.12.0" in md["report"]  # b300's numbers

    fleet: FleetReport = output(result, "fleet_report")
    assert Path(fleet.html_path) == outputs.reports / "fleet.html"
    rows = {(r.model, r.node_type): r for r in fleet.rows}
    assert set(rows) == {(m, nt) for m in (BIG, SMALL) for nt in ("b300", "h200")}
    assert rows[(BIG, "h200")].ready and rows[(BIG, "h200")].href == f"{BIG}/readiness.html"
    assert "SLOs never measured" in rows[(BIG, "b300")].why
    assert rows[(SMALL, "h200")].why.startswith("never judged: a plan-only catalog entry")
    assert fleet.nodes is None  # no node partition: the section says node_acceptance is absent
    fleet_html = Path(fleet.html_path).read_text()
    assert f'href="{BIG}/readiness.html"' in fleet_html
    assert "No node acceptance to show" in metadata(result, "fleet_report")["report"]

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    listed = subprocess.run(["bash", str(PROJECT_ROOT / "scripts" / "dev.sh"), "report"],
                            env={**env, "ONBOARDING_REPORTS_DIR": str(outputs.reports)},
                            capture_output=True, text=True, check=True, timeout=60)
    assert listed.stdout.split() == [fleet.html_path, report.html_path]


@pytest.mark.slow
def test_since_holds_while_the_state_holds_and_moves_when_it_changes(instance, configs,
                                                                     outputs):
    stored = ready_model()
    store_model(instance, stored, configs, outputs)
    first = output(materialize_reports(instance, BIG, configs, outputs), "readiness_report")
    again = output(materialize_reports(instance, BIG, configs, outputs), "readiness_report")
    assert again.readiness_at > first.readiness_at  # readiness ran again ...
    assert again.since == first.since  # ... with the same verdict: still ready since then
    assert again.node("h200").since == first.node("h200").since

    missed = dataclasses.replace(stored.values["serving_benchmark"], slo_pass=False,
                                 slo_violations=("chat @ 32: TTFT p95 1.900 s > 1.5 s",))
    store_upstream(instance, BIG, serving_benchmark=missed)
    changed = output(materialize_reports(instance, BIG, configs, outputs), "readiness_report")
    assert not changed.ready and changed.since == changed.readiness_at > again.readiness_at
    assert changed.node("h200").since == changed.readiness_at
    assert changed.node("b300").since == first.node("b300").since  # b300 stayed not ready
    assert "SLOs missed: chat @ 32: TTFT p95 1.900 s > 1.5 s" in changed.node("h200").reasons
    fleet = output(materialize_reports(instance, BIG, configs, outputs), "fleet_report")
    assert {r.node_type: r.since for r in fleet.rows if r.model == BIG} == {
        "b300": first.node("b300").since, "h200": changed.readiness_at}


@pytest.mark.slow
def test_a_not_ready_model_shows_each_reason(instance, configs, outputs):
    store_model(instance, stand_in_model(), configs, outputs)
    result = materialize_reports(instance, BIG, configs, outputs)
    assert result.success
    verdict = output(result, "readiness")
    assert not verdict.ready
    text = Path(output(result, "readiness_report").html_path).read_text()
    for node in verdict.nodes:
        for reason in node.reasons:
            assert reason in text
    assert "Measured on cpu (not a target node type&#x27;s configuration)" in text
    assert "a warning only (a stand-in profile)" in text


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
    nodes = {n.node: n for n in output(result, "fleet_report").nodes}
    assert nodes["gpu-node-1"].reasons == ("phase 2 gpu_health: XID 79 on GPU 3",)
    assert not nodes["gpu-node-1"].qualified and nodes["gpu-node-1"].node_type == "h200"
    assert nodes["gpu-node-2"].reasons == ("never accepted",)
    md = metadata(result, "fleet_report")["report"]
    assert "| gpu-node-1 | h200 | no | 1: go, 2: no-go |" in md


@pytest.mark.slow
def test_the_fleet_reads_the_reports_there_are_without_a_warning_per_missing_one(
        instance, configs, outputs):
    """A registered model never reported (a plan-only entry) is listed as never judged, and
    the run logs no "Couldn't load partition ... skipped it" for it (the fan-in input that
    allowed missing partitions logged one per such model on every run)."""
    shutil.copy(PROJECT_ROOT / "configs" / "models" / f"{SMALL}.yaml", configs.models_path)
    instance.add_dynamic_partitions("models", [SMALL])
    store_model(instance, ready_model(), configs, outputs)
    result = materialize_reports(instance, BIG, configs, outputs)
    assert result.success
    fleet: FleetReport = output(result, "fleet_report")
    assert {r.model for r in fleet.rows if r.href} == {BIG}
    assert all(r.why.startswith("never judged") for r in fleet.rows if r.model == SMALL)
    messages = [e.message for e in instance.all_logs(result.run_id)]
    assert not [m for m in messages if "Couldn't load partition" in m]


def test_no_verdict_no_report(instance, configs, outputs):
    shutil.copy(PROJECT_ROOT / "configs" / "models" / f"{BIG}.yaml", configs.models_path)
    instance.add_dynamic_partitions("models", [BIG])
    from assets.partitions import models_partitions
    from resources.upstream import optional_upstream

    result = dg.materialize(
        [readiness_report, fleet_report, dg.AssetSpec("readiness",
                                                      partitions_def=models_partitions),
         *(dg.AssetSpec(n, partitions_def=models_partitions) for n in (
             "checkpoint", "quantized", "accuracy", "serving_variant", "serving_config",
             "load_timing", "serving_benchmark", "published_variant", "kserve_manifest",
             "predictions"))],
        instance=instance, partition_key=BIG, raise_on_error=False,
        selection=[readiness_report],
        resources={"configs": configs, "outputs": outputs, "optional_upstream": optional_upstream})
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    error = failure.step_failure_data.error
    assert "`readiness` was never materialized" in (error.cause or error).message


def test_a_fleet_without_any_report_lists_every_model_as_never_judged(instance, configs,
                                                                      outputs):
    from assets.partitions import models_partitions

    shutil.copy(PROJECT_ROOT / "configs" / "models" / f"{SMALL}.yaml", configs.models_path)
    instance.add_dynamic_partitions("models", [SMALL])  # registered, never reported
    result = dg.materialize(
        [fleet_report, dg.AssetSpec("readiness_report", partitions_def=models_partitions)],
        instance=instance, resources={"configs": configs, "outputs": outputs})
    fleet = output(result, "fleet_report")
    assert [(r.model, r.ready) for r in fleet.rows] == [(SMALL, False), (SMALL, False)]
    assert all(r.why.startswith("never judged") and not r.href for r in fleet.rows)
    assert "0 of 1 catalogued models ready" in Path(fleet.html_path).read_text()


def test_onboarding_and_revalidation_runs_write_the_reports():
    from pipelines.definitions import defs

    for job in ("onboard_model", "revalidate_model"):
        keys = {k.to_user_string() for k in
                defs.resolve_job_def(job).asset_layer.executable_asset_keys}
        assert {"readiness", "readiness_report", "fleet_report"} <= keys, job
