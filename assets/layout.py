"""`node_layout`: several catalog models on one 8-GPU node, for every layout of layouts.yaml.

Not partitioned by model, and not by layout either: one materialization plans every named
layout. Static partitions would have to read layouts.yaml at import (the house reads config when
a step runs, never at import); dynamic ones would need a sensor to register each layout a person
adds to a file, for a plan that takes milliseconds and reads the same inputs (every model's
latest measurements) for all layouts. The cost: one infeasible layout fails the asset's check for
all of them, and the check names which.

Upstream results of every model partition arrive as the values their assets stored (a missing
partition is skipped): checkpoint (shape, parameter count, source dtype), serving_variant
(precision and weight bytes that passed the gate), load_timing (startup probe),
serving_benchmark (measured tokens/s/GPU and SLO verdict on a node type, precision and GPU
count), published_variant (what each manifest may deploy: the verified variant, or the source).
"""


import base64
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from assets.partitions import split_cell
from assets.stack import stack_metadata
from onboarding.common.files import write_atomic
from onboarding.common.refs import PublishedVariant
from onboarding.common.tables import md_table
from onboarding.deploy.cluster_prereqs import gpu_operator_objects
from onboarding.deploy.kserve import checkpoint_dtype, inline_secret_findings, to_yaml
from onboarding.deploy.plan import build_plan, fetched_checkpoint_dir
from onboarding.layouts.placement import LayoutPlan, layout_entries, placement_rows, plan_layout
from onboarding.layouts.plot import layout_png
from onboarding.layouts.render import (
    ModelSource,
    RenderedLayout,
    check_configmap,
    check_gateway,
    check_priority_class,
    check_prometheus,
    mig_entries,
    render_layout,
    write_layout_files,
)
from resources.config_files import ConfigFiles, OutputDirs
from resources.manifest_validator import ManifestValidator
from resources.upstream import by_cell, by_model

GROUP = "layout"  # its own group: the jobs select it (or leave it out) by group
FITS_CHECK = "every_model_fits_its_slo"
VALID_CHECK = "layout_outputs_valid"
UPSTREAM = ("checkpoint", "serving_variant", "serving_benchmark", "published_variant")


@dataclass(frozen=True)
class NodeLayouts:
    """Every layout's plan, and where the feasible ones were rendered."""

    plans: dict[str, LayoutPlan]
    directories: dict[str, str]  # layout -> its output directory

    @property
    def infeasible(self) -> dict[str, str]:
        return {n: p.reason for n, p in self.plans.items() if not p.feasible}


def published_by_model(value: Any) -> dict[str, dict[str, PublishedVariant]]:
    """published_variant's stored values (precision -> PublishedVariant, one per partition; the
    IO manager hands one partition's bare value, several as partition -> value) by model."""
    out: dict[str, dict[str, PublishedVariant]] = {}

    def add(v: Any) -> None:
        if isinstance(v, PublishedVariant):
            out.setdefault(v.model, {})[v.precision] = v
        elif isinstance(v, dict):
            for x in v.values():
                add(x)

    add(value)
    return out


def model_sources(upstream: dict[str, dict[str, Any]]) -> dict[str, ModelSource]:
    """Per model, the source dtype of its fetched checkpoint and its published variants."""
    ids = set(upstream.get("checkpoint", {})) | set(upstream.get("published_variant", {}))
    out = {}
    for m in ids:
        ckpt = fetched_checkpoint_dir(upstream.get("checkpoint", {}).get(m))
        dtype = checkpoint_dtype(json.loads((ckpt / "config.json").read_text())) if ckpt else None
        out[m] = ModelSource(dtype, upstream.get("published_variant", {}).get(m))
    return out


def on_node_type(cells: dict[str, Any], node_type: str) -> dict[str, Any]:
    """model -> the value of its (model, `node_type`) cell, from a fan-in over every cell; a
    single cell's bare value is kept when it says it was measured on `node_type`."""
    out = {}
    for key, value in cells.items():
        if "|" in key:
            model, nt = split_cell(key)
        else:
            model, nt = key, getattr(value, "node_type", "")
        if nt == node_type:
            out[model] = value
    return out


def plan_and_render(configs: ConfigFiles, upstream: dict[str, dict[str, Any]]
                 ) -> tuple[dict[str, LayoutPlan], dict[str, RenderedLayout]]:
    """Plan every layout from each model's plan inputs, and render the feasible ones."""
    cfg, nodes = configs.layouts(), configs.nodes()
    ids = sorted({m.model for layout in cfg.layouts.values() for m in layout.models})
    specs = {m: configs.spec(m) for m in ids}
    inputs = {m: build_plan(specs[m], nodes, upstream["checkpoint"].get(m),
                            upstream["serving_variant"].get(m)).inputs for m in ids}
    slos, stack, deploy = configs.slo_section(), configs.stack(), configs.deploy()
    plans = {name: plan_layout(name, layout, layout_entries(
        layout, specs, inputs, slos, on_node_type(upstream["serving_benchmark"],
                                                  layout.node_type)), cfg, nodes)
        for name, layout in cfg.layouts.items()}
    sources = model_sources(upstream)
    rendered = {name: render_layout(p, specs, inputs, cfg, nodes, stack, deploy, sources)
                for name, p in plans.items() if p.feasible}
    return plans, rendered


def write_fleet_mig_config(root: Path, plans: dict[str, LayoutPlan], configs: ConfigFiles
                           ) -> Path:
    """Every layout's MIG config in the one ConfigMap the GPU operator's ClusterPolicy names,
    beside all-disabled, and the ClusterPolicy patch (mixed strategy): apply these, not one
    layout's gpu-sharing.yaml, where the fleet runs several layouts."""
    cfg, nodes = configs.layouts(), configs.nodes()
    entries = {n: e for n, p in plans.items() if p.feasible
               for e in [mig_entries(p, cfg, nodes)] if e is not None}
    cm, patch = gpu_operator_objects(entries)
    directory = root / "layouts"
    write_atomic(directory / "clusterpolicy-patch.yaml", to_yaml(
        [patch], "kubectl patch clusterpolicies.nvidia.com cluster-policy --type merge "
        "--patch-file clusterpolicy-patch.yaml"))
    return write_atomic(directory / "gpu-operator-mig-config.yaml", to_yaml(
        [cm], "Every layout's mig-parted config; a node picks one with the label "
        "nvidia.com/mig.config=<layout> (all-disabled: whole GPUs)."))


def write_layout(root: Path, plan: LayoutPlan, rendered: RenderedLayout, png: bytes) -> Path:
    directory = write_layout_files(root / "layouts" / plan.name, plan, rendered)
    (directory / "layout.png").write_bytes(png)
    return directory


def validate_outputs(validator: ManifestValidator, rendered: dict[str, RenderedLayout]
                     ) -> dict[str, list[str]]:
    """Errors per object: KServe documents against the CRDs, the rest structurally."""
    errors: dict[str, list[str]] = {}
    for name, r in rendered.items():
        for docs in r.manifests.values():
            for doc in docs:
                errors[f"{name} {doc['kind']}/{doc['metadata']['name']}"] = validator.validate(doc)
        for doc in r.priority_classes:
            errors[f"{name} PriorityClass/{doc['metadata']['name']}"] = check_priority_class(doc)
        for doc in r.gpu_sharing:
            errors[f"{name} ConfigMap/{doc['metadata']['name']}"] = check_configmap(doc)
        errors[f"{name} GPUs the cluster can grant"] = list(r.grant_problems)
        errors[f"{name} litellm-config.yaml"] = check_gateway(r.gateway)
        errors[f"{name} prometheus.yml"] = check_prometheus(r.prometheus)
        docs = [d for ds in r.manifests.values() for d in ds]
        errors[f"{name} inline secrets"] = inline_secret_findings(
            [*docs, r.gateway, r.prometheus, list(r.launchers.values())])
    return {k: v for k, v in errors.items() if v}


def _metadata(plans: dict[str, LayoutPlan], pngs: dict[str, bytes],
              directories: dict[str, str]) -> dict[str, Any]:
    rows = [{"layout": n, "node_type": p.node_type, "feasible": p.feasible,
             "engines": len(p.placements), "free_gpus": len(p.free_gpus) if p.feasible else None,
             "mix_tokens_per_s": round(p.mix_tokens_per_s), "reason": p.reason}
            for n, p in plans.items()]
    md: dict[str, Any] = {"layouts": dg.MetadataValue.md(md_table(rows)),
                          "throughput_basis": dg.MetadataValue.json(
                              {n: {x.model: x.throughput_detail for x in p.placements}
                               for n, p in plans.items()})}
    for name, png in pngs.items():
        md[f"{name}_placement"] = dg.MetadataValue.md(
            md_table(placement_rows(plans[name])) + "\n\n"
            f"![{name}](data:image/png;base64,{base64.b64encode(png).decode()})")
        md[f"{name}_path"] = dg.MetadataValue.path(directories[name])
    return md


@dg.asset(
    ins={name: dg.AssetIn(partition_mapping=dg.AllPartitionMapping(),
                          metadata={"allow_missing_partitions": True}) for name in UPSTREAM},
    group_name=GROUP,
    check_specs=[
        dg.AssetCheckSpec(FITS_CHECK, asset="node_layout", blocking=True,
                          description="Every layout places every one of its models within its "
                          "memory budget and SLO."),
        dg.AssetCheckSpec(VALID_CHECK, asset="node_layout", blocking=True,
                          description="InferenceServices validate against the KServe CRDs; "
                          "PriorityClasses, the LiteLLM and Prometheus configs structurally; no "
                          "credential inline."),
    ],
    description="Several catalog models on one GPU node per layout of layouts.yaml: GPU sets, "
    "memory budgets, QoS, launchers, gateway and scrape configs, a picture.",
)
def node_layout(context: dg.AssetExecutionContext, configs: ConfigFiles, outputs: OutputDirs,
                manifest_validator: ManifestValidator, checkpoint, serving_variant,
                serving_benchmark, published_variant):
    upstream = {"checkpoint": by_model(checkpoint), "serving_variant": by_model(serving_variant),
                "serving_benchmark": by_cell(serving_benchmark),
                "published_variant": published_by_model(published_variant)}
    plans, rendered = plan_and_render(configs, upstream)
    pngs = {name: layout_png(plans[name]) for name in rendered}
    directories = {name: str(write_layout(outputs.manifests, plans[name], r, pngs[name]))
                   for name, r in rendered.items()}
    fleet_mig = write_fleet_mig_config(outputs.manifests, plans, configs)
    value = NodeLayouts(plans, directories)
    errors = validate_outputs(manifest_validator, rendered)
    digest = hashlib.sha256(json.dumps({n: asdict(p) for n, p in plans.items()}, sort_keys=True,
                                       default=str).encode()).hexdigest()[:16]
    yield dg.Output(value, data_version=dg.DataVersion(digest), metadata={
        **_metadata(plans, pngs, directories), **stack_metadata(configs),
        "fleet_mig_config": dg.MetadataValue.path(str(fleet_mig)),
        "upstream_present": dg.MetadataValue.json({k: sorted(v) for k, v in upstream.items()})})
    yield dg.AssetCheckResult(check_name=FITS_CHECK, passed=not value.infeasible, metadata={
        "infeasible": dg.MetadataValue.json(value.infeasible),
        "why": dg.MetadataValue.md("\n".join(f"- **{n}**: {p.reason}" for n, p in plans.items()))})
    yield dg.AssetCheckResult(check_name=VALID_CHECK, passed=not errors, metadata={
        "errors": dg.MetadataValue.json(errors),
        "crd_paths": dg.MetadataValue.json(manifest_validator.resolved_crd_paths())})


defs = dg.Definitions(assets=[node_layout])
