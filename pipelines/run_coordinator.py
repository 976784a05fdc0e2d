"""The instance's run coordinator: Dagster's run queue, refusing at submission a run that the
catalog says cannot succeed, before any run worker starts.

A plan-only catalog entry has no weights: its partitions exist for `plan_model`, `plan_cell`
and `predict_model`, but a run that would fetch or serve it (`onboard_model`, `onboard_cell`,
or an asset selection with `checkpoint` or an engine step, e.g. *Materialize* on its partition) fails at once with what to launch instead,
instead of starting a worker whose first step fails. configs/dagster.yaml names this class; an
instance without it (Dagster's default queue) still fails such a run in its `checkpoint` step.
"""

from __future__ import annotations

import dagster as dg

from onboarding.common.errors import ConfigError
from onboarding.fetch.catalog import Catalog

# pipelines/jobs.py and schedules.py; not imported, so the webserver loads no assets
ONBOARD_JOBS = ("onboard_model", "onboard_cell", "revalidate_cell")
# what needs the weights: the fetch, and every step that starts the engine on them
FETCHING_ASSETS = (dg.AssetKey("checkpoint"), dg.AssetKey("served_accuracy"),
                   dg.AssetKey("load_timing"), dg.AssetKey("serving_benchmark"))
PARTITION_TAG = "dagster/partition"


def refusal(run: dg.DagsterRun, catalog: Catalog) -> str | None:
    """Why `run` must not start, or None. Only a catalog that resolves the run's partition
    decides; anything else is left to the run, which reports it in its own steps."""
    model = (run.tags.get(PARTITION_TAG) or "").partition("|")[0]  # a model, or its cell
    spec = catalog.specs.get(model) if model else None
    if spec is None or not spec.plan_only:
        return None
    fetches = (any(a in run.asset_selection for a in FETCHING_ASSETS)
               if run.asset_selection is not None else run.job_name in ONBOARD_JOBS)
    if not fetches:
        return None
    return (f"model {model!r} is a plan-only catalog entry: it has no weights to fetch, so "
            f"nothing of {run.job_name} can run for it. Launch plan_model (serving_config) "
            "and plan_cell (kserve_manifest, readiness) or predict_model for it instead, or "
            "give it a "
            "source with weights and remove plan_only (docs/onboard-your-model.md).")


class OnboardingRunCoordinator(dg.QueuedRunCoordinator):
    """QueuedRunCoordinator, with `refusal` checked before a run is queued."""

    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        from pipelines.resources import config_files

        run = context.dagster_run
        try:
            catalog = config_files().catalog()
        except ConfigError:  # no catalog directory: the run's own steps report it
            catalog = Catalog({})
        why = refusal(run, catalog)
        if why is None:
            return super().submit_run(context)
        self._instance.report_run_failed(run, message=f"Refused before it started: {why}")
        return self._instance.get_run_by_id(run.run_id)
