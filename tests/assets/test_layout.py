"""node_layout in a real Dagster instance: plan-only models, then a measured benchmark.

Upstream stages are stand-ins that store the typed results the real stages store; the layout
reads every model partition of them (a partition never materialized is skipped).
"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.layout import node_layout
from assets.partitions import cell_key
from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.stats import ServingBenchmarkResult
from resources.manifest_validator import ManifestValidator
from tests.dagster_support import store_upstream, upstream_specs

# serving_benchmark is kept per (model, node type) cell, the others per model
UPSTREAM = upstream_specs("checkpoint", "serving_variant", "serving_benchmark",
                          "published_variant")
MODELS = ("qwen3-235b-a22b-instruct", "qwen3-32b", "llama-3-1-8b-instruct", "bge-m3",
          "bge-reranker-v2-m3", "deepseek-r1")


@pytest.fixture
def env(config_dir: Path) -> Path:
    for model in MODELS:
        shutil.copy(PROJECT_ROOT / "configs" / "models" / f"{model}.yaml", config_dir / "models")
    return config_dir


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def materialize(instance, configs, outputs) -> dg.ExecuteInJobResult:
    return dg.materialize([node_layout, *UPSTREAM], instance=instance, raise_on_error=False,
                          resources={"configs": configs, "outputs": outputs,
                                     "manifest_validator": ManifestValidator()})


def checks(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def metadata(result) -> dict:
    [event] = result.get_asset_materialization_events()
    return {k: v.value for k, v in event.materialization.metadata.items()}


@pytest.mark.slow
def test_plan_only_layouts_render_every_output_and_pass_both_checks(env, instance, configs,
                                                                      outputs):
    instance.add_dynamic_partitions("models", list(MODELS))
    result = materialize(instance, configs, outputs)
    assert result.success
    verdicts = checks(result)
    assert verdicts["every_model_fits_its_slo"].passed
    assert verdicts["layout_outputs_valid"].passed, verdicts["layout_outputs_valid"].metadata
    md = metadata(result)
    assert "![b300-mixed](data:image/png;base64," in md["b300-mixed_placement"]
    directory = outputs.manifests / "layouts" / "b300-mixed"
    assert Path(md["b300-mixed_path"]) == directory
    names = {p.name for p in directory.rglob("*") if p.is_file()}
    assert {"qwen3-32b.yaml", "priority-classes.yaml", "litellm-config.yaml", "prometheus.yml",
            "layout.json", "layout.png", "gateway.sh", "bge-m3.sh"} <= names
    launcher = directory / "launchers" / "qwen3-32b.sh"
    assert launcher.stat().st_mode & stat.S_IXUSR
    assert "export CUDA_VISIBLE_DEVICES=4,5" in launcher.read_text()
    summary = json.loads((directory / "layout.json").read_text())
    assert {p["model"]: p["throughput_basis"] for p in summary["placements"]} == dict.fromkeys(
        ("qwen3-235b-a22b-instruct", "qwen3-32b", "llama-3-1-8b-instruct", "bge-m3",
         "bge-reranker-v2-m3"), "rule")
    isvc = next(d for d in yaml.safe_load_all((directory / "qwen3-32b.yaml").read_text())
                if d and d["kind"] == "InferenceService")
    assert isvc["spec"]["predictor"]["priorityClassName"] == "model-latency-critical"


@pytest.mark.slow
def test_a_measured_benchmark_is_preferred_and_said(env, instance, configs, outputs):
    """serving_benchmark of qwen3-32b on b300 at 2 GPUs in nvfp4 replaces the rule there, and
    only there: the h200 layout (another node type) keeps the rule."""
    instance.add_dynamic_partitions("models", list(MODELS))
    bench = ServingBenchmarkResult(model="qwen3-32b", precision="nvfp4", node_type="b300",
                                   gpus=2, servable=True, tokens_per_s_per_gpu=4321.0,
                                   saturation_concurrency=32, slo_pass=True)
    store_upstream(instance, "qwen3-32b", serving_benchmark=bench)
    result = materialize(instance, configs, outputs)
    assert result.success
    value = result.output_for_node("node_layout")
    b300 = value.plans["b300-mixed"].placement("qwen3-32b")
    assert (b300.throughput_basis, b300.tokens_per_s_per_gpu) == ("measured", 4321.0)
    assert value.plans["h200-mixed"].placement("qwen3-32b").throughput_basis == "rule"
    # the benchmark is the (qwen3-32b, b300) cell's
    assert metadata(result)["upstream_present"]["serving_benchmark"] == [
        str(cell_key("qwen3-32b", "b300"))]


@pytest.mark.slow
def test_an_infeasible_layout_fails_the_blocking_check_with_its_reason(env, instance, configs,
                                                                       outputs):
    path = env / "layouts.yaml"
    data = yaml.safe_load(path.read_text())
    data["layouts"] = {"too-much": {"node_type": "h200", "models": [
        {"model": "deepseek-r1", "traffic_share": 0.5, "qos": "latency-critical"},
        {"model": "qwen3-32b", "traffic_share": 0.5, "qos": "latency-critical"}]}}
    path.write_text(yaml.safe_dump(data))
    instance.add_dynamic_partitions("models", list(MODELS))
    result = materialize(instance, configs, outputs)
    fits = checks(result)["every_model_fits_its_slo"]
    assert not fits.passed
    reason = fits.metadata["infeasible"].value["too-much"]
    assert reason.startswith("qwen3-32b fp8 needs TP >= 1 on h200; only 0 GPUs left")
    assert not (outputs.manifests / "layouts" / "too-much").exists()


@pytest.mark.slow
def test_plan_layouts_job_runs_it_and_onboarding_leaves_it_out(env, instance, configs, outputs):
    """Layouts span models: their own job plans them; one model's onboarding run never does
    (an infeasible layout must not fail it)."""
    from pipelines.definitions import defs as real_defs
    from pipelines.jobs import plan_layouts

    onboarding = real_defs.resolve_job_def("onboard_model").asset_layer.executable_asset_keys
    assert dg.AssetKey("node_layout") not in onboarding
    revalidation = real_defs.resolve_job_def("revalidate_model").asset_layer.executable_asset_keys
    assert dg.AssetKey("node_layout") not in revalidation
    defs = dg.Definitions(assets=[node_layout, *UPSTREAM], jobs=[plan_layouts], resources={
        "configs": configs, "outputs": outputs, "manifest_validator": ManifestValidator()})
    result = defs.resolve_job_def("plan_layouts").execute_in_process(instance=instance)
    assert result.success
    assert sorted(result.output_for_node("node_layout").directories) == [
        "b300-deepseek", "b300-mixed", "h200-deepseek", "h200-mixed"]
