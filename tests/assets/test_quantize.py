"""`quantized` -> `accuracy` -> `serving_variant` in a real Dagster instance, tiny model on CPU.

Covers the ladder: NVFP4 served when it passes, the fallback to FP8 with the reason recorded
when NVFP4 cannot be produced, and a failed `serving_variant` when no precision may be served.
"""

from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.partitions import models_partitions
from assets.quantize import (
    SERVING_CHECK,
    accuracy,
    export_check_name,
    gate_check_name,
    quantized,
    serving_variant,
)
from assets.stack import current_stack
from onboarding.common.refs import CheckpointRef, VariantRef
from resources.config_files import ConfigFiles
from resources.engine import Engine
from resources.evaluator import LmEvalEvaluator
from resources.quantizer import ModelOptQuantizer
from resources.upstream import optional_upstream
from tests.conftest import write_spec
from tests.quantize_support import build_tiny_causal_lm

# end to end: real Model Optimizer quantization and lm-eval scoring in Dagster
pytestmark = pytest.mark.slow

KEY = "tiny-lm"
# served_accuracy never ran for this partition (tests/e2e/test_served_accuracy.py runs it): the
# in-process gates decide, and serving_variant says so
NO_SERVED_ACCURACY = dg.AssetSpec("served_accuracy", partitions_def=models_partitions)


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return build_tiny_causal_lm(tmp_path_factory.mktemp("cache") / KEY / "rev1")


@pytest.fixture
def configs(config_dir, tmp_path) -> ConfigFiles:
    """Small calibration, and gates that a random tiny model can pass on 8 items per task: an
    absolute allowance only (a relative one of a near-zero baseline allows nothing, and eight
    items cannot show a drop of nothing)."""
    q = yaml.safe_load((config_dir / "quantization.yaml").read_text())
    q["calibration"].update({"samples": 4, "seq_len": 64, "batch_size": 2})
    q["export_check"].update({"samples": 2, "seq_len": 64})
    (config_dir / "quantization.yaml").write_text(yaml.safe_dump(q))
    g = yaml.safe_load((config_dir / "gates.yaml").read_text())
    g["accuracy"].update({"min_items": 8, "tolerance": {"max_abs_drop": 1.0}})
    (config_dir / "gates.yaml").write_text(yaml.safe_dump(g))
    return ConfigFiles(config_dir=str(config_dir), discovered_dir=str(tmp_path / "found"))


def stub_checkpoint(path: Path):
    @dg.asset(name="checkpoint", partitions_def=models_partitions)
    def _checkpoint() -> CheckpointRef:
        return CheckpointRef(model=KEY, source="s3://models/tiny/", revision="rev1",
                             path=str(path), content_hash="base", total_bytes=1)

    return _checkpoint


def materialize(path: Path, configs: ConfigFiles):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("models", [KEY])
    result = dg.materialize(
        [stub_checkpoint(path), quantized, accuracy, serving_variant, NO_SERVED_ACCURACY],
        partition_key=KEY, instance=instance, raise_on_error=False,
        resources={"configs": configs,
                   "quantizer": ModelOptQuantizer(device="cpu", configs=configs),
                   "evaluator": LmEvalEvaluator(limit=8, batch_size=8, configs=configs),
                   # serving_variant asks it the node type at hand for performance twins only
                   "engine": Engine(hardware="cpu", configs=configs),
                   "optional_upstream": optional_upstream})
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    return result, checks


def materialization(result, key: str):
    return next(m for m in result.get_asset_materialization_events()
                if m.asset_key == dg.AssetKey(key)).materialization


def test_nvfp4_is_served_when_it_passes(configs, tiny_lm):
    write_spec(configs, KEY, "s3://models/tiny/")
    result, checks = materialize(tiny_lm, configs)
    assert result.success
    ref = result.output_for_node("serving_variant")
    assert isinstance(ref, VariantRef) and ref.precision == "nvfp4"
    assert Path(ref.path).is_dir() and ref.path.endswith("rev1.variants/nvfp4")
    meta = materialization(result, "serving_variant").metadata
    assert meta["precision"].value == "nvfp4"
    assert 0 < meta["weight_bytes"].value < meta["total_bytes"].value
    for p in ("nvfp4", "fp8"):
        assert checks[export_check_name(p)].passed
        assert checks[gate_check_name(p)].passed
    assert checks[SERVING_CHECK].passed
    acc_meta = materialization(result, "accuracy").metadata
    assert "| task" in acc_meta["accuracy_table"].value
    # a table in the UI, not the outcome records as raw JSON
    assert acc_meta["gates"].value.startswith("| precision | verdict | decided by |")
    assert "| nvfp4 | pass | in_process score |" in acc_meta["gates"].value
    gate_meta = checks[gate_check_name("nvfp4")].metadata
    assert "onb_facts_mc_actual" in gate_meta and "onb_facts_mc_expected" in gate_meta
    # rounded for a reader (the UI showed 0.41785714285714287)
    assert all(round(m.value, 4) == m.value for m in gate_meta.values()
               if isinstance(m.value, float))
    assert gate_meta["verdict"].value == "pass" and gate_meta["source"].value == "in_process"
    assert gate_meta["items_used"].value == 8 and gate_meta["onb_facts_mc_items"].value == 8
    low, high = (float(x) for x in gate_meta["onb_facts_mc_drop_interval"].value.strip(
        "[]").split(","))
    assert low <= high <= gate_meta["onb_facts_mc_allowed_drop"].value
    report = result.output_for_node("accuracy")
    assert [(r.precision, r.source) for r in report.records] == [
        ("bf16", "in_process"), ("nvfp4", "in_process"), ("fp8", "in_process")]
    assert len(report.record("fp8").scores["onb_arith_gen"].per_item) == 8
    assert report.gate("fp8").verdict == "pass"
    assert meta["gate_nvfp4"].value == ("pass, decided in process: served_accuracy was not "
                                        "materialized for this model")
    q_meta = materialization(result, "quantized").metadata
    assert q_meta["nvfp4_compression_ratio"].value > 1
    assert q_meta["serving_stack_fingerprint"].value == acc_meta[
        "serving_stack_fingerprint"].value == current_stack(configs)[0]


def test_fp8_is_served_when_nvfp4_cannot_be_produced(configs, tiny_lm):
    q = yaml.safe_load((configs.root / "quantization.yaml").read_text())
    q["models"] = {KEY: {"nvfp4": {"preset": "NVFP4_DEFAULT_CFG", "disable": ["*"]}}}
    (configs.root / "quantization.yaml").write_text(yaml.safe_dump(q))
    write_spec(configs, KEY, "s3://models/tiny/")
    result, checks = materialize(tiny_lm, configs)
    assert result.success
    assert result.output_for_node("serving_variant").precision == "fp8"
    meta = materialization(result, "serving_variant").metadata
    assert "Model Optimizer could not quantize" in meta["skipped_nvfp4"].value
    assert not checks[export_check_name("nvfp4")].passed
    assert checks[export_check_name("nvfp4")].severity == dg.AssetCheckSeverity.WARN
    assert not checks[gate_check_name("nvfp4")].passed
    assert checks[SERVING_CHECK].passed


def test_no_servable_precision_fails_serving_variant(configs, tiny_lm):
    q = yaml.safe_load((configs.root / "quantization.yaml").read_text())
    q["models"] = {KEY: {"nvfp4": {"preset": "NVFP4_DEFAULT_CFG", "disable": ["*"]}}}
    (configs.root / "quantization.yaml").write_text(yaml.safe_dump(q))
    write_spec(configs, KEY, "s3://models/tiny/", precision_ladder=["nvfp4"])
    result, _ = materialize(tiny_lm, configs)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "serving_variant"
    assert "no precision of the ladder" in str(failure.event_specific_data.error)
    assert not any(m.asset_key == dg.AssetKey("serving_variant")
                   for m in result.get_asset_materialization_events())
