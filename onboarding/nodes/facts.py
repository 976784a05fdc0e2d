"""Parsers for what a GPU node says about itself: `nvidia-smi -q -x`, `nvidia-smi topo -m`,
`dcgmi diag -j`, sysfs PCIe link files, and nccl-tests' bus-bandwidth formula.

Pure functions over the tools' own text, so the recorded outputs of a real node
(tests/data/acceptance/) and crafted failing ones go through the same code. Every value a tool
prints as unavailable ("N/A", "[Not Supported]", "Requested functionality has been
deprecated", ...) becomes None, which the checks report as "not checked", never as a pass. A
value that is neither a number nor such a word (a field a new driver prints differently) also
becomes None, and is named in `GpuFacts.unreadable`, which the inventory's checks show.
The XML parser reads the current layout (driver 550+: `gpu_power_readings`,
`clocks_event_reasons`, `sram_*`/`dram_*` ECC counters, `remapped_rows`) and the older one
(`power_readings`, `clocks_throttle_reasons`, `single_bit`/`double_bit`).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_UNAVAILABLE = ("n/a", "[n/a]", "not supported", "[not supported]", "unknown error",
                "requested functionality has been deprecated", "", "none", "[unknown error]")


class FormatError(ValueError):
    """The text is not the tool output it claims to be (wrong file, truncated, an error
    message instead of a document)."""


def text(el: ET.Element | None, path: str) -> str | None:
    """The stripped text at `path`, None when absent or when the tool says it is unavailable."""
    if el is None:
        return None
    node = el.find(path)
    if node is None or node.text is None:
        return None
    value = node.text.strip()
    return None if value.lower() in _UNAVAILABLE else value


def number(el: ET.Element | None, path: str, unreadable: list[str] | None = None,
           at: str = "") -> float | None:
    """`700.00 W`, `16x`, `81559 MiB`, `41 C` -> the leading number; None when unavailable.
    A value with no number is None too, and `at + path` with the value goes to `unreadable`."""
    value = text(el, path)
    if value is None:
        return None
    m = _NUMBER.match(value)
    if m is None:
        if unreadable is not None:
            unreadable.append(f"{at}{path}: {value!r}")
        return None
    return float(m.group(1))


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _first(*values):
    return next((v for v in values if v is not None), None)


@dataclass(frozen=True, kw_only=True)
class GpuFacts:
    """One GPU of `nvidia-smi -q -x`; None where the tool reported nothing."""

    index: int
    name: str | None
    bus_id: str | None
    uuid: str | None
    serial: str | None
    vbios: str | None
    memory_total_mib: int | None
    persistence_mode: str | None
    mig_mode: str | None
    ecc_mode: str | None
    ecc_volatile_correctable: int | None
    ecc_volatile_uncorrectable: int | None
    ecc_aggregate_correctable: int | None
    ecc_aggregate_uncorrectable: int | None
    retired_pages_double_bit: int | None
    retired_pages_pending: str | None
    remapped_rows_uncorrectable: int | None
    remapped_rows_pending: str | None
    remapped_rows_failure: str | None
    pcie_gen_current: int | None
    pcie_gen_max: int | None  # the link's maximum (host and device together)
    pcie_gen_device_max: int | None
    pcie_gen_host_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    pcie_replay_count: int | None
    power_limit_w: float | None  # the limit in force
    power_limit_default_w: float | None
    power_limit_max_w: float | None
    power_draw_w: float | None
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    mem_clock_max_mhz: float | None
    temp_c: float | None
    temp_slowdown_c: float | None
    temp_shutdown_c: float | None
    clock_reasons_active: tuple[str, ...]
    fabric_state: str | None
    fabric_status: str | None
    # Fields printed with a value that is not a number, taken as missing: "<path>: '<value>'"
    unreadable: tuple[str, ...] = ()

    @property
    def row(self) -> dict[str, Any]:
        return {"gpu": self.index, "name": self.name, "bus_id": self.bus_id,
                "memory_mib": self.memory_total_mib, "vbios": self.vbios,
                "ecc": self.ecc_mode, "persistence": self.persistence_mode,
                "mig": self.mig_mode,
                "pcie": f"gen{self.pcie_gen_current}/{self.pcie_gen_max} "
                        f"x{self.pcie_width_current}/{self.pcie_width_max}",
                "power_limit_w": self.power_limit_w, "sm_clock_max_mhz": self.sm_clock_max_mhz,
                "fabric": self.fabric_state}


@dataclass(frozen=True)
class SmiReport:
    driver_version: str | None
    cuda_version: str | None
    timestamp: str | None
    gpus: tuple[GpuFacts, ...]

    @property
    def unreadable(self) -> tuple[str, ...]:
        """Every GPU's unreadable fields, `GPU<i> <path>: '<value>'`."""
        return tuple(f"GPU{g.index} {u}" for g in self.gpus for u in g.unreadable)


def _ecc_counts(errors: ET.Element | None, scope: str, unreadable: list[str] | None = None
                ) -> tuple[int | None, int | None]:
    """(correctable, uncorrectable) summed over one scope ("volatile" / "aggregate"), across
    both layouts: `sram_correctable`/`dram_uncorrectable`/... or `single_bit`/`double_bit`
    with a `total`. None when the GPU reports no counter (ECC off or not supported)."""
    node = errors.find(scope) if errors is not None else None
    if node is None:
        return None, None
    corr: int | None = None
    unc: int | None = None
    at = f"ecc_errors/{scope}/"
    for child in node:
        tag = child.tag
        uncorrectable = "uncorrectable" in tag or tag == "double_bit"
        if not uncorrectable and "correctable" not in tag and tag != "single_bit":
            continue  # not a count (`sram_threshold_exceeded` is Yes/No)
        value = (number(child, "total", unreadable, f"{at}{tag}/") if len(child)
                 else number(node, tag, unreadable, at))
        if value is None:
            continue
        if uncorrectable:
            unc = (unc or 0) + int(value)
        else:
            corr = (corr or 0) + int(value)
    return corr, unc


def _clock_reasons(gpu: ET.Element) -> tuple[str, ...]:
    for section, prefix in (("clocks_event_reasons", "clocks_event_reason_"),
                            ("clocks_throttle_reasons", "clocks_throttle_reason_")):
        node = gpu.find(section)
        if node is None:
            continue
        return tuple(child.tag.removeprefix(prefix) for child in node
                     if (child.text or "").strip() == "Active")
    return ()


def _gpu(index: int, g: ET.Element) -> GpuFacts:
    power = g.find("gpu_power_readings")
    power = power if power is not None else g.find("power_readings")
    link = g.find("pci/pci_gpu_link_info")
    errors = g.find("ecc_errors")
    unreadable: list[str] = []
    vol_c, vol_u = _ecc_counts(errors, "volatile", unreadable)
    agg_c, agg_u = _ecc_counts(errors, "aggregate", unreadable)

    def num(el: ET.Element | None, path: str) -> float | None:
        """`number`, naming an unreadable value by its path under <gpu>."""
        at = "" if el is g or el is None else "pci/pci_gpu_link_info/" if el is link \
            else f"{el.tag}/"
        return number(el, path, unreadable, at)

    return GpuFacts(
        index=index,
        name=text(g, "product_name"), bus_id=g.get("id") or text(g, "pci/pci_bus_id"),
        uuid=text(g, "uuid"), serial=text(g, "serial"), vbios=text(g, "vbios_version"),
        memory_total_mib=_int(num(g, "fb_memory_usage/total")),
        persistence_mode=text(g, "persistence_mode"), mig_mode=text(g, "mig_mode/current_mig"),
        ecc_mode=text(g, "ecc_mode/current_ecc"),
        ecc_volatile_correctable=vol_c, ecc_volatile_uncorrectable=vol_u,
        ecc_aggregate_correctable=agg_c, ecc_aggregate_uncorrectable=agg_u,
        retired_pages_double_bit=_int(num(
            g, "retired_pages/double_bit_retirement/retired_count")),
        retired_pages_pending=text(g, "retired_pages/pending_retirement"),
        remapped_rows_uncorrectable=_int(num(g, "remapped_rows/remapped_row_unc")),
        remapped_rows_pending=text(g, "remapped_rows/remapped_row_pending"),
        remapped_rows_failure=text(g, "remapped_rows/remapped_row_failure"),
        pcie_gen_current=_int(num(link, "pcie_gen/current_link_gen")),
        pcie_gen_max=_int(num(link, "pcie_gen/max_link_gen")),
        pcie_gen_device_max=_int(num(link, "pcie_gen/max_device_link_gen")),
        pcie_gen_host_max=_int(num(link, "pcie_gen/max_host_link_gen")),
        pcie_width_current=_int(num(link, "link_widths/current_link_width")),
        pcie_width_max=_int(num(link, "link_widths/max_link_width")),
        pcie_replay_count=_int(num(g, "pci/replay_counter")),
        power_limit_w=_first(num(power, "current_power_limit"),
                             num(power, "enforced_power_limit"),
                             num(power, "power_limit")),
        power_limit_default_w=num(power, "default_power_limit"),
        power_limit_max_w=num(power, "max_power_limit"),
        power_draw_w=_first(num(power, "instant_power_draw"),
                            num(power, "average_power_draw"), num(power, "power_draw")),
        sm_clock_mhz=num(g, "clocks/sm_clock"),
        sm_clock_max_mhz=num(g, "max_clocks/sm_clock"),
        mem_clock_max_mhz=num(g, "max_clocks/mem_clock"),
        temp_c=num(g, "temperature/gpu_temp"),
        temp_slowdown_c=num(g, "temperature/gpu_temp_slow_threshold"),
        temp_shutdown_c=num(g, "temperature/gpu_temp_max_threshold"),
        clock_reasons_active=_clock_reasons(g),
        fabric_state=text(g, "fabric/state"), fabric_status=text(g, "fabric/status"),
        unreadable=tuple(unreadable),
    )


def parse_smi_xml(xml_text: str) -> SmiReport:
    """`nvidia-smi -q -x` -> the driver, CUDA version and every GPU's facts."""
    try:
        root = ET.fromstring(xml_text.strip())
    except ET.ParseError as exc:
        raise FormatError(f"not nvidia-smi XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise FormatError(f"root element is <{root.tag}>, not <nvidia_smi_log>")
    gpus = tuple(_gpu(i, g) for i, g in enumerate(root.findall("gpu")))
    return SmiReport(driver_version=text(root, "driver_version"),
                     cuda_version=text(root, "cuda_version"), timestamp=text(root, "timestamp"),
                     gpus=tuple(sorted(gpus, key=lambda g: g.index)))


# ---- nvidia-smi topo -m ----

@dataclass(frozen=True)
class Topology:
    """The connection matrix between GPUs (and NICs), with each GPU's CPU and NUMA affinity."""

    devices: tuple[str, ...]  # GPU0.., NIC0..
    links: dict[tuple[str, str], str]  # ("GPU0", "GPU1") -> "NV18" / "SYS" / "PIX" ...
    cpu_affinity: dict[str, str | None]
    numa_affinity: dict[str, str | None]
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]

    def nvlinks(self, a: str, b: str) -> int:
        """Bonded NVLinks between two GPUs (`NV18` -> 18), 0 for a PCIe/system path."""
        m = re.fullmatch(r"NV(\d+)", self.links.get((a, b), ""))
        return int(m.group(1)) if m else 0

    def matrix_rows(self) -> list[dict[str, str]]:
        return [{"": a, **{b: self.links.get((a, b), "") for b in self.devices},
                 "cpu_affinity": self.cpu_affinity.get(a) or "",
                 "numa_affinity": self.numa_affinity.get(a) or ""} for a in self.gpus]


def parse_topo_matrix(topo_text: str) -> Topology:
    """`nvidia-smi topo -m` (tab-separated; terminal underlining codes are dropped)."""
    lines = [_ANSI.sub("", line).rstrip("\n") for line in topo_text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if "CPU Affinity" in line), None)
    if header_at is None:
        raise FormatError("no header line with 'CPU Affinity': not `nvidia-smi topo -m` output")
    header = [c.strip() for c in lines[header_at].split("\t") if c.strip()]
    devices = tuple(c for c in header if re.fullmatch(r"(GPU|NIC)\d+", c))
    if not devices:
        raise FormatError("the header names no GPU or NIC columns")
    links: dict[tuple[str, str], str] = {}
    cpu: dict[str, str | None] = {}
    numa: dict[str, str | None] = {}
    for line in lines[header_at + 1:]:
        cells = line.split("\t")
        name = cells[0].strip()
        if name not in devices:
            continue
        row = [c.strip() for c in cells[1:]]
        if len(row) < len(devices):
            raise FormatError(f"row {name} has {len(row)} cells for {len(devices)} devices")
        for col, cell in zip(devices, row[:len(devices)], strict=True):
            links[(name, col)] = cell
        rest = row[len(devices):]
        if name.startswith("GPU"):
            cpu[name] = _avail(rest[0]) if len(rest) > 0 else None
            numa[name] = _avail(rest[1]) if len(rest) > 1 else None
    nics = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", "\n".join(lines), flags=re.MULTILINE))
    return Topology(devices, links, cpu, numa, nics)


def _avail(cell: str) -> str | None:
    return None if cell.strip().lower() in _UNAVAILABLE else cell.strip()


# ---- dcgmi diag -j ----

@dataclass(frozen=True)
class DcgmResult:
    category: str
    test: str
    gpu: str  # "0", or "0,1,2" for the deployment tests that cover all GPUs
    status: str  # pass | fail | warn | skip | not run | unknown (<word>)
    messages: tuple[str, ...]


@dataclass(frozen=True)
class DcgmDiag:
    version: str | None
    driver_version: str | None
    results: tuple[DcgmResult, ...]

    def failed(self) -> list[DcgmResult]:
        return [r for r in self.results if r.status == "fail"]

    def not_run(self) -> list[DcgmResult]:
        return [r for r in self.results if r.status in ("not run", "skip")
                or r.status.startswith("unknown")]


_DCGM_STATUS = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn",
                "skip": "skip", "skipped": "skip", "not run": "not run"}


def _messages(result: dict) -> tuple[str, ...]:
    out = []
    for item in result.get("warnings") or []:
        out.append(item.get("warning", json.dumps(item)) if isinstance(item, dict) else str(item))
    return tuple(out)


def parse_dcgm_diag(diag_text: str) -> DcgmDiag:
    """`dcgmi diag -r N -j`, DCGM 3.x (`DCGM GPU Diagnostic`, `gpu_ids`) or 4.x (`DCGM
    Diagnostic`, `entity_id`, warnings as objects); a banner before the JSON is skipped.
    An unrecognised status word is kept as `unknown (<word>)`: never read as a pass."""
    start = diag_text.find("{")
    if start < 0:
        raise FormatError("no JSON document in the dcgmi output")
    try:
        data = json.loads(diag_text[start:])
    except json.JSONDecodeError as exc:
        raise FormatError(f"dcgmi output is not JSON ({exc})") from None
    root = data.get("DCGM GPU Diagnostic") or data.get("DCGM Diagnostic") or data
    meta = data.get("metadata") or {}
    results = []
    for cat in root.get("test_categories") or []:
        if not isinstance(cat, dict):
            continue
        for test in cat.get("tests") or []:
            if not isinstance(test, dict):
                continue
            for r in test.get("results") or []:
                if not isinstance(r, dict):
                    continue
                word = str(r.get("status", "")).strip().lower()
                gpu = r.get("gpu_ids", r.get("entity_id", ""))
                results.append(DcgmResult(
                    str(cat.get("category", "")), str(test.get("name", "")), str(gpu),
                    _DCGM_STATUS.get(word, f"unknown ({word or 'empty'})"), _messages(r)))
    return DcgmDiag(version=root.get("version") or meta.get("version"),
                    driver_version=root.get("driver_version_detected")
                    or meta.get("Driver Version Detected"), results=tuple(results))


# ---- PCIe link files in sysfs ----

_GT_PER_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def pcie_gen(speed: str | None) -> int | None:
    """sysfs `current_link_speed` ("32.0 GT/s PCIe") -> 5; None when unknown."""
    if not speed:
        return None
    m = _NUMBER.match(speed)
    return _GT_PER_GEN.get(float(m.group(1))) if m else None


# ---- nccl-tests' bus bandwidth ----

def allreduce_algbw_gbps(message_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth: bytes of one rank's buffer over the time of one all-reduce."""
    return message_bytes / seconds / 1e9


def allreduce_busbw_gbps(message_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth for all-reduce: algbw x 2(n-1)/n, comparable across rank counts
    and with the links' own speed (doc/PERFORMANCE.md of nccl-tests)."""
    if ranks < 2:
        raise ValueError("an all-reduce bus bandwidth needs at least 2 ranks")
    return allreduce_algbw_gbps(message_bytes, seconds) * 2 * (ranks - 1) / ranks
