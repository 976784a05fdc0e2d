"""`operations`: what a serving team applies beside each manifest on day two, rendered from the
values the manifest was (onboarding/deploy/observability.py, dashboard.py; docs/operations.md):
a PrometheusRule with thresholds from the SLO, the measurement and node acceptance, PodMonitors
for the engine and dcgm-exporter, a KEDA ScaledObject on the engine's queue, a Grafana
dashboard. Checked against the pinned prometheus-operator and KEDA CRDs (deploy/crds/).
"""

import hashlib
import json

import dagster as dg

from assets.checks import not_applicable_check
from assets.model_spec import MODEL_SPEC
from assets.partitions import CELL_DERIVED, cells_partitions, model_of
from assets.stack import SERVING_STACK
from onboarding.common.files import write_atomic
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.tables import md_table
from onboarding.deploy.observability import NodeLimits
from onboarding.deploy.operations_files import files_of, render_all
from onboarding.deploy.serving_plan import ManifestSet, ServingPlan, with_cell_search
from onboarding.serving.profiles import resolve_slo
from onboarding.serving.searched import CellSearch
from onboarding.serving.stats import ServingBenchmarkResult
from resources.config_files import ConfigFiles, OutputDirs
from resources.manifest_validator import ManifestValidator

VALID_CHECK = "operations_valid"
CRD_DIR = PROJECT_ROOT / "deploy" / "crds"


def operations_validator() -> ManifestValidator:
    """The pinned prometheus-operator and KEDA CRDs (deploy/crds/<project>/, SOURCE files)."""
    return ManifestValidator(crd_paths=sorted(str(p) for p in CRD_DIR.glob("*/*.yaml")))


@dg.asset(
    tags=CELL_DERIVED,
    partitions_def=cells_partitions,
    ins={"serving_benchmark": dg.AssetIn(input_manager_key="optional_upstream"),
         "config_search": dg.AssetIn(input_manager_key="optional_upstream")},
    deps=[SERVING_STACK, MODEL_SPEC],
    group_name="deploy",
    check_specs=[dg.AssetCheckSpec(VALID_CHECK, asset="operations", blocking=True,
                                   partitions_def=cells_partitions,
                                   description="Every PrometheusRule, PodMonitor and "
                                   "ScaledObject validates against the pinned CRDs.")],
    description="Per manifest: PrometheusRule (alerts at the SLO, the measured saturation "
    "point, KV cache, engine down, GPU faults at acceptance's limits), PodMonitors, a KEDA "
    "ScaledObject on the engine's queue and a Grafana dashboard.",
)
def operations(context: dg.AssetExecutionContext, configs: ConfigFiles, outputs: OutputDirs,
               kserve_manifest: ManifestSet, serving_config: ServingPlan,
               serving_benchmark: ServingBenchmarkResult | None,
               config_search: CellSearch | None):
    spec = configs.spec(model_of(context))
    serving_config = with_cell_search(serving_config, spec, config_search, configs.nodes(),
                                      configs.stack())
    node_types = sorted(kserve_manifest.files)
    acceptance = configs.acceptance()
    limits = {nt: NodeLimits.of(acceptance.node_types[nt]) if nt in acceptance.node_types
              else None for nt in node_types}
    slos = {nt: resolve_slo(configs.slo_section(), nt, spec) for nt in node_types}
    stack = configs.stack()
    rendered = render_all(spec, kserve_manifest, serving_config, configs.nodes(), stack,
                          configs.deploy(), slos, limits, serving_benchmark,
                          configs.operations())
    files = files_of(rendered, stack.fingerprint)
    paths = {name: str(write_atomic(outputs.manifests / spec.id / "operations" / name, text))
             for name, text in files.items()}
    validator = operations_validator()
    errors = {f"{r.target.node_type} {d['kind']}/{d['metadata']['name']}": e for r in rendered
              for d in r.ops.docs if (e := validator.validate(d))}
    rows = [{"node_type": r.target.node_type, "threshold": x.name, "value": x.value,
             "source": x.source} for r in rendered for x in r.ops.thresholds]
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    yield dg.Output(paths, data_version=dg.DataVersion(digest), metadata={
        "thresholds": dg.MetadataValue.md(md_table(rows)),
        "not_rendered": dg.MetadataValue.json({r.target.node_type: r.ops.skipped
                                               for r in rendered}),
        "files": dg.MetadataValue.json(paths)})
    if not rendered:
        yield not_applicable_check(VALID_CHECK, "nothing rendered: "
                                   + ("; ".join(f"{k}: {v}" for k, v in
                                                sorted(kserve_manifest.skipped.items()))
                                      or "no manifest"))
        return
    yield dg.AssetCheckResult(check_name=VALID_CHECK, passed=not errors, metadata={
        "errors": dg.MetadataValue.json(errors),
        "crd_paths": dg.MetadataValue.json(validator.resolved_crd_paths())})


defs = dg.Definitions(assets=[operations])
