"""The serving stack: `configs/stack.yaml`, parsed once into one typed `Stack`, and its fingerprint.

This module owns the file. `load_stack` reads it and validates every section in one pass:
`versions`, the image rule (`images`: repository and tag per engine release range and CUDA
build, the CUDA build per GPU architecture), the `engine_switches`, and one `EngineTemplate`
per engine (`engines`: how to start it, its flags, metrics, distribution, telemetry switch and
what it accepts from the load generator). Rendering (kserve, layout_render), the serving plan,
the engine resource and the fingerprint read the `Stack`; none of them names an engine: an
engine is a key of `engines`, and adding one touches configs/stack.yaml and tests only
(docs/architecture.md, "Adding an engine").

The fingerprint is the `serving_stack` asset's data version, so changing a version in the stack
file (or upgrading the engine in its virtualenv, or the driver) marks every stack-dependent
asset stale. The file is fingerprinted parsed, not as text: comments and key order do not count.
The node facts are read by resources/stack_facts.py (it runs `nvidia-smi` and the engine's
interpreter) and parsed here: a thing that is absent (no `nvidia-smi` on a CPU node, no engine
virtualenv) is recorded as absent; a tool that is present but fails is an error.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from onboarding.common.config import StrictConfig, load_yaml, validate_config
from onboarding.common.errors import ConfigError
from onboarding.serving.kernels import KernelFactPatterns

ABSENT = "absent"
# Distributions beside the engines' own (each template's `distributions`) whose version decides
# how a checkpoint is quantized, served or measured.
STACK_PACKAGES = ("flashinfer-python", "torch", "nvidia-nccl-cu12", "nvidia-nccl-cu13",
                  "nvidia-modelopt", "transformers")
ENGINE_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
# run by the engine virtualenv's interpreter (resources/stack_facts.py): `{package: version}`
ENGINE_PROBE = (
    "import importlib.metadata as m, json, sys\n"
    "out = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        out[name] = m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        out[name] = None\n"
    "print(json.dumps(out))\n"
)
_CUDA_IN_SMI = re.compile(r"CUDA Version:\s*([0-9.]+)")


# ---- engines: one template per engine ----------------------------------------------------


class ArgFlag(StrictConfig):
    flag: str | None = None
    off_flag: str | None = None
    # a boolean that the engine takes as a size: true renders `flag=<params[true_value_from]>`
    # (SGLang's expert parallelism is `--ep-size` at the TP size, not a switch)
    true_value_from: str | None = None


class HardwareProfile(StrictConfig):
    defaults: dict[str, Any] = Field(default_factory=dict)
    unsupported_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # The env variable that sizes the KV cache in GiB on this hardware (a CPU build has no GPU
    # memory to take a fraction of): the engine resource's cpu_kvcache_space_gib sets it.
    kv_cache_space_env: str | None = None


class MetricNames(StrictConfig):
    """The engine's Prometheus endpoint and the series the benchmark cross-checks."""

    path: str = Field(default="/metrics", pattern=r"^/", description="where it serves them")
    # The template parameter (a key of `args`) that turns the endpoint on; None: always on.
    enable_arg: str | None = None
    running: str
    waiting: str
    kv_cache_usage: str
    ttft_histogram: str
    itl_histogram: str
    # Counters of prompt tokens looked up in the engine's prefix cache and found there (sample
    # names, `_total` included); None where the engine exposes none. A sweep point's hit
    # fraction says whether it measured prefills or the cache (docs/serving.md).
    prefix_cache_queries: str | None = None
    prefix_cache_hits: str | None = None


class LoadGeneratorNeeds(StrictConfig):
    """What the engine must accept from the project's load generator: the request-body fields
    beyond OpenAI's own (resources/loadgen.completion_bodies sends them; an engine whose
    protocol forbids unknown fields answers 400 to one it lacks)."""

    request_extensions: list[str] = Field(default_factory=list)
    count_tokens_by: Literal["usage", "token_ids", "text"] = Field(
        default="usage", description=(
            "how the client has this engine count a streamed chunk's tokens "
            "(resources/loadgen.completion_bodies): its cumulative usage in every chunk, the "
            "chunk's own token ids, or one token per chunk with text"))

    @model_validator(mode="after")
    def _count_is_accepted(self) -> LoadGeneratorNeeds:
        """A template that names its way of counting must accept the field it sends. One that
        names none gets the client's default, continuous usage, as every template did before
        the field existed (the recorded runs' stack files have no `load_generator`)."""
        if "count_tokens_by" not in self.model_fields_set:
            return self
        needed = COUNT_EXTENSION[self.count_tokens_by]
        if needed and needed not in self.request_extensions:
            raise ValueError(f"count_tokens_by {self.count_tokens_by!r} sends {needed}, which "
                             f"request_extensions does not list")
        return self


# The body field each way of counting a chunk's tokens sends (None: nothing beyond OpenAI's)
COUNT_EXTENSION = {"usage": "stream_options.continuous_usage_stats",
                   "token_ids": "return_token_ids", "text": None}


class EngineTemplate(StrictConfig):
    """How to start one engine: the executable (locally and in the serving image), how it takes
    the model, host, port and served name, its flags, log line, metrics and kernels."""

    command: list[str] = Field(min_length=1, description="local executable; {bin_dir} filled")
    container_command: list[str] = Field(min_length=1, description="the serving image's")
    model_arg: str = Field(default="", description="'' = the model path is positional")
    host_flag: str = "--host"
    port_flag: str = "--port"
    # "" = the engine takes no served name (it names the model itself; see its template)
    served_name_flag: str = "--served-model-name"
    # pip distributions that carry the engine, first installed wins (its version); the first
    # one is the stack fingerprint's. Empty: the version is not read (`unknown`).
    distributions: list[str] = Field(default_factory=list)
    # The log line that ends weight loading (`seconds`: the engine's own measure); None: not
    # known, and the start's phases go without it.
    weights_loaded_pattern: str | None = None
    # The engine's own log lines that name the kernels a start chose (onboarding/serving/
    # kernels.py): quantization method, linear kernel, MoE and attention backends, KV-cache
    # dtype, CUDA-graph mode. Empty: not read for this engine.
    kernel_facts: KernelFactPatterns = Field(default_factory=KernelFactPatterns)
    health_path: str = "/health"
    metrics: MetricNames
    # The env that turns the engine's own usage statistics off (set everywhere it starts).
    usage_stats_off: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    args: dict[str, ArgFlag] = Field(default_factory=dict)
    serves: dict[str, list[str]]
    hardware: dict[str, HardwareProfile] = Field(default_factory=dict)
    # Directories the engine compiles and caches kernels into (env variable -> subdirectory):
    # a fully cold start points them at an empty directory.
    cache_env: dict[str, str] = Field(default_factory=dict)
    load_generator: LoadGeneratorNeeds = Field(default_factory=LoadGeneratorNeeds)
    # Words in the process title of the engine's own processes (engine core, workers), which
    # are not its frontend: the API CPU the frontend experiment reads leaves their subtrees
    # out (onboarding/serving/frontend.py). Empty: the started process alone is the frontend.
    engine_process_titles: list[str] = Field(default_factory=list)
    # Why no number here comes from this engine: set for an engine no run of this project has
    # started. Its configurations, manifests and launchers say so, and no evidence is ever
    # "measured" for them (engine_config.evidence).
    never_measured_here: str | None = None
    sources: list[str] = Field(default_factory=list, description="where its flags are read from")

    @field_validator("weights_loaded_pattern")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression ({exc})") from None
        return v

    @field_validator("never_measured_here")
    @classmethod
    def _says_why(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("say why (no run here started it), or leave it out")
        return v

    @model_validator(mode="after")
    def _metrics_arg_is_a_flag(self) -> EngineTemplate:
        arg = self.metrics.enable_arg
        if arg is not None and arg not in self.args:
            raise ValueError(f"metrics.enable_arg {arg!r} is not one of args "
                             f"({', '.join(sorted(self.args))})")
        return self

    @property
    def base_env(self) -> dict[str, str]:
        """The env every start of this engine gets, before hardware and switches."""
        return {**self.usage_stats_off, **self.env}


def hardware_class(hardware: str) -> str:
    """`cpu` stays `cpu`; every `smNN` is a `gpu` for profile lookup."""
    return "cpu" if hardware == "cpu" else "gpu"


def servable(template: EngineTemplate, engine: str, hardware: str, precision: str
             ) -> tuple[bool, str]:
    """Can this engine on this hardware serve `precision`? The reason when it cannot."""
    serves = template.serves.get(hardware)
    if serves is None:
        known = ", ".join(sorted(template.serves)) or "none"
        return False, (f"{engine} has no kernels listed for hardware {hardware!r} "
                       f"(configs/stack.yaml engines.{engine}.serves knows: {known})")
    if precision not in serves:
        needs = sorted(h for h, ps in template.serves.items() if precision in ps)
        return False, (f"{engine} on {hardware} serves {', '.join(serves)}, not {precision}; "
                       f"{precision} needs {', '.join(needs) or 'hardware not listed'}")
    return True, ""


def effective_max_model_len(template: EngineTemplate, hardware: str,
                            engine_args: dict[str, Any]) -> int | None:
    profile = template.hardware.get(hardware_class(hardware), HardwareProfile())
    value = {**profile.defaults, **engine_args}.get("max_model_len")
    return int(value) if value is not None else None


def launcher_variable(engine: str) -> str:
    """The shell variable a bare-metal launcher runs the engine's executable through."""
    return re.sub(r"[^A-Za-z0-9]+", "_", engine).upper()


# ---- engine_switches and images ----------------------------------------------------------


def pep440_specifier(v: str) -> str:
    """A `versions:` field of stack.yaml, checked once for every kind of entry that has one."""
    try:
        SpecifierSet(v)
    except InvalidSpecifier:
        raise ValueError(f"{v!r} is not a PEP 440 version specifier (e.g. '>=0.32')") from None
    return v


class EngineSwitch(StrictConfig):
    """Engine env variables and flags set only where every stated condition holds.

    `versions` (a PEP 440 specifier over `versions.<engine>`) keys a switch to the engine
    releases that know it: switches move between releases (vLLM's seed-era
    `VLLM_USE_FLASHINFER_MOE_FP4=1` is `--moe-backend` in current vLLM)."""

    engine: str
    versions: str = Field(description="PEP 440 specifier, e.g. '>=0.32'")
    env: dict[str, str] = Field(default_factory=dict)
    args: list[str] = Field(default_factory=list)
    why: str
    precisions: list[str] | None = None
    moe: bool | None = None
    archs: list[str] | None = None
    # A kernel choice (a MoE/attention backend the engine would otherwise pick itself, with its
    # own fallbacks) applies only where `pinned` says why: the configuration was benchmarked
    # with it, or a reason to force it. Unpinned, the engine's `auto` stays.
    kernel_choice: bool = False
    pinned: str | None = None

    @field_validator("pinned")
    @classmethod
    def _pinned_says_why(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("pinned: say why the kernel is forced (the benchmark at which "
                             "configuration, or the reason), or leave pinned out")
        return v

    @field_validator("versions")
    @classmethod
    def _specifier(cls, v: str) -> str:
        return pep440_specifier(v)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", k)]
        if bad:
            raise ValueError(f"not environment variable names: {bad}")
        return v

    @model_validator(mode="after")
    def _does_something(self) -> EngineSwitch:
        if not self.env and not self.args:
            raise ValueError("a switch sets at least one env variable or argument")
        return self

    def applies(self, engine: str, version: str, precision: str, moe: bool, arch: str) -> bool:
        return (self.engine == engine
                and (not self.kernel_choice or self.pinned is not None)
                and SpecifierSet(self.versions).contains(version, prereleases=True)
                and (self.precisions is None or precision in self.precisions)
                and (self.moe is None or self.moe == moe)
                and (self.archs is None or arch in self.archs))


class TagRule(StrictConfig):
    """The tags one range of engine releases publishes, per CUDA major: `{version}` is filled."""

    versions: str = Field(description="PEP 440 specifier over versions.<engine>")
    cuda: dict[int, str] = Field(min_length=1)

    @field_validator("versions")
    @classmethod
    def _specifier(cls, v: str) -> str:
        return pep440_specifier(v)

    @field_validator("cuda")
    @classmethod
    def _templates_carry_the_version(cls, v: dict[int, str]) -> dict[int, str]:
        bad = [t for t in v.values() if "{version}" not in t]
        if bad:
            raise ValueError(f"tag templates {bad} do not carry {{version}}")
        return v


class EngineImages(StrictConfig):
    repository: str = Field(pattern=r"^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+$")
    tags: list[TagRule] = Field(min_length=1)

    def image(self, engine: str, version: str, cuda_major: int) -> str:
        """The image of `version` built for `cuda_major`: the first rule whose range holds it;
        refused when that release publishes no build for that CUDA major."""
        for rule in self.tags:
            if SpecifierSet(rule.versions).contains(version, prereleases=True):
                if cuda_major not in rule.cuda:
                    raise ValueError(
                        f"images.{engine}: {engine} {version} publishes no CUDA {cuda_major} "
                        f"build (its tags: {sorted(rule.cuda)} only, rule {rule.versions!r})")
                return f"{self.repository}:{rule.cuda[cuda_major].format(version=version)}"
        raise ValueError(f"images.{engine}: no tag rule covers {engine} {version}")


# Blackwell (sm100 B200, sm103 B300) runs the CUDA 13 builds of the pinned stack: PyTorch and
# FlashInfer's SM100/SM103 kernels in it are built for cu130.
_MIN_CUDA_MAJOR = {"sm100": 13, "sm103": 13}


class ImagesConfig(BaseModel):
    """Serving images by rule, not by hand: repository + tag template per engine release range
    and CUDA major (one mapping per engine, keyed by its name beside `engine` and
    `cuda_major`), and the CUDA major each GPU architecture runs (tests/deploy/
    test_image_rule.py cites the registries' tag conventions)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    __pydantic_extra__: dict[str, EngineImages] = Field(init=False)
    engine: str = Field(description="the engine the manifests run")
    cuda_major: dict[str, int] = Field(min_length=1)

    @field_validator("cuda_major")
    @classmethod
    def _blackwell_needs_cuda13(cls, v: dict[str, int]) -> dict[str, int]:
        for arch, low in _MIN_CUDA_MAJOR.items():
            if arch in v and v[arch] < low:
                raise ValueError(f"images.cuda_major.{arch}: {v[arch]}; {arch} needs the CUDA "
                                 f"{low} build of the stack")
        return v

    @property
    def rules(self) -> dict[str, EngineImages]:
        """engine -> its repository and tag rule."""
        return dict(self.model_extra or {})

    def per_arch(self, engine: str, version: str) -> dict[str, str]:
        rules = self.rules.get(engine)
        if rules is None:
            raise ValueError(f"images.{engine}: no repository and tag rule")
        return {arch: rules.image(engine, version, major)
                for arch, major in self.cuda_major.items()}

    def published(self, engine: str, version: str) -> dict[str, str]:
        """The images `version` publishes, per architecture: an architecture whose CUDA major
        that release has no build for is left out (an engine the manifests do not run)."""
        out = {}
        for arch, major in self.cuda_major.items():
            try:
                out[arch] = self.rules[engine].image(engine, version, major)
            except ValueError as exc:
                if "no tag rule covers" in str(exc):
                    raise
        return out


class StackFile(BaseModel):
    """configs/stack.yaml, every section."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    versions: dict[str, str]
    # the torch / CUDA / FlashInfer an engine's own image carries where they are not
    # `versions`' (each engine ships in its own image; onboarding/serving/matrix.py)
    engine_pins: dict[str, dict[Literal["pytorch", "cuda", "flashinfer"], str]] = Field(
        default_factory=dict)
    images: ImagesConfig
    engine_switches: list[EngineSwitch] = Field(default_factory=list)
    engines: dict[str, EngineTemplate] = Field(min_length=1)

    @field_validator("engines")
    @classmethod
    def _names(cls, v: dict[str, EngineTemplate]) -> dict[str, EngineTemplate]:
        bad = [k for k in v if not ENGINE_NAME.fullmatch(k)]
        if bad:
            raise ValueError(f"engine names {bad} must match {ENGINE_NAME.pattern}")
        return v

    @model_validator(mode="after")
    def _everything_named_exists(self) -> StackFile:
        engine = self.images.engine
        if engine not in self.engines:
            raise ValueError(f"images.engine: {engine!r} has no template under engines "
                             f"(known: {', '.join(sorted(self.engines))})")
        if engine not in self.versions:
            raise ValueError(f"versions.{engine}: missing; images.engine names it")
        self.images.per_arch(engine, self.versions[engine])  # the one rendered: every arch
        for name in self.images.rules:  # every other pinned engine's rule parses and covers it
            if name != engine and name in self.versions:
                self.images.published(name, self.versions[name])
        unknown = sorted({s.engine for s in self.engine_switches} - set(self.engines))
        if unknown:
            raise ValueError(f"engine_switches name engines without a template: {unknown}")
        unpinned = sorted(e for e in self.engine_pins
                          if e not in self.engines or e not in self.versions)
        if unpinned:
            raise ValueError(f"engine_pins name engines without a template and a "
                             f"versions pin: {unpinned}")
        return self


@dataclass(frozen=True, kw_only=True)
class Stack:
    """The serving stack, typed: the engine the manifests run and its images, the switches, and
    every engine's template and images (`templates`, `images_by_engine`)."""

    engine: str
    engine_version: str
    images: dict[str, str]  # arch -> image of `engine`
    switches: tuple[EngineSwitch, ...]
    fingerprint: str  # first 12 hex of sha256 over the canonical stack.yaml
    kserve_version: str = "0.16.0"
    templates: dict[str, EngineTemplate] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    images_by_engine: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def template(self) -> EngineTemplate:
        """The template of the engine the manifests run."""
        return self.templates[self.engine]

    def switches_for(self, precision: str, moe: bool, arch: str) -> list[EngineSwitch]:
        return [s for s in self.switches
                if s.applies(self.engine, self.engine_version, precision, moe, arch)]



def fingerprint_packages(data: dict[str, Any]) -> tuple[str, ...]:
    """Distributions the fingerprint reads in the engine virtualenv: each engine template's
    first `distributions` entry, then the rest of the stack. Read off the parsed file, not the
    validated Stack, like the fingerprint itself: a stack that renders nothing (an engine
    version no image rule covers) must still be observed, so its change re-validates the
    models and the failure shows there."""
    engines = data.get("engines")
    firsts = [t["distributions"][0] for t in (engines.values() if isinstance(engines, dict)
                                               else ())
              if isinstance(t, dict) and isinstance(t.get("distributions"), list)
              and t["distributions"] and isinstance(t["distributions"][0], str)]
    return (*dict.fromkeys(firsts), *STACK_PACKAGES)


def stack_fingerprint(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


@lru_cache(maxsize=8)
def _load_stack(path: Path, mtime_ns: int) -> Stack:
    data = read_stack_config(path)
    parsed = validate_config(StackFile, data, path, path,
                             "Fix that field of stack.yaml (the repository's copy documents "
                             "each section).")
    engine = parsed.images.engine
    version = parsed.versions[engine]
    by_engine = {name: parsed.images.published(name, parsed.versions[name])
                 for name in parsed.images.rules if name in parsed.versions}
    by_engine[engine] = parsed.images.per_arch(engine, version)
    return Stack(engine=engine, engine_version=version, images=by_engine[engine],
                 switches=tuple(parsed.engine_switches), fingerprint=stack_fingerprint(data),
                 kserve_version=parsed.versions.get("kserve", "0.16.0"),
                 templates=dict(parsed.engines), versions=dict(parsed.versions),
                 images_by_engine=by_engine)


def load_stack(path: Path) -> Stack:
    """configs/stack.yaml as one typed Stack, parsed once per file version."""
    if not path.is_file():
        raise ConfigError(str(path), "does not exist",
                          "Restore configs/stack.yaml or point ONBOARDING_CONFIG_DIR at a copy.")
    return _load_stack(path, path.stat().st_mtime_ns)


# ---- the fingerprint ---------------------------------------------------------------------


def read_stack_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(str(path), "does not exist",
                          "Restore configs/stack.yaml or point ONBOARDING_CONFIG_DIR at a copy.")
    data = load_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("versions"), dict):
        raise ConfigError(str(path), "field 'versions': expected a mapping of component to "
                          "version", "Keep the `versions:` section (see the repository's copy).")
    return data


def nvidia_smi_facts(listed: str, header: str) -> dict[str, Any]:
    """Driver, CUDA and GPU names from `nvidia-smi --query-gpu=driver_version,name
    --format=csv,noheader` (`listed`) and plain `nvidia-smi`'s banner (`header`). The node's
    tools are run by resources/stack_facts.py; this reads what they printed."""
    rows = [[c.strip() for c in line.split(",")] for line in listed.splitlines() if line.strip()]
    cuda = _CUDA_IN_SMI.search(header)
    return {"nvidia_driver": rows[0][0] if rows else ABSENT,
            "cuda_driver_api": cuda.group(1) if cuda else ABSENT,
            "gpus": sorted(r[1] for r in rows if len(r) > 1)}


NO_NVIDIA = {"nvidia_driver": ABSENT, "cuda_driver_api": ABSENT, "gpus": []}


def engine_versions_facts(versions: dict[str, str | None]) -> dict[str, Any]:
    """The engine virtualenv's package versions (`ENGINE_PROBE`'s output) as node facts; a
    package it lacks is left out. The interpreter's path is left out too: the same versions
    elsewhere are the same stack."""
    return {f"engine.{k}": v for k, v in versions.items() if v is not None}


def fingerprint(config: dict[str, Any], node: dict[str, Any]) -> str:
    """sha256 over the parsed stack file and the node facts, canonical JSON."""
    blob = json.dumps({"config": config, "node": node}, sort_keys=True, separators=(",", ":"),
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """`{"versions": {"cuda": "13.0"}}` -> `{"versions.cuda": "13.0"}`; lists stay as values."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def diff(before: dict[str, Any] | None, after: dict[str, Any]) -> list[dict[str, Any]]:
    """Changed, added and removed leaves between two observations, sorted by field."""
    if before is None:
        return []
    old, new = flatten(before), flatten(after)
    rows = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name, ABSENT), new.get(name, ABSENT)
        if a != b:
            rows.append({"field": name, "before": a, "after": b})
    return rows


def observation_body(config: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """What an observation stores (JSON metadata) so the next one can diff against it."""
    return {"config": config, "node": node}
