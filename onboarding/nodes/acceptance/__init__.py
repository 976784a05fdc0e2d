"""Node acceptance: the thresholds (configs/acceptance.yaml), the checks each node asset makes
from what the probe read, and the go/no-go verdict per phase.

A check is `pass`, `fail` or `not checked` (with why), with its threshold and where the
threshold comes from. Nothing unread is ever a pass: no GPU, no NVML, no `nvme` tool, no
threshold configured all give "not checked: <why>", which blocks unless the node type waives the
check with a reason. The verdict (docs/acceptance.md):

- qualified: no check failed, and every required check passed;
- not qualified: any check failed, or a check could not be made and the node type's
  `waivers` do not accept the node without it; a node on which
  nothing at all could be checked (no GPU, no disk to read) is not qualified, with "nothing
  could be checked (<why>)" as its first reason.

By phase, as the node assets run (docs/acceptance.md): schema.py (acceptance.yaml, the
phases, the probe's raw file names), checks.py (a check and its builder), one module per node
asset (inventory.py, gpu_health.py, interconnect.py, memory_bandwidth.py, storage_read.py:
its checks and its result), the host tools' checks by phase (tools.py: what is run; host.py
phase 1, gpu_links.py phase 2, platform.py phase 3, network.py phase 4), and verdict.py
(node_acceptance). Callers import the package
(`from onboarding.nodes import acceptance as acc`); the names below are its interface.
"""

from __future__ import annotations

from onboarding.nodes.acceptance.checks import FAIL, NOT_CHECKED, PASS, Check, Checker
from onboarding.nodes.acceptance.gpu_health import (
    HEALTH_CHECKS,
    GpuHealth,
    build_health,
    burn_checks,
    dcgm_check,
)
from onboarding.nodes.acceptance.interconnect import (
    Interconnect,
    allreduce_rows,
    build_interconnect,
    interconnect_checks,
    tp_groups,
)
from onboarding.nodes.acceptance.inventory import (
    INVENTORY_NO_GPU_CHECKS,
    NodeInventory,
    build_inventory,
    inventory_checks,
)
from onboarding.nodes.acceptance.memory_bandwidth import (
    MemoryBandwidth,
    build_memory,
    memory_checks,
)
from onboarding.nodes.acceptance.schema import (
    CHECK_NAMES,
    DEFAULT_FORBIDDEN_REASONS,
    NO_GPU,
    PHASES,
    RAW_BURN,
    RAW_DCGM,
    RAW_INTERCONNECT,
    RAW_MEMORY,
    RAW_NVML,
    RAW_SMI_XML,
    RAW_STORAGE,
    RAW_SYSTEM,
    RAW_TOPO,
    AcceptanceConfig,
    BurnLimits,
    Deviation,
    GpuStackLimits,
    HostLimits,
    InterconnectLimits,
    MemoryLimits,
    NodeRegistration,
    NodeSetting,
    PcieLimits,
    ProbeSettings,
    StorageLimits,
    Thresholds,
    load_acceptance,
    node_setting,
)
from onboarding.nodes.acceptance.storage_read import StorageRead, build_storage, storage_checks
from onboarding.nodes.acceptance.tools import LOAD_LINK_COMMANDS, STRESS_COMMAND, TOOL_COMMANDS
from onboarding.nodes.acceptance.verdict import (
    OUTSIDE_NODE_ACCEPTANCE,
    UPSTREAM,
    NodeAcceptance,
    build_acceptance,
    stack_fingerprint,
    stale_reasons,
    verdict,
)

__all__ = [
    "CHECK_NAMES",
    "DEFAULT_FORBIDDEN_REASONS",
    "FAIL",
    "HEALTH_CHECKS",
    "INVENTORY_NO_GPU_CHECKS",
    "LOAD_LINK_COMMANDS",
    "NOT_CHECKED",
    "NO_GPU",
    "OUTSIDE_NODE_ACCEPTANCE",
    "PASS",
    "PHASES",
    "RAW_BURN",
    "RAW_DCGM",
    "RAW_INTERCONNECT",
    "RAW_MEMORY",
    "RAW_NVML",
    "RAW_SMI_XML",
    "RAW_STORAGE",
    "RAW_SYSTEM",
    "RAW_TOPO",
    "STRESS_COMMAND",
    "TOOL_COMMANDS",
    "UPSTREAM",
    "AcceptanceConfig",
    "BurnLimits",
    "Check",
    "Checker",
    "Deviation",
    "GpuHealth",
    "GpuStackLimits",
    "HostLimits",
    "Interconnect",
    "InterconnectLimits",
    "MemoryBandwidth",
    "MemoryLimits",
    "NodeAcceptance",
    "NodeInventory",
    "NodeRegistration",
    "NodeSetting",
    "PcieLimits",
    "ProbeSettings",
    "StorageLimits",
    "StorageRead",
    "Thresholds",
    "allreduce_rows",
    "build_acceptance",
    "build_health",
    "build_interconnect",
    "build_inventory",
    "build_memory",
    "build_storage",
    "burn_checks",
    "dcgm_check",
    "interconnect_checks",
    "inventory_checks",
    "load_acceptance",
    "memory_checks",
    "node_setting",
    "stack_fingerprint",
    "stale_reasons",
    "storage_checks",
    "tp_groups",
    "verdict",
]
