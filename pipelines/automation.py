"""The cadence the sensors and the schedule are defined with, and what each tick says of it.

Dagster takes a sensor's minimum interval and a schedule's cron and timezone from their
definitions, so those four values are read when the code location loads, through the same door
as every other read (`pipelines.resources.config_files`), tolerantly: a broken automation.yaml
leaves the defaults here and the code location loads. Nothing else is kept from that read: every
tick reads automation.yaml itself (`configs.automation()`), so a broken file fails the tick
naming file and field, and a fixed or changed one is used at the next tick without a reload.
When the file's cadence differs from the one loaded, the tick warns (`Cadence.drift`): only a
reload of the code location applies a new interval or cron.
"""

from __future__ import annotations

from dataclasses import dataclass

from onboarding.common.errors import ConfigError
from onboarding.runs.automation import AutomationConfig, Discovery, Revalidation, StackObservation
from pipelines.resources import config_files


@dataclass(frozen=True)
class Cadence:
    discovery_interval_s: int
    stack_interval_s: int
    cron: str
    timezone: str

    @classmethod
    def of(cls, cfg: AutomationConfig) -> Cadence:
        return cls(cfg.discovery.minimum_interval_s, cfg.stack.observe_interval_s,
                   cfg.revalidation.cron, cfg.revalidation.timezone)

    def drift(self, cfg: AutomationConfig) -> str:
        """"" when `cfg` (read by a tick) has the cadence the definitions were loaded with,
        else what differs and that a reload applies it."""
        now = Cadence.of(cfg)
        changed = [f"{name} is {getattr(now, name)!r} (defined with {getattr(self, name)!r})"
                   for name in ("discovery_interval_s", "stack_interval_s", "cron", "timezone")
                   if getattr(now, name) != getattr(self, name)]
        return ("automation.yaml: " + "; ".join(changed) + ". Dagster keeps a sensor's "
                "interval and a schedule's cron in their definitions: reload the code location "
                "to apply it.") if changed else ""


def cadence_at_load() -> Cadence:
    try:
        return Cadence.of(config_files().automation())
    except ConfigError:  # the ticks fail with the file's error until it is fixed
        return Cadence(Discovery.model_fields["minimum_interval_s"].default,
                       StackObservation().observe_interval_s, Revalidation().cron,
                       Revalidation().timezone)


AT_LOAD = cadence_at_load()
