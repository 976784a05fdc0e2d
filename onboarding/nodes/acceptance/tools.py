"""The node's own tools that acceptance runs (one recording each, named as
scripts/record_node_tools.sh names them) and how a check reads one: a tool that is absent or
cannot run on this node is the check "not checked", with the tool's own words."""

from __future__ import annotations

from collections.abc import Mapping

from onboarding.nodes.acceptance.checks import Checker
from onboarding.nodes.host_tools import ToolRun

# recording name -> command (the probe runs these; the recorder script writes the same names)
TOOL_COMMANDS = {
    "uname": "uname -r",
    "dmesg": "dmesg -T",
    "lspci-vvv": "lspci -vvv",
    "pci-sysfs-links": "for d in /sys/bus/pci/devices/*; do v=$(cat $d/vendor 2>/dev/null); "
                       "c=$(cat $d/class 2>/dev/null); case \"$v:$c\" in 0x10de:*|*:0x0200*|"
                       "*:0x0207*|*:0x0108*) echo \"$(basename $d) vendor=$v class=$c "
                       "cur=$(cat $d/current_link_speed 2>/dev/null)/x$(cat "
                       "$d/current_link_width 2>/dev/null) max=$(cat $d/max_link_speed "
                       "2>/dev/null)/x$(cat $d/max_link_width 2>/dev/null)\";; esac; done",
    "numactl-hardware": "numactl --hardware",
    "ipmitool-sel": "ipmitool sel elist",
    "ipmitool-sdr": "ipmitool sdr",
    "nvidia-smi-nvlink-e": "nvidia-smi nvlink -e",
    "nvidia-smi-nvlink-s": "nvidia-smi nvlink -s",
    "nvidia-ctk": "nvidia-ctk --version",
    "nvidia-container-cli": "nvidia-container-cli info",
    "lsmod-nouveau": "lsmod | grep -E \"^(nouveau|nvidia)\" ; cat /proc/driver/nvidia/version",
    "dkms": "dkms status",
    "ethtool-i": "for n in $(ls /sys/class/net | grep -v ^lo); do echo \"== $n\"; "
                 "ethtool -i $n; done",
    "edac-before": "for f in /sys/devices/system/edac/mc/mc*/ce_count "
                   "/sys/devices/system/edac/mc/mc*/ue_count; do [ -f \"$f\" ] && "
                   "echo \"$f $(cat $f)\"; done; ls /sys/devices/system/edac 2>&1",
}
# read again while the burn runs (gpu_health): an idle GPU trains its PCIe link down to save
# power, so its link speed is judged under load (host.pcie_under_load_check)
LOAD_LINK_COMMANDS = {"lspci-vvv-load": TOOL_COMMANDS["lspci-vvv"],
                      "pci-sysfs-links-load": TOOL_COMMANDS["pci-sysfs-links"]}
# run after edac-before, then edac-after with edac-before's command ({stress_s} filled in)
STRESS_COMMAND = "stress-ng --cpu 0 --vm 2 --vm-bytes 25% --timeout {stress_s}s --metrics-brief"

Runs = Mapping[str, ToolRun]


def usable(c: Checker, runs: Runs, name: str, phase: int, check: str, expected: str = ""
           ) -> ToolRun | None:
    """The recording when it says something about the node; else the check is skipped (not
    recorded, the tool absent, or it could not run here) and None."""
    run = runs.get(name)
    if run is None:
        c.skip(phase, check, f"no `{name}` recording (the tool was not run)", expected)
        return None
    why = run.unavailable()
    if why:
        c.skip(phase, check, why, expected)
        return None
    return run
