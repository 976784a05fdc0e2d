"""The executor follows configuration, and locally two GPU steps never run at once."""

from __future__ import annotations

import dagster as dg
import pytest

from onboarding.common.errors import ConfigError
from pipelines.executors import onboarding_executor
from tests.pipelines import gpu_slot_graph


@pytest.mark.parametrize(
    ("value", "name"),
    [("in_process", "in_process"), ("multiprocess", "onboarding_multiprocess"),
     ("k8s", "onboarding_k8s")],
)
def test_executor_follows_env(monkeypatch, value, name):
    monkeypatch.setenv("ONBOARDING_EXECUTOR", value)
    assert onboarding_executor().name == name


def test_unknown_executor_loads_and_fails_each_run_naming_the_variable(monkeypatch, tmp_path):
    """The code location still loads; a run on it fails at once with the cause and the fix."""
    monkeypatch.setenv("ONBOARDING_EXECUTOR", "celery")
    executor = onboarding_executor()
    assert executor.name == "onboarding_config_error"
    assert "ONBOARDING_EXECUTOR='celery'" in executor.description
    with pytest.raises(ConfigError, match="ONBOARDING_EXECUTOR='celery'"):
        executor.executor_creation_fn(None)  # what Dagster calls when a run starts


def test_run_config_still_overrides_our_defaults():
    """Defaults fill gaps only: a launch can set any field of the base executor's schema."""
    executor = onboarding_executor("multiprocess")
    assert "tag_concurrency_limits" in executor.config_schema.config_type.fields


def _run(job_fn, tmp_path, rendezvous_s: float):
    markers = tmp_path / "markers"
    markers.mkdir(parents=True)
    config = {"marker_dir": str(markers), "rendezvous_s": rendezvous_s}
    run_config = {"ops": {n: {"config": config} for n in ("quantized", "accuracy")}}
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        result = dg.execute_job(
            dg.reconstructable(job_fn), instance=instance, run_config=run_config
        )
        assert result.success
    return sorted(p.name for p in markers.iterdir())


@pytest.mark.slow
def test_local_gpu_steps_never_overlap(tmp_path):
    # Each GPU step waits up to 8 s for the other: with the limit, neither ever sees it.
    assert _run(gpu_slot_graph.limited_job, tmp_path / "limited", 8.0) == []


@pytest.mark.slow
def test_control_without_limit_the_steps_overlap(tmp_path):
    seen = _run(gpu_slot_graph.unlimited_job, tmp_path / "unlimited", 60.0)
    assert "quantized.saw-accuracy" in seen or "accuracy.saw-quantized" in seen
