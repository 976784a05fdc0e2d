"""The two partition levels as the real code location has them: which assets are cells, the
jobs of each level, and how a cell's run is placed and refused."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.partitions import (
    LEVEL_TAG,
    cell_key,
    cells_partitions,
    models_partitions,
    split_cell,
)
from pipelines.cells import cells_of, fleet_node_types
from pipelines.definitions import defs
from pipelines.executors import cell_run_config, cell_run_tags
from pipelines.jobs import CELL_ASSETS, FLEET_ASSETS
from resources.config_files import ConfigFiles


@pytest.fixture(scope="module")
def graph():
    return defs.resolve_asset_graph()


@pytest.mark.slow
def test_every_cell_partitioned_asset_is_tagged_a_cell_and_named_in_cell_assets(graph):
    cells, tagged, fleet = set(), set(), set()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        level = (node.tags or {}).get(LEVEL_TAG)
        if node.partitions_def == cells_partitions:
            cells.add(key.to_user_string())
        if level in ("cell", "cell-measured"):
            tagged.add(key.to_user_string())
        if level == "fleet":
            fleet.add(key.to_user_string())
    assert cells == tagged == set(CELL_ASSETS)
    assert fleet == set(FLEET_ASSETS)
    for name in FLEET_ASSETS:
        assert graph.get(dg.AssetKey(name)).partitions_def is None


@pytest.mark.slow
def test_a_cell_depends_on_its_own_model_only(graph):
    """A cell's per-model inputs map by the model dimension: (m, h200) reads m's plan, never
    another model's, and every node type's cell reads the same one."""
    node = graph.get(dg.AssetKey("kserve_manifest"))
    assert dg.AssetKey("serving_config") in node.parent_keys
    mapping = graph.get_partition_mapping(dg.AssetKey("kserve_manifest"),
                                          dg.AssetKey("serving_config"))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("models", ["a", "b"])
        instance.add_dynamic_partitions("node_types", ["cpu", "h200"])
        from dagster._core.definitions.partitions.context import partition_loading_context

        with partition_loading_context(dynamic_partitions_store=instance):
            upstream = mapping.get_upstream_mapped_partitions_result_for_partitions(
                cells_partitions.empty_subset().with_partition_keys(
                    [str(cell_key("a", "h200"))]),
                cells_partitions, models_partitions)
        assert set(upstream.partitions_subset.get_partition_keys()) == {"a"}


@pytest.mark.slow
def test_the_jobs_split_by_level(graph):
    model_job = defs.resolve_job_def("onboard_model")
    cell_job = defs.resolve_job_def("onboard_cell")
    in_model = {k.to_user_string() for k in model_job.asset_layer.executable_asset_keys}
    in_cell = {k.to_user_string() for k in cell_job.asset_layer.executable_asset_keys}
    assert not in_model & set(CELL_ASSETS) and not in_model & set(FLEET_ASSETS)
    assert {"checkpoint", "quantized", "accuracy", "serving_variant", "serving_config",
            "published_variant"} <= in_model
    assert in_cell == {*CELL_ASSETS, *FLEET_ASSETS, "serving_stack"}
    plan = defs.resolve_job_def("plan_cell")
    planned = {k.to_user_string() for k in plan.asset_layer.executable_asset_keys}
    assert not planned & {"load_timing", "serving_benchmark", "served_accuracy"}


def test_a_cell_key_round_trips_and_a_model_key_is_no_cell():
    key = cell_key("llama-3-1-8b-instruct", "h200")
    assert str(key) == "llama-3-1-8b-instruct|h200"
    assert split_cell(key) == split_cell(str(key)) == ("llama-3-1-8b-instruct", "h200")
    with pytest.raises(ValueError, match="not a cell key"):
        split_cell("llama-3-1-8b-instruct")


def test_a_cells_run_on_k8s_lands_on_its_node_types_pool(monkeypatch):
    monkeypatch.setenv("ONBOARDING_EXECUTOR", "k8s")
    configs = ConfigFiles()
    placed = cell_run_config("m|b300", configs)["execution"]["config"]["per_step_k8s_config"]
    b300 = configs.nodes().node_types["b300"]
    for step in ("load_timing", "serving_benchmark", "served_accuracy"):
        pod = placed[step]
        assert pod["pod_spec_config"]["node_selector"]["nvidia.com/gpu.product"] == \
            b300.gpu_product
        env = {e["name"]: e["value"] for e in pod["container_config"]["env"]}
        assert env["ONBOARDING_NODE_TYPE"] == "b300"
    h200 = cell_run_config("m|h200", configs)["execution"]["config"]["per_step_k8s_config"]
    assert h200["load_timing"]["pod_spec_config"]["node_selector"][
        "nvidia.com/gpu.product"] == configs.nodes().node_types["h200"].gpu_product
    assert cell_run_tags("m|b300") == {"onboarding/model": "m", "onboarding/node_type": "b300"}
    monkeypatch.setenv("ONBOARDING_EXECUTOR", "in_process")
    assert cell_run_config("m|b300", configs) == {}  # local runs measure where they run


def test_the_fleet_is_the_targets_and_the_embedded_cpu_measured_where_it_can_be(monkeypatch):
    configs = ConfigFiles()
    targets = list(configs.deploy().target_node_types)
    assert fleet_node_types(configs) == [*targets, "cpu"]
    monkeypatch.setenv("ONBOARDING_EXECUTOR", "in_process")
    monkeypatch.delenv("ONBOARDING_NODE_TYPE", raising=False)
    assert cells_of(None, configs) == {**{t: "plan_cell" for t in targets},
                                       "cpu": "onboard_cell"}
    assert cells_of(["h200"], configs) == {"h200": "plan_cell"}
    monkeypatch.setenv("ONBOARDING_EXECUTOR", "k8s")
    assert cells_of(["h200"], configs) == {"h200": "onboard_cell"}


def test_an_engine_on_another_node_type_refuses_before_measuring():
    from resources.engine import Engine, EngineError

    nodes = ConfigFiles().nodes()
    cpu = Engine(node_type="cpu", hardware="cpu")
    assert cpu.off_node_type("cpu", nodes) == ""
    assert "configured for node type 'cpu'" in cpu.off_node_type("h200", nodes)
    # a pod that says h200 but landed on a Hopper-less node: the hardware decides
    wrong_pool = Engine(node_type="h200", hardware="sm100")
    assert wrong_pool.off_node_type("h200", nodes) == \
        "the hardware here is sm100, a h200 node has sm90"
    assert Engine(node_type="h200", hardware="sm90").off_node_type("h200", nodes) == ""
    with pytest.raises(EngineError, match="partition node type 'h200'.*Run this cell on a "
                       "h200 node"):
        cpu.require_node_type("h200", nodes, "load_timing[m|h200]")
