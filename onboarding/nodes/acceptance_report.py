"""The one-page acceptance report of a node: verdict per phase, every check, the numbers, and
PNG traces of the burn's power, temperature and SM clock per GPU (matplotlib, Agg backend).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from onboarding.common.plots import plt, png
from onboarding.common.tables import md_table
from onboarding.nodes import telemetry as tm
from onboarding.nodes.acceptance import NodeAcceptance

_TRACES = ((tm.POWER_W, "power (W)"), (tm.GPU_TEMP_C, "GPU temperature (C)"),
           (tm.SM_CLOCK_MHZ, "SM clock (MHz)"))


def burn_png(samples: Sequence[Mapping[str, Any]], title: str,
             limits: Mapping[str, float | None] | None = None,
             window_s: Sequence[float] | None = None) -> bytes | None:
    """Power, temperature and SM clock against time, one line per GPU; None without samples.
    `limits` draws a dashed line per field (the power limit, the temperature limit...);
    `window_s` shades the span the burn computed (what was judged)."""
    if not samples:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (name, label) in zip(axes, _TRACES, strict=True):
        for gpu in tm.gpus_in(samples):
            pts = sorted((float(s["t_s"]), float(s[name])) for s in samples
                         if int(s["gpu"]) == gpu and name in s)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=f"GPU{gpu}", lw=1)
        if window_s:
            ax.axvspan(window_s[0], window_s[1], color="grey", alpha=0.1, lw=0)
        limit = (limits or {}).get(name)
        if limit:
            ax.axhline(limit, color="red", linestyle="--", lw=1, label="limit")
        ax.set(xlabel="seconds", ylabel=label, title=label.split(" (")[0])
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return png(fig)


def report_markdown(acc: NodeAcceptance, sections: Mapping[str, str], plot_name: str | None
                    ) -> str:
    """The page: verdict and reasons, the phase table, the checks, then named sections
    (inventory, burn, interconnect, ...) already rendered as Markdown."""
    when = datetime.fromtimestamp(acc.accepted_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    headline = (f"**{'QUALIFIED' if acc.qualified else 'NOT QUALIFIED'}** at {when}; driver "
                f"{acc.stack_facts.get('nvidia_driver', 'unknown')}, CUDA "
                f"{acc.stack_facts.get('cuda_driver_api', 'unknown')}.")
    lines = [f"# Node acceptance: {acc.node} ({acc.node_type})", "", headline, ""]
    if acc.reasons:
        lines += ["Reasons:", "", *[f"- {r}" for r in acc.reasons], ""]
    lines += ["## Phases", "", md_table(acc.phases), "", "## Checks", "",
              md_table([c.row() for c in acc.checks]), ""]
    for title, body in sections.items():
        lines += [f"## {title}", "", body, ""]
    if plot_name:
        lines += ["## Burn traces", "", f"![burn traces]({plot_name})", ""]
    return "\n".join(lines)


def report_sections(parts: Mapping[str, Any]) -> dict[str, str]:
    """The numbers behind the checks, one Markdown section per upstream asset that ran."""
    out: dict[str, str] = {}
    inv = parts.get("node_inventory")
    if inv is not None:
        body = [md_table([g.row for g in inv.smi.gpus]) if inv.smi else inv.no_gpu]
        if inv.topology is not None:
            body += ["", "Topology (`nvidia-smi topo -m`):", "",
                     md_table(inv.topology.matrix_rows())]
        nics = inv.system.get("nics") or []
        numa = ", ".join(f"{k} ({v})" for k, v in (inv.system.get("numa_nodes") or {}).items())
        body += ["", f"CPU sockets: {inv.system.get('cpu_sockets')}; NUMA nodes: {numa}", "",
                 md_table(nics, empty="no NIC with a device")]
        out["Inventory"] = "\n".join(body)
    health = parts.get("gpu_health")
    if health is not None and health.burn:
        what = (f"{health.burn.get('duration_s', 0):.0f} s of "
                f"{health.burn.get('matmul_size')}^3 {health.burn.get('dtype')} matmuls per GPU.")
        out["Burn"] = "\n".join([
            what, "",
            md_table(health.burn.get("per_gpu") or [], floatfmt=".4g"), "",
            "Steady part (after warm-up):", "", md_table(health.windows)])
    ic = parts.get("interconnect")
    if ic is not None and (ic.allreduce or ic.p2p):
        out["Interconnect"] = "\n".join(["All-reduce (nccl-tests busbw):", "",
                                         md_table(ic.allreduce), "", "P2P copies:", "",
                                         md_table(ic.p2p)])
    mem = parts.get("memory_bandwidth")
    if mem is not None and mem.per_gpu:
        out["Memory bandwidth"] = md_table(mem.per_gpu)
    st = parts.get("storage_read")
    if st is not None:
        out["Storage"] = md_table([_storage_row("direct-I/O read", st.direct_read),
                                   _storage_row("S3 GET", st.s3_get)])
    return out


def _storage_row(test: str, r: Mapping[str, Any]) -> dict[str, Any]:
    return {"test": test, "gbps": r.get("gbps"), "bytes": r.get("bytes"),
            "seconds": r.get("seconds"),
            "where / why not": r.get("why_not") or r.get("error") or r.get("path")
            or r.get("uri")}


def checks_csv_table(rows: Sequence[Mapping[str, str]]) -> str:
    """A node's `checks.csv` (as the probe or node_acceptance wrote it) as one Markdown table,
    the reason in place of a measurement for a check not made: for docs and reviews of a
    recorded node, whose files are all that is left of it."""
    return md_table([{"phase": int(r["phase"]), "check": r["check"], "result": r["result"],
                      "measured": r["measured"] or r["reason"].removeprefix("not checked: "),
                      "threshold": r["expected"],
                      "required": "yes" if r["required"] == "True" else "no"} for r in rows])
