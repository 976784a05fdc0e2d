"""What sensors and schedules must know when the code location loads (tick intervals, cron).

Read tolerantly: a broken automation.yaml leaves the defaults here and the code location loads;
every tick then fails with the file's error (`AutomationAtLoad.check`), naming file and field.
Everything else a tick needs is read from the ConfigFiles resource when it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from onboarding.common.errors import ConfigError
from onboarding.runs.automation import Discovery, Revalidation, StackObservation
from pipelines.executors import config_files


@dataclass(frozen=True)
class AutomationAtLoad:
    discovery_interval_s: int
    stack_interval_s: int
    cron: str
    timezone: str
    error: ConfigError | None = None

    def check(self) -> None:
        """Raise the load-time error on every tick until the file is fixed (and reloaded)."""
        if self.error is not None:
            raise self.error


def automation_at_load() -> AutomationAtLoad:
    try:
        cfg = config_files().automation()
    except ConfigError as exc:
        discovery = Discovery.model_fields["minimum_interval_s"].default
        return AutomationAtLoad(discovery, StackObservation().observe_interval_s,
                                Revalidation().cron, Revalidation().timezone, exc)
    return AutomationAtLoad(cfg.discovery.minimum_interval_s, cfg.stack.observe_interval_s,
                            cfg.revalidation.cron, cfg.revalidation.timezone)


AT_LOAD = automation_at_load()
