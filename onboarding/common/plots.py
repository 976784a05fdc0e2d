"""matplotlib for the PNG plots: the Agg backend (no display), set once, and a figure as PNG
bytes, closed after, so a long-lived process does not keep every figure it drew."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["plt", "png"]


def png(fig, dpi: int = 80) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()
