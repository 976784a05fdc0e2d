"""Serving stage: `load_timing` (cold and warm engine starts) and `serving_benchmark` (sweep).

Thin: resolve the spec and the config files, call the engine and the load generator, turn the
numbers into metadata. A variant this engine/hardware cannot serve (NVFP4 on the CPU build) is
never started: the asset records `servable: false` with the reason and, where the profile says
`substitute_baseline` (the CPU profile), measures the bf16 baseline checkpoint in its place and
says so (`precision: bf16`, `serving_precision: nvfp4`, `substituted: <why>`).

A performance twin (`weights: random`) is started on random weights (its configuration carries
`load_format: dummy`): its starts read no weights, so load timing labels the weight-load phase
"random weights: not a weight read", reports no weight-read rate, and its cold-start check is
not applicable; the sweep measures the real kernels at the real shape (docs/twins.md).
"""


import base64
import dataclasses
import math
from dataclasses import dataclass

import dagster as dg

from assets.checks import not_applicable_check
from assets.model_spec import MODEL_SPEC, spec_metadata
from assets.node_gate import node_acceptance_check, node_check_spec
from assets.partitions import CELL_MEASURED, cells_partitions, model_of, node_type_of
from assets.stack import SERVING_STACK, stack_metadata
from assets.step_tags import gpu_step_tags
from onboarding.common.errors import ConfigError
from onboarding.common.refs import CheckpointRef, VariantRef
from onboarding.common.tables import md_table, write_csv
from onboarding.deploy.serving_plan import (
    ServingPlan,
    config_at_hand,
    engine_bases,
    search_bases,
    with_cell_search,
)
from onboarding.fetch.catalog import ModelSpec
from onboarding.fetch.twins import NO_WEIGHTS, NOT_A_WEIGHT_READ
from onboarding.quantize.variants import QuantizedSet
from onboarding.serving.config_search import candidates
from onboarding.serving.engine_config import EngineConfig
from onboarding.serving.frontend import FRONTEND_ADVICE, FRONTEND_BOUND_CORES, FrontendSampler
from onboarding.serving.kernels import StartKernels, facts_table, judge, summarize_facts
from onboarding.serving.plots import sweep_png
from onboarding.serving.profiles import Profile, check_fits, resolve_slo, scenarios_for
from onboarding.serving.rate_verdict import MET, RateSlo, RepeatedVerdict
from onboarding.serving.search_settings import load_search_file, rate_slo, search_settings
from onboarding.serving.searched import CellSearch, SearchRecord
from onboarding.serving.stats import (
    LoadTimingResult,
    ServingBenchmarkResult,
    Slo,
    headline,
    summarize_load_timing,
)
from resources.config_files import ConfigFiles, OutputDirs
from resources.engine import Engine
from resources.loadgen import LoadGenerator
from resources.search_runner import Traffic, run_search, verdict_at_rate
from resources.sweep import KeepPartial, run_sweep
from resources.telemetry import GpuTelemetry

GROUP = "serving"
SLO_CHECK = "slo_at_target_concurrency"
COLD_START_CHECK = "cold_start_within_budget"
KERNEL_CHECK = "kernels_as_planned"


class LoadTimingConfig(dg.Config):
    """Unset fields take the profile's defaults in configs/scenarios.yaml."""

    profile: str | None = None
    substitute_baseline: bool | None = None
    cold_repeats: int | None = None  # fully cold starts
    cold_weights_repeats: int | None = None
    warm_repeats: int | None = None
    start_timeout_s: float | None = None


class ServingBenchmarkConfig(dg.Config):
    """Unset fields take the profile's `sweep` in configs/scenarios.yaml."""

    profile: str | None = None
    substitute_baseline: bool | None = None
    scenarios: list[str] | None = None
    concurrency: list[int] | None = None
    mode: str | None = None
    requests_per_point: int | None = None
    max_seconds_per_point: float | None = None
    rate_verdict: bool | None = None  # the open-loop verdict at the target rate after the sweep


class ConfigSearchConfig(dg.Config):
    """Unset fields take configs/search.yaml's `search` for the cell's node type and the
    profile's defaults in configs/scenarios.yaml."""

    profile: str | None = None
    substitute_baseline: bool | None = None
    run: bool | None = None  # None: search.in_pipeline for the node type
    scenario: str | None = None  # the traffic's shapes; None: the model's first scenario


@dataclass(frozen=True, kw_only=True)
class Setup:
    """What both serving assets resolve first: the spec, the profile, the SLOs, which variant is
    measured here and at which configuration (the plan's for the node type at hand)."""

    spec: ModelSpec
    profile_name: str
    profile: Profile
    slo: Slo
    variant: VariantRef | None  # None: nothing this engine can serve
    config: EngineConfig | None
    reason: str  # why the planned variant cannot be served here ("" when it can)
    note: str  # what a user is told about a substitution

    @property
    def blocking(self) -> bool:
        return self.profile.slo_severity == "error"


def _planned_variant(precision: str, serving: VariantRef, checkpoint: CheckpointRef,
                     quantized: QuantizedSet) -> VariantRef:
    """The local copy of the precision the node type at hand is planned to serve."""
    if precision == serving.precision:
        return serving
    if precision == "bf16":
        return VariantRef(serving.model, "bf16", checkpoint.path, checkpoint.total_bytes,
                          checkpoint.content_hash)
    v = quantized.get(precision)
    if v is None or not v.usable:
        raise ConfigError(f"{serving.model}: planned precision {precision}",
                          "has no usable quantized variant in the cache",
                          "Re-materialize quantized and serving_config.")
    return VariantRef(serving.model, precision, v.path, v.total_bytes, v.content_hash,
                      int(v.stats.get("weight_bytes", v.total_bytes)))


def _setup(context: dg.AssetExecutionContext, configs: ConfigFiles, engine: Engine,
           run: LoadTimingConfig | ServingBenchmarkConfig | ConfigSearchConfig,
           serving: VariantRef, checkpoint: CheckpointRef, quantized: QuantizedSet,
           splan: ServingPlan, searched: CellSearch | None = None) -> Setup:
    spec = configs.spec(model_of(context))
    engine.require_node_type(node_type_of(context), configs.nodes(),
                             f"{context.asset_key.to_user_string()}[{context.partition_key}]")
    splan = with_cell_search(splan, spec, searched, configs.nodes(), configs.stack())
    name, prof = configs.profile(run.profile, engine.resolved_hardware())
    substitute = prof.substitute_baseline if run.substitute_baseline is None \
        else run.substitute_baseline
    planned = splan.config(engine.node_type)
    target = _planned_variant(planned.precision, serving, checkpoint, quantized) if planned \
        else serving
    variant, reason, note = measured_variant(engine, target, checkpoint, substitute)
    config = config_at_hand(splan, spec, engine.template(), engine.local(variant.precision)) \
        if variant is not None else None
    if note:
        context.log.warning(note)
    if config is not None:
        context.log.info(f"configuration {config.hash} on {config.node_type}: "
                         f"{config.summary()}")
    return Setup(spec=spec, profile_name=name, profile=prof,
                 slo=resolve_slo(configs.slo_section(), engine.node_type, spec), variant=variant,
                 config=config, reason=reason, note=note)


def measured_variant(engine: Engine, variant: VariantRef, checkpoint: CheckpointRef,
                     substitute_baseline: bool) -> tuple[VariantRef | None, str, str]:
    """What to measure here: the planned variant, or the bf16 baseline standing in for it.

    Returns (variant or None, why the planned variant cannot be served here, note for users).
    """
    ok, reason = engine.can_serve(variant.precision)
    if ok:
        return variant, "", ""
    if substitute_baseline and engine.can_serve("bf16")[0]:
        base = VariantRef(variant.model, "bf16", checkpoint.path, checkpoint.total_bytes,
                          checkpoint.content_hash)
        return base, reason, (f"measured the bf16 baseline in place of {variant.precision}: "
                              f"{reason}")
    return None, reason, reason


def _unservable_check(name: str, reason: str) -> dg.AssetCheckResult:
    """Nothing was measured: the check says why, as a warning (the variant is not servable
    on this engine/hardware, which is a fact to report, not a broken run)."""
    return dg.AssetCheckResult(check_name=name, passed=False,
                               severity=dg.AssetCheckSeverity.WARN, metadata={"reason": reason})


def _node_check(context: dg.AssetExecutionContext, io_manager: dg.IOManager, engine: Engine,
                setup: Setup) -> dg.AssetCheckResult:
    """Whether the node this runs on is qualified (assets/node_gate.py), read before measuring
    so the result says which node's acceptance it relied on."""
    return node_acceptance_check(io_manager, context.instance, engine.resolved_node_name(),
                                 setup.profile.require_node_acceptance, setup.profile_name)


def _unservable_metadata(engine: Engine, reason: str, configs: ConfigFiles) -> dict:
    return {
        "servable": False,
        "node": engine.resolved_node_name(),
        "reason": dg.MetadataValue.text(reason),
        "hardware": engine.resolved_hardware(),
        "engine": engine.kind(),
        "servable_precisions": dg.MetadataValue.json(engine.servable_precisions()),
        **stack_metadata(configs),
    }


def _measured_metadata(engine: Engine, setup: Setup, serving: VariantRef) -> dict:
    """What both serving assets say about what they measured, on what, at which configuration."""
    c = setup.config
    return {
        "weights": f"random ({NO_WEIGHTS})" if setup.spec.is_twin else "real",
        "servable": not setup.reason,
        "precision": setup.variant.precision,
        "serving_precision": serving.precision,
        "substituted": dg.MetadataValue.text(setup.note or "no"),
        "hardware": engine.resolved_hardware(),
        "engine": f"{engine.kind()} {c.engine_version}",
        "node_type": engine.node_type,
        "node": engine.resolved_node_name(),
        "profile": setup.profile_name,
        "config_hash": c.hash,
        "configuration": dg.MetadataValue.json({**c.content(), "hash": c.hash}),
        "engine_argv": dg.MetadataValue.text(" ".join(c.args(setup.variant.path, 0,
                                                             "127.0.0.1"))),
    }


def _measured_cell(stage: str) -> dict:
    """What every asset that starts the engine on a cell's GPU declares: the cell partitions
    and tag, the stack and spec it depends on, its GPU step's tags and the one-engine pool."""
    return {"tags": CELL_MEASURED, "partitions_def": cells_partitions, "group_name": GROUP,
            "deps": [SERVING_STACK, MODEL_SPEC], "op_tags": gpu_step_tags(stage),
            "pool": "gpu"}


@dg.asset(
    **_measured_cell("config_search"),
    description="The measured configuration search on the cell's node type: the plan's "
    "configuration and its grid (configs/search.yaml), each started and judged by the rate "
    "verdict at the target rate; the winner is what the cell's load timing and sweep measure "
    "and its manifest renders. Off unless search.in_pipeline is true for the node type.",
)
def config_search(context: dg.AssetExecutionContext, config: ConfigSearchConfig,
                  configs: ConfigFiles, engine: Engine, loadgen: LoadGenerator,
                  serving_variant: VariantRef, checkpoint: CheckpointRef,
                  quantized: QuantizedSet, serving_config: ServingPlan):
    spec, node_type = configs.spec(model_of(context)), node_type_of(context)
    f = load_search_file(configs.path("search.yaml"))
    settings = search_settings(f, node_type)
    if not (settings.in_pipeline if config.run is None else config.run):
        note = (f"not run: configs/search.yaml search.in_pipeline is false for {node_type}; "
                "the cell keeps serving_config's configuration")
        context.log.info(note)
        return dg.Output(CellSearch(None, note), metadata={
            "searched": False, "note": note, **spec_metadata(spec)})
    setup = _setup(context, configs, engine, config, serving_variant, checkpoint, quantized,
                   serving_config)
    if setup.variant is None or setup.config is None:
        note = f"not run: nothing this engine can serve ({setup.reason})"
        return dg.Output(CellSearch(None, note), metadata={
            "searched": False, "note": note, **spec_metadata(spec)})
    template = engine.template()
    starts, left_out = _tp_starts(configs, spec, serving_config, setup.config, engine)
    cands, grid_left_out, basis = candidates(
        template, setup.config, settings.max_num_seqs, settings.max_num_batched_tokens,
        setup.slo.target_concurrency, settings.max_candidates,
        api_server_count=settings.api_server_count, starts=starts)
    left_out += grid_left_out
    name = config.scenario or next(iter(scenarios_for(spec, setup.profile, "search")))
    sc = setup.profile.scenarios[name]
    traffic = Traffic.of(sc, setup.profile.sweep, template)
    rate = _rate_settings(configs, node_type, spec)
    context.log.info(f"search on {node_type}: {len(cands)} candidates ({basis}); left out: "
                     f"{'; '.join(left_out) or 'none'}; {rate.target_rate_rps:g} req/s on "
                     f"{name}")
    result = run_search(engine, loadgen, setup.variant, cands, basis, setup.slo, rate, traffic,
                        _load_tokenizer(setup.variant.path),
                        budget_s=settings.budget_minutes * 60, start_s=settings.start_seconds,
                        min_margin=settings.min_margin, log=context.log.info)
    record = SearchRecord.of(spec.id, result)
    return dg.Output(CellSearch(record, result.margin), metadata={
        "searched": True,
        "search_table": dg.MetadataValue.md(md_table(result.table())),
        "margin": dg.MetadataValue.text(result.margin),
        "baseline_hash": result.baseline.hash, "winner_hash": result.winner.hash,
        "measured": result.measured, "crashed": result.crashed,
        "left_out": dg.MetadataValue.json(left_out), "order": basis,
        "scenario": name, "target_rate_rps": rate.target_rate_rps,
        "search_s": round(result.seconds, 1),
        "measured_precision": setup.variant.precision, "substituted": setup.note or "no",
        **stack_metadata(configs), **spec_metadata(spec)})


def _tp_starts(configs: ConfigFiles, spec: ModelSpec, splan: ServingPlan,
               config: EngineConfig, engine: Engine) -> tuple[list[EngineConfig], list[str]]:
    """The plan's configuration at the other TPs that fit, up to the engine's GPUs, at its own
    precision and engine: the cell has that precision's weights, and published_variant
    publishes the plan's precisions; its pod runs one engine (other precisions and engines:
    bench/config_search.py --other-starts, whose record serving_config applies)."""
    if splan.config(config.node_type) is None or splan.config(config.node_type) != config:
        return [], []
    bases, left_out = search_bases(splan, spec, configs.nodes(), configs.stack(),
                                   config.node_type, max_tensor_parallel=engine.gpu_count())
    same = [b for b in bases if b.precision == config.precision]
    others = sorted({b.precision for b in bases} - {config.precision})
    if others:
        left_out.append(f"precisions {', '.join(others)}: not published for this cell "
                        "(bench/config_search.py --other-starts)")
    # the cell's pod runs one engine's image: other engines are searched where installed
    _, engines_left_out = engine_bases(splan, spec, configs.stack(), config.node_type,
                                       at_hand=frozenset({engine.kind()}))
    return same, left_out + engines_left_out


@dg.asset(
    **_measured_cell("load_timing"),
    ins={"config_search": dg.AssetIn(input_manager_key="optional_upstream")},
    check_specs=[dg.AssetCheckSpec(COLD_START_CHECK, asset="load_timing",
                                   partitions_def=cells_partitions,
                                   description="cold start p95 within configs/gates.yaml "
                                   "`slo.cold_start_p95_max_s` for this node type"),
                 dg.AssetCheckSpec(KERNEL_CHECK, asset="load_timing",
                                   partitions_def=cells_partitions,
                                   description="every start ran the kernels configs/nodes.yaml "
                                   "`kernel_gate` requires of its precision on this GPU "
                                   "architecture, as the engine's own log names them"),
                 node_check_spec("load_timing")],
    description="Three kinds of engine start of the serving variant: fully cold (page cache "
    "evicted, empty compile caches), cold weights (page cache evicted, caches kept) and warm; "
    "phases, p50/p95, weight-load GB/s next to the raw sequential read GB/s of the same files.",
)
def load_timing(context: dg.AssetExecutionContext, config: LoadTimingConfig, configs: ConfigFiles,
                engine: Engine, serving_variant: VariantRef, checkpoint: CheckpointRef,
                quantized: QuantizedSet, serving_config: ServingPlan,
                config_search: CellSearch | None, io_manager: dg.ResourceParam[dg.IOManager]):
    setup = _setup(context, configs, engine, config, serving_variant, checkpoint, quantized,
                   serving_config, config_search)
    spec, variant = setup.spec, setup.variant
    node_check = _node_check(context, io_manager, engine, setup)
    if variant is None:
        yield dg.Output(LoadTimingResult(model=spec.id, precision=serving_variant.precision,
                                         servable=False, reason=setup.reason,
                                         node_type=engine.node_type),
                        metadata={**_unservable_metadata(engine, setup.reason, configs),
                                  **spec_metadata(spec)})
        yield _unservable_check(COLD_START_CHECK, setup.reason)
        yield _unservable_check(KERNEL_CHECK, setup.reason)
        yield node_check
        return
    d = setup.profile.load_timing

    def pick(value: int | None, default: int) -> int:
        return default if value is None else value

    samples, raw = engine.time_starts(
        variant, setup.config,
        {"fully_cold": pick(config.cold_repeats, d.cold_repeats),
         "cold_weights": pick(config.cold_weights_repeats, d.cold_weights_repeats),
         "warm": pick(config.warm_repeats, d.warm_repeats)},
        start_timeout_s=config.start_timeout_s or d.start_timeout_s, log=context.log,
        hand_off=True)
    result = dataclasses.replace(
        summarize_load_timing(spec.id, variant.precision, samples, raw.total_bytes,
                              raw.gbps if raw.total_bytes else None),
        node_type=engine.node_type, config_hash=setup.config.hash, random_weights=spec.is_twin)
    if setup.reason:
        result = dataclasses.replace(result, servable=False, reason=setup.reason)
    kernels = tuple(StartKernels(s.kind, s.kernels) for s in samples)
    result = dataclasses.replace(result, kernels=kernels, kernel_verdict=judge(
        configs.nodes().kernel_gate, engine.kind(), variant.precision,
        engine.resolved_hardware(), kernels))
    yield dg.Output(result, metadata={
        **_measured_metadata(engine, setup, serving_variant),
        **_timing_metadata(result, samples, engine),
        **_kernel_metadata(result),
        "servable_precisions": dg.MetadataValue.json(engine.servable_precisions()),
        **stack_metadata(configs), **spec_metadata(spec)})
    yield _cold_start_check(setup, result, engine.node_type)
    yield kernel_check(result, engine.resolved_hardware(), setup.blocking)
    yield node_check


def _cold_start_check(setup: Setup, result: LoadTimingResult, node_type: str
                      ) -> dg.AssetCheckResult:
    """The fully cold p95 against the budget; for a twin not applicable: its start reads no
    weights, so it is no cold start of the real model (the numbers are kept beside)."""
    budget = setup.slo.cold_start_p95_max_s
    metadata = {"cold_start_p95_s": result.cold_start_p95_s,
                "expected_max_s": dg.MetadataValue.float(budget) if budget is not None
                else dg.MetadataValue.null(),
                "node_type": node_type, "measured_precision": result.precision}
    if result.random_weights:
        return not_applicable_check(COLD_START_CHECK, f"{NOT_A_WEIGHT_READ}: a performance "
                                    "twin's start reads no weights, so it is not the real "
                                    "model's cold start", metadata)
    return dg.AssetCheckResult(
        check_name=COLD_START_CHECK,
        passed=budget is None or result.cold_start_p95_s <= budget,
        severity=dg.AssetCheckSeverity.WARN, metadata=metadata)


def kernel_check(result: LoadTimingResult, hardware: str, blocking: bool
                 ) -> dg.AssetCheckResult:
    """The kernel gate's verdict: a start on a fallback fails, naming the kernel it ran and
    what was expected; no rule for the start (bf16, the CPU build) passes as not judged."""
    v = result.kernel_verdict
    metadata = {"hardware": hardware, "measured_precision": result.precision,
                "kernels_seen": dg.MetadataValue.json(summarize_facts(result.kernels)),
                "verdict": dg.MetadataValue.text(v.summary if v else "not read")}
    if v is None or v.passed is None:
        return dg.AssetCheckResult(check_name=KERNEL_CHECK, passed=True,
                                   metadata={**metadata, "status": "not judged"})
    metadata["expected"] = dg.MetadataValue.text(v.expected)
    if v.problems:
        metadata["seen_instead"] = dg.MetadataValue.md("\n".join(f"- {p}" for p in v.problems))
    if v.passes_as:
        metadata["passes_as"] = dg.MetadataValue.text(v.passes_as)
    return dg.AssetCheckResult(
        check_name=KERNEL_CHECK, passed=bool(v.passed), metadata=metadata,
        severity=dg.AssetCheckSeverity.ERROR if blocking else dg.AssetCheckSeverity.WARN)


def _kernel_metadata(result: LoadTimingResult) -> dict:
    v = result.kernel_verdict
    return {"kernels": dg.MetadataValue.md(md_table(facts_table(result.kernels))
                                           if result.kernels else "no start was read"),
            "kernel_verdict": dg.MetadataValue.text(v.summary if v else "not read")}


def _float_or_null(value: float | None) -> dg.MetadataValue:
    return dg.MetadataValue.float(value) if value is not None else dg.MetadataValue.null()


def _timing_metadata(result: LoadTimingResult, samples: list, engine: Engine) -> dict:
    cold = [s.first_token_s for s in samples if s.kind == "fully_cold"]
    return {
        "cold_start_p50_s": result.cold_start_p50_s,
        "cold_start_p95_s": result.cold_start_p95_s,
        "cold_start_spread_s": float(max(cold) - min(cold)) if cold else 0.0,
        "cold_weights_p50_s": _float_or_null(result.cold_weights_p50_s),
        "warm_start_p50_s": _float_or_null(result.warm_start_p50_s),
        "which_caches_were_cold": dg.MetadataValue.md(
            "- **fully_cold**: weight files evicted from the page cache (residency checked) and "
            "the engine's compile/kernel caches (" + ", ".join(
                f"`{k}`" for k in engine.template().cache_env) + ") pointed at an empty "
            "directory\n- **cold_weights**: weights evicted, caches as the last fully cold "
            "start left them\n- **warm**: weights read into the page cache first, caches warm"
            "\n- always warm: the engine's Python packages and shared libraries (the image is "
            "pulled)"),
        "weight_load_phase": NOT_A_WEIGHT_READ if result.random_weights
        else "the engine's read of the weight files",
        "weight_bytes": result.weight_bytes,
        "weights_load_gbps": _float_or_null(result.weights_load_gbps),
        "raw_read_gbps": _float_or_null(result.raw_read_gbps),
        "starts": dg.MetadataValue.md(md_table(
            [{k: v for k, v in s.__dict__.items() if k != "kernels"} for s in samples],
            floatfmt=".3f")),
    }


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"tokenizer of {path}", f"cannot be loaded ({exc})",
                          "The serving variant must carry its tokenizer files "
                          "(tokenizer.json, tokenizer_config.json).") from None


@dg.asset(
    **_measured_cell("serving_benchmark"),
    # After load_timing in the graph (one engine on the GPU at a time), but not on its numbers:
    # a node that cannot evict its page cache fails load_timing and still gets its sweep.
    ins={"load_timing": dg.AssetIn(input_manager_key="optional_upstream"),
         "config_search": dg.AssetIn(input_manager_key="optional_upstream")},
    check_specs=[dg.AssetCheckSpec(SLO_CHECK, asset="serving_benchmark", blocking=True,
                                   partitions_def=cells_partitions,
                                   description="TTFT p95, mean ITL and error rate within "
                                   "configs/gates.yaml `slo` at the target concurrency"),
                 node_check_spec("serving_benchmark", blocking=True)],
    description="Traffic profiles x concurrency sweep against the real engine: TTFT, ITL, "
    "TPOT, E2E, throughputs, errors by cause, /metrics cross-check, goodput, saturation point.",
)
def serving_benchmark(context: dg.AssetExecutionContext, config: ServingBenchmarkConfig,
                      configs: ConfigFiles, outputs: OutputDirs, engine: Engine,
                      loadgen: LoadGenerator, telemetry: GpuTelemetry,
                      serving_variant: VariantRef, checkpoint: CheckpointRef,
                      quantized: QuantizedSet, serving_config: ServingPlan,
                      load_timing: LoadTimingResult | None, config_search: CellSearch | None,
                      io_manager: dg.ResourceParam[dg.IOManager]):
    setup = _setup(context, configs, engine, config, serving_variant, checkpoint, quantized,
                   serving_config, config_search)
    spec, variant, gpus = setup.spec, setup.variant, engine.gpu_count()
    node_check = _node_check(context, io_manager, engine, setup)
    if variant is None:
        result = ServingBenchmarkResult(model=spec.id, precision=serving_variant.precision,
                                        node_type=engine.node_type, gpus=gpus, servable=False,
                                        tokens_per_s_per_gpu=0.0, saturation_concurrency=0,
                                        slo_pass=False, slo_violations=(setup.reason,))
        yield dg.Output(result, metadata={**_unservable_metadata(engine, setup.reason, configs),
                                          **spec_metadata(spec),
                                          "node_type": engine.node_type, "gpus": gpus,
                                          "slo_pass": False})
        yield _unservable_check(SLO_CHECK, setup.reason)
        yield node_check
        return
    asked = setup.profile.sweep.model_copy(update={k: v for k, v in {
        "concurrency": config.concurrency, "mode": config.mode,
        "requests_per_point": config.requests_per_point,
        "max_seconds_per_point": config.max_seconds_per_point,
        "rate_verdict": config.rate_verdict}.items() if v is not None})
    # a blocking (gpu) profile always sweeps the target concurrency, where its SLO is judged
    sweep = setup.profile.model_copy(update={"sweep": asked}).sweep_for(
        setup.slo.target_concurrency)
    wanted = spec.model_copy(update={"scenarios": config.scenarios}) if config.scenarios else spec
    scenarios = scenarios_for(wanted, setup.profile,
                              f"configs/scenarios.yaml profile {setup.profile_name}")
    template = engine.template()
    check_fits(scenarios, setup.config.max_model_len)
    tokenizer = _load_tokenizer(variant.path)
    gpu_ids = [int(g) for g in engine.gpus.split(",") if g.strip().isdigit()] or None
    at_rate = _rate_settings(configs, engine.node_type, spec) if sweep.rate_verdict else None
    rate_v = None
    with engine.serve_shared(variant, setup.config) as running, \
            telemetry.sampler(gpu_ids) as sampler, FrontendSampler(running.pid) as frontend:
        context.log.info(engine_start_note(running))
        rows, points = run_sweep(context.log, loadgen, running, template, spec.served_name,
                                 scenarios, sweep, setup.slo, tokenizer, sampler, frontend,
                                 keep_partial=_keep_partial(context, outputs, running))
        if at_rate is not None:
            name, sc = next(iter(scenarios.items()))
            traffic = Traffic.of(sc, sweep, template)
            context.log.info(f"rate verdict: {at_rate.target_rate_rps:g} req/s Poisson on "
                             f"{name}, {at_rate.repeats} runs at most")
            rate_v = verdict_at_rate(loadgen, running.base_url, spec.served_name, tokenizer,
                                     traffic, setup.slo, at_rate,
                                     f"{setup.config.hash}/rate/{name}", log=context.log.info)
    result, basis, violations = headline(spec.id, variant.precision, engine.node_type, gpus,
                                         setup.slo, points, sweep.mode == "concurrency")
    result = dataclasses.replace(result, config_hash=setup.config.hash,
                                 slo_blocking=setup.blocking,
                                 servable=result.servable and not setup.reason)
    rate_meta: dict = {}
    if rate_v is not None and at_rate is not None:
        result, violations, rate_meta = _with_rate_verdict(result, violations, rate_v, at_rate,
                                                           next(iter(scenarios)))
    yield dg.Output(result, metadata={
        **_measured_metadata(engine, setup, serving_variant),
        **_sweep_report(outputs, f"{spec.id} ({variant.precision}) on {engine.node_type}",
                        f"{spec.id}/{engine.node_type}", rows, setup.slo),
        **_frontend_metadata(rows, frontend.unavailable),
        "gpus": gpus,
        "tokens_per_s_per_gpu": result.tokens_per_s_per_gpu,
        "saturation_concurrency": result.saturation_concurrency,
        "slo_pass": result.slo_pass,
        "throughput_basis": basis,
        "slo": dg.MetadataValue.json(setup.slo.__dict__),
        **rate_meta,
        "engine_start": dg.MetadataValue.text(engine_start_note(running)),
        "engine_args_dropped": dg.MetadataValue.json(
            {"dropped_on_" + engine.resolved_hardware(): running.dropped_args}),
        **stack_metadata(configs),
        **spec_metadata(spec),
    })
    yield _slo_check(setup, result, violations)
    yield node_check


def _rate_settings(configs: ConfigFiles, node_type: str, spec: ModelSpec) -> RateSlo:
    return rate_slo(load_search_file(configs.path("search.yaml")), node_type, spec)


def _with_rate_verdict(result: ServingBenchmarkResult, violations: list[str],
                       v: RepeatedVerdict, rate: RateSlo, scenario: str
                       ) -> tuple[ServingBenchmarkResult, list[str], dict]:
    """The SLO verdict with the open-loop one joined: met at the sweep's target concurrency and
    at the target rate (an undecided rate verdict has not shown the SLO met: fails closed)."""
    runs = f"{len(v.runs)} run{'s' if len(v.runs) != 1 else ''}"
    where = f"at {rate.target_rate_rps:g} req/s (Poisson, {scenario}, {runs})"
    if v.outcome != MET:
        violations = [*violations, f"{where}: {v.outcome} (n={v.n}): {v.says()}"[:900]]
    result = dataclasses.replace(
        result, slo_pass=result.slo_pass and v.outcome == MET,
        slo_violations=tuple(violations), rate_verdict=v.outcome,
        rate_target_rps=rate.target_rate_rps, rate_n=v.n,
        rate_goodput_rps=None if math.isnan(v.goodput_rps) else round(v.goodput_rps, 3))
    meta = {"rate_verdict": v.outcome, "rate_verdict_n": v.n,
            "rate_verdict_detail": dg.MetadataValue.md(f"{where}: {v.says()}")}
    if result.rate_goodput_rps is not None:
        meta["rate_goodput_rps"] = result.rate_goodput_rps
    return result, violations, meta


def engine_start_note(running) -> str:
    """Which engine the sweep measured: load_timing's last start of the same configuration,
    handed off in this run (resources/engine.py), or one started for this step."""
    if running.reused_from:
        return (f"reused load_timing's {running.reused_from} start of configuration "
                f"{running.config_hash} (pid {running.pid}), started and measured earlier in "
                "this run: it had served only its readiness completion (one token of "
                "\"Hello\"), as an engine started here would have, so its prefix cache holds "
                "what a fresh start's holds and nothing is reset; each scenario's warm-up "
                "requests run before its first point either way")
    return (f"started for this step: configuration {running.config_hash} (pid {running.pid}), "
            f"first token after {running.phases.first_token_s or 0:.1f} s")


def _slo_check(setup: Setup, result: ServingBenchmarkResult, violations: list[str]
               ) -> dg.AssetCheckResult:
    """A blocking gate in a profile whose slo_severity is error (gpu); a warning that says so
    in one that measures a stand-in (cpu)."""
    return dg.AssetCheckResult(
        check_name=SLO_CHECK, passed=result.slo_pass,
        severity=dg.AssetCheckSeverity.ERROR if setup.blocking else dg.AssetCheckSeverity.WARN,
        metadata={"target_concurrency": setup.slo.target_concurrency,
                  "expected": dg.MetadataValue.json(setup.slo.__dict__),
                  "violations": dg.MetadataValue.json(list(violations)),
                  "saturation_concurrency": result.saturation_concurrency,
                  "config_hash": setup.config.hash,
                  "gate": f"blocking ({setup.profile_name} profile: slo_severity error)"
                  if setup.blocking else f"warning only ({setup.profile_name} profile: "
                  "slo_severity warn; it measures on a stand-in, not a deployed configuration)"})


def _sweep_report(outputs: OutputDirs, title: str, cell: str, rows: list[dict], slo: Slo
                  ) -> dict:
    """The sweep as a table, a plot and a CSV under the reports directory, in the cell's
    folder (`<model>/<node type>/`)."""
    png = sweep_png(rows, title, slo.ttft_p95_s, slo.itl_mean_ms)
    out_dir = outputs.reports / cell
    out_dir.mkdir(parents=True, exist_ok=True)
    png_path = out_dir / "serving_benchmark.png"
    png_path.write_bytes(png)
    write_csv(out_dir / "serving_benchmark.csv", rows)
    return {
        "sweep": dg.MetadataValue.md(md_table(rows)),
        "plot": dg.MetadataValue.md(
            f"![sweep](data:image/png;base64,{base64.b64encode(png).decode()})"),
        "plot_path": dg.MetadataValue.path(str(png_path)),
    }


def _frontend_metadata(rows: list[dict], unavailable: str) -> dict:
    """Which points measured the engine's frontend rather than the GPU, and what to do."""
    bound = [f"{r['scenario']} @ {r['load']}" for r in rows if r.get("frontend_bound")]
    md: dict = {"frontend_bound_points": dg.MetadataValue.json(bound)}
    if bound:
        md["frontend_what_to_do"] = FRONTEND_ADVICE.format(cores=FRONTEND_BOUND_CORES)
    if unavailable:
        md["frontend_cpu"] = f"not checked: {unavailable}"
    return md


def _keep_partial(context: dg.AssetExecutionContext, outputs: OutputDirs, running
                  ) -> KeepPartial:
    """Keep what was measured before the engine died where a user finds it (the step fails, so
    nothing is materialized): a CSV under the reports directory and an observation on the
    asset, the dying point marked `engine_exited`. The error names the exit code and log tail."""
    def keep(rows: list[dict], point: str) -> str:
        path = (outputs.reports / model_of(context) / node_type_of(context)
                / f"serving_benchmark.partial-{context.run.run_id[:8]}.csv")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_csv(path, rows)
        context.log_event(dg.AssetObservation(
            asset_key=context.asset_key, partition=context.partition_key, metadata={
                "engine_exit_code": running.exit_code(),
                "engine_exited_during": point,
                "partial_sweep": dg.MetadataValue.md(md_table(rows)),
                "partial_csv": dg.MetadataValue.path(str(path)),
                "engine_log": dg.MetadataValue.path(str(running.log_path))}))
        return f"in {path}"

    return keep


defs = dg.Definitions(assets=[config_search, load_timing, serving_benchmark])
