"""serving_config -> kserve_manifest -> gateway_routes in a real Dagster instance.

serving_config is a model's (one plan, a configuration per node type); kserve_manifest is a
(model, node type) cell's and renders that node type only, so a model is planned in one run
and each cell rendered in its own run, with the gateway over every cell after it (as the
plan_model and plan_cell jobs do).

Upstream stages are stand-ins that store the typed results the real stages store
(`CheckpointRef`, `VariantRef`, `LoadTimingResult`, `ServingBenchmarkResult`); the deploy assets
load them through the `optional_upstream` input manager, which gives None for a partition that
was never materialized.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.deploy import gateway_routes, kserve_manifest, serving_config
from assets.partitions import cell_key
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
from tests.dagster_support import metadata, register, store_upstream, upstream_specs

# The upstream stages exist in this graph only as what they stored (external asset specs, each
# at its level: load_timing and serving_benchmark per cell, the others per model).
UPSTREAM = upstream_specs("checkpoint", "serving_variant", "accuracy", "predictions",
                          "load_timing", "serving_benchmark", "published_variant",
                          "config_search")
ASSETS = [serving_config, kserve_manifest, gateway_routes, *UPSTREAM]
TARGETS = ("b300", "h200")  # configs/deploy.yaml target_node_types
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


@dataclass
class Deployed:
    """One model's plan run, then one run per cell: its manifest, and the gateway after it."""

    plan: dg.ExecuteInJobResult
    cells: dict[str, dg.ExecuteInJobResult]

    @property
    def success(self) -> bool:
        return self.plan.success and all(r.success for r in self.cells.values())

    @property
    def last(self) -> dg.ExecuteInJobResult:
        """The run that materialized the gateway last (the last cell's)."""
        return list(self.cells.values())[-1]


def materialize(instance: dg.DagsterInstance, model: str, configs: ConfigFiles,
                outputs: OutputDirs, validator: ManifestValidator | None = None,
                node_types: tuple[str, ...] = TARGETS) -> Deployed:
    """Plan `model`, then render each of its cells on `node_types` (only once the plan run
    succeeded, as the cells follow their model's run)."""
    for nt in node_types:
        register(instance, model, nt)
    res = resources(configs, outputs, validator)
    plan = dg.materialize(ASSETS, instance=instance, partition_key=model, raise_on_error=False,
                          selection=["serving_config"], resources=res)
    cells = {nt: dg.materialize(ASSETS, instance=instance, partition_key=str(cell_key(model, nt)),
                                raise_on_error=False,
                                selection=["kserve_manifest", "gateway_routes"], resources=res)
             for nt in (node_types if plan.success else ())}
    return Deployed(plan, cells)


def checks(result: dg.ExecuteInJobResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


@pytest.mark.slow
def test_plan_only_models_render_valid_manifests_marked_as_estimates(
        env: Path, instance, configs, outputs):
    for model in PLAN_ONLY:
        result = materialize(instance, model, configs, outputs)
        assert result.success
        # recorded per partition: the UI's check history names the model, and the cell
        assert {n: (c.passed, c.partition) for n, c in checks(result.plan).items()} == {
            "plan_fits_a_target_node_type": (True, model)}
        plan_md = metadata(result.plan, "serving_config")
        assert plan_md["weights_basis"].startswith("estimate")
        assert plan_md["upstream_present"] == "none"
        assert set(plan_md["config_hashes"]) >= set(TARGETS)
        for node_type in TARGETS:
            cell = result.cells[node_type]
            assert {n: (c.passed, c.partition) for n, c in checks(cell).items()} == {
                "manifests_valid": (True, str(cell_key(model, node_type))),
                "no_inline_secrets": (True, str(cell_key(model, node_type)))}
            manifest_md = metadata(cell, "kserve_manifest")
            assert manifest_md["schema_valid"] is True
            # the cell renders its own node type only
            assert [k for k in manifest_md if k.startswith("path_")] == [f"path_{node_type}"]
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
    not_routed = metadata(result.last, "gateway_routes")["not_routed"]
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
    other_hash = "ffffffffffff"
    assert other_hash not in hashes.values()
    # h200: timed at its configuration, benchmarked at another one
    store_upstream(
        instance, key,
        load_timing=LoadTimingResult(model=key, precision="bf16", servable=True, reason="",
                                     cold_start_p50_s=70.0, cold_start_p95_s=75.0,
                                     warm_start_p50_s=9.0, weight_bytes=weight_bytes,
                                     node_type="h200", config_hash=hashes["h200"]),
        serving_benchmark=ServingBenchmarkResult(model=key, precision="bf16", node_type="h200",
                                                 gpus=1, servable=True, tokens_per_s_per_gpu=321.5,
                                                 saturation_concurrency=16, slo_pass=True,
                                                 config_hash=other_hash))
    # b300: timed only at another configuration than the one its manifest runs
    store_upstream(
        instance, key,
        load_timing=LoadTimingResult(model=key, precision="bf16", servable=True, reason="",
                                     cold_start_p50_s=50.0, cold_start_p95_s=55.0,
                                     warm_start_p50_s=8.0, weight_bytes=weight_bytes,
                                     node_type="b300", config_hash=other_hash))

    result = materialize(instance, key, configs, outputs)
    assert result.success, {nt: [c.metadata for c in checks(r).values()]
                            for nt, r in result.cells.items()}
    plan_md = metadata(result.plan, "serving_config")
    assert plan_md["weights_basis"] == "measured"
    assert plan_md["model_config_origin"] == str(SMOLLM2 / "config.json")
    assert plan_md["context_tokens"] == 2048
    for nt in TARGETS:
        manifest_md = metadata(result.cells[nt], "kserve_manifest")
        assert plan_md["serving_stack_fingerprint"] == manifest_md["serving_stack_fingerprint"] \
            == current_stack(configs)[0]  # what the re-validation schedule compares
        assert manifest_md["config_hashes"] == {nt: hashes[nt]}
        assert manifest_md["measured_at_config"] == {nt: nt == "h200"}
    manifest_md = metadata(result.cells["h200"], "kserve_manifest")
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
    b300_md = metadata(result.cells["b300"], "kserve_manifest")
    b300 = next(d for d in yaml.safe_load_all(Path(b300_md["path_b300"]).read_text())
                if d["kind"] == "InferenceService")
    # b300's cell saw only its own timing, at another configuration: unmeasured, and where
    # it was measured; h200's measurement (another cell) is not b300's
    b300_notes = b300["metadata"]["annotations"]["model-onboarding.io/configuration"]
    assert "unmeasured: configuration" in b300_notes
    assert f"(measured: b300 at {other_hash})" in b300_notes
    assert b300["metadata"]["labels"]["model-onboarding.io/probe-basis"] == "default"


@pytest.mark.slow
def test_unmeasured_configurations_can_be_kept_out_of_the_manifests(env: Path, config_dir: Path,
                                                                    instance, configs,
                                                                    outputs):
    deploy = yaml.safe_load((config_dir / "deploy.yaml").read_text())
    deploy["render_unmeasured"] = False
    (config_dir / "deploy.yaml").write_text(yaml.safe_dump(deploy))
    result = materialize(instance, PLAN_ONLY[0], configs, outputs)
    assert result.plan.success and not result.success
    for nt in TARGETS:  # each cell refuses its own unmeasured configuration
        cell = result.cells[nt]
        assert not cell.success
        failure = next(e for e in cell.all_events if e.event_type_value == "STEP_FAILURE")
        assert failure.step_key == "kserve_manifest"
        message = failure.event_specific_data.error.to_string()
        assert "render_unmeasured: false" in message and f"never measured on {nt}" in message
        assert not (env / PLAN_ONLY[0] / f"{nt}.yaml").exists()


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
    result = materialize(instance, key, configs, outputs, node_types=("h100",))
    gate = checks(result.plan)["plan_fits_a_target_node_type"]
    assert not gate.passed
    assert "short by" in gate.metadata["why"].value
    materialized = {e.asset_key.to_user_string()
                    for e in result.plan.get_asset_materialization_events()}
    assert materialized == {"serving_config"}
    # the blocking gate failed the plan run, so its cells never follow
    assert not result.plan.success and result.cells == {}
    # and a cell rendered anyway (a plan_cell launched by hand) has no manifest either
    cell = dg.materialize(ASSETS, instance=instance, partition_key=str(cell_key(key, "h100")),
                          raise_on_error=False, selection=["kserve_manifest", "gateway_routes"],
                          resources=resources(configs, outputs))
    assert not cell.success
    assert not cell.get_asset_materialization_events()
    [failure] = cell.get_step_failure_events()
    message = failure.event_specific_data.error.to_string()
    assert "on h100" in message and "no manifest" in message, message
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
    result = materialize(instance, PLAN_ONLY[0], configs, outputs,
                         ManifestValidator(crd_paths=[str(old), *map(str, others)]))
    assert result.plan.success and set(result.cells) == set(TARGETS)
    for nt in TARGETS:
        cell = result.cells[nt]
        gate = checks(cell)["manifests_valid"]
        assert not gate.passed
        errors = gate.metadata["errors"].value
        assert errors and all(
            v == ["$.spec.predictor.maxReplicas: unknown field (not in the CRD schema)"]
            for v in errors.values())
        assert metadata(cell, "kserve_manifest")["schema_valid"] is False
        materialized = {e.asset_key.to_user_string()
                        for e in cell.get_asset_materialization_events()}
        assert materialized == {"kserve_manifest"}  # the blocking check held the routes back


@pytest.mark.slow
def test_plan_model_job_runs_the_deploy_stage_for_a_plan_only_model(env: Path, instance,
                                                                  configs, outputs):
    """plan_model plans the model; plan_cell renders each cell and the gateway after it."""
    from assets.deploy import defs as deploy_defs
    from pipelines.jobs import plan_cell, plan_model

    upstream = [a for a in UPSTREAM if a.key != dg.AssetKey("published_variant")]
    defs = dg.Definitions.merge(deploy_defs, dg.Definitions(
        assets=[*upstream, *upstream_specs("quantized")],
        jobs=[plan_model, plan_cell], resources=resources(configs, outputs)))
    model = PLAN_ONLY[1]
    for nt in TARGETS:
        register(instance, model, nt)
    planned = defs.resolve_job_def("plan_model").execute_in_process(
        partition_key=model, instance=instance)
    assert planned.success
    assert {e.asset_key.to_user_string()
            for e in planned.get_asset_materialization_events()} == {"serving_config"}
    assert [c.check_name for c in planned.get_asset_check_evaluations() if c.passed] == [
        "plan_fits_a_target_node_type"]
    for nt in TARGETS:
        result = defs.resolve_job_def("plan_cell").execute_in_process(
            partition_key=str(cell_key(model, nt)), instance=instance)
        assert result.success
        assert {e.asset_key.to_user_string()
                for e in result.get_asset_materialization_events()} == {
            "kserve_manifest", "gateway_routes"}
        evaluations = result.get_asset_check_evaluations()
        assert {c.check_name for c in evaluations} == {"manifests_valid", "no_inline_secrets"}
        assert all(c.passed for c in evaluations)
        assert (env / model / f"{nt}.yaml").is_file()


@pytest.mark.slow
def test_the_gateway_is_one_unpartitioned_table_over_every_model(env: Path, instance, configs,
                                                                 outputs):
    """gateway_routes is not a partition: one table fed by every cell of kserve_manifest,
    whichever cell's run materializes it."""
    assert gateway_routes.partitions_def is None
    first = materialize(instance, PLAN_ONLY[0], configs, outputs)
    # one model, unpublished: its first cell's run sees one manifest, its last both
    assert len(metadata(first.cells["b300"], "gateway_routes")["not_routed"]) == 1
    assert len(metadata(first.last, "gateway_routes")["not_routed"]) == 2
    second = materialize(instance, PLAN_ONLY[1], configs, outputs)
    md = metadata(second.last, "gateway_routes")
    assert md["route_count"] == 0 and len(md["not_routed"]) == 4  # both models, unpublished
    [event] = [e for e in second.last.get_asset_materialization_events()
               if e.asset_key == dg.AssetKey("gateway_routes")]
    assert event.materialization.partition is None


def test_the_gateway_of_a_fleet_of_one_without_a_manifest_is_an_empty_table(env: Path, instance,
                                                                             configs, outputs):
    """One cell in the fleet and its manifest never rendered: Dagster's IO manager hands a bare
    None (not an empty dict) for a single missing partition; the gateway renders no routes
    instead of failing with AttributeError."""
    register(instance, PLAN_ONLY[0], "h200")
    result = dg.materialize([gateway_routes, *upstream_specs("kserve_manifest")],
                            instance=instance, raise_on_error=False,
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
