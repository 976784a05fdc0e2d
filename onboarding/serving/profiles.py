"""What the serving stage measures and judges: traffic profiles and SLOs.

`configs/scenarios.yaml` (the profiles: scenarios, the sweep, load-timing repeats) and
`configs/gates.yaml` section `slo`. Each parser reads only its own section (other stages own the
rest of gates.yaml), rejects unknown keys, and names file + field in every error. The engine
templates are the serving stack's (onboarding/serving/stack.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from onboarding.common.config import StrictConfig, format_validation_error, load_yaml
from onboarding.common.errors import ConfigError
from onboarding.fetch.catalog import ModelSpec
from onboarding.serving.stats import Slo

# what a catalog entry's `slo` sets of the judged SLO (its target_rate_rps is the rate
# verdict's: onboarding/serving/search_settings.py)
SLO_FIELDS = frozenset(f.name for f in dataclasses.fields(Slo))

# ---- configs/scenarios.yaml ----

class Scenario(StrictConfig):
    input_tokens: int = Field(gt=0)
    output_tokens: int = Field(gt=0)
    prefix_tokens: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _prefix(self) -> Scenario:
        if self.prefix_tokens >= self.input_tokens:
            raise ValueError(f"prefix_tokens ({self.prefix_tokens}) must be below input_tokens "
                             f"({self.input_tokens})")
        return self


class Sweep(StrictConfig):
    mode: Literal["concurrency", "rate"] = "concurrency"
    concurrency: list[int] = Field(min_length=1)
    rates: list[float] = Field(default_factory=list)
    requests_per_point: int = Field(gt=0)
    min_rounds_per_point: int = Field(default=2, ge=1)
    max_seconds_per_point: float = Field(gt=0)
    warmup_requests: int = Field(default=0, ge=0)
    request_timeout_s: float = Field(gt=0)
    scrape_interval_s: float = Field(default=1.0, gt=0)
    # after the sweep, the open-loop verdict at the node type's target rate (configs/search.yaml
    # rate_verdict) on the first scenario's shapes; its outcome joins the SLO verdict
    rate_verdict: bool = False

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v):
            raise ValueError("every concurrency must be at least 1")
        return sorted(set(v))

    def requests_at(self, concurrency: int) -> int:
        return max(self.requests_per_point, self.min_rounds_per_point * concurrency)


class LoadTimingDefaults(StrictConfig):
    cold_repeats: int = Field(ge=1, description="fully cold starts (weights and caches)")
    cold_weights_repeats: int = Field(default=1, ge=0, description="weights cold, caches warm")
    warm_repeats: int = Field(ge=0)
    start_timeout_s: float = Field(gt=0)


class Profile(StrictConfig):
    substitute_baseline: bool = False
    # error: the SLO check at the target concurrency blocks what follows (a model that misses
    # its SLOs is not ready); warn: it is reported only (a profile that measures a stand-in).
    slo_severity: Literal["warn", "error"] = "error"
    # Results count only on a node whose node_acceptance passed (assets/node_gate.py).
    require_node_acceptance: bool = False
    scenarios: dict[str, Scenario] = Field(min_length=1)
    sweep: Sweep
    load_timing: LoadTimingDefaults

    def sweep_for(self, target_concurrency: int) -> Sweep:
        """The sweep with the target concurrency added where the SLO verdict blocks
        (slo_severity error): the verdict is taken there, never below it."""
        if self.slo_severity != "error" or self.sweep.mode != "concurrency":
            return self.sweep
        return self.sweep.model_copy(update={"concurrency": sorted(
            {*self.sweep.concurrency, target_concurrency})})


class ScenariosFile(StrictConfig):
    profiles: dict[str, Profile] = Field(min_length=1)


def load_profiles(path: Path) -> dict[str, Profile]:
    try:
        return ScenariosFile.model_validate(load_yaml(path)).profiles
    except ValidationError as exc:
        raise ConfigError(str(path), format_validation_error(path, exc).split(": ", 1)[1],
                          "Fix the traffic profiles.") from None


def pick_profile(profiles: dict[str, Profile], name: str, origin: str) -> Profile:
    try:
        return profiles[name]
    except KeyError:
        raise ConfigError(f"{origin}: profile {name!r}",
                          f"not defined (known: {', '.join(sorted(profiles))})",
                          "Pick a defined profile or add it to configs/scenarios.yaml.") from None


def scenarios_for(spec: ModelSpec, profile: Profile, origin: str) -> dict[str, Scenario]:
    missing = [s for s in spec.scenarios if s not in profile.scenarios]
    if missing:
        raise ConfigError(
            f"model {spec.id!r}: scenarios {missing}",
            f"not defined in {origin} (known: {', '.join(sorted(profile.scenarios))})",
            "Fix the model's 'scenarios' list or add the profile to configs/scenarios.yaml.")
    return {s: profile.scenarios[s] for s in spec.scenarios}


def check_fits(scenarios: dict[str, Scenario], max_model_len: int | None,
               special_tokens: int = 2) -> None:
    """Refuse before the run a scenario the engine would reject for every request."""
    if max_model_len is None:
        return
    too_long = {name: s.input_tokens + s.output_tokens + special_tokens
                for name, s in scenarios.items()
                if s.input_tokens + s.output_tokens + special_tokens > max_model_len}
    if too_long:
        desc = ", ".join(f"{n} needs {t}" for n, t in sorted(too_long.items()))
        raise ConfigError(
            f"scenarios {sorted(too_long)}",
            f"input + output tokens exceed --max-model-len {max_model_len} ({desc}, counting "
            f"{special_tokens} special tokens)",
            "Raise the model's engine_args.max_model_len or pick a smaller profile in "
            "configs/scenarios.yaml.")


# ---- configs/gates.yaml: slo ----

class SloFields(StrictConfig):
    ttft_p95_s: float | None = Field(default=None, gt=0)
    itl_mean_ms: float | None = Field(default=None, gt=0)
    error_rate_max: float | None = Field(default=None, ge=0, le=1)
    target_concurrency: int | None = Field(default=None, ge=1)
    cold_start_p95_max_s: float | None = Field(default=None, gt=0)


class SloSection(StrictConfig):
    defaults: SloFields
    node_types: dict[str, SloFields] = Field(default_factory=dict)

    @field_validator("defaults")
    @classmethod
    def _complete(cls, v: SloFields) -> SloFields:
        unset = [k for k, val in v.model_dump().items() if val is None]
        if unset:
            raise ValueError(f"defaults must set every SLO; unset: {', '.join(unset)}")
        return v


def load_slo_section(gates_path: Path) -> SloSection:
    data = load_yaml(gates_path) or {}
    section = data.get("slo") if isinstance(data, dict) else None
    if section is None:
        raise ConfigError(f"{gates_path}: section 'slo'", "missing",
                          "Add the 'slo:' section (defaults and node_types).")
    try:
        return SloSection.model_validate(section)
    except ValidationError as exc:
        msg = format_validation_error(gates_path, exc).replace("field '", "field 'slo.")
        raise ConfigError(str(gates_path), msg.split(": ", 1)[1], "Fix the SLOs.") from None


def resolve_slo(section: SloSection, node_type: str, spec: ModelSpec) -> Slo:
    """defaults < node type < the model's own overrides."""
    merged = section.defaults.model_dump()
    layers = [section.node_types.get(node_type), spec.slo]
    for layer in layers:
        if layer is None:
            continue
        merged.update({k: v for k, v in layer.model_dump().items()
                       if v is not None and k in SLO_FIELDS})
    return Slo(**merged)
