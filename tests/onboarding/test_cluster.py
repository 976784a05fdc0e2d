"""cluster.yaml / nodes.yaml -> step pod config: validation names the file and field."""

from __future__ import annotations

import pytest
import yaml

from assets.step_tags import CACHE_TAG, GPU_SLOT_TAG, cache_step_tags, gpu_step_tags
from onboarding.common.errors import ConfigError
from onboarding.runs.cluster import gpu_step_pod_config, load_cluster_config, load_node_type
from pipelines.executors import step_placements


def _edit_cluster(config_dir, edit) -> None:
    path = config_dir / "cluster.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))


def _cluster(config_dir):
    return load_cluster_config(config_dir / "cluster.yaml")


def _node(config_dir, name):
    return load_node_type(name, config_dir / "nodes.yaml")


def test_unknown_key_names_file_and_field(config_dir):
    _edit_cluster(config_dir, lambda d: d["step_pods"].update(gpu_count=2))
    with pytest.raises(ConfigError, match=r"cluster\.yaml.*step_pods\.gpu_count.*unknown key"):
        _cluster(config_dir)


def test_cache_needs_exactly_one_source(config_dir):
    _edit_cluster(config_dir, lambda d: d["step_pods"]["cache"].update(pvc_claim_name="c"))
    with pytest.raises(ConfigError, match="exactly one of host_path and pvc_claim_name"):
        _cluster(config_dir)


def test_every_gpu_stage_needs_a_count(config_dir):
    _edit_cluster(config_dir, lambda d: d["step_pods"]["gpus"].pop("accuracy"))
    with pytest.raises(ConfigError, match="gpus lacks a count for \\['accuracy'\\]"):
        _cluster(config_dir)


def test_gpus_are_not_set_in_resources(config_dir):
    _edit_cluster(
        config_dir, lambda d: d["step_pods"]["resources"]["limits"].update({"nvidia.com/gpu": "1"})
    )
    with pytest.raises(ConfigError, match="per stage under step_pods.gpus"):
        _cluster(config_dir)


def test_unknown_node_type_lists_the_known_ones(config_dir):
    with pytest.raises(ConfigError, match=r"node type 'a100'.*known: b200, b300, h100, h200"):
        _node(config_dir, "a100")


def test_more_gpus_than_the_node_has_is_refused(config_dir):
    cfg, node = _cluster(config_dir), _node(config_dir, "h100")
    with pytest.raises(ConfigError, match="9 requested, a h100 node has 8"):
        gpu_step_pod_config("serving_benchmark", cfg, node, gpus=9)


def test_pvc_cache(config_dir):
    def use_pvc(d):
        d["step_pods"]["cache"].update(host_path=None, pvc_claim_name="model-cache-local")

    _edit_cluster(config_dir, use_pvc)
    config = gpu_step_pod_config("quantized", _cluster(config_dir), _node(config_dir, "b300"))
    volumes = {v["name"]: v for v in config["pod_spec_config"]["volumes"]}
    assert volumes["model-cache"]["persistent_volume_claim"] == {"claim_name": "model-cache-local"}
    assert config["pod_spec_config"]["node_selector"] == {
        "nvidia.com/gpu.product": "NVIDIA-B300-SXM6-AC"
    }


def test_step_tags_are_static_and_read_no_config():
    """Placement is the executor's job when a run starts; the tags only say what a step needs."""
    assert gpu_step_tags("quantized") == {GPU_SLOT_TAG: "true", CACHE_TAG: "true"}
    assert cache_step_tags("checkpoint") == {CACHE_TAG: "true"}


def test_without_nodes_yaml_placement_names_the_file(configs, config_dir):
    (config_dir / "nodes.yaml").unlink()
    with pytest.raises(ConfigError, match=r"nodes\.yaml: does not exist"):
        step_placements(configs)


def test_cpu_assets_cannot_take_gpu_tags():
    with pytest.raises(ValueError, match="not a GPU-bound asset"):
        gpu_step_tags("serving_config")
    with pytest.raises(ValueError, match="GPU-bound assets call gpu_step_tags"):
        cache_step_tags("quantized")


def test_gpu_image_from_env(configs, monkeypatch):
    monkeypatch.setenv("ONBOARDING_GPU_IMAGE", "my.registry/gpu:1")
    assert step_placements(configs)["accuracy"]["container_config"]["image"] == \
        "my.registry/gpu:1"
    assert "image" not in step_placements(configs)["checkpoint"]["container_config"]
