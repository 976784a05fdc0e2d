"""The readiness report in headless Chromium, as a person opens it: the pages written by the
real report assets (upstream stand-ins, the real `readiness` asset, a real Dagster instance)
loaded over file://, every plot decoded and laid out, the verdicts word for word what
`readiness` computed, the fleet page's links leading to the model pages, nothing fetched from
anywhere, and screenshots under test-artifacts/report/."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from onboarding.common.paths import PROJECT_ROOT
from tests.e2e.docs_screenshots import keep_for_docs
from tests.e2e.test_ui import CHROMIUM, CHROMIUM_ARGS
from tests.report_facts import BIG, materialize_reports, ready_model, stand_in_model, store_model

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


@pytest.fixture
def reports(configs, outputs) -> dict[str, str]:
    """model -> the summary of the `readiness` value its page was made from."""
    verdicts = {}
    with dg.instance_for_test() as instance:
        store_model(instance, ready_model(BIG), configs, outputs)
        store_model(instance, stand_in_model(SMALL), configs, outputs)
        for model in (SMALL, BIG):
            result = materialize_reports(instance, model, configs, outputs)
            assert result.success
            verdicts[model] = result.output_for_node("readiness").summary()
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
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    fetched: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("request", lambda r: fetched.append(r.url))
            for model, summary in reports.items():
                page.goto((outputs.reports / model / "readiness.html").as_uri())
                assert page.inner_text("#verdict") == summary
                assert _check_plots(page, model) == 3
                assert page.evaluate(CUT_OFF) == [], model
                page.screenshot(path=str(ARTIFACTS / f"{model}.png"), full_page=True)
                top = ARTIFACTS / f"{model}-top.png"  # what a reader sees first
                page.screenshot(path=str(top))
                keep_for_docs(top, "screenshot-report-ready.png" if model == BIG
                              else "screenshot-report-not-ready.png")
            page.goto((outputs.reports / "fleet.html").as_uri())
            page.screenshot(path=str(ARTIFACTS / "fleet.png"), full_page=True)
            keep_for_docs(ARTIFACTS / "fleet.png", "screenshot-fleet.png")
            assert "1 of 2 catalogued models ready" in page.inner_text("main")
            page.click(f"a[href='{BIG}/readiness.html']")
            page.wait_for_load_state()
            assert page.url.endswith(f"/{BIG}/readiness.html")
            assert page.inner_text("#verdict") == reports[BIG] == "ready on h200"
        finally:
            browser.close()
    assert reports[SMALL].startswith("not ready: b300: weights not published")
    assert fetched and all(u.startswith(("file://", "data:")) for u in fetched), fetched
    for name in (BIG, SMALL, "fleet"):
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 20_000, name
