"""Independent proof that an exported NVFP4/FP8 checkpoint holds the model that was evaluated.

"It loads" proves nothing: transformers ignores `quant_method: modelopt`, so an FP8 export loads
with its scales dropped and wrong outputs. This module reads the exported safetensors itself,
decodes packed FP4 (E2M1 nibbles, FP8 E4M3 per-16 block scales, FP32 global scale) and FP8
weights with plain torch (no Model Optimizer code), puts the dequantized weights into the
baseline architecture, re-applies activation quantization from the exported `input_scale`s, and
compares next-token predictions with the in-memory fake-quantized model on held-out text.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from onboarding.common.errors import OnboardingError

# E2M1 magnitudes by 3-bit code; bit 3 of a nibble is the sign.
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E4M3_MAX = 448.0
E2M1_MAX = 6.0
QUANT_SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale",
                  "output_scale")


class ExportError(OnboardingError):
    """An exported quantized checkpoint is malformed or does not reproduce the model."""


@dataclass(frozen=True)
class ExportLayout:
    quant_algo: str  # "NVFP4" | "FP8"
    group_size: int | None
    exclude_modules: tuple[str, ...]
    tensors: dict[str, torch.Tensor]


def read_export(export_dir: Path) -> ExportLayout:
    """Every tensor of the export plus its `hf_quant_config.json`, read with safetensors."""
    from safetensors.torch import load_file

    cfg_path = export_dir / "hf_quant_config.json"
    if not cfg_path.is_file():
        raise ExportError(str(export_dir), "no hf_quant_config.json",
                          "The directory is not a Model Optimizer export; re-run `quantized`.")
    quant = json.loads(cfg_path.read_text()).get("quantization", {})
    algo = quant.get("quant_algo")
    if algo not in ("NVFP4", "FP8"):
        raise ExportError(str(cfg_path), f"quant_algo {algo!r} is not NVFP4 or FP8",
                          "Only NVFP4 and FP8 exports are checked by this project.")
    files = sorted(export_dir.glob("*.safetensors"))
    if not files:
        raise ExportError(str(export_dir), "no *.safetensors files", "Re-run `quantized`.")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return ExportLayout(algo, quant.get("group_size"), tuple(quant.get("exclude_modules") or ()),
                        tensors)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n/2] (low nibble = even element) -> float32 [..., n]."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed FP4 weights must be uint8, got {packed.dtype}")
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=packed.device)
    nibbles = torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2).long()
    magnitude = grid[nibbles & 0x7]
    return torch.where((nibbles & 0x8).bool(), -magnitude, magnitude)


def dequantize_nvfp4(packed: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor,
                     block_size: int = 16) -> torch.Tensor:
    values = unpack_e2m1(packed)
    rows, cols = values.shape[:-1], values.shape[-1]
    if block_scale.shape != (*rows, cols // block_size):
        raise ValueError(f"block scales {tuple(block_scale.shape)} do not fit weights "
                         f"{(*rows, cols)} with block size {block_size}")
    blocks = values.view(*rows, cols // block_size, block_size)
    scale = block_scale.to(torch.float32) * global_scale.to(torch.float32)
    return (blocks * scale.unsqueeze(-1)).view(*rows, cols)


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"FP8 weights must be float8_e4m3fn, got {weight.dtype}")
    s = scale.to(torch.float32)
    if s.ndim == 1 and s.numel() == weight.shape[0] and s.numel() > 1:
        s = s.unsqueeze(-1)
    return weight.to(torch.float32) * s


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 value, ties to the even code, saturating at +-6 (what FP4 hardware does)."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=x.device)
    bounds = (grid[1:] + grid[:-1]) / 2  # 0.25, 0.75, ..., 5.0
    mag = x.abs().float().clamp(max=E2M1_MAX)
    code = torch.bucketize(mag, bounds)  # a value on a bound gets the lower code
    on_bound = mag == bounds[code.clamp(max=len(bounds) - 1)]
    code = code + (on_bound & (code % 2 == 1)).long()
    return torch.copysign(grid[code], x.float())


def fake_quant_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    s = scale.to(torch.float32)
    q = (x.float() / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.float() * s).to(x.dtype)


def fake_quant_nvfp4(x: torch.Tensor, global_scale: torch.Tensor, block_size: int = 16
                     ) -> torch.Tensor:
    """Dynamic per-block activation quantization with the exported global (input) scale."""
    shape = x.shape
    xf = x.float().reshape(-1, shape[-1] // block_size, block_size)
    g = global_scale.to(torch.float32)
    block = xf.abs().amax(-1, keepdim=True) / (E2M1_MAX * g)
    block = torch.where(block == 0, torch.ones_like(block), block)
    block = block.clamp(2.0**-9, E4M3_MAX).to(torch.float8_e4m3fn).float()
    q = round_to_e2m1(xf / (block * g))
    return (q * block * g).reshape(shape).to(x.dtype)


def _modules_with(tensors: dict[str, torch.Tensor], suffix: str) -> set[str]:
    tail = "." + suffix
    return {k[: -len(tail)] for k in tensors if k.endswith(tail)}


def structural_problems(layout: ExportLayout, baseline_keys: set[str]) -> list[str]:
    """Missing tensors, wrong dtypes, or scale shapes that do not fit their weights."""
    problems = []
    t = layout.tensors
    for key in sorted(baseline_keys - set(t)):
        problems.append(f"{key}: in the baseline checkpoint but missing from the export")
    for mod in sorted(_modules_with(t, "weight_scale")):
        w = t.get(f"{mod}.weight")
        if w is None:
            problems.append(f"{mod}.weight: scales exist but the weight is missing")
            continue
        s = t[f"{mod}.weight_scale"]
        if layout.quant_algo == "NVFP4":
            gs = layout.group_size or 16
            if w.dtype != torch.uint8:
                problems.append(f"{mod}.weight: NVFP4 weights must be packed uint8, not {w.dtype}")
            elif s.dtype != torch.float8_e4m3fn or s.shape != (*w.shape[:-1],
                                                              w.shape[-1] * 2 // gs):
                problems.append(f"{mod}.weight_scale: {s.dtype} {tuple(s.shape)} does not fit "
                                f"FP8 per-{gs} block scales for {tuple(w.shape)} packed weights")
            if f"{mod}.weight_scale_2" not in t:
                problems.append(f"{mod}.weight_scale_2: missing (the FP32 global scale)")
        elif w.dtype != torch.float8_e4m3fn:
            problems.append(f"{mod}.weight: FP8 weights must be float8_e4m3fn, not {w.dtype}")
    for mod in sorted(_modules_with(t, "weight")):
        w = t[f"{mod}.weight"]
        if w.dtype in (torch.uint8, torch.float8_e4m3fn) and f"{mod}.weight_scale" not in t:
            problems.append(f"{mod}.weight_scale: missing for quantized weight {mod}.weight")
    for name, v in t.items():
        if name.rsplit(".", 1)[-1] in QUANT_SUFFIXES and not bool(
                torch.isfinite(v.float()).all() and (v.float() > 0).all()):
            problems.append(f"{name}: scales must be finite and positive")
    return problems


def dequantized_state(layout: ExportLayout) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(high-precision weights by parameter name, activation scales by module name)."""
    t = layout.tensors
    quantized = _modules_with(t, "weight_scale")
    weights: dict[str, torch.Tensor] = {}
    for name, v in t.items():
        if name.rsplit(".", 1)[-1] in QUANT_SUFFIXES:
            continue
        mod = name[: -len(".weight")] if name.endswith(".weight") else None
        if mod in quantized:
            if layout.quant_algo == "NVFP4":
                v = dequantize_nvfp4(v, t[f"{mod}.weight_scale"], t[f"{mod}.weight_scale_2"],
                                     layout.group_size or 16)
            else:
                v = dequantize_fp8(v, t[f"{mod}.weight_scale"])
        weights[name] = v
    return weights, {m: t[f"{m}.input_scale"] for m in _modules_with(t, "input_scale")}


class ActivationQuant:
    """Switch for the reference model's activation fake-quant hooks (weights stay dequantized)."""

    def __init__(self, scales: dict[str, torch.Tensor]):
        self.enabled = True
        self.scales = scales


def load_reference_model(baseline_dir: Path, export_dir: Path, baseline_keys: set[str]):
    """The baseline architecture carrying the export's dequantized weights and activation quant.

    Returns (model, ActivationQuant). Raises ExportError naming every missing or malformed tensor.
    """
    from transformers import AutoModelForCausalLM

    layout = read_export(export_dir)
    problems = structural_problems(layout, baseline_keys)
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more"
                                           if len(problems) > 8 else "")
        raise ExportError(str(export_dir), f"the export is malformed: {shown}",
                          "Delete the variant directory and re-materialize `quantized`")
    weights, act_scales = dequantized_state(layout)
    model = AutoModelForCausalLM.from_pretrained(baseline_dir, dtype=torch.bfloat16).eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            if name in params:
                if params[name].shape != value.shape:
                    raise ExportError(f"{export_dir}: {name}",
                                      f"shape {tuple(value.shape)} after dequantization, "
                                      f"{tuple(params[name].shape)} in the model (a layout "
                                      "this check does not know, e.g. transposed Conv1D)",
                                      "Serve another precision of the ladder for this "
                                      "architecture")
                params[name].copy_(value.to(params[name].dtype))
    modules = dict(model.named_modules())
    gs = layout.group_size or 16
    switch = ActivationQuant(act_scales)
    quant = ((lambda x, s: fake_quant_nvfp4(x, s, gs)) if layout.quant_algo == "NVFP4"
             else fake_quant_fp8)
    for mod_name, scale in act_scales.items():
        module = modules.get(mod_name)
        if module is None:
            raise ExportError(f"{export_dir}: {mod_name}.input_scale",
                              "names a module the baseline architecture does not have",
                              "The export does not belong to this baseline; re-run `quantized`")

        def hook(_m, args, s=scale):
            if not switch.enabled:
                return None
            return (quant(args[0], s.to(args[0].device)), *args[1:])

        module.register_forward_pre_hook(hook)
    return model, switch


def scale_mismatches(exported: dict[str, torch.Tensor], in_memory: dict[str, torch.Tensor],
                     rel_tol: float = 1e-3) -> list[str]:
    """Activation scales in the export that differ from the calibrated ones (or are absent)."""
    out = []
    for name, expected in sorted(in_memory.items()):
        got = exported.get(name)
        if got is None:
            out.append(f"{name}.input_scale: calibrated but missing from the export")
            continue
        e, g = float(expected.float().reshape(-1)[0]), float(got.float().reshape(-1)[0])
        if not abs(g - e) <= rel_tol * abs(e):
            out.append(f"{name}.input_scale: {g:.6g} exported, {e:.6g} calibrated")
    return out


@dataclass(frozen=True)
class OutputComparison:
    ppl_reference: float
    ppl_candidate: float
    top1_agreement: float
    max_abs_logit_diff: float
    tokens: int

    @property
    def ppl_rel_diff(self) -> float:
        return abs(self.ppl_candidate / self.ppl_reference - 1.0)


def logits_on(model, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for ids in batches:
            out.append(model(ids.to(device)).logits.float().cpu())
    return out


def compare_logits(reference: list[torch.Tensor], candidate: list[torch.Tensor],
                   batches: list[torch.Tensor]) -> OutputComparison:
    """Perplexity of each on the batches' next tokens, and how often their argmaxes agree."""
    nll_r = nll_c = 0.0
    agree = n = 0
    max_diff = 0.0
    for lr, lc, ids in zip(reference, candidate, batches, strict=True):
        target = ids[:, 1:].reshape(-1)
        lr2, lc2 = lr[:, :-1].reshape(-1, lr.shape[-1]), lc[:, :-1].reshape(-1, lc.shape[-1])
        nll_r += torch.nn.functional.cross_entropy(lr2, target, reduction="sum").item()
        nll_c += torch.nn.functional.cross_entropy(lc2, target, reduction="sum").item()
        agree += int((lr2.argmax(-1) == lc2.argmax(-1)).sum())
        n += target.numel()
        max_diff = max(max_diff, float((lr - lc).abs().max()))
    return OutputComparison(math.exp(nll_r / n), math.exp(nll_c / n), agree / n, max_diff, n)
