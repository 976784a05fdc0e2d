"""PNG plots of a serving sweep: the throughput-latency curve, TTFT and ITL vs concurrency.

Rendered with matplotlib's Agg backend (no display); returns PNG bytes so the caller decides
where they go (a file beside the reports, a markdown image in the asset's metadata).
"""

from __future__ import annotations

from collections.abc import Sequence

from onboarding.common.plots import plt, png
from onboarding.serving.frontend import FRONTEND_BOUND_LABEL


def sweep_png(rows: Sequence[dict], title: str, ttft_slo_s: float | None = None,
              itl_slo_ms: float | None = None) -> bytes:
    """`rows` carry scenario, load, output_tokens_per_s, ttft_p95_s, itl_mean_ms; a point
    whose `frontend_bound` is true is crossed in red on every panel."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for scenario in sorted({r["scenario"] for r in rows}):
        pts = sorted((r for r in rows if r["scenario"] == scenario), key=lambda r: r["load"])
        load = [r["load"] for r in pts]
        axes[0].plot([r["output_tokens_per_s"] for r in pts], [r["ttft_p95_s"] for r in pts],
                     marker="o", label=scenario)
        axes[1].plot(load, [r["ttft_p95_s"] for r in pts], marker="o", label=scenario)
        axes[2].plot(load, [r["itl_mean_ms"] for r in pts], marker="o", label=scenario)
        mark_frontend_bound(axes, pts)
    axes[0].set(xlabel="output tokens/s", ylabel="TTFT p95 (s)", title="throughput vs latency")
    axes[1].set(xlabel="concurrency / rate", ylabel="TTFT p95 (s)", title="TTFT")
    axes[2].set(xlabel="concurrency / rate", ylabel="mean ITL (ms)", title="ITL")
    for ax in axes[1:]:
        ax.set_xscale("log", base=2)
    if ttft_slo_s:
        axes[1].axhline(ttft_slo_s, color="red", linestyle="--", label="SLO")
    if itl_slo_ms:
        axes[2].axhline(itl_slo_ms, color="red", linestyle="--", label="SLO")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return png(fig)


def mark_frontend_bound(axes, pts: Sequence[dict]) -> None:
    """A red cross on each panel over the points whose API server saturated (labelled once
    per axes, so the legend says it once)."""
    bound = [r for r in pts if r.get("frontend_bound") is True]
    if not bound:
        return
    xy = (("output_tokens_per_s", "ttft_p95_s"), ("load", "ttft_p95_s"), ("load", "itl_mean_ms"))
    for ax, (x, y) in zip(axes, xy, strict=True):
        labelled = FRONTEND_BOUND_LABEL in ax.get_legend_handles_labels()[1]
        ax.scatter([float(r[x]) for r in bound], [float(r[y]) for r in bound], marker="x",
                   s=90, color="tab:red", zorder=5, label=None if labelled else
                   FRONTEND_BOUND_LABEL)


def calibration_png(pairs: Sequence[dict], title: str) -> bytes:
    """Predicted vs measured, one point per configuration and metric panel, with the identity
    line: `pairs` carry metric, point, predicted, measured (CalibrationPair rows)."""
    metrics = [m for m in ("ttft_p50_ms", "ttft_p95_ms", "tpot_ms", "tokens_per_s_per_gpu")
               if any(p["metric"] == m for p in pairs)] or ["tpot_ms"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        pts = [p for p in pairs if p["metric"] == metric]
        xs, ys = [p["predicted"] for p in pts], [p["measured"] for p in pts]
        for p in pts:
            ax.scatter(p["predicted"], p["measured"], label=p["point"], s=30)
        hi = max(xs + ys, default=1.0) * 1.15
        ax.plot([0, hi], [0, hi], color="grey", linestyle="--", linewidth=1, label="identity")
        ax.set(xlim=(0, hi), ylim=(0, hi), xlabel=f"predicted {metric}",
               ylabel=f"measured {metric}", title=metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    return png(fig)
