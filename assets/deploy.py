"""Plan and render: `deployment_plan` -> `kserve_manifest` -> `gateway_routes`, with their gates.

Upstream results are read from the instance, not through the IO manager: plan-only models are
never fetched, quantized or benchmarked, so `checkpoint`, `serving_variant`, `load_timing` and
`serving_benchmark` are lineage (`deps`) whose latest materialization for this partition is used
when it exists and reported absent when it does not.
"""

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from assets.stack import stack_metadata
from onboarding.catalog import ModelSpec, load_catalog, resolve
from onboarding.errors import OnboardingError
from onboarding.kserve import (
    Rendered,
    RenderInputs,
    Route,
    gib,
    inline_secret_findings,
    load_deploy,
    load_stack,
    output_dir,
    render,
    route_table,
    source_precision,
    to_yaml,
    write_atomic,
)
from onboarding.paths import config_dir, models_dir
from onboarding.plan import (
    DeploymentPlan,
    load_nodes,
    measured_from_metadata,
    param_count_from_safetensors,
    plan,
    plan_inputs,
    plan_rows,
    shape_from_checkpoint,
    shape_from_hint,
)
from pipelines.partitions import models_partitions
from resources.manifest_validator import ManifestValidator

UPSTREAM = ("checkpoint", "serving_variant", "load_timing", "serving_benchmark")
GROUP = "deploy"
# Environment variables whose values must never show up in a rendered file.
SECRET_ENV_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "HF_TOKEN",
                   "HUGGING_FACE_HUB_TOKEN")


def read_upstream(instance: dg.DagsterInstance, partition_key: str,
                  assets: tuple[str, ...] = UPSTREAM) -> dict[str, dict[str, Any]]:
    """Latest materialization metadata of each upstream asset for this partition (plain values).

    An asset never materialized for the partition is simply missing from the result.
    """
    out: dict[str, dict[str, Any]] = {}
    for name in assets:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(name), asset_partitions=[partition_key]),
            limit=1,
        ).records
        if records and records[0].asset_materialization is not None:
            md = records[0].asset_materialization.metadata
            out[name] = {k: getattr(v, "value", v) for k, v in md.items()}
    return out


def _spec(key: str) -> ModelSpec:
    return resolve(load_catalog(models_dir()), key)


def _checkpoint_dir(upstream: dict[str, dict[str, Any]]) -> Path | None:
    path = upstream.get("checkpoint", {}).get("cache_path")
    if path and (Path(path) / "config.json").is_file():
        return Path(path)
    return None


def build_plan(spec: ModelSpec, upstream: dict[str, dict[str, Any]]) -> DeploymentPlan:
    """The model's shape from its checkpoint when fetched, else from the catalog's hint."""
    nodes = load_nodes(config_dir() / "nodes.yaml")
    ckpt = _checkpoint_dir(upstream)
    if ckpt is not None:
        shape, params = shape_from_checkpoint(ckpt), param_count_from_safetensors(ckpt)
    elif spec.architecture is not None:
        shape = shape_from_hint(spec.architecture, f"catalog {spec.id}: architecture (declared)")
        params = None
    else:
        raise OnboardingError(
            f"deployment plan for {spec.id!r}",
            "no checkpoint materialization with a config.json and no architecture hint",
            "Materialize `checkpoint` for this partition first, or add `architecture:` to the "
            "catalog entry (required for plan_only models).",
        )
    measured = measured_from_metadata(upstream)
    return plan(plan_inputs(spec, nodes, shape, measured, params), nodes)


def _md_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("" if r[c] is None else str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def _version(payload: Any) -> dg.DataVersion:
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return dg.DataVersion(hashlib.sha256(blob).hexdigest()[:16])


@dg.asset(
    partitions_def=models_partitions,
    deps=[dg.AssetKey(k) for k in UPSTREAM],
    group_name=GROUP,
    description="GPUs and tensor parallelism per node type from weight bytes, KV budget and "
    "runtime reserve; measured throughput where a benchmark on that node type exists.",
)
def deployment_plan(context: dg.AssetExecutionContext) -> dg.Output[DeploymentPlan]:
    spec = _spec(context.partition_key)
    upstream = read_upstream(context.instance, context.partition_key)
    result = build_plan(spec, upstream)
    inputs, m = result.inputs, result.inputs.measured
    plan_json = result.to_dict()
    path = write_atomic(output_dir() / spec.id / "plan.json", json.dumps(plan_json, indent=1))
    feasible = [n.node_type for n in result.nodes if n.feasible]
    return dg.Output(
        result,
        data_version=_version(plan_json),
        metadata={
            "plan": dg.MetadataValue.md(_md_table(plan_rows(result))),
            "plan_path": dg.MetadataValue.path(str(path)),
            "feasible_node_types": dg.MetadataValue.text(", ".join(feasible) or "none"),
            "weights_basis": dg.MetadataValue.text(
                "measured" if m.variant_weight_bytes else f"estimate ({inputs.param_count_origin})"),
            "model_config_origin": dg.MetadataValue.text(inputs.shape.origin),
            "upstream_present": dg.MetadataValue.text(", ".join(sorted(upstream)) or "none"),
            "upstream_absent": dg.MetadataValue.text(
                ", ".join(k for k in UPSTREAM if k not in upstream) or "none"),
            "target_concurrency": inputs.target_concurrency,
            "context_tokens": inputs.context_tokens,
            "gpu_memory_utilization": inputs.gpu_memory_utilization,
            "tokens_per_s_per_gpu": (dg.MetadataValue.float(m.tokens_per_s_per_gpu)
                                     if m.tokens_per_s_per_gpu is not None
                                     else dg.MetadataValue.text("absent (never benchmarked)")),
            "benchmark_node_type": dg.MetadataValue.text(m.benchmark_node_type or "absent"),
            **stack_metadata(),
        },
    )


@dg.asset_check(asset=deployment_plan, blocking=True, partitions_def=models_partitions,
                description="At least one target node type (deploy.yaml) can serve the model.")
def plan_fits_a_target_node_type(deployment_plan: DeploymentPlan) -> dg.AssetCheckResult:
    targets = load_deploy(config_dir() / "deploy.yaml").target_node_types
    nodes = {n.node_type: n for n in deployment_plan.nodes}
    unknown = [t for t in targets if t not in nodes]
    fits = {t: nodes[t].feasible for t in targets if t in nodes}
    return dg.AssetCheckResult(
        passed=any(fits.values()) and not unknown,
        metadata={
            "target_node_types": dg.MetadataValue.json(targets),
            "unknown_node_types": dg.MetadataValue.json(unknown),
            "why": dg.MetadataValue.md("\n".join(
                f"- **{t}**: {nodes[t].reason}" for t in targets if t in nodes)),
        },
    )


@dataclass(frozen=True)
class ManifestSet:
    """Rendered files of one model, one per target node type whose plan is feasible."""

    model: str
    files: dict[str, str]  # node type -> path of the multi-document YAML
    services: dict[str, str]  # node type -> InferenceService name
    routes: tuple[Route, ...]
    skipped: dict[str, str]  # node type -> why no manifest


@dg.asset(
    partitions_def=models_partitions,
    group_name=GROUP,
    description="InferenceService (+ ServingRuntime) per target node type, written under "
    "ONBOARDING_OUTPUT_DIR and validated against the configured KServe CRDs.",
)
def kserve_manifest(context: dg.AssetExecutionContext, deployment_plan: DeploymentPlan,
                    manifest_validator: ManifestValidator) -> dg.Output[ManifestSet]:
    spec = _spec(context.partition_key)
    cfg_dir = config_dir()
    deploy, stack = load_deploy(cfg_dir / "deploy.yaml"), load_stack(cfg_dir / "stack.yaml")
    nodes = load_nodes(cfg_dir / "nodes.yaml")
    ckpt = _checkpoint_dir(read_upstream(context.instance, context.partition_key, ("checkpoint",)))
    src_prec = source_precision(
        json.loads((ckpt / "config.json").read_text()).get("dtype") if ckpt else None)
    rendered: list[Rendered] = []
    skipped: dict[str, str] = {}
    for nt in deploy.target_node_types:
        node_plan = deployment_plan.node(nt)
        if not node_plan.feasible:
            skipped[nt] = node_plan.reason
            continue
        rendered.append(render(RenderInputs(spec, deployment_plan, nt, nodes.node_types[nt],
                                            stack, deploy, src_prec)))
    if not rendered:
        raise OnboardingError(
            f"kserve_manifest for {spec.id!r}", "no target node type has a feasible plan: "
            + "; ".join(f"{k}: {v}" for k, v in skipped.items()),
            "Add a node type that fits to deploy.yaml target_node_types, or lower the model's "
            "context/concurrency or precision.",
        )
    files, errors, md = {}, {}, []
    for r in rendered:
        header = (f"Rendered by model-onboarding for {spec.id} on {r.node_type}; stack "
                  f"{stack.fingerprint}.\nStartup probe: {r.startup.explanation}")
        text = to_yaml(r.docs, header)
        path = write_atomic(output_dir() / spec.id / f"{r.node_type}.yaml", text)
        files[r.node_type] = str(path)
        for doc in r.docs:
            for line in manifest_validator.validate(doc):
                errors.setdefault(r.node_type, []).append(f"{doc['kind']}: {line}")
        md.append(f"### {r.service} ({r.node_type})\n\n```yaml\n{text}```")
    valid = not errors
    value = ManifestSet(spec.id, files, {r.node_type: r.service for r in rendered},
                        tuple(r.route for r in rendered), skipped)
    metadata: dict[str, Any] = {
        "manifests": dg.MetadataValue.md("\n\n".join(md)),
        "services": dg.MetadataValue.json(value.services),
        "schema_valid": valid,
        "schema_errors": dg.MetadataValue.json(errors),
        "skipped_node_types": dg.MetadataValue.json(skipped),
        "probe_basis": dg.MetadataValue.text(rendered[0].startup.explanation),
        "stack_fingerprint": dg.MetadataValue.text(stack.fingerprint),
        # Only valid manifests enter the gateway's route table.
        "routes": dg.MetadataValue.json([r.__dict__ for r in value.routes] if valid else []),
        **stack_metadata(),
    }
    for nt, path in files.items():
        metadata[f"path_{nt}"] = dg.MetadataValue.path(path)
        node = deployment_plan.node(nt)
        metadata[f"tp_{nt}"] = node.tensor_parallel
        metadata[f"weights_gib_{nt}"] = gib(node.weight_bytes or 0)
    texts = {nt: Path(p).read_text() for nt, p in files.items()}
    return dg.Output(value, metadata=metadata, data_version=_version(texts))


@dg.asset_check(asset=kserve_manifest, blocking=True, partitions_def=models_partitions,
                description="Every rendered document validates against the configured KServe "
                "CRD schemas (and `kubectl apply --dry-run=server` when a context is set).")
def manifests_valid(kserve_manifest: ManifestSet,
                    manifest_validator: ManifestValidator) -> dg.AssetCheckResult:
    errors: dict[str, list[str]] = {}
    dry_runs: dict[str, str] = {}
    for nt, path in kserve_manifest.files.items():
        for doc, problems in manifest_validator.validate_file(Path(path)).items():
            if problems:
                errors[f"{nt} {doc}"] = problems
        run = manifest_validator.dry_run(Path(path))
        dry_runs[nt] = run.output
        if run.ran and not run.ok:
            errors[f"{nt} kubectl dry-run"] = [run.output]
    return dg.AssetCheckResult(
        passed=not errors,
        metadata={
            "errors": dg.MetadataValue.json(errors),
            "error_count": sum(len(v) for v in errors.values()),
            "crd_paths": dg.MetadataValue.json(manifest_validator.resolved_crd_paths()),
            "server_dry_run": dg.MetadataValue.json(dry_runs),
        },
    )


@dg.asset_check(asset=kserve_manifest, blocking=True, partitions_def=models_partitions,
                description="No credential appears inline in a rendered file: only service "
                "accounts and secretKeyRefs.")
def no_inline_secrets(kserve_manifest: ManifestSet) -> dg.AssetCheckResult:
    import yaml

    values = tuple(v for k in SECRET_ENV_VARS if (v := os.environ.get(k)))
    findings = []
    for nt, path in kserve_manifest.files.items():
        text = Path(path).read_text()
        docs = [d for d in yaml.safe_load_all(text) if d]
        findings += [f"{nt}: {f}" for f in inline_secret_findings(docs, values)]
        findings += [f"{nt}: raw text contains a secret value" for v in values
                     if len(v) >= 8 and v in text]
    return dg.AssetCheckResult(
        passed=not findings,
        metadata={"findings": dg.MetadataValue.json(sorted(set(findings))),
                  "secret_env_vars_checked": dg.MetadataValue.json(
                      [k for k in SECRET_ENV_VARS if os.environ.get(k)])},
    )


def read_routes(instance: dg.DagsterInstance) -> list[Route]:
    """Routes of every registered model's latest valid `kserve_manifest`."""
    routes = []
    for key in sorted(instance.get_dynamic_partitions(models_partitions.name)):
        facts = read_upstream(instance, key, ("kserve_manifest",)).get("kserve_manifest", {})
        routes += [Route(**r) for r in facts.get("routes") or []]
    return routes


@dg.asset(
    partitions_def=models_partitions,
    deps=[kserve_manifest],
    group_name=GROUP,
    description="LiteLLM-compatible route table (served model name -> InferenceService) over "
    "every onboarded model, so one gateway endpoint fronts them all.",
)
def gateway_routes(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    deploy = load_deploy(config_dir() / "deploy.yaml")
    routes = read_routes(context.instance)
    table = route_table(routes, deploy)
    text = to_yaml([table], "LiteLLM proxy config rendered by model-onboarding "
                   "(litellm --config litellm-config.yaml).")
    path = write_atomic(output_dir() / "gateway" / "litellm-config.yaml", text)
    rows = [{"model_name": r.served_name, "service": r.service, "node_type": r.node_type,
             "precision": r.precision, "tp": r.tensor_parallel} for r in routes]
    return dg.MaterializeResult(
        data_version=_version(table),
        metadata={
            "path": dg.MetadataValue.path(str(path)),
            "routes": dg.MetadataValue.md(_md_table(rows)),
            "route_count": len(routes),
            "models": len({r.served_name for r in routes}),
            "config": dg.MetadataValue.md(f"```yaml\n{text}```"),
        },
    )


defs = dg.Definitions(
    assets=[deployment_plan, kserve_manifest, gateway_routes],
    asset_checks=[plan_fits_a_target_node_type, manifests_valid, no_inline_secrets],
)
