"""Stack fingerprint, staleness and the re-validation schedule in a real Dagster instance.

The graph has trivial bodies (tests/pipelines/automation_graph.py); the serving_stack asset, its
sensor, the dependency wiring, the schedule and the jobs are the real ones.
"""

from __future__ import annotations

import dagster as dg
import pytest
import yaml
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContextForTest

from assets.model_spec import MODEL_SPEC
from assets.stack import current_stack, observe_stack
from onboarding.deploy.readiness import Readiness
from onboarding.serving.stack import diff, fingerprint, flatten
from pipelines.schedules import (
    STACK_INPUT_TAG,
    readiness_verdict,
    revalidation_schedule,
    spec_dependent,
    stack_dependent,
    stale_onboarded_models,
)
from pipelines.sensors import catalog_partitions_sensor, serving_stack_sensor
from tests.conftest import write_spec
from tests.pipelines.automation_graph import BROKEN_VLLM, GATE, build_defs, store_readiness

STACK = dg.AssetKey("serving_stack")


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        inst.add_dynamic_partitions("models", list(MODELS))
        yield inst


MODELS = ("ready-a", "ready-b", "half-done")


@pytest.fixture
def defs(configs):
    for model in MODELS:  # every partition has its catalog entry, as the catalog sensor makes
        write_spec(configs, model, f"s3://models/{model}/", eval_tasks=["arith"])
    return build_defs(configs=configs)


@pytest.fixture
def STACK_DEPENDENT(defs):
    return stack_dependent(defs.resolve_asset_graph())


def _observe(instance, defs):
    """A serving_stack_sensor tick, its observation recorded as the daemon records it."""
    with dg.build_sensor_context(instance=instance, instance_ref=instance.get_ref(),
                                 definitions=defs,
                                 resources={"configs": defs.resources["configs"]}) as ctx:
        data = serving_stack_sensor.evaluate_tick(ctx)
    for event in data.asset_events or []:
        instance.report_runless_asset_event(event)
    return data


def _schedule_tick(instance, defs):
    # as a context manager: the context enters the instance (which sets dagster's current
    # defs-state storage) and, left open, resets that storage to this test's whenever the
    # garbage collector closes it, in whichever test is running then
    with dg.build_schedule_context(instance=instance,
                                   repository_def=defs.get_repository_def(),
                                   resources={"configs": defs.resources["configs"],
                                              "io_manager": defs.resources["io_manager"]}) as ctx:
        return revalidation_schedule.evaluate_tick(ctx)


def _status(instance, defs, asset: str, partition: str) -> StaleStatus:
    resolver = CachingStaleStatusResolver(instance, defs.resolve_asset_graph(),
                                          LoadingContextForTest(instance))
    return resolver.get_status(dg.AssetKey(asset), partition)


def _verdict(instance, defs, model: str) -> str:
    with dg.build_resources({"io_manager": defs.resources["io_manager"]},
                            instance=instance) as built:
        return readiness_verdict(built.io_manager, instance, model)


def _onboard(instance, defs, model: str, selection: list[str] | None = None):
    job = defs.resolve_job_def("onboard_model")
    result = job.execute_in_process(
        instance=instance, partition_key=model,
        asset_selection=[dg.AssetKey(a) for a in selection] if selection else None)
    assert result.success


def _bump_vllm(config_dir, version: str) -> None:
    path = config_dir / "stack.yaml"
    data = yaml.safe_load(path.read_text())
    data["versions"]["vllm"] = version
    path.write_text(yaml.safe_dump(data))


def test_fingerprint_ignores_comments_and_order_but_not_versions():
    a = {"versions": {"cuda": "13.0", "vllm": "0.32.0"}}
    b = {"versions": {"vllm": "0.32.0", "cuda": "13.0"}}
    c = {"versions": {"cuda": "13.0", "vllm": "0.33.0"}}
    assert fingerprint(a, {}) == fingerprint(b, {}) != fingerprint(c, {})
    assert fingerprint(a, {"nvidia_driver": "580"}) != fingerprint(a, {"nvidia_driver": "590"})
    assert diff({"config": a}, {"config": c}) == [
        {"field": "config.versions.vllm", "before": "0.32.0", "after": "0.33.0"}]
    assert flatten({"x": {"y": [1, 2]}}) == {"x.y": [1, 2]}


def test_stack_dependent_assets_depend_on_serving_stack(defs, STACK_DEPENDENT):
    assert STACK_DEPENDENT == ["accuracy", "kserve_manifest", "load_timing", "quantized",
                               "serving_benchmark", "serving_config"]
    graph = defs.resolve_asset_graph()
    for name in STACK_DEPENDENT:
        assert STACK in graph.get(dg.AssetKey(name)).parent_keys, name
    assert STACK not in graph.get(dg.AssetKey("checkpoint")).parent_keys
    # argument inputs live beside the dependency declared in the decorator
    assert "serving_config" in defs.resolve_assets_def("kserve_manifest").op.ins


@pytest.mark.slow
def test_stack_edit_marks_dependents_stale_and_revalidates_exactly_the_ready_models(
        instance, defs, config_dir, STACK_DEPENDENT):
    first = _observe(instance, defs)
    assert len(first.asset_events) == 1
    for model in ("ready-a", "ready-b"):
        _onboard(instance, defs, model)
    _onboard(instance, defs, "half-done", ["checkpoint", "quantized"])
    fp_before = first.asset_events[0].tags["dagster/data_version"]
    mat = instance.get_latest_materialization_event(dg.AssetKey("kserve_manifest"))
    assert mat.asset_materialization.tags[STACK_INPUT_TAG] == fp_before

    unchanged = _schedule_tick(instance, defs)
    assert unchanged.run_requests == [] and "current" in unchanged.skip_message
    assert _observe(instance, defs).skip_message.startswith("serving stack unchanged")
    assert _status(instance, defs, "kserve_manifest", "ready-a") == StaleStatus.FRESH

    _bump_vllm(config_dir, "0.33.0")
    changed = _observe(instance, defs)
    [obs] = changed.asset_events
    fp_after = obs.tags["dagster/data_version"]
    assert fp_after != fp_before
    assert obs.metadata["changed"].value is True
    assert "config.versions.vllm | 0.32.0 | 0.33.0" in obs.metadata["diff"].value
    for model in ("ready-a", "ready-b"):
        for asset in STACK_DEPENDENT:
            assert _status(instance, defs, asset, model) == StaleStatus.STALE, (asset, model)
    assert _status(instance, defs, "checkpoint", "ready-a") == StaleStatus.FRESH
    assert _status(instance, defs, "quantized", "half-done") == StaleStatus.STALE

    tick = _schedule_tick(instance, defs)
    assert sorted(r.partition_key for r in tick.run_requests) == ["ready-a", "ready-b"]
    for request in tick.run_requests:
        assert request.run_key == f"revalidate-{request.partition_key}@{fp_after[:16]}"
        assert request.tags["onboarding/stack_fingerprint"] == fp_after
        assert request.tags["onboarding/stale_assets"].split(",") == sorted(STACK_DEPENDENT)
        # the verdict before, in the readiness asset's words, as the checkpoint sensor tags it
        assert request.tags["onboarding/ready_before"] == _verdict(
            instance, defs, request.partition_key) != ""

    revalidation = defs.resolve_job_def("revalidate_model")
    assert "checkpoint" not in {k.to_user_string()
                                for k in revalidation.asset_layer.executable_asset_keys}
    assert revalidation.execute_in_process(instance=instance, partition_key="ready-a").success
    assert _status(instance, defs, "kserve_manifest", "ready-a") == StaleStatus.FRESH
    after_one = _schedule_tick(instance, defs)
    assert [r.partition_key for r in after_one.run_requests] == ["ready-b"]
    assert after_one.run_requests[0].run_key == tick.run_requests[1].run_key


@pytest.mark.slow
def test_an_onboarded_model_is_revalidated_whatever_its_readiness_verdict(
        instance, defs, config_dir):
    """The schedule takes every model with each `revalidation.ready_assets`
    materialized, whatever its `readiness` verdict (a stack change can turn "not ready"
    either way); what the UI shows of the schedule says the same, not "ready models"."""
    _observe(instance, defs)
    for model in ("ready-a", "ready-b"):
        _onboard(instance, defs, model)
    # the verdict lives in the stored Readiness only (no metadata): before, the schedule read
    # the `verdict` metadata and tagged this run "not judged yet"
    verdict = Readiness("ready-b", False, reasons=("ttft_p95_s 4.1 > 2.0 (chat, concurrency 8)",))
    store_readiness(instance, verdict)
    not_ready = "not ready: ttft_p95_s 4.1 > 2.0 (chat, concurrency 8)"
    assert verdict.summary() == not_ready
    _bump_vllm(config_dir, "0.33.0")
    _observe(instance, defs)
    requests = {r.partition_key: r for r in _schedule_tick(instance, defs).run_requests}
    assert sorted(requests) == ["ready-a", "ready-b"]
    assert requests["ready-b"].tags["onboarding/ready_before"] == not_ready
    said = revalidation_schedule.description
    assert "onboarded models" in said and "whatever their readiness verdict" in said


@pytest.mark.slow
def test_a_revalidation_that_flips_the_gate_is_visible_in_metadata(instance, defs, config_dir):
    _observe(instance, defs)
    _onboard(instance, defs, "ready-a")
    _bump_vllm(config_dir, BROKEN_VLLM)
    _observe(instance, defs)
    [request] = [r for r in _schedule_tick(instance, defs).run_requests
                 if r.partition_key == "ready-a"]
    result = defs.resolve_job_def("revalidate_model").execute_in_process(
        instance=instance, partition_key="ready-a", tags=request.tags, raise_on_error=False)
    assert not result.success  # the blocking gate stops the re-validation

    run = instance.get_run_by_id(result.run_id)
    [failure] = instance.get_records_for_run(
        result.run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
    on_failure = defs.resolve_sensor_def("revalidation_verdicts_on_failure")
    ctx = dg.build_run_status_sensor_context(
        sensor_name=on_failure.name, dagster_instance=instance,
        dagster_run=run, dagster_event=failure.event_log_entry.dagster_event,
        repository_def=defs.get_repository_def(),
        resources={"io_manager": defs.resources["io_manager"]})
    on_failure(ctx)

    [obs] = instance.fetch_observations(dg.AssetKey("accuracy"), limit=1).records
    md = obs.asset_observation.metadata
    assert obs.asset_observation.partition == "ready-a"
    assert md["verdict_changed"].value is True
    assert md["verdict_change"].value == f"{GATE}: passed -> failed"
    assert md["stack_fingerprint"].value == request.tags["onboarding/stack_fingerprint"]


ALL_STAGES = ["checkpoint", "quantized", "accuracy", "serving_variant", "load_timing",
              "serving_benchmark", "serving_config", "kserve_manifest"]


@pytest.mark.slow
def test_every_onboarding_run_observes_the_stack_first(instance, defs, configs):
    """onboard_model selects serving_stack: its results record a fingerprint as their stack
    input version even when nothing observed the stack before."""
    assert not instance.fetch_observations(STACK, limit=1).records
    _onboard(instance, defs, "ready-a")
    [mat] = instance.fetch_materializations(dg.AssetKey("kserve_manifest"), limit=1).records
    assert mat.asset_materialization.tags[STACK_INPUT_TAG] == current_stack(configs)[0]


@pytest.mark.slow
def test_a_model_onboarded_before_any_stack_observation_is_current_until_the_stack_changes(
        instance, defs, config_dir, configs, STACK_DEPENDENT):
    """An ad-hoc materialization of the stages (as from the UI, without the job's observation)
    before any serving_stack observation: Dagster records its marker instead of a fingerprint;
    the assets' own record of the stack they ran on decides."""
    assert not instance.fetch_observations(STACK, limit=1).records
    _onboard(instance, defs, "ready-a", ALL_STAGES)
    [mat] = instance.fetch_materializations(dg.AssetKey("kserve_manifest"), limit=1).records
    assert mat.asset_materialization.tags.get(STACK_INPUT_TAG, "INITIAL") == "INITIAL"
    first = _observe(instance, defs)  # the first observation comes after the run
    fp = first.asset_events[0].tags["dagster/data_version"]
    tick = _schedule_tick(instance, defs)
    assert tick.run_requests == [] and "current" in tick.skip_message
    assert stale_onboarded_models(instance, fp, ["kserve_manifest"], STACK_DEPENDENT) == {}

    _bump_vllm(config_dir, "0.33.0")
    changed = _observe(instance, defs).asset_events[0].tags["dagster/data_version"]
    [request] = _schedule_tick(instance, defs).run_requests
    assert request.partition_key == "ready-a"
    assert request.run_key == f"revalidate-ready-a@{changed[:16]}"
    assert stale_onboarded_models(instance, changed, ["kserve_manifest"], STACK_DEPENDENT)[
        "ready-a"] == {a: fp for a in STACK_DEPENDENT}


@pytest.mark.slow
def test_a_model_whose_stack_is_unknown_is_revalidated(instance, defs, STACK_DEPENDENT):
    """Neither an observation nor the asset's own record: nothing says what it was measured
    on, so it is re-validated rather than assumed current."""
    _onboard(instance, defs, "ready-a", ALL_STAGES)
    fp = _observe(instance, defs).asset_events[0].tags["dagster/data_version"]
    assert stale_onboarded_models(instance, fp, ["kserve_manifest"], STACK_DEPENDENT) == {}
    legacy = dg.AssetMaterialization("kserve_manifest", partition="ready-a",
                                     metadata={"note": "from before fingerprints were recorded"})
    instance.report_runless_asset_event(legacy)
    assert stale_onboarded_models(instance, fp, ["kserve_manifest"], STACK_DEPENDENT) == {
        "ready-a": {"kserve_manifest": "unknown"}}


def test_observe_before_onboarding_records_the_stack_once(instance, configs):
    """What the demo does before it runs onboard_model: an observation when there is none or
    the stack changed, nothing when it is unchanged."""
    fp, recorded = observe_stack(instance, configs)
    assert recorded
    [obs] = instance.fetch_observations(STACK, limit=5).records
    assert obs.asset_observation.tags["dagster/data_version"] == fp == current_stack(configs)[0]
    assert observe_stack(instance, configs) == (fp, False)
    assert len(instance.fetch_observations(STACK, limit=5).records) == 1


def _catalog_tick(instance, defs):
    """A catalog_partitions_sensor tick, its observations and partitions applied in the
    daemon's order (asset events first: dagster/_daemon/sensor.py)."""
    with dg.build_sensor_context(instance=instance, definitions=defs,
                                 resources={"configs": defs.resources["configs"]}) as ctx:
        data = catalog_partitions_sensor.evaluate_tick(ctx)
    for event in data.asset_events or []:
        instance.report_runless_asset_event(event)
    for req in data.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, req.partition_keys)
    return data


SPEC_DEPENDENT = ["accuracy", "kserve_manifest", "load_timing", "quantized",
                  "serving_benchmark", "serving_config", "serving_variant"]


def test_the_real_stages_that_read_the_spec_depend_on_model_spec():
    """The code location's own graph: every stage that reads a model's catalog entry names
    model_spec in its decorator; checkpoint (its data version is what it fetched) and
    published_variant (its content hash) do not."""
    from pipelines.definitions import defs as real

    graph = real.resolve_asset_graph()
    assert spec_dependent(graph) == [
        "accuracy", "kserve_manifest", "load_timing", "operations", "predictions", "quantized",
        "readiness",
        "readiness_report", "served_accuracy", "serving_benchmark", "serving_config",
        "serving_variant"]
    for name in ("checkpoint", "published_variant"):
        assert MODEL_SPEC not in graph.get(dg.AssetKey(name)).parent_keys, name
    # onboarding and re-validation observe it first, as they observe the stack
    for job in ("onboard_model", "revalidate_model"):
        assert MODEL_SPEC in real.resolve_job_def(job).asset_layer.asset_graph.get_all_asset_keys()


@pytest.mark.slow
def test_editing_one_catalog_entry_marks_that_model_stale_and_revalidates_it_alone(
        instance, defs, configs):
    """The spec is a versioned per-partition input. Editing ready-a's eval tasks,
    SLO overrides and engine args makes the next catalog tick record a new model_spec version
    for ready-a only; Dagster's stale-status resolver then reports ready-a's spec-dependent
    stages STALE and ready-b's FRESH, and the schedule asks re-validation of ready-a alone,
    which makes it fresh again."""
    assert spec_dependent(defs.resolve_asset_graph()) == SPEC_DEPENDENT
    first = _catalog_tick(instance, defs)
    assert sorted(e.partition for e in first.asset_events) == sorted(MODELS)
    _observe(instance, defs)
    for model in ("ready-a", "ready-b"):
        _onboard(instance, defs, model)
    versions = {e.partition: e.tags["dagster/data_version"] for e in first.asset_events}
    for model in ("ready-a", "ready-b"):
        [mat] = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("kserve_manifest"), asset_partitions=[model]), limit=1).records
        assert mat.asset_materialization.metadata["model_spec_version"].value == versions[model]
        assert _status(instance, defs, "kserve_manifest", model) == StaleStatus.FRESH
    assert _catalog_tick(instance, defs).skip_message.endswith("their specs recorded")
    assert _schedule_tick(instance, defs).run_requests == []

    write_spec(configs, "ready-a", "s3://models/ready-a/", eval_tasks=["arith", "mmlu_tiny"],
               slo={"ttft_p95_s": 0.5}, engine_args={"max_model_len": 2048})
    [obs] = _catalog_tick(instance, defs).asset_events
    assert obs.partition == "ready-a"
    assert obs.tags["dagster/data_version"] != versions["ready-a"]
    for asset in SPEC_DEPENDENT:
        assert _status(instance, defs, asset, "ready-a") == StaleStatus.STALE, asset
        assert _status(instance, defs, asset, "ready-b") == StaleStatus.FRESH, asset
    assert _status(instance, defs, "checkpoint", "ready-a") == StaleStatus.FRESH

    [request] = _schedule_tick(instance, defs).run_requests
    new = obs.tags["dagster/data_version"]
    fp = current_stack(configs)[0]
    assert request.partition_key == "ready-a"
    assert request.run_key == f"revalidate-ready-a@{fp[:16]}+spec-{new[:12]}"
    assert request.tags["onboarding/spec_version"] == new
    assert request.tags["onboarding/stale_assets"].split(",") == SPEC_DEPENDENT
    revalidation = defs.resolve_job_def("revalidate_model")
    assert revalidation.execute_in_process(instance=instance, partition_key="ready-a").success
    assert _status(instance, defs, "kserve_manifest", "ready-a") == StaleStatus.FRESH
    assert _schedule_tick(instance, defs).run_requests == []
