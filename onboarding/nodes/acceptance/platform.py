"""Phase 3, the platform the engine runs on: the NVIDIA container toolkit (nvidia-ctk and
nvidia-container-cli seeing the GPUs), no nouveau loaded beside the nvidia module, and the
nvidia module built by DKMS for the running kernel at the driver's version."""

from __future__ import annotations

import re

from onboarding.nodes import host_tools as ht
from onboarding.nodes.acceptance.checks import Checker
from onboarding.nodes.acceptance.schema import NodeSetting
from onboarding.nodes.acceptance.tools import Runs, usable


def platform_checks(c: Checker, s: NodeSetting, runs: Runs, driver: str | None,
                    gpu_count: int) -> None:
    _container_toolkit(c, runs, gpu_count)
    _modules(c, runs, driver)
    _dkms(c, runs, driver)


def _container_toolkit(c: Checker, runs: Runs, gpu_count: int) -> None:
    want = "nvidia-ctk installed; nvidia-container-cli info lists every GPU"
    ctk = usable(c, runs, "nvidia-ctk", 3, "container_toolkit", want)
    if ctk is None:
        return
    version = ht.parse_version(ctk.output, r"version ([\d.]+)")
    cli = runs.get("nvidia-container-cli")
    why = cli.unavailable() if cli is not None else "`nvidia-container-cli info` was not run"
    if why:
        c.skip(3, "container_toolkit", f"nvidia-ctk {version}; {why}", want)
        return
    seen = len(re.findall(r"^Device Index:", cli.output, re.MULTILINE))
    ok = ctk.exit_code == 0 and cli.exit_code == 0 and seen == gpu_count
    c.add(3, "container_toolkit", ok, f"nvidia-ctk {version}; nvidia-container-cli sees "
          f"{seen} GPU(s)", want, f"container toolkit: nvidia-ctk exit {ctk.exit_code}, "
          f"nvidia-container-cli exit {cli.exit_code}, {seen} of {gpu_count} GPU(s) seen")


def _modules(c: Checker, runs: Runs, driver: str | None) -> None:
    want = "nvidia loaded, nouveau not loaded"
    run = usable(c, runs, "lsmod-nouveau", 3, "nouveau", want)
    if run is None:
        return
    mods = ht.loaded_modules(run.output)
    loaded = ht.parse_version(run.output, r"NVRM version:.*?\s(\d{3}\.\d+(?:\.\d+)?)\s")
    if not mods and loaded is None:
        c.skip(3, "nouveau", "neither lsmod nor /proc/driver/nvidia/version was readable "
               f"({ht._last_line(run.output)})", want)
        return
    bad = (["nouveau loaded (blacklist it and rebuild the initramfs)"] if "nouveau" in mods
           else []) + ([] if "nvidia" in mods or loaded else ["nvidia module not loaded"]) + \
        ([f"loaded nvidia module {loaded}, nvidia-smi reports {driver}"]
         if loaded and driver and loaded != driver else [])
    c.add(3, "nouveau", not bad, "; ".join(bad) or f"nvidia {loaded or 'loaded'}, no nouveau",
          want, "; ".join(bad))


def _dkms(c: Checker, runs: Runs, driver: str | None) -> None:
    want = "nvidia installed by DKMS for the running kernel, at the driver's version"
    run = usable(c, runs, "dkms", 3, "dkms", want)
    if run is None:
        return
    kernel = (runs["uname"].output.strip().split() or [""])[-1] if "uname" in runs and \
        not runs["uname"].unavailable() else ""
    rows = [r for r in ht.parse_dkms(run.output) if r["module"].startswith("nvidia")]
    if not rows:
        c.skip(3, "dkms", "DKMS manages no nvidia module (a precompiled or container-built "
               "driver)", want)
        return
    mine = [r for r in rows if not kernel or r["kernel"] == kernel]
    bad = ([f"no nvidia module built for the running kernel {kernel}"] if not mine else []) + \
        [f"{r['module']} {r['version']} for {r['kernel']}: {r['state']}" for r in mine
         if not r["state"].startswith("installed")] + \
        [f"DKMS nvidia {r['version']}, driver {driver}" for r in mine
         if driver and r["version"] != driver]
    c.add(3, "dkms", not bad, "; ".join(bad) or ", ".join(
          f"{r['module']} {r['version']} {r['kernel']}: {r['state']}" for r in mine), want,
          "DKMS: " + "; ".join(bad))
