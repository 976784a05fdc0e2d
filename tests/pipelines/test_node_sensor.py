"""node_partitions_sensor: the nodes of configs/acceptance.yaml become `nodes` partitions; a
broken acceptance.yaml fails the tick naming the file, never the code location."""

import dagster as dg
import pytest
import yaml

from onboarding.common.errors import ConfigError
from pipelines.jobs import accept_node, onboard_model
from pipelines.sensors import node_partitions_sensor


def tick(instance, configs):
    with dg.build_sensor_context(instance=instance, resources={"configs": configs}) as ctx:
        result = node_partitions_sensor(ctx)
    if isinstance(result, dg.SensorResult):
        for request in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(request.partitions_def_name,
                                            list(request.partition_keys))
    return result


def test_listed_nodes_are_registered_once(config_dir, configs):
    path = config_dir / "acceptance.yaml"
    data = yaml.safe_load(path.read_text())
    data["nodes"] = {"gpu-node-01": {"node_type": "h200"},
                     "h200-slice-1.example": {"node_type": "h200", "gpus": 1}}
    path.write_text(yaml.safe_dump(data))
    with dg.instance_for_test() as instance:
        assert isinstance(tick(instance, configs), dg.SensorResult)
        assert sorted(instance.get_dynamic_partitions("nodes")) == [
            "gpu-node-01", "h200-slice-1.example"]
        again = tick(instance, configs)
        assert isinstance(again, dg.SkipReason) and "all 2 node(s)" in again.skip_message
        assert instance.get_dynamic_partitions("models") == []


def test_a_broken_acceptance_file_fails_the_tick_naming_it(config_dir, configs):
    (config_dir / "acceptance.yaml").write_text("nodes: {gpu-node-01: {node_type: a100}}\n"
                                                "probe: {burn_s: 60}\nnode_types: {h200: {}}\n")
    with dg.instance_for_test() as instance, pytest.raises(ConfigError, match="acceptance.yaml"):
        tick(instance, configs)


def test_node_assets_are_their_own_job_outside_model_onboarding():
    from pipelines.definitions import defs

    def assets(job):
        return {k.to_user_string() for k in defs.resolve_job_def(job.name).asset_layer
                .executable_asset_keys}

    node = assets(accept_node)
    assert node == {"node_inventory", "gpu_health", "interconnect", "memory_bandwidth",
                    "storage_read", "node_acceptance"}
    assert not node & assets(onboard_model)
    assert defs.resolve_job_def(accept_node.name).executor_def.name == "in_process"
