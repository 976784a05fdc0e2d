"""deploy/helm/values.yaml: the parts the project relies on, checked for structure and against
the Kubernetes schemas.

The Dagster chart itself (and its values.schema.json) is published only in its own Helm
repository, which no registry reachable here (PyPI, Debian, npm) mirrors; so the chart's schema
check runs only where the chart has been pulled: set DAGSTER_HELM_CHART_DIR to the directory of
`helm pull dagster/dagster --version 1.13.27 --untar`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import dagster as dg
import kubernetes_validate
import pytest
import yaml

from assets.step_tags import GPU_BOUND_ASSETS
from onboarding.common.paths import PROJECT_ROOT
from resources.manifest_validator import DEFAULT_CRD_DIR, DEFAULT_CRDS

VALUES = yaml.safe_load((PROJECT_ROOT / "deploy" / "helm" / "values.yaml").read_text())
K8S_VERSION = "1.33.0"
DAGSTER_VERSION = "1.13.27"


def _deployment() -> dict[str, Any]:
    (deployment,) = VALUES["dagster-user-deployments"]["deployments"]
    return deployment


def _env() -> dict[str, str]:
    return {e["name"]: e["value"] for e in _deployment()["env"]}


def _k8s_launcher() -> dict[str, Any]:
    return VALUES["runLauncher"]["config"]["k8sRunLauncher"]


def _validate_as_pod(name: str, volumes: list, mounts: list, env: list | None = None) -> None:
    """Fragments of a pod spec, validated strictly by putting them in a Pod."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "volumes": volumes,
            "containers": [
                {"name": "c", "image": "x", "volumeMounts": mounts, "env": env or []}
            ],
        },
    }
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    declared = {v["name"] for v in volumes}
    assert {m["name"] for m in mounts} <= declared, f"{name}: a mount names no volume"


def test_k8s_run_launcher_and_k8s_executor():
    assert VALUES["runLauncher"]["type"] == "K8sRunLauncher"
    assert _k8s_launcher()["loadInclusterConfig"] is True
    assert _env()["ONBOARDING_EXECUTOR"] == "k8s"


def test_user_code_deployment_runs_this_code_location():
    deployment = _deployment()
    args = deployment["codeServerArgs"]
    module, attribute = args[args.index("-m") + 1], args[args.index("-a") + 1]
    assert (PROJECT_ROOT / Path(*module.split("."))).with_suffix(".py").is_file()
    assert f"\n{attribute} = " in (PROJECT_ROOT / "pipelines" / "definitions.py").read_text()
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True
    assert deployment["image"]["repository"].endswith("/model-onboarding")
    dockerfile = (PROJECT_ROOT / "deploy" / "Dockerfile").read_text()
    assert f'"-p", "{deployment["port"]}"' in dockerfile


def test_step_pod_settings_point_at_real_config():
    env = _env()
    nodes = yaml.safe_load((PROJECT_ROOT / "configs" / "nodes.yaml").read_text())["node_types"]
    assert env["ONBOARDING_NODE_TYPE"] in nodes
    assert env["ONBOARDING_GPU_IMAGE"].split(":")[0].endswith("/model-onboarding-gpu")
    cluster = yaml.safe_load((PROJECT_ROOT / "configs" / "cluster.yaml").read_text())
    assert env["ONBOARDING_CACHE_ROOT"] == cluster["step_pods"]["cache"]["mount_path"]
    assert set(cluster["step_pods"]["gpus"]) == set(GPU_BOUND_ASSETS)


def test_kserve_crds_come_from_the_image():
    """kserve_manifest validates against the pinned release's CRDs, which the CPU image copies
    to where the validator's default looks (WORKDIR/deploy/kserve-crds/); the Helm values set no
    KSERVE_CRD_PATHS, so the shipped set is what runs unless a deployer overrides it."""
    dockerfile = (PROJECT_ROOT / "deploy" / "Dockerfile").read_text()
    (workdir,) = re.findall(r"^WORKDIR (\S+)$", dockerfile, flags=re.MULTILINE)
    (target,) = re.findall(r"^COPY deploy/kserve-crds/ (\S+)$", dockerfile, flags=re.MULTILINE)
    image_root = Path(workdir)
    assert image_root / target == image_root / DEFAULT_CRD_DIR.relative_to(PROJECT_ROOT)
    assert "KSERVE_CRD_PATHS" not in _env()
    assert all((DEFAULT_CRD_DIR / name).is_file() for name in DEFAULT_CRDS)
    ignore = (PROJECT_ROOT / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
    assert "!deploy/kserve-crds/" in ignore


def test_configmaps_replace_files_that_exist_in_configs():
    deployment = _deployment()
    config_dir = Path(_env()["ONBOARDING_CONFIG_DIR"])
    _validate_as_pod("code-location", deployment["volumes"], deployment["volumeMounts"],
                     deployment["env"])
    by_volume: dict[str, list] = {}
    for mount in deployment["volumeMounts"]:
        by_volume.setdefault(mount["name"], []).append(mount)
    (models,) = by_volume["onboarding-models"]
    assert Path(models["mountPath"]) == config_dir / "models"
    mounted = set()
    for mount in by_volume["onboarding-configs"]:
        assert Path(mount["mountPath"]) == config_dir / mount["subPath"]
        assert (PROJECT_ROOT / "configs" / mount["subPath"]).is_file(), mount["subPath"]
        mounted.add(mount["subPath"])
    # The files an operator edits for a cluster are all replaceable.
    assert {"cluster.yaml", "nodes.yaml", "stack.yaml", "gates.yaml"} <= mounted


def test_io_manager_storage_is_one_shared_volume_for_runs_steps_and_webserver():
    storage = f"{VALUES['global']['dagsterHome']}/storage"
    launcher = _k8s_launcher()
    _validate_as_pod("run", launcher["volumes"], launcher["volumeMounts"])
    webserver = VALUES["dagsterWebserver"]
    _validate_as_pod("webserver", webserver["volumes"], webserver["volumeMounts"])
    assert _env()["ONBOARDING_OUTPUT_DIR"].startswith(storage + "/")
    claims = set()
    for part in (launcher, webserver):
        (mount,) = [m for m in part["volumeMounts"] if m["mountPath"] == storage]
        (volume,) = [v for v in part["volumes"] if v["name"] == mount["name"]]
        claims.add(volume["persistentVolumeClaim"]["claimName"])
    assert len(claims) == 1
    (pvc,) = yaml.safe_load_all((PROJECT_ROOT / "deploy" / "k8s" / "storage.yaml").read_text())
    kubernetes_validate.validate(pvc, K8S_VERSION, strict=True)
    assert pvc["metadata"]["name"] in claims
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_postgres_password_never_in_values():
    pg = VALUES["postgresql"]
    assert pg["enabled"] is False and pg["postgresqlHost"]
    assert pg["postgresqlPassword"] == ""
    assert VALUES["generatePostgresqlPasswordSecret"] is False
    assert VALUES["global"]["postgresqlSecretName"]


def test_daemon_runs_sensors_schedules_and_retries_lost_runs_only():
    daemon = VALUES["dagsterDaemon"]
    assert daemon["enabled"] is True
    assert daemon["runRetries"]["enabled"] is True
    assert daemon["runRetries"]["maxRetries"] >= 1
    assert daemon["runRetries"]["retryOnAssetOrOpFailure"] is False
    assert daemon["runMonitoring"]["enabled"] is True
    assert daemon["sensors"]["useThreads"] is True
    assert daemon["schedules"]["useThreads"] is True


def test_gpu_pool_is_enforced_per_op():
    pools = VALUES["concurrency"]["pools"]
    assert VALUES["concurrency"]["enabled"] is True
    assert pools["granularity"] == "op" and pools["defaultLimit"] >= 1
    assert VALUES["telemetry"]["enabled"] is False


def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: _deep_merge(base.get(k), v) if k in base else v for k, v in over.items()} | {
            k: v for k, v in base.items() if k not in over
        }
    return over


@pytest.mark.skipif(
    not os.environ.get("DAGSTER_HELM_CHART_DIR"),
    reason="the Dagster Helm chart is not obtainable from PyPI/Debian/npm here; set "
    "DAGSTER_HELM_CHART_DIR to `helm pull dagster/dagster --version 1.13.27 --untar`",
)
def test_values_validate_against_the_chart_schema():
    import json

    import jsonschema
    from referencing import Registry, Resource
    from referencing.exceptions import NoSuchResource
    from referencing.jsonschema import DRAFT7 as DRAFT

    # The chart's schema refers to Kubernetes definitions by URL; answer those from the
    # definitions kubernetes-validate ships, so the check stays offline.
    k8s_definitions = json.loads(
        (Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
         / f"v{K8S_VERSION}-local" / "_definitions.json").read_text()
    )

    # kubernetes-validate keys them under $defs; the chart points into definitions/.
    k8s_definitions["definitions"] = k8s_definitions["$defs"]

    def retrieve(uri: str) -> Resource:
        if uri.endswith("_definitions.json"):
            return Resource.from_contents(k8s_definitions, default_specification=DRAFT)
        raise NoSuchResource(ref=uri)

    chart = Path(os.environ["DAGSTER_HELM_CHART_DIR"])
    assert yaml.safe_load((chart / "Chart.yaml").read_text())["version"] == DAGSTER_VERSION
    defaults = yaml.safe_load((chart / "values.yaml").read_text())
    schema = json.loads((chart / "values.schema.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(
        schema, registry=Registry(retrieve=retrieve)
    )
    errors = sorted(validator.iter_errors(_deep_merge(defaults, VALUES)), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:20])


def test_the_cluster_instance_refuses_a_plan_only_fetch_at_submission():
    """The daemon's and the webserver's instance get the project's run coordinator, as the
    chart renders `customRunCoordinator` (module, class, config) into dagster.yaml
    (helm/dagster/templates/helpers/instance/_run-coordinator.tpl, dagster 1.13.27): it loads
    from exactly those values, and both pods run the image that holds it and read the catalog
    where the code server does. With Dagster's plain queue a plan-only model's run would start
    a run pod before its first step refused."""
    from pipelines.run_coordinator import OnboardingRunCoordinator

    daemon, web = VALUES["dagsterDaemon"], VALUES["dagsterWebserver"]
    coordinator = daemon["runCoordinator"]
    assert coordinator["enabled"] is True and coordinator["type"] == "CustomRunCoordinator"
    custom = coordinator["config"]["customRunCoordinator"]
    with dg.instance_for_test(overrides={"run_coordinator": {
            "module": custom["module"], "class": custom["class"],
            "config": custom["config"]}}) as instance:
        assert isinstance(instance.run_coordinator, OnboardingRunCoordinator)
        assert instance.run_coordinator.get_run_queue_config().max_concurrent_runs == \
            custom["config"]["max_concurrent_runs"]
    code = _deployment()
    catalog = _env()["ONBOARDING_CONFIG_DIR"] + "/models"
    for name, pod in (("dagsterDaemon", daemon), ("dagsterWebserver", web)):
        assert pod["image"]["repository"] == code["image"]["repository"], name
        assert pod["image"]["tag"] == code["image"]["tag"], name
        env = {e["name"]: e["value"] for e in pod["env"]}
        assert env["ONBOARDING_CONFIG_DIR"] == _env()["ONBOARDING_CONFIG_DIR"], name
        mounts = {m["mountPath"]: m["name"] for m in pod["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes[mounts[catalog]]["configMap"]["name"] == "onboarding-models", name
