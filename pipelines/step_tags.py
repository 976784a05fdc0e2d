"""Op tags for GPU-bound steps: Kubernetes pod config for step pods and the local GPU pool.

Assets call `gpu_step_tags("<asset name>")` at decoration time; CPU assets call nothing.
"""

from __future__ import annotations

GPU_BOUND_ASSETS = ("quantized", "accuracy", "load_timing", "serving_benchmark")


def gpu_step_tags(stage: str) -> dict[str, str]:
    """Tags for a GPU-bound asset's step (filled in by the cluster stage)."""
    if stage not in GPU_BOUND_ASSETS:
        raise ValueError(f"{stage!r} is not a GPU-bound asset ({', '.join(GPU_BOUND_ASSETS)})")
    return {}
