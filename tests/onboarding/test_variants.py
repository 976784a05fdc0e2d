"""Precision choice, calibration packing, and quantization.yaml validation."""

import pytest

from onboarding.errors import ConfigError
from onboarding.paths import PROJECT_ROOT
from onboarding.quantize_config import load_quantization_config
from onboarding.variants import (
    AccuracyReport,
    GateOutcome,
    QuantizationError,
    QuantizedSet,
    QuantizedVariant,
    choose_precision,
    pack_sequences,
    read_jsonl_texts,
    variant_dir,
)


def qset(*variants):
    return QuantizedSet("m", "/c/m/r", 10, tuple(variants))


def ok(p):
    return QuantizedVariant(p, f"/v/{p}", f"/v/{p}.pt", 5, "h", export_valid=True)


def report(**passed):
    return AccuracyReport("m", (), tuple(GateOutcome(p, v, f"{p} reason")
                                         for p, v in passed.items()))


def test_first_passing_precision_wins():
    assert choose_precision(["nvfp4", "fp8", "bf16"], qset(ok("nvfp4"), ok("fp8")),
                            report(nvfp4=True, fp8=True)) == ("nvfp4", {})


def test_nvfp4_failing_its_gate_falls_back_to_fp8_with_the_reason():
    chosen, skipped = choose_precision(["nvfp4", "fp8", "bf16"], qset(ok("nvfp4"), ok("fp8")),
                                       report(nvfp4=False, fp8=True))
    assert chosen == "fp8"
    assert skipped == {"nvfp4": "accuracy gate failed: nvfp4 reason"}


def test_invalid_export_and_failed_quantization_are_skipped_before_the_gate():
    bad_export = QuantizedVariant("nvfp4", "/v", "/s", export_valid=False, error="scales off")
    failed = QuantizedVariant("fp8", None, None, error="modelopt cannot quantize Bloom")
    chosen, skipped = choose_precision(["nvfp4", "fp8", "bf16"], qset(bad_export, failed),
                                       report(nvfp4=True, fp8=True))
    assert chosen == "bf16"
    assert skipped == {"nvfp4": "scales off", "fp8": "modelopt cannot quantize Bloom"}


def test_nothing_servable_when_bf16_is_not_in_the_ladder():
    chosen, skipped = choose_precision(["nvfp4", "fp8"], qset(ok("nvfp4"), ok("fp8")),
                                       report(nvfp4=False, fp8=False))
    assert chosen is None and set(skipped) == {"nvfp4", "fp8"}


def test_variant_dir_sits_beside_the_baseline():
    assert str(variant_dir("/cache/m/abc", "fp8")) == "/cache/m/abc.variants/fp8"


def test_pack_sequences_cuts_exact_lengths_across_texts():
    seqs = pack_sequences([[1, 2, 3], [4, 5], [6, 7, 8, 9]], 4, 2, "cal", separator=0)
    assert seqs == [[1, 2, 3, 0], [4, 5, 0, 6]]


def test_too_short_calibration_set_is_refused_with_the_numbers():
    with pytest.raises(QuantizationError) as err:
        pack_sequences([[1, 2, 3]], 8, 4, "calibration set x.jsonl")
    assert "enough for 0 sequences of 8; 4 are configured" in str(err.value)


def test_empty_and_malformed_calibration_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert read_jsonl_texts(empty) == []
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:2"):
        read_jsonl_texts(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        read_jsonl_texts(tmp_path / "missing.jsonl")


def test_shipped_quantization_config_and_overrides():
    cfg = load_quantization_config(PROJECT_ROOT / "configs" / "quantization.yaml")
    assert cfg.variant_for("any", "nvfp4").preset == "NVFP4_DEFAULT_CFG"
    assert cfg.calibration.samples >= 1


def test_quantization_config_rejects_unknown_keys_and_bad_presets(tmp_path):
    text = (PROJECT_ROOT / "configs" / "quantization.yaml").read_text()
    p = tmp_path / "q.yaml"
    p.write_text(text.replace("  batch_size: 8", "  batch_size: 8\n  shuffle: true"))
    with pytest.raises(ConfigError, match=r"calibration\.shuffle.*unknown key"):
        load_quantization_config(p)
    p.write_text(text.replace("preset: FP8_DEFAULT_CFG", "preset: FP8_DEFAULT"))
    with pytest.raises(ConfigError, match="end in _CFG"):
        load_quantization_config(p)
