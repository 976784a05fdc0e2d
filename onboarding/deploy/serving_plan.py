"""The serving plan of one model: the memory plan per node type and, for each node type that can
serve it, the one EngineConfig that is measured and deployed there.

Also the configuration of the engine at hand when its node type is not a planned one (the
embedded CPU engine), and the evidence a manifest carries: what was measured at which
configuration hash, where, or "unmeasured".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from onboarding.deploy.engine_choice import (
    MEASURED,
    SEARCHED,
    EngineChoice,
    Measurement,
    choose_engine,
    engine_candidates,
    in_engine,
)
from onboarding.deploy.kserve import (
    DeployConfig,
    Rendered,
    RenderInputs,
    Route,
    render,
    source_precision,
    storage_for,
)
from onboarding.deploy.plan import (
    DeploymentPlan,
    NodePlan,
    NodesConfig,
    PlanInputs,
    plan_node_at,
    servable_precisions,
)
from onboarding.fetch.catalog import ModelSpec
from onboarding.fetch.twins import NOT_READY
from onboarding.serving.engine_config import (
    ConfigInputs,
    EngineConfig,
    build_config,
    evidence,
)
from onboarding.serving.searched import CellSearch, SearchRecord, apply
from onboarding.serving.stack import EngineTemplate, Stack
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult

LOCAL_IMAGE = "local"


@dataclass(frozen=True)
class ServingPlan:
    """What `serving_config` stores: the plan, and a configuration per servable node type."""

    plan: DeploymentPlan
    configs: dict[str, EngineConfig]  # node type -> configuration
    skipped: dict[str, str] = field(default_factory=dict)  # node type -> why no configuration
    # which engine serves each configured node type, and why; a tuple, so that a
    # plan stored before it existed reads back with none
    engines: tuple[EngineChoice, ...] = ()
    # the recorded search winners of this model (configs/searched_configs.json), and what
    # applying them did per node type; tuples, so that an older stored plan reads back with none
    searched: tuple[SearchRecord, ...] = ()
    search_notes: tuple[tuple[str, str], ...] = ()

    def config(self, node_type: str) -> EngineConfig | None:
        return self.configs.get(node_type)

    def engine_choice(self, node_type: str) -> EngineChoice | None:
        return next((c for c in self.engines if c.node_type == node_type), None)


def planned_config(spec: ModelSpec, plan: DeploymentPlan, node_type: str, nodes: NodesConfig,
                   stack: Stack) -> EngineConfig:
    """The configuration the plan gives a (feasible) node type, in the stack's engine (its
    template: `stack.template`)."""
    return _node_config(spec, plan.inputs, plan.node(node_type), nodes, stack)


def _node_config(spec: ModelSpec, inputs: PlanInputs, node: NodePlan, nodes: NodesConfig,
                 stack: Stack) -> EngineConfig:
    node_type = node.node_type
    node_t = nodes.node_types[node_type]
    switches = stack.switches_for(node.precision, inputs.shape.moe, node_t.arch)
    planned: dict[str, Any] = {"max_model_len": inputs.context_tokens,
                               "max_num_seqs": node.max_num_seqs or inputs.target_concurrency,
                               "gpu_memory_utilization": inputs.gpu_memory_utilization}
    if inputs.kv_cache_dtype:
        planned["kv_cache_dtype"] = inputs.kv_cache_dtype
    return build_config(stack.template, ConfigInputs(
        spec=spec, node_type=node_type, hardware=node_t.arch, engine=stack.engine,
        engine_version=stack.engine_version, image=stack.images.get(node_t.arch, "missing"),
        precision=node.precision, tensor_parallel=node.tensor_parallel, planned=planned,
        switch_args=tuple(a for s in switches for a in s.args),
        switch_env={k: v for s in switches for k, v in s.env.items()}))


def local_config(spec: ModelSpec, template: EngineTemplate, engine: str, engine_version: str,
                 hardware: str, node_type: str, precision: str) -> EngineConfig:
    """The engine at hand on a node type nothing plans (the CPU build): its hardware defaults
    and the model's production parameters; one device."""
    return build_config(template, ConfigInputs(
        spec=spec, node_type=node_type, hardware=hardware, engine=engine,
        engine_version=engine_version, image=LOCAL_IMAGE, precision=precision))


def with_sla_choices(plan: DeploymentPlan, choices: list[Any], node_types: list[str]
                     ) -> DeploymentPlan:
    """The plan with TP and --max-num-seqs from the SLA choice (onboarding/predictions/predict.py) for the
    node types not at hand, where the choice is covered by the prediction data, feasible in
    memory and at the precision the plan serves there. Other node types keep the memory rule."""
    chosen = {c.node_type: c for c in choices if c.node_type in node_types}
    nodes = []
    for n in plan.nodes:
        c = chosen.get(n.node_type)
        if (c is None or c.basis != "sla" or not c.sla_pass or c.node_plan is None
                or not c.node_plan.feasible or c.precision != n.precision):
            nodes.append(n)
            continue
        nodes.append(dataclasses.replace(
            c.node_plan, max_num_seqs=c.max_num_seqs,
            tp_basis=f"SLA (predicted): {c.reason}"))
    return dataclasses.replace(plan, nodes=tuple(nodes))


def serving_plan(spec: ModelSpec, plan: DeploymentPlan, nodes: NodesConfig, stack: Stack
                 ) -> ServingPlan:
    """Every feasible node type's configuration, and why the others have none."""
    configs, skipped = {}, {}
    for node in plan.nodes:
        if node.feasible:
            configs[node.node_type] = planned_config(spec, plan, node.node_type, nodes, stack)
        else:
            skipped[node.node_type] = node.reason
    return ServingPlan(plan, configs, skipped)


def with_engine_choices(splan: ServingPlan, spec: ModelSpec,
                        templates: dict[str, EngineTemplate], stack_data: dict[str, Any],
                        measurements: list[Measurement], default_engine: str) -> ServingPlan:
    """Per configured node type, the engine chosen by measured goodput at the SLO where two or
    more engines were measured at their configurations there, else the stack's engine
    (onboarding/deploy/engine_choice.py); the chosen engine's configuration replaces the default's,
    with the reason among its notes (the manifest's configuration-notes)."""
    configs, choices = {}, []
    for nt, config in splan.configs.items():
        candidates, _ = engine_candidates(config, spec, templates, stack_data)
        choice = choose_engine(nt, candidates, measurements, default_engine)
        chosen = candidates[choice.engine]
        if choice.basis == MEASURED and choice.engine != config.engine:
            chosen = dataclasses.replace(chosen, notes=(*chosen.notes, f"engine {choice.reason}"))
        configs[nt] = chosen
        choices.append(choice)
    return dataclasses.replace(splan, configs=configs, engines=tuple(choices))


def search_bases(splan: ServingPlan, spec: ModelSpec, nodes: NodesConfig, stack: Stack,
                 node_type: str, max_tensor_parallel: int | None = None
                 ) -> tuple[list[EngineConfig], list[str]]:
    """The configuration search's other starting points on a planned node type: the plan's
    configuration at each other precision the plan may serve there (the ladder, native, past
    the gate) and each other TP candidate that fits in memory, at most `max_tensor_parallel`
    (the GPUs at hand); and what was left out, with why. Built as the plan builds its own, so a
    search winner from one of them is rebuilt to the same hash (`with_searched`)."""
    config = splan.config(node_type)
    if config is None:
        return [], [f"{node_type}: nothing planned ({splan.skipped.get(node_type, '?')})"]
    if config.engine != stack.engine:
        return [], [(f"precision and TP: {node_type} serves {config.engine} (chosen by "
                    f"measurement), and other starting points are built in the stack's engine "
                    f"{stack.engine}")]
    inputs, node_t = splan.plan.inputs, nodes.node_types[node_type]
    precisions, _ = servable_precisions(inputs, node_t)
    tps = sorted(t for t in nodes.planning.tensor_parallel_candidates
                 if t <= node_t.gpus_per_node)
    out, left_out = [], []
    for precision in precisions:
        for tp in tps:
            if (precision, tp) == (config.precision, config.tensor_parallel):
                continue
            if max_tensor_parallel is not None and tp > max_tensor_parallel:
                left_out.append(f"{precision} TP {tp}: {max_tensor_parallel} GPU(s) at hand")
                continue
            node = plan_node_at(inputs, node_type, node_t, nodes, precision, tp)
            if not node.feasible:
                left_out.append(f"{precision} TP {tp}: {node.reason}")
                continue
            out.append(_node_config(spec, inputs, node, nodes, stack))
    return out, left_out


def engine_bases(splan: ServingPlan, spec: ModelSpec, stack: Stack, node_type: str,
                 at_hand: frozenset[str] | None = None) -> tuple[list[EngineConfig], list[str]]:
    """The configuration search's starts in the other engines: the plan's configuration of
    `node_type` rendered by every other engine template of configs/stack.yaml with kernels for
    its precision on that hardware, at that engine's pinned version and image (as the engine
    choice builds it: `config_for_engine`); and what was left out, with why. `at_hand`: the
    engines this machine can start (None: all), the others left out, said."""
    config = splan.config(node_type)
    if config is None:
        return [], [f"{node_type}: nothing planned ({splan.skipped.get(node_type, '?')})"]
    out, left_out = [], []
    for name, template in sorted(stack.templates.items()):
        if name == config.engine:
            continue
        version = stack.versions.get(name)
        start, why = in_engine(config, spec, template, name, version,
                               stack.images_by_engine.get(name, {}).get(config.hardware))
        if start is None:
            left_out.append(f"engine {name}: {why}")
            continue
        if at_hand is not None and name not in at_hand:
            left_out.append(f"engine {name} {version}: not installed where this search runs "
                            f"(bench/config_search.py --engine-bin-for {name}=DIR starts it)")
            continue
        out.append(start)
    return out, left_out


def with_searched(splan: ServingPlan, spec: ModelSpec, templates: dict[str, EngineTemplate],
                  records: list[SearchRecord], nodes: NodesConfig | None = None,
                  stack: Stack | None = None) -> ServingPlan:
    """Each configured node type's recorded search winner, where the plan still gives the
    configuration the search started from (onboarding/serving/searched.py); the records of this
    model kept on the plan for the engine at hand (`config_at_hand`). A winner at another
    precision or TP (`search_bases`, which needs `nodes` and `stack`) also replaces the node
    type's memory plan, so the manifest asks for its GPUs and publishes its weights; a winner
    in another engine (`engine_bases`) replaces the node type's engine choice, saying so."""
    mine = tuple(r for r in records if r.model == spec.id)
    configs, notes, node_plans = dict(splan.configs), [], {}
    engines: dict[str, EngineChoice] = {}
    for nt, config in splan.configs.items():
        template = templates.get(config.engine)
        if template is None:
            continue

        def rebase(precision: str, tp: int, engine: str, nt: str = nt,
                   config: EngineConfig = config) -> tuple[EngineConfig | None, str]:
            if stack is None:
                return None, "no stack at hand to rebuild another precision, TP or engine"
            if engine != config.engine:
                if (precision, tp) != (config.precision, config.tensor_parallel):
                    return None, (f"the search starts other engines at the plan's precision "
                                  f"and TP ({config.precision}, TP {config.tensor_parallel})")
                bases, left_out = engine_bases(splan, spec, stack, nt)
                hit = [b for b in bases if b.engine == engine]
                why = [w for w in left_out if w.startswith(f"engine {engine}")]
                return (hit[0], "") if hit else (None, why[0] if why else (
                    f"{engine} is no longer an engine template of configs/stack.yaml"))
            if nodes is None:
                return None, "no memory plan at hand to rebuild another precision or TP"
            bases, left_out = search_bases(splan, spec, nodes, stack, nt)
            hit = [b for b in bases if (b.precision, b.tensor_parallel) == (precision, tp)]
            if not hit:
                why = [w for w in left_out if w.startswith(f"{precision} TP {tp}:")]
                return None, (why[0] if why else f"{precision} at TP {tp} is no longer a "
                              f"starting point on {nt} (the ladder, the gate or the memory "
                              "plan changed)")
            node = plan_node_at(splan.plan.inputs, nt, nodes.node_types[nt], nodes, precision,
                                tp)
            node_plans[nt] = dataclasses.replace(
                node, tp_basis=f"measured search: {precision} at TP {tp}")
            return hit[0], ""

        configs[nt], said = apply(config, template, list(mine), rebase, templates)
        if said:
            notes.append((nt, said))
        if configs[nt].hash == config.hash:
            node_plans.pop(nt, None)
        elif configs[nt].engine != config.engine:
            won = next(r for r in mine if r.node_type == nt and r.base_hash == config.hash)
            engines[nt] = EngineChoice(
                node_type=nt, engine=configs[nt].engine, basis=SEARCHED,
                config_hash=configs[nt].hash,
                reason=(f"{configs[nt].engine}: the measured search's winner over "
                        f"{won.candidates} candidates, {config.engine} among them: "
                        f"{won.margin}")[:600])
    plan = splan.plan
    if node_plans:
        plan = dataclasses.replace(plan, nodes=tuple(node_plans.get(n.node_type, n)
                                                     for n in plan.nodes))
    choices = tuple(engines.get(c.node_type, c) for c in splan.engines) + tuple(
        c for nt, c in engines.items() if splan.engine_choice(nt) is None)
    return dataclasses.replace(splan, plan=plan, configs=configs, searched=mine,
                               search_notes=tuple(notes), engines=choices)


def with_cell_search(splan: ServingPlan, spec: ModelSpec, found: CellSearch | None,
                     nodes: NodesConfig, stack: Stack) -> ServingPlan:
    """The plan with one cell's search winner (its `config_search` asset) applied to that
    cell's node type only (`with_searched`), the other node types and what serving_config
    applied before kept; a node type nothing plans (the engine at hand) gets it through
    `config_at_hand`. Unchanged when the search did not run."""
    if found is None or found.record is None:
        return splan
    r = found.record
    one = dataclasses.replace(splan, configs={k: v for k, v in splan.configs.items()
                                              if k == r.node_type})
    one = with_searched(one, spec, stack.templates, [r], nodes, stack)
    return dataclasses.replace(splan, plan=one.plan, configs={**splan.configs, **one.configs},
                               engines=one.engines, searched=(*splan.searched, r),
                               search_notes=(*splan.search_notes, *one.search_notes))


def config_at_hand(splan: ServingPlan, spec: ModelSpec, template: EngineTemplate,
                   local: dict[str, str]) -> EngineConfig:
    """The configuration at hand (`_config_at_hand`), or its recorded search winner."""
    config = _config_at_hand(splan, spec, template, local)
    if config.node_type not in splan.configs and splan.searched:
        config, _ = apply(config, template, list(splan.searched))
    return config


def _config_at_hand(splan: ServingPlan, spec: ModelSpec, template: EngineTemplate,
                    local: dict[str, str]) -> EngineConfig:
    """The configuration the engine at hand starts: the plan's for its node type when it runs
    that precision on that hardware (with the installed engine version: when that differs from
    the stack's, the hash differs too, so no manifest claims the measurement); else the local
    engine's own (the CPU build, or a precision standing in for the planned one)."""
    nt, precision = local["node_type"], local["precision"]
    base = splan.config(nt)
    if base is None or base.precision != precision or base.hardware != local["hardware"] \
            or base.engine != local["engine"]:
        return local_config(spec, template, local["engine"], local["engine_version"],
                            local["hardware"], nt, precision)
    if base.engine_version == local["engine_version"]:
        return base
    return build_config(template, ConfigInputs(
        spec=spec, node_type=nt, hardware=base.hardware, engine=base.engine,
        engine_version=local["engine_version"], image=LOCAL_IMAGE, precision=base.precision,
        tensor_parallel=base.tensor_parallel,
        planned={k: base.params[k] for k in ("max_model_len", "max_num_seqs",
                                              "gpu_memory_utilization", "kv_cache_dtype")
                 if k in base.params},
        switch_args=base.switch_args,
        switch_env={k: v for k, v in base.env.items() if k not in template.base_env}))


def render_targets(spec: ModelSpec, splan: ServingPlan, nodes: NodesConfig, stack: Stack,
                   deploy: DeployConfig, config_dtype: str | None,
                   timing: LoadTimingResult | None = None,
                   bench: ServingBenchmarkResult | None = None,
                   published: dict[str, Any] | None = None,
                   only: str | None = None) -> tuple[list[Rendered], dict[str, str]]:
    """Every target node type of deploy.yaml (`only`: that one, a cell's): its configuration
    rendered with the evidence for exactly that configuration, or why there is no manifest
    (not a target; infeasible; unmeasured when deploy.yaml `render_unmeasured` is false; a
    performance twin: none at all).

    The LocalModelCache of a variant names every target node type whose plan deploys it, also
    when one cell is rendered: each cell renders the same object, so applying several cells'
    manifests leaves one cache over all their node groups."""
    wanted = [only] if only is not None else list(deploy.target_node_types)
    if spec.is_twin:
        return [], {nt: f"{NOT_READY}: a twin is never deployed (docs/twins.md)"
                    for nt in wanted}
    rendered, skipped, todo, cached = [], {}, [], {}
    for nt in wanted:
        if nt not in deploy.target_node_types or nt not in nodes.node_types:
            skipped[nt] = (f"{nt} is not a deployment target (deploy.yaml target_node_types: "
                           f"{', '.join(deploy.target_node_types)}); what was measured there "
                           "is kept, nothing is rendered")
    source_prec = source_precision(config_dtype, spec.source_precision)
    for nt in deploy.target_node_types:
        config = splan.config(nt)
        if config is None or not splan.plan.node(nt).feasible:
            if nt in wanted:
                skipped[nt] = splan.skipped.get(nt) or splan.plan.node(nt).reason
            continue
        storage = storage_for(spec, config.precision, source_prec, deploy, published)
        if storage.published and nt in deploy.local_model_cache.node_types:
            # one LocalModelCache per published variant: every node type with a cache that
            # deploys it
            cached.setdefault(storage.uri, []).append(nt)
        if nt not in wanted:
            continue
        ev = evidence(config, timing, bench)
        if not ev.measured and not deploy.render_unmeasured:
            skipped[nt] = f"{ev.basis} (deploy.yaml render_unmeasured: false)"
            continue
        todo.append((nt, config, ev, storage))
    for nt, config, ev, storage in todo:
        rendered.append(render(RenderInputs(
            spec=spec, plan=splan.plan, node_type=nt, node=nodes.node_types[nt],
            stack=_stack_of(stack, config, nodes.node_types[nt].arch), deploy=deploy, config=config,
            evidence=ev, storage=storage, cache_node_types=tuple(cached.get(storage.uri, ())))))
    return rendered, skipped


def _stack_of(stack: Stack, config: EngineConfig, arch: str) -> Stack:
    """The stack as the configuration's engine sees it: the stack itself for its own engine;
    for an engine the plan chose by measurement, that engine and version with the image its tag
    rule gave when serving_config was built (engine_candidates) and none of the stack engine's
    switches (a stale serving_config is caught by the stack fingerprint, its data version)."""
    if config.engine == stack.engine:
        return stack
    return dataclasses.replace(stack, engine=config.engine, engine_version=config.engine_version,
                               images={arch: config.image}, switches=())


@dataclass(frozen=True, kw_only=True)
class ManifestSet:
    """What `kserve_manifest` stores: the rendered files of one model, one per target node type
    `render_targets` rendered, with the verdict of the one schema validation they went through."""

    model: str
    files: dict[str, str]  # node type -> path of the multi-document YAML
    services: dict[str, str]  # node type -> InferenceService name
    routes: tuple[Route, ...]
    skipped: dict[str, str]  # node type -> why no manifest
    errors: dict[str, list[str]] = field(default_factory=dict)  # "<node type> <doc>" -> errors
    config_hashes: dict[str, str] = field(default_factory=dict)  # node type -> hash rendered
    measured: dict[str, bool] = field(default_factory=dict)  # node type -> measured at it
    published: dict[str, bool] = field(default_factory=dict)  # node type -> storage published

    @property
    def valid(self) -> bool:
        return not self.errors
