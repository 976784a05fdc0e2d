"""Quantized variants on disk, what passes between `quantized`, `accuracy` and `serving_variant`.

Also the two small decisions this stage makes: where a variant lives in the cache, and which
precision of the ladder is served.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from onboarding.common.errors import ConfigError, OnboardingError
from onboarding.common.refs import CheckpointRef, VariantRef
from onboarding.fetch.checkpoint_manifest import (
    MANIFEST_NAME,
    CheckpointManifest,
    FileEntry,
    sha256_file,
)
from onboarding.quantize.accuracy_gate import GateResult

IN_PROCESS, SERVED = "in_process", "served"


class QuantizationError(OnboardingError):
    """A precision could not be produced for this checkpoint; the ladder moves on."""


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
class GateOutcome:
    """One precision's accuracy decision, and the evidence's own verdict beside it: an
    inconclusive verdict is `passed` only under the `pass` policy (configs/gates.yaml)."""

    precision: str
    passed: bool
    reason: str
    verdict: str = ""  # pass | fail | inconclusive (empty: taken from `passed`)
    source: str = IN_PROCESS  # which score decided: in_process | served
    items: int = 0  # the most items a task was judged on
    # per task, the information fractions the gate looked at (accuracy_gate.decide)
    looks: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.verdict:
            object.__setattr__(self, "verdict", "pass" if self.passed else "fail")

    @classmethod
    def of(cls, gate: GateResult, source: str) -> GateOutcome:
        return cls(precision=gate.precision, passed=gate.passed, reason=gate.reason,
                   verdict=gate.verdict, source=source, items=gate.items,
                   looks={t: list(f) for t, f in gate.looks.items()})


@dataclass(frozen=True)
class AccuracyRecord:
    """One precision scored by one source, with lm-eval's per-item results per task."""

    precision: str
    source: str  # in_process | served
    content_hash: str  # of the checkpoint that was scored
    scores: dict = field(default_factory=dict)  # task -> accuracy_gate.TaskScore
    seconds: float = 0.0

    def rows(self) -> list[dict]:
        return [{"precision": self.precision, "source": self.source, "task": s.task,
                 "metric": s.metric, "value": s.value, "n": s.n, "size": s.size or None}
                for s in self.scores.values()]


@dataclass(frozen=True)
class AccuracyReport:
    model: str
    rows: tuple[dict, ...]  # task, metric, baseline, variant, precision, delta, interval, n
    gates: tuple[GateOutcome, ...]
    eval_s: dict = field(default_factory=dict)  # precision -> seconds
    records: tuple[AccuracyRecord, ...] = ()  # in process, one per precision evaluated

    def gate(self, precision: str) -> GateOutcome | None:
        return next((g for g in self.gates if g.precision == precision), None)

    def record(self, precision: str) -> AccuracyRecord | None:
        return next((r for r in self.records if r.precision == precision), None)


@dataclass(frozen=True, kw_only=True)
class ServedAccuracyReport:
    """The same tasks scored through the engine that serves each variant (`served_accuracy`)."""

    model: str
    records: tuple[AccuracyRecord, ...]  # served, one per precision this engine served
    agreements: tuple = ()  # served_accuracy.Agreement per served precision
    gates: tuple[GateOutcome, ...] = ()  # source "served", quantized precisions
    rows: tuple[dict, ...] = ()  # the served gates' table, as AccuracyReport.rows
    not_served: dict = field(default_factory=dict)  # precision -> why not served here
    eval_s: dict = field(default_factory=dict)  # precision -> seconds (start + evaluation)

    def gate(self, precision: str) -> GateOutcome | None:
        return next((g for g in self.gates if g.precision == precision), None)

    def record(self, precision: str) -> AccuracyRecord | None:
        return next((r for r in self.records if r.precision == precision), None)

    def agreement(self, precision: str):
        return next((a for a in self.agreements if a.precision == precision), None)


def deciding_gate(precision: str, variant: QuantizedVariant, report: AccuracyReport | None,
                  served: ServedAccuracyReport | None) -> tuple[GateOutcome | None, str]:
    """The gate that decides: the served score's when this variant's bytes were served and
    judged, else the in-process one; and why that source."""
    record = served.record(precision) if served else None
    gate = served.gate(precision) if served else None
    if gate is not None and record is not None and record.content_hash == variant.content_hash:
        return gate, "served: scored through the engine that serves it"
    if served is None:
        why = "in process: served_accuracy was not materialized for this model"
    elif record is not None and record.content_hash != variant.content_hash:
        why = "in process: the served record is of other bytes (an older variant)"
    else:
        why = f"in process: not served here ({served.not_served.get(precision, 'no served gate')})"
    return (report.gate(precision) if report else None), why


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


def choose_across(ladder: list[str], quantized: QuantizedSet | None,
                  report: AccuracyReport | None,
                  served: Mapping[str, ServedAccuracyReport] | None = None
                  ) -> tuple[str | None, dict[str, str]]:
    """`choose_precision` over every node type's served report: the precision furthest down
    the ladder any of them allows (a variant whose served gate fails on one node type's kernels
    is served on none), and every reason a precision was passed over, with its node type."""
    if not served:
        return choose_precision(ladder, quantized, report)
    chosen: str | None = None
    skipped: dict[str, str] = {}
    for node_type, one in sorted(served.items()):
        precision, why = choose_precision(ladder, quantized, report, one)
        for p, reason in why.items():
            skipped[p] = f"{skipped[p]}; {node_type}: {reason}" if p in skipped \
                else f"{node_type}: {reason}"
        if precision is None:
            return None, skipped
        if chosen is None or ladder.index(precision) > ladder.index(chosen):
            chosen = precision
    return chosen, skipped


def choose_precision(ladder: list[str], quantized: QuantizedSet | None,
                     report: AccuracyReport | None, served: ServedAccuracyReport | None = None
                     ) -> tuple[str | None, dict[str, str]]:
    """First precision of the ladder that may be served, and why each one before it was not.

    bf16 is the baseline itself: always exportable and the gate's reference, so it passes.
    A quantized precision is judged by its served gate when there is one (`deciding_gate`).
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
        gate, _ = deciding_gate(precision, variant, report, served)
        if gate is None:
            skipped[precision] = "no accuracy result"
        elif not gate.passed:
            skipped[precision] = (f"accuracy gate failed ({gate.source.replace('_', ' ')}): "
                                  f"{gate.reason}")
        else:
            return precision, skipped
    return None, skipped


def variant_ref(model: str, precision: str, checkpoint: CheckpointRef,
                quantized: QuantizedSet | None) -> VariantRef:
    """The bytes of one precision: the baseline checkpoint (bf16) or its exported variant."""
    if precision == "bf16":
        weight_bytes = sum(p.stat().st_size for p in Path(checkpoint.path).glob("*.safetensors"))
        return VariantRef(model, "bf16", checkpoint.path, checkpoint.total_bytes,
                          checkpoint.content_hash, weight_bytes)
    v = quantized.get(precision) if quantized else None
    if v is None or v.path is None:
        raise OnboardingError(f"{model} ({precision})", "no exported variant of this precision",
                              "Materialize `quantized` for this model first.")
    return VariantRef(model, precision, v.path, v.total_bytes, v.content_hash,
                      int(v.stats.get("weight_bytes", v.total_bytes)))


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
