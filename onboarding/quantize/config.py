"""`configs/quantization.yaml` -> validated settings for the quantize stage.

Presets are kept as names (`NVFP4_DEFAULT_CFG`) rather than copied dicts, so a Model Optimizer
upgrade brings its tuned exclusions with it; only the resource turns a name into a config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from onboarding.common.config import StrictConfig, load_yaml, validate_config
from onboarding.common.errors import ConfigError

QuantizedPrecision = Literal["nvfp4", "fp8"]


class CalibrationConfig(StrictConfig):
    dataset: str = Field(description="JSONL with a `text` field; relative to the config dir")
    samples: int = Field(ge=1)
    seq_len: int = Field(ge=8)
    batch_size: int = Field(default=8, ge=1)


class ExportCheckConfig(StrictConfig):
    dataset: str
    samples: int = Field(ge=1)
    seq_len: int = Field(ge=8)
    max_ppl_rel_diff: float = Field(gt=0, description="weights only")
    min_top1_agreement: float = Field(ge=0, le=1, description="weights only")
    max_ppl_rel_diff_full: float = Field(gt=0, description="weights and activations")


class VariantConfig(StrictConfig):
    preset: str = Field(description="a modelopt.torch.quantization *_CFG name")
    kv_cache: str | None = Field(default=None, description="a KV-cache *_KV_CFG name")
    disable: list[str] = Field(default_factory=list, description="quantizer name patterns")

    @field_validator("preset", "kv_cache")
    @classmethod
    def _cfg_name(cls, v: str | None) -> str | None:
        if v is not None and not v.endswith("_CFG"):
            raise ValueError(f"{v!r} is not a Model Optimizer config name (they end in _CFG)")
        return v


class QuantizationConfig(StrictConfig):
    calibration: CalibrationConfig
    export_check: ExportCheckConfig
    variants: dict[QuantizedPrecision, VariantConfig]
    models: dict[str, dict[QuantizedPrecision, VariantConfig]] = Field(default_factory=dict)
    torch_extensions_subdir: str = ".torch_extensions"

    def variant_for(self, model_id: str, precision: str) -> VariantConfig:
        override = self.models.get(model_id, {}).get(precision)  # type: ignore[call-overload]
        if override is not None:
            return override
        try:
            return self.variants[precision]  # type: ignore[index]
        except KeyError:
            raise ConfigError(
                f"configs/quantization.yaml: variants.{precision}",
                f"no quantization config for precision {precision!r} "
                f"(configured: {', '.join(self.variants) or 'none'})",
                "Add a `variants` entry for it, or remove it from the model's precision_ladder.",
            ) from None


def load_quantization_config(path: Path) -> QuantizationConfig:
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(str(path), "expected a mapping at the top level", "See the shipped file.")
    return validate_config(QuantizationConfig, data, path, "quantization",
                           "Fix the file (see configs/quantization.yaml's comments).")


