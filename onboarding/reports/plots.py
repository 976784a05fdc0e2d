"""PNG plots of the readiness report: accuracy drops against the tolerance, start times, and the
latency-throughput curves of a sweep with the SLO lines and the target concurrency marked.

Drawn through onboarding/common/plots.py (Agg backend, no display, PNG bytes back), so the
caller decides where they go: a data: URI in the HTML page and in the asset's Markdown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from onboarding.common.plots import plt, png
from onboarding.serving.plots import mark_frontend_bound

VERDICT_COLOURS = {"pass": "tab:green", "fail": "tab:red", "inconclusive": "tab:orange"}


@dataclass(frozen=True, kw_only=True)
class DropPoint:
    """One task of one variant: the drop from the baseline and its interval, in metric points
    (percentage points of accuracy/exact match), against the allowed drop."""

    task: str
    precision: str
    drop_pts: float
    low_pts: float
    high_pts: float
    allowed_pts: float
    verdict: str  # pass | fail | inconclusive


def accuracy_png(points: Sequence[DropPoint], title: str) -> bytes:
    """Per task, one marker per variant at its drop with the interval as error bar; the allowed
    drop as a dashed line across the task's group and the region beyond it shaded."""
    tasks = list(dict.fromkeys(p.task for p in points))
    precisions = list(dict.fromkeys(p.precision for p in points))
    fig, ax = plt.subplots(figsize=(max(5.5, 2.6 * len(tasks)) + 1.6, 3.8))
    width = 0.7 / max(len(precisions), 1)
    top = max([p.high_pts for p in points] + [p.allowed_pts for p in points] + [1.0]) * 1.25
    bottom = min([p.low_pts for p in points] + [0.0]) * 1.25 - 0.5
    for i, task in enumerate(tasks):
        allowed = next(p.allowed_pts for p in points if p.task == task)
        ax.fill_between([i - 0.45, i + 0.45], allowed, top, color="tab:red", alpha=0.08)
        ax.hlines(allowed, i - 0.45, i + 0.45, colors="tab:red", linestyles="--", linewidth=1.2)
        for j, precision in enumerate(precisions):
            p = next((p for p in points if p.task == task and p.precision == precision), None)
            if p is None:
                continue
            x = i - 0.35 + width * (j + 0.5)
            ax.errorbar(x, p.drop_pts, yerr=[[p.drop_pts - p.low_pts], [p.high_pts - p.drop_pts]],
                        fmt="o", capsize=4, color=VERDICT_COLOURS.get(p.verdict, "tab:grey"))
            ax.annotate(precision, (x, p.high_pts), textcoords="offset points", xytext=(0, 4),
                        ha="center", fontsize=8)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_xlim(-0.6, len(tasks) - 0.4)
    ax.set_ylim(bottom, top)
    ax.set_ylabel("drop from bf16 (points)")
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=c, label=v)
               for v, c in VERDICT_COLOURS.items() if any(p.verdict == v for p in points)]
    handles.append(plt.Line2D([], [], color="tab:red", linestyle="--", label="allowed drop"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return png(fig)


def starts_png(phases: Sequence[tuple[str, float | None, float | None]], title: str,
               budget_s: float | None = None) -> bytes:
    """Bars per kind of start: (kind, p50_s, p95_s); a missing p95 draws the p50 alone, a kind
    not measured is labelled so. The cold-start budget as a dashed line."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    xs = range(len(phases))
    for x, (kind, p50, p95) in zip(xs, phases, strict=True):
        if p50 is None and p95 is None:
            ax.text(x, 0, "not measured", ha="center", va="bottom", fontsize=8, rotation=90)
            continue
        if p50 is not None:
            ax.bar(x - 0.18, p50, width=0.36, color="tab:blue", label="p50" if x == 0 else None)
            ax.annotate(f"{p50:.1f}", (x - 0.18, p50), ha="center", va="bottom", fontsize=8)
        if p95 is not None:
            ax.bar(x + 0.18, p95, width=0.36, color="tab:orange",
                   label="p95" if x == 0 else None)
            ax.annotate(f"{p95:.1f}", (x + 0.18, p95), ha="center", va="bottom", fontsize=8)
    if budget_s is not None:
        ax.axhline(budget_s, color="tab:red", linestyle="--", label=f"budget {budget_s:g} s")
    ax.set_xticks(list(xs), [k.replace("_", " ") for k, _, _ in phases])
    ax.set_ylabel("start to first token (s)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return png(fig)


def curves_png(rows: Sequence[dict], title: str, ttft_slo_s: float | None,
               itl_slo_ms: float | None, target_concurrency: int | None) -> bytes:
    """One row of panels per scenario: output tokens/s against TTFT p95 (the point at the
    target concurrency ringed), TTFT p95 and mean ITL against concurrency with the SLO lines
    and the target concurrency as a dotted vertical line; frontend-bound points crossed in
    red."""
    scenarios = sorted({str(r["scenario"]) for r in rows})
    fig, axes = plt.subplots(len(scenarios), 3, figsize=(13, 3.6 * len(scenarios)),
                             squeeze=False)
    for ax_row, scenario in zip(axes, scenarios, strict=True):
        pts = sorted((r for r in rows if str(r["scenario"]) == scenario),
                     key=lambda r: float(r["load"]))
        load = [float(r["load"]) for r in pts]
        tput = [float(r["output_tokens_per_s"]) for r in pts]
        ttft = [float(r["ttft_p95_s"]) for r in pts]
        itl = [float(r["itl_mean_ms"]) for r in pts]
        ax_row[0].plot(tput, ttft, marker="o")
        for x, y, c in zip(tput, ttft, load, strict=True):
            ax_row[0].annotate(f"{c:g}", (x, y), textcoords="offset points", xytext=(4, 4),
                               fontsize=7)
        at = [i for i, c in enumerate(load) if target_concurrency is not None
              and c == target_concurrency]
        for i in at:
            ax_row[0].scatter([tput[i]], [ttft[i]], s=160, facecolors="none",
                              edgecolors="tab:red", label=f"target {target_concurrency}")
        ax_row[1].plot(load, ttft, marker="o")
        ax_row[2].plot(load, itl, marker="o")
        mark_frontend_bound(ax_row, pts)
        ax_row[0].set(xlabel="output tokens/s", ylabel="TTFT p95 (s)",
                      title=f"{scenario}: throughput vs latency")
        ax_row[1].set(xlabel="concurrency", ylabel="TTFT p95 (s)", title=f"{scenario}: TTFT")
        ax_row[2].set(xlabel="concurrency", ylabel="mean ITL (ms)", title=f"{scenario}: ITL")
        for ax, slo in ((ax_row[0], ttft_slo_s), (ax_row[1], ttft_slo_s),
                        (ax_row[2], itl_slo_ms)):
            if slo is not None:
                ax.axhline(slo, color="tab:red", linestyle="--", label="SLO")
        for ax in ax_row[1:]:
            if min(load, default=0) > 0:
                ax.set_xscale("log", base=2)
                ax.set_xticks(load, [f"{c:g}" for c in load])
            if target_concurrency is not None:
                ax.axvline(target_concurrency, color="tab:red", linestyle=":",
                           label=f"target {target_concurrency}")
        for ax in ax_row:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return png(fig)
