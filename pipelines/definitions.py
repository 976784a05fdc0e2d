"""The code location: every stage module's `defs`, merged, plus resources, jobs and automation.

Stage modules under `assets/` each expose `defs`; adding a stage never edits this file.
"""

from __future__ import annotations

import importlib
import pkgutil

import dagster as dg

import assets as _assets_pkg
from pipelines.automation import with_automation
from pipelines.jobs import jobs
from pipelines.resources import build_resources


def _stage_definitions() -> list[dg.Definitions]:
    found = []
    for info in sorted(pkgutil.iter_modules(_assets_pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{_assets_pkg.__name__}.{info.name}")
        if isinstance(getattr(module, "defs", None), dg.Definitions):
            found.append(module.defs)
    return found


defs = with_automation(dg.Definitions.merge(
    *_stage_definitions(),
    dg.Definitions(resources=build_resources(), jobs=jobs),
))
