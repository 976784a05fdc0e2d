"""configs/search.yaml: the rate verdict's settings and the configuration search's grid and
budget, per node type (`defaults` < `node_types.<node type>`). Strict: an unknown key, a
missing default or a value out of range is an error naming the file and the field."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError, field_validator

from onboarding.common.config import StrictConfig, format_validation_error, load_yaml
from onboarding.common.errors import ConfigError
from onboarding.fetch.catalog import ModelSpec
from onboarding.serving.rate_verdict import RateSlo, requests_to_meet


class RateFields(StrictConfig):
    target_rate_rps: float | None = Field(default=None, gt=0)
    percentile: float | None = Field(default=None, ge=50, lt=100)
    ttft_s: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    confidence: float | None = Field(default=None, ge=0.5, lt=1)
    min_requests: int | None = Field(default=None, ge=1)
    min_seconds: float | None = Field(default=None, ge=0)
    max_seconds: float | None = Field(default=None, gt=0)
    look_every: int | None = Field(default=None, ge=1)
    repeats: int | None = Field(default=None, ge=1)


class SearchFields(StrictConfig):
    budget_minutes: float | None = Field(default=None, gt=0)
    max_candidates: int | None = Field(default=None, ge=1)
    max_num_seqs: list[int] | None = Field(default=None, min_length=1)
    max_num_batched_tokens: list[int] | None = Field(default=None, min_length=1)
    api_server_count: list[int] | None = Field(default=None, min_length=1)
    min_margin: float | None = Field(default=None, ge=0, lt=1)
    in_pipeline: bool | None = None  # the cell's config_search asset runs it
    start_seconds: float | None = Field(default=None, gt=0)  # one engine start, for the budget

    @field_validator("max_num_seqs", "max_num_batched_tokens", "api_server_count")
    @classmethod
    def _positive(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and min(v) < 1:
            raise ValueError(f"{v}: every value must be >= 1")
        return v


def _complete(v: StrictConfig) -> StrictConfig:
    if unset := [k for k, val in v.model_dump().items() if val is None]:
        raise ValueError(f"defaults must set every field; unset: {', '.join(unset)}")
    return v


class RateSection(StrictConfig):
    defaults: RateFields
    node_types: dict[str, RateFields] = Field(default_factory=dict)
    _check = field_validator("defaults")(classmethod(lambda cls, v: _complete(v)))


class SearchSection(StrictConfig):
    defaults: SearchFields
    node_types: dict[str, SearchFields] = Field(default_factory=dict)
    _check = field_validator("defaults")(classmethod(lambda cls, v: _complete(v)))


class SearchFile(StrictConfig):
    rate_verdict: RateSection
    search: SearchSection


class SearchSettings(StrictConfig):
    """The search at one node type."""

    budget_minutes: float
    max_candidates: int
    max_num_seqs: list[int]
    max_num_batched_tokens: list[int]
    api_server_count: list[int]
    min_margin: float
    in_pipeline: bool
    start_seconds: float


def load_search_file(path: Path) -> SearchFile:
    try:
        return SearchFile.model_validate(load_yaml(path) or {})
    except ValidationError as exc:
        raise ConfigError(str(path), format_validation_error(path, exc).split(": ", 1)[1],
                          "Fix configs/search.yaml (docs/serving.md).") from None


def _merged(defaults: StrictConfig, layer: StrictConfig | None) -> dict:
    out = defaults.model_dump()
    if layer is not None:
        out.update({k: v for k, v in layer.model_dump().items() if v is not None})
    return out


def rate_slo(f: SearchFile, node_type: str, spec: ModelSpec | None = None) -> RateSlo:
    """The rate verdict at `node_type`, at the rate `spec`'s catalog entry sets where it sets
    one (`slo.target_rate_rps`: the traffic is the model's); an error when its run could never
    show "met" (fewer requests fit in `max_seconds` at the target rate than a met verdict
    needs)."""
    m = _merged(f.rate_verdict.defaults, f.rate_verdict.node_types.get(node_type))
    where = f"configs/search.yaml rate_verdict at {node_type}"
    if spec is not None and spec.slo.target_rate_rps is not None:
        m["target_rate_rps"] = spec.slo.target_rate_rps
        where += f" (the rate from {spec.id}'s catalog entry slo.target_rate_rps)"
    rate = RateSlo(target_rate_rps=m["target_rate_rps"], ttft_p_s=m["ttft_s"],
                   tpot_p_ms=m["tpot_ms"], percentile=m["percentile"],
                   confidence=m["confidence"], min_requests=m["min_requests"],
                   min_seconds=m["min_seconds"], max_seconds=m["max_seconds"],
                   look_every=m["look_every"], repeats=m["repeats"])
    need, fit = requests_to_meet(rate), rate.target_rate_rps * rate.max_seconds
    if fit < need:
        raise ConfigError(
            where,
            f"{fit:.0f} requests fit in max_seconds={rate.max_seconds:g} at "
            f"{rate.target_rate_rps:g} req/s, and showing p{rate.percentile:g} and p95 met at "
            f"confidence {rate.confidence:g} needs {need}: every run would end undecided",
            "Raise max_seconds or look_every (fewer looks), or lower the percentile.")
    return rate


def search_settings(f: SearchFile, node_type: str) -> SearchSettings:
    return SearchSettings(**_merged(f.search.defaults, f.search.node_types.get(node_type)))
