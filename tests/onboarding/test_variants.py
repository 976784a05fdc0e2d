"""Precision choice, calibration packing, and quantization.yaml validation."""

import pytest

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.quantize.config import load_quantization_config
from onboarding.quantize.variants import (
    AccuracyRecord,
    AccuracyReport,
    GateOutcome,
    QuantizationError,
    QuantizedSet,
    QuantizedVariant,
    ServedAccuracyReport,
    choose_across,
    choose_precision,
    deciding_gate,
    pack_sequences,
    read_jsonl_texts,
    variant_dir,
)


def qset(*variants):
    return QuantizedSet("m", "/c/m/r", 10, tuple(variants))


def ok(p):
    return QuantizedVariant(precision=p, path=f"/v/{p}", state_path=f"/v/{p}.pt", total_bytes=5,
                            content_hash="h", export_valid=True)


def report(**passed):
    return AccuracyReport("m", (), tuple(GateOutcome(precision=p, passed=v, reason=f"{p} reason")
                                         for p, v in passed.items()))


def test_first_passing_precision_wins():
    assert choose_precision(["nvfp4", "fp8", "bf16"], qset(ok("nvfp4"), ok("fp8")),
                            report(nvfp4=True, fp8=True)) == ("nvfp4", {})


def test_nvfp4_failing_its_gate_falls_back_to_fp8_with_the_reason():
    chosen, skipped = choose_precision(["nvfp4", "fp8", "bf16"], qset(ok("nvfp4"), ok("fp8")),
                                       report(nvfp4=False, fp8=True))
    assert chosen == "fp8"
    assert skipped == {"nvfp4": "accuracy gate failed (in process): nvfp4 reason"}


def served(**passed):
    """A served_accuracy report that served and gated the given precisions (hash "h")."""
    return ServedAccuracyReport(
        model="m", records=tuple(AccuracyRecord(p, "served", "h") for p in passed),
        gates=tuple(GateOutcome(precision=p, passed=v, reason=f"{p} served reason", source="served")
                    for p, v in passed.items()),
        not_served={"nvfp4": "the CPU build serves bf16 only"})


def test_the_served_gate_decides_where_there_is_one_and_says_so():
    q = qset(ok("nvfp4"), ok("fp8"))
    in_process = report(nvfp4=True, fp8=True)
    chosen, skipped = choose_precision(["nvfp4", "fp8", "bf16"], q, in_process,
                                       served(nvfp4=False, fp8=True))
    assert chosen == "fp8"
    assert skipped == {"nvfp4": "accuracy gate failed (served): nvfp4 served reason"}
    gate, why = deciding_gate("fp8", ok("fp8"), in_process, served(fp8=False))
    assert gate.source == "served" and not gate.passed and why.startswith("served")


def test_across_node_types_the_strictest_served_gate_decides():
    """A variant whose served gate fails on one node type's kernels is served on none: the
    choice is the one furthest down the ladder, and the reason names the node type."""
    q, in_process = qset(ok("nvfp4"), ok("fp8")), report(nvfp4=True, fp8=True)
    ladder = ["nvfp4", "fp8", "bf16"]
    chosen, skipped = choose_across(ladder, q, in_process,
                                    {"b300": served(nvfp4=True, fp8=True),
                                     "h200": served(nvfp4=False, fp8=True)})
    assert chosen == "fp8"
    assert skipped == {"nvfp4": "h200: accuracy gate failed (served): nvfp4 served reason"}
    assert choose_across(ladder, q, in_process, {"b300": served(nvfp4=True, fp8=True)}) == \
        ("nvfp4", {})
    # nothing served anywhere: the in-process gate, as before
    assert choose_across(ladder, q, in_process, {}) == choose_precision(ladder, q, in_process)
    chosen, skipped = choose_across(["nvfp4", "fp8"], q, in_process,
                                    {"h200": served(nvfp4=False, fp8=False)})
    assert chosen is None and set(skipped) == {"nvfp4", "fp8"}


def test_the_in_process_gate_decides_when_nothing_was_served_and_says_why():
    in_process = report(nvfp4=False, fp8=True)
    gate, why = deciding_gate("nvfp4", ok("nvfp4"), in_process, served(fp8=True))
    assert gate.source == "in_process" and not gate.passed
    assert why == "in process: not served here (the CPU build serves bf16 only)"
    gate, why = deciding_gate("fp8", ok("fp8"), in_process, None)
    assert gate.passed and "served_accuracy was not materialized" in why
    stale = QuantizedVariant(precision="fp8", path="/v/fp8", state_path="/v/fp8.pt", total_bytes=5,
                             content_hash="new-bytes", export_valid=True)
    gate, why = deciding_gate("fp8", stale, in_process, served(fp8=False))
    assert gate.source == "in_process" and gate.passed and "other bytes" in why


def test_gate_outcome_carries_the_verdict():
    assert GateOutcome(precision="fp8", passed=False, reason="r").verdict == "fail"
    assert GateOutcome(precision="fp8", passed=True, reason="r").verdict == "pass"
    open_policy = GateOutcome(precision="fp8", passed=True, reason="inconclusive after 280 items",
                              verdict="inconclusive")
    assert open_policy.passed and open_policy.verdict == "inconclusive"


def test_invalid_export_and_failed_quantization_are_skipped_before_the_gate():
    bad_export = QuantizedVariant(precision="nvfp4", path="/v", state_path="/s", export_valid=False,
                                  error="scales off")
    failed = QuantizedVariant(precision="fp8", path=None, state_path=None,
                              error="modelopt cannot quantize Bloom")
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
