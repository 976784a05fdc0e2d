"""Stack fingerprint, staleness and the re-validation schedules in a real Dagster instance.

The graph has trivial bodies (tests/pipelines/automation_graph.py); the serving_stack asset, its
sensor, the dependency wiring, the two schedules (a model's own stages; its (model, node type)
cells), the sensor that runs a model's cells after its own stages, and the jobs are the real
ones. Onboarding a model is what the daemon does: onboard_model, then onboard_cell for each
cell.
"""

from __future__ import annotations

import dagster as dg
import pytest
import yaml
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContextForTest

from assets.model_spec import MODEL_SPEC
from assets.partitions import cell_key
from assets.stack import SERVING_STACK, current_stack, observe_stack
from onboarding.deploy.readiness import NodeReadiness, Readiness
from onboarding.runs.cluster import EXECUTOR_ENV, NODE_TYPE_ENV
from onboarding.serving.stack import diff, fingerprint, flatten
from pipelines.cells import CELL_TRIGGER_TAG, cells_after_model
from pipelines.jobs import CELL_ASSETS
from pipelines.launch import job_stages
from pipelines.schedules import (
    STACK_INPUT_TAG,
    cell_revalidation_schedule,
    cell_verdict,
    readiness_verdict,
    revalidation_schedule,
    spec_dependent,
    stack_dependent,
    stale_partitions,
)
from pipelines.sensors import catalog_partitions_sensor, serving_stack_sensor
from tests.conftest import write_spec
from tests.dagster_support import after_success
from tests.pipelines.automation_graph import (
    BROKEN_VLLM,
    GATE,
    SLO,
    SLOW_VLLM,
    build_defs,
    store_readiness,
)

STACK = dg.AssetKey("serving_stack")
MODELS = ("ready-a", "ready-b", "half-done")
NODE_TYPES = ("cpu", "h200")


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        inst.add_dynamic_partitions("models", list(MODELS))
        inst.add_dynamic_partitions("node_types", list(NODE_TYPES))
        yield inst


@pytest.fixture
def defs(configs):
    for model in MODELS:  # every partition has its catalog entry, as the catalog sensor makes
        write_spec(configs, model, f"s3://models/{model}/", eval_tasks=["arith"])
    return build_defs(configs=configs)


@pytest.fixture
def STACK_DEPENDENT(defs):
    return stack_dependent(defs.resolve_asset_graph())


def _model_level(names: list[str]) -> list[str]:
    return [n for n in names if n not in CELL_ASSETS]


def _cell_level(names: list[str]) -> list[str]:
    return [n for n in names if n in CELL_ASSETS]


def _partition(asset: str, model: str, node_type: str = "cpu") -> str:
    """Where `asset` keeps `model`'s result: the model, or its cell on `node_type`."""
    return str(cell_key(model, node_type)) if asset in CELL_ASSETS else model


def _observe(instance, defs):
    """A serving_stack_sensor tick, its observation recorded as the daemon records it."""
    with dg.build_sensor_context(instance=instance, instance_ref=instance.get_ref(),
                                 definitions=defs,
                                 resources={"configs": defs.resources["configs"]}) as ctx:
        data = serving_stack_sensor.evaluate_tick(ctx)
    for event in data.asset_events or []:
        instance.report_runless_asset_event(event)
    return data


def _schedule_tick(instance, defs, schedule=revalidation_schedule):
    # as a context manager: the context enters the instance (which sets dagster's current
    # defs-state storage) and, left open, resets that storage to this test's whenever the
    # garbage collector closes it, in whichever test is running then
    with dg.build_schedule_context(instance=instance,
                                   repository_def=defs.get_repository_def(),
                                   resources={"configs": defs.resources["configs"],
                                              "io_manager": defs.resources["io_manager"]}) as ctx:
        return schedule.evaluate_tick(ctx)


def _cell_tick(instance, defs):
    return _schedule_tick(instance, defs, cell_revalidation_schedule)


def _status(instance, defs, asset: str, partition: str) -> StaleStatus:
    resolver = CachingStaleStatusResolver(instance, defs.resolve_asset_graph(),
                                          LoadingContextForTest(instance))
    if "|" in partition:
        partition = cell_key(*partition.split("|"))
    return resolver.get_status(dg.AssetKey(asset), partition)


def _verdict(instance, defs, model: str) -> str:
    with dg.build_resources({"io_manager": defs.resources["io_manager"]},
                            instance=instance) as built:
        return readiness_verdict(built.io_manager, instance, model)


def _cell_verdict(instance, defs, cell: str) -> str:
    with dg.build_resources({"io_manager": defs.resources["io_manager"]},
                            instance=instance) as built:
        return cell_verdict(built.io_manager, instance, cell)


def _run(instance, defs, job: str, partition: str, **kwargs) -> dg.ExecuteInProcessResult:
    result = defs.resolve_job_def(job).execute_in_process(
        instance=instance, partition_key=cell_key(*partition.split("|")) if "|" in partition
        else partition, **kwargs)
    assert result.success or kwargs.get("raise_on_error") is False
    return result


def _onboard(instance, defs, model: str, node_types=("cpu",), selection: list[str] | None = None):
    """onboard_model, then onboard_cell on each of `node_types` (what cells_after_model
    requests); `selection`: only those stages (as an ad-hoc materialization from the UI)."""
    def pick(job: str) -> dict:
        if selection is None:
            return {}
        stages = job_stages(defs.get_repository_def(), job)
        return {"asset_selection": [dg.AssetKey(a) for a in selection if a in stages]}
    _run(instance, defs, "onboard_model", model, **pick("onboard_model"))
    for node_type in node_types:
        _run(instance, defs, "onboard_cell", f"{model}|{node_type}", **pick("onboard_cell"))


def _bump_vllm(config_dir, version: str) -> None:
    path = config_dir / "stack.yaml"
    data = yaml.safe_load(path.read_text())
    data["versions"]["vllm"] = version
    path.write_text(yaml.safe_dump(data))


def _materializations(instance, asset: str, partition: str) -> list[int]:
    """Storage ids of every materialization of `asset` for `partition`, newest first."""
    return [r.storage_id for r in instance.fetch_materializations(dg.AssetRecordsFilter(
        asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=100).records]


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
    # the plan is the model's; a cell reads it, it reads no cell
    for name in CELL_ASSETS:
        if graph.has(dg.AssetKey(name)):
            assert dg.AssetKey(name) not in graph.get(dg.AssetKey("serving_config")).parent_keys
    assert [n for n in STACK_DEPENDENT if n in CELL_ASSETS] == [
        "kserve_manifest", "load_timing", "serving_benchmark"]


@pytest.mark.slow
def test_stack_edit_marks_dependents_stale_and_revalidates_exactly_the_ready_models(
        instance, defs, config_dir, STACK_DEPENDENT):
    """A stack change: the onboarded models' own stages are re-validated first (the model
    schedule); their cells wait for it, then exactly the onboarded cells still measured on the
    old stack are re-validated (the cell schedule). A half-done model is neither."""
    first = _observe(instance, defs)
    assert len(first.asset_events) == 1
    for model in ("ready-a", "ready-b"):
        _onboard(instance, defs, model)
    _onboard(instance, defs, "half-done", node_types=(), selection=["checkpoint", "quantized"])
    fp_before = first.asset_events[0].tags["dagster/data_version"]
    mat = instance.get_latest_materialization_event(dg.AssetKey("kserve_manifest"))
    assert mat.asset_materialization.partition == "ready-b|cpu"
    assert mat.asset_materialization.tags[STACK_INPUT_TAG] == fp_before

    for schedule in (revalidation_schedule, cell_revalidation_schedule):
        unchanged = _schedule_tick(instance, defs, schedule)
        assert unchanged.run_requests == [] and "current" in unchanged.skip_message
    assert _observe(instance, defs).skip_message.startswith("serving stack unchanged")
    assert _status(instance, defs, "kserve_manifest", "ready-a|cpu") == StaleStatus.FRESH

    _bump_vllm(config_dir, "0.33.0")
    changed = _observe(instance, defs)
    [obs] = changed.asset_events
    fp_after = obs.tags["dagster/data_version"]
    assert fp_after != fp_before
    assert obs.metadata["changed"].value is True
    assert "config.versions.vllm | 0.32.0 | 0.33.0" in obs.metadata["diff"].value
    for model in ("ready-a", "ready-b"):
        for asset in STACK_DEPENDENT:
            assert _status(instance, defs, asset, _partition(asset, model)) == \
                StaleStatus.STALE, (asset, model)
    assert _status(instance, defs, "checkpoint", "ready-a") == StaleStatus.FRESH
    assert _status(instance, defs, "quantized", "half-done") == StaleStatus.STALE

    tick = _schedule_tick(instance, defs)
    assert sorted(r.partition_key for r in tick.run_requests) == ["ready-a", "ready-b"]
    for request in tick.run_requests:
        assert request.run_key == f"revalidate-{request.partition_key}@{fp_after[:16]}"
        assert request.tags["onboarding/stack_fingerprint"] == fp_after
        assert request.tags["onboarding/stale_assets"].split(",") == \
            _model_level(STACK_DEPENDENT) == ["accuracy", "quantized", "serving_config"]
        # the verdict before, in the readiness asset's words, as the checkpoint sensor tags it
        assert request.tags["onboarding/ready_before"] == _verdict(
            instance, defs, request.partition_key) != ""
    # both models are stale at the model level: their cells wait for the models' runs
    waiting = _cell_tick(instance, defs)
    assert waiting.run_requests == [] and "current" in waiting.skip_message

    revalidation = defs.resolve_job_def("revalidate_model")
    assert {k.to_user_string() for k in revalidation.asset_layer.executable_asset_keys} == {
        "serving_stack", "model_spec", "quantized", "accuracy", "serving_variant",
        "serving_config"}  # neither checkpoint nor a cell
    _run(instance, defs, "revalidate_model", "ready-a")
    assert _status(instance, defs, "serving_config", "ready-a") == StaleStatus.FRESH
    assert _status(instance, defs, "kserve_manifest", "ready-a|cpu") == StaleStatus.STALE
    after_one = _schedule_tick(instance, defs)
    assert [r.partition_key for r in after_one.run_requests] == ["ready-b"]
    assert after_one.run_requests[0].run_key == tick.run_requests[1].run_key

    [cell] = _cell_tick(instance, defs).run_requests  # ready-b's cell still waits
    assert cell.partition_key == "ready-a|cpu"
    assert cell.run_key == f"revalidate-ready-a@cpu@{fp_after[:16]}"
    assert cell.tags["onboarding/stale_assets"].split(",") == _cell_level(STACK_DEPENDENT) == [
        "kserve_manifest", "load_timing", "serving_benchmark"]
    assert cell.tags["onboarding/ready_before"] == _cell_verdict(instance, defs, "ready-a|cpu")
    revalidate_cell = defs.resolve_job_def("revalidate_cell")
    assert {k.to_user_string() for k in revalidate_cell.asset_layer.executable_asset_keys} == {
        "serving_stack", "load_timing", "serving_benchmark", "kserve_manifest"}
    _run(instance, defs, "revalidate_cell", "ready-a|cpu", tags=cell.tags)
    for asset in _cell_level(STACK_DEPENDENT):
        assert _status(instance, defs, asset, "ready-a|cpu") == StaleStatus.FRESH, asset
    assert _cell_tick(instance, defs).run_requests == []


@pytest.mark.slow
def test_a_stack_change_after_the_models_revalidation_revalidates_exactly_the_stale_cells(
        instance, defs, config_dir, STACK_DEPENDENT):
    """Two cells of one model: cpu measured on the old stack, h200 first measured after the
    change, once the model's own stages were re-validated on the new one. Only cell assets
    are stale then, of the cpu cell alone: the model schedule asks nothing, the cell schedule
    one revalidate_cell run, for that cell."""
    _observe(instance, defs)
    _onboard(instance, defs, "ready-a", node_types=("cpu",))
    _bump_vllm(config_dir, "0.33.0")
    fp = _observe(instance, defs).asset_events[0].tags["dagster/data_version"]
    _run(instance, defs, "revalidate_model", "ready-a")
    _run(instance, defs, "onboard_cell", "ready-a|h200")

    assert _schedule_tick(instance, defs).run_requests == []
    for asset in _cell_level(STACK_DEPENDENT):
        assert _status(instance, defs, asset, "ready-a|cpu") == StaleStatus.STALE, asset
        assert _status(instance, defs, asset, "ready-a|h200") == StaleStatus.FRESH, asset
    [request] = _cell_tick(instance, defs).run_requests
    assert request.partition_key == "ready-a|cpu"
    assert request.run_key == f"revalidate-ready-a@cpu@{fp[:16]}"
    assert request.tags["onboarding/stack_fingerprint"] == fp
    assert request.tags["onboarding/stale_assets"].split(",") == _cell_level(STACK_DEPENDENT)


@pytest.mark.slow
def test_rerunning_one_cell_leaves_the_other_cells_materializations_untouched(instance, defs):
    """A cell's run writes its own partition only: re-running ready-a's cpu cell adds one
    materialization per cell asset there and none on ready-a's h200 cell."""
    _observe(instance, defs)
    _onboard(instance, defs, "ready-a", node_types=("cpu", "h200"))
    before = {(a, nt): _materializations(instance, a, f"ready-a|{nt}")
              for a in CELL_ASSETS for nt in NODE_TYPES}
    assert all(len(before[(a, nt)]) == 1 for a in ("load_timing", "serving_benchmark",
                                                   "kserve_manifest") for nt in NODE_TYPES)

    _run(instance, defs, "onboard_cell", "ready-a|cpu")
    for asset in ("load_timing", "serving_benchmark", "kserve_manifest"):
        assert _materializations(instance, asset, "ready-a|h200") == before[(asset, "h200")]
        cpu = _materializations(instance, asset, "ready-a|cpu")
        assert len(cpu) == 2 and cpu[1:] == before[(asset, "cpu")], asset
    assert instance.get_materialized_partitions(dg.AssetKey("kserve_manifest")) == {
        "ready-a|cpu", "ready-a|h200"}


@pytest.mark.slow
def test_an_onboarded_model_is_revalidated_whatever_its_readiness_verdict(
        instance, defs, config_dir):
    """The schedules take every model with an onboarded cell (each
    `revalidation.ready_assets` materialized), and every such cell, whatever its `readiness`
    verdict (a stack change can turn "not ready" either way); what the UI shows of the
    schedules says the same, not "ready models"."""
    _observe(instance, defs)
    for model in ("ready-a", "ready-b"):
        _onboard(instance, defs, model)
    # the verdict lives in the stored Readiness only (no metadata): before, the schedule read
    # the `verdict` metadata and tagged this run "not judged yet"
    verdict = Readiness("ready-b", False, reasons=("ttft_p95_s 4.1 > 2.0 (chat, concurrency 8)",))
    store_readiness(instance, verdict, node_type="cpu")
    not_ready = "not ready: ttft_p95_s 4.1 > 2.0 (chat, concurrency 8)"
    assert verdict.summary() == not_ready
    _bump_vllm(config_dir, "0.33.0")
    _observe(instance, defs)
    requests = {r.partition_key: r for r in _schedule_tick(instance, defs).run_requests}
    assert sorted(requests) == ["ready-a", "ready-b"]
    assert requests["ready-b"].tags["onboarding/ready_before"] == f"cpu: {not_ready}"
    assert requests["ready-a"].tags["onboarding/ready_before"] == "not judged yet"

    for model in ("ready-a", "ready-b"):
        _run(instance, defs, "revalidate_model", model)
    cells = {r.partition_key: r for r in _cell_tick(instance, defs).run_requests}
    assert sorted(cells) == ["ready-a|cpu", "ready-b|cpu"]
    assert cells["ready-b|cpu"].tags["onboarding/ready_before"] == not_ready
    for schedule in (revalidation_schedule, cell_revalidation_schedule):
        assert "whatever their readiness verdict" in schedule.description
    assert "onboarded models" in revalidation_schedule.description
    assert "onboarded cells" in cell_revalidation_schedule.description


@pytest.mark.slow
def test_a_revalidation_that_flips_the_gate_is_visible_in_metadata(instance, defs, config_dir):
    _observe(instance, defs)
    _onboard(instance, defs, "ready-a")
    _bump_vllm(config_dir, BROKEN_VLLM)
    _observe(instance, defs)
    [request] = [r for r in _schedule_tick(instance, defs).run_requests
                 if r.partition_key == "ready-a"]
    result = _run(instance, defs, "revalidate_model", "ready-a", tags=request.tags,
                  raise_on_error=False)
    assert not result.success  # the blocking gate stops the re-validation

    _report_failure(instance, defs, result.run_id)
    [obs] = instance.fetch_observations(dg.AssetKey("accuracy"), limit=1).records
    md = obs.asset_observation.metadata
    assert obs.asset_observation.partition == "ready-a"
    assert md["verdict_changed"].value is True
    assert md["verdict_change"].value == f"{GATE}: passed -> failed"
    assert md["stack_fingerprint"].value == request.tags["onboarding/stack_fingerprint"]


@pytest.mark.slow
def test_a_cell_revalidation_that_flips_its_slo_is_visible_in_the_cells_metadata(
        instance, defs, config_dir):
    """A stack that keeps the model's gate but misses a cell's SLO: the model's re-validation
    passes; the cell's fails on its check, and the change is recorded on that cell, against
    the cell's own onboarding run, with the cell's verdict."""
    _observe(instance, defs)
    _onboard(instance, defs, "ready-a", node_types=("cpu", "h200"))
    store_readiness(instance, Readiness("ready-a", True, nodes=(NodeReadiness("cpu", True, ()),)),
                    node_type="cpu")
    _bump_vllm(config_dir, SLOW_VLLM)
    _observe(instance, defs)
    _run(instance, defs, "revalidate_model", "ready-a")
    requests = {r.partition_key: r for r in _cell_tick(instance, defs).run_requests}
    assert sorted(requests) == ["ready-a|cpu", "ready-a|h200"]
    request = requests["ready-a|cpu"]
    result = _run(instance, defs, "revalidate_cell", "ready-a|cpu", tags=request.tags,
                  raise_on_error=False)
    assert not result.success  # the blocking SLO check stops the cell's re-validation

    _report_failure(instance, defs, result.run_id)
    [obs] = instance.fetch_observations(dg.AssetKey("serving_benchmark"), limit=5).records
    md = obs.asset_observation.metadata
    assert obs.asset_observation.partition == "ready-a|cpu"
    assert md["verdict_changed"].value is True
    assert md["verdict_change"].value == f"{SLO}: passed -> failed"
    assert md["readiness"].value == "ready on cpu"  # the cell's verdict, in its words
    assert md["stack_fingerprint"].value == request.tags["onboarding/stack_fingerprint"]


def _report_failure(instance, defs, run_id: str) -> None:
    """The revalidation_verdicts_on_failure sensor on the failed run, as the daemon runs it."""
    run = instance.get_run_by_id(run_id)
    [failure] = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
    on_failure = defs.resolve_sensor_def("revalidation_verdicts_on_failure")
    ctx = dg.build_run_status_sensor_context(
        sensor_name=on_failure.name, dagster_instance=instance,
        dagster_run=run, dagster_event=failure.event_log_entry.dagster_event,
        repository_def=defs.get_repository_def(),
        resources={"io_manager": defs.resources["io_manager"]})
    on_failure(ctx)


def _after_success(instance, defs, run_id: str):
    """cells_after_model on the successful run, as the daemon runs it."""
    return after_success(cells_after_model, instance, defs, run_id)


@pytest.mark.slow
def test_a_models_success_requests_one_run_per_cell_measured_here_or_planned(
        instance, defs, configs, monkeypatch):
    """After onboard_model succeeds: one run per node type of the fleet (deploy.yaml
    target_node_types, then the embedded cpu), measured (onboard_cell) on the local cpu and
    planned (plan_cell) on the GPU pools this deployment cannot reach; the node types are
    registered as partitions. The cpu request runs as asked. After the model's re-validation:
    its onboarded cells' re-validation, and no other."""
    monkeypatch.delenv(EXECUTOR_ENV, raising=False)
    monkeypatch.delenv(NODE_TYPE_ENV, raising=False)
    assert configs.deploy().target_node_types == ["b300", "h200"]
    assert not instance.has_dynamic_partition("node_types", "b300")
    _observe(instance, defs)
    model_run = _run(instance, defs, "onboard_model", "ready-a",
                     tags={"onboarding/sweep": "quick"})

    requests = {r.partition_key: r for r in _after_success(instance, defs, model_run.run_id)}
    assert {k: r.job_name for k, r in requests.items()} == {
        "ready-a|b300": "plan_cell", "ready-a|h200": "plan_cell", "ready-a|cpu": "onboard_cell"}
    assert instance.has_dynamic_partition("node_types", "b300")
    for key, request in requests.items():
        assert request.run_key == f"{model_run.run_id}:{key.split('|')[1]}"
        assert request.tags[CELL_TRIGGER_TAG] == model_run.run_id
        assert request.tags["onboarding/sweep"] == "quick"  # the model run's sweep, passed on
    launch = configs.automation().launch
    cpu = requests["ready-a|cpu"]
    assert cpu.run_config == launch.run_config(
        "quick", job_stages(defs.get_repository_def(), "onboard_cell")) != {}
    assert requests["ready-a|h200"].run_config == {}
    cell_run = _run(instance, defs, "onboard_cell", cpu.partition_key,
                    run_config=cpu.run_config, tags=cpu.tags)
    timing = cell_run.asset_materializations_for_node("load_timing")[0]
    assert timing.metadata["cold_repeats"].value == 1  # the quick sweep reached the cell

    revalidation = _run(instance, defs, "revalidate_model", "ready-a")
    [again] = _after_success(instance, defs, revalidation.run_id)
    assert (again.job_name, again.partition_key) == ("revalidate_cell", "ready-a|cpu")


@pytest.mark.slow
def test_a_model_run_that_did_not_plan_starts_no_cell(instance, defs, monkeypatch):
    """A fetch alone (an asset selection without serving_config) gives the cells nothing new
    to render from: no cell run follows it; one that re-planned does."""
    monkeypatch.delenv(EXECUTOR_ENV, raising=False)
    _observe(instance, defs)
    fetched = _run(instance, defs, "onboard_model", "ready-a",
                   asset_selection=[dg.AssetKey("checkpoint")])
    skipped = _after_success(instance, defs, fetched.run_id)
    assert isinstance(skipped, dg.SkipReason) and "did not plan it" in skipped.skip_message
    planned = _run(instance, defs, "onboard_model", "ready-a",
                   asset_selection=[dg.AssetKey("serving_config")])
    assert {r.partition_key for r in _after_success(instance, defs, planned.run_id)} == {
        "ready-a|b300", "ready-a|h200", "ready-a|cpu"}


@pytest.mark.slow
def test_on_k8s_every_chained_cell_run_carries_its_pool_beside_the_sweep(
        instance, defs, monkeypatch):
    """A request's run config replaces the job's partitioned config: each cell run the chain
    requests carries its own pool's placement merged with the model run's sweep."""
    monkeypatch.setenv(EXECUTOR_ENV, "k8s")
    _observe(instance, defs)
    model_run = _run(instance, defs, "onboard_model", "ready-a",
                     tags={"onboarding/sweep": "quick"})
    requests = {r.partition_key: r for r in _after_success(instance, defs, model_run.run_id)}
    nodes = defs.resources["configs"].nodes().node_types
    for nt in ("b300", "h200"):
        request = requests[f"ready-a|{nt}"]
        assert request.job_name == "onboard_cell"
        pod = request.run_config["execution"]["config"]["per_step_k8s_config"]["load_timing"]
        assert pod["pod_spec_config"]["node_selector"]["nvidia.com/gpu.product"] == \
            nodes[nt].gpu_product
        assert request.run_config["ops"]["load_timing"]["config"]["cold_repeats"] == 1


MODEL_STAGES = ["checkpoint", "quantized", "accuracy", "serving_variant", "serving_config"]
CELL_STAGES = ["load_timing", "serving_benchmark", "kserve_manifest"]


@pytest.mark.slow
def test_every_onboarding_run_observes_the_stack_first(instance, defs, configs):
    """onboard_model and onboard_cell each select serving_stack: their results record a
    fingerprint as their stack input version even when nothing observed the stack before,
    and a cell's run observes it itself (its node type may run on another stack than the
    model's run)."""
    assert not instance.fetch_observations(STACK, limit=1).records
    _onboard(instance, defs, "ready-a")
    fp = current_stack(configs)[0]
    [mat] = instance.fetch_materializations(dg.AssetKey("kserve_manifest"), limit=1).records
    assert mat.asset_materialization.partition == "ready-a|cpu"
    assert mat.asset_materialization.tags[STACK_INPUT_TAG] == fp
    [mat] = instance.fetch_materializations(dg.AssetKey("serving_config"), limit=1).records
    assert mat.asset_materialization.tags[STACK_INPUT_TAG] == fp
    observed = [r.run_id for r in instance.fetch_observations(STACK, limit=5).records]
    [cell_run] = instance.get_runs(filters=dg.RunsFilter(job_name="onboard_cell"))
    [model_run] = instance.get_runs(filters=dg.RunsFilter(job_name="onboard_model"))
    assert sorted(observed) == sorted([cell_run.run_id, model_run.run_id])


@pytest.mark.slow
def test_a_model_onboarded_before_any_stack_observation_is_current_until_the_stack_changes(
        instance, defs, config_dir, configs, STACK_DEPENDENT):
    """An ad-hoc materialization of the stages (as from the UI, without the jobs'
    observation) before any serving_stack observation: Dagster records its marker instead of a
    fingerprint; the assets' own record of the stack they ran on decides, for the model's
    stages and for its cell's."""
    assert not instance.fetch_observations(STACK, limit=1).records
    _onboard(instance, defs, "ready-a", selection=MODEL_STAGES + CELL_STAGES)
    assert not instance.fetch_observations(STACK, limit=1).records
    [mat] = instance.fetch_materializations(dg.AssetKey("kserve_manifest"), limit=1).records
    assert mat.asset_materialization.tags.get(STACK_INPUT_TAG, "INITIAL") == "INITIAL"
    first = _observe(instance, defs)  # the first observation comes after the runs
    fp = first.asset_events[0].tags["dagster/data_version"]
    for schedule in (revalidation_schedule, cell_revalidation_schedule):
        tick = _schedule_tick(instance, defs, schedule)
        assert tick.run_requests == [] and "current" in tick.skip_message
    assert stale_partitions(instance, fp, ["ready-a"], _model_level(STACK_DEPENDENT)) == {}
    assert stale_partitions(instance, fp, ["ready-a|cpu"], _cell_level(STACK_DEPENDENT)) == {}

    _bump_vllm(config_dir, "0.33.0")
    changed = _observe(instance, defs).asset_events[0].tags["dagster/data_version"]
    [request] = _schedule_tick(instance, defs).run_requests
    assert request.partition_key == "ready-a"
    assert request.run_key == f"revalidate-ready-a@{changed[:16]}"
    assert _cell_tick(instance, defs).run_requests == []  # the cell waits for its model
    assert stale_partitions(instance, changed, ["ready-a"], _model_level(STACK_DEPENDENT)) == {
        "ready-a": {a: fp for a in _model_level(STACK_DEPENDENT)}}
    assert stale_partitions(instance, changed, ["ready-a|cpu"],
                            _cell_level(STACK_DEPENDENT)) == {
        "ready-a|cpu": {a: fp for a in _cell_level(STACK_DEPENDENT)}}


@pytest.mark.slow
def test_a_cell_whose_stack_is_unknown_is_revalidated(instance, defs, STACK_DEPENDENT):
    """Neither an observation nor the asset's own record: nothing says what the cell was
    measured on, so it is re-validated rather than assumed current."""
    _onboard(instance, defs, "ready-a", selection=MODEL_STAGES + CELL_STAGES)
    fp = _observe(instance, defs).asset_events[0].tags["dagster/data_version"]
    assert stale_partitions(instance, fp, ["ready-a|cpu"], STACK_DEPENDENT) == {}
    legacy = dg.AssetMaterialization("kserve_manifest", partition="ready-a|cpu",
                                     metadata={"note": "from before fingerprints were recorded"})
    instance.report_runless_asset_event(legacy)
    assert stale_partitions(instance, fp, ["ready-a|cpu"], STACK_DEPENDENT) == {
        "ready-a|cpu": {"kserve_manifest": "unknown"}}
    assert _schedule_tick(instance, defs).run_requests == []  # the model's stages are current
    [request] = _cell_tick(instance, defs).run_requests
    assert request.partition_key == "ready-a|cpu"
    assert request.tags["onboarding/stale_assets"] == "kserve_manifest"


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
        "accuracy", "config_search", "kserve_manifest", "load_timing", "operations", "predictions", "quantized",
        "readiness",
        "readiness_report", "served_accuracy", "serving_benchmark", "serving_config",
        "serving_variant"]
    for name in ("checkpoint", "published_variant"):
        assert MODEL_SPEC not in graph.get(dg.AssetKey(name)).parent_keys, name
    # onboarding and re-validation observe it first, as they observe the stack
    for job in ("onboard_model", "revalidate_model"):
        assert MODEL_SPEC in real.resolve_job_def(job).asset_layer.asset_graph.get_all_asset_keys()
    # a cell's run observes the stack it measures on
    for job in ("onboard_cell", "revalidate_cell"):
        assert SERVING_STACK in real.resolve_job_def(job).asset_layer.executable_asset_keys, job


@pytest.mark.slow
def test_editing_one_catalog_entry_marks_that_model_stale_and_revalidates_it_alone(
        instance, defs, configs):
    """The spec is a versioned per-model input. Editing ready-a's eval tasks, SLO overrides
    and engine args makes the next catalog tick record a new model_spec version for ready-a
    only; Dagster's stale-status resolver then reports ready-a's spec-dependent stages STALE
    (its own and its cell's) and ready-b's FRESH; the model schedule asks re-validation of
    ready-a alone, then the cell schedule of ready-a's cell alone, which makes it fresh
    again."""
    assert spec_dependent(defs.resolve_asset_graph()) == SPEC_DEPENDENT
    first = _catalog_tick(instance, defs)
    assert sorted(e.partition for e in first.asset_events) == sorted(MODELS)
    _observe(instance, defs)
    for model in ("ready-a", "ready-b"):
        _onboard(instance, defs, model)
    versions = {e.partition: e.tags["dagster/data_version"] for e in first.asset_events}
    for model in ("ready-a", "ready-b"):
        [mat] = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("kserve_manifest"), asset_partitions=[f"{model}|cpu"]),
            limit=1).records
        assert mat.asset_materialization.metadata["model_spec_version"].value == versions[model]
        assert _status(instance, defs, "kserve_manifest", f"{model}|cpu") == StaleStatus.FRESH
    assert _catalog_tick(instance, defs).skip_message.endswith("their specs recorded")
    assert _schedule_tick(instance, defs).run_requests == []
    assert _cell_tick(instance, defs).run_requests == []

    write_spec(configs, "ready-a", "s3://models/ready-a/", eval_tasks=["arith", "mmlu_tiny"],
               slo={"ttft_p95_s": 0.5}, engine_args={"max_model_len": 2048})
    [obs] = _catalog_tick(instance, defs).asset_events
    assert obs.partition == "ready-a"
    new = obs.tags["dagster/data_version"]
    assert new != versions["ready-a"]
    for asset in SPEC_DEPENDENT:
        assert _status(instance, defs, asset, _partition(asset, "ready-a")) == \
            StaleStatus.STALE, asset
        assert _status(instance, defs, asset, _partition(asset, "ready-b")) == \
            StaleStatus.FRESH, asset
    assert _status(instance, defs, "checkpoint", "ready-a") == StaleStatus.FRESH

    [request] = _schedule_tick(instance, defs).run_requests
    fp = current_stack(configs)[0]
    assert request.partition_key == "ready-a"
    assert request.run_key == f"revalidate-ready-a@{fp[:16]}+spec-{new[:12]}"
    assert request.tags["onboarding/spec_version"] == new
    assert request.tags["onboarding/stale_assets"].split(",") == _model_level(SPEC_DEPENDENT)
    assert _cell_tick(instance, defs).run_requests == []  # the cell waits for its model
    _run(instance, defs, "revalidate_model", "ready-a")
    assert _status(instance, defs, "serving_config", "ready-a") == StaleStatus.FRESH
    assert _schedule_tick(instance, defs).run_requests == []

    [cell] = _cell_tick(instance, defs).run_requests
    assert cell.partition_key == "ready-a|cpu"
    assert cell.run_key == f"revalidate-ready-a@cpu@{fp[:16]}+spec-{new[:12]}"
    assert cell.tags["onboarding/spec_version"] == new
    assert cell.tags["onboarding/stale_assets"].split(",") == _cell_level(SPEC_DEPENDENT)
    _run(instance, defs, "revalidate_cell", "ready-a|cpu")
    assert _status(instance, defs, "kserve_manifest", "ready-a|cpu") == StaleStatus.FRESH
    assert _cell_tick(instance, defs).run_requests == []
