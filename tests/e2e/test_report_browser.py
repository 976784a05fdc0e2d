"""The readiness report in headless Chromium, as a person opens it: the pages written by the
real report assets (upstream stand-ins, the real `readiness` asset, a real Dagster instance)
loaded over file://, one per (model, node type) cell, every plot decoded and laid out, the
verdicts word for word what each cell's `readiness` computed, the fleet page's grid and its
links leading to the cells' pages, nothing fetched from anywhere, and screenshots under
test-artifacts/report/."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from onboarding.common.paths import PROJECT_ROOT
from tests.dagster_support import metadata
from tests.e2e.docs_screenshots import keep_for_docs
from tests.e2e.test_ui import CHROMIUM, CHROMIUM_ARGS
from tests.report_facts import (
    BIG,
    TARGETS,
    cells_of,
    materialize_reports,
    ready_model,
    stand_in_model,
    store_model,
)

pytestmark = pytest.mark.slow

ARTIFACTS = PROJECT_ROOT / "test-artifacts" / "report"
SMALL = "llama-3-1-8b-instruct"

PLOTS = """() => Array.from(document.querySelectorAll('img.plot')).map(i => ({
    id: i.id, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight,
    shown: i.getBoundingClientRect().width}))"""
# tables wider than the page at 1400 px: their last columns would be cut off (or behind a scroll)
CUT_OFF = """() => Array.from(document.querySelectorAll('table'))
    .filter(t => t.scrollWidth > t.clientWidth + 1)
    .map(t => [t.closest('section') ? t.closest('section').id : '', t.scrollWidth, t.clientWidth])"""


# the fleet's grid as the page shows it: header, then one row per model
GRID = """() => Array.from(document.querySelectorAll('#grid tr')).map(
    tr => Array.from(tr.querySelectorAll('th, td')).map(c => c.innerText))"""


@pytest.fixture
def reports(configs, outputs) -> dict[tuple[str, str], tuple[str, int]]:
    """(model, node type) -> the summary of the cell's `readiness` value its page was made
    from, and the number of plots its readiness_report recorded."""
    verdicts = {}
    with dg.instance_for_test() as instance:
        stored = {BIG: ready_model(BIG), SMALL: stand_in_model(SMALL)}
        for s in stored.values():
            store_model(instance, s, configs, outputs)
        for model in (SMALL, BIG):
            result = materialize_reports(instance, model, configs, outputs,
                                         node_types=cells_of(stored[model]))
            assert result.success
            for nt in result.cells:
                verdicts[(model, nt)] = (result.verdict(nt).summary(), metadata(
                    result.cells[nt], "readiness_report")["plots"])
    return verdicts


def _check_plots(page, name: str) -> int:
    plots = page.evaluate(PLOTS)
    assert plots, f"{name}: no plot"
    for p in plots:
        assert p["complete"] and p["width"] > 100 and p["height"] > 100, (name, p)
        assert p["shown"] > 100, (name, p)  # laid out, not collapsed
    return len(plots)


def test_the_pages_render_with_the_verdicts_of_readiness(reports, outputs):
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    assert set(reports) == {(BIG, nt) for nt in TARGETS} | {(SMALL, nt) for nt in (
        *TARGETS, "cpu")}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    # the docs' two pages: the ready cell, and the stand-in's b300 cell with its reasons
    docs = {(BIG, "h200"): "screenshot-report-ready.png",
            (SMALL, "b300"): "screenshot-report-not-ready.png"}
    fetched: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("request", lambda r: fetched.append(r.url))
            for (model, nt), (summary, plots) in reports.items():
                name = f"{model}-{nt}"
                page.goto((outputs.reports / model / nt / "readiness.html").as_uri())
                assert page.inner_text("#verdict") == summary
                assert _check_plots(page, name) == plots
                assert page.evaluate(CUT_OFF) == [], name
                page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
                top = ARTIFACTS / f"{name}-top.png"  # what a reader sees first
                page.screenshot(path=str(top))
                if (model, nt) in docs:
                    keep_for_docs(top, docs[(model, nt)])
            page.goto((outputs.reports / "fleet.html").as_uri())
            page.screenshot(path=str(ARTIFACTS / "fleet.png"), full_page=True)
            keep_for_docs(ARTIFACTS / "fleet.png", "screenshot-fleet.png")
            assert "1 of 2 catalogued models ready" in page.inner_text("main")
            # the grid opens the page, each cell in a word; both entries are plan-only in the
            # catalog, so the cell never judged (the ready model's cpu) reads "plan only"
            assert page.evaluate(GRID) == [
                ["model", *TARGETS, "cpu"],
                [BIG, *("ready" if nt == "h200" else "not ready" for nt in TARGETS),
                 "plan only"],
                [SMALL, "not ready", "not ready", "not ready"]]
            page.click(f"a[href='{BIG}/h200/readiness.html']")
            page.wait_for_load_state()
            assert page.url.endswith(f"/{BIG}/h200/readiness.html")
            assert page.inner_text("#verdict") == reports[(BIG, "h200")][0] == "ready on h200"
        finally:
            browser.close()
    # the measured cells show the start times and the sweep beside the accuracy
    assert reports[(BIG, "h200")][1] == reports[(SMALL, "cpu")][1] == 3
    assert reports[(SMALL, "b300")][0].startswith("not ready: b300: weights not published")
    assert fetched and all(u.startswith(("file://", "data:")) for u in fetched), fetched
    for name in (f"{BIG}-h200", f"{SMALL}-b300", f"{SMALL}-cpu", "fleet"):
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 20_000, name
