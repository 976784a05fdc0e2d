"""Render the Kubernetes Job that dagster-k8s would create for one step, without a cluster.

The executor's own step handler builds the Job (container context merge, construct_dagster_k8s_job);
only the Kubernetes API client is a recorder, since no cluster exists here. The Job comes back as
the camelCase mapping `kubectl apply` would send.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import kubernetes
import yaml
from dagster._config import process_config
from dagster._core.definitions.reconstruct import ReconstructableJob
from dagster._core.execution.api import create_execution_plan
from dagster._core.execution.context.system import PlanData, PlanOrchestrationContext
from dagster._core.execution.context_creation_job import create_context_free_log_manager
from dagster._core.execution.retries import RetryMode
from dagster._core.executor.init import InitExecutorContext
from dagster._core.executor.step_delegating.step_handler.base import StepHandlerContext
from dagster._core.test_utils import create_run_for_test
from dagster._grpc.types import ExecuteStepArgs
from dagster_k8s.client import DagsterKubernetesClient

from onboarding.common.paths import PROJECT_ROOT
from pipelines.executors import onboarding_executor

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: never-contacted
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: nobody
  user: {token: "not-a-secret"}
contexts:
- name: test
  context: {cluster: never-contacted, user: nobody, namespace: onboarding}
current-context: test
"""


def k8s_run_launcher_overrides(kubeconfig_file: str) -> dict[str, Any]:
    """The K8sRunLauncher as deploy/helm/values.yaml configures it (volumes, labels, run pod
    resources), so step pods are rendered on top of what the chart really sets."""
    values = yaml.safe_load((PROJECT_ROOT / "deploy" / "helm" / "values.yaml").read_text())
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    run_k8s = launcher["runK8sConfig"]
    return {
        "run_launcher": {
            "module": "dagster_k8s",
            "class": "K8sRunLauncher",
            "config": {
                "service_account_name": values["global"]["serviceAccountName"],
                "instance_config_map": "dagster-instance",
                "postgres_password_secret": values["global"]["postgresqlSecretName"],
                "dagster_home": values["global"]["dagsterHome"],
                "job_image": "registry.example.com/model-onboarding:0.1.0",
                "job_namespace": "onboarding",
                "load_incluster_config": False,
                "kubeconfig_file": kubeconfig_file,
                "volumes": launcher["volumes"],
                "volume_mounts": launcher["volumeMounts"],
                "labels": launcher["labels"],
                "fail_pod_on_run_failure": launcher["failPodOnRunFailure"],
                "run_k8s_config": {"container_config": run_k8s["containerConfig"]},
            },
        }
    }


def code_location_container_context() -> dict[str, Any]:
    """What the chart hands runs from the user deployment (includeConfigInLaunchedRuns)."""
    values = yaml.safe_load((PROJECT_ROOT / "deploy" / "helm" / "values.yaml").read_text())
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    return {
        "k8s": {
            "env": deployment["env"],
            "env_secrets": [s["name"] for s in deployment["envSecrets"]],
            "volumes": deployment["volumes"],
            "volume_mounts": deployment["volumeMounts"],
        }
    }


def render_step_job(
    recon_job: ReconstructableJob,
    step_key: str,
    instance,
    executor_config: dict[str, Any] | None = None,
    run_tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    executor_def = onboarding_executor("k8s")
    processed = process_config(
        executor_def.config_schema.config_type, executor_config or {}
    )
    assert processed.success, processed.errors
    executor = executor_def.executor_creation_fn(
        InitExecutorContext(
            job=recon_job,
            executor_def=executor_def,
            executor_config=processed.value,
            instance=instance,
        )
    )
    batch_api = mock.MagicMock()
    handler = executor._step_handler  # the executor's own handler; only its API is recorded
    handler._api_client = DagsterKubernetesClient.production_client(
        batch_api_override=batch_api, core_api_override=mock.MagicMock()
    )

    origin = recon_job.get_python_origin()
    origin = origin._replace(
        repository_origin=origin.repository_origin._replace(
            container_context=code_location_container_context()
        )
    )
    run = create_run_for_test(
        instance, job_name=recon_job.get_definition().name, job_code_origin=origin, tags=run_tags
    )
    plan = create_execution_plan(recon_job)
    plan_context = PlanOrchestrationContext(
        plan_data=PlanData(
            job=recon_job,
            dagster_run=run,
            instance=instance,
            execution_plan=plan,
            raise_on_error=True,
            retry_mode=RetryMode.DISABLED,
        ),
        log_manager=create_context_free_log_manager(instance, run),
        executor=executor,
        output_capture=None,
    )
    context = StepHandlerContext(
        instance=instance,
        plan_context=plan_context,
        steps=plan.steps,
        execute_step_args=ExecuteStepArgs(origin, run.run_id, [step_key]),
    )
    list(handler.launch_step(context))

    calls = [c for c in batch_api.method_calls if c[0] == "create_namespaced_job"]
    assert len(calls) == 1, batch_api.method_calls
    _name, _args, kwargs = calls[0]
    body = kubernetes.client.ApiClient().sanitize_for_serialization(kwargs["body"])
    return {"namespace": kwargs["namespace"], "job": body}
