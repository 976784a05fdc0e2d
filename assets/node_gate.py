"""A measurement counts only on a qualified node: the check `load_timing` and
`serving_benchmark` carry, from the node's latest `node_acceptance`.

The check fails, with the reason, when the node the engine ran on has no acceptance, its
latest acceptance did not qualify it, or the node's driver, CUDA or GPUs differ from what the
acceptance ran on (`nvidia-smi` read now against the facts the acceptance recorded). Whether it
applies is the traffic profile's `require_node_acceptance` (configs/scenarios.yaml): the `cpu`
profile of the embedded default measures on a laptop, the `gpu` one on fleet nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from onboarding.nodes.acceptance import stale_reasons
from onboarding.serving.stack import nvidia_facts
from resources.upstream import latest_materialization

NODE_ACCEPTANCE = dg.AssetKey("node_acceptance")
NODE_CHECK = "measured_on_qualified_node"


def node_check_spec(asset: str, blocking: bool = False) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(NODE_CHECK, asset=asset, blocking=blocking,
                             description="the node it ran on passed node_acceptance on its "
                             "current driver (when the profile's require_node_acceptance)")


def _value(mat: dg.AssetMaterialization, key: str) -> Any:
    entry = mat.metadata.get(key)
    return entry.value if entry is not None else None


def acceptance_problem(instance: dg.DagsterInstance, node: str,
                       current_facts: Mapping[str, Any] | None = None) -> tuple[str, dict]:
    """("" when the node's acceptance holds, else why not; what the acceptance recorded)."""
    mat = latest_materialization(instance, NODE_ACCEPTANCE, node)
    if mat is None:
        return (f"node {node!r} has no node_acceptance: run the accept_node job for it "
                "(register it in configs/acceptance.yaml `nodes`)"), {}
    recorded = {"qualified": _value(mat, "qualified"),
                "accepted_at": _value(mat, "accepted_at"),
                "node_stack": _value(mat, "node_stack") or {}}
    if not recorded["qualified"]:
        reasons = [r.removeprefix("- ") for r in str(_value(mat, "reasons") or "").splitlines()
                   if r.strip()]
        more = f" (+{len(reasons) - 3} more in its report)" if len(reasons) > 3 else ""
        return (f"node {node!r} is not qualified: {'; '.join(reasons[:3]) or 'see its report'}"
                f"{more}"), recorded
    now = nvidia_facts() if current_facts is None else current_facts
    changed = stale_reasons(recorded["node_stack"], now)
    if changed:
        return (f"node {node!r} changed since its acceptance ({'; '.join(changed)}): accept "
                "it again"), recorded
    return "", recorded


def node_acceptance_check(instance: dg.DagsterInstance, node: str, required: bool,
                          profile: str, current_facts: Mapping[str, Any] | None = None
                          ) -> dg.AssetCheckResult:
    """Passes when the node's acceptance holds, or when the profile does not require one
    (the metadata still says what the acceptance state is)."""
    problem, recorded = acceptance_problem(instance, node, current_facts)
    return dg.AssetCheckResult(
        check_name=NODE_CHECK, passed=not problem or not required,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"node": node, "profile": profile, "required": required,
                  "acceptance": dg.MetadataValue.text(problem or "qualified, current"),
                  "accepted_at": dg.MetadataValue.timestamp(recorded["accepted_at"])
                  if recorded.get("accepted_at") else dg.MetadataValue.null()})
