"""Phase 2 from `nvidia-smi nvlink`: every link's error counters (`-e`: replay, recovery, CRC)
and every link up at one speed (`-s`). One GPU has no NVLink: not applicable."""

from __future__ import annotations

from onboarding.nodes import host_tools as ht
from onboarding.nodes.acceptance.checks import Checker
from onboarding.nodes.acceptance.schema import NodeSetting
from onboarding.nodes.acceptance.tools import Runs, usable


def nvlink_tool_checks(c: Checker, s: NodeSetting, runs: Runs) -> None:
    if s.gpus_expected < 2:
        for name in ("nvlink_errors", "nvlink_status"):
            c.skip(2, name, "1 GPU", required=False)
        return
    most = s.thresholds.gpu_stack.nvlink_errors_max
    want = f"<= {most} errors per counter per link"
    run = usable(c, runs, "nvidia-smi-nvlink-e", 2, "nvlink_errors", want)
    if run is not None:
        counters = ht.parse_nvlink_errors(run.output)
        bad = [f"GPU{g} link {lk} {name} {n}" for (g, lk), by in sorted(counters.items())
               for name, n in sorted(by.items()) if n > most]
        if not counters:
            c.skip(2, "nvlink_errors", "`nvidia-smi nvlink -e` printed no counter: "
                   + ht._last_line(run.output), want)
        else:
            c.add(2, "nvlink_errors", not bad, "; ".join(bad) or f"0 errors on "
                  f"{len(counters)} links", want, "NVLink errors (a link or NVSwitch tray to "
                  "service): " + "; ".join(bad[:8]) + (f" (+{len(bad) - 8} more)"
                                                      if len(bad) > 8 else ""))
    want_links = s.thresholds.nvlinks_per_gpu
    want = f"{want_links} links up per GPU, one speed"
    run = usable(c, runs, "nvidia-smi-nvlink-s", 2, "nvlink_status", want)
    if run is None:
        return
    status = ht.parse_nvlink_status(run.output)
    if not status:
        c.skip(2, "nvlink_status", "`nvidia-smi nvlink -s` listed no GPU: "
               + ht._last_line(run.output), want)
        return
    speeds = {v for links in status.values() for v in links.values() if v is not None}
    bad = [f"GPU{g} {sum(v is not None for v in links.values())} of {len(links)} up"
           for g, links in sorted(status.items())
           if want_links and sum(v is not None for v in links.values()) < want_links]
    if len(speeds) > 1:
        bad.append("links at different speeds: " + ", ".join(f"{v:g} GB/s"
                                                               for v in sorted(speeds)))
    c.add(2, "nvlink_status", not bad, "; ".join(bad) or f"{len(status)} GPUs, "
          f"{min(len(v) for v in status.values())}+ links each at "
          f"{next(iter(speeds), 0):g} GB/s", want, "NVLink down or degraded: " + "; ".join(bad))
