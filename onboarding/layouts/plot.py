"""The picture of a node layout: the node's GPUs, what sits where, memory per GPU, NUMA halves.

matplotlib's Agg backend (no display); returns PNG bytes for the asset's metadata and docs/.
"""

from __future__ import annotations

from matplotlib.patches import Patch

from onboarding.common.plots import plt, png
from onboarding.deploy.plan import GIB
from onboarding.layouts.placement import LayoutPlan

_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#17becf")


def layout_png(plan: LayoutPlan) -> bytes:
    """One bar per GPU: each engine's weights (solid), planned KV cache (light), reserve
    (hatched) and the rest of its --gpu-memory-utilization share, which vLLM also fills with KV
    blocks (faint); the utilization line, and the NUMA halves shaded behind."""
    hbm_gib = plan.memory_bytes_per_gpu / GIB
    fig, ax = plt.subplots(figsize=(max(8, plan.gpus * 1.3), 5.8))
    for i, socket in enumerate(plan.numa_gpus):
        ax.axvspan(min(socket) - 0.5, max(socket) + 0.5, color=("#f2f2f2", "#e6eef7")[i % 2],
                   zorder=0)
        ax.text((min(socket) + max(socket)) / 2, hbm_gib * 1.02, f"NUMA {i}", ha="center",
                va="bottom", fontsize=9, color="#555555")
    color = {p.model: _PALETTE[i % len(_PALETTE)] for i, p in enumerate(plan.placements)}
    bottoms = [0.0] * plan.gpus
    for p in plan.placements:
        for g in p.gpu_ids:
            y = bottoms[g]
            pool = max(0.0, p.gpu_memory_utilization * plan.memory_bytes_per_gpu
                       - p.need_bytes_per_gpu)
            parts = ((p.weight_bytes_per_gpu, 1.0, None), (p.kv_bytes_per_gpu, 0.45, None),
                     (p.reserve_bytes_per_gpu, 0.25, "//"), (pool, 0.1, None))
            for size, alpha, hatch in parts:
                height = size / GIB
                ax.bar(g, height, bottom=y, width=0.8, color=color[p.model], alpha=alpha,
                       hatch=hatch, edgecolor="white", linewidth=0.5, zorder=2)
                y += height
            label = f"{p.served_name}\nTP{p.tensor_parallel}" + (
                f" EP{p.expert_parallel}" if p.expert_parallel > 1 else "") + f" {p.precision}"
            ax.text(g, (bottoms[g] + y) / 2, label, ha="center", va="center", fontsize=7,
                    rotation=90, zorder=3)
            bottoms[g] = y
    ax.axhline(hbm_gib * plan.gpu_memory_utilization, color="red", linestyle="--", linewidth=1,
               label=f"--gpu-memory-utilization {plan.gpu_memory_utilization:g}", zorder=1)
    ax.axhline(hbm_gib, color="black", linewidth=1, label=f"HBM {hbm_gib:.0f} GiB", zorder=1)
    ax.set_xticks(range(plan.gpus), [f"GPU {g}" for g in range(plan.gpus)])
    ax.set_xlim(-0.5, plan.gpus - 0.5)
    ax.set_ylim(0, hbm_gib * 1.12)
    ax.set_ylabel("GiB per GPU")
    legend = [Patch(color="#777777", alpha=a, hatch=h, label=t) for a, h, t in
              ((1.0, None, "weights"), (0.45, None, "KV (target)"), (0.25, "//", "reserve"),
               (0.1, None, "KV pool to the fraction"))]
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=[*legend, *handles], fontsize=8, loc="upper center", ncol=3,
              bbox_to_anchor=(0.5, -0.07))
    ax.set_title(f"{plan.name} ({plan.node_type}): {plan.mix_tokens_per_s:,.0f} tokens/s of "
                 "the traffic mix", fontsize=11)
    fig.tight_layout()
    return png(fig, dpi=90)
