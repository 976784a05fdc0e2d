"""What node acceptance is judged against: configs/acceptance.yaml (probe settings, thresholds
per node type, registered nodes), the phases, and the raw files the probe keeps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from onboarding.common.config import StrictConfig, deep_merge, load_yaml, validate_config
from onboarding.common.errors import ConfigError
from onboarding.common.names import is_dns1123_subdomain
from onboarding.deploy.plan import NodesConfig
from onboarding.deploy.plan import NodeType as PlannedNodeType
from onboarding.nodes import telemetry as tm

PHASES = {1: "hardware and system", 2: "GPU stack", 3: "platform and serving smoke",
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
# Every check's name, as `sources`, `deviations` and `waivers` key them (`allreduce` stands for
# every `allreduce_tp<N>`).
CHECK_NAMES = frozenset({
    "pcie_link", "pcie_lnksta", "pcie_lnksta_load", "nic_pcie", "kernel_log", "edac", "aer",
    "ipmi_sel", "ipmi_sensors", "numa_map", "cpu_memory_stress", "stress_edac", "nvme_smart",
    "direct_io_read", "direct_io_write", "nvidia_smi", "nvidia_smi_values", "gpu_count",
    "gpu_model", "driver", "ecc", "ecc_uncorrectable", "row_remapping", "persistence_mode",
    "mig_mode", "power_limit", "fabric_manager", "nvlink", "nvlink_status", "nvlink_errors",
    "dcgm_diag", "burn_duration", "burn_compute", "burn_tflops", "burn_xid", "burn_ecc",
    "ecc_sbe_rate", "burn_temperature", "burn_clocks", "burn_power", "allreduce", "p2p",
    "interconnect", "hbm_copy", "nic_mtu", "nic_firmware", "container_toolkit", "nouveau",
    "dkms", "s3_get", "node_inventory", "gpu_health", "memory_bandwidth", "storage_read"})
# Clock-event reasons that mean the GPU is being held back by a fault, heat or the board, as
# opposed to the power cap a full-load burn is expected to reach.
DEFAULT_FORBIDDEN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown",
                             "hw_power_brake_slowdown")


class ProbeSettings(StrictConfig):
    """What the node assets run (the probe script shortens the burn on a test machine)."""

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
    stress_s: float = Field(default=600.0, ge=0, description="stress-ng CPU/memory run between "
                            "two EDAC reads; 0 = not run")
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
    aer_correctable_max: int = Field(default=100, ge=0, description="corrected AER per device "
                                     "since boot; hundreds mean a bad riser or cable")


class HostLimits(StrictConfig):
    """Phase 1 beyond PCIe: memory errors, the BMC, the stress step."""

    edac_correctable_max: int = Field(default=0, ge=0, description="corrected memory errors "
                                      "per controller since boot")
    stress_min_s: float = Field(default=600.0, gt=0, description="the CPU/memory stress run")
    numa_nodes_min: int = Field(default=2, ge=1, description="NUMA nodes the host must show")
    ipmi_sensor_ok: list[str] = Field(default_factory=lambda: ["ok", "ns"], description=(
        "`ipmitool sdr` status words that pass (ns: no reading)"))


class GpuStackLimits(StrictConfig):
    """Phase 2 beyond the burn: error counters the procedure reads."""

    ecc_sbe_max_per_hour: float = Field(default=0.0, ge=0, description="new single-bit ECC "
                                        "errors per GPU-hour of the burn")
    nvlink_errors_max: int = Field(default=0, ge=0, description="replay/recovery/CRC errors "
                                   "per link (`nvidia-smi nvlink -e`)")


class BurnLimits(StrictConfig):
    min_duration_s: float = Field(gt=0)
    warmup_s: float = Field(default=10.0, ge=0)
    temperature_max_c: float = Field(gt=0, description="below the GPU's throttle point")
    plateau_window_s: float = Field(default=120.0, gt=0)
    plateau_max_rise_c_per_min: float = Field(default=0.5, gt=0)
    sm_clock_drop_max_fraction: float = Field(ge=0, lt=1, description="the steady part's "
                                              "lowest SM clock may sit this far under its "
                                              "median, no further")
    power_min_fraction: float = Field(gt=0, le=1, description="mean power over the steady "
                                      "part, of the enforced limit (about TDP)")
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
    direct_write_min_gbps: float = Field(gt=0)
    s3_get_min_gbps: float = Field(gt=0)


class Deviation(StrictConfig):
    """Where the project holds a value other than the acceptance procedure's."""

    procedure: str = Field(min_length=1, description="the procedure's value, as it says it")
    why: str = Field(min_length=1, description="one line: why the project differs")


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
    nic_mtu_min: int = Field(ge=576)
    nic_firmware_min: dict[str, str] = Field(default_factory=dict, description="NIC driver "
                                             "(ethtool -i) -> lowest firmware accepted")
    dcgm_diag_level_min: int = Field(default=3, ge=1, le=4)
    gpu_temperature_alarm_c: float = Field(default=85.0, gt=0, description=(
        "the GPU temperature alarm in service (the procedure's production alarm); not judged "
        "at acceptance, whose burn limit is burn.temperature_max_c"))
    host: HostLimits = Field(default_factory=HostLimits)
    gpu_stack: GpuStackLimits = Field(default_factory=GpuStackLimits)
    burn: BurnLimits
    memory_bandwidth: MemoryLimits
    interconnect: InterconnectLimits = Field(default_factory=InterconnectLimits)
    storage: StorageLimits
    sources: dict[str, str] = Field(default_factory=dict, description="check -> where its "
                                    "threshold comes from")
    deviations: dict[str, Deviation] = Field(default_factory=dict, description="check -> the "
                                             "procedure's value and why the project differs")
    waivers: dict[str, str] = Field(default_factory=dict, description="check -> why this node "
                                    "type is accepted without it; a waived check that cannot "
                                    "be made does not block")

    @field_validator("waivers", "deviations", "sources")
    @classmethod
    def _reasons(cls, v: dict) -> dict:
        unknown = sorted(set(v) - CHECK_NAMES)
        if unknown:
            raise ValueError(f"unknown check(s) {unknown} (known: {', '.join(sorted(CHECK_NAMES))})")
        empty = sorted(k for k, why in v.items() if isinstance(why, str) and not why.strip())
        if empty:
            raise ValueError(f"{empty}: say why in one line")
        return v

    @model_validator(mode="after")
    def _alarm_above_the_burn_limit(self) -> Thresholds:
        if self.gpu_temperature_alarm_c < self.burn.temperature_max_c:
            raise ValueError(f"gpu_temperature_alarm_c {self.gpu_temperature_alarm_c:g} is below "
                             f"burn.temperature_max_c {self.burn.temperature_max_c:g}: a node "
                             "accepted at the burn's limit would page in service")
        return self

    def source(self, check: str) -> str:
        """Where `check`'s threshold comes from; with the procedure's value where the project
        holds another."""
        d = self.deviations.get(check)
        base = self.sources.get(check, "")
        if d is None:
            return base
        return f"project ({d.why}); procedure: {d.procedure}" + (f"; {base}" if base else "")


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


@dataclass(frozen=True, kw_only=True)
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
    return NodeSetting(name=name, node_type=reg.node_type,
                       gpus_expected=reg.gpus or planned.gpus_per_node, planned=planned,
                       thresholds=cfg.thresholds(reg.node_type, origin), probe=cfg.probe,
                       tp_candidates=tuple(nodes.planning.tensor_parallel_candidates))
