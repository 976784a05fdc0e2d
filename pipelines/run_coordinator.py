"""The instance's run coordinator: Dagster's run queue, refusing at submission a run that the
catalog says cannot succeed, before any run worker starts.

A plan-only catalog entry has no weights: its partition exists for `plan_model` and
`predict_model`, but a run that would fetch it (`onboard_model`, or an asset selection with
`checkpoint`, e.g. *Materialize* on its partition) fails at once with what to launch instead,
instead of starting a worker whose first step fails. configs/dagster.yaml names this class; an
instance without it (Dagster's default queue) still fails such a run in its `checkpoint` step.
"""

from __future__ import annotations

import dagster as dg

from onboarding.common.errors import ConfigError
from onboarding.fetch.catalog import Catalog

ONBOARD_JOB = "onboard_model"  # pipelines/jobs.py; not imported, so the webserver loads no assets
FETCHING_ASSET = dg.AssetKey("checkpoint")
PARTITION_TAG = "dagster/partition"


def refusal(run: dg.DagsterRun, catalog: Catalog) -> str | None:
    """Why `run` must not start, or None. Only a catalog that resolves the run's partition
    decides; anything else is left to the run, which reports it in its own steps."""
    model = run.tags.get(PARTITION_TAG)
    spec = catalog.specs.get(model) if model else None
    if spec is None or not spec.plan_only:
        return None
    fetches = (FETCHING_ASSET in run.asset_selection if run.asset_selection is not None
               else run.job_name == ONBOARD_JOB)
    if not fetches:
        return None
    return (f"model {model!r} is a plan-only catalog entry: it has no weights to fetch, so "
            "nothing of onboard_model can run for it. Launch plan_model (serving_config, "
            "kserve_manifest, gateway_routes) or predict_model for it instead, or give it a "
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
