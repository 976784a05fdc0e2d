"""The readiness report's pages, rendered from crafted stored values (tests/report_facts.py):
every section and plot present, self-contained HTML, every number with its source, a
not-ready model's reasons, since-when carried over, the fleet's rows."""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import re
from pathlib import Path

import pytest
from PIL import Image

from bench.gpu_recordings import folder
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.tables import write_csv
from onboarding.deploy.plan import Measured, plan, plan_inputs, shape_from_hint
from onboarding.deploy.readiness import Readiness, judge
from onboarding.deploy.serving_plan import serving_plan
from onboarding.quantize.variants import AccuracyReport
from onboarding.reports.pages import (
    FleetEntry,
    FleetReport,
    NodeAcceptanceRow,
    Page,
    Table,
    _measured_blocks,
    carry_since,
    drop_points,
    fleet_page,
    fleet_rows,
    manifest_row,
    model_page,
    node_numbers,
    read_sweep_csv,
    readiness_grid,
    to_html,
    to_markdown,
    when,
)
from tests.report_facts import (
    BIG,
    CATALOG,
    GATES,
    NODES,
    STACK,
    TARGETS,
    facts_of,
    ready_model,
    stand_in_model,
    sweep_rows,
)

DATA_URI = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


@pytest.fixture(scope="module")
def ready():
    return ready_model()


@pytest.fixture(scope="module")
def ready_page(ready):
    return model_page(facts_of(ready))


@pytest.mark.slow
def test_a_ready_model_has_every_section_and_plot(ready_page):
    anchors = [s.anchor for s in ready_page.sections]
    assert anchors == ["verdict-section", "fetched", "accuracy", "precision", "node-b300",
                       "node-h200", "measured-h200", "plan", "manifests"]
    assert [f.name for f in ready_page.figures()] == ["accuracy", "starts", "curves"]
    page = to_html(ready_page)
    assert ('<div class="verdict ready"><span class="sentence" id="verdict-sentence">'
            "Ready on h200; not ready: on b300 its SLOs were never measured at the "
            "configuration deployed there.</span>") in page
    assert 'readiness: <span id="verdict">ready on h200</span>' in page
    assert 'id="verdict-h200">ready</span>' in page
    assert 'id="verdict-b300">not ready: SLOs never measured at configuration' in page


def test_the_html_is_self_contained_and_every_plot_decodes(ready_page):
    page = to_html(ready_page)
    assert "<script" not in page and "<link" not in page and "url(" not in page
    assert re.findall(r'(?:src|href)="([^"]*)"', page) == [
        m.group(0)[5:-1] for m in DATA_URI.finditer(page)]  # every src is a data: URI
    images = [Image.open(io.BytesIO(base64.b64decode(b))) for b in DATA_URI.findall(page)]
    assert len(images) == 3 and all(i.format == "PNG" and min(i.size) > 100 for i in images)


def test_markdown_says_what_the_html_says(ready_page):
    page, md = to_html(ready_page), to_markdown(ready_page)
    for s in ready_page.sections:
        assert f"{'#' * s.level} {s.title}" in md and f">{s.title}</h{s.level}>" in page
    for f in ready_page.figures():
        encoded = base64.b64encode(f.png).decode()
        assert encoded in md and encoded in page
    tables = [b for s in ready_page.sections for b in s.blocks if isinstance(b, Table)]
    assert page.count("<table>") == md.count("\n|---") + md.count("\n|--:") == sum(
        1 for t in tables if t.rows)


def test_numbers_carry_where_they_came_from(ready):
    facts = facts_of(ready)
    h200, b300 = ready.splan.config("h200"), ready.splan.config("b300")
    measured = {r["quantity"]: r for r in node_numbers(facts, "h200", h200)}
    where = f"measured on h200 at configuration {h200.hash} (vllm {h200.engine_version})"
    assert measured["cold start p95 (s)"] == {"quantity": "cold start p95 (s)", "value": 55.2,
                                              "source": where}
    assert measured["tokens/s/GPU"]["value"] == 1210.5
    assert measured["SLO at target concurrency"]["source"] == f"{where} (blocking)"
    assert measured["weights"]["source"] == "measured: the variant's files"
    predicted = {r["quantity"]: r for r in node_numbers(facts, "b300", b300)}
    assert (b300.precision, b300.tensor_parallel) == ("fp8", 1)
    # tests/data/predict/recorded_predictions.json: b300 fp8 TP 1 at batch 32, no calibration
    assert predicted["tokens/s/GPU"]["value"] == pytest.approx(1247.3584477699214)
    assert predicted["TPOT (ms)"]["value"] == pytest.approx(24.778500059357285)
    assert predicted["tokens/s/GPU"]["source"].startswith(
        "predicted by AIConfigurator 0.12.0 from its b300_sxm vllm 0.24.0 data, uncorrected")
    assert predicted["cold start p95 (s)"]["value"] is None
    assert predicted["cold start p95 (s)"]["source"].startswith(
        f"unmeasured: configuration {b300.hash} was never measured on b300")
    assert predicted["SLO at target concurrency (predicted)"]["value"] == "pass"


def test_estimates_name_their_rule():
    spec = CATALOG[BIG]
    p = plan(plan_inputs(spec, NODES, shape_from_hint(spec.architecture, "t"), Measured()),
             NODES)
    splan = serving_plan(spec, p, NODES, STACK)
    facts = dataclasses.replace(facts_of(ready_model()), serving_plan=splan, load_timing=None,
                                benchmark=None, predictions=None)
    rows = {r["quantity"]: r for r in node_numbers(facts, "h200", splan.config("h200"))}
    assert rows["weights"]["source"] == ("estimate: parameters (catalog "
                                         "architecture.params_billion (declared)) x bytes per "
                                         "parameter of fp8 (configs/nodes.yaml)")
    assert rows["tokens/s/GPU"]["value"] is None
    assert rows["tokens/s/GPU"]["source"].startswith("absent: unmeasured")
    assert rows["KV cache per GPU (GiB)"]["source"].startswith("rule: 32 sequences x 8192")


@pytest.mark.slow
def test_a_not_ready_model_shows_every_reason_in_both_renderings():
    stored = stand_in_model()
    verdict: Readiness = stored.values["readiness"]
    page = model_page(facts_of(stored))
    text, md = to_html(page), to_markdown(page)
    assert not verdict.ready
    reasons = [r for n in verdict.nodes for r in n.reasons]
    assert len(reasons) == 4  # per target: unpublished, SLOs never measured at its hash
    for reason in reasons:
        assert reason in md and html.escape(reason) in text
    assert f'<span id="verdict">{verdict.summary()}</span>' in text
    # the headline says it in plain words, without the hashes the reasons carry, and what next
    headline = re.search(r'id="verdict-sentence">([^<]*)</span><span class="next">(.*?)</span>'
                         r'<span class="detail">', text)
    assert headline[1] == ("Not ready: on b300 and h200 its weights are not published and "
                           "verified and its SLOs were never measured at the configuration "
                           "deployed there.")
    assert headline[2] == "Next, for b300 and h200: materialize <code>published_variant</code>."
    assert [s.anchor for s in page.sections][-3:] == ["measured", "plan", "manifests"]
    assert "Measured on cpu (not a target node type's configuration)" in md
    assert "a warning only (a stand-in profile)" in md
    assert "chat @ 4: mean ITL 180.2 ms > 150 ms" in md
    assert "unpublished: no fp8 variant was published" in md


def test_absent_stages_are_said_absent():
    model = "fresh-model"
    verdict = judge(model, list(TARGETS), None, None, None)
    stored = ready_model()
    facts = dataclasses.replace(
        facts_of(stored), model=model, verdict=carry_since(None, verdict, 5.0), checkpoint=None,
        quantized=None, accuracy=None, serving_variant=None, skipped={}, serving_plan=None,
        load_timing=None, benchmark=None, sweep_rows=(), published=None, manifests=None,
        predictions=None)
    md = to_markdown(model_page(facts))
    for absent in ("`checkpoint` was never materialized", "`quantized` was never materialized",
                   "`accuracy` was never materialized", "nothing serves",
                   "`serving_config` was never materialized", "Nothing measured",
                   "`kserve_manifest` was never materialized"):
        assert absent in md, absent
    assert "not ready: no precision passed its accuracy gate" in md
    assert not model_page(facts).figures()


def test_drop_intervals_from_the_paired_se_or_from_the_gate():
    rows, _ = drop_points(ready_model().values["accuracy"], GATES)
    arith_fp8 = next(p for p in rows if (p.task, p.precision) == ("onb_arith_gen", "fp8"))
    assert arith_fp8.drop_pts == pytest.approx(4.6)
    assert (arith_fp8.low_pts, arith_fp8.high_pts) == pytest.approx(
        (4.6 - 1.645 * 2.5, 4.6 + 1.645 * 2.5))
    assert arith_fp8.allowed_pts == pytest.approx(0.05 * 43.6)
    # a three-way gate's rows carry their own interval, allowed drop and verdict
    row = {"task": "onb_arith_gen", "metric": "exact_match", "precision": "fp8",
           "baseline": 0.436, "variant": 0.39, "delta": -0.046, "se_delta": 0.025, "n": 200,
           "drop_low": 0.005, "drop_high": 0.087, "allowed_drop": 0.0218,
           "verdict": "inconclusive", "passed": False}
    points, table = drop_points(AccuracyReport("m", (row,), ()), GATES)
    assert (points[0].low_pts, points[0].high_pts, points[0].allowed_pts) == pytest.approx(
        (0.5, 8.7, 2.18))
    assert points[0].verdict == "inconclusive" and table[0]["interval"] == "the gate's interval"


def test_since_is_carried_while_the_state_holds():
    stored = ready_model()
    verdict = stored.values["readiness"]
    first = carry_since(None, verdict, 100.0)
    assert first.since == 100.0 and {n.since for n in first.nodes} == {100.0}
    held = carry_since(first, verdict, 200.0)
    assert held.since == 100.0 and held.readiness_at == 200.0
    h200_down = Readiness(verdict.model, False, tuple(
        dataclasses.replace(n, ready=False, reasons=("SLOs missed: x",)) for n in verdict.nodes))
    changed = carry_since(held, h200_down, 300.0)
    assert changed.since == 300.0
    assert changed.node("h200").since == 300.0 and changed.node("b300").since == 100.0


def test_fleet_rows_cover_every_model_and_node_type():
    ready_report = carry_since(None, ready_model().values["readiness"], 100.0)
    no_variant = carry_since(None, judge("b", list(TARGETS), None, None, None), 50.0)
    def cells(report, model):  # one cell per node type, each holding its own verdict
        return ({nt: report for nt in TARGETS},
                {nt: f"{model}/{nt}/readiness.html" for nt in TARGETS})

    rows = fleet_rows([
        FleetEntry("a", False, *cells(ready_report, "a")),
        FleetEntry("b", False, *cells(no_variant, "b")),
        FleetEntry("c", True), FleetEntry("d", False),
        FleetEntry("e", False, {"h200": ready_report}, {"h200": "e/h200/readiness.html"})],
        TARGETS)
    by = {(r.model, r.node_type): r for r in rows}
    assert len(rows) == 10
    assert by[("a", "h200")].ready and by[("a", "h200")].since == 100.0
    assert by[("a", "h200")].href == "a/h200/readiness.html"
    # one cell measured and judged: the other node type's cell is never judged, whatever
    # the first says
    assert by[("e", "h200")].ready
    assert by[("e", "b300")].why == "never judged: no readiness_report of this cell yet"
    assert by[("b", "h200")].why.startswith("no precision passed its accuracy gate")
    assert by[("b", "b300")].since == 50.0
    assert by[("c", "b300")].why.startswith("never judged: a plan-only catalog entry")
    assert by[("d", "b300")].why == "never judged: no readiness_report of this cell yet"
    fleet = FleetReport(rows, "", (NodeAcceptanceRow("n1", "h200", True, (), 10.0,
                                                     ({"phase": 1, "verdict": "go"},)),))
    page = fleet_page(fleet, TARGETS)
    text, md = to_html(page), to_markdown(page)
    assert fleet.ready_models() == ["a", "e"]
    assert "2 of 5 catalogued models ready" in md
    grid = {r["model"]: r for r in readiness_grid(fleet, TARGETS)}
    assert grid["e"] == {"model": "e", "h200": "ready", "b300": "never judged"}
    assert grid["c"]["h200"] == "plan only" and grid["b"]["h200"] == "not ready"
    assert '<a href="a/h200/readiness.html">a</a>' in text and "[a](a/h200/readiness.html)" in md
    assert "| n1 | h200 | yes | 1: go |" in md and when(10.0) in md


def test_manifest_row_reads_storage_and_the_number_sources():
    golden = PROJECT_ROOT / "tests" / "golden" / "llama-3-1-70b-instruct-h200.yaml"
    row = manifest_row("h200", str(golden), "svc", "af89fa284c1e", False, False, True,
                       golden.read_text())
    assert row.storage_uri == "s3://model-serving/llama-3-1-70b-instruct/fp8/"
    assert row.notes["startup-probe"].startswith("default: never load-timed")
    assert row.notes["throughput"].startswith("absent: never benchmarked")


def test_the_sweep_csv_reads_back_as_numbers(tmp_path):
    rows = sweep_rows()
    read = read_sweep_csv(write_csv(tmp_path / "sweep.csv", rows))
    assert [dict(r) for r in read] == [{k: float(v) if isinstance(v, int) and not isinstance(
        v, bool) else v for k, v in r.items()} for r in rows]
    assert read_sweep_csv(tmp_path / "absent.csv") == ()


@pytest.mark.slow
def test_a_cold_start_p95_of_fewer_than_three_starts_says_its_n(ready):
    """One start's p95 is that start; the report says n where n < 3."""
    facts = facts_of(ready)
    h200 = ready.splan.config("h200")
    few = dataclasses.replace(facts, load_timing=dataclasses.replace(
        facts.load_timing, cold_start_samples=1, cold_start_max_s=55.2))
    row = {r["quantity"]: r for r in node_numbers(few, "h200", h200)}["cold start p95 (s)"]
    assert "(n=1: fewer than 3 starts" in row["source"]
    blocks = [b for b in _measured_blocks(few) if isinstance(b, Table)]
    fully_cold = next(r for r in blocks[0].rows if r["start"] == "fully_cold")
    assert fully_cold["n"] == 1 and "(p95 of n=1" in fully_cold["source"]
    # the threshold is deploy.yaml's probes.min_p95_samples, as the manifest's probe uses
    five = dataclasses.replace(few, min_p95_samples=5, load_timing=dataclasses.replace(
        few.load_timing, cold_start_samples=4))
    row = {r["quantity"]: r for r in node_numbers(five, "h200", h200)}["cold start p95 (s)"]
    assert "(n=4: fewer than 5 starts" in row["source"]


@pytest.mark.slow
def test_a_frontend_bound_point_is_marked_with_what_to_do(ready):
    rows = [{**r, "frontend_cpu_cores": 0.97 if r["load"] == 64 else 0.3,
             "frontend_bound": r["load"] == 64} for r in sweep_rows()]
    md = to_markdown(model_page(dataclasses.replace(facts_of(ready), sweep_rows=tuple(rows))))
    assert "--api-server-count" in md
    assert "chat @ 64: frontend-bound, its API server at 0.97 of a core" in md
    assert "rag @ 64: frontend-bound" in md and "@ 32: frontend-bound" not in md
    assert "--api-server-count" not in to_markdown(model_page(facts_of(ready)))


def _recorded_kernels(log: Path, precision: str, arch: str):
    """The kernels a recorded H200 start named, and the gate's reading of them on `arch`."""
    from onboarding.serving.kernels import StartKernels, judge, read_kernel_facts

    facts = read_kernel_facts(STACK.templates["vllm"].kernel_facts,
                              log.read_text().splitlines())
    starts = (StartKernels("fully_cold", facts),)
    return starts, judge(NODES.kernel_gate, "vllm", precision, arch, starts)


@pytest.mark.slow
def test_the_measured_section_shows_the_kernels_each_start_ran(ready):
    facts = facts_of(ready)
    starts, verdict = _recorded_kernels(
        folder("stages") / "engine-logs/engine-llama-3-1-8b-instruct-twin-54287-1796071496.log",
        "fp8", "sm90")
    measured = dataclasses.replace(facts, load_timing=dataclasses.replace(
        facts.load_timing, kernels=starts, kernel_verdict=verdict))
    md = to_markdown(model_page(measured))
    assert "CutlassFP8ScaledMMLinearKernel" in md and "FULL_AND_PIECEWISE" in md
    assert "Kernel gate (pass): fp8 on sm90 (vllm): native FP8" in md
    assert "Kernels: not read" in to_markdown(model_page(facts))  # a result from before


@pytest.mark.slow
def test_hopper_nvfp4_says_it_ran_weight_only(ready):
    facts = facts_of(ready)
    starts, verdict = _recorded_kernels(
        folder("client_accounting") / "engine-logs/served-nvfp4-marlin-refused.log",
        "nvfp4", "sm90")
    page = model_page(dataclasses.replace(facts, load_timing=dataclasses.replace(
        facts.load_timing, kernels=starts, kernel_verdict=verdict)))
    for text in (to_markdown(page), html.unescape(to_html(page))):
        assert "weight-only FP4 (Marlin): Blackwell-only speed not measured" in text
        assert "MarlinNvFp4LinearKernel" in text


def test_colours_mean_good_and_bad_not_yes_and_no():
    """frontend_bound false is the good value (green), a skipped upload is a fact (no colour),
    a missed SLO is bad (red); a plan-only model in the fleet is not a red "no"."""
    page = Page("t", (Table(({"frontend_bound": False, "skipped_upload": True,
                              "slo_pass": False, "published": True},)),), ())
    text = to_html(page)
    assert ('<td class="yes">no</td><td>yes</td><td class="no">no</td>'
            '<td class="yes">yes</td>') in text
    rows = fleet_rows([FleetEntry("qwen3-32b", True)], ["h200"])
    fleet = to_html(fleet_page(FleetReport(rows), ["h200"]))
    assert "<td>plan only</td>" in fleet and '<td class="no">' not in fleet
