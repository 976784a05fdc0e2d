"""`node_acceptance`: every phase's checks, the phases outside node acceptance, the go/no-go
verdict per phase, and what changed on the node since (stale_reasons)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onboarding.nodes.acceptance.checks import FAIL, NOT_CHECKED, PASS, Check
from onboarding.nodes.acceptance.schema import PHASES, NodeSetting
from onboarding.serving.stack import diff

OUTSIDE_NODE_ACCEPTANCE = (
    Check(phase=3, name="serving_smoke", status=NOT_CHECKED, required=False,
          reason="not checked: outside node acceptance; load_timing starts the engine (TP from "
          "the model's plan) on this node for every model"),
    Check(phase=5, name="performance_slos", status=NOT_CHECKED, required=False,
          reason="not checked: outside node acceptance; serving_benchmark judges each model's "
          "SLOs on this node"),
)


@dataclass(frozen=True, kw_only=True)
class NodeAcceptance:
    node: str
    node_type: str
    qualified: bool
    reasons: tuple[str, ...]
    phases: tuple[dict, ...]
    checks: tuple[Check, ...]
    stack_facts: dict[str, Any]
    stack_fingerprint: str
    accepted_at: float
    report_path: str = ""
    extras: dict[str, Any] = field(default_factory=dict)


def verdict(checks: Sequence[Check]) -> tuple[bool, list[str], list[dict]]:
    """(qualified, reasons, one go/no-go row per phase)."""
    failed = [c for c in checks if c.status == FAIL]
    unmade = [c for c in checks if c.status == NOT_CHECKED and c.required]
    reasons = [f"phase {c.phase} {c.name}: {c.reason}" for c in failed + unmade]
    if all(c.status == NOT_CHECKED for c in checks):
        why = next((c.reason for c in checks if c.status == NOT_CHECKED), "no check ran")
        reasons.insert(0, f"nothing could be checked ({why.removeprefix('not checked: ')})")
    phases = []
    for num, title in PHASES.items():
        mine = [c for c in checks if c.phase == num]
        n = {st: sum(c.status == st for c in mine) for st in (PASS, FAIL, NOT_CHECKED)}
        blocked = [c for c in mine if c.status == FAIL or (c.status == NOT_CHECKED
                                                           and c.required)]
        phases.append({"phase": num, "title": title,
                       "verdict": "no-go" if blocked else "go" if n[PASS] else "not checked",
                       "passed": n[PASS], "failed": n[FAIL], "not_checked": n[NOT_CHECKED],
                       "reasons": "; ".join(f"{c.name}: {c.reason}" for c in blocked)})
    return not reasons, reasons, phases


def stack_fingerprint(facts: Mapping[str, Any]) -> str:
    """sha256 of the node facts an acceptance holds for (driver, CUDA, GPUs)."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


UPSTREAM = {"node_inventory": 2, "gpu_health": 2, "interconnect": 2, "memory_bandwidth": 2,
            "storage_read": 1}


def build_acceptance(s: NodeSetting, parts: Mapping[str, Any], now: float) -> NodeAcceptance:
    """Every upstream result's checks (an upstream never materialized for this node is a
    required check not made), the phases outside node acceptance, and the verdict."""
    checks: list[Check] = []
    for name, phase in UPSTREAM.items():
        part = parts.get(name)
        if part is None:
            checks.append(Check(phase=phase, name=name, status=NOT_CHECKED,
                                reason=f"not checked: {name} was never materialized for this "
                                "node"))
        else:
            checks.extend(part.checks)
    checks.extend(OUTSIDE_NODE_ACCEPTANCE)
    checks.sort(key=lambda c: c.phase)
    qualified, reasons, phases = verdict(checks)
    inv = parts.get("node_inventory")
    facts = dict(inv.stack_facts) if inv is not None else {}
    return NodeAcceptance(node=s.name, node_type=s.node_type, qualified=qualified,
                          reasons=tuple(reasons), phases=tuple(phases), checks=tuple(checks),
                          stack_facts=facts, stack_fingerprint=stack_fingerprint(facts),
                          accepted_at=now)


def stale_reasons(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What changed on the node since its acceptance (driver, CUDA, GPUs): each `field: before
    -> after`. Empty when the acceptance still describes the node."""
    return [f"{r['field']}: {r['before']} -> {r['after']}" for r in diff(dict(recorded),
                                                                         dict(current))]
