"""The host tools' recordings and parsers: the real recording of an H100 VM's tools
(tests/data/acceptance/h100-node-tools/) and crafted faults (labelled), and the checks they
feed: a tool that is absent or cannot run is "not checked" and blocks, never a pass."""

from pathlib import Path

import pytest

from onboarding.nodes import acceptance as acc
from onboarding.nodes import host_tools as ht
from onboarding.nodes.acceptance.checks import Checker
from onboarding.nodes.acceptance.host import numa_map_check, pcie_under_load_check
from onboarding.nodes.facts import parse_topo_matrix
from resources.config_files import ConfigFiles

DATA = Path(__file__).parents[1] / "data" / "acceptance"
H100 = DATA / "h100-node-tools"  # recorded on an H100 in a Firecracker microVM
# the same kind of VM with lspci and stress-ng carried in, the link read again under load
H100_LOAD = DATA / "h100-lspci-stress-load"
HEALTHY, FAULTY = DATA / "crafted-h200x2-healthy", DATA / "crafted-h200x2-faulty"  # crafted
TOOL_CHECKS = ("kernel_log", "ipmi_sel", "ipmi_sensors", "pcie_lnksta", "cpu_memory_stress",
               "stress_edac", "nvlink_errors", "nvlink_status", "container_toolkit", "nouveau",
               "dkms", "nic_firmware")


def recorded() -> dict[str, ht.ToolRun]:
    return ht.load_recordings(H100)


def test_a_recording_is_the_command_its_output_and_its_exit():
    run = ht.parse_recording("x", ht.render_recording("nvidia-smi nvlink -s", "GPU 0: x\n", 3))
    assert (run.command, run.output, run.exit_code) == ("nvidia-smi nvlink -s", "GPU 0: x", 3)
    with pytest.raises(ValueError, match=r"ends with `# exit <N>`"):
        ht.parse_recording("x", "$ dmesg\nsome output\n")
    with pytest.raises(ValueError, match=r"starts with `\$ <command>`"):
        ht.parse_recording("x", "dmesg output\n# exit 0\n")


def test_the_recorded_node_says_which_tools_it_lacks():
    runs = recorded()
    assert runs["stress-ng"].unavailable() == "`stress-ng` is not installed"  # exit 127
    # lsmod is missing inside a pipeline that exits 0 (cat ran after it)
    assert runs["lsmod-nouveau"].exit_code == 0
    assert runs["lsmod-nouveau"].unavailable() == "`lsmod` is not installed"
    assert "cannot access '/sys/devices/system/edac'" in runs["edac-before"].unavailable()
    assert runs["dmesg"].unavailable() == "" and runs["numactl-hardware"].unavailable() == ""
    no_bmc = ht.ToolRun("ipmitool-sel", "ipmitool sel elist", "Could not open device at "
                        "/dev/ipmi0 or /dev/ipmi/0 or /dev/ipmidev/0: No such file or "
                        "directory", 1)
    assert no_bmc.unavailable().startswith("ipmitool-sel exited 1: Could not open device")


def test_pcie_links_from_sysfs_and_lspci():
    [gpu] = ht.parse_pci_sysfs_links(recorded()["pci-sysfs-links"].output)  # virtio NIC: none
    assert gpu.is_gpu and gpu.at_capability and (gpu.sta_speed, gpu.sta_width) == ("32GT/s", 16)
    slow = ht.parse_pci_sysfs_links("0000:3b:00.0 vendor=0x10de class=0x030200 cur=8.0 GT/s "
                                    "PCIe/x8 max=32.0 GT/s PCIe/x16")  # crafted: Gen3 x8
    assert not slow[0].at_capability
    links = ht.parse_lspci_links(ht.load_recordings(FAULTY)["lspci-vvv"].output)  # crafted
    assert [(ln.address, ln.is_gpu, ln.at_capability) for ln in links] == [
        ("19:00.0", True, False), ("1a:00.0", False, True), ("3b:00.0", True, False),
        ("3c:00.0", False, True)]  # GPU0 idles at 2.5GT/s x16: power saving, not a fault
    assert links[2].describe() == "3b:00.0 8GT/s x8 of 32GT/s x16"


def test_kernel_log_findings():
    clean = ht.parse_kernel_log(recorded()["dmesg"].output)
    assert clean.lines > 300 and not (clean.mce or clean.aer_corrected or clean.xids)
    bad = ht.parse_kernel_log(ht.load_recordings(FAULTY)["dmesg"].output)  # crafted
    assert bad.aer_corrected == {"0000:19:00.0": 500} and not bad.aer_uncorrected
    assert bad.xids == ("Xid 63 on 0000:19:00", "Xid 64 on 0000:19:00")
    mixed = ht.parse_kernel_log(
        "[1.0] mce: [Hardware Error]: Machine check events logged\n"
        "[2.0] pcieport 0000:00:01.0: AER: Uncorrectable (Fatal) error message received\n"
        "[2.1] nvme 0000:05:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Inaccessible\n"
        "[3.0] EDAC MC0: 2 CE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0\n")
    assert len(mixed.mce) == 1 and len(mixed.aer_uncorrected) == 1 and mixed.edac_ce == 2


def test_stress_ng_summary_and_edac_counts():
    long = ht.parse_stress_ng(ht.load_recordings(HEALTHY)["stress-ng"].output)  # crafted
    assert long.completed and long.seconds == pytest.approx(600.12) and long.failed == 0
    short = ht.parse_stress_ng("stress-ng: info:  [9] unsuccessful run completed in 20.03 secs"
                               "\nstress-ng: info:  [9] failed: 1: vm (1)")
    assert not short.completed and short.seconds == pytest.approx(20.03) and short.failed == 1
    after = ht.parse_edac_counts(ht.load_recordings(FAULTY)["edac-after"].output)  # crafted
    assert after["mc0/ce_count"] == 4 and after["mc1/ue_count"] == 0


def test_nvlink_counters_and_status():
    assert ht.parse_nvlink_errors(recorded()["nvidia-smi-nvlink-e"].output) == {}  # one GPU
    runs = ht.load_recordings(FAULTY)  # crafted
    counters = ht.parse_nvlink_errors(runs["nvidia-smi-nvlink-e"].output)
    assert len(counters) == 36 and counters[(1, 5)]["CRC Errors"] == 1873
    status = ht.parse_nvlink_status(runs["nvidia-smi-nvlink-s"].output)
    assert set(status) == {0, 1} and set(status[0].values()) == {26.562}
    assert ht.parse_nvlink_status("GPU 0: H100 (UUID: x)\n\t Link 0: <inactive>\n") == \
        {0: {0: None}}


def test_platform_and_network_parsers():
    runs = ht.load_recordings(FAULTY)  # crafted
    assert "nouveau" in ht.loaded_modules(runs["lsmod-nouveau"].output)
    assert ht.parse_dkms("nvidia/580.95.05, 6.8.0-49-generic, x86_64: installed") == [
        {"module": "nvidia", "version": "580.95.05", "kernel": "6.8.0-49-generic",
         "state": "installed"}]
    nics = ht.parse_ethtool_i(runs["ethtool-i"].output)
    assert nics["ib1"]["firmware-version"].startswith("28.37.1014")
    assert ht.parse_numactl(recorded()["numactl-hardware"].output) == {
        0: "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"}


def _checks(runs: dict[str, ht.ToolRun], node_type: str = "h200", gpus: int = 2) -> dict:
    configs = ConfigFiles()
    cfg = configs.acceptance().model_copy(update={"nodes": {"n": acc.NodeRegistration(
        node_type=node_type, gpus=gpus)}})
    s = acc.node_setting(cfg, configs.nodes(), "n", "test")
    inv = acc.build_inventory(s, smi_xml=(HEALTHY / acc.RAW_SMI_XML).read_text(), smi_error="",
                              topo_text=None, topo_error="not read", nvlinks={0: 18, 1: 18},
                              nvlink_error="", system={}, stack_facts={}, tools=runs)
    return {c.name: c for c in inv.checks}


def test_an_absent_tool_is_not_checked_and_blocks_never_a_pass():
    absent = {name: ht.ToolRun(name, cmd, f"bash: line 1: {cmd.split()[0]}: command not found",
                               127) for name, cmd in acc.TOOL_COMMANDS.items()}
    absent["stress-ng"] = ht.ToolRun("stress-ng", "stress-ng --cpu 0", "", 127)
    checks = _checks(absent)
    for name in TOOL_CHECKS:
        c = checks[name]
        assert c.status == acc.NOT_CHECKED and c.required, c
        assert "is not installed" in c.reason and c.source, c
    assert _checks({})["kernel_log"].reason == "not checked: no `dmesg` recording (the tool " \
        "was not run)"


def test_the_crafted_faults_fail_their_checks_and_name_what_is_wrong():
    checks = _checks(ht.load_recordings(FAULTY))
    assert "GPU 3b:00.0 8GT/s x8 of 32GT/s x16" in checks["pcie_lnksta"].reason
    assert "500 corrected AER from 0000:19:00.0" in checks["kernel_log"].reason
    assert "GPU1 link 5 CRC Errors 1873" in checks["nvlink_errors"].reason
    assert "Correctable ECC" in checks["ipmi_sel"].reason
    assert "mc0 +4 CE" in checks["stress_edac"].reason
    assert "nouveau loaded" in checks["nouveau"].reason
    assert "different firmware" in checks["nic_firmware"].reason
    healthy = _checks(ht.load_recordings(HEALTHY))
    assert all(healthy[n].status == acc.PASS for n in TOOL_CHECKS), {
        n: healthy[n].reason for n in TOOL_CHECKS if healthy[n].status != acc.PASS}


def test_a_short_stress_fails_its_duration():
    runs = dict(ht.load_recordings(HEALTHY))
    runs["stress-ng"] = ht.ToolRun("stress-ng", "stress-ng --timeout 20s", "stress-ng: info:  "
                                   "[9] successful run completed in 20.03 secs\nfailed: 0", 0)
    c = _checks(runs)["cpu_memory_stress"]
    assert c.status == acc.FAIL and "ran 20 s" in c.reason and c.expected.endswith(">= 600 s")


def test_the_numa_map_is_judged_against_nodes_yaml_on_a_whole_node():
    configs = ConfigFiles()
    cfg = configs.acceptance().model_copy(update={"nodes": {"n": acc.NodeRegistration(
        node_type="h200")}})
    s = acc.node_setting(cfg, configs.nodes(), "n", "test")
    head = "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tCPU Affinity\tNUMA Affinity\n"

    def topo(numa: list[int]) -> str:
        rows = "".join(f"GPU{g}\t" + "\t".join(" X " if o == g else "NV18" for o in range(8))
                       + f"\t0-55\t{numa[g]}\n" for g in range(8))
        return head + rows

    runs = {"numactl-hardware": ht.ToolRun("numactl-hardware", "numactl --hardware",
                                           "available: 2 nodes (0-1)\nnode 0 cpus: 0-55\n"
                                           "node 1 cpus: 56-111\n", 0)}
    c = acc.Checker(s.thresholds)
    numa_map_check(c, s, runs, parse_topo_matrix(topo([0, 0, 0, 0, 1, 1, 1, 1])))
    numa_map_check(c, s, runs, parse_topo_matrix(topo([0, 0, 0, 1, 0, 1, 1, 1])))  # swapped
    good, bad = c.checks
    assert good.status == acc.PASS and good.source.startswith("configs/nodes.yaml")
    assert bad.status == acc.FAIL and "GPU3 on NUMA node 1, nodes.yaml says 0" in bad.reason


# ---- PCIe links at idle and under load ----

def _load_check(runs: dict[str, ht.ToolRun], read_s: float | None = 120.0,
                window: tuple[float, float] | None = (0.0, 3650.0)) -> acc.Check:
    c = Checker(ConfigFiles().acceptance().node_types["h200"])
    pcie_under_load_check(c, runs, read_s, window)
    [check] = c.checks
    return check


def test_an_idle_gpu_link_trained_down_is_not_a_fault_its_width_is():
    """At idle the driver trains a GPU's link down (2.5GT/s, width kept): pcie_lnksta passes it
    and leaves the speed to the read under load; a narrower link fails at idle already, and a
    NIC below its speed fails (NICs do not train down to save power). Crafted lspci lines."""
    healthy = _checks(ht.load_recordings(HEALTHY))["pcie_lnksta"]
    assert healthy.status == acc.PASS
    assert "GPU 19:00.0 2.5GT/s x16 of 32GT/s (idle: speed judged under load)" in \
        healthy.measured
    faulty = _checks(ht.load_recordings(FAULTY))["pcie_lnksta"]
    assert faulty.status == acc.FAIL and "GPU 3b:00.0 8GT/s x8 of 32GT/s x16" in faulty.reason
    assert "19:00.0" not in faulty.reason  # GPU0 only idles
    lspci = ht.load_recordings(HEALTHY)["lspci-vvv"]
    slow_nic = lspci.output.replace("Infiniband controller: Mellanox Technologies MT2910 Family "
                                    "[ConnectX-7]\n", "Infiniband controller: ConnectX-7\n", 1)
    slow_nic = slow_nic.replace("LnkSta:\tSpeed 32GT/s, Width x16", "LnkSta:\tSpeed 16GT/s "
                                "(downgraded), Width x16", 1)
    nic = _checks({"lspci-vvv": ht.ToolRun("lspci-vvv", "lspci -vvv", slow_nic, 0)})
    assert nic["pcie_lnksta"].status == acc.FAIL and "NIC 1a:00.0 16GT/s x16 of 32GT/s x16" in \
        nic["pcie_lnksta"].reason


def test_the_gpu_link_is_judged_under_load():
    """pcie_lnksta_load: every GPU at LnkCap in the read the probe takes during the burn; a
    read outside the burn's compute window, or none, is not checked and blocks."""
    ok = _load_check(ht.load_recordings(HEALTHY))
    assert ok.status == acc.PASS and "lspci under load: GPU 19:00.0 32GT/s x16" in ok.measured
    assert ok.source.startswith("procedure: LnkSta equals LnkCap")
    bad = _load_check(ht.load_recordings(FAULTY))
    assert bad.status == acc.FAIL and bad.reason.endswith("GPU 3b:00.0 8GT/s x8 of 32GT/s x16")
    late = _load_check(ht.load_recordings(HEALTHY), read_s=3700.0)
    assert late.status == acc.NOT_CHECKED and late.required
    assert "outside the burn's compute window (0-3650 s)" in late.reason
    none = _load_check(ht.load_recordings(H100))  # the recorder took no read under load there
    assert none.status == acc.NOT_CHECKED and none.required
    assert none.reason == "not checked: the PCIe links were not read during the burn"
    sysfs = {"pci-sysfs-links-load": ht.ToolRun(
        "pci-sysfs-links-load", acc.TOOL_COMMANDS["pci-sysfs-links"],
        "0000:3b:00.0 vendor=0x10de class=0x030200 cur=2.5 GT/s PCIe/x16 max=32.0 GT/s "
        "PCIe/x16", 0)}  # crafted: still idle-speed while the burn runs
    assert _load_check(sysfs).status == acc.FAIL


def test_real_lspci_and_stress_ng_output_of_an_h100_vm():
    """What pciutils 3.9.0 and stress-ng 0.15.06 printed on an H100 VM (recorded): the GPU's
    LnkCap/LnkSta at idle and under a matmul load, and stress-ng's summary as that version
    writes it ("completed in 31.72s", no `failed:` line)."""
    runs = ht.load_recordings(H100_LOAD)
    for name in ("lspci-vvv", "lspci-vvv-load"):
        [gpu] = [ln for ln in ht.parse_lspci_links(runs[name].output) if ln.is_gpu or ln.is_nic]
        assert (gpu.address, gpu.is_gpu, gpu.at_capability) == ("00:06.0", True, True), name
        assert (gpu.sta_speed, gpu.sta_width) == ("32GT/s", 16)
    assert "96 %, 698.16 W" in runs["nvidia-smi-query-load"].output  # read under load
    st = ht.parse_stress_ng(runs["stress-ng"].output)
    assert st.completed and st.seconds == pytest.approx(31.72) and st.failed == 0
    assert _load_check(runs, read_s=None, window=None).status == acc.PASS
