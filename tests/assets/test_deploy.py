"""serving_config -> kserve_manifest -> gateway_routes in a real Dagster instance.

Upstream stages are stand-ins that store the typed results the real stages store
(`CheckpointRef`, `VariantRef`, `LoadTimingResult`, `ServingBenchmarkResult`); the deploy assets
load them through the `optional_upstream` input manager, which gives None for a partition that
was never materialized.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.deploy import gateway_routes, kserve_manifest, serving_config
from assets.partitions import models_partitions
from assets.stack import current_stack
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import CheckpointRef, VariantRef
from onboarding.quantize.variants import AccuracyReport, GateOutcome
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult
from resources.config_files import ConfigFiles, OutputDirs
from resources.huggingface import HuggingFaceStore
from resources.manifest_validator import DEFAULT_CRD_DIR, ManifestValidator
from resources.s3 import S3ObjectStore
from resources.upstream import optional_upstream
from tests.conftest import write_spec
from tests.dagster_support import metadata, store_upstream

# The upstream stages exist in this graph only as what they stored (external asset specs).
UPSTREAM = [dg.AssetSpec(n, partitions_def=models_partitions)
            for n in ("checkpoint", "serving_variant", "accuracy", "predictions", "load_timing",
                      "serving_benchmark", "published_variant")]
ASSETS = [serving_config, kserve_manifest, gateway_routes, *UPSTREAM]
PLAN_ONLY = ("llama-3-1-70b-instruct", "qwen3-235b-a22b-instruct")
SMOLLM2 = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"
SECRET = "plan-only-secret-value-42"


@pytest.fixture
def env(config_dir: Path, outputs: OutputDirs) -> Path:
    for model in PLAN_ONLY:
        shutil.copy(PROJECT_ROOT / "configs" / "models" / f"{model}.yaml", config_dir / "models")
    return outputs.manifests


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def resources(configs: ConfigFiles, outputs: OutputDirs, validator: ManifestValidator | None
              = None) -> dict:
    return {"configs": configs, "outputs": outputs,
            "manifest_validator": validator or ManifestValidator(),
            "s3": S3ObjectStore(endpoint_url="http://127.0.0.1:1", access_key_id="unused-id",
                                secret_access_key=SECRET),
            "hf": HuggingFaceStore(), "optional_upstream": optional_upstream}


def materialize(instance: dg.DagsterInstance, key: str, configs: ConfigFiles,
                outputs: OutputDirs, validator: ManifestValidator | None = None
                ) -> dg.ExecuteInJobResult:
    return dg.materialize(ASSETS, instance=instance, partition_key=key, raise_on_error=False,
                          resources=resources(configs, outputs, validator))


def checks(result: dg.ExecuteInJobResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


@pytest.mark.slow
def test_plan_only_models_render_valid_manifests_marked_as_estimates(
        env: Path, instance, configs, outputs):
    instance.add_dynamic_partitions("models", list(PLAN_ONLY))
    for model in PLAN_ONLY:
        result = materialize(instance, model, configs, outputs)
        assert result.success
        assert {n: c.passed for n, c in checks(result).items()} == {
            "plan_fits_a_target_node_type": True, "manifests_valid": True,
            "no_inline_secrets": True}
        # recorded per partition: the UI's check history names the model
        assert {c.partition for c in checks(result).values()} == {model}
        plan_md = metadata(result, "serving_config")
        assert plan_md["weights_basis"].startswith("estimate")
        assert plan_md["upstream_present"] == "none"
        assert set(plan_md["config_hashes"]) >= {"b300", "h200"}
        manifest_md = metadata(result, "kserve_manifest")
        assert manifest_md["schema_valid"] is True
        for node_type in ("b300", "h200"):
            path = Path(manifest_md[f"path_{node_type}"])
            assert path.parent == env / model and path.is_file()
            text = path.read_text()
            assert SECRET not in text
            isvc = next(d for d in yaml.safe_load_all(text)
                        if d and d["kind"] == "InferenceService")
            labels = isvc["metadata"]["labels"]
            assert labels["model-onboarding.io/weights-basis"] == "estimate"
            assert labels["model-onboarding.io/probe-basis"] == "default"
            assert labels["model-onboarding.io/measured"] == "false"
            assert labels["model-onboarding.io/published"] == "false"
            assert labels["model-onboarding.io/config-hash"] == plan_md["config_hashes"][
                node_type]
            notes = isvc["metadata"]["annotations"]
            assert "absent" in notes["model-onboarding.io/throughput"]
            assert notes["model-onboarding.io/configuration"].startswith("unmeasured")
        stored = json.loads((env / model / "serving_config.json").read_text())
        assert stored["plan"]["inputs"]["model"] == model
    # Nothing of a plan-only model was published, so no pod could load it; the
    # gateway routes none of the four manifests and says why
    gateway = yaml.safe_load((env / "gateway" / "litellm-config.yaml").read_text())
    assert gateway["model_list"] == []
    not_routed = metadata(result, "gateway_routes")["not_routed"]
    assert len(not_routed) == 4  # two models x two target node types
    assert all("not published" in why for why in not_routed.values())


@pytest.mark.slow
@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(),
                    reason="SmolLM2 not built: python scripts/build_smollm2.py "
                    ".cache/smollm2-135m-instruct")
def test_small_real_model_carries_what_was_measured_at_its_configuration(
        env: Path, config_dir: Path, instance, configs, outputs):
    """Measurements count for a manifest only at exactly its configuration's hash on its node
    type; one at another hash leaves the manifest "unmeasured", and says where it was."""
    key = "smollm2-135m-instruct"
    write_spec(config_dir, key, "s3://models/smollm2-135m-instruct/",
               precision_ladder=["fp8", "bf16"], engine_args={"max_model_len": 2048})
    weight_bytes = sum(f.stat().st_size for f in SMOLLM2.glob("*.safetensors"))
    instance.add_dynamic_partitions("models", [key])
    store_upstream(
        instance, key,
        checkpoint=CheckpointRef(model=key, source="s3://models/smollm2-135m-instruct/",
                                 revision="r", path=str(SMOLLM2), content_hash="base",
                                 total_bytes=weight_bytes),
        serving_variant=VariantRef(key, "bf16", str(SMOLLM2), weight_bytes, "base",
                                   weight_bytes),
        accuracy=AccuracyReport(key, (), (GateOutcome(precision="fp8", passed=False,
                                                      reason="drop too large"),)))
    planned = dg.materialize([serving_config, *UPSTREAM], instance=instance, partition_key=key,
                             resources=resources(configs, outputs))
    hashes = metadata(planned, "serving_config")["config_hashes"]
    plan_rows = {r["node_type"]: r for r in json.loads(
        (env / key / "serving_config.json").read_text())["plan"]["nodes"]}
    # The gate failed fp8, so no node is planned at fp8 even where fp8 is native.
    assert {r["precision"] for r in plan_rows.values()} == {"bf16"}
    assert plan_rows["b300"]["weight_bytes"] == weight_bytes
    store_upstream(
        instance, key,
        load_timing=LoadTimingResult(model=key, precision="bf16", servable=True, reason="",
                                     cold_start_p50_s=70.0, cold_start_p95_s=75.0,
                                     warm_start_p50_s=9.0, weight_bytes=weight_bytes,
                                     node_type="h200", config_hash=hashes["h200"]),
        serving_benchmark=ServingBenchmarkResult(model=key, precision="bf16", node_type="h200",
                                                 gpus=1, servable=True, tokens_per_s_per_gpu=321.5,
                                                 saturation_concurrency=16, slo_pass=True,
                                                 config_hash="ffffffffffff"))

    result = materialize(instance, key, configs, outputs)
    assert result.success, [c.metadata for c in checks(result).values()]
    plan_md = metadata(result, "serving_config")
    assert plan_md["weights_basis"] == "measured"
    assert plan_md["model_config_origin"] == str(SMOLLM2 / "config.json")
    assert plan_md["context_tokens"] == 2048
    manifest_md = metadata(result, "kserve_manifest")
    assert plan_md["serving_stack_fingerprint"] == manifest_md["serving_stack_fingerprint"] \
        == current_stack(configs)[0]  # what the re-validation schedule compares
    assert manifest_md["config_hashes"] == {nt: hashes[nt] for nt in ("b300", "h200")}
    assert manifest_md["measured_at_config"] == {"b300": False, "h200": True}
    docs = list(yaml.safe_load_all(Path(manifest_md["path_h200"]).read_text()))
    isvc = next(d for d in docs if d["kind"] == "InferenceService")
    model, notes = isvc["spec"]["predictor"]["model"], isvc["metadata"]["annotations"]
    window_s = max(120, math.ceil(2.0 * 75.0))  # deploy.yaml: floor 120 s, safety factor 2
    assert model["startupProbe"]["failureThreshold"] == math.ceil(window_s / 10)
    assert isvc["metadata"]["labels"]["model-onboarding.io/probe-basis"] == "measured"
    assert notes["model-onboarding.io/configuration"].startswith(
        f"measured on h200 at configuration {hashes['h200']}")
    # The benchmark ran another configuration: its throughput is not this manifest's.
    assert notes["model-onboarding.io/throughput"].startswith("absent")
    assert model["storageUri"] == "s3://models/smollm2-135m-instruct/"  # unpublished: source
    assert notes["model-onboarding.io/storage"].startswith("unpublished")
    assert "--max-model-len=2048" in model["args"]
    b300 = next(d for d in yaml.safe_load_all(Path(manifest_md["path_b300"]).read_text())
                if d["kind"] == "InferenceService")
    assert "unmeasured: configuration" in b300["metadata"]["annotations"][
        "model-onboarding.io/configuration"]
    assert "(measured: h200 at " in b300["metadata"]["annotations"][
        "model-onboarding.io/configuration"]


@pytest.mark.slow
def test_unmeasured_configurations_can_be_kept_out_of_the_manifests(env: Path, config_dir: Path,
                                                                    instance, configs,
                                                                    outputs):
    deploy = yaml.safe_load((config_dir / "deploy.yaml").read_text())
    deploy["render_unmeasured"] = False
    (config_dir / "deploy.yaml").write_text(yaml.safe_dump(deploy))
    instance.add_dynamic_partitions("models", [PLAN_ONLY[0]])
    result = materialize(instance, PLAN_ONLY[0], configs, outputs)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.event_specific_data.error.to_string()
    assert "render_unmeasured: false" in message and "never measured on b300" in message


def test_infeasible_everywhere_fails_the_plan_gate_with_the_shortfall(env: Path,
                                                                      config_dir: Path,
                                                                      instance, configs,
                                                                      outputs):
    deploy = yaml.safe_load((config_dir / "deploy.yaml").read_text())
    deploy["target_node_types"] = ["h100"]
    (config_dir / "deploy.yaml").write_text(yaml.safe_dump(deploy))
    key = "dense-405b"
    write_spec(config_dir, key, "hf://org/dense-405b", plan_only=True,
               precision_ladder=["bf16"],
               architecture={"params_billion": 405, "num_layers": 126, "num_kv_heads": 8,
                             "head_dim": 128, "num_attention_heads": 128})
    instance.add_dynamic_partitions("models", [key])
    result = materialize(instance, key, configs, outputs)
    gate = checks(result)["plan_fits_a_target_node_type"]
    assert not gate.passed
    assert "short by" in gate.metadata["why"].value
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert materialized == {"serving_config"}
    assert not (env / key / "h100.yaml").exists()


@pytest.mark.slow
def test_manifest_invalid_for_the_configured_crd_blocks_the_routes(env: Path, tmp_path: Path,
                                                                   instance, configs, outputs):
    """An older cluster CRD without predictor.maxReplicas: the check names that path."""
    crd = yaml.safe_load(
        (DEFAULT_CRD_DIR / "serving.kserve.io_inferenceservices.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    del schema["properties"]["spec"]["properties"]["predictor"]["properties"]["maxReplicas"]
    old = tmp_path / "old-isvc-crd.yaml"
    old.write_text(yaml.safe_dump(crd))
    others = [DEFAULT_CRD_DIR / f"serving.kserve.io_{k}.yaml" for k in (
        "servingruntimes", "llminferenceservices", "localmodelcaches", "localmodelnodegroups")]
    instance.add_dynamic_partitions("models", [PLAN_ONLY[0]])
    result = materialize(instance, PLAN_ONLY[0], configs, outputs,
                         ManifestValidator(crd_paths=[str(old), *map(str, others)]))
    gate = checks(result)["manifests_valid"]
    assert not gate.passed
    errors = gate.metadata["errors"].value
    assert errors and all(
        v == ["$.spec.predictor.maxReplicas: unknown field (not in the CRD schema)"]
        for v in errors.values())
    assert metadata(result, "kserve_manifest")["schema_valid"] is False
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "gateway_routes" not in materialized


@pytest.mark.slow
def test_plan_model_job_runs_the_deploy_stage_for_a_plan_only_model(env: Path, instance,
                                                                  configs, outputs):
    from assets.deploy import defs as deploy_defs
    from pipelines.jobs import plan_model

    upstream = [a for a in UPSTREAM if a.key != dg.AssetKey("published_variant")]
    defs = dg.Definitions.merge(deploy_defs, dg.Definitions(
        assets=[*upstream, dg.AssetSpec("quantized", partitions_def=models_partitions)],
        jobs=[plan_model], resources=resources(configs, outputs)))
    instance.add_dynamic_partitions("models", [PLAN_ONLY[1]])
    result = defs.resolve_job_def("plan_model").execute_in_process(
        partition_key=PLAN_ONLY[1], instance=instance)
    assert result.success
    assert {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()} == {
        "serving_config", "kserve_manifest", "gateway_routes"}
    assert all(c.passed for c in result.get_asset_check_evaluations())


@pytest.mark.slow
def test_the_gateway_is_one_unpartitioned_table_over_every_model(env: Path, instance, configs,
                                                                 outputs):
    """gateway_routes is not a partition: one table fed by every partition of kserve_manifest,
    whichever partition's run materializes it."""
    assert gateway_routes.partitions_def is None
    instance.add_dynamic_partitions("models", list(PLAN_ONLY))
    first = materialize(instance, PLAN_ONLY[0], configs, outputs)
    assert len(metadata(first, "gateway_routes")["not_routed"]) == 2  # one model, unpublished
    second = materialize(instance, PLAN_ONLY[1], configs, outputs)
    md = metadata(second, "gateway_routes")
    assert md["route_count"] == 0 and len(md["not_routed"]) == 4  # both models, unpublished
    [event] = [e for e in second.get_asset_materialization_events()
               if e.asset_key == dg.AssetKey("gateway_routes")]
    assert event.materialization.partition is None


def test_the_gateway_of_a_fleet_of_one_without_a_manifest_is_an_empty_table(env: Path, instance,
                                                                             configs, outputs):
    """One model in the fleet and its manifest never rendered: Dagster's IO manager hands a bare
    None (not an empty dict) for a single missing partition; the gateway renders no routes
    instead of failing with AttributeError."""
    instance.add_dynamic_partitions("models", [PLAN_ONLY[0]])
    manifest = dg.AssetSpec("kserve_manifest", partitions_def=models_partitions)
    result = dg.materialize([gateway_routes, manifest], instance=instance, raise_on_error=False,
                            resources=resources(configs, outputs))
    assert result.success
    md = metadata(result, "gateway_routes")
    assert md["route_count"] == 0 and md["models"] == 0 and md["left_out_invalid"] == []
    assert (outputs.manifests / "gateway" / "litellm-config.yaml").is_file()


def test_rendered_files_are_readable_like_any_file_the_user_writes(tmp_path: Path):
    """mkstemp creates 0600; a manifest other users (kubectl, CI, the gateway) read must get the
    mode the user's umask gives an ordinary file."""
    import os

    from onboarding.common.files import write_atomic

    umask = os.umask(0o022)
    try:
        path = write_atomic(tmp_path / "m" / "h200.yaml", "kind: InferenceService\n")
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644
