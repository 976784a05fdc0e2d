"""The screenshots docs/onboard-your-model.md, docs/report.md and docs/operations.md show are
the ones these end-to-end tests take: with ONBOARDING_DOCS_SCREENSHOTS=1 each test also copies
its pictures into docs/ (CI runs the same tests and keeps them under test-artifacts/ only, so
the suite never edits the checkout).

    ONBOARDING_DOCS_SCREENSHOTS=1 .venv/bin/python -m pytest -n 0 \\
        tests/e2e/test_report_browser.py tests/e2e/test_ui.py \\
        tests/e2e/test_serving_vllm.py::test_a_real_prometheus_evaluates_the_rendered_rules_on_the_real_engine
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from onboarding.common.paths import PROJECT_ROOT

DOCS = PROJECT_ROOT / "docs"
# docs/ name -> what it shows (docs/onboard-your-model.md links each)
SHOTS = {
    "screenshot-report-ready.png": "a ready model's report: the verdict and what was fetched",
    "screenshot-report-not-ready.png": "a model that is not ready: the sentence, the next step",
    "screenshot-fleet.png": "the fleet page",
    "screenshot-ui-asset-graph.png": "the UI: a model's asset graph",
    "screenshot-ui-checkpoint.png": "the UI: a checkpoint partition with its checks",
    # docs/report.md too
    "screenshot-ui-readiness-grid.png": "the UI: readiness's partitions, models x node types "
                                        "as a grid (cells materialized, failed, never run)",
    # docs/operations.md
    "screenshot-prometheus-alert.png": "Prometheus's Alerts page: the queue alert firing on the "
                                       "CPU engine, its threshold's source in the annotations",
}


def keep_for_docs(picture: Path, name: str) -> None:
    assert name in SHOTS, name
    if os.environ.get("ONBOARDING_DOCS_SCREENSHOTS") == "1":
        shutil.copyfile(picture, DOCS / name)
