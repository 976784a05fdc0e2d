"""A measurement counts only on a qualified node: the check `load_timing` and
`serving_benchmark` carry, from the node's latest `node_acceptance`.

The check fails, with the reason, when the node the engine ran on has no acceptance, its
latest acceptance did not qualify it, or the node's driver, CUDA or GPUs differ from what the
acceptance ran on (`nvidia-smi` read now against the facts the acceptance recorded). Whether it
applies is the traffic profile's `require_node_acceptance` (configs/scenarios.yaml): the `cpu`
profile of the embedded default measures on a laptop, the `gpu` one on fleet nodes.

Not a stage (no `defs`): the serving stage imports it. What it reads is the `NodeAcceptance`
value the asset stored, through the IO manager (`resources/upstream.stored_value`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from assets.partitions import cells_partitions, nodes_partitions
from onboarding.nodes.acceptance import NodeAcceptance, stale_reasons
from resources.stack_facts import nvidia_facts
from resources.upstream import stored_value

NODE_ACCEPTANCE = dg.AssetKey("node_acceptance")
NODE_CHECK = "measured_on_qualified_node"


def node_check_spec(asset: str, blocking: bool = False) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(NODE_CHECK, asset=asset, blocking=blocking,
                             partitions_def=cells_partitions,
                             description="the node it ran on passed node_acceptance on its "
                             "current driver (when the profile's require_node_acceptance)")


def acceptance_problem(io_manager: dg.IOManager, instance: dg.DagsterInstance, node: str,
                       current_facts: Mapping[str, Any] | None = None
                       ) -> tuple[str, NodeAcceptance | None]:
    """("" when the node's acceptance holds, else why not; the acceptance it read).

    Reads the `NodeAcceptance` the asset stored (its verdict, reasons and node facts), never its
    metadata, which is for people."""
    value = stored_value(io_manager, instance, NODE_ACCEPTANCE, node, nodes_partitions)
    if value is None:
        return (f"node {node!r} has no node_acceptance: run the accept_node job for it "
                "(register it in configs/acceptance.yaml `nodes`)"), None
    if not value.qualified:
        reasons = list(value.reasons)
        more = f" (+{len(reasons) - 3} more in its report)" if len(reasons) > 3 else ""
        return (f"node {node!r} is not qualified: {'; '.join(reasons[:3]) or 'see its report'}"
                f"{more}"), value
    now = nvidia_facts() if current_facts is None else current_facts
    changed = stale_reasons(value.stack_facts or {}, now)
    if changed:
        return (f"node {node!r} changed since its acceptance ({'; '.join(changed)}): accept "
                "it again"), value
    return "", value


def node_acceptance_check(io_manager: dg.IOManager, instance: dg.DagsterInstance, node: str,
                          required: bool, profile: str,
                          current_facts: Mapping[str, Any] | None = None
                          ) -> dg.AssetCheckResult:
    """Passes when the node's acceptance holds, or when the profile does not require one
    (the metadata still says what the acceptance state is)."""
    problem, accepted = acceptance_problem(io_manager, instance, node, current_facts)
    return dg.AssetCheckResult(
        check_name=NODE_CHECK, passed=not problem or not required,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"node": node, "profile": profile, "required": required,
                  "acceptance": dg.MetadataValue.text(problem or "qualified, current"),
                  "accepted_at": dg.MetadataValue.timestamp(accepted.accepted_at)
                  if accepted is not None and accepted.accepted_at else dg.MetadataValue.null()})
