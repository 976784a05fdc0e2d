"""Small values passed between assets through the IO manager.

They point at files in the NVMe cache instead of carrying bytes, so what travels between steps
(and between step pods in a cluster) stays a few hundred bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
class PublishedVariant:
    """One precision of a model published to the serving bucket and verified there."""

    model: str
    precision: str
    uri: str  # s3://<bucket>/<prefix><content-hash>/
    content_hash: str
    total_bytes: int
    files: int
    skipped: bool  # already published with this content: nothing uploaded
    bytes_uploaded: int = 0
    read_back_bytes: int = 0
    read_back_s: float = 0.0

    @property
    def read_gbps(self) -> float | None:
        """The serving bucket's GET throughput measured reading back part of the variant."""
        if self.read_back_bytes <= 0 or self.read_back_s <= 0:
            return None
        return self.read_back_bytes / self.read_back_s / 1e9

    @property
    def pull_s(self) -> float | None:
        """Derived: seconds the storage initializer needs to pull it at that throughput."""
        gbps = self.read_gbps
        return self.total_bytes / 1e9 / gbps if gbps else None
