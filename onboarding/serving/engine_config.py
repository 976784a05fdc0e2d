"""One serving configuration per (model, node type, variant): what is measured is what is deployed.

An `EngineConfig` is every engine setting that changes what a benchmark measures: engine and
version, image, precision, tensor parallelism, max-num-seqs, max-model-len, GPU memory
utilization, KV-cache dtype, the model's production parameters, the engine switches, the
environment, and `load_format: dummy` for a performance twin (random weights). It is computed
once, from the plan and the node facts, before anything is timed; the local engine starts
`args(...)` of it and the manifest renders the same `args(...)`, so "benchmarked" and "deployed"
are one list (the model path, port and bind address aside, which necessarily differ between a
test node and a pod). Its short content hash travels with every number measured at it.
The asset that stores one per node type, in a `ServingPlan`, is `serving_config`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from onboarding.common.errors import ConfigError
from onboarding.fetch.catalog import ModelSpec
from onboarding.fetch.twins import DUMMY_LOAD_FORMAT
from onboarding.serving.kernels import summarize_facts
from onboarding.serving.stack import EngineTemplate, HardwareProfile, hardware_class
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult

# Parameters the plan owns: a spec that sets them is refused (it would silently disagree with
# the plan that sized the GPUs).
PLAN_OWNED = ("tensor_parallel_size",)
# Set by the launcher or the manifest, never by a spec.
LAUNCH_OWNED = ("model", "served_model_name", "port", "host")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """The engine configuration of one model on one node type, with its content hash."""

    model: str
    served_name: str
    node_type: str
    hardware: str  # cpu | smNN
    engine: str
    engine_version: str
    image: str
    precision: str
    tensor_parallel: int
    params: dict[str, Any]  # template parameter names -> values, as started
    param_args: tuple[str, ...]
    switch_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()  # parameters this hardware does not take
    notes: tuple[str, ...] = ()  # e.g. "enable_expert_parallel dropped: EP needs TP > 1"
    container_command: tuple[str, ...] = ()  # the serving image's executable
    model_arg: str = ""  # "" = positional (vllm serve <model>), else e.g. --model-path
    host_flag: str = "--host"
    port_flag: str = "--port"
    served_name_flag: str = "--served-model-name"
    # The template's `never_measured_here`: no evidence is ever "measured" at this config.
    never_measured: str = ""

    def content(self) -> dict[str, Any]:
        """What the hash covers: everything that changes what the engine does (not what this
        project knows about the engine)."""
        out = asdict(self)
        for key in ("notes", "model", "never_measured"):
            out.pop(key)
        return out

    @property
    def hash(self) -> str:
        blob = json.dumps(self.content(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def args(self, model_path: str, port: int, host: str | None = None) -> list[str]:
        """The engine's arguments after its executable: the same list locally and in the pod."""
        out = [model_path] if not self.model_arg else [f"{self.model_arg}={model_path}"]
        if host:
            out.append(f"{self.host_flag}={host}")
        out.append(f"{self.port_flag}={port}")
        if self.served_name_flag:  # "" = the engine takes none
            out.append(f"{self.served_name_flag}={self.served_name}")
        return out + list(self.param_args) + list(self.switch_args)

    def param(self, name: str, default: Any = None) -> Any:
        return self.params.get(name, default)

    @property
    def max_num_seqs(self) -> int | None:
        v = self.param("max_num_seqs")
        return int(v) if v is not None else None

    @property
    def max_model_len(self) -> int | None:
        v = self.param("max_model_len")
        return int(v) if v is not None else None

    def summary(self) -> dict[str, Any]:
        """A row for tables: the numbers people ask about, and the hash."""
        never = " (never measured here)" if self.never_measured else ""
        return {"node_type": self.node_type, "hash": self.hash, "engine":
                f"{self.engine} {self.engine_version}{never}", "precision": self.precision,
                "tp": self.tensor_parallel, "max_num_seqs": self.max_num_seqs,
                "max_model_len": self.max_model_len,
                "gpu_memory_utilization": self.param("gpu_memory_utilization"),
                "kv_cache_dtype": self.param("kv_cache_dtype", "auto")}


SECRET_NAME = re.compile(
    r"(?i)(token|secret|passw(or)?d|api[_-]?key|access[_-]?key|credential|private[_-]?key)")


def check_engine_args(spec: ModelSpec) -> None:
    """A spec's engine_args must not carry credentials nor what the plan or launcher sets."""
    for key, value in spec.engine_args.items():
        if SECRET_NAME.search(key):
            raise ConfigError(
                f"model {spec.id!r}: engine_args.{key}",
                "looks like a credential, and engine args are rendered into the manifest in clear",
                "Remove it; give credentials to the pod through a secret (deploy.yaml "
                "service_account / hf_token_secret).")
        if key in PLAN_OWNED or key in LAUNCH_OWNED:
            raise ConfigError(
                f"model {spec.id!r}: engine_args.{key}={value!r}",
                "set by the deployment plan and the launcher, not by the spec",
                f"Remove engine_args.{key}.")


def render_params(template: EngineTemplate, params: dict[str, Any]) -> list[str]:
    """Flags for `params` through the template's flag map (a bool adds `flag`/`off_flag`)."""
    argv: list[str] = []
    for key, value in params.items():
        spec = template.args.get(key)
        if spec is None:
            known = ", ".join(sorted(template.args))
            raise ConfigError(f"engine_args.{key}", f"the engine template has no flag for it "
                              f"(known: {known})",
                              "Use one of the known names, or add it to the template's 'args' "
                              "in configs/stack.yaml.")
        if isinstance(value, bool) and value and spec.true_value_from:
            if spec.true_value_from not in params:
                raise ConfigError(f"engine_args.{key}", f"rendered as {spec.flag} at "
                                  f"{spec.true_value_from}, which this configuration lacks",
                                  "Plan the configuration with that parameter.")
            argv.append(f"{spec.flag}={params[spec.true_value_from]}")
        elif isinstance(value, bool):
            flag = spec.flag if value else spec.off_flag
            if flag:
                argv.append(flag)
        elif spec.flag:
            argv.append(f"{spec.flag}={value}")
    return argv


@dataclass(frozen=True, kw_only=True)
class ConfigInputs:
    """What one configuration is built from (the plan's numbers for a GPU node type, nothing
    planned for the local CPU engine)."""

    spec: ModelSpec
    node_type: str
    hardware: str
    engine: str
    engine_version: str
    image: str
    precision: str
    tensor_parallel: int = 1
    planned: dict[str, Any] = field(default_factory=dict)  # max_model_len, max_num_seqs, ...
    switch_args: tuple[str, ...] = ()
    switch_env: dict[str, str] = field(default_factory=dict)


# hardware defaults that only a generating model takes (see build_config)
GENERATE_ONLY_DEFAULTS = ("enable_chunked_prefill", "enable_prefix_caching")


def build_config(template: EngineTemplate, ci: ConfigInputs) -> EngineConfig:
    """Hardware defaults < the plan's numbers < the spec's production parameters; then what the
    hardware does not take is dropped (and said)."""
    check_engine_args(ci.spec)
    profile = template.hardware.get(hardware_class(ci.hardware), HardwareProfile())
    metrics_on = {template.metrics.enable_arg: True} if template.metrics.enable_arg else {}
    defaults = dict(profile.defaults)
    notes: list[str] = []
    if ci.spec.task != "generate":
        # A pooling model (embeddings, reranker): the engine decides chunked prefill and prefix
        # caching from the model; forcing them on is unsupported for it (vLLM 0.32.0
        # vllm/engine/arg_utils.py _set_default_chunked_prefill_and_prefix_caching_args: "may
        # cause the engine to crash or produce incorrect outputs"). The spec may still set them.
        forced = sorted(k for k in GENERATE_ONLY_DEFAULTS if k in defaults)
        for k in forced:
            del defaults[k]
        if forced:
            notes.append(f"{', '.join(forced)} left to the engine (task {ci.spec.task})")
    params: dict[str, Any] = {**defaults, **metrics_on, **ci.planned}
    if ci.hardware != "cpu":
        params["tensor_parallel_size"] = ci.tensor_parallel
    for key, value in ci.spec.engine_args.items():
        if key not in ci.planned or key == "max_num_seqs":
            params[key] = value
    if ci.spec.is_twin:  # in the hash: no real model's manifest can claim a twin's numbers
        _check_twin_template(template, ci)
        params["load_format"] = DUMMY_LOAD_FORMAT
    if params.get("enable_expert_parallel") and ci.tensor_parallel < 2:
        params.pop("enable_expert_parallel")
        notes.append("enable_expert_parallel dropped: expert parallelism needs TP > 1")
    dropped = tuple(sorted(k for k in params if k in profile.unsupported_args))
    params = {k: v for k, v in params.items() if k not in dropped}
    env = {**template.base_env, **profile.env, **ci.switch_env}
    never = f"never measured here ({ci.engine}): {template.never_measured_here}" \
        if template.never_measured_here else ""
    return EngineConfig(
        model=ci.spec.id, served_name=ci.spec.served_name, node_type=ci.node_type,
        hardware=ci.hardware, engine=ci.engine, engine_version=ci.engine_version,
        image=ci.image, precision=ci.precision, tensor_parallel=ci.tensor_parallel,
        params=params, param_args=tuple(render_params(template, params)),
        switch_args=ci.switch_args, env=env, dropped=dropped, notes=tuple(notes),
        container_command=tuple(template.container_command),
        model_arg=template.model_arg, host_flag=template.host_flag,
        port_flag=template.port_flag, served_name_flag=template.served_name_flag,
        never_measured=never)


def _check_twin_template(template: EngineTemplate, ci: ConfigInputs) -> None:
    if "load_format" not in template.args:
        raise ConfigError(
            f"performance twin {ci.spec.id!r} on engine {ci.engine}",
            "random weights need the engine's load format flag, and its template in "
            "configs/stack.yaml has none", f"Add `load_format: {{flag: --load-format}}` to "
            f"engines.{ci.engine}.args if the engine takes random weights.")


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What a manifest for one node type can claim: measurements taken at exactly its
    configuration (same hash, same node type), or why there are none."""

    config_hash: str
    measured: bool
    basis: str  # one sentence: "measured on h200 at configuration abc" / "unmeasured: ..."
    cold_start_p95_s: float | None = None  # fully cold
    cold_start_samples: int | None = None  # its n (None: not recorded, an older result)
    cold_start_max_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    slo_pass: bool | None = None
    e2e_p99_s: float | None = None  # at the judged (target) concurrency, slowest scenario
    ttft_p99_s: float | None = None
    judged_at: int | None = None
    # the kernels the measured starts ran ("fact=value; ...") and the kernel gate's reading of
    # them (onboarding/serving/kernels.py); "" when load timing did not read them here
    kernels: str = ""
    kernel_verdict: str = ""


def evidence(config: EngineConfig, timing: LoadTimingResult | None,
             bench: ServingBenchmarkResult | None) -> Evidence:
    """Measurements at exactly this configuration; never any for an engine its template marks
    never measured here, whatever a result claims."""
    h = config.hash
    if config.never_measured:
        return Evidence(config_hash=h, measured=False, basis=f"unmeasured: {config.never_measured}")

    def at_this(r) -> bool:
        return r is not None and r.config_hash == h and r.node_type == config.node_type

    if not (at_this(timing) or at_this(bench)):
        seen = [f"{r.node_type} at {r.config_hash or 'no hash'}" for r in (timing, bench)
                if r is not None and r.servable]
        where = f" (measured: {', '.join(sorted(set(seen)))})" if seen else ""
        return Evidence(config_hash=h, measured=False,
                        basis=f"unmeasured: configuration {h} was never measured on "
                        f"{config.node_type}{where}")
    timed, benched = at_this(timing), at_this(bench)
    facts = summarize_facts(getattr(timing, "kernels", ())) if timed else {}
    verdict = getattr(timing, "kernel_verdict", None) if timed else None
    return Evidence(
        config_hash=h, measured=True,
        basis=f"measured on {config.node_type} at configuration {h} ({config.engine} "
        f"{config.engine_version})",
        cold_start_p95_s=timing.cold_start_p95_s if timed else None,
        cold_start_samples=(getattr(timing, "cold_start_samples", 0) or None) if timed else None,
        cold_start_max_s=getattr(timing, "cold_start_max_s", None) if timed else None,
        tokens_per_s_per_gpu=bench.tokens_per_s_per_gpu if benched and bench.servable else None,
        slo_pass=bench.slo_pass if benched else None,
        e2e_p99_s=getattr(bench, "e2e_p99_s", None) if benched else None,
        ttft_p99_s=getattr(bench, "ttft_p99_s", None) if benched else None,
        judged_at=getattr(bench, "judged_at", None) if benched else None,
        kernels="; ".join(f"{k}={v}" for k, v in facts.items()),
        kernel_verdict=verdict.summary if verdict is not None else "")
