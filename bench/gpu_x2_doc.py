"""Two H200s of one host: what the plan expects, written before the run, and docs/gpu.md's
generated sections for it.

    .venv/bin/python bench/gpu_x2_doc.py expect     # tests/data/gpu/h200x2/expected/plan.json
    .venv/bin/python bench/gpu_x2_doc.py [--check]  # docs/gpu.md's two h200x2 sections

`expect` runs the project's own code on a CPU: the plan (onboarding/deploy/plan.py, as
assets/deploy.py's build_plan does for a twin) and the serving configurations of the twins
(onboarding/deploy/serving_plan.py) on configs pinned to the H200's recorded versions (the
SLO-target recording's prepare.json, as bench/gpu_serving.py `prepare` pins them there), the TP
override of `--tp` (bench/gpu_serving.py), AIConfigurator's predictions at the steps' points corrected by the H200
calibration (onboarding/predictions/predict.py, resources/predictor.py; about a minute), the interconnect
thresholds of configs/acceptance.yaml and the noisy-neighbour bound. Every number carries its
source; nothing in it is measured on two GPUs. The device minutes per step are estimates from
the one-GPU recordings' timings, each with the recording it rests on.

The default writes the sections from plan.json and the recordings under tests/data/gpu/h200x2/
(re-judged by bench/gpu_recordings_x2.py, the functions the replay tests use); `--check`
writes nothing and exits 1 when the page differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench.gpu_recordings import folder
from bench.gpu_recordings_x2 import (
    DEVICE_STEPS,
    EXPECTED,
    expected,
    judge_interconnect,
    judge_neighbour,
    judge_twin,
    recorded_interconnect_checks,
    recording,
    tp_gain,
    twin_steps,
)
from onboarding.common.tables import md_table, splice_generated

DOC = ROOT / "docs" / "gpu.md"
TWIN_8B, TWIN_70B = "llama-3-1-8b-instruct-twin", "llama-3-1-70b-instruct-twin"
PINNED_RECORDING = folder("slo_target")  # the versions the x2 plan is pinned to
GIB = 1 << 30
# What the steps run (bench/gpu_device.sh's defaults): item -> (twin, precision, TP override)
ITEMS = {"x2-twins": [("llama-3-1-70b-instruct-twin:fp8", TWIN_70B, "fp8", None)],
         "x2-tp": [(f"llama-3-1-8b-instruct-twin:fp8@tp{tp}", TWIN_8B, "fp8", tp)
                   for tp in (1, 2)]}
CONCURRENCY = [1, 8, 32, 64]
CHAT = (512, 256)  # the gpu profile's chat scenario (configs/scenarios.yaml)
# Device minutes per step: estimates, each from a recorded one-GPU timing (docs/gpu.md).
MINUTES = [
    ("machine start + pieces 0-6", 2.1, ("the SLO-target recording (tests/data/gpu/"
     "h200-slo-target/): machine start and seven pieces 2.1 min")),
    ("install (BURN_S=0) + x2-plan", 2.5, ("the SLO-target recording: install and onboard A "
     "4.5 min, of which SmolLM2's job A 151 s (h200-slo-target/onboard-A.json), which x2-plan "
     "leaves out; the twins' jobs 1.7 s each there")),
    ("x2-interconnect", 2.0, ("the node probe with a 30 s burn took 59.5 s on one GPU "
     "(h200/prepare.json node_probe, the stages recording); two GPUs add the P2P pairs, the "
     "NCCL start and 3 sizes")),
    ("x2-twins", 4.5, ("the 70B FP8 twin was ready in 149 s on one GPU (h200-performance-twins/),"
     " the 8B twin's step with 4 points took 184 s (h200/twins.json, the stages recording); "
     "TP 2 start not measured")),
    ("x2-tp", 6.0, ("the 8B ladder of two twins x 6 points took 7.1 min (8B ready in 98-113 s; "
     "h200-client-accounting/twins.json); here two starts x 4 points")),
    ("x2-neighbour", 4.0, ("two 8B bf16 starts side by side (ready in 106 s) and three "
     "`vllm bench serve` runs of 256 prompts at c=32 (8B bf16 at c=32: 4,297 tokens/s; both "
     "h200-client-accounting/twins.json)")),
]


# ---- expect ----

def pinned_files(work: Path):
    """ConfigFiles over configs/ pinned as the device pins them (vLLM 0.22.0 there)."""
    import gpu_serving

    from resources.config_files import ConfigFiles

    versions = json.loads((PINNED_RECORDING / "prepare.json").read_text())["steps"]["versions"]
    cfg, _ = gpu_serving.pinned_configs(work, {k: v for k, v in versions.items()
                                               if k != "at_s"})
    return ConfigFiles(config_dir=str(cfg))


def twin_plan(cf, twin: str, work: Path):
    """As assets/deploy.py build_plan for a twin: the shape from its fetched config.json, the
    catalog's declared parameters, no gate."""
    from onboarding.deploy.plan import (
        Measured,
        param_count_from_safetensors,
        plan,
        plan_inputs,
        shape_from_checkpoint,
    )
    from onboarding.fetch.twins import twin_source_dir

    src = twin_source_dir(twin, work / twin)
    nodes = cf.nodes()
    return plan(plan_inputs(cf.spec(twin), nodes, shape_from_checkpoint(src), Measured(),
                            param_count_from_safetensors(src)), nodes)


def plan_section(cf, work: Path) -> dict[str, Any]:
    out = {}
    for twin in (TWIN_70B, TWIN_8B):
        n = twin_plan(cf, twin, work).node("h200")
        out[twin] = {
            "precision": n.precision, "tensor_parallel": n.tensor_parallel,
            "gpu_ids": list(n.gpu_ids), "tp_basis": n.tp_basis, "reason": n.reason,
            "rejected": list(n.rejected), "weights_gib": round(n.weight_bytes / GIB, 2),
            "weights_gib_per_gpu": round(n.weight_bytes_per_gpu / GIB, 2),
            "kv_gib_per_gpu": round(n.kv_bytes_per_gpu / GIB, 2),
            "reserve_gib_per_gpu": round(n.reserve_bytes_per_gpu / GIB, 2),
            "budget_gib_per_gpu": round(n.budget_bytes_per_gpu / GIB, 2),
            "headroom_gib_per_gpu": round(n.headroom_bytes_per_gpu / GIB, 2),
            "max_sequences_at_context": n.max_sequences_at_context,
            "source": "onboarding/deploy/plan.py plan_node on configs/nodes.yaml (memory rule: weights "
                      "by bytes per parameter + KV for target concurrency x context + reserve "
                      "within gpu_memory_utilization of HBM)"}
    return out


def configurations(cf, work: Path) -> dict[str, Any]:
    import gpu_serving

    from onboarding.deploy.serving_plan import serving_plan

    recorded = json.loads((PINNED_RECORDING / "onboard-A.json").read_text())["assets"]
    nodes, stack = cf.nodes(), cf.stack()
    template = cf.stack().templates[stack.engine]
    out = {}
    for step, items in ITEMS.items():
        for item, twin, precision, tp in items:
            spec = cf.spec(twin)
            config = serving_plan(spec, twin_plan(cf, twin, work), nodes, stack,
                                  template).config("h200")
            planned = config.hash
            note = "planned"
            if tp:
                config, note = gpu_serving.with_tensor_parallel(config, tp, note)
            device = recorded[twin]["serving_config"]["config_hashes"]["h200"]
            out[item] = {
                "step": step, "config_hash": config.hash, "basis": note,
                "tensor_parallel": config.tensor_parallel,
                "cuda_visible_devices": ",".join(map(str, range(config.tensor_parallel))),
                "engine_args": config.args("<variant path>", 0, "127.0.0.1")[1:],
                "planned_hash_recorded_on_the_h200": device,
                "planned_hash_here": planned, "planned_hash_matches_the_h200": planned == device,
                "source": "onboarding/deploy/serving_plan.py on configs pinned to the SLO-target "
                          "recording's versions (h200-slo-target/prepare.json); "
                          "the recorded hash from tests/data/gpu/h200-slo-target/"
                          "onboard-A.json"}
    return out


def predictions(cf) -> dict[str, Any]:
    """AIConfigurator at every step point, corrected by the H200 calibration; or why not."""
    from onboarding.predictions.predict import (
        calibrate_points,
        correct,
        make_request,
        model_config_for,
        slo_verdict,
    )
    from onboarding.serving.profiles import resolve_slo
    from resources.predictor import AIConfiguratorPredictor, missing_reason

    if missing_reason():
        return {"not_predicted": missing_reason()}
    predictor, cfg = AIConfiguratorPredictor(), cf.predict()
    cal, _ = calibrate_points(cfg, cf.measured_points(), predictor.predict, predictor.version())
    out: dict[str, Any] = {"calibration": cal.rows(), "rows": [],
                           "scenario": {"input_tokens": CHAT[0], "output_tokens": CHAT[1]},
                           "kv_cache": "the plan's (auto: bf16), as the calibration points were "
                                       "predicted; vLLM runs the FP8 export's KV in FP8"}
    for items in ITEMS.values():
        for item, twin, precision, tp in items:
            spec = cf.spec(twin)
            slo = resolve_slo(cf.slo_section(), "h200", spec)
            model_config, _ = model_config_for(spec, json.loads(
                (ROOT / "twins" / twin / "config.json").read_text()))
            tp_ = tp or (2 if twin == TWIN_70B else 1)
            for c in CONCURRENCY:
                p = predictor.predict(make_request(cfg, twin, model_config, "h200", precision,
                                                   tp_, c, input_tokens=CHAT[0],
                                                   output_tokens=CHAT[1]))
                fixed = correct(p, cal)
                ok, why = slo_verdict(fixed, slo) if c == slo.target_concurrency else (None, "")
                out["rows"].append({
                    "item": item, "tp": tp_, "concurrency": c, "status": p.status,
                    "ttft_ms": p.ttft_ms, "tpot_ms": p.tpot_ms,
                    "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
                    "corrected_ttft_ms": fixed.ttft_ms, "corrected_tpot_ms": fixed.tpot_ms,
                    "corrected_tokens_per_s_per_gpu": fixed.tokens_per_s_per_gpu,
                    "slo_at_target": ok, "slo_why": why, "basis": fixed.basis})
    return out


def expect(args) -> int:
    from bench.gpu_recordings_x2 import interconnect_setting

    with tempfile.TemporaryDirectory(prefix="x2-expect-") as tmp:
        work = Path(tmp)
        cf = pinned_files(work)
        t = interconnect_setting(2).thresholds
        spec70 = cf.spec(TWIN_70B)
        from onboarding.serving.profiles import resolve_slo

        body = {
            "format": "h200x2-expectations/1",
            "written_by": "bench/gpu_x2_doc.py expect (CPU; nothing here measured on two GPUs)",
            "points": {"scenario": "chat", "input_tokens": CHAT[0], "output_tokens": CHAT[1],
                       "concurrency": CONCURRENCY,
                       "source": "bench/gpu_device.sh x2-twins / x2-tp defaults"},
            "slo": {**vars(resolve_slo(cf.slo_section(), "h200", spec70)),
                    "source": "configs/gates.yaml slo, resolved by onboarding/serving/profiles.py "
                              "resolve_slo for h200"},
            "plan": plan_section(cf, work),
            "configurations": configurations(cf, work),
            "predictions": predictions(cf) if not args.no_predict else
            {"not_predicted": "--no-predict"},
            "interconnect": {
                "allreduce_busbw_min_gbps_tp2": t.interconnect.allreduce_busbw_min_gbps.get(2),
                "p2p_min_gbps": t.interconnect.p2p_min_gbps,
                "nvlinks_per_gpu": t.nvlinks_per_gpu,
                "probe": {"p2p_mib": cf.acceptance().probe.p2p_mib,
                          "allreduce_sizes_mib": list(cf.acceptance().probe.allreduce_sizes_mib)},
                "busbw": "nccl-tests' formula, 2 (n - 1) / n x bytes / time",
                "source": "configs/acceptance.yaml (node_types.h200.interconnect, defaults, "
                          "probe), judged by onboarding/nodes/acceptance/ interconnect_checks"},
            "neighbour": {"bound": 0.10, "model": TWIN_8B, "precision": "bf16",
                          "rule": "a model's TTFT p95 or mean ITL together / alone above 1 + "
                                  "bound fails", "concurrency": 32, "prompts": 256,
                          "input_tokens": 512, "output_tokens": 256,
                          "source": "scripts/gpu_noisy_neighbour.py degradation and "
                                    "its defaults"},
            "device_minutes": [{"step": s, "minutes": m, "basis": b} for s, m, b in MINUTES],
            "device_minutes_total": round(sum(m for _, m, _ in MINUTES), 1)}
    EXPECTED.parent.mkdir(parents=True, exist_ok=True)
    EXPECTED.write_text(json.dumps(body, indent=1, default=str) + "\n")
    print(f"wrote {EXPECTED.relative_to(ROOT)}")
    return 0


# ---- doc ----

def _n(v, digits: int = 3) -> str:
    return "" if v is None else f"{v:.{digits}g}"


def expectations_section() -> str:
    e = expected()
    p70, p8 = e["plan"][TWIN_70B], e["plan"][TWIN_8B]
    lines = [
        (f"From `{EXPECTED.relative_to(ROOT)}` (`bench/gpu_x2_doc.py expect`, on a CPU; nothing "
        "in it was measured on two GPUs)."), "",
        (f"**The plan for the 70B FP8 twin on h200**: {p70['precision']}, TP "
        f"{p70['tensor_parallel']} on GPUs {p70['gpu_ids']} ({p70['tp_basis']}): "
        f"{p70['reason']}. Rejected: {'; '.join(p70['rejected']) or 'none'}. Per GPU: weights "
        f"{p70['weights_gib_per_gpu']} GiB + KV {p70['kv_gib_per_gpu']} GiB + reserve "
        f"{p70['reserve_gib_per_gpu']} GiB, headroom {p70['headroom_gib_per_gpu']} GiB "
        f"({p70['max_sequences_at_context']} sequences at full context). Source: "
        f"{p70['source']}."), "",
        (f"The 8B FP8 twin: TP {p8['tensor_parallel']} ({p8['reason']}); `x2-tp` runs it at TP 1 "
        "and, overriding the plan, TP 2."), ""]
    rows = [{"item": k, "step": v["step"], "TP": v["tensor_parallel"],
             "CUDA_VISIBLE_DEVICES": v["cuda_visible_devices"], "configuration": v["config_hash"],
             "basis": v["basis"], "planned hash = the H200's recorded":
             f"{'yes' if v['planned_hash_matches_the_h200'] else 'NO'} "
             f"({v['planned_hash_recorded_on_the_h200']})",
             "engine args": " ".join(v["engine_args"])} for k, v in e["configurations"].items()]
    lines += [md_table(rows), ""]
    pr = e["predictions"]
    if "rows" in pr:
        lines += [(f"AIConfigurator's prediction at chat {CHAT[0]}/{CHAT[1]} (batch = "
                  "concurrency), raw and corrected by the H200 calibration; the SLO verdict of "
                  "the corrected prediction at the target:"), "",
                  md_table([{"item": r["item"], "c": r["concurrency"], "status": r["status"],
                             "TTFT ms": _n(r["ttft_ms"]), "TPOT ms": _n(r["tpot_ms"]),
                             "tokens/s/GPU": _n(r["tokens_per_s_per_gpu"], 4),
                             "corrected TTFT ms": _n(r["corrected_ttft_ms"]),
                             "corrected TPOT ms": _n(r["corrected_tpot_ms"]),
                             "corrected tokens/s/GPU": _n(r["corrected_tokens_per_s_per_gpu"], 4),
                             "SLO at target": {True: "pass", False: "fail"}.get(
                                 r["slo_at_target"], "")} for r in pr["rows"]]), "",
                  f"Basis: {pr['rows'][0]['basis']}. KV cache: {pr['kv_cache']}.", ""]
    else:
        lines += [f"Predictions: not made ({pr['not_predicted']}).", ""]
    ic, nb = e["interconnect"], e["neighbour"]
    slo = e["slo"]
    lines += [
        (f"SLO judged at concurrency {slo['target_concurrency']}: TTFT p95 within "
        f"{slo['ttft_p95_s']} s, mean ITL within {slo['itl_mean_ms']} ms, error rate at most "
        f"{slo['error_rate_max']} ({slo['source']})."), "",
        (f"Interconnect thresholds: all-reduce over 2 GPUs peak bus bandwidth >= "
        f"{ic['allreduce_busbw_min_gbps_tp2']:.0f} GB/s, every P2P pair >= "
        f"{ic['p2p_min_gbps']:.0f} GB/s with peer access, {ic['nvlinks_per_gpu']} NVLinks per "
        f"GPU; probe sizes P2P {ic['probe']['p2p_mib']} MiB, all-reduce "
        f"{ic['probe']['allreduce_sizes_mib']} MiB ({ic['source']})."), "",
        (f"Noisy neighbour: {nb['rule']}, bound {nb['bound']:.0%}; {nb['model']} {nb['precision']}"
        f" twice, c={nb['concurrency']}, {nb['prompts']} prompts {nb['input_tokens']}/"
        f"{nb['output_tokens']} ({nb['source']})."), "",
        md_table([{"step": m["step"], "device minutes (estimate)": m["minutes"],
                   "rests on": m["basis"]} for m in e["device_minutes"]]), "",
        f"Total estimate: {e['device_minutes_total']} minutes on the two-GPU machine."]
    return "\n".join(lines)


def results_section() -> str:
    out = []
    for phase, step in DEVICE_STEPS.items():
        rec = recording(phase)
        if rec is None:
            out.append(f"- `{phase}`: not recorded yet (`{step}`).")
            continue
        if phase in ("x2-twins", "x2-tp"):
            steps = twin_steps(rec)
            for k, s in steps.items():
                j = judge_twin(s)
                out.append(f"- `{phase}` {k}: TP {j['tensor_parallel']}, ready after "
                           f"{s.get('ready_s')} s, SLO at the target **"
                           f"{'met' if j['slo_pass'] else 'missed'}** ("
                           f"{'; '.join(j['violations']) or 'no violation'}), headline "
                           f"{j['tokens_per_s_per_gpu']:.0f} tokens/s/GPU ({j['basis']}).")
            tps = sorted(steps.values(), key=lambda s: int(s["tensor_parallel"]))
            if phase == "x2-tp" and len(tps) == 2:
                g = tp_gain(tps[0], tps[1], 32)
                out.append(f"- `x2-tp` at c=32, TP 2 over TP 1: tokens/s/GPU "
                           f"x{g['tokens_per_s_per_gpu']:.2f}, TTFT p95 x{g['ttft_p95']:.2f}, "
                           f"mean ITL x{g['itl_mean']:.2f}.")
        elif phase == "x2-neighbour":
            res = rec.get("result") or {}
            if "alone" not in res:
                out.append(f"- `x2-neighbour`: no measurement (rc {rec['rc']}).")
                continue
            v = judge_neighbour(res, rec["bound"])
            verdict = "pass" if all(d["within"] for d in v.values()) else "fail"
            out.append("- `x2-neighbour`: " + "; ".join(
                f"{m} {'within' if d['within'] else 'beyond'} the bound ("
                + ", ".join(f"{k} x{r:.3f}" for k, r in d["ratios"].items()) + ")"
                for m, d in v.items()) + f": **{verdict}**.")
        else:
            j = judge_interconnect(rec.get("interconnect"))
            out.append("- `x2-interconnect` re-judged: " + ", ".join(
                f"{k} {v}" for k, v in j.items()) + "; on the device: " + ", ".join(
                f"{k} {v}" for k, v in recorded_interconnect_checks(rec).items()) + ".")
    return "\n".join(out)


def regenerated(doc: str) -> str:
    doc = splice_generated(doc, "h200x2 expectations", expectations_section())
    return splice_generated(doc, "h200x2 results", results_section())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", nargs="?", default="doc", choices=["doc", "expect"])
    ap.add_argument("--check", action="store_true", help="doc: write nothing; exit 1 if stale")
    ap.add_argument("--no-predict", action="store_true", help="expect: leave AIConfigurator out")
    ap.add_argument("--doc", type=Path, default=DOC)
    args = ap.parse_args()
    if args.phase == "expect":
        return expect(args)
    doc = args.doc.read_text()
    new = regenerated(doc)
    if args.check:
        if new != doc:
            print(f"{args.doc}: the h200x2 sections are stale; run bench/gpu_x2_doc.py")
            return 1
        print(f"{args.doc}: the h200x2 sections are current")
        return 0
    args.doc.write_text(new)
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
