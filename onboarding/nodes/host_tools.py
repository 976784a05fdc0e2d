"""What a node's own tools print, read: one recording per command and a parser per tool.

A recording (`<name>.txt`, what the probe keeps and scripts/record_node_tools.sh writes) is the
command on a first line `$ <command>`, its stdout and stderr, and a last line `# exit <N>`.
Exit 127 (or a shell's "command not found") is a tool that is not installed: the check it feeds
is "not checked", never passed. The parsers read the formats the tools print upstream:

- `lspci -vvv`: pciutils ls-caps.c, cap_express_link (`LnkCap:\tPort #N, Speed S, Width xW`,
  `LnkSta:\tSpeed S (ok|downgraded), Width xW (ok|downgraded)`);
- `dmesg`: the kernel's AER (drivers/pci/pcie/aer.c, `PCIe Bus Error: severity=...`), MCE
  (`mce: [Hardware Error]`), EDAC (`EDAC MCn: N CE|UE ...`) and NVIDIA Xid (`NVRM: Xid`) lines;
- `ipmitool sel elist` (`id | date | time | sensor | event | Asserted`) and `ipmitool sdr`
  (`name | reading | status`, status ok/ns/nc/cr/nr) of ipmitool's lib/ipmi_sel.c and
  lib/ipmi_sdr.c;
- `stress-ng --metrics-brief`'s summary (`successful run completed in Ns`, `failed: N`);
- EDAC sysfs `mc*/ce_count`, `mc*/ue_count` as `<path> <count>` lines;
- `nvidia-smi nvlink -e` (per GPU, `Link N: <counter> Errors: <count>`) and `nvidia-smi nvlink
  -s` (`Link N: <speed> GB/s` or `<inactive>`);
- `nvidia-ctk --version`, `nvidia-container-cli info`, `lsmod`, `dkms status`
  (`nvidia/<version>, <kernel>, <arch>: installed`), `ethtool -i` (`firmware-version: ...`),
  `numactl --hardware` (`available: N nodes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

NOT_INSTALLED = 127


@dataclass(frozen=True)
class ToolRun:
    """One command's recording."""

    name: str
    command: str
    output: str
    exit_code: int

    @property
    def tool(self) -> str:
        return self.command.split()[0] if self.command else self.name

    def unavailable(self) -> str:
        """Why the command's output says nothing about the node ("" when it ran): a tool not
        installed (exit 127, or the shell's `X: command not found` for a tool inside a
        pipeline), or one that could not reach what it reads (no BMC device, no sysfs node)."""
        missing = re.findall(r"(?:^|: )([\w.-]+): command not found", self.output, re.MULTILINE)
        if missing or self.exit_code == NOT_INSTALLED:
            return f"`{missing[0] if missing else self.tool}` is not installed"
        low = self.output.lower()
        for marker in ("could not open device", "operation not permitted", "permission denied",
                       "no such file or directory", "not supported"):
            if self.exit_code != 0 and marker in low:
                return f"{self.name} exited {self.exit_code}: {_last_line(self.output)}"
        return ""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no output"


def parse_recording(name: str, text: str) -> ToolRun:
    lines = text.rstrip("\n").split("\n")
    if not lines or not lines[0].startswith("$ "):
        raise ValueError(f"{name}: a recording starts with `$ <command>`")
    m = re.fullmatch(r"# exit (-?\d+)", lines[-1].strip()) if len(lines) > 1 else None
    if m is None:
        raise ValueError(f"{name}: a recording ends with `# exit <N>`")
    return ToolRun(name, lines[0][2:].strip(), "\n".join(lines[1:-1]), int(m.group(1)))


def render_recording(command: str, output: str, exit_code: int) -> str:
    return f"$ {command}\n{output.rstrip(chr(10))}\n# exit {exit_code}\n"


def load_recordings(directory: Path) -> dict[str, ToolRun]:
    """Every `<name>.txt` recording in `directory` by name (other .txt files are skipped)."""
    out = {}
    for path in sorted(directory.glob("*.txt")):
        text = path.read_text(errors="replace")
        if text.startswith("$ "):
            out[path.stem] = parse_recording(path.stem, text)
    return out


# ---- PCIe links (lspci -vvv) ----

_DEVICE = re.compile(r"^((?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ([^:]+): (.*)$")
_LNKCAP = re.compile(r"^\s*LnkCap:\s*Port #\d+, Speed ([^,]+?)(?: \([^)]*\))?, Width x(\d+)")
_LNKSTA = re.compile(r"^\s*LnkSta:\s*Speed ([^,]+?)(?: \(([^)]*)\))?, Width x(\d+)"
                     r"(?: \(([^)]*)\))?")


@dataclass(frozen=True, kw_only=True)
class PciLink:
    address: str
    kind: str  # lspci's class name: "3D controller", "Ethernet controller", ...
    name: str
    cap_speed: str
    cap_width: int
    sta_speed: str
    sta_width: int

    @property
    def is_gpu(self) -> bool:
        return "NVIDIA" in self.name and self.kind in ("3D controller",
                                                       "VGA compatible controller")

    @property
    def is_nic(self) -> bool:
        return self.kind in ("Ethernet controller", "Infiniband controller",
                             "Network controller")

    @property
    def at_capability(self) -> bool:
        return self.sta_width == self.cap_width and gts(self.sta_speed) == gts(self.cap_speed)

    def describe(self) -> str:
        return (f"{self.address} {self.sta_speed} x{self.sta_width} of {self.cap_speed} "
                f"x{self.cap_width}")


def gts(speed: str) -> float | None:
    m = re.match(r"([\d.]+)\s*GT/s", speed or "")
    return float(m.group(1)) if m else None


def parse_lspci_links(text: str) -> list[PciLink]:
    """Every device of `lspci -vvv` with a PCI Express link (LnkCap and LnkSta)."""
    out: list[PciLink] = []
    dev: tuple[str, str, str] | None = None
    cap: tuple[str, int] | None = None
    for line in text.splitlines():
        m = _DEVICE.match(line)
        if m:
            dev, cap = (m.group(1), m.group(2).strip(), m.group(3).strip()), None
            continue
        if dev is None:
            continue
        if (c := _LNKCAP.match(line)):
            cap = (c.group(1), int(c.group(2)))
        elif (s := _LNKSTA.match(line)) and cap is not None:
            out.append(PciLink(address=dev[0], kind=dev[1], name=dev[2], cap_speed=cap[0],
                               cap_width=cap[1], sta_speed=s.group(1), sta_width=int(s.group(3))))
            cap = None
    return out


_SYSFS_LINK = re.compile(r"^(\S+) vendor=(0x[0-9a-f]+) class=(0x[0-9a-f]+) cur=(.*?)/x(\d*) "
                         r"max=(.*?)/x(\d*)\s*$")


def parse_pci_sysfs_links(text: str) -> list[PciLink]:
    """GPUs (vendor 0x10de, class 0x03xxxx) and NICs (class 0x02xxxx) with a link, from the
    `<bdf> vendor= class= cur=<current_link_speed>/x<width> max=<max_link_speed>/x<width>`
    lines of the pci-sysfs-links recording: the kernel's sysfs `current_link_*` is the link
    status register, `max_link_*` its capability, what lspci prints as LnkSta and LnkCap."""
    out = []
    for line in text.splitlines():
        m = _SYSFS_LINK.match(line.strip())
        if not m or not m.group(5) or not m.group(7):
            continue  # no PCI Express link (a virtio device)
        vendor, cls = m.group(2), m.group(3)
        if vendor == "0x10de" and cls.startswith("0x03"):
            kind, name = "3D controller", "NVIDIA GPU"
        elif cls.startswith("0x02"):
            kind, name = "Ethernet controller" if cls.startswith("0x0200") else \
                "Network controller", f"NIC {vendor}"
        else:
            continue
        out.append(PciLink(
            address=m.group(1), kind=kind, name=name,
            cap_speed=m.group(6).replace(" PCIe", "").replace(".0 GT/s", "GT/s").replace(
                " GT/s", "GT/s"), cap_width=int(m.group(7)),
            sta_speed=m.group(4).replace(" PCIe", "").replace(".0 GT/s", "GT/s").replace(
                " GT/s", "GT/s"), sta_width=int(m.group(5))))
    return out


# ---- kernel log (dmesg) ----

_AER = re.compile(r"(?:(\S+ [0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]): )?(?:AER: )?PCIe Bus "
                  r"Error: severity=([A-Za-z]+)")
_EDAC = re.compile(r"EDAC (MC\d+): (\d+) (CE|UE)")
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


@dataclass(frozen=True, kw_only=True)
class KernelLog:
    mce: tuple[str, ...]
    aer_corrected: dict[str, int]  # device -> corrected AER lines
    aer_uncorrected: tuple[str, ...]
    edac_ce: int
    edac_ue: int
    xids: tuple[str, ...]
    lines: int


def parse_kernel_log(text: str) -> KernelLog:
    mce, unc, xids = [], [], []
    corrected: dict[str, int] = {}
    ce = ue = 0
    for line in text.splitlines():
        if "mce: [Hardware Error]" in line or "Machine check events logged" in line \
                or "Machine Check Exception" in line:
            mce.append(line.strip())
        if (a := _AER.search(line)):
            device = (a.group(1) or "unknown device").split()[-1]
            if a.group(2).lower().startswith("correct"):
                corrected[device] = corrected.get(device, 0) + 1
            else:
                unc.append(line.strip())
        if (e := _EDAC.search(line)):
            if e.group(3) == "CE":
                ce += int(e.group(2))
            else:
                ue += int(e.group(2))
        if (x := _XID.search(line)):
            xids.append(f"Xid {x.group(2)} on {x.group(1)}")
    return KernelLog(mce=tuple(mce), aer_corrected=corrected, aer_uncorrected=tuple(unc),
                     edac_ce=ce, edac_ue=ue, xids=tuple(xids), lines=len(text.splitlines()))


# ---- BMC (ipmitool) ----

SEL_BAD = ("uncorrectable", "correctable ecc", "critical", "failure", "fault",
           "non-recoverable", "ierr", "machine check", "bus fatal", "bus uncorrectable",
           "pci serr", "pci perr", "predictive failure", "thermal trip", "power off")


def parse_ipmi_sel(text: str) -> tuple[int, list[str]]:
    """(entries, the asserted ones naming a fault) of `ipmitool sel elist`."""
    entries, bad = 0, []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 5 or not cells[0].strip().isalnum():
            continue
        entries += 1
        text_low = " ".join(cells[3:]).lower()
        if "deasserted" not in text_low and any(w in text_low for w in SEL_BAD):
            bad.append(" | ".join(cells[1:]))
    return entries, bad


def parse_ipmi_sdr(text: str) -> list[tuple[str, str, str]]:
    """(sensor, reading, status) rows of `ipmitool sdr`."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) == 3 and cells[0]:
            rows.append((cells[0], cells[1], cells[2].lower()))
    return rows


# ---- stress and EDAC counters ----

@dataclass(frozen=True)
class StressRun:
    completed: bool
    seconds: float | None
    failed: int
    summary: str


def parse_stress_ng(text: str) -> StressRun:
    """stress-ng's closing lines: `successful run completed in 30.01 secs` (or, for longer
    runs, `in 600.02 secs (10 mins, 0.02 secs)` / `in 10 mins, 0.02 secs`) and `failed: N`."""
    m = re.search(r"(successful|unsuccessful) run completed in ([^\n]*)", text)
    seconds = None
    if m:
        tail = m.group(2)
        total = re.match(r"\s*([\d.]+)\s*s(?:ecs?)?\b", tail)
        if total:
            seconds = float(total.group(1))
        else:
            unit = {"day": 86400, "hour": 3600, "min": 60, "sec": 1}
            seconds = sum(float(n) * unit[u] for n, u in re.findall(
                r"([\d.]+)\s*(day|hour|min|sec)", tail.split("(")[0])) or None
    failed = sum(int(f) for f in re.findall(r"\bfailed: (\d+)", text))
    summary = next((ln.strip() for ln in text.splitlines() if "run completed" in ln), "")
    return StressRun(bool(m) and m.group(1) == "successful", seconds, failed, summary)


def parse_edac_counts(text: str) -> dict[str, int]:
    """`<sysfs path> <count>` lines -> {"mc0/ce_count": n, ...}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"\S*/(mc\d+)/(ce_count|ue_count)\s+(\d+)\s*$", line.strip())
        if m:
            out[f"{m.group(1)}/{m.group(2)}"] = int(m.group(3))
    return out


# ---- NVLink (nvidia-smi nvlink -e / -s) ----

_GPU = re.compile(r"^GPU (\d+): ")
_LINK = re.compile(r"^\s*Link (\d+):\s*(.*)$")
_COUNTER = re.compile(r"([A-Za-z][A-Za-z0-9 ]*?(?:Errors?|errors?))\s*:\s*(\d+)")


def parse_nvlink_errors(text: str) -> dict[tuple[int, int], dict[str, int]]:
    """(gpu, link) -> {counter: count} of every `... Errors: N` counter `nvlink -e` prints."""
    out: dict[tuple[int, int], dict[str, int]] = {}
    gpu = link = None
    for line in text.splitlines():
        if (g := _GPU.match(line)):
            gpu, link = int(g.group(1)), None
            continue
        rest = line
        if (lk := _LINK.match(line)):
            link, rest = int(lk.group(1)), lk.group(2)
        if gpu is None or link is None:
            continue
        for name, count in _COUNTER.findall(rest):
            counters = out.setdefault((gpu, link), {})
            counters[name.strip()] = counters.get(name.strip(), 0) + int(count)
    return out


def parse_nvlink_status(text: str) -> dict[int, dict[int, float | None]]:
    """gpu -> {link: GB/s, None when inactive} of `nvidia-smi nvlink -s`."""
    out: dict[int, dict[int, float | None]] = {}
    gpu = None
    for line in text.splitlines():
        if (g := _GPU.match(line)):
            gpu = int(g.group(1))
            out[gpu] = {}
        elif gpu is not None and (lk := _LINK.match(line)):
            m = re.match(r"([\d.]+)\s*GB/s", lk.group(2).strip())
            out[gpu][int(lk.group(1))] = float(m.group(1)) if m else None
    return out


# ---- platform: container toolkit, modules, DKMS ----

def parse_version(text: str, pattern: str) -> str | None:
    m = re.search(pattern, text)
    return m.group(1) if m else None


def loaded_modules(text: str) -> set[str]:
    """Module names of `lsmod` output (first column)."""
    return {ln.split()[0] for ln in text.splitlines()
            if ln.strip() and not ln.startswith("Module") and re.match(r"^[a-z0-9_]+\s+\d+", ln)}


def parse_dkms(text: str) -> list[dict[str, str]]:
    """`dkms status` rows: module, version, kernel, state (dkms 2 `nvidia, 580.95.05, ...` and
    dkms 3 `nvidia/580.95.05, ...` forms)."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"^([\w-]+)[/,]\s*([\w.+-]+),\s*([\w.+-]+),\s*[\w]+:\s*(.+)$", line.strip())
        if m:
            rows.append({"module": m.group(1), "version": m.group(2), "kernel": m.group(3),
                         "state": m.group(4).strip()})
    return rows


# ---- network: ethtool -i, NUMA ----

def parse_ethtool_i(text: str) -> dict[str, dict[str, str]]:
    """interface -> ethtool -i fields, from `== <iface>` separated blocks."""
    out: dict[str, dict[str, str]] = {}
    iface = None
    for line in text.splitlines():
        if line.startswith("== "):
            iface = line[3:].strip()
            out[iface] = {}
        elif iface is not None and ":" in line:
            key, _, value = line.partition(":")
            out[iface][key.strip()] = value.strip()
    return out


def parse_numactl(text: str) -> dict[int, str]:
    """node -> its CPU list, from `numactl --hardware`."""
    return {int(m.group(1)): m.group(2).strip()
            for m in re.finditer(r"^node (\d+) cpus:(.*)$", text, re.MULTILINE)}
