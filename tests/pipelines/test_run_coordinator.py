"""A plan-only model's onboarding is refused when it is submitted, before a run worker starts
(pipelines/run_coordinator.py); other runs are queued as Dagster's queue queues them."""

from __future__ import annotations

import shutil

import dagster as dg
import pytest
import yaml

from onboarding.common.paths import PROJECT_ROOT
from pipelines.definitions import defs
from pipelines.jobs import onboard_model, plan_model
from pipelines.run_coordinator import OnboardingRunCoordinator, refusal
from resources.config_files import ConfigFiles

PLAN_ONLY, REAL = "qwen3-32b", "smollm2-135m"


@pytest.fixture(scope="module")
def catalog():
    catalog = ConfigFiles().catalog()
    assert catalog.specs[PLAN_ONLY].plan_only and not catalog.specs[REAL].plan_only
    return catalog


def _run(job: str, model: str, assets: list[str] | None = None) -> dg.DagsterRun:
    return dg.DagsterRun(job_name=job, run_id=f"{job}-{model}-{len(assets or [])}",
                         tags={"dagster/partition": model},
                         asset_selection={dg.AssetKey(a) for a in assets} if assets else None)


def test_the_job_name_it_knows_is_the_job_that_fetches():
    job = defs.resolve_job_def(onboard_model.name)
    assert dg.AssetKey("checkpoint") in job.asset_layer.executable_asset_keys
    assert onboard_model.name == "onboard_model"


def test_a_plan_only_models_fetch_is_refused_and_its_plan_is_not(catalog):
    why = refusal(_run(onboard_model.name, PLAN_ONLY), catalog)
    assert "plan-only" in why and "Launch plan_model" in why
    assert refusal(_run("__ASSET_JOB", PLAN_ONLY, ["checkpoint", "quantized"]), catalog)
    assert refusal(_run(plan_model.name, PLAN_ONLY), catalog) is None
    assert refusal(_run("__ASSET_JOB", PLAN_ONLY, ["serving_config"]), catalog) is None
    assert refusal(_run(onboard_model.name, REAL), catalog) is None
    assert refusal(_run(onboard_model.name, "not-in-the-catalog"), catalog) is None


def test_the_project_instance_refuses_before_the_run_starts(tmp_path, monkeypatch):
    """configs/dagster.yaml, as scripts/dev.sh installs it: the refused run is FAILURE with the
    reason in its event log and never started. (A real model's run goes through the queue in
    tests/e2e/test_ui.py, launched over the UI's API on the same instance settings.)"""
    shutil.copy(PROJECT_ROOT / "configs" / "dagster.yaml", tmp_path / "dagster.yaml")
    overrides = yaml.safe_load((tmp_path / "dagster.yaml").read_text())
    with dg.instance_for_test(overrides=overrides) as instance:
        coordinator = instance.run_coordinator
        assert isinstance(coordinator, OnboardingRunCoordinator)
        refused = instance.add_run(_run(onboard_model.name, PLAN_ONLY))
        run = coordinator.submit_run(dg.SubmitRunContext(refused, workspace=None))
        assert run.status == dg.DagsterRunStatus.FAILURE
        messages = [e.message for e in instance.all_logs(refused.run_id)]
        assert any("Refused before it started" in m and "plan-only" in m for m in messages)
        assert not any(e.dagster_event and e.dagster_event.event_type_value == "PIPELINE_START"
                       for e in instance.all_logs(refused.run_id))
