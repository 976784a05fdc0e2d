"""The day-two files of one model: per node type with a manifest, the PrometheusRule,
PodMonitors and ScaledObject (`<node type>-operations.yaml`), the same rules as a plain rule file
(`<node type>-rules.yml`, for `promtool` or a Prometheus without the operator), the Grafana
dashboard (`<node type>-dashboard.json`), and dcgm-exporter's counters file the node rules need.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from onboarding.deploy.dashboard import render_dashboard
from onboarding.deploy.kserve import DeployConfig, metrics_path, to_yaml
from onboarding.deploy.observability import (
    NodeLimits,
    Operations,
    OperationsConfig,
    Target,
    dcgm_counters_csv,
    render_operations,
)
from onboarding.deploy.plan import NodesConfig
from onboarding.deploy.serving_plan import ManifestSet, ServingPlan
from onboarding.fetch.catalog import ModelSpec
from onboarding.serving.stack import Stack
from onboarding.serving.stats import ServingBenchmarkResult, Slo

DCGM_COUNTERS = "dcgm-counters.csv"


@dataclass(frozen=True)
class Rendered:
    target: Target
    ops: Operations
    dashboard: dict


def target_of(spec: ModelSpec, node_type: str, manifests: ManifestSet, splan: ServingPlan,
              nodes: NodesConfig, stack: Stack, deploy: DeployConfig) -> Target:
    c = splan.configs[node_type]
    return Target(model=spec.id, served_name=spec.served_name, node_type=node_type,
                  namespace=deploy.namespace, service=manifests.services[node_type],
                  precision=c.precision, tensor_parallel=c.tensor_parallel, config_hash=c.hash,
                  port=deploy.container_port, metrics_path=metrics_path(c, stack, deploy),
                  gpu_product=nodes.node_types[node_type].gpu_product,
                  llm_inference_service=node_type in deploy.llm_inference_service_node_types)


def render_all(spec: ModelSpec, manifests: ManifestSet, splan: ServingPlan, nodes: NodesConfig,
               stack: Stack, deploy: DeployConfig, slos: dict[str, Slo],
               limits: dict[str, NodeLimits | None], bench: ServingBenchmarkResult | None,
               ops: OperationsConfig) -> list[Rendered]:
    """Every node type the manifests were rendered for, from the same configuration."""
    out = []
    for nt in sorted(manifests.files):
        t = target_of(spec, nt, manifests, splan, nodes, stack, deploy)
        metrics = stack.templates[splan.configs[nt].engine].metrics
        o = render_operations(t, metrics, slos[nt], bench, limits.get(nt), ops)
        out.append(Rendered(t, o, render_dashboard(t, o, ops.evaluation.window)))
    return out


def files_of(rendered: list[Rendered], stack_fingerprint: str) -> dict[str, str]:
    files = {}
    for r in rendered:
        t = r.target
        head = (f"Rendered by model-onboarding for {t.model} on {t.node_type}; configuration "
                f"{t.config_hash}; stack {stack_fingerprint}.")
        skipped = "".join(f"\nNot rendered: {k}: {v}" for k, v in sorted(r.ops.skipped.items()))
        files[f"{t.node_type}-operations.yaml"] = to_yaml(r.ops.docs, head + skipped)
        files[f"{t.node_type}-rules.yml"] = to_yaml(
            [r.ops.rule_file()], f"{head}\nCheck: promtool check rules {t.node_type}-rules.yml")
        files[f"{t.node_type}-dashboard.json"] = json.dumps(r.dashboard, indent=1) + "\n"
    if rendered:
        files[DCGM_COUNTERS] = ("# dcgm-exporter counters the node rules read (dcgm-exporter "
                                "-f); the default counters leave ECC and NVLink errors out.\n"
                                + dcgm_counters_csv())
    return files
