"""Step pods as dagster-k8s renders them: GPU steps get exactly their GPUs and placement, CPU none.

The Jobs come from the k8s executor's own step handler (see k8s_render); only the API client is
a recorder, because no cluster exists here. Every rendered Job is validated strictly against the
Kubernetes schemas shipped with kubernetes-validate (offline).
"""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.test_utils import instance_for_test

from assets.partitions import cell_key
from assets.step_tags import CACHE_ASSETS, GPU_BOUND_ASSETS, cache_step_tags, gpu_step_tags
from onboarding.common.paths import DEFAULT_CONFIG_DIR, PROJECT_ROOT
from onboarding.runs.cluster import load_cluster_config, load_node_type
from pipelines.executors import CELL_STEPS, K8S_CONFIG_TAG, step_placements, step_run_config
from tests.pipelines.k8s_render import KUBECONFIG, k8s_run_launcher_overrides, render_step_job
from tests.pipelines.stand_in_graph import EDGES

CPU_STAGES = [s for s in EDGES if s not in CACHE_ASSETS]


def load_cluster():
    return load_cluster_config(DEFAULT_CONFIG_DIR / "cluster.yaml")


def node_type(name):
    return load_node_type(name, DEFAULT_CONFIG_DIR / "nodes.yaml")
CPU_IMAGE = "registry.example.com/model-onboarding:0.1.0"
K8S_VERSION = "1.33.0"


@pytest.fixture(scope="module")
def k8s_instance(tmp_path_factory):
    kubeconfig = tmp_path_factory.mktemp("kube") / "config"
    kubeconfig.write_text(KUBECONFIG)
    with instance_for_test(overrides=k8s_run_launcher_overrides(str(kubeconfig))) as instance:
        yield instance


@pytest.fixture(scope="module")
def stand_in():
    repo = ReconstructableRepository.for_module(
        "tests.pipelines.stand_in_graph", "defs", working_directory=str(PROJECT_ROOT)
    )
    return repo.get_reconstructable_job("onboard_model")


def _pod(rendered):
    return rendered["job"]["spec"]["template"]["spec"]


def _container(rendered):
    (container,) = _pod(rendered)["containers"]
    return container


def _validate(rendered, overridden_env: tuple[str, ...] = ()):
    """Strict schema validation, plus the uniqueness the API server enforces beyond the schema:
    the layers dagster-k8s merges must never declare a volume or a mount path twice, nor an
    env var, except `overridden_env`: set by the code location and again, later in the list
    (which the kubelet applies), by the step's placement."""
    kubernetes_validate.validate(rendered["job"], K8S_VERSION, strict=True)
    pod = _pod(rendered)
    volumes = [v["name"] for v in pod.get("volumes") or []]
    assert len(volumes) == len(set(volumes)), f"duplicate volumes: {volumes}"
    for container in pod["containers"]:
        paths = [m["mountPath"] for m in container.get("volumeMounts") or []]
        assert len(paths) == len(set(paths)), f"duplicate mount paths: {paths}"
        assert {m["name"] for m in container.get("volumeMounts") or []} <= set(volumes)
        env = [e["name"] for e in container.get("env") or [] if e["name"] not in overridden_env]
        assert len(env) == len(set(env)), f"duplicate env: {env}"


@pytest.mark.parametrize("stage", GPU_BOUND_ASSETS)
def test_gpu_step_pod_has_exactly_its_gpus_and_placement(stage, stand_in, k8s_instance):
    cfg = load_cluster()
    node = node_type(cfg.step_pods.node_type)
    rendered = render_step_job(stand_in, stage, k8s_instance)
    _validate(rendered)
    pod, container = _pod(rendered), _container(rendered)

    gpus = str(cfg.step_pods.gpus[stage])
    assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
    assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
    # Guaranteed QoS (requests = limits for cpu and memory): NUMA-aligned CPUs.
    for resource in ("cpu", "memory"):
        assert container["resources"]["requests"][resource] == (
            container["resources"]["limits"][resource]
        )
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": node.gpu_product}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": cfg.step_pods.shm_size}
    cache = cfg.step_pods.cache
    assert volumes["model-cache"]["hostPath"]["path"] == cache.host_path
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm"
    assert mounts["model-cache"] == cache.mount_path
    assert len(volumes) == len(pod["volumes"]), "duplicate volume names"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ONBOARDING_CACHE_ROOT"] == cache.mount_path
    assert env["ONBOARDING_NODE_TYPE"] == node.name  # one name, read by the engine resource too
    assert "NODE_TYPE" not in env
    assert container["image"] == cfg.step_pods.gpu_image
    assert rendered["job"]["metadata"]["labels"]["dagster/op"] == stage
    assert rendered["namespace"] == "onboarding"


@pytest.mark.parametrize("stage", CPU_STAGES)
def test_cpu_step_pod_has_no_gpu_placement(stage, stand_in, k8s_instance):
    rendered = render_step_job(stand_in, stage, k8s_instance)
    _validate(rendered)
    pod, container = _pod(rendered), _container(rendered)
    resources = container.get("resources") or {}
    assert "nvidia.com/gpu" not in json.dumps(resources)
    assert not pod.get("nodeSelector")
    assert not pod.get("tolerations")
    assert {v["name"] for v in pod["volumes"]}.isdisjoint({"dshm", "model-cache"})
    # The code location's (CPU) image, not the GPU one.
    assert container["image"] == CPU_IMAGE
    # What the Helm values give every run and step pod: the shared IO volume.
    assert "onboarding-io" in {v["name"] for v in pod["volumes"]}


def test_checkpoint_pod_has_the_cache_on_the_gpu_node_type_but_no_gpu(stand_in, k8s_instance):
    """The fetch writes the NVMe cache the GPU steps read: same node type, same volume."""
    cfg = load_cluster()
    node = node_type(cfg.step_pods.node_type)
    rendered = render_step_job(stand_in, "checkpoint", k8s_instance)
    _validate(rendered)
    pod, container = _pod(rendered), _container(rendered)
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources") or {})
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": node.gpu_product}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert {v["name"] for v in pod["volumes"]} == {
        "onboarding-io", "onboarding-configs", "onboarding-models", "model-cache"
    }
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["model-cache"] == cfg.step_pods.cache.mount_path
    assert container["image"] == CPU_IMAGE


@pytest.mark.slow
def test_node_pin_reaches_every_cache_step_and_no_other(stand_in, k8s_instance):
    executor_config = step_run_config(node_name="gpu-node-3")["execution"]["config"]
    for stage in CACHE_ASSETS:
        rendered = render_step_job(stand_in, stage, k8s_instance, executor_config)
        _validate(rendered)
        selector = _pod(rendered)["nodeSelector"]
        assert selector["kubernetes.io/hostname"] == "gpu-node-3", stage
        assert "nvidia.com/gpu.product" in selector, stage
    plan = render_step_job(stand_in, "serving_config", k8s_instance, executor_config)
    assert not _pod(plan).get("nodeSelector")


def test_merge_order_per_step_config_beats_op_tag_beats_step_k8s_config(stand_in, k8s_instance):
    """executor step_k8s_config < op tag < per_step_k8s_config; the merge is deep."""
    executor_config = {
        "step_k8s_config": {
            "container_config": {"resources": {"limits": {"nvidia.com/gpu": "7"}}},
            "pod_spec_config": {"priority_class_name": "onboarding"},
        },
        **step_run_config({"serving_benchmark": 4})["execution"]["config"],
    }
    bench = render_step_job(stand_in, "serving_benchmark", k8s_instance, executor_config)
    _validate(bench)
    resources = _container(bench)["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == "4"
    assert resources["limits"]["nvidia.com/gpu"] == "4"
    assert resources["requests"]["cpu"] == load_cluster().step_pods.resources.requests["cpu"]
    assert _pod(bench)["nodeSelector"]  # kept from the op tag
    assert _pod(bench)["priorityClassName"] == "onboarding"  # executor-wide setting kept

    # Without a per-step override the op tag beats the executor-wide limit of 7.
    quant = render_step_job(stand_in, "quantized", k8s_instance, executor_config)
    assert _container(quant)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # ...and a CPU step gets the executor-wide setting as is: why GPUs never go there.
    plan = render_step_job(stand_in, "serving_config", k8s_instance, executor_config)
    assert _container(plan)["resources"]["limits"]["nvidia.com/gpu"] == "7"


def test_job_level_tags_do_not_reach_step_pods(stand_in, k8s_instance):
    run_tags = {
        K8S_CONFIG_TAG: json.dumps({"pod_spec_config": {"node_selector": {"pool": "run-level"}}})
    }
    rendered = render_step_job(stand_in, "serving_variant", k8s_instance, run_tags=run_tags)
    assert not _pod(rendered).get("nodeSelector")
    gpu = render_step_job(stand_in, "accuracy", k8s_instance, run_tags=run_tags)
    assert "pool" not in _pod(gpu)["nodeSelector"]


def test_step_run_config_refuses_more_gpus_than_a_node_has():
    node = node_type(load_cluster().step_pods.node_type)
    with pytest.raises(ValueError, match="node has"):
        step_run_config({"serving_benchmark": node.gpus_per_node + 1})
    with pytest.raises(ValueError, match="not a GPU-bound"):
        step_run_config({"checkpoint": 1})


def test_node_type_from_env_changes_the_selector(monkeypatch):
    monkeypatch.setenv("ONBOARDING_NODE_TYPE", "b300")
    config = step_placements()["load_timing"]
    b300 = node_type("b300")
    assert config["pod_spec_config"]["node_selector"] == {"nvidia.com/gpu.product": b300.gpu_product}
    assert {"name": "ONBOARDING_NODE_TYPE", "value": "b300"} in config["container_config"]["env"]


@pytest.fixture
def resource_env(monkeypatch):
    """Resources read these when the plan is built; nothing connects to them here."""
    for name, value in {
        "S3_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_ACCESS_KEY_ID": "unused",
        "AWS_SECRET_ACCESS_KEY": "unused", "ONBOARDING_CACHE_ROOT": "/data/models",
    }.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def onboard_model():
    repo = ReconstructableRepository.for_module(
        "pipelines.definitions", "defs", working_directory=str(PROJECT_ROOT)
    )
    return repo.get_reconstructable_job("onboard_model")


@pytest.fixture(scope="module")
def onboard_cell():
    repo = ReconstructableRepository.for_module(
        "pipelines.definitions", "defs", working_directory=str(PROJECT_ROOT)
    )
    return repo.get_reconstructable_job("onboard_cell")


def _cell_executor_config(model: str, node_type_name: str) -> dict:
    """The executor config onboard_cell's partitioned config gives the run of one cell (the
    launchpad, a backfill and the sensor all ask it)."""
    from pipelines.definitions import defs

    job = defs.resolve_job_def("onboard_cell")
    run_config = job.partitioned_config.get_run_config_for_partition_key(
        str(cell_key(model, node_type_name)))
    return run_config["execution"]["config"]


@pytest.mark.slow
def test_real_onboarding_job_renders_the_same_step_pods(onboard_model, onboard_cell,
                                                         k8s_instance, resource_env,
                                                         monkeypatch):
    """The real code location: every step of a model's run and of a cell's renders and
    validates; the GPU-bound assets carry exactly `gpu_step_tags` and get their GPUs from the
    run-time placement (a cell's on its partition's node type), `checkpoint` its cache
    placement, every other step no GPU."""
    from dagster._core.execution.api import create_execution_plan

    cfg = load_cluster()

    def render_all(job, executor_config=None, overridden_env=()) -> dict[str, dict]:
        out = {}
        for key, step in {s.key: s for s in create_execution_plan(job).steps}.items():
            rendered = render_step_job(job, key, k8s_instance, executor_config)
            _validate(rendered, overridden_env)
            gpus = (_container(rendered).get("resources") or {}).get("limits", {})
            if key in GPU_BOUND_ASSETS:
                assert {k: step.tags[k] for k in gpu_step_tags(key)} == gpu_step_tags(key), key
                assert step.pool == "gpu", key
                assert gpus["nvidia.com/gpu"] == str(cfg.step_pods.gpus[key]), key
            else:
                assert "nvidia.com/gpu" not in gpus, key
            out[key] = rendered
        return out

    # the model's own stages: the GPU steps that do not depend on the node type they run on
    model_steps = render_all(onboard_model)
    assert {*GPU_BOUND_ASSETS, "checkpoint"} - set(CELL_STEPS) <= set(model_steps)
    assert not set(model_steps) & set(CELL_STEPS)  # those are the cells'
    default = node_type(cfg.step_pods.node_type)
    for key in GPU_BOUND_ASSETS:
        if key in model_steps:
            assert _pod(model_steps[key])["nodeSelector"] == {
                "nvidia.com/gpu.product": default.gpu_product}, key

    # each cell's GPU steps land on its own node type's pool: the default one and another
    monkeypatch.setenv("ONBOARDING_EXECUTOR", "k8s")
    assert cfg.step_pods.node_type == "h200"
    for name in ("h200", "b300"):
        node = node_type(name)
        # The code location's env (deploy/helm/values.yaml) names the default node type; a
        # cell's GPU step sets its own after it, and the kubelet applies the last definition.
        cell_steps = render_all(onboard_cell, _cell_executor_config("some-model", name),
                                overridden_env=("ONBOARDING_NODE_TYPE",))
        assert set(CELL_STEPS) <= set(cell_steps), name
        assert not set(cell_steps) & ({*GPU_BOUND_ASSETS, "checkpoint"} - set(CELL_STEPS))
        for key in CELL_STEPS:
            pod, container = _pod(cell_steps[key]), _container(cell_steps[key])
            assert pod["nodeSelector"] == {"nvidia.com/gpu.product": node.gpu_product}, \
                (name, key)
            env = {e["name"]: e.get("value") for e in container["env"]}  # the last wins
            assert env["ONBOARDING_NODE_TYPE"] == name, key  # the engine checks it
            assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"]), key
        for key in set(cell_steps) - set(CELL_STEPS):  # judged or rendered: no GPU node
            assert "nvidia.com/gpu.product" not in (_pod(cell_steps[key]).get("nodeSelector")
                                                    or {}), (name, key)


def test_real_checkpoint_step_carries_the_cache_placement(onboard_model, k8s_instance,
                                                         resource_env):
    from dagster._core.execution.api import create_execution_plan

    (step,) = [s for s in create_execution_plan(onboard_model).steps if s.key == "checkpoint"]
    assert {k: step.tags[k] for k in cache_step_tags("checkpoint")} == \
        cache_step_tags("checkpoint")
    rendered = render_step_job(onboard_model, "checkpoint", k8s_instance)
    mounts = {m["name"] for m in _container(rendered)["volumeMounts"]}
    assert "model-cache" in mounts


# ---- node acceptance: the run pod itself is the probe, so it must land on the node ----

def _accept_node_tags(tmp_path, node: str) -> dict[str, str]:
    """Run tags Dagster gives the accept_node run of `node` (launchpad, backfill, sensor all ask
    the job's partitioned config), with gpu-node-01 registered as an h200 in acceptance.yaml."""
    import shutil

    import yaml

    from pipelines.definitions import defs

    config_dir = tmp_path / "configs"
    shutil.copytree(DEFAULT_CONFIG_DIR, config_dir, dirs_exist_ok=True)
    acceptance = yaml.safe_load((config_dir / "acceptance.yaml").read_text())
    acceptance["nodes"] = {"gpu-node-01": {"node_type": "h200"},
                           "h200-slice-1": {"node_type": "h200", "gpus": 1}}
    (config_dir / "acceptance.yaml").write_text(yaml.safe_dump(acceptance))
    job = defs.resolve_job_def("accept_node")
    return dict(job.partitioned_config.get_tags_for_partition_key(node, job_name=job.name))


def _render_run_job(instance, tags: dict[str, str]) -> dict:
    """The run worker Job the K8sRunLauncher (as the Helm values configure it) creates for a
    run with `tags`; only its API client is a recorder."""
    from unittest import mock

    import kubernetes
    from dagster._core.test_utils import create_run_for_test

    repo = ReconstructableRepository.for_module(
        "pipelines.definitions", "defs", working_directory=str(PROJECT_ROOT))
    recon = repo.get_reconstructable_job("accept_node")
    run = create_run_for_test(instance, job_name="accept_node",
                              job_code_origin=recon.get_python_origin(), tags=tags)
    launcher = instance.run_launcher
    launcher._api_client = mock.MagicMock()
    launcher._launch_k8s_job_with_args("dagster-run-test", ["dagster", "api", "execute_run"], run)
    (call,) = [c for c in launcher._api_client.method_calls
               if c[0] == "create_namespaced_job_with_retries"]
    body = kubernetes.client.ApiClient().sanitize_for_serialization(call.kwargs["body"])
    return {"namespace": call.kwargs["namespace"], "job": body}


def test_a_node_acceptance_run_pod_is_pinned_to_its_node_with_all_its_gpus(
        tmp_path, monkeypatch, k8s_instance):
    """accept_node runs its steps in the run's own pod (one after another, no step pods): that
    pod must run on the node it qualifies, holding every GPU the node registers, the NVMe cache
    mounted (storage_read reads it). Before, nothing placed it: it ran wherever the run launcher
    put it, and probed that machine instead."""
    monkeypatch.setenv("ONBOARDING_EXECUTOR", "k8s")
    monkeypatch.setenv("ONBOARDING_CONFIG_DIR", str(tmp_path / "configs"))
    tags = _accept_node_tags(tmp_path, "gpu-node-01")
    assert K8S_CONFIG_TAG in tags, tags
    rendered = _render_run_job(k8s_instance, tags)
    _validate(rendered)
    pod = _pod(rendered)
    assert pod["nodeSelector"]["kubernetes.io/hostname"] == "gpu-node-01"
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == node_type("h200").gpu_product
    limits = _container(rendered)["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == str(node_type("h200").gpus_per_node)
    assert "model-cache" in {m["name"] for m in _container(rendered)["volumeMounts"]}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    sliced = json.loads(_accept_node_tags(tmp_path, "h200-slice-1")[K8S_CONFIG_TAG])
    assert sliced["container_config"]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_an_unregistered_node_cannot_get_a_run_pod_and_local_runs_carry_no_pin(
        tmp_path, monkeypatch):
    monkeypatch.setenv("ONBOARDING_CONFIG_DIR", str(tmp_path / "configs"))
    monkeypatch.setenv("ONBOARDING_EXECUTOR", "multiprocess")
    assert K8S_CONFIG_TAG not in _accept_node_tags(tmp_path, "gpu-node-01")
    monkeypatch.setenv("ONBOARDING_EXECUTOR", "k8s")
    with pytest.raises(Exception, match=r"gpu-node-99.*acceptance.yaml|acceptance.yaml.*gpu-node-99"):
        _accept_node_tags(tmp_path, "gpu-node-99")
