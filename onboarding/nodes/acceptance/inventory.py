"""Phases 1 and 2 from what the node says about itself (`node_inventory`): GPUs, driver, ECC,
PCIe, fabric, NVLink, NICs, EDAC/AER and NVMe SMART against the node type's thresholds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onboarding.nodes.acceptance.checks import Check, Checker
from onboarding.nodes.acceptance.gpu_links import nvlink_tool_checks
from onboarding.nodes.acceptance.host import host_checks
from onboarding.nodes.acceptance.network import network_checks
from onboarding.nodes.acceptance.platform import platform_checks
from onboarding.nodes.acceptance.schema import NO_GPU, NodeSetting, Thresholds
from onboarding.nodes.acceptance.tools import Runs
from onboarding.nodes.facts import (
    FormatError,
    GpuFacts,
    SmiReport,
    Topology,
    parse_smi_xml,
    parse_topo_matrix,
    pcie_gen,
)
from onboarding.nodes.host_tools import ToolRun


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


@dataclass(frozen=True, kw_only=True)
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
    tools: dict[str, ToolRun] = field(default_factory=dict)  # the host tools' recordings

    @property
    def gpu_count(self) -> int:
        return len(self.smi.gpus) if self.smi else 0


def inventory_checks(s: NodeSetting, smi: SmiReport | None, smi_error: str,
                     topo: Topology | None, topo_error: str, nvlinks: dict[int, int] | None,
                     nvlink_error: str, system: Mapping[str, Any], tools: Runs | None = None
                     ) -> list[Check]:
    """Phase 1 to 4 facts against the node type's thresholds: nvidia-smi, sysfs and the host
    tools' recordings (`tools`, by recording name). `smi_error` is why there is no report:
    `no GPU: ...` when the node has no nvidia-smi, the tool's error when it failed."""
    t, c = s.thresholds, Checker(s.thresholds)
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
    runs = tools or {}
    host_checks(c, s, runs, topo)
    nvlink_tool_checks(c, s, runs)
    platform_checks(c, s, runs, smi.driver_version if smi else None,
                    len(smi.gpus) if smi else 0)
    network_checks(c, s, runs)
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
        c.skip(2, "driver", f"driver {smi.driver_version}; no driver_min configured")
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
    if s.gpus_expected < 2:
        c.skip(2, "nvlink", "1 GPU", required=False)
    elif want is None:
        c.skip(2, "nvlink", "no nvlinks_per_gpu configured")
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
        c.skip(1, "nic_pcie", system.get("nics_error") or "no NIC with a PCIe device")
    else:
        bad = [f"{n['name']} {n.get('speed')} x{n.get('width')} of {n.get('max_speed')} "
               f"x{n.get('max_width')}" for n in with_pci
               if n.get("width") != n.get("max_width")
               or pcie_gen(n.get("speed")) != pcie_gen(n.get("max_speed"))]
        c.add(1, "nic_pcie", not bad, "; ".join(bad) or f"{len(with_pci)} NIC(s) at capability",
              "link at its maximum", "NIC PCIe link below capability: " + "; ".join(bad))
    if not nics:
        c.skip(4, "nic_mtu", system.get("nics_error") or "no NIC found")
    else:
        small = [f"{n['name']} {n.get('mtu')}" for n in nics if (n.get("mtu") or 0) <
                 t.nic_mtu_min]
        c.add(4, "nic_mtu", not small, "; ".join(small) or ", ".join(
              f"{n['name']} {n.get('mtu')}" for n in nics), f">= {t.nic_mtu_min} (jumbo frames)",
              "MTU below jumbo frames: " + ", ".join(small))
    for name, key, what, most, fix in (
            ("edac", "edac", "memory controller(s)", t.host.edac_correctable_max,
             "reseat or replace the DIMM"),
            ("aer", "aer", "PCIe device(s)", t.pcie.aer_correctable_max,
             "hundreds of corrected ones mean a bad riser or cable")):
        rows = system.get(key)
        if rows is None:
            c.skip(1, name, system.get(f"{key}_error") or f"{key} not readable")
            continue
        bad = [f"{r['device']} {r['uncorrectable']} uncorrectable, {r.get('correctable', 0)} "
               "corrected" for r in rows
               if r["uncorrectable"] or (r.get("correctable") or 0) > most]
        worst = max((r.get("correctable") or 0 for r in rows), default=0)
        c.add(1, name, not bad, "; ".join(bad) or f"0 uncorrectable, at most {worst} corrected "
              f"on {len(rows)} {what}", f"0 uncorrectable, <= {most} corrected per device",
              f"{key.upper()} errors ({fix}): " + "; ".join(bad))
    smart = system.get("nvme")
    if smart is None:
        c.skip(1, "nvme_smart", system.get("nvme_error") or "nvme SMART not readable")
    else:
        bad = [f"{d['device']} {', '.join(p)}" for d in smart if (p := _smart_problems(d))]
        c.add(1, "nvme_smart", not bad, "; ".join(bad) or ", ".join(
              f"{d['device']} spare {d.get('available_spare')}% (threshold "
              f"{d.get('spare_threshold')}%)" for d in smart),
              "no critical warning, 0 media errors, available spare above its threshold",
              "NVMe SMART: " + "; ".join(bad))


def _smart_problems(d: Mapping[str, Any]) -> list[str]:
    spare, floor = d.get("available_spare"), d.get("spare_threshold")
    return ([f"critical_warning {d['critical_warning']}"] if d.get("critical_warning") else [])\
        + ([f"media_errors {d['media_errors']}"] if d.get("media_errors") else []) \
        + (["available spare not reported"] if spare is None else
           [f"available spare {spare}% at or under its threshold {floor}%"]
           if floor is not None and spare <= floor else [])


INVENTORY_NO_GPU_CHECKS = ((2, "gpu_count"), (2, "gpu_model"), (2, "driver"), (2, "ecc"),
                           (2, "row_remapping"), (1, "pcie_link"), (2, "persistence_mode"),
                           (2, "mig_mode"), (2, "power_limit"))


def build_inventory(s: NodeSetting, *, smi_xml: str | None, smi_error: str,
                    topo_text: str | None, topo_error: str, nvlinks: dict[int, int],
                    nvlink_error: str, system: dict[str, Any], stack_facts: dict[str, Any],
                    tools: Runs | None = None) -> NodeInventory:
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
                              system, tools)
    no_gpu = smi_error if smi is None else "" if smi.gpus else "nvidia-smi lists no GPU"
    return NodeInventory(node=s.name, node_type=s.node_type, gpus_expected=s.gpus_expected,
                         no_gpu=no_gpu, smi=smi, topology=topo, nvlinks_active=nvlinks,
                         system=system, stack_facts=stack_facts, checks=tuple(checks),
                         tools=dict(tools or {}))
