"""`memory_bandwidth`: device-to-device copy per GPU against the HBM figure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from onboarding.nodes.acceptance.checks import Check, Checker
from onboarding.nodes.acceptance.inventory import NodeInventory
from onboarding.nodes.acceptance.schema import NodeSetting


@dataclass(frozen=True)
class MemoryBandwidth:
    node: str
    per_gpu: tuple[dict, ...]  # gpu, bytes, copy_gbps (read + write)
    checks: tuple[Check, ...]


def memory_checks(s: NodeSetting, raw: Mapping[str, Any] | None, why_not: str,
                  c: Checker) -> None:
    m = s.thresholds.memory_bandwidth
    floor = m.min_fraction * m.hbm_gbps
    if raw is None:
        c.skip(2, "hbm_copy", why_not, f">= {floor:.0f} GB/s")
        return
    if raw.get("error"):
        c.add(2, "hbm_copy", False, "did not finish", f">= {floor:.0f} GB/s", str(raw["error"]))
        return
    per = raw.get("per_gpu") or []
    slow = [f"GPU{r['gpu']} {r['copy_gbps']:.0f}" for r in per if r["copy_gbps"] < floor]
    c.add(2, "hbm_copy", bool(per) and not slow,
          ", ".join(f"GPU{r['gpu']} {r['copy_gbps']:.0f} GB/s" for r in per) or "nothing",
          f">= {m.min_fraction:.0%} of {m.hbm_gbps:.0f} GB/s",
          "device-to-device copy below the HBM figure: " + ", ".join(slow) if slow
          else "no GPU measured")


def build_memory(s: NodeSetting, inv: NodeInventory, raw: Mapping[str, Any] | None, why: str
                 ) -> MemoryBandwidth:
    c = Checker(s.thresholds)
    memory_checks(s, None if inv.no_gpu else raw, inv.no_gpu or why, c)
    return MemoryBandwidth(s.name, tuple((raw or {}).get("per_gpu") or ()), tuple(c.checks))
