"""Independent NVFP4/FP8 decoding and the export's structural checks (pure torch, fast)."""

import pytest
import torch

from onboarding.quantize.export_check import (
    ExportLayout,
    compare_logits,
    dequantize_fp8,
    dequantize_nvfp4,
    fake_quant_fp8,
    fake_quant_nvfp4,
    round_to_e2m1,
    scale_mismatches,
    structural_problems,
    unpack_e2m1,
)


def test_unpack_reads_low_nibble_first_and_sign_bit():
    # low nibble 0x2 (+1.0) is element 0, high nibble 0xF (-6.0) is element 1
    packed = torch.tensor([[0xF2, 0x07]], dtype=torch.uint8)
    assert unpack_e2m1(packed).tolist() == [[1.0, -6.0, 6.0, 0.0]]


def test_dequantize_nvfp4_applies_block_and_global_scales():
    codes = torch.tensor([2] * 16 + [4] * 16, dtype=torch.uint8)  # 1.0 in block 0, 2.0 in block 1
    packed = (codes[1::2] << 4 | codes[0::2]).view(1, 16)
    block = torch.tensor([[2.0, 0.5]]).to(torch.float8_e4m3fn)
    out = dequantize_nvfp4(packed, block, torch.tensor(3.0), block_size=16)
    assert out[0, :16].unique().tolist() == [6.0]
    assert out[0, 16:].unique().tolist() == [3.0]


def test_dequantize_nvfp4_rejects_scales_that_do_not_fit():
    with pytest.raises(ValueError, match="do not fit"):
        dequantize_nvfp4(torch.zeros(2, 8, dtype=torch.uint8),
                         torch.ones(2, 2).to(torch.float8_e4m3fn), torch.tensor(1.0))


def test_round_to_e2m1_ties_go_to_even_codes_and_saturate():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 9.0, -0.74, -2.6])
    assert round_to_e2m1(x).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.5, -3.0]


def test_fp8_round_trip_and_activation_quant_are_close():
    w = torch.randn(8, 32)
    scale = w.abs().max() / 448
    q = (w / scale).to(torch.float8_e4m3fn)
    deq = dequantize_fp8(q, scale)
    assert torch.allclose(deq, fake_quant_fp8(w, scale), atol=0)
    assert (deq - w).abs().max() <= w.abs().max() * 0.07


def test_nvfp4_activation_quant_stays_on_the_grid_per_block():
    x = torch.randn(4, 64)
    g = x.abs().max() / (6 * 448)
    q = fake_quant_nvfp4(x, g)
    assert q.shape == x.shape
    assert (q - x).abs().max() < x.abs().max() * 0.34  # coarse, but bounded by half a step
    assert not torch.equal(q, x)


def _layout(tensors, algo="NVFP4"):
    return ExportLayout(algo, 16, ("lm_head",), tensors)


def _nvfp4_linear(name="m.q"):
    return {f"{name}.weight": torch.zeros(4, 16, dtype=torch.uint8),
            f"{name}.weight_scale": torch.ones(4, 2).to(torch.float8_e4m3fn),
            f"{name}.weight_scale_2": torch.tensor(0.01),
            f"{name}.input_scale": torch.tensor(0.02)}


def test_structure_of_a_good_export_has_no_problems():
    assert structural_problems(_layout(_nvfp4_linear()), {"m.q.weight"}) == []


def test_structure_names_a_missing_tensor():
    t = _nvfp4_linear()
    problems = structural_problems(_layout(t), {"m.q.weight", "m.norm.weight"})
    assert problems == ["m.norm.weight: in the baseline checkpoint but missing from the export"]


def test_structure_catches_dropped_scales_and_wrong_dtype():
    t = _nvfp4_linear()
    del t["m.q.weight_scale_2"]
    t["m.k.weight"] = torch.zeros(4, 16, dtype=torch.uint8)  # packed, but no scales at all
    problems = structural_problems(_layout(t), set())
    assert any("m.q.weight_scale_2: missing" in p for p in problems)
    assert any("m.k.weight_scale: missing" in p for p in problems)
    fp8 = {"m.q.weight": torch.zeros(4, 16, dtype=torch.bfloat16),
           "m.q.weight_scale": torch.tensor(1.0)}
    assert any("float8_e4m3fn" in p for p in structural_problems(_layout(fp8, "FP8"), set()))


def test_structure_rejects_non_positive_scales():
    t = _nvfp4_linear()
    t["m.q.input_scale"] = torch.tensor(0.0)
    assert any("finite and positive" in p for p in structural_problems(_layout(t), set()))


def test_scale_mismatches_report_missing_and_different_scales():
    calibrated = {"a": torch.tensor(1.0), "b": torch.tensor(2.0), "c": torch.tensor(3.0)}
    exported = {"a": torch.tensor(1.0), "b": torch.tensor(2.5)}
    out = scale_mismatches(exported, calibrated)
    assert len(out) == 2 and "b.input_scale" in out[0] and "c.input_scale" in out[1]


def test_compare_logits_detects_disagreement():
    torch.manual_seed(0)
    ids = torch.randint(0, 10, (1, 9))
    ref = [torch.randn(1, 9, 10)]
    same = compare_logits(ref, [ref[0].clone()], [ids])
    assert same.ppl_rel_diff == 0 and same.top1_agreement == 1.0 and same.tokens == 8
    other = compare_logits(ref, [-ref[0]], [ids])
    assert other.top1_agreement < 0.5 and other.ppl_rel_diff > 0
