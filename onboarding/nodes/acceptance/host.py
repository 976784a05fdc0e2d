"""Phase 1 from the host's own tools: the kernel log (MCE, AER, EDAC, Xid), the BMC's event log
and sensors (ipmitool), every GPU's and NIC's PCIe link (lspci LnkSta against LnkCap: at idle,
and each GPU's again under the burn's load, since an idle GPU trains its link down), the NUMA
map against nodes.yaml, and the CPU/memory stress with the EDAC counters read before and
after."""

from __future__ import annotations

from onboarding.nodes import host_tools as ht
from onboarding.nodes.acceptance.checks import Checker
from onboarding.nodes.acceptance.schema import NodeSetting
from onboarding.nodes.acceptance.tools import Runs, usable
from onboarding.nodes.facts import Topology


def host_checks(c: Checker, s: NodeSetting, runs: Runs, topo: Topology | None) -> None:
    _kernel_log(c, s, runs)
    _ipmi(c, s, runs)
    _pcie_lnksta(c, runs)
    numa_map_check(c, s, runs, topo)
    _stress(c, s, runs)


def _kernel_log(c: Checker, s: NodeSetting, runs: Runs) -> None:
    most = s.thresholds.pcie.aer_correctable_max
    want = f"no MCE, uncorrected AER, EDAC UE or Xid; <= {most} corrected AER per device"
    run = usable(c, runs, "dmesg", 1, "kernel_log", want)
    if run is None:
        return
    log = ht.parse_kernel_log(run.output)
    bad = ([f"{len(log.mce)} machine-check line(s): {log.mce[0]}"] if log.mce else []) + \
        ([f"{len(log.aer_uncorrected)} uncorrected AER: {log.aer_uncorrected[0]}"]
         if log.aer_uncorrected else []) + \
        [f"{n} corrected AER from {dev}" for dev, n in sorted(log.aer_corrected.items())
         if n > most] + \
        ([f"EDAC {log.edac_ue} UE"] if log.edac_ue else []) + \
        ([f"EDAC {log.edac_ce} CE"] if log.edac_ce > s.thresholds.host.edac_correctable_max
         else []) + \
        ([", ".join(sorted(set(log.xids)))] if log.xids else [])
    c.add(1, "kernel_log", not bad, "; ".join(bad) or
          f"{log.lines} lines: no MCE/AER/EDAC/Xid finding "
          f"({sum(log.aer_corrected.values())} corrected AER)", want,
          "the kernel logged hardware errors: " + "; ".join(bad))


def _ipmi(c: Checker, s: NodeSetting, runs: Runs) -> None:
    run = usable(c, runs, "ipmitool-sel", 1, "ipmi_sel", "no asserted fault event")
    if run is not None:
        entries, bad = ht.parse_ipmi_sel(run.output)
        c.add(1, "ipmi_sel", not bad, f"{len(bad)} fault event(s) of {entries}" if bad else
              f"{entries} event(s), no fault", "no asserted fault event",
              "the BMC logged faults: " + "; ".join(bad[:5])
              + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""))
    ok = s.thresholds.host.ipmi_sensor_ok
    run = usable(c, runs, "ipmitool-sdr", 1, "ipmi_sensors", f"every sensor {'/'.join(ok)}")
    if run is not None:
        rows = ht.parse_ipmi_sdr(run.output)
        bad = [f"{name} {reading} ({status})" for name, reading, status in rows
               if status not in ok]
        c.add(1, "ipmi_sensors", bool(rows) and not bad, "; ".join(bad) or
              f"{len(rows)} sensors {'/'.join(ok)}", f"every sensor {'/'.join(ok)}",
              "sensors out of range: " + "; ".join(bad) if rows else "ipmitool sdr listed "
              "no sensor")


def read_links(runs: Runs, lspci: str = "lspci-vvv", sysfs: str = "pci-sysfs-links"
               ) -> tuple[list[ht.PciLink], str] | None:
    """Every GPU's and NIC's PCI Express link from `lspci -vvv` where it ran, else from the same
    registers in sysfs (the pci-sysfs-links recording), and which of the two; None when
    neither says anything about the node."""
    for name, parse, via in ((lspci, ht.parse_lspci_links, "lspci"),
                             (sysfs, ht.parse_pci_sysfs_links, "sysfs")):
        run = runs.get(name)
        if run is not None and not run.unavailable():
            return [ln for ln in parse(run.output) if ln.is_gpu or ln.is_nic], via
    return None


def _kind(ln: ht.PciLink) -> str:
    return "GPU" if ln.is_gpu else "NIC"


def _pcie_lnksta(c: Checker, runs: Runs) -> None:
    """At idle: every NIC's LnkSta = LnkCap (speed and width), every GPU's width = LnkCap. A
    GPU's link *speed* below its capability at idle is no fault: the driver trains an idle
    GPU's link down to save power and back up under load (nvidia-smi: "PCIe link generation
    may be reduced when the GPU is not in use"). The GPU's speed is judged by pcie_lnksta_load
    from the read the probe takes while the burn runs."""
    want = ("LnkSta = LnkCap (speed and width) for every NIC; every GPU's width = LnkCap (its "
            "speed at idle may be trained down: judged under load, pcie_lnksta_load)")
    read = read_links(runs)
    if read is None:
        usable(c, runs, "lspci-vvv", 1, "pcie_lnksta", want)
        return
    links, via = read
    if not links:
        c.skip(1, "pcie_lnksta", f"{via} shows no GPU or NIC with a PCI Express link (a VM's "
               "virtual devices)", want)
        return
    bad = [f"{_kind(ln)} {ln.describe()}" for ln in links
           if ln.sta_width != ln.cap_width or (ln.is_nic and not ln.at_capability)]
    idle = [ln for ln in links if ln.is_gpu and not ln.at_capability
            and ln.sta_width == ln.cap_width]
    shown = ", ".join(f"{_kind(ln)} {ln.address} {ln.sta_speed} x{ln.sta_width}"
                      + (f" of {ln.cap_speed} (idle: speed judged under load)"
                         if ln in idle else "") for ln in links)
    c.add(1, "pcie_lnksta", not bad, "; ".join(bad) or f"{via}: {shown}", want,
          "PCIe link below its capability (reseat, check the riser/cable/slot): "
          + "; ".join(bad))


def pcie_under_load_check(c: Checker, runs: Runs, read_s: float | None,
                          window_s: tuple[float, float] | list[float] | None) -> None:
    """Every GPU's LnkSta = LnkCap, speed and width, read while the GPUs compute (the probe
    reads `lspci -vvv` or sysfs again during the burn: `lspci-vvv-load`,
    `pci-sysfs-links-load`). A read outside the burn's compute window says nothing of the link
    under load: not checked."""
    want = "LnkSta = LnkCap (speed and width) for every GPU, read under load"
    read = read_links(runs, "lspci-vvv-load", "pci-sysfs-links-load")
    if read is None:
        run = runs.get("lspci-vvv-load") or runs.get("pci-sysfs-links-load")
        c.skip(1, "pcie_lnksta_load", run.unavailable() if run is not None else
               "the PCIe links were not read during the burn", want)
        return
    if read_s is not None and window_s and not window_s[0] <= read_s <= window_s[1]:
        c.skip(1, "pcie_lnksta_load", f"the links were read at {read_s:.0f} s, outside the "
               f"burn's compute window ({window_s[0]:.0f}-{window_s[1]:.0f} s)", want)
        return
    links, via = read
    gpus = [ln for ln in links if ln.is_gpu]
    if not gpus:
        c.skip(1, "pcie_lnksta_load", f"{via} under load shows no GPU with a PCI Express link",
               want)
        return
    bad = [f"GPU {ln.describe()}" for ln in gpus if not ln.at_capability]
    c.add(1, "pcie_lnksta_load", not bad, "; ".join(bad) or f"{via} under load: " + ", ".join(
          f"GPU {ln.address} {ln.sta_speed} x{ln.sta_width}" for ln in gpus), want,
          "GPU PCIe link below its capability under load (reseat the GPU, check the "
          "riser/cable/slot): " + "; ".join(bad))


def numa_map_check(c: Checker, s: NodeSetting, runs: Runs, topo: Topology | None) -> None:
    layout = s.planned.numa_layout()
    want = "; ".join(f"GPUs {','.join(map(str, g))} on NUMA node {i}"
                     for i, g in enumerate(layout))
    if s.gpus_expected < s.planned.gpus_per_node:
        c.skip(1, "numa_map", f"{s.gpus_expected} of the node type's {s.planned.gpus_per_node} "
               "GPUs (a slice): nodes.yaml's map is for the whole node", want)
        return
    run = usable(c, runs, "numactl-hardware", 1, "numa_map", want)
    if run is None:
        return
    nodes = ht.parse_numactl(run.output)
    if topo is None or not topo.numa_affinity:
        c.skip(1, "numa_map", "`nvidia-smi topo -m` gave no NUMA affinity per GPU", want)
        return
    bad = [] if len(nodes) >= len(layout) else [
        f"{len(nodes)} NUMA node(s), nodes.yaml places GPUs on {len(layout)}"]
    for numa, gpus in enumerate(layout):
        for g in gpus:
            got = topo.numa_affinity.get(f"GPU{g}")
            if got != str(numa):
                bad.append(f"GPU{g} on NUMA node {got}, nodes.yaml says {numa}")
    c.add(1, "numa_map", not bad, "; ".join(bad) or f"{len(nodes)} NUMA nodes; " + ", ".join(
          f"GPU{g.removeprefix('GPU')}:{n}" for g, n in sorted(topo.numa_affinity.items())),
          want, "NUMA placement differs from configs/nodes.yaml (TP groups are planned on "
          "it): " + "; ".join(bad))


def _stress(c: Checker, s: NodeSetting, runs: Runs) -> None:
    h = s.thresholds.host
    want = f"completes, 0 failed, >= {h.stress_min_s:.0f} s"
    run = usable(c, runs, "stress-ng", 1, "cpu_memory_stress", want)
    if run is not None:
        st = ht.parse_stress_ng(run.output)
        bad = ([] if st.completed and run.exit_code == 0 else
               [f"exit {run.exit_code}: {st.summary or ht._last_line(run.output)}"]) + \
            ([f"{st.failed} stressor(s) failed"] if st.failed else []) + \
            ([f"ran {st.seconds:.0f} s"] if st.seconds is not None and
             st.seconds < h.stress_min_s else [])
        c.add(1, "cpu_memory_stress", not bad, st.summary or ht._last_line(run.output), want,
              "CPU/memory stress: " + "; ".join(bad))
    want = f"0 new UE, <= {h.edac_correctable_max} new CE during the stress"
    before = usable(c, runs, "edac-before", 1, "stress_edac", want)
    after = runs.get("edac-after")
    if before is None:
        return
    if after is None or run is None:
        c.skip(1, "stress_edac", "no stress run with an EDAC read after it", want)
        return
    b, a = ht.parse_edac_counts(before.output), ht.parse_edac_counts(after.output)
    if not b or not a:
        c.skip(1, "stress_edac", "no EDAC memory controller (no EDAC driver, or a VM)", want)
        return
    delta = {k: a.get(k, 0) - v for k, v in b.items()}
    bad = [f"{k.split('/')[0]} +{d} {'UE' if 'ue' in k else 'CE'}" for k, d in
           sorted(delta.items()) if d > (0 if "ue" in k else h.edac_correctable_max)]
    c.add(1, "stress_edac", not bad, "; ".join(bad) or f"no new error on "
          f"{len({k.split('/')[0] for k in b})} memory controller(s)", want,
          "memory errors during the stress (reseat or replace the DIMM): " + "; ".join(bad))
