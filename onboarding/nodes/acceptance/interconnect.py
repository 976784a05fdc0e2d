"""`interconnect`: all-reduce bus bandwidth per TP group and P2P between GPU pairs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from onboarding.nodes.acceptance.checks import Check, Checker
from onboarding.nodes.acceptance.inventory import NodeInventory
from onboarding.nodes.acceptance.schema import NodeSetting
from onboarding.nodes.facts import allreduce_busbw_gbps


@dataclass(frozen=True)
class Interconnect:
    node: str
    allreduce: tuple[dict, ...]  # rows: ranks, message_bytes, time_s, algbw_gbps, busbw_gbps
    p2p: tuple[dict, ...]  # rows: src, dst, peer_access, gbps
    checks: tuple[Check, ...]


def allreduce_rows(raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The worker's timings -> rows with nccl-tests' algbw and busbw."""
    rows = []
    for r in raw.get("allreduce") or []:
        t = float(r["time_s"])
        rows.append({"ranks": int(r["ranks"]), "message_bytes": int(r["bytes"]), "time_s": t,
                     "algbw_gbps": int(r["bytes"]) / t / 1e9,
                     "busbw_gbps": allreduce_busbw_gbps(int(r["bytes"]), t, int(r["ranks"])),
                     "correct": bool(r.get("correct", True))})
    return rows


def interconnect_checks(s: NodeSetting, gpu_count: int, raw: Mapping[str, Any] | None,
                        why_not: str, c: Checker) -> tuple[list[dict], list[dict]]:
    limits = s.thresholds.interconnect
    if gpu_count < 2 or raw is None:
        c.skip(2, "interconnect", why_not or f"{gpu_count} GPU", required=gpu_count >= 2)
        return [], []
    if raw.get("error"):
        c.add(2, "interconnect", False, "did not finish", "all-reduce and P2P run",
              str(raw["error"]))
        return [], []
    rows = allreduce_rows(raw)
    for ranks in sorted({r["ranks"] for r in rows}):
        mine = [r for r in rows if r["ranks"] == ranks]
        peak = max(r["busbw_gbps"] for r in mine)
        wrong = [r for r in mine if not r["correct"]]
        want = limits.allreduce_busbw_min_gbps.get(ranks)
        name = f"allreduce_tp{ranks}"
        if wrong:
            c.add(2, name, False, f"{len(wrong)} wrong sums", "correct sums",
                  "all-reduce returned wrong sums")
        elif want is None:
            c.skip(2, name, f"peak busbw {peak:.1f} GB/s; no allreduce_busbw_min_gbps for "
                   f"{ranks} ranks")
        else:
            c.add(2, name, peak >= want, f"peak busbw {peak:.1f} GB/s", f">= {want:.0f} GB/s",
                  f"all-reduce over {ranks} GPUs reaches {peak:.1f} GB/s bus bandwidth, "
                  f"below {want:.0f}")
    p2p = list(raw.get("p2p") or [])
    if not p2p:
        c.skip(2, "p2p", "no P2P measurement")
    else:
        no_peer = [f"GPU{r['src']}->GPU{r['dst']}" for r in p2p if not r["peer_access"]]
        worst = min(p2p, key=lambda r: r["gbps"])
        want = limits.p2p_min_gbps
        ok = not no_peer and (want is None or worst["gbps"] >= want)
        c.add(2, "p2p", ok, f"min {worst['gbps']:.1f} GB/s (GPU{worst['src']}->"
              f"GPU{worst['dst']})", f"peer access, >= {want or 0:.0f} GB/s",
              "; ".join([f"no peer access {x}" for x in no_peer]
                        + ([f"slowest pair {worst['gbps']:.1f} GB/s"] if want and
                           worst["gbps"] < want else [])))
    return rows, p2p


def tp_groups(s: NodeSetting, gpu_count: int) -> list[int]:
    """TP group sizes the node supports: the plan's candidates above 1 that fit."""
    return [t for t in s.tp_candidates if 1 < t <= gpu_count]


def build_interconnect(s: NodeSetting, inv: NodeInventory, raw: Mapping[str, Any] | None,
                       why: str) -> Interconnect:
    c = Checker(s.thresholds)
    why = inv.no_gpu or why or ("" if inv.gpu_count > 1 else f"{inv.gpu_count} GPU")
    rows, p2p = interconnect_checks(s, inv.gpu_count, None if why else raw, why, c)
    return Interconnect(s.name, tuple(rows), tuple(p2p), tuple(c.checks))
