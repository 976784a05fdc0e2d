"""Plan, publish and render: `serving_config` -> `published_variant` -> `kserve_manifest` ->
`gateway_routes`, with their gates.

`serving_config` computes, once and before anything is timed, the configuration each node type
runs (onboarding/deploy/serving_plan.py); the serving assets start exactly that configuration and
`kserve_manifest` renders exactly it, with what was measured at its hash. Upstream results
arrive as the values their assets stored through the `optional_upstream` input manager:
plan-only models are never fetched, quantized, published or benchmarked, so an upstream
partition never materialized arrives as None and is reported absent, never filled in. A
performance twin (random weights) is planned and configured like any model, but never
published nor rendered as a manifest: both refuse, saying why (docs/twins.md).
"""

import hashlib
import json
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from assets.checks import not_applicable_check
from assets.model_spec import MODEL_SPEC, spec_metadata
from assets.partitions import (
    CELL_DERIVED,
    FLEET,
    cells_partitions,
    model_of,
    models_partitions,
    node_type_of,
)
from assets.stack import SERVING_STACK, stack_metadata
from assets.step_tags import cache_step_tags
from onboarding.common.errors import OnboardingError
from onboarding.common.files import write_atomic
from onboarding.common.refs import CheckpointRef, PublishedVariant, VariantRef
from onboarding.common.tables import md_table
from onboarding.deploy.cluster_prereqs import render_prerequisites
from onboarding.deploy.kserve import (
    Rendered,
    agent_model_dir,
    checkpoint_dtype,
    gib,
    inline_secret_findings,
    route_table,
    split_routes,
    to_yaml,
)
from onboarding.deploy.plan import (
    DeploymentPlan,
    build_plan,
    fetched_checkpoint_dir,
    plan_rows,
)
from onboarding.deploy.serving_plan import (
    ManifestSet,
    ServingPlan,
    render_targets,
    serving_plan,
    with_cell_search,
    with_engine_choices,
    with_searched,
    with_sla_choices,
)
from onboarding.fetch import twins
from onboarding.predictions.predict import PredictionTable
from onboarding.quantize.variants import AccuracyReport, QuantizedSet
from onboarding.serving.searched import CellSearch
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult
from resources.cache_filler import prefill
from resources.config_files import ConfigFiles, OutputDirs
from resources.huggingface import HuggingFaceStore
from resources.manifest_validator import ManifestValidator
from resources.publisher import publish_variant
from resources.s3 import S3ObjectStore
from resources.upstream import by_cell

GROUP = "deploy"
OPTIONAL = "optional_upstream"
PLAN_CHECK = "plan_fits_a_target_node_type"
PUBLISHED_CHECK = "variants_published_and_verified"
VALID_CHECK = "manifests_valid"
SECRETS_CHECK = "no_inline_secrets"


def _optional(*names: str) -> dict[str, dg.AssetIn]:
    return {n: dg.AssetIn(input_manager_key=OPTIONAL) for n in names}


def _passed(accuracy: AccuracyReport | None) -> tuple[str, ...] | None:
    return None if accuracy is None else tuple(g.precision for g in accuracy.gates if g.passed)


def _version(payload: Any) -> dg.DataVersion:
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return dg.DataVersion(hashlib.sha256(blob).hexdigest()[:16])


@dg.asset(
    partitions_def=models_partitions,
    ins=_optional("checkpoint", "serving_variant", "accuracy", "predictions"),
    deps=[SERVING_STACK, MODEL_SPEC],
    group_name=GROUP,
    check_specs=[dg.AssetCheckSpec(PLAN_CHECK, asset="serving_config", blocking=True,
                                   partitions_def=models_partitions,
                                   description="At least one target node type (deploy.yaml) "
                                   "can serve the model.")],
    description="Per node type: the GPUs and tensor parallelism the weights, KV budget and "
    "reserve need, and the one engine configuration (args, env, image, hash) that is measured "
    "and deployed there.",
)
def serving_config(context: dg.AssetExecutionContext, configs: ConfigFiles, outputs: OutputDirs,
                   checkpoint: CheckpointRef | None, serving_variant: VariantRef | None,
                   accuracy: AccuracyReport | None, predictions: PredictionTable | None):
    spec = configs.spec(context.partition_key)
    nodes, stack = configs.nodes(), configs.stack()
    result = build_plan(spec, nodes, checkpoint, serving_variant, _passed(accuracy))
    if predictions is not None:
        result = with_sla_choices(result, list(predictions.choices),
                                  configs.predict().plan_node_types)
    splan = with_engine_choices(serving_plan(spec, result, nodes, stack), spec, stack.templates,
                                configs.stack_config(), configs.engine_measurements(),
                                stack.engine)
    splan = with_searched(splan, spec, stack.templates, configs.searched_configs(), nodes, stack)
    body = {"plan": result.to_dict(),
            "configs": {nt: {**c.content(), "hash": c.hash} for nt, c in splan.configs.items()},
            "engines": [c.row() for c in splan.engines]}
    path = write_atomic(outputs.manifests / spec.id / "serving_config.json",
                        json.dumps(body, indent=1, default=str))
    inputs = result.inputs
    yield dg.Output(splan, data_version=_version(body), metadata={
        "configurations": dg.MetadataValue.md(md_table(
            [c.summary() for c in splan.configs.values()])),
        "plan": dg.MetadataValue.md(md_table(plan_rows(result))),
        "engine_choice": dg.MetadataValue.md(md_table([c.row() for c in splan.engines])),
        **search_metadata(splan),
        "path": dg.MetadataValue.path(str(path)),
        "config_hashes": dg.MetadataValue.json({nt: c.hash for nt, c in splan.configs.items()}),
        "tp_basis": dg.MetadataValue.json({n.node_type: n.tp_basis for n in result.nodes
                                           if n.feasible}),
        "weights_basis": "measured" if inputs.measured.variant_weight_bytes
        else f"estimate ({inputs.param_count_origin})",
        "model_config_origin": inputs.shape.origin,
        "upstream_present": ", ".join(k for k, v in (("checkpoint", checkpoint), (
            "serving_variant", serving_variant), ("accuracy", accuracy)) if v is not None)
        or "none",
        "target_concurrency": inputs.target_concurrency,
        "context_tokens": inputs.context_tokens,
        **stack_metadata(configs),
        **spec_metadata(spec),
    })
    yield _fits_check(result, configs.deploy().target_node_types)


def search_metadata(splan: ServingPlan) -> dict[str, Any]:
    """The recorded search winners applied (or why not), each search's table: predicted vs
    measured per candidate, the chosen one, by how much it won, n."""
    if not splan.searched:
        return {}
    tables = "\n\n".join(
        f"### {r.node_type}: {r.base_hash} -> {r.winner_hash} ({r.candidates} measured, "
        f"{r.crashed} crashed; order: {r.basis})\n\n{md_table(list(r.table))}\n\n{r.margin}"
        for r in splan.searched)
    return {"config_search": dg.MetadataValue.md(tables),
            "config_search_applied": dg.MetadataValue.json(dict(splan.search_notes))}


def _fits_check(result: DeploymentPlan, targets: list[str]) -> dg.AssetCheckResult:
    nodes = {n.node_type: n for n in result.nodes}
    unknown = [t for t in targets if t not in nodes]
    return dg.AssetCheckResult(
        check_name=PLAN_CHECK,
        passed=any(nodes[t].feasible for t in targets if t in nodes) and not unknown,
        metadata={"target_node_types": dg.MetadataValue.json(targets),
                  "unknown_node_types": dg.MetadataValue.json(unknown),
                  "why": dg.MetadataValue.md("\n".join(
                      f"- **{t}**: {nodes[t].reason}" for t in targets if t in nodes))})


def _local_dirs(checkpoint: CheckpointRef, quantized: QuantizedSet | None) -> dict[str, Path]:
    """Where each precision lives in the NVMe cache: bf16 is the checkpoint itself."""
    dirs = {"bf16": Path(checkpoint.path)}
    for v in (quantized.variants if quantized else ()):
        if v.usable:
            dirs[v.precision] = Path(v.path)
    return dirs


@dg.asset(
    partitions_def=models_partitions,
    group_name=GROUP,
    kinds={"s3"},
    op_tags=cache_step_tags("published_variant"),  # reads the node's NVMe cache
    check_specs=[dg.AssetCheckSpec(PUBLISHED_CHECK, asset="published_variant", blocking=True,
                                   partitions_def=models_partitions,
                                   description="Every precision a target node type serves is "
                                   "in the serving bucket under its content hash, every file at "
                                   "its size and sha256 (listing + HEAD), bytes read back equal")],
    description="The served precisions uploaded to the serving bucket (deploy.yaml "
    "storage.variants_uri), content-addressed and verified; skipped when already there.",
)
def published_variant(context: dg.AssetExecutionContext, configs: ConfigFiles,
                      s3: S3ObjectStore, checkpoint: CheckpointRef, quantized: QuantizedSet,
                      serving_config: ServingPlan):
    if configs.spec(context.partition_key).is_twin:
        raise twins.refusal(checkpoint.model, "published_variant", "random weights are nothing "
                            "to publish (its variants hold config.json, a tokenizer and at most "
                            "Model Optimizer's export marker)")
    deploy = configs.deploy()
    needed = sorted({c.precision for nt, c in serving_config.configs.items()
                     if nt in deploy.target_node_types})
    dirs = _local_dirs(checkpoint, quantized)
    missing = [p for p in needed if p not in dirs]
    if missing:
        raise OnboardingError(f"published_variant for {checkpoint.model!r}",
                              f"no usable local variant for {', '.join(missing)}",
                              "Re-run quantized; the plan only serves precisions that passed.")
    published = {p: publish_variant(
        s3, dirs[p], checkpoint.model, p,
        deploy.storage.variants_uri.format(model=checkpoint.model, precision=p),
        deploy.storage.read_back_mib, log=context.log.info) for p in needed}
    # this node's KServe cache folder, filled from the files just verified: the download Job
    # then fetches nothing here (docs/deploy.md, "Publishing fills the node it runs on")
    roots = sorted({c.cache_root for c in deploy.local_model_cache.node_types.values()
                    if Path(c.cache_root).is_dir()})
    node_cache: dict[str, str] = {}
    for root in roots:
        for p, v in published.items():
            r = prefill(s3, v.uri, Path(agent_model_dir(root, v.uri)), dirs[p],
                        log=context.log.info)
            node_cache[p] = f"{r.files} files in {r.folder}, {r.bytes_fetched} bytes fetched"
    rows = [{"precision": p, "uri": v.uri, "bytes": v.total_bytes, "files": v.files,
             "uploaded_bytes": v.bytes_uploaded, "skipped": v.skipped,
             "read_gbps": v.read_gbps, "derived_pull_s": v.pull_s,
             "node_cache": node_cache.get(p, "no KServe cache root on this node")}
            for p, v in published.items()]
    yield dg.Output(published, data_version=_version({p: v.uri for p, v in published.items()}),
                    metadata={"published": dg.MetadataValue.md(md_table(rows)),
                              **{f"uri_{p}": v.uri for p, v in published.items()}})
    yield dg.AssetCheckResult(check_name=PUBLISHED_CHECK, passed=bool(published), metadata={
        "verified": "listing + HEAD of every file (size, x-amz-meta-sha256) after upload; the "
        "first bytes of the largest file read back and compared",
        "precisions": dg.MetadataValue.json(needed)})


@dg.asset(
    tags=CELL_DERIVED,
    partitions_def=cells_partitions,
    ins=_optional("checkpoint", "load_timing", "serving_benchmark", "published_variant",
                  "config_search"),
    deps=[SERVING_STACK, MODEL_SPEC],
    group_name=GROUP,
    check_specs=[
        dg.AssetCheckSpec(VALID_CHECK, asset="kserve_manifest", blocking=True,
                          partitions_def=cells_partitions,
                          description="Every rendered document validates against the "
                          "configured KServe CRD schemas (and `kubectl apply "
                          "--dry-run=server` when a context is set)."),
        dg.AssetCheckSpec(SECRETS_CHECK, asset="kserve_manifest", blocking=True,
                          partitions_def=cells_partitions,
                          description="No credential appears inline in a rendered file: only "
                          "service accounts and secretKeyRefs."),
    ],
    description="InferenceService (+ ServingRuntime) of one (model, node type) cell: exactly "
    "the node type's serving configuration, with what was measured at that configuration's hash, the "
    "published storageUri, validated against the configured KServe CRDs.",
)
def kserve_manifest(context: dg.AssetExecutionContext, configs: ConfigFiles, outputs: OutputDirs,
                    serving_config: ServingPlan, checkpoint: CheckpointRef | None,
                    load_timing: LoadTimingResult | None,
                    serving_benchmark: ServingBenchmarkResult | None,
                    published_variant: dict[str, PublishedVariant] | None,
                    config_search: CellSearch | None,
                    manifest_validator: ManifestValidator, s3: S3ObjectStore,
                    hf: HuggingFaceStore):
    spec, node_type = configs.spec(model_of(context)), node_type_of(context)
    if spec.is_twin:
        raise twins.refusal(spec.id, "kserve_manifest", "no deployable manifest is rendered: "
                            "a deployment would serve random weights, and its measurements "
                            "describe the shape, not the model")
    stack = configs.stack()
    # the cell's search winner, as its load timing and sweep measured it: one hash
    serving_config = with_cell_search(serving_config, spec, config_search, configs.nodes(),
                                      stack)
    ckpt = fetched_checkpoint_dir(checkpoint)
    rendered, skipped = render_targets(
        spec, serving_config, configs.nodes(), stack, configs.deploy(),
        checkpoint_dtype(json.loads((ckpt / "config.json").read_text())) if ckpt else None,
        load_timing, serving_benchmark, published_variant, only=node_type)
    if not rendered and node_type not in configs.deploy().target_node_types:
        yield from _nothing_to_render(spec.id, skipped, configs)
        return
    if not rendered:
        raise OnboardingError(
            f"kserve_manifest for {spec.id!r} on {node_type}", "no manifest: "
            + "; ".join(f"{k}: {v}" for k, v in skipped.items()),
            "Add a node type that fits to deploy.yaml target_node_types, lower the model's "
            "context/concurrency or precision, or measure the configuration.")
    texts = {r.node_type: to_yaml(r.docs, f"Rendered by model-onboarding for {spec.id} on "
                                  f"{r.node_type}; stack {stack.fingerprint}; configuration "
                                  f"{r.config_hash}.\nStartup probe: {r.startup.explanation}")
             for r in rendered}
    files = {nt: str(write_atomic(outputs.manifests / spec.id / f"{nt}.yaml", text))
             for nt, text in texts.items()}
    errors, dry_runs = _validate(manifest_validator, rendered, files)
    value = ManifestSet(model=spec.id, files=files,
                        services={r.node_type: r.service for r in rendered},
                        routes=tuple(r.route for r in rendered), skipped=skipped, errors=errors,
                        config_hashes={r.node_type: r.config_hash for r in rendered},
                        measured={r.node_type: r.measured for r in rendered},
                        published={r.node_type: r.published for r in rendered})
    yield dg.Output(value, data_version=_version(texts), metadata={
        **_manifest_metadata(value, rendered, texts, serving_config.plan, stack),
        **stack_metadata(configs), **spec_metadata(spec)})
    yield dg.AssetCheckResult(check_name=VALID_CHECK, passed=value.valid, metadata={
        "errors": dg.MetadataValue.json(errors),
        "error_count": sum(len(v) for v in errors.values()),
        "crd_paths": dg.MetadataValue.json(manifest_validator.resolved_crd_paths()),
        "server_dry_run": dg.MetadataValue.json(dry_runs)})
    yield _secrets_check(rendered, texts, (s3.access_key_id, s3.secret_access_key, hf.token))


def _nothing_to_render(model: str, skipped: dict[str, str], configs: ConfigFiles):
    """A cell whose node type is no deployment target (the embedded `cpu`): its measurements
    stand, its manifest is empty with the reason, and the checks say they had nothing to
    judge."""
    why = "; ".join(f"{k}: {v}" for k, v in sorted(skipped.items()))
    yield dg.Output(ManifestSet(model=model, files={}, services={}, routes=(),
                                skipped=skipped),
                    data_version=_version(skipped), metadata={
                        "rendered": "nothing", "skipped": dg.MetadataValue.json(skipped),
                        **stack_metadata(configs)})
    yield not_applicable_check(VALID_CHECK, why)
    yield not_applicable_check(SECRETS_CHECK, why)


def _validate(validator: ManifestValidator, rendered: list[Rendered], files: dict[str, str]
              ) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Schema errors per document, and the server dry run per file where a context is set."""
    errors: dict[str, list[str]] = {}
    dry_runs: dict[str, str] = {}
    for r in rendered:
        for doc in r.docs:
            problems = validator.validate(doc)
            if problems:
                errors[f"{r.node_type} {doc['kind']}/{doc['metadata']['name']}"] = problems
        run = validator.dry_run(Path(files[r.node_type]))
        dry_runs[r.node_type] = run.output
        if run.ran and not run.ok:
            errors[f"{r.node_type} kubectl dry-run"] = [run.output]
    return errors, dry_runs


def _secrets_check(rendered: list[Rendered], texts: dict[str, str],
                   secrets: tuple[str | None, ...]) -> dg.AssetCheckResult:
    values = tuple(v for v in secrets if v)
    findings = []
    for r in rendered:
        findings += [f"{r.node_type}: {f}" for f in inline_secret_findings(list(r.docs), values)]
        findings += [f"{r.node_type}: raw text contains a secret value" for v in values
                     if len(v) >= 8 and v in texts[r.node_type]]
    return dg.AssetCheckResult(check_name=SECRETS_CHECK, passed=not findings, metadata={
        "findings": dg.MetadataValue.json(sorted(set(findings))),
        "secret_values_checked": len(values)})


def _manifest_metadata(value: ManifestSet, rendered: list[Rendered], texts: dict[str, str],
                       plan: DeploymentPlan, stack) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "manifests": dg.MetadataValue.md("\n\n".join(
            f"### {r.service} ({r.node_type})\n\n```yaml\n{texts[r.node_type]}```"
            for r in rendered)),
        "services": dg.MetadataValue.json(value.services),
        "schema_valid": value.valid,
        "skipped_node_types": dg.MetadataValue.json(value.skipped),
        "probe_basis": rendered[0].startup.explanation,
        "stack_fingerprint": stack.fingerprint,
        "config_hashes": dg.MetadataValue.json(value.config_hashes),
        "measured_at_config": dg.MetadataValue.json(value.measured),
        "published": dg.MetadataValue.json(value.published),
    }
    for nt, path in value.files.items():
        node = plan.node(nt)
        metadata[f"path_{nt}"] = dg.MetadataValue.path(path)
        metadata[f"tp_{nt}"] = node.tensor_parallel
        metadata[f"weights_gib_{nt}"] = gib(node.weight_bytes or 0)
    return metadata


@dg.asset(
    tags=FLEET,
    ins={"kserve_manifest": dg.AssetIn(partition_mapping=dg.AllPartitionMapping(),
                                       metadata={"allow_missing_partitions": True})},
    group_name=GROUP,
    description="LiteLLM-compatible route table (served model name -> InferenceService) over "
    "every model's latest valid manifests, so one gateway endpoint fronts them all.",
)
def gateway_routes(context: dg.AssetExecutionContext, configs: ConfigFiles, outputs: OutputDirs,
                   manifest_validator: ManifestValidator, kserve_manifest) -> dg.MaterializeResult:
    manifests: dict[str, ManifestSet] = by_cell(kserve_manifest)
    valid = [r for _, m in sorted(manifests.items()) if m.valid for r in m.routes]
    invalid = sorted(k for k, m in manifests.items() if not m.valid)
    # the serving profile the GPU node types are measured in: a blocking one (gpu) routes only
    # configurations measured at their hash
    profile_name, profile = configs.profile(None, "gpu")
    routes, not_routed = split_routes(valid, require_measured=profile.slo_severity == "error")
    table = route_table(routes, configs.deploy())
    text = to_yaml([table], "LiteLLM proxy config rendered by model-onboarding "
                   "(litellm --config litellm-config.yaml).")
    path = write_atomic(outputs.manifests / "gateway" / "litellm-config.yaml", text)
    # what the cluster needs once before any manifest serves (docs/deploy.md, "Deploy to your
    # KServe cluster"): rendered beside the gateway, the one step over every model
    deploy, stack = configs.deploy(), configs.stack()
    rendered = render_prerequisites(deploy, configs.nodes(), stack.kserve_version)
    _check_prerequisites(manifest_validator, rendered)
    prereqs = {name: str(write_atomic(outputs.manifests / "cluster" / name, body))
               for name, body in rendered.items()}
    rows = [{"model_name": r.served_name, "service": r.service, "node_type": r.node_type,
             "precision": r.precision, "tp": r.tensor_parallel, "routed": "yes"}
            for r in routes] + [{"model_name": "", "service": k, "node_type": "",
                                 "precision": "", "tp": "", "routed": f"no: {why}"}
                                for k, why in sorted(not_routed.items())]
    return dg.MaterializeResult(data_version=_version(table), metadata={
        "path": dg.MetadataValue.path(str(path)),
        "routes": dg.MetadataValue.md(md_table(rows)),
        "route_count": len(routes),
        "models": len({r.served_name for r in routes}),
        "left_out_invalid": dg.MetadataValue.json(invalid),
        "not_routed": dg.MetadataValue.json(not_routed),
        "routing_rule": "published and verified"
        + (f", and measured at its configuration ({profile_name} profile)"
           if profile.slo_severity == "error" else f" ({profile_name} profile)"),
        "config": dg.MetadataValue.md(f"```yaml\n{text}```"),
        "cluster_prerequisites": dg.MetadataValue.json(prereqs),
    })


def _check_prerequisites(validator: ManifestValidator, rendered: dict[str, str]) -> None:
    """The KServe objects among the prerequisites meet the same CRDs as the model's manifests,
    before any file is written."""
    errors = [f"{name} {doc['kind']}/{doc['metadata']['name']}: {e}"
              for name, body in rendered.items() for doc in yaml.safe_load_all(body)
              if isinstance(doc, dict)
              and str(doc.get("apiVersion", "")).startswith("serving.kserve.io/")
              for e in validator.validate(doc)]
    if errors:
        raise OnboardingError("cluster prerequisites", "; ".join(errors[:5]),
                              "Point the manifest validator at the KServe CRDs of the pinned "
                              "release (deploy/kserve-crds/ by default).")


defs = dg.Definitions(assets=[serving_config, published_variant, kserve_manifest,
                             gateway_routes])
