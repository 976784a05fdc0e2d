"""Served accuracy on recorded per-item results: agreement (with a planted disagreement), the
served gate and its re-evaluation through engine restarts, and which gate decides.

The per-item results are recorded from real runs by bench/served_accuracy_gpu.py into
tests/data/served_accuracy/: `cpu_smollm2.json` (SmolLM2 bf16 in process and through vLLM's CPU
build) and `gpu_smollm2.json` (the H200, 2026-12-02: bf16 and FP8; NVFP4 is not served on Hopper).
What cannot run here, a GPU engine serving FP8/NVFP4, is a stand-in (`GpuEngineStandIn`) that
starts nothing and answers with recorded items; everything else is the production code.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from pydantic import PrivateAttr

from bench.gpu_recordings import recorded as gpu_recorded
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import CheckpointRef
from onboarding.fetch.catalog import ModelSpec
from onboarding.quantize.accuracy_gate import (
    AccuracyGates,
    TaskScore,
    apply_policy,
    judge_variant,
    scores_from_json,
    scores_to_json,
)
from onboarding.quantize.served_accuracy import agreement
from onboarding.quantize.variants import (
    AccuracyRecord,
    AccuracyReport,
    GateOutcome,
    QuantizedSet,
    QuantizedVariant,
    choose_precision,
    deciding_gate,
)
from resources.accuracy_runs import served_report
from resources.config_files import ConfigFiles
from resources.engine import Engine, RunningEngine
from resources.evaluator import EvalRun

DATA = PROJECT_ROOT / "tests" / "data" / "served_accuracy"
CPU = DATA / "cpu_smollm2.json"
GPU = DATA / "gpu_smollm2.json"
TASKS = ("onb_facts_mc", "onb_arith_gen")
METRICS = {"onb_facts_mc": "acc", "onb_arith_gen": "exact_match"}


def load_scores(recorded: dict) -> dict[str, TaskScore]:
    return scores_from_json(recorded["tasks"])


def recorded(path: Path) -> dict:
    return json.loads(path.read_text())


def gates_for(data: dict) -> AccuracyGates:
    return AccuracyGates.model_validate(data["settings"]["gates"])


def lose(scores: dict[str, TaskScore], task: str, every: int) -> dict[str, TaskScore]:
    """A planted fault: every `every`-th item of `task` answered wrong (what a wrong scale on one
    layer does to a model's answers), the rest as recorded."""
    s = scores[task]
    per_item = {i: (0.0 if i % every == 0 else v) for i, v in s.per_item.items()}
    return {**scores, task: TaskScore(task=task, metric=s.metric,
                                      value=sum(per_item.values()) / len(per_item), stderr=None,
                                      n=len(per_item), per_item=per_item, size=s.size)}


@pytest.fixture(scope="module")
def cpu() -> dict:
    if not CPU.is_file():
        pytest.skip(f"{CPU} not recorded (bench/served_accuracy_gpu.py --precisions bf16)")
    return recorded(CPU)


def test_recorded_scores_read_back_as_the_script_wrote_them(cpu):
    for source in ("in_process", "served"):
        tasks = cpu[source]["bf16"]["tasks"]
        assert scores_to_json(scores_from_json(tasks)) == tasks


def test_recorded_cpu_bf16_served_and_in_process_do_not_disagree(cpu):
    gates = gates_for(cpu)
    in_process, served = (load_scores(cpu[k]["bf16"]) for k in ("in_process", "served"))
    found = agreement("bf16", in_process, served, gates)
    assert found.verdict != "disagree", found.reason
    assert found.verdict == cpu["agreements"]["bf16"]["verdict"]  # as the run recorded it
    for t in found.tasks:
        assert t.paired and t.n == in_process[t.task].n == served[t.task].n
        assert abs(t.diff) < 0.05  # the same bf16 weights: a few near-tie items flip


def test_a_planted_fault_in_the_served_answers_is_an_export_or_kernel_problem(cpu):
    gates = gates_for(cpu)
    in_process = load_scores(cpu["in_process"]["bf16"])
    broken = lose(load_scores(cpu["served"]["bf16"]), "onb_arith_gen", every=2)
    found = agreement("bf16", in_process, broken, gates)
    assert found.verdict == "disagree" and not found.passed
    arith = next(t for t in found.tasks if t.task == "onb_arith_gen")
    assert arith.diff_high < -gates.served_agreement.max_abs_diff
    assert found.reason.startswith("export or kernel problem: onb_arith_gen: served ")
    assert f"in process {in_process['onb_arith_gen'].value:.4f}" in found.reason
    assert f"served {broken['onb_arith_gen'].value:.4f}" in found.reason


def test_a_task_missing_from_the_served_run_is_a_disagreement(cpu):
    gates = gates_for(cpu)
    in_process = load_scores(cpu["in_process"]["bf16"])
    served = load_scores(cpu["served"]["bf16"])
    del served["onb_arith_gen"]
    found = agreement("bf16", in_process, served, gates)
    assert found.verdict == "disagree" and "not scored when served: onb_arith_gen" in found.reason


# ---- served_report: the served_accuracy asset's code with a GPU engine stand-in ----

class GpuEngineStandIn(Engine):
    """The real Engine's configuration and servable matrix (configs/stack.yaml, sm100 serves
    NVFP4, FP8, bf16); `serve` starts nothing (no GPU here) and records each start."""

    _starts: list = PrivateAttr(default_factory=list)

    @property
    def starts(self) -> list:
        return self._starts

    @contextlib.contextmanager
    def serve(self, variant, config, engine_args=None, start_timeout_s=None, cache_dir=None):
        self.starts.append((variant.precision, {k: config.params[k] for k in
                                                ("max_model_len", "max_num_seqs")}))
        served_name = config.served_name
        running = RunningEngine(base_url=f"http://stand-in/{variant.precision}", port=0, pid=0,
                                served_name=served_name, log_path=Path("/dev/null"), argv=[],
                                dropped_args=[])
        running.phases.first_token_s = 0.0
        yield running


class RecordedEvaluator:
    """The Evaluator's served mode answered from recorded per-item results (the first `limit`
    items, as lm-eval takes them), per precision by the served variant's path."""

    def __init__(self, by_path: dict[str, dict[str, TaskScore]]):
        self.by_path, self.calls = by_path, []

    def evaluate_served(self, base_url, served_name, tokenizer_dir, tasks, limit=None,
                        max_length=None, items=None) -> EvalRun:
        scores = self.by_path[str(tokenizer_dir)]
        self.calls.append((Path(tokenizer_dir).name, tuple(tasks),
                           limit if items is None else
                           {t: (min(i), max(i) + 1) for t, i in items.items()}, max_length))
        results, samples, sizes = {}, {}, {}
        for t in tasks:
            s = scores[t]
            items_ = (sorted(s.per_item.items())[:limit] if items is None else
                      [(i, s.per_item[i]) for i in items[t]])
            metric = METRICS[t]
            results[t] = {f"{metric},none": sum(v for _, v in items_) / len(items_),
                          "sample_len": len(items_)}
            samples[t] = [{"doc_id": i, metric: v} for i, v in items_]
            sizes[t] = s.size
        return EvalRun(results, samples, 0.0, sum(len(v) for v in samples.values()), sizes)


def first(scores: dict[str, TaskScore], n: int) -> dict[str, TaskScore]:
    out = {}
    for t, s in scores.items():
        items = dict(sorted(s.per_item.items())[:n])
        out[t] = TaskScore(task=t, metric=s.metric, value=sum(items.values()) / n, stderr=None, n=n,
                           per_item=items, size=s.size)
    return out


@pytest.fixture
def world(cpu, tmp_path, config_dir):
    """SmolLM2's recorded bf16 results standing for every precision, with NVFP4 broken when
    served (planted): in process, NVFP4 and FP8 score as bf16 did."""
    in_process = load_scores(cpu["in_process"]["bf16"])
    served = load_scores(cpu["served"]["bf16"])
    ckpt = tmp_path / "m" / "rev"
    variants = []
    for p in ("nvfp4", "fp8"):
        d = tmp_path / "m" / "rev.variants" / p
        d.mkdir(parents=True)
        variants.append(QuantizedVariant(precision=p, path=str(d), state_path=str(d) + ".pt",
                                         total_bytes=1, content_hash=f"hash-{p}",
                                         export_valid=True))
    ckpt.mkdir(parents=True)
    qset = QuantizedSet("m", str(ckpt), 1, tuple(variants))
    checkpoint = CheckpointRef(model="m", source="s3://models/m/", revision="rev", path=str(ckpt),
                               content_hash="hash-bf16", total_bytes=1)
    n = min(s.n for s in in_process.values())
    gates = gates_for(cpu).model_copy(update={"min_items": n})
    records = tuple(AccuracyRecord(p, "in_process", f"hash-{p}", in_process)
                    for p in ("bf16", "nvfp4", "fp8"))
    accuracy = AccuracyReport("m", (), tuple(GateOutcome(precision=p, passed=True,
                                                         reason="in process: pass")
                                             for p in ("nvfp4", "fp8")), {}, records)
    by_path = {str(ckpt): served, variants[0].path: lose(served, "onb_arith_gen", every=2),
               variants[1].path: served}
    spec = ModelSpec(id="m", source="s3://models/m/", served_name="m",
                     engine_args={"max_model_len": 2048, "max_num_seqs": 64})
    configs = ConfigFiles(config_dir=str(config_dir), discovered_dir=str(tmp_path / "found"))
    return {"qset": qset, "checkpoint": checkpoint, "gates": gates, "accuracy": accuracy,
            "by_path": by_path, "spec": spec, "configs": configs, "served": served, "n": n}


def run(world, hardware="sm100", accuracy=None):
    engine = GpuEngineStandIn(configs=world["configs"], hardware=hardware)
    evaluator = RecordedEvaluator(world["by_path"])
    report = served_report(engine, evaluator, world["spec"], world["checkpoint"],
                           world["qset"], accuracy or world["accuracy"], world["gates"])
    return report, engine, evaluator


def test_every_precision_is_served_once_on_the_in_process_items_and_judged(world):
    report, engine, evaluator = run(world)
    assert [p for p, _ in engine.starts] == ["bf16", "nvfp4", "fp8"]
    # the model's production parameters, in the configuration serving_config would build
    assert engine.starts[0][1] == {"max_model_len": 2048, "max_num_seqs": 64}
    in_process = world["accuracy"].record("bf16").scores
    for _, tasks, limit, _ in evaluator.calls:  # the same items as in process, task by task
        assert all(in_process[t].n == limit for t in tasks)
    assert {c[3] for c in evaluator.calls} == {2048}  # lm-eval's max length: the engine's
    assert [r.source for r in report.records] == ["served"] * 3
    assert report.record("nvfp4").content_hash == "hash-nvfp4"
    # NVFP4 served is broken (planted): its served gate fails against bf16 served, and it
    # disagrees with its in-process score; FP8 served scores as bf16 served: it passes
    assert report.gate("nvfp4").verdict == "fail" and report.gate("nvfp4").source == "served"
    assert report.gate("fp8").verdict == "pass" and report.gate("fp8").passed
    assert report.agreement("nvfp4").verdict == "disagree"
    assert "export or kernel problem" in report.agreement("nvfp4").reason
    assert report.agreement("fp8").verdict == report.agreement("bf16").verdict != "disagree"
    assert report.not_served == {}


def test_the_served_gate_decides_and_serving_variant_falls_back_on_it(world):
    report, _, _ = run(world)
    qset, accuracy = world["qset"], world["accuracy"]
    gate, why = deciding_gate("nvfp4", qset.get("nvfp4"), accuracy, report)
    assert gate.source == "served" and not gate.passed and why.startswith("served")
    assert accuracy.gate("nvfp4").passed  # in process it had passed
    chosen, skipped = choose_precision(["nvfp4", "fp8", "bf16"], qset, accuracy, report)
    assert chosen == "fp8"
    assert skipped["nvfp4"].startswith("accuracy gate failed (served): onb_arith_gen: drop")


def test_on_the_cpu_engine_only_bf16_is_served_and_the_in_process_gate_decides(world):
    report, engine, _ = run(world, hardware="cpu")
    assert [p for p, _ in engine.starts] == ["bf16"]
    assert set(report.not_served) == {"nvfp4", "fp8"}
    assert "vllm on cpu serves bf16, not nvfp4" in report.not_served["nvfp4"]
    assert report.gates == () and report.agreement("bf16") is not None
    gate, why = deciding_gate("nvfp4", world["qset"].get("nvfp4"), world["accuracy"], report)
    assert gate.source == "in_process" and why.startswith("in process: not served here (vllm")


def test_an_inconclusive_served_gate_restarts_the_engines_for_more_items(world):
    """In process scored 20 items; served on those 20, NVFP4's planted fault (every 7th
    arithmetic answer wrong) is not yet decisive, so bf16 and NVFP4 are served again on more
    recorded items of that task (up to the task's size here), and the gate decides there. Twenty
    identical answers do not prove FP8 within 0.03 either (the adjusted interval is ±0.11 wide),
    so FP8 is served again on what 20 items left undecided, and nothing else is."""
    size, served, gates = world["n"], world["served"], world["gates"]
    for scores in world["by_path"].values():  # the recorded items are the whole task here
        for t, s in list(scores.items()):
            scores[t] = TaskScore(task=t, metric=s.metric, value=s.value, stderr=None, n=s.n,
                                  per_item=s.per_item, size=size)
    nvfp4_served = lose(world["by_path"][world["checkpoint"].path], "onb_arith_gen", every=7)
    world["by_path"][world["qset"].get("nvfp4").path] = nvfp4_served
    world["gates"] = gates = gates.model_copy(update={"min_items": 20})
    at20 = {p: judge_variant(p, first(served, 20), first(scores, 20), gates)
            for p, scores in (("nvfp4", nvfp4_served), ("fp8", served))}
    assert at20["nvfp4"].verdict == "inconclusive"
    undecided = {(p, v.task) for p, g in at20.items() for v in g.verdicts
                 if v.verdict == "inconclusive"}
    short = AccuracyReport("m", (), world["accuracy"].gates, {}, tuple(
        AccuracyRecord(r.precision, r.source, r.content_hash, first(r.scores, 20))
        for r in world["accuracy"].records))
    report, engine, evaluator = run(world, accuracy=short)
    starts = [p for p, _ in engine.starts]
    assert starts[:3] == ["bf16", "nvfp4", "fp8"] and len(starts) > 3
    assert set(starts[3:]) == {"bf16"} | {p for p, _ in undecided}
    more = evaluator.calls[3:]
    assert {(c[0], t) for c in more if c[0] != "rev" for t in c[1]} <= undecided
    # each restart scores only the items after those already scored (the ranges follow on)
    ranges = [c[2]["onb_arith_gen"] for c in more if c[0] == "nvfp4"]
    assert [lo for lo, _ in ranges] == [20] + [hi for _, hi in ranges[:-1]]
    limits = [hi for _, hi in ranges]
    assert limits == sorted(limits) and limits[0] >= 40  # at least doubled each round
    gate = report.gate("nvfp4")
    assert gate.items == limits[-1] == report.record("nvfp4").scores["onb_arith_gen"].n
    assert gate.verdict != "inconclusive" or gate.items == size
    assert len(gate.looks["onb_arith_gen"]) >= 2  # each look kept, the last judged after them
    final = judge_variant("nvfp4", report.record("bf16").scores,
                          report.record("nvfp4").scores, gates, gate.looks)
    assert (gate.verdict, gate.passed) == (final.verdict, apply_policy(final, gates).passed)


def test_recorded_h200_run_replays_to_the_verdicts_it_recorded():
    """An H200 recording (2026-12-02, vLLM 0.22.0, CUDA graphs on): SmolLM2 bf16 and FP8 scored
    in process and through the engine on all items. NVFP4 is not in it: configs/stack.yaml does
    not serve NVFP4 on sm90, and an earlier override was refused by vLLM's Marlin FP4
    kernel at SmolLM2's 576-wide shapes (tests/data/gpu/h200-client-accounting/engine-logs/)."""
    data = recorded(GPU)
    gates = gates_for(data)
    in_process = {p: load_scores(r) for p, r in data["in_process"].items()}
    served = {p: load_scores(r) for p, r in data["served"].items()}
    assert set(served) == set(data["settings"]["precisions"]) == {"bf16", "fp8"}
    assert not data["not_served"], data["not_served"]
    for p, found in data["agreements"].items():
        assert agreement(p, in_process[p], served[p], gates).verdict == found["verdict"], p
    bf16 = agreement("bf16", in_process["bf16"], served["bf16"], gates)
    assert bf16.verdict != "disagree", bf16.reason  # vLLM's bf16 is the checkpoint as it is
    # the served gate, re-judged from the served per-item scores, is what decided FP8
    recorded_gate = data["served_gates"]["fp8"]
    fp8 = judge_variant("fp8", served["bf16"], served["fp8"], gates, recorded_gate.get("looks"))
    decided = apply_policy(fp8, gates)
    assert (recorded_gate["verdict"], recorded_gate["passed"]) == (fp8.verdict, decided.passed)
    assert data["deciding"]["fp8"]["source"] == "served"
    assert (data["deciding"]["fp8"]["verdict"], data["deciding"]["fp8"]["passed"]) == (
        fp8.verdict, decided.passed)
    # and the variant served follows from it: FP8 when its gate passed, else the baseline
    assert data["serving_variant"]["precision"] == ("fp8" if decided.passed else "bf16")
    # the gate that decided each variant, re-judged from the scores of the source it names
    for p, found in data["deciding"].items():
        if "verdict" not in found:
            continue  # nothing decided it (not quantized): its `why` says so
        scores = served if found["source"] == "served" else in_process
        again = apply_policy(judge_variant(p, scores["bf16"], scores[p], gates,
                                           found.get("looks")), gates)
        assert (again.verdict, again.passed) == (found["verdict"], found["passed"]), p


def test_recorded_h200_in_process_gates_replay_to_the_verdicts_recorded():
    """The client-accounting H200 recording (tests/data/gpu/h200-client-accounting) scored bf16, FP8 and
    NVFP4 in process on every item (its served phase did not finish): each gate it recorded,
    re-judged here from the recorded per-item scores with the run's gates, is the one recorded."""
    data = gpu_recorded("client_accounting", "served_accuracy_smollm2")
    gates = gates_for(data)
    scores = {p: load_scores(r) for p, r in data["in_process"].items()}
    assert set(scores) == {"bf16", "fp8", "nvfp4"} and "served" not in data
    assert set(data["in_process_gates"]) == {"fp8", "nvfp4"}
    for p, found in data["in_process_gates"].items():
        again = apply_policy(judge_variant(p, scores["bf16"], scores[p], gates,
                                           found["looks"]), gates)
        assert (again.verdict, again.passed, again.reason, again.items) == (
            found["verdict"], found["passed"], found["reason"], found["items"]), p
        assert found["source"] == "in_process"
