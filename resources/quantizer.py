"""The quantizer: NVIDIA Model Optimizer PTQ (calibrate, export) and the independent export check.

`Quantizer` is the interface the assets see; `ModelOptQuantizer` runs Model Optimizer in this
process, on the GPU when there is one. Without CUDA, Model Optimizer still calibrates and exports
NVFP4, but its fake-quantized NVFP4 forward asserts CUDA ("amax must be a CUDA tensor for dynamic
block quantization"); there a pure-torch backend, which reproduces Model Optimizer's own
`NVFP4QTensor` round trip bit for bit and is registered through its public
`register_quant_backend`, takes over for the NVFP4 quantizers.
On a GPU the native path runs and the backend is never attached.
"""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import os
import resource
import shutil
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from pydantic import Field

# Model Optimizer warns on import that transformers outside [4.57, 5.15) "is not tested with
# current version of modelopt". This project pins both (pyproject.toml) and tests that pair
# itself: the NVFP4 round trip against Model Optimizer bit for bit, the FP8 and NVFP4 exports and
# their independent check (tests/assets/test_quantize.py, tests/e2e/test_quantize_smollm2.py).
warnings.filterwarnings("ignore", message=r"transformers \S+ is not tested with current version "
                        "of modelopt", category=UserWarning)

from onboarding.common.errors import ConfigError
from onboarding.common.progress import Throttled
from onboarding.fetch.twins import (
    NO_WEIGHTS,
    marker_hf_quant_config,
    marker_problems,
    write_twin_variant,
)
from onboarding.quantize.config import (
    QuantizationConfig,
    VariantConfig,
)
from onboarding.quantize.export_check import (
    ExportError,
    OutputComparison,
    compare_logits,
    load_reference_model,
    logits_on,
    scale_mismatches,
)
from onboarding.quantize.variants import (
    QuantizationError,
    QuantizedVariant,
    pack_sequences,
    read_jsonl_texts,
    write_manifest,
)
from resources.config_files import ConfigFiles

CPU_NVFP4_BACKEND = "onboarding_cpu_nvfp4"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                   "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja",
                   "chat_template.json", "generation_config.json")
STATE_SUFFIX = ".modelopt.pt"
# The bf16 baseline's perplexity on the held-out set, per checkpoint and held-out batches: the
# same for every precision the step quantizes, so computed once per process (a model load and
# a forward pass each time otherwise). Keyed by the weight files' identity (size, mtime), so a
# checkpoint rewritten in place is measured again.
_BASELINE_PPL: dict[tuple, float] = {}


def _cpu_nvfp4_fake_quant(inputs, quantizer):
    """NVFP4 fake quantization in plain torch: Model Optimizer's `NVFP4QTensor` round trip,
    bit for bit, in a few in-place passes.

    Same arithmetic as the CUDA kernel: a per-tensor FP32 scale from the calibrated amax
    (amax / (6 * 448)), FP8 E4M3 scales per block of 16, E2M1 values. `NVFP4QTensor` packs the
    E2M1 codes two to a byte through a `searchsorted` and unpacks them again, which made it
    most of the CPU's NVFP4 evaluation (18 s of the demo's 38 s); rounding to the
    E2M1 grid directly gives the same values (tests/resources/test_quantizer.py compares the
    two bit for bit, ties and clamps included) 3-4x faster. A last dimension that is not a
    whole number of blocks is padded with zeros, as `NVFP4QTensor.quantize` pads it.
    """
    amax = quantizer.amax
    if amax is None:
        amax = inputs.detach().abs().amax()
    block = quantizer.block_sizes.get(-1) or quantizer.block_sizes.get(inputs.dim() - 1)
    return _nvfp4_fake_quant(inputs, amax, block)


def _nvfp4_fake_quant(inputs, amax, block: int):
    """`_cpu_nvfp4_fake_quant` of `inputs` at a given amax and block size."""
    import torch

    if pad := -inputs.shape[-1] % block:  # zeros to whole blocks, as `NVFP4QTensor` pads
        padded = torch.nn.functional.pad(inputs, (0, pad))
        return _nvfp4_fake_quant(padded, amax, block)[..., :inputs.shape[-1]]
    global_scale = amax.float().amax() / (6.0 * 448.0)
    x = inputs.float().reshape(*inputs.shape[:-1], -1, block)
    a = x.abs()
    # per-block scale: block amax / (6 * global), 0 -> 1, clamped and cast to FP8 E4M3
    scale = a.amax(-1).div_(6.0 * global_scale)
    scale.masked_fill_(scale == 0, 1.0)
    scale = scale.clamp_(min=2 ** -9, max=448.0).to(torch.float8_e4m3fn).to(torch.float32)
    step_scale = scale.mul_(global_scale).unsqueeze(-1)
    a.div_(step_scale)
    # E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6: steps of 0.5 below 2, 1 below 4, 2 above,
    # ties to the even code (torch.round is half-to-even; the steps are powers of two, so
    # scaling by them is exact); beyond 6 saturates at 6.
    beyond = a > 6
    per_step = torch.full_like(a, 2.0)
    per_step.masked_fill_(a >= 2, 1.0)
    per_step.masked_fill_(a >= 4, 0.5)
    a.mul_(per_step).round_().div_(per_step)
    a.masked_fill_(beyond, 6.0)
    # the input's sign; a negative value rounded to 0 is +0, as the E2M1 code table has it
    a.copysign_(x).add_(0.0)
    return a.mul_(step_scale).reshape(inputs.shape).to(inputs.dtype)


def register_cpu_backend() -> None:
    from modelopt.torch.quantization.nn.modules.tensor_quantizer import (
        is_registered_quant_backend,
        register_quant_backend,
    )

    if not is_registered_quant_backend(CPU_NVFP4_BACKEND):
        register_quant_backend(CPU_NVFP4_BACKEND, _cpu_nvfp4_fake_quant)


def attach_cpu_backend(model) -> int:
    """Route every enabled dynamic-NVFP4 quantizer to the pure-torch backend; returns how many."""
    register_cpu_backend()
    n = 0
    for _, module in model.named_modules():
        if getattr(module, "is_nvfp4_dynamic", False) and module.is_enabled:
            module.backend = CPU_NVFP4_BACKEND
            n += 1
    return n


def build_quant_cfg(variant: VariantConfig, where: str) -> dict:
    """A Model Optimizer config from preset names in configs/quantization.yaml."""
    import modelopt.torch.quantization as mtq

    def preset(name: str) -> dict:
        cfg = getattr(mtq, name, None)
        if not isinstance(cfg, dict):
            known = ", ".join(n for n in dir(mtq) if n.endswith("_CFG"))
            raise ConfigError(where, f"{name!r} is not a Model Optimizer config in this version "
                              f"(known: {known})", "Use one of the known names.")
        return copy.deepcopy(cfg)

    cfg = preset(variant.preset)
    if variant.kv_cache:
        cfg["quant_cfg"] = list(cfg["quant_cfg"]) + list(preset(variant.kv_cache)["quant_cfg"])
    cfg["quant_cfg"] = list(cfg["quant_cfg"]) + [
        {"quantizer_name": pattern, "enable": False} for pattern in variant.disable]
    return cfg


def count_quantizers(model) -> int:
    return sum(1 for name, m in model.named_modules()
               if name.endswith("_quantizer") and getattr(m, "is_enabled", False))


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _dir_bytes(path: Path, suffix: str = "") -> int:
    return sum(p.stat().st_size for p in path.rglob(f"*{suffix}") if p.is_file())


@contextmanager
def _quantizers_disabled(model, suffix: str):
    """Disable the enabled quantizers whose module name ends with `suffix`; yields them."""
    mods = [m for n, m in model.named_modules() if n.endswith(suffix)
            and getattr(m, "is_enabled", False)]
    for m in mods:
        m.disable()
    try:
        yield mods
    finally:
        for m in mods:
            m.enable()


@contextmanager
def _kv_quantizers_disabled(model):
    """KV-cache scales are checked for presence; their numerics stay out of the logit compare."""
    with _quantizers_disabled(model, "bmm_quantizer"):
        yield


@dataclass(frozen=True)
class ExportCheck:
    passed: bool
    weights_only: OutputComparison | None
    full: OutputComparison | None
    ppl_baseline: float | None
    problem: str | None


class Quantizer(dg.ConfigurableResource):
    """Interface: produce a quantized variant, rebuild it in memory, prove its export; for a
    performance twin, write the export marker only."""

    def quantize(self, model_id: str, checkpoint_dir: Path, precision: str, out_dir: Path,
                 revision: str, log=print, verify: bool = True) -> QuantizedVariant:
        raise NotImplementedError

    def load_for_eval(self, checkpoint_dir: Path, variant: QuantizedVariant):
        raise NotImplementedError

    def verify_export(self, checkpoint_dir: Path, variant_dir: Path, state_path: Path
                      ) -> ExportCheck:
        raise NotImplementedError

    def twin_variant(self, model_id: str, checkpoint_dir: Path, precision: str, out_dir: Path,
                     revision: str) -> QuantizedVariant:
        """A performance twin's precision: the export marker only (docs/twins.md)."""
        raise NotImplementedError


class ModelOptQuantizer(Quantizer):
    """Model Optimizer post-training quantization into the NVMe cache."""

    device: str = Field(default="auto", description="'auto' (cuda if present), 'cuda' or 'cpu'")
    configs: ConfigFiles | None = Field(
        default=None, description="quantization.yaml and the calibration set; default: the "
                                  "repository's configs/")

    # ---- configuration -------------------------------------------------------------------
    @property
    def config_files(self) -> ConfigFiles:
        return self.configs or ConfigFiles()

    def settings(self) -> QuantizationConfig:
        return self.config_files.quantization()

    def torch_device(self) -> str:
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("quantizer.device", "is 'cuda' but torch sees no CUDA device",
                              "Run on a GPU node or set device to 'auto'.")
        return self.device

    def _load_baseline(self, checkpoint_dir: Path):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir)
        model = AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=torch.bfloat16)
        model = model.to(self.torch_device()).eval()
        if not getattr(model.config, "architectures", None):
            # Model Optimizer's HF export needs it to name the architecture in config.json.
            model.config.architectures = [type(model).__name__]
        return model, tokenizer

    def _batches(self, tokenizer, dataset: str, samples: int, seq_len: int, what: str):
        import torch

        path = self.config_files.data_path(dataset)
        texts = read_jsonl_texts(path)
        if not texts:
            raise QuantizationError(f"{what} {path}", "is empty",
                                    "Point configs/quantization.yaml at a file with text in it.")
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        seqs = pack_sequences(ids, seq_len, samples, f"{what} {path}", tokenizer.eos_token_id)
        return [torch.tensor([s]) for s in seqs]

    # ---- quantize --------------------------------------------------------------------------
    def quantize(self, model_id: str, checkpoint_dir: Path, precision: str, out_dir: Path,
                 revision: str, log=print, verify: bool = True) -> QuantizedVariant:
        """Calibrate, export into `out_dir` (staged, then renamed), verify; never half a variant.

        Raises QuantizationError when this architecture cannot be quantized at this precision.
        `verify=False` skips the export check (bench/quantize.py times the two apart); such a
        variant is marked not valid, so it is never served.
        """
        import modelopt.torch.opt as mto
        import modelopt.torch.quantization as mtq
        import torch
        from modelopt.torch.export import export_hf_checkpoint
        from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

        settings = self.settings()
        variant_cfg = settings.variant_for(model_id, precision)
        quant_cfg = build_quant_cfg(variant_cfg, f"configs/quantization.yaml variants.{precision}")
        device = self.torch_device()
        stats: dict = {"device": device, "preset": variant_cfg.preset,
                       "kv_cache": variant_cfg.kv_cache or "none"}
        if device == "cuda" and precision == "fp8":
            stats["extension_build_s"] = self._prepare_fp8_extension(out_dir)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()

        t_load = time.perf_counter()
        model, tokenizer = self._load_baseline(checkpoint_dir)
        arch = type(model).__name__
        cal = settings.calibration
        batches = self._batches(tokenizer, cal.dataset, cal.samples, cal.seq_len, "calibration set")
        stats["calibration_tokens"] = cal.samples * cal.seq_len
        n_batches = -(-len(batches) // cal.batch_size)
        log(f"{precision}: baseline {arch} loaded on {device} in "
            f"{time.perf_counter() - t_load:.0f} s; calibrating on {cal.samples} samples x "
            f"{cal.seq_len} tokens ({n_batches} batches)")
        progress = Throttled(log)

        def forward_loop(m):
            with torch.no_grad():
                for b, i in enumerate(range(0, len(batches), cal.batch_size), 1):
                    m(torch.cat(batches[i:i + cal.batch_size]).to(device))
                    progress(lambda b=b: f"{precision}: calibration batch {b}/{n_batches}, "
                             f"{time.perf_counter() - t0:.0f} s", last=b == n_batches)

        t0 = time.perf_counter()
        try:
            model = mtq.quantize(model, quant_cfg, forward_loop)
        except Exception as exc:  # re-raised below with the cause chained
            raise QuantizationError(
                f"{model_id} ({arch}) at {precision}",
                f"Model Optimizer could not quantize it: {type(exc).__name__}: {exc}",
                "Leave this precision out of the model's precision_ladder, or disable the "
                "failing layers under configs/quantization.yaml `disable`.") from exc
        if device == "cuda":
            torch.cuda.synchronize()
        stats["calibration_s"] = round(time.perf_counter() - t0, 3)
        n_quantizers = count_quantizers(model)
        if n_quantizers == 0:
            raise QuantizationError(
                f"{model_id} ({arch}) at {precision}",
                "Model Optimizer found no layer it knows how to quantize in this architecture",
                "Serve it at bf16 (drop quantized precisions from its precision_ladder).")
        stats["quantizers"] = n_quantizers
        log(f"{precision}: calibrated in {stats['calibration_s']:.0f} s, {n_quantizers} "
            "quantizers; exporting")
        if device == "cpu":
            stats["cpu_nvfp4_backend_quantizers"] = attach_cpu_backend(model)
        # The exporter unifies scales across layers that share an input (q/k/v, gate/up) before
        # packing. Doing it here, before the state is saved, makes the model that is evaluated
        # the model that is exported (the exporter's own pass is then a no-op).
        requantize_resmooth_fused_llm_layers(model)

        staging = out_dir.parent / f".staging-{out_dir.name}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        state_path = out_dir.parent / f"{out_dir.name}{STATE_SUFFIX}"
        quantizer_state = {k: v.detach().cpu() for k, v in model.state_dict().items()
                           if "_quantizer." in k}
        torch.save({"modelopt_state": mto.modelopt_state(model),
                    "quantizer_state_dict": quantizer_state}, staging.parent /
                   f".staging-{out_dir.name}{STATE_SUFFIX}")
        t0 = time.perf_counter()
        try:
            # dtype explicitly: left to itself the exporter reads config.torch_dtype, which
            # transformers 5 may hold as the string 'bfloat16' ("Invalid device string").
            export_hf_checkpoint(model, dtype=torch.bfloat16, export_dir=staging)
        except Exception as exc:  # re-raised below with the cause chained
            raise QuantizationError(
                f"{model_id} ({arch}) at {precision}",
                f"Model Optimizer could not export it: {type(exc).__name__}: {exc}",
                "Leave this precision out of the model's precision_ladder.") from exc
        stats["export_s"] = round(time.perf_counter() - t0, 3)
        log(f"{precision}: exported in {stats['export_s']:.0f} s"
            + ("; checking the export against the in-memory model" if verify else ""))
        if device == "cuda":
            stats["gpu_peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        stats["peak_rss_bytes"] = _peak_rss_bytes()
        del model
        gc.collect()
        for name in TOKENIZER_FILES:
            if (checkpoint_dir / name).is_file() and not (staging / name).exists():
                shutil.copy2(checkpoint_dir / name, staging / name)
        manifest = write_manifest(staging, f"quantized:{precision}", revision)

        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
        (staging.parent / f".staging-{out_dir.name}{STATE_SUFFIX}").replace(state_path)

        t0 = time.perf_counter()
        check = (self.verify_export(checkpoint_dir, out_dir, state_path) if verify else
                 ExportCheck(False, None, None, None, "export check skipped (verify=False)"))
        if verify:
            log(f"{precision}: export check {'passed' if check.passed else 'failed'} in "
                f"{time.perf_counter() - t0:.0f} s" + (f": {check.problem}" if check.problem
                                                       else ""))
        weight_bytes = _dir_bytes(out_dir, ".safetensors")
        baseline_weight_bytes = _dir_bytes(checkpoint_dir, ".safetensors")
        stats.update({
            "weight_bytes": weight_bytes,
            "baseline_weight_bytes": baseline_weight_bytes,
            "compression_ratio": round(baseline_weight_bytes / weight_bytes, 3),
            "hf_quant_config": (out_dir / "hf_quant_config.json").read_text(),
        })
        for label, c in (("weights_only", check.weights_only), ("full", check.full)):
            if c is not None:
                stats.update({f"check_{label}_ppl_in_memory": round(c.ppl_reference, 4),
                              f"check_{label}_ppl_export": round(c.ppl_candidate, 4),
                              f"check_{label}_ppl_rel_diff": round(c.ppl_rel_diff, 6),
                              f"check_{label}_top1_agreement": round(c.top1_agreement, 5)})
                stats["check_tokens"] = c.tokens
        if check.ppl_baseline is not None:
            stats["ppl_baseline_bf16"] = round(check.ppl_baseline, 4)
        return QuantizedVariant(
            precision=precision, path=str(out_dir), state_path=str(state_path),
            total_bytes=manifest.total_bytes, content_hash=manifest.content_hash,
            export_valid=check.passed, error=None if check.passed else check.problem,
            stats=stats)

    def _prepare_fp8_extension(self, out_dir: Path) -> float:
        """Build Model Optimizer's FP8 CUDA extension once per node, outside the timed steps."""
        from modelopt.torch.quantization.extensions import get_cuda_ext_fp8

        ext_dir = out_dir.parents[2] / self.settings().torch_extensions_subdir
        ext_dir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ext_dir))
        t0 = time.perf_counter()
        get_cuda_ext_fp8(raise_if_failed=False)
        return round(time.perf_counter() - t0, 3)

    # ---- performance twins ------------------------------------------------------------------
    def twin_variant(self, model_id: str, checkpoint_dir: Path, precision: str, out_dir: Path,
                     revision: str) -> QuantizedVariant:
        """Model Optimizer's export marker for `precision` beside a twin's config.json, no
        weights: `hf_quant_config.json` for the configured preset, and config.json's
        `quantization_config` converted by Model Optimizer's own exporter function, so vLLM
        starts that precision's kernels on random weights (`--load-format dummy`). Read back and
        checked; nothing is calibrated or evaluated (there is nothing to calibrate)."""
        from importlib.metadata import version

        from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format

        cfg = self.settings().variant_for(model_id, precision)
        hf_quant = marker_hf_quant_config(
            precision, cfg.preset, cfg.kv_cache, list(cfg.disable), version("nvidia-modelopt"),
            f"performance twin {model_id} at {precision} (configs/quantization.yaml)")
        manifest = write_twin_variant(checkpoint_dir, out_dir, hf_quant,
                                      convert_hf_quant_config_format(hf_quant), revision)
        algo = hf_quant["quantization"]["quant_algo"]
        problems = marker_problems(out_dir, algo)
        return QuantizedVariant(
            precision=precision, path=str(out_dir), state_path=None,
            total_bytes=manifest.total_bytes, content_hash=manifest.content_hash,
            export_valid=not problems,
            error=f"{out_dir}: the export marker is wrong: {'; '.join(problems)}"
            if problems else None,
            stats={"weights": f"random ({NO_WEIGHTS}): Model Optimizer's export marker only",
                   "preset": cfg.preset, "kv_cache": cfg.kv_cache or "none",
                   "quant_algo": algo, "weight_bytes": 0,
                   "hf_quant_config": json.dumps(hf_quant)})

    # ---- in-memory rebuild -----------------------------------------------------------------
    def restore(self, checkpoint_dir: Path, state_path: Path):
        """The fake-quantized model exactly as calibrated: baseline + saved quantizer state."""
        import modelopt.torch.opt as mto
        import modelopt.torch.quantization as mtq
        import torch

        model, tokenizer = self._load_baseline(checkpoint_dir)
        saved = torch.load(state_path, map_location="cpu", weights_only=False)
        model = mto.restore_from_modelopt_state(model, saved["modelopt_state"])
        result = model.load_state_dict(saved["quantizer_state_dict"], strict=False)
        if result.unexpected_keys:
            raise QuantizationError(str(state_path), "quantizer state does not fit the "
                                    f"checkpoint: {result.unexpected_keys[:5]}",
                                    "Re-materialize `quantized` for this checkpoint.")
        model = model.to(self.torch_device()).eval()
        if self.torch_device() == "cpu":
            attach_cpu_backend(model)
        # Fake-quantize the weights once instead of on every forward.
        mtq.fold_weight(model)
        return model, tokenizer

    def load_for_eval(self, checkpoint_dir: Path, variant: QuantizedVariant):
        """Rebuilt in memory: transformers cannot apply a modelopt export when loading it."""
        if variant.state_path is None:
            raise QuantizationError(variant.precision, "has no saved quantizer state",
                                    "Re-materialize `quantized`.")
        return self.restore(checkpoint_dir, Path(variant.state_path))

    # ---- export check ----------------------------------------------------------------------
    def verify_export(self, checkpoint_dir: Path, variant_dir: Path, state_path: Path
                      ) -> ExportCheck:
        """Exported bytes, decoded independently, must reproduce the in-memory model.

        Two comparisons on held-out text: weights only (activation quantization off on both
        sides), which must agree almost exactly since it isolates the exported weight bytes; and
        the full W+A model, held to a looser perplexity bound because W4A4 is chaotic: a 1-ulp
        bf16 difference in an activation can flip an FP4 rounding. The exported activation
        scales are compared with the calibrated ones directly.
        """
        import torch
        from safetensors import safe_open

        settings = self.settings().export_check
        model, tokenizer = self.restore(checkpoint_dir, state_path)
        batches = self._batches(tokenizer, settings.dataset, settings.samples, settings.seq_len,
                                "held-out set")
        calibrated_scales = _activation_scales(model)
        with _kv_quantizers_disabled(model):
            ref_full = logits_on(model, batches)
            with _input_quantizers_disabled(model):
                ref_weights = logits_on(model, batches)
        del model
        gc.collect()
        baseline_keys: set[str] = set()
        for f in checkpoint_dir.glob("*.safetensors"):
            with safe_open(str(f), "pt") as st:
                baseline_keys.update(st.keys())
        try:
            candidate_model, act_quant = load_reference_model(checkpoint_dir, variant_dir,
                                                              baseline_keys)
        except ExportError as exc:
            return ExportCheck(False, None, None, None, str(exc))
        candidate_model = candidate_model.to(self.torch_device())
        cand_full = logits_on(candidate_model, batches)
        act_quant.enabled = False
        cand_weights = logits_on(candidate_model, batches)
        del candidate_model
        key = _baseline_key(checkpoint_dir, batches, self.torch_device())
        ppl_baseline = _BASELINE_PPL.get(key)
        if ppl_baseline is None:
            base_model, _ = self._load_baseline(checkpoint_dir)
            ppl_baseline = _BASELINE_PPL[key] = compare_logits(
                ref_full, logits_on(base_model, batches), batches).ppl_candidate
            del base_model
        gc.collect()
        if self.torch_device() == "cuda":
            torch.cuda.empty_cache()
        weights_cmp = compare_logits(ref_weights, cand_weights, batches)
        full_cmp = compare_logits(ref_full, cand_full, batches)
        problems = scale_mismatches(act_quant.scales, calibrated_scales)[:5]
        if not weights_cmp.ppl_rel_diff <= settings.max_ppl_rel_diff:
            problems.append(f"weights only: perplexity {weights_cmp.ppl_candidate:.4f} from the "
                            f"export vs {weights_cmp.ppl_reference:.4f} in memory (relative "
                            f"difference {weights_cmp.ppl_rel_diff:.4f} > "
                            f"{settings.max_ppl_rel_diff})")
        if not weights_cmp.top1_agreement >= settings.min_top1_agreement:
            problems.append(f"weights only: next-token agreement {weights_cmp.top1_agreement:.4f}"
                            f" < {settings.min_top1_agreement}")
        if not full_cmp.ppl_rel_diff <= settings.max_ppl_rel_diff_full:
            problems.append(f"weights and activations: perplexity {full_cmp.ppl_candidate:.4f} "
                            f"from the export vs {full_cmp.ppl_reference:.4f} in memory "
                            f"(relative difference {full_cmp.ppl_rel_diff:.4f} > "
                            f"{settings.max_ppl_rel_diff_full})")
        problem = None
        if problems:
            problem = (f"{variant_dir}: the export does not reproduce the calibrated model: "
                       + "; ".join(problems) + ". Delete the variant and re-materialize "
                       "`quantized`; if it persists, report the Model Optimizer version.")
        return ExportCheck(not problems, weights_cmp, full_cmp, ppl_baseline, problem)


def _baseline_key(checkpoint_dir: Path, batches: list, device: str) -> tuple:
    """What the baseline's held-out perplexity depends on: its weights and the token ids (the
    batches are CPU tensors, `_batches`)."""
    weights = tuple(sorted((p.name, st.st_size, st.st_mtime_ns)
                           for p in checkpoint_dir.glob("*.safetensors") for st in [p.stat()]))
    ids = hashlib.sha256()
    for b in batches:
        ids.update(b.numpy().tobytes())
    return (str(checkpoint_dir.resolve()), weights, ids.hexdigest(), device)


def _activation_scales(model) -> dict:
    """What the exporter writes as `input_scale`: calibrated amax / (format max * 448)."""
    out = {}
    for name, module in model.named_modules():
        q = getattr(module, "input_quantizer", None)
        if q is None or not q.is_enabled or q.amax is None:
            continue
        maxbound = 6.0 * 448.0 if getattr(q, "is_nvfp4_dynamic", False) else 448.0
        out[name] = q.amax.detach().float().cpu().amax() / maxbound
    return out


@contextmanager
def _input_quantizers_disabled(model):
    mods: list = []
    try:
        with _quantizers_disabled(model, "input_quantizer") as mods:
            yield
    finally:  # re-enabling can drop the CPU NVFP4 backend; attach it again where it was used
        if mods and getattr(mods[0], "backend", None) is None and next(
                model.parameters()).device.type == "cpu":
            attach_cpu_backend(model)
