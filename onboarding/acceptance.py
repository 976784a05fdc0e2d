"""Node acceptance: the thresholds (configs/acceptance.yaml), the checks each node asset makes
from what the probe read, and the go/no-go verdict per phase.

A check is `pass`, `fail` or `not checked` (with why). Nothing unread is ever a pass: no GPU,
no NVML, no `nvme` tool, no threshold configured all give "not checked: <why>". A check is
*required* unless acceptance.yaml lists it under `optional` or no expectation is configured
for it. The verdict (docs/acceptance.md):

- qualified: no check failed, and every required check passed;
- not qualified: any check failed, or a required check could not be made; a node on which
  nothing at all could be checked (no GPU, no disk to read) is not qualified, with "nothing
  could be checked (<why>)" as its first reason.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from onboarding import telemetry as tm
from onboarding.catalog import StrictConfig, deep_merge, load_yaml, validate_config
from onboarding.errors import ConfigError
from onboarding.names import is_dns1123_subdomain
from onboarding.node_facts import (
    DcgmDiag,
    FormatError,
    GpuFacts,
    SmiReport,
    Topology,
    allreduce_busbw_gbps,
    parse_smi_xml,
    parse_topo_matrix,
    pcie_gen,
)
from onboarding.plan import NodesConfig
from onboarding.plan import NodeType as PlannedNodeType
from onboarding.stack import diff

PASS, FAIL, NOT_CHECKED = "pass", "fail", "not checked"
PHASES = {1: "hardware and system", 2: "GPU stack", 3: "serving smoke",
          4: "storage and cold start", 5: "performance SLOs"}
NO_GPU = "no GPU"
# Names of the raw files the probe keeps (resources/node_probe.py, scripts/gpu_node_probe.py)
# and the recorded test data uses (tests/data/acceptance/<set>/).
RAW_SMI_XML = "nvidia-smi-q.xml"
RAW_TOPO = "nvidia-smi-topo-m.txt"
RAW_DCGM = "dcgmi-diag.json"
RAW_NVML = "nvml.json"
RAW_SYSTEM = "system.json"
RAW_BURN = "burn.json"
RAW_INTERCONNECT = "interconnect.json"
RAW_MEMORY = "memory-bandwidth.json"
RAW_STORAGE = "storage-read.json"
# Clock-event reasons that mean the GPU is being held back by a fault, heat or the board, as
# opposed to the power cap a full-load burn is expected to reach.
DEFAULT_FORBIDDEN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown",
                             "hw_power_brake_slowdown")


# ---- configs/acceptance.yaml ----

class ProbeSettings(StrictConfig):
    """What the node assets run (the probe script shortens the burn on a lent machine)."""

    burn_s: float = Field(gt=0)
    sample_interval_s: float = Field(default=1.0, gt=0)
    matmul_size: int = Field(default=8192, ge=256)
    dcgm_diag_level: int = Field(default=3, ge=0, le=4)
    copy_mib: int = Field(default=4096, ge=1)
    copy_iters: int = Field(default=20, ge=1)
    p2p_mib: int = Field(default=1024, ge=1)
    allreduce_sizes_mib: list[int] = Field(default_factory=lambda: [16, 256, 1024], min_length=1)
    allreduce_iters: int = Field(default=20, ge=1)
    direct_read_gib: float = Field(default=4.0, gt=0)
    direct_read_block_mib: int = Field(default=16, ge=1)
    direct_read_threads: int = Field(default=8, ge=1)
    s3_object: str = Field(default="", description="s3://bucket/key of a large object; empty: "
                           "the S3 GET check is not made")
    s3_max_gib: float = Field(default=4.0, gt=0)
    gpu_job_timeout_s: float = Field(default=7800.0, gt=0)

    @field_validator("s3_object")
    @classmethod
    def _s3(cls, v: str) -> str:
        if v and (not v.startswith("s3://") or "/" not in v[5:] or v.endswith("/")):
            raise ValueError("expected s3://<bucket>/<key> of one object")
        return v


class PcieLimits(StrictConfig):
    min_gen: int = Field(ge=1, le=6)
    min_width: Literal[1, 2, 4, 8, 16, 32]


class BurnLimits(StrictConfig):
    min_duration_s: float = Field(gt=0)
    warmup_s: float = Field(default=10.0, ge=0)
    temperature_max_c: float = Field(gt=0)
    plateau_window_s: float = Field(default=120.0, gt=0)
    plateau_max_rise_c_per_min: float = Field(default=0.5, gt=0)
    sm_clock_min_fraction: float = Field(gt=0, le=1)
    power_min_fraction: float = Field(gt=0, le=1)
    forbidden_clock_reasons: list[str] = Field(
        default_factory=lambda: list(DEFAULT_FORBIDDEN_REASONS))
    matmul_tflops_min: float | None = Field(default=None, gt=0)
    compare_tolerance: float = Field(default=2e-2, gt=0, description="a burn result off by "
                                     "more than this x max(|reference|, 1) is an error (2 "
                                     "bf16 ulps); any bit difference is reported")

    @field_validator("forbidden_clock_reasons")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        unknown = sorted(set(v) - set(tm.CLOCK_REASON_BITS.values()))
        if unknown:
            raise ValueError(f"unknown clock reasons {unknown} (known: "
                             f"{', '.join(tm.CLOCK_REASON_BITS.values())})")
        return v


class MemoryLimits(StrictConfig):
    hbm_gbps: float = Field(gt=0, description="the GPU's HBM bandwidth on its data sheet")
    min_fraction: float = Field(gt=0, le=1)


class InterconnectLimits(StrictConfig):
    allreduce_busbw_min_gbps: dict[int, float] = Field(default_factory=dict)
    p2p_min_gbps: float | None = Field(default=None, gt=0)


class StorageLimits(StrictConfig):
    direct_read_min_gbps: float = Field(gt=0)
    s3_get_min_gbps: float | None = Field(default=None, gt=0)


class Thresholds(StrictConfig):
    """One node type's go/no-go limits (acceptance.yaml `defaults` overlaid by its entry)."""

    pcie: PcieLimits
    require_ecc: bool = True
    require_persistence_mode: bool = True
    mig: Literal["disabled", "enabled", "any"] = "disabled"
    power_limit_min_fraction: float = Field(default=1.0, gt=0, le=1,
                                            description="of the default power limit")
    fabric_manager_required: bool = False
    nvlinks_per_gpu: int | None = Field(default=None, ge=1)
    driver_min: str | None = None
    nic_mtu_min: int | None = Field(default=None, ge=576)
    burn: BurnLimits
    memory_bandwidth: MemoryLimits
    interconnect: InterconnectLimits = Field(default_factory=InterconnectLimits)
    storage: StorageLimits
    optional: list[str] = Field(default_factory=list)


class NodeRegistration(StrictConfig):
    node_type: str
    gpus: int | None = Field(default=None, ge=1, description="GPUs the node has; default: the "
                             "node type's gpus_per_node (a VM slice has fewer)")


class AcceptanceConfig(StrictConfig):
    probe: ProbeSettings
    node_types: dict[str, Thresholds] = Field(min_length=1)
    nodes: dict[str, NodeRegistration] = Field(default_factory=dict)

    def registration(self, node: str, origin: str) -> NodeRegistration:
        try:
            return self.nodes[node]
        except KeyError:
            raise ConfigError(f"node {node!r}", f"not registered in {origin} `nodes` (known: "
                              f"{', '.join(sorted(self.nodes)) or 'none'})",
                              "Add it under `nodes:` with its node type.") from None

    def thresholds(self, node_type: str, origin: str) -> Thresholds:
        try:
            return self.node_types[node_type]
        except KeyError:
            raise ConfigError(f"node type {node_type!r}", f"no thresholds in {origin} "
                              f"`node_types` (known: {', '.join(sorted(self.node_types))})",
                              "Add the node type's entry.") from None


def load_acceptance(path: Path, nodes: NodesConfig) -> AcceptanceConfig:
    """acceptance.yaml validated: every node type's `defaults` + its entry, every registered
    node's type known to nodes.yaml and to this file, node names valid Kubernetes node names."""
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(str(path), "expected a mapping with probe, defaults, node_types, nodes",
                          "See the repository's configs/acceptance.yaml.")
    defaults = data.get("defaults") or {}
    types = data.get("node_types") or {}
    if not isinstance(defaults, dict) or not isinstance(types, dict):
        raise ConfigError(str(path), "'defaults' and 'node_types' must be mappings",
                          "See the repository's configs/acceptance.yaml.")
    unknown = sorted(set(data) - {"probe", "defaults", "node_types", "nodes"})
    if unknown:
        raise ConfigError(str(path), f"unknown section(s) {unknown}",
                          "Use probe, defaults, node_types and nodes.")
    merged = {"probe": data.get("probe"), "nodes": data.get("nodes") or {},
              "node_types": {k: deep_merge(defaults, v or {}) for k, v in types.items()}}
    cfg = validate_config(AcceptanceConfig, merged, path, path, "Fix acceptance.yaml.")
    for name, reg in cfg.nodes.items():
        if not is_dns1123_subdomain(name):
            raise ConfigError(str(path), f"field 'nodes.{name}': not a Kubernetes node name "
                              "(lowercase letters, digits, '-' and '.')", "Rename the node.")
        if reg.node_type not in nodes.node_types:
            raise ConfigError(str(path), f"field 'nodes.{name}.node_type': {reg.node_type!r} "
                              f"is not a node type of nodes.yaml "
                              f"({', '.join(sorted(nodes.node_types))})",
                              "Use a node type of configs/nodes.yaml.")
        if reg.node_type not in cfg.node_types:
            raise ConfigError(str(path), f"field 'nodes.{name}.node_type': no thresholds for "
                              f"{reg.node_type!r} under node_types", "Add them.")
    return cfg


@dataclass(frozen=True)
class NodeSetting:
    """Everything a node asset needs about the node it runs for."""

    name: str
    node_type: str
    gpus_expected: int
    planned: PlannedNodeType
    thresholds: Thresholds
    probe: ProbeSettings
    tp_candidates: tuple[int, ...]


def node_setting(cfg: AcceptanceConfig, nodes: NodesConfig, name: str, origin: str
                 ) -> NodeSetting:
    reg = cfg.registration(name, origin)
    planned = nodes.node_types[reg.node_type]
    return NodeSetting(name, reg.node_type, reg.gpus or planned.gpus_per_node, planned,
                       cfg.thresholds(reg.node_type, origin), cfg.probe,
                       tuple(nodes.planning.tensor_parallel_candidates))


# ---- checks ----

@dataclass(frozen=True)
class Check:
    phase: int
    name: str
    status: str  # pass | fail | not checked
    measured: str = ""
    expected: str = ""
    reason: str = ""
    required: bool = True

    def row(self) -> dict[str, Any]:
        return {"phase": self.phase, "check": self.name, "result": self.status,
                "measured": self.measured, "expected": self.expected, "reason": self.reason,
                "required": self.required}


class Checker:
    """Builds checks for one node setting: a check is optional when acceptance.yaml says so."""

    def __init__(self, optional: Iterable[str] = ()):
        self.optional = set(optional)
        self.checks: list[Check] = []

    def add(self, phase: int, name: str, ok: bool, measured: Any, expected: Any,
            reason: str = "") -> None:
        self.checks.append(Check(phase, name, PASS if ok else FAIL, _fmt(measured),
                                 _fmt(expected), "" if ok else reason,
                                 name not in self.optional))

    def skip(self, phase: int, name: str, why: str, expected: Any = "",
             required: bool | None = None) -> None:
        """Not checked, with why. `required=False` for a check with nothing to judge against
        (no threshold configured, nothing of the kind on this node)."""
        req = name not in self.optional if required is None else required and \
            name not in self.optional
        self.checks.append(Check(phase, name, NOT_CHECKED, "", _fmt(expected),
                                 f"not checked: {why}", req))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _product_label(name: str) -> str:
    """nvidia-smi's product name as gpu-feature-discovery labels it (spaces -> '-')."""
    return "-".join(name.split())


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".") if p.isdigit())


def _not_read(g: GpuFacts, field: str) -> str:
    """`GPU0 not read`, with the unreadable values behind it where nvidia-smi printed some."""
    values = [u for u in g.unreadable if field in u]
    return f"GPU{g.index} not read" + (f" ({', '.join(values)})" if values else "")


def _per_gpu(gpus: Sequence[GpuFacts], bad: Iterable[str]) -> str:
    bad = list(bad)
    return "; ".join(bad) if bad else f"all {len(gpus)} GPU(s)"


# ---- node_inventory ----

@dataclass(frozen=True)
class NodeInventory:
    node: str
    node_type: str
    gpus_expected: int
    no_gpu: str  # why there is nothing to probe ("" when GPUs were read)
    smi: SmiReport | None
    topology: Topology | None
    nvlinks_active: dict[int, int]
    system: dict[str, Any]
    stack_facts: dict[str, Any]
    checks: tuple[Check, ...]

    @property
    def gpu_count(self) -> int:
        return len(self.smi.gpus) if self.smi else 0


def inventory_checks(s: NodeSetting, smi: SmiReport | None, smi_error: str,
                     topo: Topology | None, topo_error: str, nvlinks: dict[int, int] | None,
                     nvlink_error: str, system: Mapping[str, Any]) -> list[Check]:
    """Phase 1 and 2 facts against the node type's thresholds. `smi_error` is why there is no
    report: `no GPU: ...` when the node has no nvidia-smi, the tool's error when it failed."""
    t, c = s.thresholds, Checker(s.thresholds.optional)
    if smi is None:
        if smi_error.startswith(NO_GPU):
            for phase, name in ((2, "gpu_count"), (2, "gpu_model"), (2, "driver"),
                                (2, "ecc"), (2, "row_remapping"), (1, "pcie_link"),
                                (2, "persistence_mode"), (2, "mig_mode"), (2, "power_limit")):
                c.skip(phase, name, smi_error)
        else:
            c.add(2, "nvidia_smi", False, "failed", "runs", smi_error)
    else:
        _gpu_checks(c, s, smi)
        _fabric_check(c, s, smi)
        if smi.unreadable:  # said beside the checks that then judged fewer GPUs or none
            c.skip(2, "nvidia_smi_values", "nvidia-smi printed values that are not numbers, "
                   "taken as missing: " + "; ".join(smi.unreadable), required=False)
    _nvlink_check(c, s, smi, topo, topo_error, nvlinks, nvlink_error)
    _system_checks(c, t, system)
    return c.checks


def _gpu_checks(c: Checker, s: NodeSetting, smi: SmiReport) -> None:
    t, gpus = s.thresholds, smi.gpus
    c.add(2, "gpu_count", len(gpus) == s.gpus_expected, len(gpus), s.gpus_expected,
          f"{len(gpus)} GPU(s) visible, {s.gpus_expected} expected")
    want = s.planned.gpu_product
    wrong = [f"GPU{g.index} {g.name} {g.memory_total_mib} MiB" for g in gpus
             if _product_label(g.name or "") != want or g.memory_total_mib is None
             or abs(g.memory_total_mib - s.planned.memory_mib) > 0.01 * s.planned.memory_mib]
    c.add(2, "gpu_model", not wrong, _per_gpu(gpus, wrong) if wrong else
          f"{gpus[0].name} {gpus[0].memory_total_mib} MiB" if gpus else "none",
          f"{want} {s.planned.memory_mib} MiB", "; ".join(wrong) or "no GPU listed")
    if smi.driver_version is None:
        c.skip(2, "driver", "nvidia-smi reported no driver version")
    elif t.driver_min:
        ok = _version_tuple(smi.driver_version) >= _version_tuple(t.driver_min)
        c.add(2, "driver", ok, f"{smi.driver_version} (CUDA {smi.cuda_version})",
              f">= {t.driver_min}", f"driver {smi.driver_version} is older than {t.driver_min}")
    else:
        c.skip(2, "driver", f"driver {smi.driver_version}; no driver_min configured",
               required=False)
    _ecc_checks(c, t, gpus)
    _pcie_check(c, t, gpus)
    if t.require_persistence_mode:
        off = [f"GPU{g.index} {g.persistence_mode}" for g in gpus
               if g.persistence_mode != "Enabled"]
        c.add(2, "persistence_mode", not off, _per_gpu(gpus, off), "Enabled",
              "persistence mode off (`nvidia-smi -pm 1`): " + ", ".join(off))
    if t.mig != "any":
        want_mig = t.mig.capitalize()
        wrong_mig = [f"GPU{g.index} {g.mig_mode}" for g in gpus
                     if g.mig_mode is not None and g.mig_mode != want_mig]
        c.add(2, "mig_mode", not wrong_mig, _per_gpu(gpus, wrong_mig), want_mig,
              "MIG mode differs: " + ", ".join(wrong_mig))
    low = [f"GPU{g.index} {g.power_limit_w} W of default {g.power_limit_default_w} W"
           for g in gpus if g.power_limit_w is not None and g.power_limit_default_w
           and g.power_limit_w < t.power_limit_min_fraction * g.power_limit_default_w]
    unread = [g for g in gpus if g.power_limit_w is None or not g.power_limit_default_w]
    not_read = "; ".join(_not_read(g, "power_limit") for g in unread)
    if len(unread) == len(gpus):
        c.skip(2, "power_limit", f"nvidia-smi reported no power limits ({not_read})"
               if not_read else "nvidia-smi reported no power limits")
    else:
        read = next(g for g in gpus if g not in unread)
        c.add(2, "power_limit", not low, (_per_gpu(gpus, low) if low else
              f"{read.power_limit_w} W") + (f"; {not_read}" if not_read else ""),
              f">= {t.power_limit_min_fraction:.0%} of default",
              "power capped below the default: " + "; ".join(low))


def _ecc_checks(c: Checker, t: Thresholds, gpus: Sequence[GpuFacts]) -> None:
    if t.require_ecc:
        off = [f"GPU{g.index} {g.ecc_mode}" for g in gpus if g.ecc_mode != "Enabled"]
        c.add(2, "ecc", not off, _per_gpu(gpus, off), "Enabled",
              "ECC not enabled: " + ", ".join(off))
    unc = [f"GPU{g.index} volatile {g.ecc_volatile_uncorrectable} aggregate "
           f"{g.ecc_aggregate_uncorrectable}" for g in gpus
           if (g.ecc_volatile_uncorrectable or 0) > 0 or (g.ecc_aggregate_uncorrectable or 0) > 0]
    remap = [f"GPU{g.index} " + ", ".join(
        what for what, v in (("row remap pending", g.remapped_rows_pending),
                             ("row remap failed", g.remapped_rows_failure),
                             ("page retirement pending", g.retired_pages_pending)) if v == "Yes")
        for g in gpus if "Yes" in (g.remapped_rows_pending, g.remapped_rows_failure,
                                   g.retired_pages_pending)]
    if all(g.ecc_aggregate_uncorrectable is None and g.ecc_volatile_uncorrectable is None
           for g in gpus):
        c.skip(2, "ecc_uncorrectable", "no ECC counters reported (ECC off or not supported)")
    else:
        c.add(2, "ecc_uncorrectable", not unc, _per_gpu(gpus, unc) if unc else "0", "0",
              "uncorrectable ECC errors recorded: " + "; ".join(unc))
    if all(g.remapped_rows_pending is None and g.retired_pages_pending is None for g in gpus):
        c.skip(2, "row_remapping", "no row-remapping or page-retirement state reported")
    else:
        c.add(2, "row_remapping", not remap, _per_gpu(gpus, remap), "nothing pending or failed",
              "memory repair pending or failed (reset the GPU; replace it if it recurs): "
              + "; ".join(remap))


def _pcie_check(c: Checker, t: Thresholds, gpus: Sequence[GpuFacts]) -> None:
    """Width now against the link's capability, and the link's generation against the node
    type's. The current generation is reported, not judged: idle GPUs train the link down to
    save power, so an idle Gen1 reading is healthy."""
    bad, unread = [], []
    for g in gpus:
        if g.pcie_width_current is None or g.pcie_width_max is None or g.pcie_gen_max is None:
            unread.append(f"GPU{g.index}")
            continue
        if g.pcie_width_current < g.pcie_width_max:
            bad.append(f"GPU{g.index} x{g.pcie_width_current} of x{g.pcie_width_max}")
        elif g.pcie_width_max < t.pcie.min_width:
            bad.append(f"GPU{g.index} x{g.pcie_width_max} capable, x{t.pcie.min_width} needed")
        if g.pcie_gen_max < t.pcie.min_gen:
            bad.append(f"GPU{g.index} link gen{g.pcie_gen_max} (device "
                       f"gen{g.pcie_gen_device_max}, host gen{g.pcie_gen_host_max})")
    if len(unread) == len(gpus):
        c.skip(1, "pcie_link", "nvidia-smi reported no PCIe link state")
        return
    measured = "; ".join(bad) if bad else ", ".join(
        f"GPU{g.index} gen{g.pcie_gen_current}/{g.pcie_gen_max} x{g.pcie_width_current}"
        for g in gpus)
    c.add(1, "pcie_link", not bad and not unread, measured,
          f"gen{t.pcie.min_gen}+ x{t.pcie.min_width}, width at its maximum",
          "PCIe link below capability (reseat the GPU or check the riser/slot): "
          + "; ".join(bad + [f"{u} unreadable" for u in unread]))


def _fabric_check(c: Checker, s: NodeSetting, smi: SmiReport) -> None:
    required = s.thresholds.fabric_manager_required and s.gpus_expected > 1
    states = {(g.fabric_state, g.fabric_status) for g in smi.gpus}
    if all(st is None for st, _ in states):
        c.skip(2, "fabric_manager", "no NVSwitch fabric reported (fabric state N/A)",
               "Completed/Success" if required else "", required=required)
        return
    bad = [f"GPU{g.index} {g.fabric_state}/{g.fabric_status}" for g in smi.gpus
           if g.fabric_state != "Completed" or g.fabric_status not in (None, "Success")]
    c.add(2, "fabric_manager", not bad, _per_gpu(smi.gpus, bad), "Completed/Success",
          "GPU fabric not registered (is nvidia-fabricmanager running?): " + "; ".join(bad))


def _nvlink_check(c: Checker, s: NodeSetting, smi: SmiReport | None, topo: Topology | None,
                  topo_error: str, nvlinks: dict[int, int] | None, nvlink_error: str) -> None:
    want = s.thresholds.nvlinks_per_gpu
    if s.gpus_expected < 2 or want is None:
        why = "1 GPU" if s.gpus_expected < 2 else "no nvlinks_per_gpu configured"
        c.skip(2, "nvlink", why, required=False)
    elif smi is None:
        c.skip(2, "nvlink", topo_error or nvlink_error or NO_GPU)
    elif nvlinks:
        short = [f"GPU{g} {n} active" for g, n in sorted(nvlinks.items()) if n < want]
        c.add(2, "nvlink", not short, _per_gpu(smi.gpus, short) if short else
              f"{min(nvlinks.values())}+ active per GPU", f"{want} per GPU",
              "NVLinks down: " + ", ".join(short))
    elif topo is not None:
        pairs = [(a, b) for a in topo.gpus for b in topo.gpus if a < b]
        short = [f"{a}-{b} {topo.links.get((a, b))}" for a, b in pairs
                 if topo.nvlinks(a, b) == 0]
        c.add(2, "nvlink", not short, "; ".join(short) or f"{len(pairs)} GPU pairs on NVLink",
              "every GPU pair on NVLink", "GPU pairs without NVLink: " + "; ".join(short))
    else:
        c.skip(2, "nvlink", nvlink_error or topo_error)


def _system_checks(c: Checker, t: Thresholds, system: Mapping[str, Any]) -> None:
    nics = system.get("nics")
    with_pci = [n for n in nics or [] if n.get("max_width")]
    if not with_pci:
        c.skip(1, "nic_pcie", system.get("nics_error") or "no NIC with a PCIe device",
               required=False)
    else:
        bad = [f"{n['name']} {n.get('speed')} x{n.get('width')} of {n.get('max_speed')} "
               f"x{n.get('max_width')}" for n in with_pci
               if n.get("width") != n.get("max_width")
               or pcie_gen(n.get("speed")) != pcie_gen(n.get("max_speed"))]
        c.add(1, "nic_pcie", not bad, "; ".join(bad) or f"{len(with_pci)} NIC(s) at capability",
              "link at its maximum", "NIC PCIe link below capability: " + "; ".join(bad))
    if t.nic_mtu_min is None:
        c.skip(4, "nic_mtu", "no nic_mtu_min configured", required=False)
    elif not nics:
        c.skip(4, "nic_mtu", system.get("nics_error") or "no NIC found")
    else:
        small = [f"{n['name']} {n.get('mtu')}" for n in nics if (n.get("mtu") or 0) <
                 t.nic_mtu_min]
        c.add(4, "nic_mtu", not small, "; ".join(small) or "all at or above", f">= "
              f"{t.nic_mtu_min}", "MTU below the fabric's: " + ", ".join(small))
    for name, key, what in (("edac", "edac", "memory controller(s)"),
                            ("aer", "aer", "PCIe device(s)")):
        rows = system.get(key)
        if rows is None:
            c.skip(1, name, system.get(f"{key}_error") or f"{key} not readable")
            continue
        bad = [f"{r['device']} {r['uncorrectable']}" for r in rows if r["uncorrectable"]]
        c.add(1, name, not bad, "; ".join(bad) or f"0 uncorrectable on {len(rows)} {what}",
              "0 uncorrectable", f"uncorrectable {key.upper()} errors: " + "; ".join(bad))
    smart = system.get("nvme")
    if smart is None:
        c.skip(1, "nvme_smart", system.get("nvme_error") or "nvme SMART not readable")
    else:
        bad = [f"{d['device']} critical_warning {d.get('critical_warning')} media_errors "
               f"{d.get('media_errors')}" for d in smart
               if d.get("critical_warning") or d.get("media_errors")]
        c.add(1, "nvme_smart", not bad, "; ".join(bad) or f"{len(smart)} drive(s) healthy",
              "no critical warning, 0 media errors", "NVMe SMART: " + "; ".join(bad))


# ---- gpu_health ----

@dataclass(frozen=True)
class GpuHealth:
    node: str
    burn: dict[str, Any]  # the worker's result, `duration_s`, per-GPU iterations and errors
    samples: tuple[dict, ...]  # telemetry during the burn (onboarding.telemetry samples)
    windows: tuple[dict, ...]  # per-GPU summary of the steady part
    xids: tuple[dict, ...]
    dcgm: DcgmDiag | None
    checks: tuple[Check, ...]


def dcgm_check(c: Checker, diag: DcgmDiag | None, why_not: str, level: int) -> None:
    if diag is None:
        c.skip(2, "dcgm_diag", why_not)
        return
    failed = diag.failed()
    if failed:
        c.add(2, "dcgm_diag", False, f"{len(failed)} failed", f"dcgmi diag -r {level} passes",
              "; ".join(f"{r.test} GPU{r.gpu}: {' '.join(r.messages) or 'Fail'}"
                        for r in failed))
    elif not diag.results or len(diag.not_run()) == len(diag.results):
        c.skip(2, "dcgm_diag", f"dcgmi diag -r {level} ran no test")
    elif diag.not_run():
        c.skip(2, "dcgm_diag", "dcgmi diag did not run " + ", ".join(
            sorted({f"{r.test} ({r.status})" for r in diag.not_run()})))
    else:
        warned = [r for r in diag.results if r.status == "warn"]
        c.add(2, "dcgm_diag", True, f"{len(diag.results)} results pass"
              + (f", {len(warned)} warn" if warned else ""), f"dcgmi diag -r {level} passes")


def burn_checks(s: NodeSetting, gpus: Sequence[GpuFacts], burn: Mapping[str, Any],
                samples: Sequence[Mapping[str, Any]], xids: Sequence[Mapping[str, Any]],
                telemetry_why: str, xid_why: str, c: Checker) -> list[dict]:
    """The burn's verdicts: compute results against the reference, XIDs, ECC deltas,
    temperature plateau, clocks and power over the steady part (after `warmup_s`).
    Returns the per-GPU window summaries."""
    b = s.thresholds.burn
    if burn.get("error"):
        c.add(2, "burn_compute", False, "did not finish", "runs for the burn duration",
              str(burn["error"]))
    duration = float(burn.get("duration_s") or 0.0)
    c.add(2, "burn_duration", duration >= b.min_duration_s, f"{duration:.0f} s",
          f">= {b.min_duration_s:.0f} s", f"burn of {duration:.0f} s is shorter than the "
          f"{b.min_duration_s:.0f} s the node type requires")
    per_gpu = burn.get("per_gpu") or []
    if not burn.get("error"):
        bad = [f"GPU{g['gpu']}: {g['errors']} wrong elements in {g['checks']} checks"
               + ("" if g.get("reference_ok", True) else ", reference differs from the CPU")
               for g in per_gpu if g["errors"] or not g.get("reference_ok", True)]
        idle = [f"GPU{g['gpu']}" for g in per_gpu if not g["iterations"]]
        missing = sorted({x.index for x in gpus} - {int(g["gpu"]) for g in per_gpu})
        c.add(2, "burn_compute", not (bad or idle or missing) and bool(per_gpu),
              "; ".join(bad) or f"0 errors in {sum(g['checks'] for g in per_gpu)} checks",
              "0 wrong results",
              "; ".join(bad + [f"{x} did no work" for x in idle]
                        + [f"GPU{m} not burned" for m in missing]) or "no GPU burned")
    if b.matmul_tflops_min is None:
        c.skip(2, "burn_tflops", "no matmul_tflops_min configured", required=False)
    elif per_gpu:
        slow = [f"GPU{g['gpu']} {g['tflops']:.0f}" for g in per_gpu
                if g["tflops"] < b.matmul_tflops_min]
        c.add(2, "burn_tflops", not slow, "; ".join(slow) or
              f"min {min(g['tflops'] for g in per_gpu):.0f} TFLOP/s",
              f">= {b.matmul_tflops_min:.0f} TFLOP/s", "slow GPU(s): " + ", ".join(slow))
    if xid_why:
        c.skip(2, "burn_xid", xid_why)
    else:
        field_xids = [{"gpu": int(x["gpu"]), "xid": int(x[tm.XID]), "t_s": x["t_s"]}
                      for x in samples if x.get(tm.XID)]
        seen = list(xids) + field_xids
        c.add(2, "burn_xid", not seen, f"{len(seen)} XID event(s)", "none",
              "XID during the burn: " + ", ".join(
                  sorted({f"GPU{x['gpu']} XID {x['xid']}" for x in seen})))
    if telemetry_why:
        for name in ("burn_ecc", "burn_temperature", "burn_clocks", "burn_power"):
            c.skip(2, name, f"no telemetry: {telemetry_why}")
        return []
    # The burn's own span on the samples' clock (the job starts CUDA before it computes and the
    # sampler runs a little past its end): judged from `warmup_s` into it, to its end.
    start, end = burn.get("window_s") or (0.0, max((float(x["t_s"]) for x in samples),
                                                   default=0.0))
    burning = tm.window(samples, start, end)
    steady = tm.summarize(burning, start_s=start + b.warmup_s)
    _ecc_delta(c, samples)
    _temperature(c, b, burning, steady, end - start)
    _clocks(c, b, gpus, steady)
    _power(c, b, gpus, steady)
    return [w.row() for w in steady.values()]


def _ecc_delta(c: Checker, samples: Sequence[Mapping[str, Any]]) -> None:
    deltas = {}
    for g in tm.gpus_in(samples):
        vals = tm.values(samples, tm.ECC_DBE_VOL, g)
        if len(vals) >= 2:
            deltas[g] = vals[-1] - vals[0]
    if not deltas:
        c.skip(2, "burn_ecc", "ECC counters not readable during the burn")
        return
    grew = [f"GPU{g} +{int(d)}" for g, d in sorted(deltas.items()) if d > 0]
    c.add(2, "burn_ecc", not grew, ", ".join(grew) or "no new uncorrectable",
          "0 new uncorrectable", "new uncorrectable ECC errors during the burn: "
          + ", ".join(grew))


def _temperature(c: Checker, b: BurnLimits, samples, steady: dict[int, tm.GpuWindow],
                 span_s: float) -> None:
    temps = {g: w for g, w in steady.items() if w.temp_max_c is not None}
    if not temps:
        c.skip(2, "burn_temperature", "GPU temperature not read")
        return
    hot = [f"GPU{g} max {w.temp_max_c:.0f} C" for g, w in temps.items()
           if w.temp_max_c > b.temperature_max_c]
    rising = {g: r for g in temps if (r := tm.rise_c_per_min(samples, g, b.plateau_window_s))
              is not None and r > b.plateau_max_rise_c_per_min}
    measured = ", ".join(f"GPU{g} {w.temp_end_c:.0f} C" for g, w in temps.items())
    if hot:
        c.add(2, "burn_temperature", False, "; ".join(hot), f"<= {b.temperature_max_c:.0f} C",
              "over the temperature limit (check airflow/cooling): " + "; ".join(hot))
    elif rising or span_s < b.plateau_window_s:
        c.skip(2, "burn_temperature", f"no plateau yet ({measured}; rising "
               + (", ".join(f"GPU{g} {r:.1f} C/min" for g, r in rising.items()) or
                  f"unknown: burn shorter than the {b.plateau_window_s:.0f} s window")
               + ")", f"plateau <= {b.temperature_max_c:.0f} C")
    else:
        c.add(2, "burn_temperature", True, measured, f"plateau <= {b.temperature_max_c:.0f} C")


def _clocks(c: Checker, b: BurnLimits, gpus: Sequence[GpuFacts],
            steady: dict[int, tm.GpuWindow]) -> None:
    max_clock = {g.index: g.sm_clock_max_mhz for g in gpus}
    rows, bad = [], []
    for g, w in steady.items():
        if w.sm_clock_min_mhz is None:
            continue
        top = max_clock.get(g)
        floor = b.sm_clock_min_fraction * top if top else None
        rows.append(f"GPU{g} min {w.sm_clock_min_mhz:.0f} median {w.sm_clock_median_mhz:.0f}"
                    + (f" of {top:.0f} MHz" if top else " MHz"))
        if floor is not None and w.sm_clock_min_mhz < floor:
            bad.append(f"GPU{g} fell to {w.sm_clock_min_mhz:.0f} MHz (< {floor:.0f})")
        held = sorted(r for r in w.clock_reasons if r in b.forbidden_clock_reasons)
        if held:
            bad.append(f"GPU{g} held back by " + ", ".join(
                f"{r} {w.clock_reasons[r]:.0%} of samples" for r in held))
    if not rows:
        c.skip(2, "burn_clocks", "SM clock not read")
        return
    c.add(2, "burn_clocks", not bad, "; ".join(rows),
          f">= {b.sm_clock_min_fraction:.0%} of max SM clock, none of "
          f"{', '.join(b.forbidden_clock_reasons)}", "clock collapse: " + "; ".join(bad))


def _power(c: Checker, b: BurnLimits, gpus: Sequence[GpuFacts],
           steady: dict[int, tm.GpuWindow]) -> None:
    limit = {g.index: g.power_limit_w for g in gpus}
    rows, low = [], []
    for g, w in steady.items():
        if w.power_mean_w is None or not limit.get(g):
            continue
        rows.append(f"GPU{g} {w.power_mean_w:.0f} of {limit[g]:.0f} W")
        if w.power_mean_w < b.power_min_fraction * limit[g]:
            low.append(f"GPU{g} {w.power_mean_w:.0f} W < {b.power_min_fraction:.0%} of "
                       f"{limit[g]:.0f} W")
    if not rows:
        c.skip(2, "burn_power", "power draw or power limit not read")
        return
    c.add(2, "burn_power", not low, "; ".join(rows), f">= {b.power_min_fraction:.0%} of the "
          "power limit", "power well below the limit under full load (a GPU not doing the "
          "work, or capped elsewhere): " + "; ".join(low))


# ---- interconnect ----

@dataclass(frozen=True)
class Interconnect:
    node: str
    allreduce: tuple[dict, ...]  # rows: ranks, message_bytes, time_s, algbw_gbps, busbw_gbps
    p2p: tuple[dict, ...]  # rows: src, dst, peer_access, gbps
    checks: tuple[Check, ...]


def allreduce_rows(raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The worker's timings -> rows with nccl-tests' algbw and busbw."""
    rows = []
    for r in raw.get("allreduce") or []:
        t = float(r["time_s"])
        rows.append({"ranks": int(r["ranks"]), "message_bytes": int(r["bytes"]), "time_s": t,
                     "algbw_gbps": int(r["bytes"]) / t / 1e9,
                     "busbw_gbps": allreduce_busbw_gbps(int(r["bytes"]), t, int(r["ranks"])),
                     "correct": bool(r.get("correct", True))})
    return rows


def interconnect_checks(s: NodeSetting, gpu_count: int, raw: Mapping[str, Any] | None,
                        why_not: str, c: Checker) -> tuple[list[dict], list[dict]]:
    limits = s.thresholds.interconnect
    if gpu_count < 2 or raw is None:
        c.skip(2, "interconnect", why_not or f"{gpu_count} GPU", required=gpu_count >= 2)
        return [], []
    if raw.get("error"):
        c.add(2, "interconnect", False, "did not finish", "all-reduce and P2P run",
              str(raw["error"]))
        return [], []
    rows = allreduce_rows(raw)
    for ranks in sorted({r["ranks"] for r in rows}):
        mine = [r for r in rows if r["ranks"] == ranks]
        peak = max(r["busbw_gbps"] for r in mine)
        wrong = [r for r in mine if not r["correct"]]
        want = limits.allreduce_busbw_min_gbps.get(ranks)
        name = f"allreduce_tp{ranks}"
        if wrong:
            c.add(2, name, False, f"{len(wrong)} wrong sums", "correct sums",
                  "all-reduce returned wrong sums")
        elif want is None:
            c.skip(2, name, f"peak busbw {peak:.1f} GB/s; no allreduce_busbw_min_gbps for "
                   f"{ranks} ranks", required=False)
        else:
            c.add(2, name, peak >= want, f"peak busbw {peak:.1f} GB/s", f">= {want:.0f} GB/s",
                  f"all-reduce over {ranks} GPUs reaches {peak:.1f} GB/s bus bandwidth, "
                  f"below {want:.0f}")
    p2p = list(raw.get("p2p") or [])
    if not p2p:
        c.skip(2, "p2p", "no P2P measurement")
    else:
        no_peer = [f"GPU{r['src']}->GPU{r['dst']}" for r in p2p if not r["peer_access"]]
        worst = min(p2p, key=lambda r: r["gbps"])
        want = limits.p2p_min_gbps
        ok = not no_peer and (want is None or worst["gbps"] >= want)
        c.add(2, "p2p", ok, f"min {worst['gbps']:.1f} GB/s (GPU{worst['src']}->"
              f"GPU{worst['dst']})", f"peer access, >= {want or 0:.0f} GB/s",
              "; ".join([f"no peer access {x}" for x in no_peer]
                        + ([f"slowest pair {worst['gbps']:.1f} GB/s"] if want and
                           worst["gbps"] < want else [])))
    return rows, p2p


# ---- memory_bandwidth ----

@dataclass(frozen=True)
class MemoryBandwidth:
    node: str
    per_gpu: tuple[dict, ...]  # gpu, bytes, copy_gbps (read + write)
    checks: tuple[Check, ...]


def memory_checks(s: NodeSetting, raw: Mapping[str, Any] | None, why_not: str,
                  c: Checker) -> None:
    m = s.thresholds.memory_bandwidth
    floor = m.min_fraction * m.hbm_gbps
    if raw is None:
        c.skip(2, "hbm_copy", why_not, f">= {floor:.0f} GB/s")
        return
    if raw.get("error"):
        c.add(2, "hbm_copy", False, "did not finish", f">= {floor:.0f} GB/s", str(raw["error"]))
        return
    per = raw.get("per_gpu") or []
    slow = [f"GPU{r['gpu']} {r['copy_gbps']:.0f}" for r in per if r["copy_gbps"] < floor]
    c.add(2, "hbm_copy", bool(per) and not slow,
          ", ".join(f"GPU{r['gpu']} {r['copy_gbps']:.0f} GB/s" for r in per) or "nothing",
          f">= {m.min_fraction:.0%} of {m.hbm_gbps:.0f} GB/s",
          "device-to-device copy below the HBM figure: " + ", ".join(slow) if slow
          else "no GPU measured")


# ---- storage_read ----

@dataclass(frozen=True)
class StorageRead:
    node: str
    direct_read: dict[str, Any]  # path, bytes, seconds, gbps / or why_not
    s3_get: dict[str, Any]
    checks: tuple[Check, ...]


def storage_checks(s: NodeSetting, direct: Mapping[str, Any], s3: Mapping[str, Any],
                   c: Checker) -> None:
    lim = s.thresholds.storage
    if direct.get("why_not"):
        c.skip(1, "direct_io_read", direct["why_not"], f">= {lim.direct_read_min_gbps} GB/s")
    else:  # judged from the raw measurement, so a recorded set re-judges from what was read
        gbps = direct["bytes"] / direct["seconds"] / 1e9
        c.add(1, "direct_io_read", gbps >= lim.direct_read_min_gbps,
              f"{gbps:.2f} GB/s ({direct['bytes'] / 2**30:.1f} GiB, O_DIRECT)",
              f">= {lim.direct_read_min_gbps} GB/s", f"sequential direct-I/O read of "
              f"{direct['path']} is {gbps:.2f} GB/s")
    if s3.get("error"):
        c.add(4, "s3_get", False, "failed", f">= {lim.s3_get_min_gbps} GB/s", s3["error"])
    elif s3.get("why_not"):
        c.skip(4, "s3_get", s3["why_not"], required=lim.s3_get_min_gbps is not None
               and "no s3_object" not in s3["why_not"])
    elif lim.s3_get_min_gbps is None:
        c.skip(4, "s3_get", f"{s3['gbps']:.2f} GB/s measured; no s3_get_min_gbps configured",
               required=False)
    else:
        c.add(4, "s3_get", s3["gbps"] >= lim.s3_get_min_gbps, f"{s3['gbps']:.2f} GB/s",
              f">= {lim.s3_get_min_gbps} GB/s", f"S3 GET from {s3['uri']} is "
              f"{s3['gbps']:.2f} GB/s")


# ---- node_acceptance ----

OUTSIDE_NODE_ACCEPTANCE = (
    Check(3, "serving_smoke", NOT_CHECKED, required=False,
          reason="not checked: outside node acceptance; load_timing starts the engine (TP from "
          "the model's plan) on this node for every model"),
    Check(5, "performance_slos", NOT_CHECKED, required=False,
          reason="not checked: outside node acceptance; serving_benchmark judges each model's "
          "SLOs on this node"),
)


@dataclass(frozen=True)
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


# ---- assembling each asset's result (the assets stay thin) ----

INVENTORY_NO_GPU_CHECKS = ((2, "gpu_count"), (2, "gpu_model"), (2, "driver"), (2, "ecc"),
                           (2, "row_remapping"), (1, "pcie_link"), (2, "persistence_mode"),
                           (2, "mig_mode"), (2, "power_limit"))
HEALTH_CHECKS = ("dcgm_diag", "burn_duration", "burn_compute", "burn_xid", "burn_ecc",
                 "burn_temperature", "burn_clocks", "burn_power")


def build_inventory(s: NodeSetting, *, smi_xml: str | None, smi_error: str,
                    topo_text: str | None, topo_error: str, nvlinks: dict[int, int],
                    nvlink_error: str, system: dict[str, Any], stack_facts: dict[str, Any]
                    ) -> NodeInventory:
    """Parse what the probe read and judge it. Unparseable tool output is a failed check
    naming the parser's complaint (the tool ran and said something else)."""
    smi = topo = None
    if smi_xml is not None:
        try:
            smi = parse_smi_xml(smi_xml)
        except FormatError as exc:
            smi_error = f"`nvidia-smi -q -x` output unreadable: {exc}"
    if topo_text is not None:
        try:
            topo = parse_topo_matrix(topo_text)
        except FormatError as exc:
            topo_error = f"`nvidia-smi topo -m` output unreadable: {exc}"
    checks = inventory_checks(s, smi, smi_error, topo, topo_error, nvlinks, nvlink_error,
                              system)
    no_gpu = smi_error if smi is None else "" if smi.gpus else "nvidia-smi lists no GPU"
    return NodeInventory(s.name, s.node_type, s.gpus_expected, no_gpu, smi, topo, nvlinks,
                         system, stack_facts, tuple(checks))


def build_health(s: NodeSetting, inv: NodeInventory, *, diag: DcgmDiag | None, diag_why: str,
                 level: int, burn: Mapping[str, Any] | None, samples: Sequence[dict],
                 xids: Sequence[dict], telemetry_why: str, xid_why: str) -> GpuHealth:
    c = Checker(s.thresholds.optional)
    if inv.no_gpu or burn is None:
        for name in HEALTH_CHECKS:
            c.skip(2, name, inv.no_gpu or "the burn did not run")
        return GpuHealth(s.name, {}, (), (), (), None, tuple(c.checks))
    dcgm_check(c, diag, diag_why, level)
    gpus = inv.smi.gpus if inv.smi else ()
    windows = burn_checks(s, gpus, burn, samples, xids, telemetry_why, xid_why, c)
    return GpuHealth(s.name, dict(burn), tuple(samples), tuple(windows), tuple(xids), diag,
                     tuple(c.checks))


def tp_groups(s: NodeSetting, gpu_count: int) -> list[int]:
    """TP group sizes the node supports: the plan's candidates above 1 that fit."""
    return [t for t in s.tp_candidates if 1 < t <= gpu_count]


def build_interconnect(s: NodeSetting, inv: NodeInventory, raw: Mapping[str, Any] | None,
                       why: str) -> Interconnect:
    c = Checker(s.thresholds.optional)
    why = inv.no_gpu or why or ("" if inv.gpu_count > 1 else f"{inv.gpu_count} GPU")
    rows, p2p = interconnect_checks(s, inv.gpu_count, None if why else raw, why, c)
    return Interconnect(s.name, tuple(rows), tuple(p2p), tuple(c.checks))


def build_memory(s: NodeSetting, inv: NodeInventory, raw: Mapping[str, Any] | None, why: str
                 ) -> MemoryBandwidth:
    c = Checker(s.thresholds.optional)
    memory_checks(s, None if inv.no_gpu else raw, inv.no_gpu or why, c)
    return MemoryBandwidth(s.name, tuple((raw or {}).get("per_gpu") or ()), tuple(c.checks))


def build_storage(s: NodeSetting, direct: dict[str, Any], s3: dict[str, Any]) -> StorageRead:
    c = Checker(s.thresholds.optional)
    storage_checks(s, direct, s3, c)
    return StorageRead(s.name, direct, s3, tuple(c.checks))


UPSTREAM = {"node_inventory": 2, "gpu_health": 2, "interconnect": 2, "memory_bandwidth": 2,
            "storage_read": 1}


def build_acceptance(s: NodeSetting, parts: Mapping[str, Any], now: float) -> NodeAcceptance:
    """Every upstream result's checks (an upstream never materialized for this node is a
    required check not made), the phases outside node acceptance, and the verdict."""
    checks: list[Check] = []
    for name, phase in UPSTREAM.items():
        part = parts.get(name)
        if part is None:
            checks.append(Check(phase, name, NOT_CHECKED, reason=f"not checked: {name} was "
                                "never materialized for this node"))
        else:
            checks.extend(part.checks)
    checks.extend(OUTSIDE_NODE_ACCEPTANCE)
    checks.sort(key=lambda c: c.phase)
    qualified, reasons, phases = verdict(checks)
    inv = parts.get("node_inventory")
    facts = dict(inv.stack_facts) if inv is not None else {}
    return NodeAcceptance(s.name, s.node_type, qualified, tuple(reasons), tuple(phases),
                          tuple(checks), facts, stack_fingerprint(facts), now)


def stale_reasons(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What changed on the node since its acceptance (driver, CUDA, GPUs): each `field: before
    -> after`. Empty when the acceptance still describes the node."""
    return [f"{r['field']}: {r['before']} -> {r['after']}" for r in diff(dict(recorded),
                                                                         dict(current))]
