"""The single index of the GPU recordings (tests/data/gpu/<folder>/, each folder's README says
what each file is, on which device and by which command), and their reader.

`RECORDINGS` names each recording by what it proves; `recorded(topic, name)` reads one of its
files. The recording of the project's stages end to end (`stages`) is read back into the typed
values the assets stored there, through the project's own code:

- the sweep's points from `serving_benchmark.csv` (`PointStats.from_row`), its result from
  them (`serving_stats.headline`, the asset's own headline);
- load timing from the `starts` table load_timing recorded (`summarize_load_timing`);
- the published variant, the serving variant and the accuracy gates from their metadata;
- the config directory it ran with: the repository's configs/ with the three files it
  changed (tests/data/gpu/h200/configs/) laid over it.

Only what a recording does not hold is reconstructed, and each such place says how.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import CheckpointRef, PublishedVariant, VariantRef
from onboarding.common.tables import read_md_table
from onboarding.quantize.variants import AccuracyReport, GateOutcome
from onboarding.serving.profiles import resolve_slo
from onboarding.serving.stats import (
    LoadTimingResult,
    PointStats,
    ServingBenchmarkResult,
    Slo,
    StartSample,
    headline,
    summarize_load_timing,
)
from resources.config_files import ConfigFiles

GPU_DATA = PROJECT_ROOT / "tests" / "data" / "gpu"
# topic -> its folder under tests/data/gpu/ (one H200, vLLM 0.22.0 unless its README says more)
RECORDINGS = {
    # the project's own stages on the H200: fetch, quantize and gate, publish, plan, the
    # manifests, load timing and the serving sweep of SmolLM2; the 8B FP8 twin
    "stages": "h200",
    # clients taking turns on one engine (what the client's own work costs the engine); the
    # 8B twin in bf16 and NVFP4 with the greedy client; served accuracy of SmolLM2
    "client_accounting": "h200-client-accounting",
    # the SLO judged at its target concurrency, which the sweep measured; the fixed client
    # against `vllm bench serve`
    "slo_target": "h200-slo-target",
    # vLLM and SGLang at the same points on one machine: the engine the plan chooses
    "engine_choice": "h200-engine-choice",
    # the 8B twin in bf16 on both engines, and three fully cold starts of SmolLM2
    "cold_start": "h200-cold-start",
    # one ingredient of the client's request body at a time against `vllm bench serve`
    "client_ingredients": "h200-client-ingredients",
    # four API server processes: the client's ITL against the engine's
    "api_servers": "h200-api-servers",
    # the peer's repeated default-seed prompts against fresh prompts per run; the NVFP4 twin
    # with the sampling client
    "peer_prompts": "h200-peer-prompts",
    # a warm-up round after each engine start: the client-accounting targets at 256 and 128
    "client_targets": "h200-client-targets",
    # the 8B twin's sweeps with fresh prompts per load point, the calibration's points
    "fresh_prompts": "h200-fresh-prompts",
}
# the frontend experiment's calls of a recording, in the order they ran (its README: which
# command ran each)
FRONTEND_CALLS = {
    "client_ingredients": ("frontend", "frontend-256", "frontend-128-256"),
    # vLLM --api-server-count 4
    "api_servers": ("frontend-asc4",),
    # four API servers, the peer with and without fresh prompts
    "peer_prompts": ("frontend-asc4-seeds-256", "frontend-asc4-seeds-128-32"),
    # four API servers, the warm-up round, the fresh-prompts peer
    "client_targets": ("frontend-asc4-seeds-more", "frontend-asc4-seeds-more2",
                       "frontend-asc4-seeds-256b"),
}
MODEL = "smollm2-135m"
NODE_TYPE = "h200"
RUN_CONFIG_HASH = "0660e584b7cc"  # serving_config's h200 configuration there (vLLM 0.22.0)
GPUS = 1  # one H200 (onboard-B: serving_benchmark `gpus`)


def folder(topic: str) -> Path:
    """The folder of the recording named `topic` in `RECORDINGS`."""
    if topic not in RECORDINGS:
        raise KeyError(f"no GPU recording {topic!r}; bench/gpu_recordings.py RECORDINGS names "
                       f"them: {', '.join(RECORDINGS)}")
    return GPU_DATA / RECORDINGS[topic]


H200 = folder("stages")


@cache
def recorded(topic: str, name: str) -> dict[str, Any]:
    """One file of a recording: `<name>.json` of the recording named `topic` (the device
    call's output, e.g. `prepare`, `onboard-A`, `twins`, `frontend`; its README lists them)."""
    return json.loads((folder(topic) / f"{name}.json").read_text())


def recording(name: str) -> dict[str, Any]:
    """`prepare`, `onboard-A`, `onboard-T`, `onboard-B` or `twins` of the stages' recording
    (bench/gpu_serving.py)."""
    return recorded("stages", name)


@cache
def fresh_prompt_requests(name: str) -> tuple[dict[str, Any], ...]:
    """The per-point request records of a fresh-prompts twins call (`<name>-requests.jsonl.gz`,
    bench/gpu_serving.py PointRecorder: one line per point, in the order the points ran)."""
    import gzip

    with gzip.open(folder("fresh_prompts") / f"{name}-requests.jsonl.gz", "rt") as f:
        return tuple(json.loads(line) for line in f)


# the fresh-prompts recording's twins calls, in the order they ran (its README: what each swept)
FRESH_PROMPT_CALLS = ("vllm-twins-1", "vllm-twins-2", "vllm-twins-3", "vllm-twins-4")


def fresh_prompt_sweeps() -> list[tuple[str, dict[str, Any], tuple[dict[str, Any], ...]]]:
    """Every sweep of the fresh-prompts recording in the order it ran: (call, its step, the step's request
    lines from the call's PointRecorder file, in point order)."""
    out = []
    for call in FRESH_PROMPT_CALLS:
        lines = fresh_prompt_requests(call)
        for key, step in recorded("fresh_prompts", call)["steps"].items():
            if step.get("rows"):
                out.append((call, step, tuple(x for x in lines if x["item"] == key)))
    return out


def flattered_sweeps() -> dict[str, tuple[str, dict[str, Any]]]:
    """Per precision, the 8B twin's sweep whose rows were the calibration points before the
    fresh-prompts recording (configs/predict/h200_points.json before it): (which recording, its
    step). Each ran before c5b0991, so every point after concurrency 1 re-sent earlier points'
    prompts."""
    twin = "llama-3-1-8b-instruct-twin"
    return {"fp8": ("engine-choice recording",
                    recorded("engine_choice", "vllm-twins")["steps"][f"{twin}:fp8"]),
            "bf16": ("cold-start recording",
                     recorded("cold_start", "vllm-twins")["steps"][f"{twin}:bf16"]),
            "nvfp4": ("peer-prompts recording",
                      recorded("peer_prompts", "vllm-twins-nvfp4")["steps"][f"{twin}:nvfp4"])}


def resent_before_fix(rows: list[dict[str, Any]]) -> list[int]:
    """How many of each point's requests re-sent a prompt an earlier point of the same sweep had
    sent, for a sweep measured before c5b0991 (its rows in the order they ran, one scenario):
    every point sent a prefix of one prompt list (`requests` of them: a fixed-concurrency point
    hands its bodies out in order and sends none after its deadline), so a point's overlap with
    the earlier ones is the shorter of its prefix and the longest earlier one."""
    out, longest = [], 0
    for row in rows:
        n = int(float(row["requests"]))
        out.append(min(n, longest))
        longest = max(longest, n)
    return out


def stats_of_point(line: dict[str, Any], slo: Slo | None = None) -> PointStats:
    """One PointRecorder line's requests summarized again by the asset's own `summarize`: the
    row's TTFT, TPOT, e2e and throughput figures. Each token gap is not kept (a count and a sum
    per request), so its ITL percentiles are not recomputed; the pooled mean is
    (`itl_mean_ms_of`)."""
    from onboarding.serving.stats import RequestRecord, summarize

    fields = line["fields"]
    records = []
    for values in line["records"]:
        r = dict(zip(fields, values, strict=True))
        r.pop("itl_n"), r.pop("itl_sum_s")
        records.append(RequestRecord(**r))
    return summarize(records, line["duration_s"], slo)


def itl_mean_ms_of(line: dict[str, Any]) -> float:
    """The pooled mean gap between tokens over a point's completed requests, in ms."""
    fields = line["fields"]
    ok, n, total = fields.index("ok"), fields.index("itl_n"), fields.index("itl_sum_s")
    done = [v for v in line["records"] if v[ok]]
    return 1e3 * sum(v[total] for v in done) / sum(v[n] for v in done)


def frontend_rows(topic: str) -> list[dict[str, Any]]:
    """Every row of a recording's frontend calls (`FRONTEND_CALLS[topic]`), in the order they
    ran, each tagged with the call it came from: run numbers restart with every call, so a run
    is (call, concurrency, run)."""
    return [{**r, "call": name} for name in FRONTEND_CALLS[topic]
            for r in recorded(topic, name)["steps"]["rows"]["rows"]]


def _configs_at(topic: str, target: Path) -> Path:
    """The repository's configs/ with a recording's pins laid over: the versions its `prepare`
    changed there (`changed`), and SGLang at the release its `sglang-twins` steps ran."""
    shutil.copytree(PROJECT_ROOT / "configs", target)
    stack = yaml.safe_load((target / "stack.yaml").read_text())
    changed = recorded(topic, "prepare")["steps"]["configs"]["changed"]
    for key, (_, new) in changed.items():
        if key.startswith("versions."):
            stack["versions"][key.split(".", 1)[1]] = new
    (sgl,) = {s["engine"] for s in recorded(topic, "sglang-twins")["steps"].values() if s.get("engine")}
    name, version = sgl.split(" ")
    stack["versions"][name] = version
    (target / "stack.yaml").write_text(yaml.safe_dump(stack, sort_keys=False))
    return target


def engine_choice_configs(target: Path) -> Path:
    """The configs at the engine-choice recording's pins. With these the plan reproduces
    every configuration hash it recorded, for both engines."""
    return _configs_at("engine_choice", target)


def bf16_engine_configs(target: Path) -> Path:
    """The configs at the bf16 engine pair's pins (the engine-choice recording's: vLLM 0.22.0,
    SGLang 0.5.17)."""
    return _configs_at("cold_start", target)


# what the engine-choice recording swept on both engines
ENGINE_CHOICE_MODELS = ("llama-3-1-8b-instruct-twin", MODEL)


def engine_choice_candidates(tmp: Path) -> tuple[ConfigFiles, dict[str, dict[str, Any]]]:
    """The configs at the engine-choice recording's pins and, per model it swept, its h200 configuration in
    every engine template there (engine -> EngineConfig), planned as serving_config plans it:
    SmolLM2 from its fetched shape and bf16 variant (the stages' recording's, the same
    checkpoint)."""
    from assets.deploy import build_plan
    from onboarding.deploy.engine_choice import engine_candidates
    from onboarding.deploy.serving_plan import serving_plan

    cf = ConfigFiles(config_dir=str(engine_choice_configs(tmp / "configs")))
    out = {}
    for model in ENGINE_CHOICE_MODELS:
        spec, nodes, stack = cf.spec(model), cf.nodes(), cf.stack()
        ckpt = None if spec.is_twin else checkpoint(tmp / model / "ckpt")
        variant = None if spec.is_twin else serving_variant(tmp / model / "variant")
        plan = build_plan(spec, nodes, ckpt, variant, None if spec.is_twin else ("bf16",))
        config = serving_plan(spec, plan, nodes, stack).config(NODE_TYPE)
        out[model] = engine_candidates(config, spec, stack.templates, cf.stack_config())[0]
    return cf, out


def bf16_engine_candidates(tmp: Path) -> tuple[ConfigFiles, dict[str, Any]]:
    """The 8B twin's bf16 configuration in every engine template at the bf16 pair's pins, as
    its steps ran it: the plan's h200 configuration (FP8, the twin's planned precision) with
    the precision replaced (bench/gpu_serving.py twin_target), then each engine's template."""
    from assets.deploy import build_plan
    from onboarding.deploy.engine_choice import engine_candidates
    from onboarding.deploy.serving_plan import serving_plan

    twin = ENGINE_CHOICE_MODELS[0]
    cf = ConfigFiles(config_dir=str(bf16_engine_configs(tmp / "configs")))
    spec, nodes, stack = cf.spec(twin), cf.nodes(), cf.stack()
    planned = serving_plan(spec, build_plan(spec, nodes, None, None, None), nodes,
                           stack).config(NODE_TYPE)
    bf16 = dataclasses.replace(planned, precision="bf16")
    return cf, engine_candidates(bf16, spec, stack.templates, cf.stack_config())[0]


def start_samples_from(starts_md: str) -> list[StartSample]:
    """load_timing's starts from its `starts` table (3 decimals there)."""
    def num(text: str) -> float | None:
        return float(text) if text else None

    return [StartSample(kind=r["kind"], resident_fraction=float(r["resident_fraction"]),
                        weights_loaded_s=num(r["weights_loaded_s"]),
                        engine_weights_load_s=num(r["engine_weights_load_s"]),
                        health_ready_s=num(r["health_ready_s"]),
                        first_token_s=float(r["first_token_s"]))
            for r in read_md_table(starts_md)]


def cold_start_load_timing() -> LoadTimingResult:
    """What load_timing stored in the cold-start recording (three fully cold starts, nothing else),
    recomputed from its starts."""
    md = recorded("cold_start", "onboard-T")["assets"][MODEL]["load_timing"]
    result = summarize_load_timing(MODEL, md["precision"], start_samples_from(md["starts"]),
                                   md["weight_bytes"], md["raw_read_gbps"])
    return dataclasses.replace(result, node_type=md["node_type"], config_hash=md["config_hash"])


def slo_target_sweep_rows() -> list[dict[str, str]]:
    """The SLO-target recording's serving_benchmark.csv (SmolLM2, gpu profile, concurrency 1, 8, 32, 128)."""
    with open(folder("slo_target") / "serving_benchmark.csv", newline="") as f:
        return list(csv.DictReader(f))


def asset_metadata(call: str, asset: str, model: str = MODEL) -> dict[str, Any]:
    """An asset's materialization metadata as the device call `call` (A, T, B) recorded it."""
    return recording(f"onboard-{call}")["assets"][model][asset]


def check(call: str, asset: str, name: str) -> dict[str, Any]:
    """The first evaluation of check `name` on `asset` in call `call`."""
    for step in recording(f"onboard-{call}")["steps"].values():
        for c in step.get("checks", []):
            if c["asset"] == asset and c["check"] == name:
                return c
    raise KeyError(f"onboard-{call}: no check {asset}.{name}")


def sweep_rows() -> list[dict[str, str]]:
    """serving_benchmark.csv as written there: one row per scenario x concurrency, as text."""
    with open(H200 / "serving_benchmark.csv", newline="") as f:
        return list(csv.DictReader(f))


def points(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, PointStats]]]:
    """The sweep's points per scenario, in the order measured (what `run_sweep` hands on)."""
    out: dict[str, list[tuple[int, PointStats]]] = {}
    for row in rows:
        out.setdefault(row["scenario"], []).append(
            (int(float(row["load"])), PointStats.from_row(row)))
    return out


def slo(configs: ConfigFiles) -> Slo:
    """The SLO serving_benchmark judges smollm2-135m on h200 by, as `configs` resolve it."""
    return resolve_slo(configs.slo_section(), NODE_TYPE, configs.spec(MODEL))


def benchmark_result(slo: Slo) -> tuple[ServingBenchmarkResult, str, list[str]]:
    """What serving_benchmark stored there, recomputed from the CSV: the headline at `slo`, at
    the configuration the run measured, judged as the gpu profile's blocking gate."""
    result, basis, violations = headline(MODEL, "bf16", NODE_TYPE, GPUS, slo,
                                         points(sweep_rows()), by_concurrency=True)
    return (dataclasses.replace(result, config_hash=asset_metadata("B", "serving_benchmark")[
        "config_hash"], slo_blocking=True), basis, violations)


def start_samples() -> list[StartSample]:
    """load_timing's three starts from its `starts` table (3 decimals there)."""
    return start_samples_from(asset_metadata("T", "load_timing")["starts"])


def load_timing_result() -> LoadTimingResult:
    """What load_timing stored there (call T), recomputed from its starts."""
    md = asset_metadata("T", "load_timing")
    result = summarize_load_timing(MODEL, md["precision"], start_samples(), md["weight_bytes"],
                                   md["raw_read_gbps"])
    return dataclasses.replace(result, node_type=md["node_type"], config_hash=md["config_hash"])


def published(call: str = "B") -> dict[str, PublishedVariant]:
    """published_variant as the manifests of call `call` saw it. The recording keeps the read
    GB/s (4 significant digits), not the bytes and seconds read back: those are rebuilt from it
    with the bytes deploy.yaml `read_back_mib` reads (256 MiB, less than the 269 MB file)."""
    out = {}
    for row in read_md_table(asset_metadata(call, "published_variant")["published"]):
        read_back_bytes = 256 << 20
        out[row["precision"]] = PublishedVariant(
            model=MODEL, precision=row["precision"], uri=row["uri"],
            content_hash=row["uri"].rstrip("/").rsplit("/", 1)[-1], total_bytes=int(row["bytes"]),
            files=int(row["files"]), skipped=row["skipped"] == "yes",
            bytes_uploaded=int(row["uploaded_bytes"]), read_back_bytes=read_back_bytes,
            read_back_s=read_back_bytes / (float(row["read_gbps"]) * 1e9))
    return out


def checkpoint(directory: Path) -> CheckpointRef:
    """The fetched checkpoint, at `directory`: a copy of the config.json fetched there
    (smollm2-135m/config.json here; the plan reads the model's shape and dtype from it)."""
    md = asset_metadata("A", "checkpoint")
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(H200 / MODEL / "config.json", directory / "config.json")
    return CheckpointRef(model=MODEL, source=md["source"], revision=md["revision"],
                         path=str(directory), content_hash=md["content_hash"],
                         total_bytes=md["total_bytes"])


def serving_variant(directory: Path) -> VariantRef:
    md = asset_metadata("A", "serving_variant")
    return VariantRef(MODEL, md["precision"], str(directory), md["total_bytes"],
                      md["content_hash"], md["weight_bytes"])


def accuracy() -> AccuracyReport:
    """The in-process gates as accuracy decided them there (the tables stay in the metadata)."""
    gates = asset_metadata("A", "accuracy")["gates"]
    return AccuracyReport(MODEL, (), tuple(
        GateOutcome(precision=g["precision"], passed=g["passed"], reason=g["reason"],
                    verdict=g["verdict"], source=g["source"],
                    items=g["items"]) for g in gates.values()))


def configs_at_run(target: Path) -> Path:
    """The repository's configs/ with the three files the run changed laid over it (stack
    pinned to vLLM 0.22.0 there, the node gate off, the device budget's sweep)."""
    shutil.copytree(PROJECT_ROOT / "configs", target)
    for f in sorted((H200 / "configs").glob("*.yaml")):
        shutil.copy(f, target / f.name)
    # The run's stack.yaml named its images by hand (Blackwell with the -cu130 suffix vLLM
    # stopped publishing at 0.20); images now follow versions.vllm through the repository's tag
    # rule, the only part of the run's stack.yaml not laid over as it was. Only the rules of
    # the engines the run had templates for: an engine added since was not part of that stack.
    stack = yaml.safe_load((target / "stack.yaml").read_text())
    images = yaml.safe_load((PROJECT_ROOT / "configs" / "stack.yaml").read_text())["images"]
    stack["images"] = {k: v for k, v in images.items()
                       if k in ("engine", "cuda_major") or k in stack["engines"]}
    (target / "stack.yaml").write_text(yaml.safe_dump(stack, sort_keys=False))
    return target
