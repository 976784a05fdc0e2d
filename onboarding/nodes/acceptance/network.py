"""Phase 4, the network beyond MTU: every NIC's firmware (`ethtool -i`), at or above the node
type's minimum for its driver, and one version per driver across the node."""

from __future__ import annotations

from onboarding.nodes import host_tools as ht
from onboarding.nodes.acceptance.checks import Checker
from onboarding.nodes.acceptance.schema import NodeSetting
from onboarding.nodes.acceptance.tools import Runs, usable


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split()[0].replace("-", ".").split(".") if p.isdigit())


def network_checks(c: Checker, s: NodeSetting, runs: Runs) -> None:
    mins = s.thresholds.nic_firmware_min
    want = ("one firmware per NIC driver" + (", >= " + ", ".join(
        f"{d} {v}" for d, v in sorted(mins.items())) if mins else ""))
    run = usable(c, runs, "ethtool-i", 4, "nic_firmware", want)
    if run is None:
        return
    nics = {k: v for k, v in ht.parse_ethtool_i(run.output).items()
            if v.get("bus-info", "").count(":") >= 2}  # a PCI device, not a virtual interface
    if not nics:
        c.skip(4, "nic_firmware", "no NIC with a PCI bus address in `ethtool -i` (a VM's "
               "virtual NIC)", want)
        return
    bare = sorted(n for n, f in nics.items()
                  if f.get("firmware-version", "").upper() in ("", "N/A"))
    judged = {n: f for n, f in nics.items() if n not in bare}
    if not judged:
        c.skip(4, "nic_firmware", "no NIC reports a firmware version (virtual NICs: "
               + ", ".join(f"{n} {nics[n].get('driver')}" for n in bare) + ")", want)
        return
    bad, by_driver = [], {}
    for name, f in sorted(judged.items()):
        fw, drv = f["firmware-version"], f.get("driver", "?")
        by_driver.setdefault(drv, set()).add(fw)
        if drv in mins and _version(fw) < _version(mins[drv]):
            bad.append(f"{name} ({drv}) firmware {fw} < {mins[drv]}")
    bad += [f"{drv} NICs on different firmware: {', '.join(sorted(v))}"
            for drv, v in sorted(by_driver.items()) if len(v) > 1]
    c.add(4, "nic_firmware", not bad, "; ".join(bad) or ", ".join(
          f"{n} {f.get('driver')} {f['firmware-version']}" for n, f in sorted(judged.items()))
          + (f"; no firmware reported by {', '.join(bare)}" if bare else ""),
          want, "NIC firmware: " + "; ".join(bad))
