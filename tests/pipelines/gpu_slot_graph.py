"""Two independent GPU-bound assets and one CPU asset, for the local GPU-slot test.

Each GPU step writes a marker while it runs. With `rendezvous_s > 0` it waits that long for the
other GPU step's marker and records whether it saw it: proof that two GPU steps ran at once.
"""

import time
from pathlib import Path

import dagster as dg

from assets.step_tags import gpu_step_tags
from pipelines.executors import onboarding_executor


class SlotConfig(dg.Config):
    marker_dir: str
    rendezvous_s: float = 0.0


def _gpu_asset(name: str, other: str) -> dg.AssetsDefinition:
    @dg.asset(name=name, op_tags=gpu_step_tags(name))
    def _asset(config: SlotConfig) -> None:
        markers = Path(config.marker_dir)
        mine = markers / f"{name}.running"
        mine.touch()
        try:
            deadline = time.monotonic() + config.rendezvous_s
            while time.monotonic() < deadline:
                if (markers / f"{other}.running").exists():
                    (markers / f"{name}.saw-{other}").touch()
                    return
                if (markers / f"{other}.saw-{name}").exists():
                    return
                time.sleep(0.05)
        finally:
            mine.unlink()

    return _asset


@dg.asset
def cpu_stage() -> None:
    return None


_assets = [_gpu_asset("quantized", "accuracy"), _gpu_asset("accuracy", "quantized"), cpu_stage]


def limited_job() -> dg.JobDefinition:
    """The project's local executor: GPU steps limited to the configured local slots."""
    return dg.Definitions(
        assets=_assets,
        jobs=[dg.define_asset_job("limited", executor_def=onboarding_executor("multiprocess"))],
    ).resolve_job_def("limited")


def unlimited_job() -> dg.JobDefinition:
    """Plain multiprocess executor: the control that shows the test can see an overlap."""
    return dg.Definitions(
        assets=_assets,
        jobs=[dg.define_asset_job("unlimited", executor_def=dg.multiprocess_executor)],
    ).resolve_job_def("unlimited")
