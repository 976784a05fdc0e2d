"""Quantized variants on disk, what passes between `quantized`, `accuracy` and `serving_variant`.

Also the two small decisions this stage makes: where a variant lives in the cache, and which
precision of the ladder is served.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from onboarding.checkpoint_manifest import (
    MANIFEST_NAME,
    CheckpointManifest,
    FileEntry,
    sha256_file,
)
from onboarding.errors import ConfigError, OnboardingError


class QuantizationError(OnboardingError):
    """A precision could not be produced for this checkpoint; the ladder moves on."""


@dataclass(frozen=True)
class QuantizedVariant:
    precision: str
    path: str | None  # exported HF checkpoint (None when quantization failed)
    state_path: str | None  # Model Optimizer state beside it, to rebuild the in-memory model
    total_bytes: int = 0
    content_hash: str = ""
    export_valid: bool = False
    error: str | None = None  # why the variant is unusable, in words a user can act on
    stats: dict = field(default_factory=dict)  # seconds, bytes, ppl, ...

    @property
    def usable(self) -> bool:
        return self.path is not None and self.export_valid and self.error is None


@dataclass(frozen=True)
class QuantizedSet:
    model: str
    checkpoint_path: str
    baseline_bytes: int
    variants: tuple[QuantizedVariant, ...]

    def get(self, precision: str) -> QuantizedVariant | None:
        return next((v for v in self.variants if v.precision == precision), None)


@dataclass(frozen=True)
class GateOutcome:
    precision: str
    passed: bool
    reason: str


@dataclass(frozen=True)
class AccuracyReport:
    model: str
    rows: tuple[dict, ...]  # task, metric, baseline, variant, precision, delta, stderr, n
    gates: tuple[GateOutcome, ...]
    eval_s: dict = field(default_factory=dict)  # precision -> seconds

    def gate(self, precision: str) -> GateOutcome | None:
        return next((g for g in self.gates if g.precision == precision), None)


def variant_dir(checkpoint_path: str | Path, precision: str) -> Path:
    """`<cache>/<model>/<revision>.variants/<precision>/`, beside the baseline it came from."""
    base = Path(checkpoint_path)
    return base.parent / f"{base.name}.variants" / precision


def dir_manifest(root: Path, source: str, revision: str) -> CheckpointManifest:
    files = [FileEntry(str(p.relative_to(root).as_posix()), p.stat().st_size, sha256_file(p))
             for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST_NAME]
    return CheckpointManifest(source=source, revision=revision, files=files)


def write_manifest(root: Path, source: str, revision: str) -> CheckpointManifest:
    manifest = dir_manifest(root, source, revision)
    (root / MANIFEST_NAME).write_text(manifest.to_json())
    return manifest


def choose_precision(ladder: list[str], quantized: QuantizedSet | None,
                     report: AccuracyReport | None) -> tuple[str | None, dict[str, str]]:
    """First precision of the ladder that may be served, and why each one before it was not.

    bf16 is the baseline itself: always exportable and the gate's reference, so it passes.
    """
    skipped: dict[str, str] = {}
    for precision in ladder:
        if precision == "bf16":
            return precision, skipped
        variant = quantized.get(precision) if quantized else None
        if variant is None:
            skipped[precision] = "not quantized (not in this run's variants)"
            continue
        if not variant.usable:
            skipped[precision] = variant.error or "export check failed"
            continue
        gate = report.gate(precision) if report else None
        if gate is None:
            skipped[precision] = "no accuracy result"
        elif not gate.passed:
            skipped[precision] = f"accuracy gate failed: {gate.reason}"
        else:
            return precision, skipped
    return None, skipped


def read_jsonl_texts(path: Path, field_name: str = "text") -> list[str]:
    if not path.is_file():
        raise ConfigError(str(path), "calibration/held-out text file does not exist",
                          "Point configs/quantization.yaml at a JSONL file with a `text` field.")
    texts = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ConfigError(f"{path}:{lineno}", "not a JSON object",
                              "Each line must be a JSON object with a `text` field.") from None
        text = row.get(field_name) if isinstance(row, dict) else None
        if not isinstance(text, str):
            raise ConfigError(f"{path}:{lineno}", f"no string field {field_name!r}",
                              "Each line must be a JSON object with a `text` field.")
        texts.append(text)
    return texts


def pack_sequences(token_lists: list[list[int]], seq_len: int, samples: int, what: str,
                   separator: int | None = None) -> list[list[int]]:
    """Concatenate tokenized texts and cut `samples` sequences of exactly `seq_len` tokens.

    Refuses a set that is too short rather than calibrating on less than configured: amax from
    a handful of tokens clips real activations later.
    """
    stream: list[int] = []
    for ids in token_lists:
        stream.extend(ids)
        if separator is not None:
            stream.append(separator)
        if len(stream) >= seq_len * samples:
            break
    have = len(stream) // seq_len
    if have < samples:
        raise QuantizationError(
            what, f"holds {len(stream)} tokens, enough for {have} sequences of {seq_len}; "
            f"{samples} are configured",
            "Add text to the file, or lower `samples`/`seq_len` in configs/quantization.yaml.")
    return [stream[i * seq_len:(i + 1) * seq_len] for i in range(samples)]
