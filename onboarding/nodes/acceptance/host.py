"""Phase 1 from the host's own tools: the kernel log (MCE, AER, EDAC, Xid), the BMC's event log
and sensors (ipmitool), every GPU's and NIC's PCIe link (lspci LnkSta against LnkCap), the NUMA
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


def _pcie_lnksta(c: Checker, runs: Runs) -> None:
    """`lspci -vvv` where installed; else the same registers from sysfs (the pci-sysfs-links
    recording). Either way every GPU and NIC with a PCI Express link is judged."""
    want = "LnkSta = LnkCap (speed and width) for every GPU and NIC"
    lspci, sysfs = runs.get("lspci-vvv"), runs.get("pci-sysfs-links")
    if lspci is not None and not lspci.unavailable():
        links, via = ht.parse_lspci_links(lspci.output), "lspci"
    elif sysfs is not None and not sysfs.unavailable():
        links, via = ht.parse_pci_sysfs_links(sysfs.output), "sysfs"
    else:
        usable(c, runs, "lspci-vvv", 1, "pcie_lnksta", want)
        return
    links = [ln for ln in links if ln.is_gpu or ln.is_nic]
    if not links:
        c.skip(1, "pcie_lnksta", f"{via} shows no GPU or NIC with a PCI Express link (a VM's "
               "virtual devices)", want)
        return
    bad = [f"{'GPU' if ln.is_gpu else 'NIC'} {ln.describe()}" for ln in links
           if not ln.at_capability]
    c.add(1, "pcie_lnksta", not bad, "; ".join(bad) or f"{via}: " + ", ".join(
          f"{'GPU' if ln.is_gpu else 'NIC'} {ln.address} {ln.sta_speed} x{ln.sta_width}"
          for ln in links), want,
          "PCIe link below its capability (reseat, check the riser/cable/slot): "
          + "; ".join(bad))


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
