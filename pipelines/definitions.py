"""The code location: every stage module's `defs`, merged, plus resources, jobs and automation.

Stage modules under `assets/` each expose `defs`; adding a stage never edits this file. This is
the top floor: it imports assets/ and resources/, and nothing below imports it.
"""

from __future__ import annotations

import importlib
import pkgutil

import dagster as dg

import assets as _assets_pkg
from pipelines.cells import cells_after_model, fleet_partitions_sensor
from pipelines.jobs import jobs
from pipelines.launch import onboard_registered_model, register_model
from pipelines.resources import build_resources
from pipelines.schedules import (
    cell_revalidation_schedule,
    revalidate_cell_job,
    revalidate_job,
    revalidation_schedule,
    revalidation_sensors,
)
from pipelines.sensors import sensors


def _stage_definitions() -> list[dg.Definitions]:
    found = []
    for info in sorted(pkgutil.iter_modules(_assets_pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{_assets_pkg.__name__}.{info.name}")
        if isinstance(getattr(module, "defs", None), dg.Definitions):
            found.append(module.defs)
    return found


defs = dg.Definitions.merge(
    *_stage_definitions(),
    dg.Definitions(
        resources=build_resources(),
        jobs=[*jobs, revalidate_job, revalidate_cell_job, register_model],
        schedules=[revalidation_schedule, cell_revalidation_schedule],
        sensors=[*sensors, onboard_registered_model, *revalidation_sensors, cells_after_model,
                 fleet_partitions_sensor],
    ),
)
