"""Ready or not, and why: one verdict per model and target node type.

A model is ready on a node type when: a precision passed its accuracy gate (a serving variant
exists), the SLOs were met at exactly the configuration the manifest deploys (same hash,
measured on that node type, judged as a blocking gate, not a stand-in's warning), that
configuration's weights were published and verified, and its manifest validated. It is ready
when it is ready on at least one target node type. A performance twin (random weights) never
is. The same verdict feeds the readiness report, the re-validation schedule and the sensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onboarding.common.refs import VariantRef
from onboarding.fetch.twins import NOT_READY
from onboarding.serving.stats import ServingBenchmarkResult


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


def judge(model: str, targets: list[str], variant: VariantRef | None,
          bench: ServingBenchmarkResult | None, manifests: ManifestFacts | None,
          twin: bool = False) -> Readiness:
    """The verdict; a performance twin (random weights) is never ready, whatever it measured."""
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
            nodes.append(NodeReadiness(nt, False, ("no manifest for this node type",)))
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
        nodes.append(NodeReadiness(nt, not why, tuple(why), h))
    return Readiness(model, any(n.ready for n in nodes), tuple(nodes))
