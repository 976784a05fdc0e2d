"""The recordings from two H200s of one host (`tests/data/gpu/h200x2/<phase>.json`, written by the
device steps of bench/gpu_device.sh) and the functions that re-judge them with the project's own
rules: the SLO verdict by `serving_stats.headline`, TP 1 against TP 2 at one concurrency, the
noisy-neighbour rule of scripts/gpu_noisy_neighbour.py (`degradation`), the interconnect by
onboarding.nodes.acceptance's checks at configs/acceptance.yaml's thresholds.

A phase not yet recorded reads as None; the replay tests then skip naming the device step.
bench/gpu_x2.py's doc section and the replay tests both call these, so what the page says is
what the tests hold.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from bench.gpu_recordings import points
from onboarding.common.paths import PROJECT_ROOT
from onboarding.nodes import acceptance as acc
from onboarding.serving.stats import Slo, headline
from resources.config_files import ConfigFiles

X2 = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200x2"
EXPECTED = X2 / "expected" / "plan.json"
NODE_TYPE = "h200"
# recording -> the device call that writes it (docs/gpu.md, "Two H200s")
DEVICE_STEPS = {
    "x2-interconnect": "bash bench/gpu_device.sh x2-interconnect",
    "x2-twins": "bash bench/gpu_device.sh x2-twins",
    "x2-tp": "bash bench/gpu_device.sh x2-tp",
    "x2-neighbour": "bash bench/gpu_device.sh x2-neighbour",
}
# the interconnect checks node acceptance makes where a node has more than one GPU
INTERCONNECT_CHECKS = ("interconnect", "allreduce_tp2", "p2p")


def recording(phase: str, root: Path = X2) -> dict[str, Any] | None:
    path = root / f"{phase}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def expected() -> dict[str, Any]:
    return json.loads(EXPECTED.read_text())


# ---- twins: the SLO verdict at the target, TP 1 against TP 2 ----

def twin_steps(rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The steps of a twins recording that swept (not skipped, not failed, not a dry run)."""
    return {k: v for k, v in rec["steps"].items()
            if v.get("rows") and not v.get("error") and not v.get("dry_run")}


def judge_twin(step: dict[str, Any]) -> dict[str, Any]:
    """One twin's sweep re-judged by the serving benchmark's own function, per GPU of its TP."""
    slo = Slo(**step["slo"])
    gpus = int(step["tensor_parallel"])
    result, basis, violations = headline(step["model"], step["precision"], NODE_TYPE, gpus, slo,
                                         points(step["rows"]), True)
    at = [r for r in step["rows"] if int(float(r["load"])) == slo.target_concurrency]
    return {"slo_pass": result.slo_pass, "violations": violations, "basis": basis,
            "tokens_per_s_per_gpu": result.tokens_per_s_per_gpu,
            "judged_at": result.judged_at, "tensor_parallel": gpus,
            "row_at_target_meets_slo": [str(r["meets_slo"]) == "True" for r in at]}


def _row_at(step: dict[str, Any], concurrency: int) -> dict[str, Any]:
    rows = [r for r in step["rows"] if int(float(r["load"])) == concurrency]
    if not rows:
        raise KeyError(f"{step['model']} TP {step['tensor_parallel']}: no point at "
                       f"concurrency {concurrency}")
    return rows[0]


def tp_gain(tp1: dict[str, Any], tp2: dict[str, Any], concurrency: int) -> dict[str, float]:
    """What the second GPU buys at one concurrency: TP 2 over TP 1 in output tokens/s per GPU,
    TTFT p95 and mean ITL (below 1: lower at TP 2)."""
    if int(tp1["tensor_parallel"]) >= int(tp2["tensor_parallel"]):
        raise ValueError("tp_gain(tp1, tp2): the first step must have the smaller TP")
    a, b = _row_at(tp1, concurrency), _row_at(tp2, concurrency)

    def per_gpu(row: dict[str, Any], step: dict[str, Any]) -> float:
        return float(row["output_tokens_per_s"]) / int(step["tensor_parallel"])

    return {"tokens_per_s_per_gpu": per_gpu(b, tp2) / per_gpu(a, tp1),
            "ttft_p95": float(b["ttft_p95_s"]) / float(a["ttft_p95_s"]),
            "itl_mean": float(b["itl_mean_ms"]) / float(a["itl_mean_ms"])}


# ---- noisy neighbour ----

def _neighbour_script():
    path = PROJECT_ROOT / "scripts" / "gpu_noisy_neighbour.py"
    spec = importlib.util.spec_from_file_location("gpu_noisy_neighbour", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def judge_neighbour(result: dict[str, Any], bound: float) -> dict[str, dict[str, Any]]:
    """The script's own rule (`degradation`: TTFT p95 or mean ITL rising more than `bound`
    with the neighbour loaded) on each model's alone and together numbers."""
    degradation = _neighbour_script().degradation
    return {m: degradation(result["alone"][m], result["together"][m], bound)
            for m in result["alone"]}


# ---- interconnect ----

def interconnect_setting(gpus: int = 2) -> acc.NodeSetting:
    """The shipped configs/acceptance.yaml for an h200 node of `gpus` GPUs."""
    configs = ConfigFiles()
    cfg = configs.acceptance()
    cfg = cfg.model_copy(update={"nodes": {"recorded": acc.NodeRegistration(
        node_type=NODE_TYPE, gpus=gpus)}})
    return acc.node_setting(cfg, configs.nodes(), "recorded", "test")


def judge_interconnect(raw: dict[str, Any] | None, gpus: int = 2) -> dict[str, str]:
    """check name -> pass | fail | not checked, from the probe's raw interconnect.json."""
    s = interconnect_setting(gpus)
    c = acc.Checker(s.thresholds)
    acc.interconnect_checks(s, gpus, raw, "" if raw is not None else "not recorded", c)
    return {ch.name: ch.status for ch in c.checks}


def recorded_interconnect_checks(rec: dict[str, Any]) -> dict[str, str]:
    """What the probe's node_acceptance said on the device for the interconnect checks."""
    return {r["check"]: r["result"] for r in rec.get("checks", [])
            if r["check"] in INTERCONNECT_CHECKS}
