"""Which kernels an engine start actually ran, read from the engine's own log, and the gate that
holds them to what the precision needs on the hardware at hand.

An engine picks its quantization method, GEMM kernel, MoE backend, attention backend, KV-cache
dtype and CUDA-graph mode itself, and falls back silently: NVFP4 on a GPU without FP4 tensor
cores runs Marlin's weight-only kernel, correct and slower. The engine names its choices in its
log; each engine template in configs/stack.yaml (`kernel_facts`) holds the regular expressions
that find them, so no code names an engine or a kernel. `read_kernel_facts` applies them to a
log; `judge` applies configs/nodes.yaml's `kernel_gate` rules (per engine, precision and GPU
architecture) to the facts of every start. Pure: no files, no Dagster.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field, field_validator

from onboarding.common.config import StrictConfig

FactName = Literal["quantization", "linear_kernel", "moe_backend", "attention_backend",
                   "kv_cache_dtype", "cuda_graph_mode"]
KERNEL_FACTS: tuple[str, ...] = FactName.__args__  # type: ignore[attr-defined]
NOT_IN_LOG = "not in the log"


def _compiled(pattern: str, group: str | None) -> str:
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a valid regular expression ({exc})") from None
    if group and group not in rx.groupindex:
        raise ValueError(f"{pattern!r} has no (?P<{group}>...) group for the value")
    return pattern


class KernelFactPatterns(StrictConfig):
    """Per fact, the log lines that name it: regular expressions with a `value` group. Every
    match counts (a model has linear layers of several kinds); a fact with no pattern is not
    read for this engine."""

    quantization: list[str] = Field(default_factory=list)
    linear_kernel: list[str] = Field(default_factory=list)
    moe_backend: list[str] = Field(default_factory=list)
    attention_backend: list[str] = Field(default_factory=list)
    kv_cache_dtype: list[str] = Field(default_factory=list)
    cuda_graph_mode: list[str] = Field(default_factory=list)

    @field_validator(*KERNEL_FACTS)
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        return [_compiled(p, "value") for p in v]

    def read(self) -> dict[str, list[re.Pattern]]:
        return {name: [re.compile(p) for p in getattr(self, name)] for name in KERNEL_FACTS
                if getattr(self, name)}


def read_kernel_facts(patterns: KernelFactPatterns, lines: Iterable[str]
                      ) -> dict[str, tuple[str, ...]]:
    """fact -> the distinct values the log names, in the order it names them. A fact the
    template reads but the log never names is absent from the result."""
    compiled = patterns.read()
    found: dict[str, dict[str, None]] = {}
    for line in lines:
        for name, rxs in compiled.items():
            for rx in rxs:
                for m in rx.finditer(line):
                    found.setdefault(name, {})[m.group("value")] = None
    return {name: tuple(found[name]) for name in KERNEL_FACTS if name in found}


@dataclass(frozen=True)
class StartKernels:
    """The kernel facts of one engine start (`kind`: fully_cold, cold_weights, warm)."""

    kind: str
    facts: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)


def summarize_facts(starts: Sequence[StartKernels]) -> dict[str, str]:
    """One line per fact over every start: its values, `a | b` where starts differed."""
    out: dict[str, str] = {}
    for name in KERNEL_FACTS:
        per_start = {", ".join(s.facts[name]) if name in s.facts else NOT_IN_LOG: None
                     for s in starts}
        if set(per_start) != {NOT_IN_LOG}:
            out[name] = " | ".join(per_start)
    return out


# ---- the gate ------------------------------------------------------------------------------


class FactRule(StrictConfig):
    match: str = Field(description="a regular expression every value seen must match (search)")
    required: bool = Field(default=False, description=(
        "the log must name the fact: a start whose log names none fails (a changed log line "
        "must not pass as a native kernel)"))

    @field_validator("match")
    @classmethod
    def _regex(cls, v: str) -> str:
        return _compiled(v, None)


class KernelRule(StrictConfig):
    """What an engine's starts of one precision must run on some GPU architectures."""

    engine: str
    precision: Literal["nvfp4", "fp8", "bf16"]
    archs: list[str] = Field(min_length=1)
    expected: str = Field(min_length=1, description="what a passing start runs, in words")
    # A pass that is not the fast path (Hopper's weight-only FP4): said wherever it passes.
    passes_as: str | None = None
    facts: dict[FactName, FactRule] = Field(min_length=1)

    @field_validator("archs")
    @classmethod
    def _archs(cls, v: list[str]) -> list[str]:
        bad = [a for a in v if not re.fullmatch(r"sm\d+", a)]
        if bad:
            raise ValueError(f"{bad}: an architecture is sm<major><minor>, e.g. sm90, sm103")
        return v


@dataclass(frozen=True)
class KernelVerdict:
    """The gate's reading of every start. `passed` None: no rule covers the start."""

    passed: bool | None
    summary: str
    expected: str = ""
    problems: tuple[str, ...] = ()
    passes_as: str = ""


def rule_for(rules: Sequence[KernelRule], engine: str, precision: str, arch: str
             ) -> KernelRule | None:
    return next((r for r in rules if r.engine == engine and r.precision == precision
                 and arch in r.archs), None)


def judge(rules: Sequence[KernelRule], engine: str, precision: str, arch: str,
          starts: Sequence[StartKernels]) -> KernelVerdict:
    """Every start against the rule for (engine, precision, arch): each value a start's log
    names must match the rule's pattern, and a required fact must be named."""
    where = f"{precision} on {arch} ({engine})"
    rule = rule_for(rules, engine, precision, arch)
    if rule is None:
        return KernelVerdict(None, f"no kernel rule for {where} (configs/nodes.yaml "
                             "kernel_gate): the kernels are recorded, not judged")
    if not starts:
        return KernelVerdict(False, f"{where}: no engine start to read", rule.expected,
                             ("no start was recorded",))
    problems: list[str] = []
    for s in starts:
        for name, fr in rule.facts.items():
            seen = s.facts.get(name, ())
            if not seen and fr.required:
                problems.append(f"{s.kind} start: the log names no {name} (expected one "
                                f"matching {fr.match!r})")
            for value in seen:
                if not re.search(fr.match, value):
                    problems.append(f"{s.kind} start ran {name} {value}")
    if problems:
        return KernelVerdict(False, f"{where}: a fallback ran, not {rule.expected}",
                             rule.expected, tuple(dict.fromkeys(problems)))
    summary = f"{where}: {rule.passes_as or rule.expected}"
    return KernelVerdict(True, summary, rule.expected, (), rule.passes_as or "")


def facts_table(starts: Sequence[StartKernels]) -> list[Mapping[str, str]]:
    """Rows for a report: one per start, a column per fact."""
    return [{"start": s.kind, **{name: ", ".join(s.facts.get(name, ())) or "-"
                                 for name in KERNEL_FACTS}} for s in starts]
