"""`configs/automation.yaml`: discovery (the new-checkpoint sensor), stack observation, re-validation.

The few fields that differ between a laptop and a cluster (bucket, prefix, engine Python) are
overridden by the ConfigFiles resource's fields, so the same file ships everywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from onboarding.common.config import StrictConfig, load_config_file
from onboarding.common.errors import ConfigError


class Discovery(StrictConfig):
    bucket: str = Field(min_length=3)
    prefix: str = ""
    page_size: int = Field(default=1000, ge=1, le=1000)
    max_pages_per_tick: int = Field(default=10, ge=1)
    minimum_interval_s: int = Field(default=30, ge=1)
    completion_marker: str = Field(default="ONBOARDING_COMPLETE", min_length=1)
    require_marker: bool = False
    run_assets: list[str] | None = None

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if v.startswith("/"):
            raise ValueError("the prefix is relative to the bucket: drop the leading '/'")
        return v if not v or v.endswith("/") else v + "/"

    @field_validator("completion_marker")
    @classmethod
    def _marker(cls, v: str) -> str:
        if "/" in v:
            raise ValueError("the marker is a file name beside the weights, without '/'")
        return v


class StackObservation(StrictConfig):
    engine_python: str | None = ".venv-engine/bin/python"
    observe_node: bool = True
    observe_interval_s: int = Field(default=60, ge=10)


class Revalidation(StrictConfig):
    cron: str = "0 3 * * *"
    timezone: str = "UTC"
    ready_assets: list[str] = Field(default_factory=lambda: ["kserve_manifest"], min_length=1)


class Launch(StrictConfig):
    sweeps: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=lambda: {"full": {}},
        description="sweep name -> stage (asset) name -> that stage's run config")
    default_sweep: str = "full"
    automatic_sweep: str = "full"

    @model_validator(mode="after")
    def _known(self) -> Launch:
        for field in ("default_sweep", "automatic_sweep"):
            if getattr(self, field) not in self.sweeps:
                raise ValueError(f"{field} {getattr(self, field)!r} is not one of the sweeps "
                                 f"({', '.join(sorted(self.sweeps))})")
        return self

    def run_config(self, sweep: str, stages: set[str] | None = None) -> dict[str, Any]:
        """Run config for `sweep`, limited to `stages` when given (a job without a stage must
        not receive config for it)."""
        if sweep not in self.sweeps:
            raise ConfigError(f"sweep {sweep!r}", "not defined in automation.yaml "
                              f"(known: {', '.join(sorted(self.sweeps))})",
                              "Pick one of those or add it under launch.sweeps.")
        ops = {stage: {"config": cfg} for stage, cfg in self.sweeps[sweep].items()
               if cfg and (stages is None or stage in stages)}
        return {"ops": ops} if ops else {}


class AutomationConfig(StrictConfig):
    discovery: Discovery
    stack: StackObservation = Field(default_factory=StackObservation)
    revalidation: Revalidation = Field(default_factory=Revalidation)
    launch: Launch = Field(default_factory=Launch)


def load_automation(path: Path) -> AutomationConfig:
    return load_config_file(AutomationConfig, path,
                            "Fix automation.yaml (docs/automation.md lists the fields).")
