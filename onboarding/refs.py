"""Small values passed between assets through the IO manager.

They point at files in the NVMe cache instead of carrying bytes, so what travels between steps
(and between step pods in a cluster) stays a few hundred bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CheckpointRef:
    """A verified checkpoint in the NVMe cache (output of `checkpoint`)."""

    model: str
    source: str
    revision: str  # HF commit, or the S3 content id derived from keys, sizes and ETags
    path: str  # <cache_root>/<model>/<revision>/
    content_hash: str  # sha256 over the manifest; the asset's data version
    total_bytes: int
    files: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class VariantRef:
    """One precision of a model on disk: the baseline (bf16) or an exported quantized variant."""

    model: str
    precision: str  # "bf16" | "fp8" | "nvfp4"
    path: str
    total_bytes: int
    content_hash: str
    weight_bytes: int = 0  # bytes of *.safetensors: what the GPU holds, for the plan
