"""Ready or not, and why: one verdict per model and target node type.

A model is ready on a node type when: a precision passed its accuracy gate (a serving variant
exists), the SLOs were met at exactly the configuration the manifest deploys (same hash,
measured on that node type, judged as a blocking gate, not a stand-in's warning), a new pod of
that configuration comes up within the cold-start budget (the fully cold p95 load_timing
measured at the same hash and node type, against gates.yaml `slo.cold_start_p95_max_s`: a 70B
model ready in 1-2 min), that configuration's weights were published and verified, and its
manifest validated. It is ready when it is ready on at least one target node type. A
performance twin (random weights) never is. The same verdict feeds the readiness report, the
re-validation schedule and the sensors.

On the `cpu` profile the SLOs are a stand-in's warning, so no node type is ready there whatever
the cold start; the cold start is still judged against the cpu node type's budget (gates.yaml,
the 120 s default: the 135M stand-in starts in about 40 s) and a miss is named beside the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from onboarding.common.refs import VariantRef
from onboarding.fetch.twins import NOT_READY
from onboarding.serving.profiles import SloSection, resolve_slo
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult


@dataclass(frozen=True)
class NodeReadiness:
    node_type: str
    ready: bool
    reasons: tuple[str, ...]  # why not; empty when ready
    config_hash: str = ""


@dataclass(frozen=True)
class Readiness:
    model: str
    ready: bool
    nodes: tuple[NodeReadiness, ...] = ()
    reasons: tuple[str, ...] = ()  # model-level: why no node type can be ready

    def summary(self) -> str:
        if self.ready:
            ready_on = ", ".join(n.node_type for n in self.nodes if n.ready)
            return f"ready on {ready_on}"
        why = list(self.reasons) or [f"{n.node_type}: {'; '.join(n.reasons)}"
                                     for n in self.nodes]
        return "not ready: " + " | ".join(why)

    def rows(self) -> list[dict[str, Any]]:
        return [{"node_type": n.node_type, "ready": n.ready, "config_hash": n.config_hash,
                 "why not": "; ".join(n.reasons)} for n in self.nodes]


@dataclass(frozen=True)
class ManifestFacts:
    """What readiness needs of a rendered ManifestSet (kept free of the asset module)."""

    valid: bool
    config_hashes: dict[str, str] = field(default_factory=dict)
    published: dict[str, bool] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # node type -> why no manifest


def cold_start_budgets(section: SloSection, spec: Any, node_types: list[str]
                       ) -> dict[str, float | None]:
    """Node type -> its cold-start budget: gates.yaml `slo` defaults < node type < the model's
    own `slo:` overrides (`spec`: its ModelSpec)."""
    return {nt: resolve_slo(section, nt, spec).cold_start_p95_max_s for nt in node_types}


def cold_start_problem(node_type: str, config_hash: str, timing: LoadTimingResult | None,
                       budget_s: float | None) -> str:
    """Why the deployed configuration's cold start does not hold ("" when it does, or when the
    node type has no budget): the fully cold p95 load_timing measured at exactly this hash and
    node type, against the budget."""
    if budget_s is None:
        return ""
    src = f"gates.yaml slo.cold_start_p95_max_s for {node_type}"
    if timing is None or timing.node_type != node_type or timing.config_hash != config_hash:
        where = (f" (load-timed {timing.node_type} at {timing.config_hash or 'no hash'})"
                 if timing is not None else "")
        return f"cold start never measured at configuration {config_hash} on {node_type}{where}"
    if timing.cold_start_p95_s is None:
        return (f"no fully cold start measured at configuration {config_hash} on {node_type} "
                f"({timing.reason or 'load_timing recorded none'})")
    if timing.cold_start_p95_s > budget_s:
        return (f"cold start p95 {timing.cold_start_p95_s:.0f} s over the {budget_s:g} s budget "
                f"({src}; fully cold, n={timing.cold_start_samples or '?'})")
    return ""


def judge(model: str, targets: list[str], variant: VariantRef | None,
          bench: ServingBenchmarkResult | None, manifests: ManifestFacts | None,
          twin: bool = False, *, timing: LoadTimingResult | None = None,
          cold_start_budgets_s: Mapping[str, float | None] | None = None,
          served: Any = None) -> Readiness:
    """The verdict; a performance twin (random weights) is never ready, whatever it measured.
    `cold_start_budgets_s` (node type -> gates.yaml's resolved `cold_start_p95_max_s`) makes the
    cold start of `timing` a criterion; a node type it does not name has none. `served`: the
    cell's served accuracy (ServedAccuracyReport), whose gate for the serving precision, where
    there is one, must hold on this node type's kernels."""
    if twin:
        return Readiness(model, False, reasons=(NOT_READY,))
    if variant is None:
        why = ("no precision passed its accuracy gate (serving_variant never materialized or "
               "failed)")
        return Readiness(model, False, reasons=(why,))
    if manifests is None:
        return Readiness(model, False, reasons=("no manifest was rendered",))
    nodes = []
    for nt in targets:
        h = manifests.config_hashes.get(nt)
        if h is None:
            why = manifests.skipped.get(nt)
            nodes.append(NodeReadiness(nt, False, (f"no manifest: {why}" if why
                                                   else "no manifest for this node type",)))
            continue
        why = []
        if not manifests.valid:
            why.append("manifest invalid against the KServe CRDs")
        if not manifests.published.get(nt):
            why.append("weights not published and verified in the serving bucket")
        if bench is None or bench.node_type != nt or bench.config_hash != h:
            where = (f" (benchmarked {bench.node_type} at {bench.config_hash or 'no hash'})"
                     if bench is not None else "")
            why.append(f"SLOs never measured at configuration {h} on {nt}{where}")
        elif not bench.slo_blocking:
            why.append("SLOs judged as a warning only (a stand-in profile), not as a gate")
        elif not bench.slo_pass:
            why.append("SLOs missed: " + "; ".join(bench.slo_violations[:3]))
        gate = served.gate(variant.precision) if served is not None else None
        if gate is not None and not gate.passed:
            why.append(f"served accuracy gate of {variant.precision} failed on {nt}: "
                       f"{gate.reason or gate.verdict}")
        cold = cold_start_problem(nt, h, timing, (cold_start_budgets_s or {}).get(nt))
        if cold:
            why.append(cold)
        nodes.append(NodeReadiness(nt, not why, tuple(why), h))
    return Readiness(model, any(n.ready for n in nodes), tuple(nodes))
