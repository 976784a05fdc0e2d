"""Model catalog: `configs/models/*.yaml` -> validated `ModelSpec`s keyed by partition key.

A spec says where a checkpoint comes from and how it must be proven (precision ladder, eval
tasks, traffic scenarios, SLO overrides). Unknown keys are rejected and every error names the
file and the field, because a typo in a gate silently relaxing it is the worst failure here.

What a spec leaves unset comes from the catalog's `_defaults.yaml` (`DEFAULTS_FILE`), the same
for a catalog entry, a checkpoint dropped under the watched prefix and a launchpad model; the
field defaults below apply only where a catalog has no such file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from onboarding.common.config import StrictConfig, load_yaml, validate_config
from onboarding.common.errors import ConfigError
from onboarding.common.names import is_dns1123_label, to_dns1123_label
from onboarding.common.redact import redact_urls, url_secret

Precision = Literal["nvfp4", "fp8", "bf16"]
PRECISION_WIDTH = {"nvfp4": 0, "fp8": 1, "bf16": 2}  # quantization moves down this order only

_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])/(?P<prefix>.*)$")
_HF_URI = re.compile(r"^hf://(?P<repo>[A-Za-z0-9][\w.\-]*/[\w.\-]+)(@(?P<revision>[^@]*))?$")
# A branch, a tag or a commit: one git ref name component, no path (huggingface_hub joins the
# revision into paths of its cache, so '/' or '..' would reach outside it).
_REVISION = re.compile(r"^[A-Za-z0-9_][\w.\-]*$")


class SloOverrides(StrictConfig):
    """Per-model SLOs; unset fields fall back to `configs/gates.yaml`."""

    ttft_p95_s: float | None = Field(default=None, gt=0)
    itl_mean_ms: float | None = Field(default=None, gt=0)
    error_rate_max: float | None = Field(default=None, ge=0, le=1)
    target_concurrency: int | None = Field(default=None, ge=1)
    # the production rate one replica must hold (Poisson, req/s): the rate verdict's target,
    # over configs/search.yaml's node-type value (the traffic is the model's, not the GPU's)
    target_rate_rps: float | None = Field(default=None, gt=0)


class ArchitectureHint(StrictConfig):
    """Declared facts for plan-only entries, whose weights the pipeline never sees."""

    params_billion: float = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    num_attention_heads: int | None = Field(default=None, gt=0)  # TP must divide it
    moe: bool = False
    active_params_billion: float | None = Field(default=None, gt=0)
    # What quantization keeps in bf16 (embeddings, lm_head, MoE routers): counted at 2 bytes.
    hidden_size: int | None = Field(default=None, gt=0)
    vocab_size: int | None = Field(default=None, gt=0)
    tie_word_embeddings: bool = False
    num_experts: int | None = Field(default=None, gt=1)
    first_dense_layers: int = Field(default=0, ge=0)  # DeepSeek's first_k_dense_replace
    # Multi-head latent attention (DeepSeek-V3/R1): the KV cache holds this latent + rope dims.
    kv_lora_rank: int | None = Field(default=None, gt=0)
    qk_rope_head_dim: int | None = Field(default=None, gt=0)
    # What a performance model (AIConfigurator, onboarding/predictions/predict.py) needs beyond the memory
    # plan: the config.json `architectures[0]` and the MLP widths it times GEMMs with.
    hf_architecture: str | None = Field(default=None, min_length=1)
    intermediate_size: int | None = Field(default=None, gt=0)
    moe_intermediate_size: int | None = Field(default=None, gt=0)
    num_experts_per_tok: int | None = Field(default=None, gt=0)
    max_position_embeddings: int | None = Field(default=None, gt=0)


class SourceRef(StrictConfig):
    kind: Literal["s3", "hf"]
    location: str  # bucket for s3, repo id for hf
    path: str  # prefix for s3 (ends with '/'), '' for hf
    revision: str | None = None

    @property
    def uri(self) -> str:
        if self.kind == "s3":
            return f"s3://{self.location}/{self.path}"
        return f"hf://{self.location}" + (f"@{self.revision}" if self.revision else "")


def check_revision(revision: str) -> str:
    """A Hugging Face revision must be a branch, tag or commit: no path, no '..'."""
    if not _REVISION.match(revision) or ".." in revision or revision.endswith((".", ".lock")):
        raise ValueError(
            f"revision {revision!r} is not a branch, tag or commit (letters, digits, '_', '-' "
            "and '.'; no '/', no '..'); pin the 40-hex commit for anything else")
    return revision


def parse_source(uri: str) -> SourceRef:
    """`uri` as a SourceRef; one that carries a secret is refused and shown redacted, since a
    source is echoed in errors, logs and manifest annotations."""
    if secret := url_secret(uri):
        raise ValueError(
            f"{redact_urls(uri)!r} carries {secret}; a source must not hold credentials, which "
            "would be echoed in logs, the event store and manifests. Write the bare "
            "'s3://<bucket>/<prefix>/' (or 'hf://<org>/<name>@<revision>') and give "
            "credentials through AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or HF_TOKEN); "
            "revoke the credential you pasted if this file was shared")
    if m := _S3_URI.match(uri):
        prefix = m["prefix"]
        if bad := {".", ".."} & set(prefix.rstrip("/").split("/")):
            raise ValueError(f"the prefix of {uri!r} has a {max(bad)!r} segment; S3 would "
                             "take it literally, so it names no checkpoint: write the prefix "
                             "without it")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return SourceRef(kind="s3", location=m["bucket"], path=prefix)
    if m := _HF_URI.match(uri):
        if ".." in m["repo"].split("/"):
            raise ValueError(f"the repository of {uri!r} has a '..' segment: write org/name")
        revision = m["revision"]
        return SourceRef(kind="hf", location=m["repo"], path="",
                         revision=check_revision(revision) if revision is not None else None)
    raise ValueError(
        "expected 's3://<bucket>/<prefix>/' or 'hf://<org>/<name>@<revision>', got "
        + repr(redact_urls(uri))
    )


class ModelSpec(StrictConfig):
    id: str = Field(description="partition key: DNS-1123 label")
    source: str = Field(description="s3://bucket/prefix/ or hf://org/name@revision")
    served_name: str
    description: str = ""
    precision_ladder: list[Precision] = Field(default_factory=lambda: ["nvfp4", "fp8", "bf16"])
    source_precision: Precision = Field(
        default="bf16", description="the precision of the source checkpoint's weights (fp8 for "
        "a block-scaled FP8 release such as DeepSeek-R1): what a plan_only entry is planned and "
        "deployed from, the baseline no accuracy gate is needed for; a fetched checkpoint's "
        "config.json must agree")
    eval_tasks: list[str] = Field(default_factory=list)
    scenarios: list[str] = Field(default_factory=lambda: ["chat"])
    slo: SloOverrides = Field(default_factory=SloOverrides)
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="production engine parameters, e.g. max_model_len"
    )
    plan_only: bool = Field(
        default=False, description="a spec for planning and rendering only: nothing is fetched"
    )
    node_types: list[str] | None = Field(
        default=None, description="the node types this model is onboarded on after its own "
        "stages (one cell each); unset: the fleet's (deploy.yaml target_node_types and the "
        "embedded cpu)")
    architecture: ArchitectureHint | None = None
    task: Literal["generate", "embed", "rerank"] = Field(
        default="generate", description="what the engine serves: text generation, or a pooling "
        "model (embeddings, a reranker) that keeps no KV cache for decoding")
    weights: Literal["real", "random"] = Field(
        default="real", validate_default=True, description="real: the checkpoint's weights are "
        "fetched, quantized, gated, served and deployed. random: a performance twin: the source "
        "holds the real model's config.json and a tokenizer, no weights; the engine starts it "
        "with random weights (its template's load_format: dummy) to measure the serving performance of "
        "that shape. A twin's accuracy gates are not applicable; it is never published, "
        "deployed or ready (docs/twins.md)")

    @field_validator("id")
    @classmethod
    def _dns(cls, v: str) -> str:
        if not is_dns1123_label(v):
            raise ValueError(
                f"{v!r} is not a DNS-1123 label (lowercase letters, digits and '-', at most 63, "
                "starting and ending with a letter or digit)"
            )
        return v

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        parse_source(v)
        return v

    @field_validator("precision_ladder")
    @classmethod
    def _ladder(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("the precision ladder needs at least one precision")
        if len(set(v)) != len(v):
            raise ValueError(f"precision ladder {v} names a precision twice")
        return v

    @model_validator(mode="after")
    def _ladder_within_source(self) -> ModelSpec:
        """Quantization only narrows: a ladder precision wider than the source's has no
        weights to serve (an FP8 release has no bf16 variant)."""
        wider = [p for p in self.precision_ladder
                 if PRECISION_WIDTH[p] > PRECISION_WIDTH[self.source_precision]]
        if wider:
            raise ValueError(
                f"precision_ladder {self.precision_ladder} lists {', '.join(wider)}, wider than "
                f"source_precision {self.source_precision}: no such weights exist; remove "
                f"{', '.join(wider)} from the ladder (or correct source_precision)")
        return self

    @field_validator("weights")
    @classmethod
    def _twin(cls, v: str, info: ValidationInfo) -> str:
        """A twin is started by the engine and sized from its declared architecture; its random
        weights come from `weights`, never from engine_args (nor a real model's)."""
        load_format = (info.data.get("engine_args") or {}).get("load_format")
        if v == "real":
            if load_format == "dummy":
                raise ValueError("engine_args.load_format: dummy starts the engine on random "
                                 "weights: write `weights: random` (a performance twin) instead, "
                                 "so no stage takes its numbers for the real model's")
            return v
        if info.data.get("plan_only"):
            raise ValueError("random weights make a performance twin, which the engine starts "
                             "to be measured; a plan_only entry is never started: drop plan_only")
        if "architecture" in info.data and info.data["architecture"] is None:
            raise ValueError("a performance twin (random weights) has no weights to count: add "
                             "`architecture:` (params_billion at least), which the plan sizes "
                             "its weights from")
        if load_format is not None:
            raise ValueError(f"a performance twin (random weights) sets the load format itself "
                             f"(dummy): remove engine_args.load_format ({load_format!r})")
        return v

    @property
    def is_twin(self) -> bool:
        """A performance twin: random weights at the real model's shape (docs/twins.md)."""
        return self.weights == "random"

    @property
    def source_ref(self) -> SourceRef:
        return parse_source(self.source)


DEFAULTS_FILE = "_defaults.yaml"


class SpecDefaults(StrictConfig):
    """The catalog's defaults: what every spec gets for a field it does not set (mappings are
    merged key by key, so `engine_args: {max_num_seqs: 64}` keeps the default max_model_len)."""

    precision_ladder: list[Precision] | None = None
    eval_tasks: list[str] | None = None
    scenarios: list[str] | None = None
    slo: SloOverrides | None = None
    engine_args: dict[str, Any] | None = None

    def under(self, data: dict[str, Any]) -> dict[str, Any]:
        """`data` with the defaults filled in beneath it."""
        out = {k: v for k, v in self.model_dump(exclude_none=True).items() if k not in data}
        for key in ("slo", "engine_args"):
            base = self.model_dump(exclude_none=True).get(key)
            if base is not None and isinstance(data.get(key), dict):
                out[key] = {**base, **data[key]}
        return {**data, **out}


def load_defaults(models_dir: Path) -> SpecDefaults:
    """The catalog's `_defaults.yaml`; none (the field defaults) where it has no such file."""
    path = models_dir / DEFAULTS_FILE
    if not path.is_file():
        return SpecDefaults()
    return validate_config(SpecDefaults, load_yaml(path) or {}, str(path), "catalog defaults",
                           "Fix the defaults file.")


def parse_spec(data: Any, origin: str, default_id: str | None = None,
               defaults: SpecDefaults | None = None) -> ModelSpec:
    """Validate one spec mapping; `origin` (a file path or URI) goes into every error."""
    if not isinstance(data, dict):
        raise ConfigError(
            origin, f"expected a mapping of spec fields, got {type(data).__name__}",
            "Write the spec as YAML key: value pairs (see configs/models/*.yaml).",
        )
    if default_id is not None:
        data = {"id": default_id, **data}
    if defaults is not None:
        data = defaults.under(data)
    return validate_config(ModelSpec, data, origin, "model spec", "Fix the spec.")


@dataclass(frozen=True)
class Catalog:
    """Every spec that validates, and every file that does not, each with its own error.

    Loaded per entry: one broken file fails only the model it defines (and is listed in
    `broken` for whoever reports it), never the runs of every other model.
    """

    specs: dict[str, ModelSpec]
    broken: dict[str, ConfigError] = field(default_factory=dict)  # file path -> its error
    defaults: SpecDefaults = field(default_factory=SpecDefaults)  # the catalog's _defaults.yaml

    def resolve(self, key: str) -> ModelSpec:
        if key in self.specs:
            return self.specs[key]
        for path, error in self.broken.items():
            if Path(path).stem == key:
                raise error
        if not is_dns1123_label(key):
            raise ConfigError(
                f"model {key!r}", "is not a model id: an id is a DNS-1123 label (lowercase "
                "letters, digits and '-', at most 63, starting and ending with a letter or digit)",
                f"Use the catalog id (e.g. {to_dns1123_label(key)!r} if that is the model), "
                "not a file name, a Hub repository or a served name.")
        known = ", ".join(sorted(self.specs)) or "none"
        broken = (f"; {len(self.broken)} catalog file(s) do not validate: "
                  f"{', '.join(sorted(self.broken))}") if self.broken else ""
        raise ConfigError(
            f"model {key!r}", f"not in the catalog (known: {known}){broken}",
            "Add configs/models/<id>.yaml (or fix the broken file that defines it), or upload "
            "the checkpoint so the sensor registers it.",
        )

    def strict(self) -> dict[str, ModelSpec]:
        """The specs, or the first broken file's error: for callers that must see them all."""
        for error in self.broken.values():
            raise error
        return dict(self.specs)


def read_catalog(models_dir: Path, discovered_dir: Path | None = None) -> Catalog:
    """Specs under `models_dir`, plus those the new-checkpoint sensor or the launchpad wrote to
    `discovered_dir`, so every stage resolves a discovered model like a catalogued one.

    A catalog entry wins over a discovered spec of the same id; that spec is reported broken.
    `models_dir`'s `_defaults.yaml` fills in what each spec leaves unset.
    """
    if not models_dir.is_dir():
        raise ConfigError(
            str(models_dir), "the model catalog directory does not exist",
            "Set ONBOARDING_CONFIG_DIR to a directory holding models/*.yaml.",
        )
    defaults = load_defaults(models_dir)
    specs: dict[str, ModelSpec] = {}
    broken: dict[str, ConfigError] = {}
    sources = [(models_dir, "catalog")]
    if discovered_dir is not None and discovered_dir.is_dir():
        sources.append((discovered_dir, "discovered"))
    origin: dict[str, Path] = {}
    for directory, kind in sources:
        for path in sorted(directory.glob("*.yaml")):
            if path.name == DEFAULTS_FILE:
                continue
            try:
                spec = parse_spec(load_yaml(path), str(path), defaults=defaults)
            except ConfigError as exc:
                broken[str(path)] = exc
                continue
            if spec.id in specs:
                fix = ("Delete the discovered spec (the catalog entry wins), or give the "
                       "checkpoint's onboarding.yaml another id." if kind == "discovered"
                       else "Give each catalog entry a unique id.")
                broken[str(path)] = ConfigError(
                    str(path), f"model id {spec.id!r} is already defined by {origin[spec.id]}",
                    fix)
                continue
            specs[spec.id], origin[spec.id] = spec, path
    return Catalog(specs, broken, defaults)


def load_catalog(models_dir: Path, discovered: Path | None = None) -> dict[str, ModelSpec]:
    """Every spec, strictly: the first broken file is an error (for listing the catalog)."""
    return read_catalog(models_dir, discovered).strict()
