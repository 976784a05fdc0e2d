"""Launching from the UI: register_model validates and stores a spec, registers the partition,
and its success requests onboarding with the chosen sweep, which the real job accepts."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.partitions import LOCAL_NODE_TYPE, cell_key
from onboarding.runs.cluster import EXECUTOR_ENV, NODE_TYPE_ENV
from pipelines.cells import cells_after_model
from pipelines.launch import job_stages, onboard_registered_model
from tests.conftest import write_spec
from tests.dagster_support import after_success
from tests.pipelines.automation_graph import build_defs


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


@pytest.fixture
def defs(configs):
    return build_defs(configs=configs)


def _register(defs, instance, **fields):
    job = defs.resolve_job_def("register_model")
    return job.execute_in_process(
        instance=instance, raise_on_error=False,
        run_config={"ops": {"register_model_spec": {"config": fields}}})


def _error(result) -> str:
    err = result.failure_data_for_node("register_model_spec").error
    return err.message + (err.cause.message if err.cause else "")


def _cells_after(defs, instance, result) -> list[dg.RunRequest]:
    """cells_after_model on a successful onboard_model run, as the daemon runs it."""
    return after_success(cells_after_model, instance, defs, result.run_id)


def _follow_up(defs, instance, result) -> dg.RunRequest:
    return after_success(onboard_registered_model, instance, defs, result.run_id)


@pytest.mark.slow
def test_register_then_onboard_with_the_quick_sweep(defs, instance, configs, monkeypatch):
    """The sweep chosen at launch reaches the stages that take it: onboard_model has none (the
    measurements are per cell), so it carries the sweep as a tag, and the model's cell on
    the local node type is requested with the sweep's run config, which the real job accepts."""
    monkeypatch.delenv(EXECUTOR_ENV, raising=False)
    monkeypatch.delenv(NODE_TYPE_ENV, raising=False)
    result = _register(defs, instance, id="my-model", source="s3://models/my-model/",
                       precision_ladder=["fp8", "bf16"], sweep="quick")
    assert result.success
    assert instance.has_dynamic_partition("models", "my-model")
    spec = configs.spec("my-model")  # what every stage resolves
    assert spec.precision_ladder == ["fp8", "bf16"] and spec.served_name == "my-model"
    assert spec.scenarios == ["chat"]  # the catalog default

    launch = configs.automation().launch
    request = _follow_up(defs, instance, result)
    assert request.partition_key == "my-model"
    assert request.run_config == launch.run_config(
        "quick", job_stages(defs.get_repository_def(), "onboard_model"))
    assert request.tags["onboarding/sweep"] == "quick"
    onboard = defs.resolve_job_def("onboard_model").execute_in_process(
        instance=instance, partition_key="my-model", run_config=request.run_config,
        tags=request.tags)
    assert onboard.success

    [cell] = [r for r in _cells_after(defs, instance, onboard) if r.job_name == "onboard_cell"]
    assert cell.partition_key == f"my-model|{LOCAL_NODE_TYPE}"
    assert cell.run_config == launch.run_config(
        "quick", job_stages(defs.get_repository_def(), "onboard_cell")) != {}
    measured = defs.resolve_job_def("onboard_cell").execute_in_process(
        instance=instance, partition_key=cell_key("my-model", LOCAL_NODE_TYPE),
        run_config=cell.run_config, tags=cell.tags)
    assert measured.success
    timing = measured.asset_materializations_for_node("load_timing")[0]
    assert timing.metadata["cold_repeats"].value == 1


def test_defaults_give_a_launchable_run(defs, instance, configs):
    result = _register(defs, instance, id="plain", source="hf://org/plain@main")
    assert result.success
    request = _follow_up(defs, instance, result)
    assert request.tags["onboarding/sweep"] == configs.automation().launch.default_sweep


@pytest.mark.parametrize(("fields", "needles"), [
    ({"id": "Bad_Id", "source": "s3://models/x/"}, ["field 'id'", "DNS-1123"]),
    ({"id": "ok", "source": "ftp://x"}, ["field 'source'", "s3://"]),
    ({"id": "ok", "source": "s3://models/x/", "precision_ladder": ["int4"]},
     ["field 'precision_ladder.0'"]),
    ({"id": "ok", "source": "s3://models/x/", "sweep": "medium"}, ["sweep 'medium'", "quick"]),
])
def test_invalid_launch_config_names_the_field(defs, instance, fields, needles):
    result = _register(defs, instance, **fields)
    assert not result.success
    for needle in needles:
        assert needle in _error(result)
    assert not instance.has_dynamic_partition("models", "ok")


def test_a_catalogued_or_registered_id_is_refused(defs, instance, config_dir):
    write_spec(config_dir, "taken", "s3://models/taken/")
    result = _register(defs, instance, id="taken", source="s3://models/taken/")
    assert not result.success and "is a catalog entry" in _error(result)
    assert _register(defs, instance, id="mine", source="s3://models/mine/").success
    again = _register(defs, instance, id="mine", source="s3://models/other/")
    assert not again.success and "already registered with source" in _error(again)


def test_the_shipped_quick_sweep_judges_the_cpu_slo_on_two_rounds_per_stream():
    """The demo's quick sweep shrinks the points it does not judge, never the one it
    does: on the cpu profile the SLO's target concurrency is swept with two rounds per stream
    (the profile's min_rounds_per_point), and no point has fewer than that."""
    from resources.config_files import ConfigFiles

    shipped = ConfigFiles()
    profile = shipped.profiles()["cpu"]
    target = shipped.slo_section().node_types["cpu"].target_concurrency
    quick = shipped.automation().launch.sweeps["quick"]["serving_benchmark"]
    sweep = profile.sweep.model_copy(update=quick)
    assert target in sweep.concurrency
    assert sweep.requests_at(target) == profile.sweep.min_rounds_per_point * target
    assert all(sweep.requests_at(c) >= profile.sweep.min_rounds_per_point * c
               for c in sweep.concurrency)
    # the full sweep is the profile as it stands
    assert not shipped.automation().launch.sweeps["full"]
