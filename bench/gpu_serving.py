"""On an H200: this project's own serving stages on real vLLM, back as files.

Three phases, one device call each, back to back on one machine (state under --work):

  prepare   SmolLM2-135M-Instruct built from the carried GGUF (scripts/build_smollm2.py), a
            copy of configs/ whose stack is pinned to what is installed here (so the measured
            configuration hash is the one the plan renders), the `vllm` wrapper the Engine
            resource starts, and whether this kernel can evict the page cache (cold starts).
  onboard   the onboard_model job for smollm2-135m, then onboard_cell for its h200 cell (and
            the twins' CPU part: fetch of their config.json, export markers, serving_config) in
            the `gpu` profile on node type h200, through Dagster in a throwaway instance with
            SeaweedFS on 127.0.0.1: fetch, quantize (Model Optimizer on the GPU), in-process
            accuracy gate, serving variant, serving_config, published variant, load_timing
            (three kinds of start), serving_benchmark (chat/rag/codegen, concurrency sweep, GPU
            telemetry), manifests, readiness. `--select` runs part of it; a later call
            continues in the same instance.
  twins     performance twins (catalog entries with `weights: random`, docs/twins.md) at the
            configuration their serving_config planned for h200 (`--load-format dummy`),
            started by the Engine resource, swept by serving_benchmark's own sweep code with
            telemetry, and on the first twin `vllm bench serve` at the same point, both against
            the engine's /metrics histograms (one engine start per twin; the whole
            serving_benchmark asset would add load_timing's starts, which the budget lacks).

Every phase writes `<out>/<phase>.json` as it goes and ends by packing its files into
`<out>/<phase>.tar.gz` (the device returns at most 8 files). Budget: `--deadline-s`; a twin or
point that would not fit is recorded as not run.

    export PYTHONPATH=/tmp/site:/tmp/gg:$PWD PATH=/tmp/site/bin:$PATH
    python3 bench/gpu_serving.py prepare --out $OUT
    python3 bench/gpu_serving.py onboard --out $OUT --models smollm2-135m,<twin ids> --select ...
    python3 bench/gpu_serving.py twins --out $OUT --twins llama-3-1-8b-instruct-twin:fp8,...

bench/gpu_device.sh holds the exact device calls.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# GPUs passed through to a VM: NVLink multicast stays off; offline.
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
       "NVSHMEM_DISABLE_NVLS": "1", "DAGSTER_DISABLE_TELEMETRY": "1", "VLLM_NO_USAGE_STATS": "1",
       "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "VLLM_USE_FLASHINFER_SAMPLER": "0",
       # FlashInfer travels without its prebuilt kernels (no flashinfer-jit-cache/-cubin of the
       # version SGLang 0.5.17 pins on PyPI): SGLang then samples in PyTorch, as vLLM does here
       # (sglang srt/arg_groups/overrides.py _sampling_backend_default)
       "SGLANG_IS_FLASHINFER_AVAILABLE": "false"}
T0 = time.monotonic()
MODEL = "smollm2-135m"
# The job's sweep on the device budget: every scenario, concurrency 1 to 256, 8 s a point.
BUDGET_SWEEP = {
    # three fully cold starts: a p95 of fewer than three is labelled with its n
    "load_timing": {"cold_repeats": 3, "cold_weights_repeats": 1, "warm_repeats": 1,
                    "start_timeout_s": 600},
    # the SLO's target concurrency (32, configs/gates.yaml) is always a point of the sweep
    "serving_benchmark": {"concurrency": [1, 8, 32, 128], "max_seconds_per_point": 8,
                          "requests_per_point": 200},
}


def say(msg: str) -> None:
    print(f"[gpu {time.monotonic() - T0:6.1f} s] {msg}", flush=True)


class Report:
    """`<out>/<phase>.json`, rewritten after every step so a timeout keeps what was done."""

    def __init__(self, out: Path, phase: str):
        self.path, self.data = out / f"{phase}.json", {"phase": phase, "steps": {}}
        out.mkdir(parents=True, exist_ok=True)

    def step(self, name: str, **fields) -> None:
        self.data["steps"][name] = {"at_s": round(time.monotonic() - T0, 1), **fields}
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1, default=str))


def pack(out: Path, phase: str, paths: list[Path]) -> None:
    """Everything a phase made, in one archive beside its JSON (the device returns 8 files)."""
    with tarfile.open(out / f"{phase}.tar.gz", "w:gz") as tar:
        for p in paths:
            if p.exists():
                tar.add(p, arcname=p.name)
    say(f"packed {out / f'{phase}.tar.gz'} ({(out / f'{phase}.tar.gz').stat().st_size / 1e6:.1f}"
        " MB)")


def run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 127, "", f"{type(exc).__name__}: {exc}")


# ---- prepare ----

def engine_bin(work: Path) -> Path:
    """`vllm` (python3 -m vllm.entrypoints.cli.main: no script on PATH here) and `python` (the
    Engine reads the installed version through it) in one directory: ENGINE_BIN_DIR."""
    bin_dir = work / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "vllm").write_text(
        f'#!/bin/sh\nexec {sys.executable} -m vllm.entrypoints.cli.main "$@"\n')
    (bin_dir / "vllm").chmod(0o755)
    # A script, not a symlink: a venv's python linked from elsewhere loses its site-packages
    # (the H200 run's `vllm bench serve` failed with "No module named torch" that way).
    (bin_dir / "python").unlink(missing_ok=True)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    return bin_dir


def installed() -> dict[str, str]:
    import importlib.metadata as md

    import torch

    out = {"torch": torch.__version__, "cuda": torch.version.cuda or ""}
    for dist in ("vllm", "nvidia-modelopt", "transformers", "lm-eval", "dagster"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "missing"
    smi = run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total",
               "--format=csv,noheader"], 60)
    out["gpu"] = smi.stdout.strip()
    return out


def pinned_configs(work: Path, versions: dict[str, str]) -> tuple[Path, dict]:
    """configs/ with the stack pinned to this machine's engine, torch, CUDA and driver, and the
    node gate off: a test machine gets a 40 s burn, not the hour a node type needs, so it is
    never qualified (the probe's verdict is kept beside). Returns the copy and what changed."""
    import yaml

    cfg = work / "configs"
    if cfg.exists():
        shutil.rmtree(cfg)
    shutil.copytree(ROOT / "configs", cfg)
    stack = yaml.safe_load((cfg / "stack.yaml").read_text())
    vllm = versions["vllm"]
    driver = versions["gpu"].split(",")[1].strip() if versions["gpu"].count(",") >= 2 else ""
    changed = {"versions.vllm": [stack["versions"]["vllm"], vllm],
               "versions.pytorch": [stack["versions"]["pytorch"],
                                    versions["torch"].split("+")[0]],
               "versions.cuda": [stack["versions"]["cuda"], versions["cuda"]]}
    stack["versions"].update(vllm=vllm, pytorch=versions["torch"].split("+")[0],
                             cuda=versions["cuda"])
    if driver:
        changed["versions.nvidia_driver"] = [stack["versions"]["nvidia_driver"], driver]
        stack["versions"]["nvidia_driver"] = driver
    # images follow versions.vllm through stack.yaml's tag rule: nothing to pin
    (cfg / "stack.yaml").write_text(yaml.safe_dump(stack, sort_keys=False))
    scen = yaml.safe_load((cfg / "scenarios.yaml").read_text())
    scen["profiles"]["gpu"]["require_node_acceptance"] = False
    changed["scenarios.profiles.gpu.require_node_acceptance"] = [True, False]
    (cfg / "scenarios.yaml").write_text(yaml.safe_dump(scen, sort_keys=False))
    auto = yaml.safe_load((cfg / "automation.yaml").read_text())
    auto["launch"]["sweeps"]["device_budget"] = BUDGET_SWEEP
    (cfg / "automation.yaml").write_text(yaml.safe_dump(auto, sort_keys=False))
    return cfg, changed


def eviction_works(work: Path) -> dict:
    """Write 256 MiB, evict it, read residency: the cold starts need this kernel to drop pages
    (gVisor keeps its own page cache)."""
    from onboarding.serving import page_cache

    f = work / "evict-probe.bin"
    with open(f, "wb") as fh:
        fh.writelines(os.urandom(4 << 20) for _ in range(64))
        fh.flush()
        os.fsync(fh.fileno())
    page_cache.sequential_read([f])
    before = page_cache.residency([f]).fraction
    page_cache.evict([f])
    after = page_cache.residency([f]).fraction
    f.unlink()
    return {"resident_before": before, "resident_after_evict": after,
            "cold_starts_measurable": after <= 0.05}


def prepare(args) -> int:
    rep = Report(args.out, "prepare")
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    versions = installed()
    rep.step("versions", **versions)
    say(f"installed: {versions}")
    bin_dir = engine_bin(work)
    cfg, changed = pinned_configs(work, versions)
    rep.step("configs", dir=str(cfg), changed=changed, engine_bin=str(bin_dir))
    try:
        rep.step("page_cache", **eviction_works(work))
    except Exception as exc:  # noqa: BLE001 - recorded; load_timing says it in its own words
        rep.step("page_cache", error=f"{type(exc).__name__}: {exc}")
    model = work / "smollm2-135m-instruct"
    t = time.monotonic()
    p = run([sys.executable, str(ROOT / "scripts" / "build_smollm2.py"), str(model)], 900)
    rep.step("build_smollm2", rc=p.returncode, seconds=round(time.monotonic() - t, 1),
             tail=(p.stdout + p.stderr)[-1500:],
             files=sorted(x.name for x in model.iterdir()) if model.exists() else [])
    say(f"SmolLM2 built in {time.monotonic() - t:.0f} s (rc {p.returncode})")
    if args.probe_burn_s > 0:
        t = time.monotonic()
        probe = args.out / "probe"
        p = run([sys.executable, str(ROOT / "scripts" / "gpu_node_probe.py"), str(probe),
                 "--node-type", "h200", "--burn-s", str(args.probe_burn_s)], 420)
        rep.step("node_probe", rc=p.returncode, seconds=round(time.monotonic() - t, 1),
                 tail=(p.stdout + p.stderr)[-2000:])
        say(f"node probe rc {p.returncode} in {time.monotonic() - t:.0f} s")
        pack(args.out, "probe", [probe])
        shutil.rmtree(probe, ignore_errors=True)
    return 0 if model.exists() else 1


# ---- onboard ----

def onboard_env(work: Path, node_type: str, engine_bin_dir: str) -> None:
    os.environ.update({
        "DAGSTER_HOME": str(work / "dagster_home"),
        "ONBOARDING_CONFIG_DIR": str(work / "configs"),
        "ONBOARDING_CACHE_ROOT": str(work / "nvme"),
        "ONBOARDING_OUTPUT_DIR": str(work / "manifests"),
        "ONBOARDING_REPORTS_DIR": str(work / "reports"),
        "ONBOARDING_NODE_TYPE": node_type,
        "ENGINE_BIN_DIR": engine_bin_dir or str(work / "bin"),
        "ENGINE_LOG_DIR": str(work / "engine-logs"),
        "ENGINE_START_TIMEOUT_S": "600",
    })
    (work / "dagster_home").mkdir(parents=True, exist_ok=True)
    (work / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")


def asset_outputs(instance, model: str, node_type: str) -> dict:
    """Each asset's latest materialization metadata for the model's partition, or for its
    (model, `node_type`) cell where the asset is kept per cell (what the UI shows)."""
    import dagster as dg

    from assets.partitions import cell_key, cells_partitions

    out = {}
    for rec in instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("serving_stack")), limit=1).records:
        out["serving_stack"] = _meta(rec)
    from pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        partition = str(cell_key(model, node_type)) \
            if graph.get(key).partitions_def == cells_partitions else model
        recs = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1).records
        if recs:
            out[key.to_user_string()] = _meta(recs[0])
    return out


def _meta(rec) -> dict:
    mat = rec.event_log_entry.asset_materialization
    return {k: _plain(v.value) for k, v in mat.metadata.items()
            if not (isinstance(v.value, str) and v.value.startswith("![")) and "plot" != k}


def _plain(v):
    return v if v is None or isinstance(v, str | int | float | bool | list | dict) else str(v)


def by_level(stages: set[str], level: dict[str, set[str]]) -> list[tuple[str, set[str]]]:
    """`stages` as one run per job (a run cannot mix per-model and per-cell stages), the
    model's first (its cells read it); serving_stack, in both, goes with the first that has
    other stages."""
    runs, left = [], set(stages)
    for name, keys in level.items():
        if (picked := left & keys) - {"serving_stack"} or picked == left:
            runs.append((name, picked))
            left -= picked
    return [(name, picked) for name, picked in runs if picked]


def onboard(args) -> int:
    """For each of `--models`, one after another, in one instance: the onboard_model job (the
    model's own stages), then the onboard_cell job of its (model, `--node-type`) cell (what is
    measured on this node, and the fleet stages)."""
    import dagster as dg

    from assets.partitions import cell_key

    onboard_env(args.work, args.node_type, args.engine_bin)
    rep = Report(args.out, f"onboard-{args.tag}")
    sys.path.insert(0, str(ROOT / "scripts"))
    import demo  # the demo's S3 server, uploads and partition registration

    demo.DATA = args.work / "data"
    server = demo.start_s3()
    models = args.models.split(",")
    try:
        from assets.stack import observe_stack
        from pipelines.definitions import defs
        from pipelines.resources import config_files

        cf = config_files()
        if MODEL in models:
            demo.upload_model(server, cf.spec(MODEL).source, args.work / "smollm2-135m-instruct")
        demo.upload_twins(server, [cf.spec(m) for m in models if cf.spec(m).is_twin])
        instance = dg.DagsterInstance.get()
        demo.register_partitions(instance)
        observe_stack(instance, cf)
        jobs = {name: defs.resolve_job_def(name) for name in ("onboard_model", "onboard_cell")}
        level = {name: {k.to_user_string() for k in job.asset_layer.selected_asset_keys}
                 for name, job in jobs.items()}
        every = set().union(*level.values())
        runs = []
        for model in models:
            stages = set(args.select.split(",")) if args.select else set(every)
            stages -= set(args.exclude.split(",")) if args.exclude else set()
            if cf.spec(model).is_twin:  # nothing to publish or deploy (docs/twins.md)
                stages -= {"published_variant", "kserve_manifest", "gateway_routes"}
            # `--first` runs as a job of its own: its failure (load_timing where the page
            # cache cannot be evicted) must not skip what follows in the graph
            first = stages & set(args.first.split(",")) if args.first else set()
            for part in ([first | {"serving_stack"}] if first else []) + [stages - first]:
                runs += [(model, name, picked) for name, picked in by_level(part, level)]
        for model, name, stages in runs:
            job = jobs[name]
            key = model if name == "onboard_model" else str(cell_key(model, args.node_type))
            run_config = cf.automation().launch.run_config("device_budget", stages)
            if args.load_timing_repeats and "load_timing" in stages:
                cold, cold_weights, warm = args.load_timing_repeats
                lt = run_config.setdefault("ops", {}).setdefault("load_timing", {})
                lt.setdefault("config", {}).update(
                    cold_repeats=cold, cold_weights_repeats=cold_weights, warm_repeats=warm)
            t = time.monotonic()
            say(f"{name}[{key}] selection {sorted(stages)}")
            result = job.execute_in_process(
                partition_key=key, instance=instance, run_config=run_config,
                asset_selection=[dg.AssetKey(s) for s in stages], raise_on_error=False)
            failures = [{"step": e.step_key,
                         "error": e.step_failure_data.error.message[-3000:]}
                        for e in result.all_events if e.is_step_failure]
            checks = [{"asset": ev.asset_key.to_user_string(), "check": ev.check_name,
                       "passed": ev.passed, "severity": str(ev.severity),
                       "metadata": {k: _plain(v.value) for k, v in ev.metadata.items()}}
                      for ev in result.get_asset_check_evaluations()]
            cell = "" if name == "onboard_model" else f" {args.node_type}"
            rep.step(f"job {model}{cell} {'+'.join(sorted(stages))}", success=result.success,
                     seconds=round(time.monotonic() - t, 1), run_config=run_config,
                     failures=failures, checks=checks)
            say(f"{key}: {'SUCCESS' if result.success else 'FAILED'} in "
                f"{time.monotonic() - t:.0f} s; failures: {[f['step'] for f in failures]}")
            rep.data.setdefault("assets", {})[model] = asset_outputs(instance, model,
                                                                     args.node_type)
            rep.save()
    except Exception:  # noqa: BLE001 - a one-off run records everything and packs what it has
        rep.step("error", traceback=traceback.format_exc()[-4000:])
        say(traceback.format_exc()[-2000:])
    finally:
        server.stop()
    pack(args.out, f"onboard-{args.tag}", [args.work / "reports", args.work / "manifests",
                                            args.work / "engine-logs", args.work / "configs"])
    shutil.rmtree(args.work / "engine-logs", ignore_errors=True)  # one call's logs per archive
    return 0


# ---- twins ----

def sweep_log(name: str):
    """The sweep's per-point lines on stdout, under the twin's name."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return logging.getLogger(name)


def stored(work: Path, asset: str, partition: str):
    """A value the onboard phase's assets stored (the instance's filesystem IO manager)."""
    import pickle

    with open(work / "dagster_home" / "storage" / asset / partition, "rb") as f:
        return pickle.load(f)


def twin_target(work: Path, twin_id: str, precision: str, node_type: str):
    """The twin's variant of `precision` and the configuration its serving_config planned for
    the node type (load_format dummy); another precision than the planned one runs that
    configuration with the precision replaced (its own hash), and says so."""
    import dataclasses

    from onboarding.common.refs import VariantRef

    splan = stored(work, "serving_config", twin_id)
    planned = splan.config(node_type)
    if planned is None:
        raise RuntimeError(f"{twin_id}: serving_config planned nothing for {node_type}: "
                           f"{splan.skipped.get(node_type, '?')}")
    if precision == "bf16":
        path = stored(work, "checkpoint", twin_id).path
    else:
        v = stored(work, "quantized", twin_id).get(precision)
        if v is None:
            raise RuntimeError(f"{twin_id}: quantized made no {precision} marker")
        path = v.path
    config = planned if planned.precision == precision else dataclasses.replace(
        planned, precision=precision)
    note = "planned" if config is planned else \
        f"the {planned.precision} plan's configuration at {precision} (not planned)"
    return VariantRef(twin_id, precision, path, 0, f"twin-{precision}", 0), config, note


def engine_target(cf, engine, spec, config):
    """`config` (the plan's, in the stack's engine) as `engine` runs it: the same planned
    numbers through that engine's template, at its installed version and the image its tag
    rule gives that version; the plan's own when the engine is the stack's."""
    from onboarding.deploy.engine_choice import config_for_engine, engine_images

    if engine.engine == config.engine:
        return config, ""
    version = engine.installed_version()
    image = engine_images(cf.stack_config(), engine.engine, version).get(config.hardware, "")
    other = config_for_engine(config, spec, engine.template(), engine.engine, version, image)
    return other, f"; rendered by the {engine.engine} {version} template"


def with_tensor_parallel(config, tp: int, note: str):
    """The configuration at another tensor-parallel size (the 8B at TP 1 against TP
    2): `--tensor-parallel-size` replaced in params and argv, so it has its own hash, and the
    note says it was not planned. The planned TP passes through unchanged."""
    import dataclasses

    if tp == config.tensor_parallel:
        return config, note
    flag = "--tensor-parallel-size="
    if not any(a.startswith(flag) for a in config.param_args):
        raise SystemExit(f"--tp {tp}: the configuration has no {flag}N argument to replace "
                         f"({list(config.param_args)})")
    config = dataclasses.replace(
        config, tensor_parallel=tp, params={**config.params, "tensor_parallel_size": tp},
        param_args=tuple(f"{flag}{tp}" if a.startswith(flag) else a for a in config.param_args))
    return config, f"{note}; TP {tp} instead of the plan's (--tp)"


def twin_items(args) -> list[tuple[str, str, str, int | None]]:
    """(report key, twin id, precision, TP override or None) for each `--twins` x `--tp`."""
    out = []
    for item in args.twins.split(","):
        twin_id, _, precision = item.rpartition(":")
        if not twin_id:
            raise SystemExit(f"--twins {item!r}: expected <twin id>:<precision>")
        for tp in args.tp or [None]:
            out.append((item if tp is None else f"{item}@tp{tp}", twin_id, precision, tp))
    return out


# The engine's counters a point's request record keeps, before and after the point (vLLM's
# names end so; `_counter` sums a name's series): what its prompts cost the engine, and how much
# of that its prefix cache served
POINT_COUNTERS = ("prompt_tokens_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
                  "generation_tokens_total", "request_success_total")
# Per request, what `summarize` computes a point's TTFT, TPOT and throughput from (each token's
# gap is kept as a count and a sum: 256 floats a request would be most of the file)
REQUEST_FIELDS = ("ok", "error", "start_s", "ttft_s", "e2e_s", "output_tokens", "stream_tokens",
                  "prompt_tokens", "content_chunks", "tokens_from_usage", "client_queue_s",
                  "itl_n", "itl_sum_s")


def prompt_digest(body: bytes) -> str:
    """A short name for the prompt of one request body (the first 16 hex digits of its sha256):
    two points that sent one prompt share a digest."""
    import hashlib

    return hashlib.sha256(json.dumps(json.loads(body)["prompt"]).encode()).hexdigest()[:16]


class PointRecorder:
    """The project's load generator, writing down what each point of a sweep sent and got, one
    JSON line per point appended to `path` as it ends: the digest of every prompt it sent (the
    first len(records) bodies: `_fixed_concurrency` hands them out in order and sends none after
    its deadline) and of its warm-up prompts, every request's record (REQUEST_FIELDS), and the
    engine's POINT_COUNTERS in the scrapes around the measured requests. A replay recomputes
    the sweep row's numbers from these and checks that no point re-sent an earlier one's prompt."""

    def __init__(self, loadgen, path: Path, item: str):
        self.loadgen, self.path, self.item = loadgen, path, item
        self.lines = 0

    def run_point(self, base_url: str, bodies, **kw):
        from onboarding.serving.stats import parse_metrics

        run = self.loadgen.run_point(base_url, bodies, **kw)
        sent = list(bodies[:len(run.records)])

        def counters(text: str | None) -> dict[str, float] | None:
            if text is None:
                return None
            parsed = parse_metrics(text)
            return {k: _counter(parsed, k) for k in POINT_COUNTERS}

        line = {"item": self.item, "point": self.lines,
                "load": kw.get("concurrency", kw.get("rate_rps")),
                "duration_s": run.duration_s, "bodies_given": len(bodies),
                "sent": [prompt_digest(b) for b in sent],
                "warmup": [prompt_digest(b) for b in kw.get("warmup_bodies", ())],
                "counters_before": counters(run.metrics_before),
                "counters_after": counters(run.metrics_after),
                "fields": list(REQUEST_FIELDS),
                "records": [[getattr(r, f) for f in REQUEST_FIELDS[:-2]]
                            + [len(r.itl_s), sum(r.itl_s)] for r in run.records]}
        with open(self.path, "a") as f:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.lines += 1
        return run


def twins(args) -> int:
    onboard_env(args.work, args.node_type, args.engine_bin)
    rep = Report(args.out, args.name or "twins")
    requests_path = args.out / f"{args.name or 'twins'}-requests.jsonl"
    from onboarding.serving.frontend import FrontendSampler
    from onboarding.serving.profiles import resolve_slo
    from pipelines.resources import config_files
    from resources.engine import Engine
    from resources.loadgen import LoadGenerator
    from resources.sweep import run_sweep
    from resources.telemetry import GpuTelemetry

    cf = config_files()
    engine_name = args.engine or cf.stack().engine
    tok_src = args.work / "smollm2-135m-instruct"
    if not args.dry_run:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tok_src, local_files_only=True)
    budget_end = T0 + args.deadline_s
    first = True
    for item, twin_id, precision, tp_override in twin_items(args):
        est_s = 150 + 1.2 * args.seconds_per_point * len(args.concurrency)
        if time.monotonic() + est_s > budget_end and not args.dry_run:
            rep.step(item, skipped=f"not run: {est_s:.0f} s estimated, "
                     f"{budget_end - time.monotonic():.0f} s of the budget left")
            continue
        t = time.monotonic()
        entry: dict = {"model": twin_id, "precision": precision, "tp_override": tp_override}
        try:
            spec = cf.spec(twin_id)
            variant, config, note = twin_target(args.work, twin_id, precision, args.node_type)
            planned_tp = config.tensor_parallel
            if tp_override:
                config, note = with_tensor_parallel(config, tp_override, note)
            # the engine's GPUs and the telemetry's: the first TP of them (TP 1 on a two-GPU
            # machine must not count the idle GPU's power against its tokens)
            gpu_ids = list(range(config.tensor_parallel))
            engine = Engine(configs=cf, bin_dir=os.environ["ENGINE_BIN_DIR"],
                            node_type=args.node_type, log_dir=str(args.work / "engine-logs"),
                            start_timeout_s=600, engine=engine_name,
                            gpus=",".join(map(str, gpu_ids)) if args.node_type != "cpu" else "")
            _, profile = cf.profile(args.profile, engine.resolved_hardware())
            config, rendered = engine_target(cf, engine, spec, config)
            note += rendered
            entry.update(engine=f"{config.engine} {config.engine_version}",
                         config_hash=config.hash, config_basis=note,
                         config_content=config.content(),
                         params_billion=spec.architecture.params_billion
                         if spec.architecture else None,
                         argv_params=config.params, tensor_parallel=config.tensor_parallel,
                         planned_tensor_parallel=planned_tp, gpus=gpu_ids)
            scenarios = {s: profile.scenarios[s] for s in args.scenarios.split(",")}
            sweep = profile.sweep.model_copy(update={
                "concurrency": args.concurrency,
                "max_seconds_per_point": args.seconds_per_point})
            slo = resolve_slo(cf.slo_section(), args.node_type, spec)
            entry["slo"] = vars(slo)
            if args.dry_run:  # what would start, and where; no engine
                entry.update(dry_run=True, engine_argv=config.args(variant.path, 0, "127.0.0.1"),
                             engine_env=config.env, cuda_visible_devices=engine.gpus,
                             concurrency=args.concurrency, scenarios=list(scenarios),
                             estimated_s=round(est_s))
                print(json.dumps({item: entry}, indent=1, default=str))
                rep.step(item, **entry)
                continue
            with engine.serve(variant, config) as running, \
                    GpuTelemetry().sampler(gpu_ids) as sampler, \
                    FrontendSampler(running.pid) as frontend:
                entry["ready_s"] = round(running.phases.first_token_s, 1)
                entry["start_phases"] = {k: v for k, v in vars(running.phases).items()
                                         if isinstance(v, (int, float)) or v is None}
                entry["engine_log"] = running.log_path.name
                say(f"{item}: ready in {entry['ready_s']} s ({config.hash}, {note})")
                loadgen = PointRecorder(LoadGenerator(), requests_path, item)
                rows, _ = run_sweep(sweep_log(twin_id), loadgen, running, engine.template(),
                                    spec.served_name, scenarios, sweep, slo, tokenizer, sampler,
                                    frontend)
                entry["requests_file"] = requests_path.name
                entry["rows"] = rows
                rep.step(item, **entry)
                if first and args.crosscheck_concurrency:
                    entry["crosscheck"] = crosscheck(running, spec.served_name, tok_src,
                                                     args.crosscheck_concurrency, args.work,
                                                     tokenizer, engine, args.crosscheck_tokens)
                    first = False
            entry["telemetry_unavailable"] = sampler.unavailable
            entry["unreadable_fields"] = sampler.unreadable  # filled by stop()
        except Exception as exc:  # noqa: BLE001 - one twin failing must not cost the others
            entry["error"] = f"{type(exc).__name__}: {exc}"[-3000:]
            say(f"{item}: {entry['error'][:500]}")
        entry["seconds"] = round(time.monotonic() - t, 1)
        rep.step(item, **entry)
    if not args.dry_run:
        pack(args.out, args.name or "twins", [args.work / "engine-logs"])
    return 0


def vllm_bench(url: str, served: str, tokenizer: Path, concurrency: int, prompts: int,
               in_len: int, out_len: int, work: Path, warmups: int | None = None,
               seed: int | None = None) -> dict:
    """`vllm bench serve` at one point against the running engine (the peer client). Its
    random dataset is drawn from `--seed` (default 0; vLLM 0.32's
    vllm/benchmarks/datasets/datasets.py): the same prompts on every call unless `seed`
    differs, and a repeated prompt hits the prefix cache."""
    python = Path(os.environ["ENGINE_BIN_DIR"]) / "python"  # the engine's interpreter
    argv = [str(python), "-m", "vllm.entrypoints.cli.main", "bench", "serve",
            "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", served, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(in_len), "--random-output-len", str(out_len),
            "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
            "--ignore-eos", "--disable-tqdm",
            "--num-warmups", str(concurrency if warmups is None else warmups),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
            "--save-result", "--result-dir", str(work), "--result-filename", "vllm-bench.json"]
    if seed is not None:
        argv += ["--seed", str(seed)]
    p = run(argv, 300)
    if p.returncode != 0:
        return {"error": (p.stdout + p.stderr)[-2000:]}
    d = json.loads((work / "vllm-bench.json").read_text())
    return {k: d.get(k) for k in BENCH_KEYS}


BENCH_KEYS = ("completed", "duration", "request_throughput", "output_throughput",
              "median_ttft_ms", "p95_ttft_ms", "mean_itl_ms", "median_itl_ms", "mean_tpot_ms")


def sglang_bench(url: str, served: str, tokenizer: Path, concurrency: int, prompts: int,
                 in_len: int, out_len: int, work: Path, warmups: int | None = None) -> dict:
    """SGLang's own client (`python -m sglang.benchmark.serving`, the OpenAI completions
    backend) at one point: the peer that `vllm bench serve` is for vLLM. `random-ids`: random
    token ids of exactly these lengths (`random` would read ShareGPT, which is not here)."""
    python = Path(os.environ["ENGINE_BIN_DIR"]) / "python"
    out = work / "sglang-bench.jsonl"
    out.unlink(missing_ok=True)
    argv = [str(python), "-m", "sglang.benchmark.serving", "--backend", "sglang-oai",
            "--base-url", url, "--model", served, "--tokenizer", str(tokenizer),
            "--dataset-name", "random-ids", "--random-input-len", str(in_len),
            "--random-output-len", str(out_len), "--random-range-ratio", "1",
            "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
            "--warmup-requests", str(concurrency if warmups is None else warmups),
            "--disable-tqdm", "--output-file", str(out)]
    p = run(argv, 300)
    if p.returncode != 0 or not out.is_file():
        return {"error": (p.stdout + p.stderr)[-2000:]}
    d = json.loads(out.read_text().strip().splitlines()[-1])
    return {k: d.get(k) for k in BENCH_KEYS}


# Each engine's own benchmark client, the peer the project's load generator is checked beside
# (bench-side tooling: the argv of another program, not a plan decision)
PEER_BENCH = {"vllm": vllm_bench, "sglang": sglang_bench}


def crosscheck(running, served: str, tok_dir: Path, concurrency: int, work: Path, tokenizer,
               engine, tokens: tuple[int, int]) -> dict:
    """The project's client and `vllm bench serve` at the same point on the same engine, each
    against the engine's own /metrics histograms over its run (chat: 512 in, 256 out)."""
    in_len, out_len = tokens
    from onboarding.serving.prompts import synthetic_prompts
    from onboarding.serving.stats import summarize
    from resources.loadgen import LoadGenerator, completion_bodies

    n = concurrency * 8
    out: dict = {"concurrency": concurrency, "prompts": n, "input_tokens": in_len,
                 "output_tokens": out_len}
    prompts = synthetic_prompts(tokenizer, n + concurrency, in_len, 0, seed=7)
    bodies = completion_bodies(served, prompts, out_len,
                               count_tokens_by=engine.template().load_generator.count_tokens_by)
    metrics = engine.template().metrics
    run_ = LoadGenerator().run_point(running.base_url, bodies[concurrency:],
                                     concurrency=concurrency, max_seconds=120,
                                     request_timeout_s=120, warmup_bodies=bodies[:concurrency],
                                     scrape_interval_s=1.0)
    s = summarize(run_.records, run_.duration_s)
    from resources.sweep import server_side

    out["ours"] = {"completed": s.completed, "request_throughput": s.request_throughput_rps,
                   "output_throughput": s.output_tokens_per_s,
                   "median_ttft_ms": s.ttft_s.p50 * 1e3, "p95_ttft_ms": s.ttft_s.p95 * 1e3,
                   "mean_itl_ms": s.itl_ms.mean, **server_side(run_, metrics)}
    peer = PEER_BENCH.get(engine.engine)
    if peer is None:
        out["peer_bench"] = {"error": f"no peer client for {engine.engine} (PEER_BENCH)"}
        return out
    key = f"{engine.engine}_bench"  # vllm_bench: the key the earlier recordings have
    before = _scrape(running.base_url)
    out[key] = peer(running.base_url, served, tok_dir, concurrency, n, in_len, out_len, work)
    after = _scrape(running.base_url)
    out[key]["engine_histograms"] = _hist_delta(before, after, metrics)
    return out


# ---- frontend: which ingredient makes the engine's API server work harder ----

def _counter(parsed: dict, suffix: str) -> float:
    """The sum of a parsed scrape's series whose name ends in `suffix` (0 where none)."""
    return sum(v for k, v in parsed.items() if k.split("{")[0].endswith(suffix))


def _counted_per_request(before: dict, after: dict, completed) -> int:
    """How many times the engine's request_success counter counted each completed request
    between two parsed scrapes (1 with one API server; N where N API servers each count it);
    1 where it cannot be told (nothing completed, no counter)."""
    succ = _counter(after, "request_success_total") - _counter(before, "request_success_total")
    if not completed or succ <= 0:
        return 1
    return max(1, round(succ / completed))


def frontend_bodies(served: str, prompts: list[str], out_len: int,
                    token_prompts: list[list[int]] | None = None) -> dict[str, list[bytes]]:
    """The project's bodies and, one ingredient at a time, `vllm bench serve`'s (its
    `async_request_openai_completions` payload: no temperature, repetition_penalty 1.0,
    logprobs null, usage only at the end)."""
    import json as _json

    from resources.loadgen import completion_bodies

    def bench(p: str, greedy: bool) -> bytes:
        body = {"model": served, "prompt": p, "repetition_penalty": 1.0, "max_tokens": out_len,
                "logprobs": None, "stream": True, "stream_options": {"include_usage": True},
                "ignore_eos": True}
        if greedy:
            body["temperature"] = 0.0
        return _json.dumps(body).encode()

    # The client samples; greedy is what it sent before (the run of
    # 2026-12-02 called these "ours without temperature (sampled)" and "ours"). "ours" is the
    # recordings' name for the continuous-usage body: vLLM's template has counted by token ids
    # ("ours, token ids per chunk") since the ingredients experiment, the others by usage.
    greedy = completion_bodies(served, prompts, out_len, temperature=0.0)
    ours = completion_bodies(served, prompts, out_len)
    out = {"ours": ours,
           "ours, greedy (before the fix)": greedy,
           "bench body (sampled)": [bench(p, False) for p in prompts],
           "bench body, greedy": [bench(p, True) for p in prompts],
           # The req/s gap, one ingredient at a time: how the client has the
           # server count a chunk's tokens (continuous usage in every chunk, the chunk's own
           # ids, or none: one token per text chunk, as `vllm bench serve` counts)
           "ours, token ids per chunk": completion_bodies(served, prompts, out_len,
                                                          count_tokens_by="token_ids"),
           "ours, no count per chunk": completion_bodies(served, prompts, out_len,
                                                         count_tokens_by="text")}
    if token_prompts:  # the prompt's content, as vllm bench's random dataset makes it
        def with_ids(bodies: list[bytes]) -> list[bytes]:
            return [_json.dumps({**_json.loads(b), "prompt": ids}).encode()
                    for b, ids in zip(bodies, token_prompts, strict=False)]

        out["ours, greedy, random-token prompts"] = with_ids(greedy)
        out["ours, random-token prompts"] = with_ids(ours)
    return out


def client_names(arg: str) -> tuple[str, ...]:
    """`--frontend-clients`: names separated by ';' (several names hold a comma), or by ','
    where there is no ';' (the form the earlier runs' commands used)."""
    return tuple(c.strip() for c in arg.split(";" if ";" in arg else ",") if c.strip())


# `vllm bench serve` as the runs up to the eighth called it (its default seed: the same
# prompts in every run, so from the second run on the engine's prefix cache holds them), and
# with fresh prompts per run as the project's client has them (True: `--seed` per run)
PEER_SEEDS = {"vllm bench serve": False, "vllm bench serve, fresh prompts per run": True}


def frontend_point(running, engine, served: str, tokenizer, tok_dir: Path, work: Path,
                   concurrency: int, run_no: int, in_len: int, out_len: int,
                   only: tuple[str, ...] = ()) -> list[dict]:
    """One round of every client at one concurrency, fresh prompts, order rotated by run."""
    from onboarding.serving.frontend import frontend_cpu_delta, frontend_processes_cpu_s, tree_cpu_s
    from onboarding.serving.prompts import synthetic_prompts
    from onboarding.serving.stats import histogram_mean_delta, parse_metrics

    n = 2 * concurrency
    metrics = engine.template().metrics
    seed = 1000 * concurrency + run_no  # fresh prompts per run and point, for every client
    prompts = synthetic_prompts(tokenizer, n, in_len, 0, seed=seed)
    import random

    rng = random.Random(concurrency + 7919 * run_no)
    vocab = tokenizer.vocab_size
    token_prompts = [[rng.randrange(vocab) for _ in range(in_len)] for _ in range(n)]
    clients: list[tuple[str, list[bytes] | None]] = [
        *frontend_bodies(served, prompts, out_len, token_prompts).items(),
        *((name, None) for name in PEER_SEEDS)]
    if only:  # The fixed client against `vllm bench serve`, nothing else
        unknown = set(only) - {name for name, _ in clients}
        if unknown:
            raise SystemExit(f"--frontend-clients: unknown {sorted(unknown)}; "
                             f"known: {[name for name, _ in clients]}")
        clients = [c for c in clients if c[0] in only]
    k = run_no % len(clients)
    rows = []
    for name, bodies in clients[k:] + clients[:k]:
        before = _scrape(running.base_url)
        titles = engine.template().engine_process_titles
        api0, tree0 = frontend_processes_cpu_s(running.pid, titles), tree_cpu_s(running.pid)
        t0 = time.monotonic()
        client0 = _client_cpu_s()
        if bodies is None:
            got = vllm_bench(running.base_url, served, tok_dir, concurrency, n, in_len, out_len,
                             work, warmups=0, seed=seed if PEER_SEEDS[name] else None)
            row = {"req_s": got.get("request_throughput"), "client_itl_ms": got.get("mean_itl_ms"),
                   "ttft_p50_ms": got.get("median_ttft_ms"), "completed": got.get("completed"),
                   "error": got.get("error"), "load_s": got.get("duration")}
        else:
            r, st = ours_round(running.base_url, bodies, concurrency)
            row = {"req_s": st.request_throughput_rps, "client_itl_ms": st.itl_ms.mean,
                   "ttft_p50_ms": st.ttft_s.p50 * 1e3, "completed": st.completed,
                   "tokens_per_chunk": st.tokens_per_chunk, "load_s": r.duration_s}
        wall = time.monotonic() - t0
        # every API server process (one, or --api-server-count's N and their launcher)
        per_process = frontend_cpu_delta(api0, frontend_processes_cpu_s(running.pid, titles))
        api, tree = sum(c for _, c in per_process.values()), tree_cpu_s(running.pid) - tree0
        # the client's own CPU (ours in this process; `vllm bench serve` a waited-for child,
        # its start-up included): whether a client that cannot keep up explains its req/s
        client = {k: round(v - client0[k], 2) for k, v in _client_cpu_s().items()}
        after = _scrape(running.base_url)
        b, a = parse_metrics(before), parse_metrics(after)
        # vLLM with --api-server-count N counted each request more than once on the CPU build
        # (0.32: 8 request_success for 4 requests with N=2), the histograms' sums with their
        # counts, so a mean holds; the token counter is divided by that count per request
        counted = _counted_per_request(b, a, row.get("completed"))
        tokens = (_counter(a, "generation_tokens_total")
                  - _counter(b, "generation_tokens_total")) / counted
        # what the engine did with the prompts (its counters, vLLM's names): a client whose
        # prompts are longer, or hit the prefix cache less, loads the engine more per request
        engine_work = {k: round((_counter(a, name) - _counter(b, name)) / counted, 1)
                       for k, name in (("prompt_tokens", "prompt_tokens_total"),
                                       ("prefix_cache_queries", "prefix_cache_queries_total"),
                                       ("prefix_cache_hits", "prefix_cache_hits_total"))}
        itl = histogram_mean_delta(b, a, metrics.itl_histogram)
        row.update(client=name, concurrency=concurrency, run=run_no, wall_s=round(wall, 2),
                   generated_tokens=tokens, api_cpu_s=round(api, 2), tree_cpu_s=round(tree, 2),
                   # over the load itself (vllm bench's own start-up is idle time here)
                   api_cores=round(api / row["load_s"], 3) if row.get("load_s") else None,
                   api_cpu_s_per_1k_tokens=round(1e3 * api / tokens, 4) if tokens else None,
                   engine_itl_ms=itl * 1e3 if itl is not None else None,
                   client_cpu_s=client["children" if bodies is None else "self"],
                   engine_counts_per_request=counted, **engine_work,
                   api_processes=sorted([t[:48], round(c, 2)] for t, c in per_process.values()))
        if row.get("client_itl_ms") and row["engine_itl_ms"]:
            row["itl_vs_engine"] = round(row["client_itl_ms"] / row["engine_itl_ms"] - 1, 4)
        say(f"frontend c={concurrency} repetition {run_no} {name}: {row.get('req_s')} req/s, API "
            f"{row['api_cores']} cores, {row['api_cpu_s_per_1k_tokens']} s/1k tok, ITL vs "
            f"engine {row.get('itl_vs_engine')}")
        rows.append(row)
    return rows


def ours_round(base_url: str, bodies: list[bytes], concurrency: int):
    """One round of the project's client (no /metrics scrape of its own: the experiment
    scrapes around it): the run and its statistics."""
    from onboarding.serving.stats import summarize
    from resources.loadgen import LoadGenerator

    r = LoadGenerator(metrics_path="").run_point(base_url, bodies, concurrency=concurrency,
                                                 max_seconds=240, request_timeout_s=240)
    return r, summarize(r.records, r.duration_s)


WARMUP_SEED = 999_999  # no measured run's prompt seed (1000 x concurrency + run)


def frontend_warmup(running, served: str, tokenizer, concurrency: int, in_len: int,
                    out_len: int) -> dict:
    """One discarded round of the project's client after the engine start, at `concurrency`,
    on prompts no measured run sends (so it primes no prefix cache for them): without it
    the first measured run after a start read the lowest req/s of its point."""
    from onboarding.serving.prompts import synthetic_prompts
    from resources.loadgen import completion_bodies

    prompts = synthetic_prompts(tokenizer, concurrency, in_len, 0, seed=WARMUP_SEED)
    r, st = ours_round(running.base_url, completion_bodies(served, prompts, out_len),
                       concurrency)
    return {"concurrency": concurrency, "requests": len(prompts), "completed": st.completed,
            "seconds": round(r.duration_s, 2), "req_s": st.request_throughput_rps}


def _client_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) of this process and of its waited-for children."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return {"self": me.ru_utime + me.ru_stime, "children": kids.ru_utime + kids.ru_stime}


def frontend(args) -> int:
    """The client-accounting gap where it reproduces (vLLM 0.22 on the H200, the 8B twin,
    c=256): the project's client, the same client with one of `vllm bench serve`'s request
    ingredients at a time, and
    `vllm bench serve` itself, taking turns on one engine; per run the API server's CPU seconds
    per 1,000 generated tokens, its cores, req/s and the client's mean ITL against the engine's
    histogram. Writes frontend.json after every run."""
    onboard_env(args.work, args.node_type, args.engine_bin)
    rep = Report(args.out, args.name or "frontend")
    from transformers import AutoTokenizer

    from onboarding.serving.frontend import frontend_processes_cpu_s
    from pipelines.resources import config_files
    from resources.engine import Engine

    cf = config_files()
    engine = Engine(configs=cf, bin_dir=os.environ["ENGINE_BIN_DIR"], node_type=args.node_type,
                    log_dir=str(args.work / "engine-logs"), start_timeout_s=600)
    twin_id, _, precision = args.twins.split(",")[0].rpartition(":")
    tok_src = args.work / "smollm2-135m-instruct"
    tokenizer = AutoTokenizer.from_pretrained(tok_src, local_files_only=True)
    variant, config, note = twin_target(args.work, twin_id, precision, args.node_type)
    import dataclasses

    if args.max_num_seqs:  # the engine ran 256 at once; the h200 plan admits fewer
        flag = f"--max-num-seqs={args.max_num_seqs}"
        config = dataclasses.replace(
            config, params={**config.params, "max_num_seqs": args.max_num_seqs},
            param_args=tuple(flag if a.startswith("--max-num-seqs=") else a
                             for a in config.param_args))
        note += f"; max_num_seqs {args.max_num_seqs} for this experiment"
    if args.api_servers > 1:  # At 256: the one API server is the bottleneck
        config = dataclasses.replace(
            config, params={**config.params, "api_server_count": args.api_servers},
            param_args=(*config.param_args, f"--api-server-count={args.api_servers}"))
        note += f"; {args.api_servers} API server processes for this experiment"
    in_len, out_len = args.crosscheck_tokens
    rows: list[dict] = []
    budget_end = T0 + args.deadline_s
    with engine.serve(variant, config) as running:
        rep.step("engine", twin=twin_id, precision=precision, config_hash=config.hash,
                 basis=note, ready_s=round(running.phases.first_token_s, 1),
                 argv_params=config.params, api_servers=args.api_servers,
                 processes=sorted(t[:48] for t, _ in
                                  frontend_processes_cpu_s(
                                      running.pid,
                                      engine.template().engine_process_titles).values()))
        if args.frontend_warmup and args.concurrency:
            rep.step("warm-up", **frontend_warmup(
                running, cf.spec(twin_id).served_name, tokenizer, max(args.concurrency),
                in_len, out_len))
        for run_no in range(args.frontend_runs):
            for conc in args.concurrency:
                if time.monotonic() + 10 * conc / 16 > budget_end:
                    rep.step(f"c{conc} repetition {run_no}", skipped="device budget")
                    continue
                rows += frontend_point(running, engine, cf.spec(twin_id).served_name,
                                       tokenizer, tok_src, args.work, conc, run_no, in_len,
                                       out_len, args.frontend_clients)
                rep.step("rows", rows=rows)
    pack(args.out, args.name or "frontend", [args.work / "engine-logs"])
    return 0


def _scrape(base_url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as r:
        return r.read().decode()


def _hist_delta(before: str, after: str, metrics) -> dict:
    """Mean TTFT and ITL (ms) from the engine's histograms between two scrapes."""
    from onboarding.serving.stats import histogram_mean_delta, parse_metrics

    b, a = parse_metrics(before), parse_metrics(after)
    means = {"ttft_mean_ms": histogram_mean_delta(b, a, metrics.ttft_histogram),
             "itl_mean_ms": histogram_mean_delta(b, a, metrics.itl_histogram)}
    return {k: v * 1e3 if v is not None else None for k, v in means.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", choices=["prepare", "onboard", "twins", "frontend"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/onb"))
    ap.add_argument("--node-type", default="h200", help="configs/nodes.yaml entry (cpu: a "
                    "smoke test of this script on the CPU engine)")
    ap.add_argument("--engine-bin", default="", help="ENGINE_BIN_DIR (default: the wrapper "
                    "`prepare` writes)")
    ap.add_argument("--engine", default="", help="twins: the engine template to start "
                    "(configs/stack.yaml engines; default: the stack's engine); another than "
                    "the plan's renders the plan's numbers through its template")
    ap.add_argument("--deadline-s", type=float, default=560)
    ap.add_argument("--probe-burn-s", type=float, default=40)
    ap.add_argument("--select", default="", help="onboard: comma-separated asset names")
    ap.add_argument("--first", default="", help="onboard: these assets in a job of their own "
                    "before the rest")
    ap.add_argument("--exclude", default="", help="onboard: the job's assets but these")
    ap.add_argument("--tag", default="a", help="onboard: names this call's files")
    ap.add_argument("--load-timing-repeats", default=None,
                    type=lambda s: tuple(int(x) for x in s.split(",")),
                    help="onboard: load_timing's fully cold, cold-weights and warm starts "
                    "(e.g. 3,0,0: three fully cold starts and nothing else, where the device "
                    "budget is short); default the device_budget sweep's")
    ap.add_argument("--models", default=MODEL, help="onboard: partitions, one job each")
    ap.add_argument("--twins", default="llama-3-1-8b-instruct-twin:fp8,"
                    "llama-3-1-70b-instruct-twin:fp8,llama-3-1-8b-instruct-twin:bf16,"
                    "llama-3-1-8b-instruct-twin:nvfp4", help="twins: <twin id>:<precision>")
    ap.add_argument("--tp", type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                    default=[], help="twins: run each twin at each of these tensor-parallel "
                    "sizes instead of the plan's (e.g. 1,2; its own configuration hash, recorded "
                    "as tp_override); default the plan's")
    ap.add_argument("--name", default="", help="twins, frontend: names the phase's files "
                    "(<name>.json, <name>.tar.gz) instead of the phase's name")
    ap.add_argument("--dry-run", action="store_true", help="twins: the configuration, engine "
                    "argv and GPUs of each item, written and printed; no engine starts")
    ap.add_argument("--scenarios", default="chat")
    ap.add_argument("--profile", default="gpu", help="twins: configs/scenarios.yaml profile")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 8, 32, 64])
    ap.add_argument("--seconds-per-point", type=float, default=12)
    ap.add_argument("--frontend-runs", type=int, default=3, help="frontend: rounds of clients")
    ap.add_argument("--frontend-warmup", type=int, default=1, choices=[0, 1],
                    help="frontend: one discarded round of the client after the engine start "
                    "(1, the default; 0: none)")
    ap.add_argument("--max-num-seqs", type=int, default=0, help="frontend: override the plan's")
    ap.add_argument("--api-servers", type=int, default=1, help="frontend: vLLM's "
                    "--api-server-count (1: the plan's single API server)")
    ap.add_argument("--frontend-clients", type=client_names, default=(),
                    help="frontend: only these clients (names as in frontend.json, separated "
                    "by ';', or by ',' where no name has one: 'ours,vllm bench serve'); "
                    "default all")
    ap.add_argument("--crosscheck-concurrency", type=int, default=32)
    ap.add_argument("--crosscheck-tokens", type=lambda s: tuple(int(x) for x in s.split(",")),
                    default=(512, 256), help="input,output tokens of the cross-check point")
    args = ap.parse_args()
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    return {"prepare": prepare, "onboard": onboard, "twins": twins,
            "frontend": frontend}[args.phase](args)


if __name__ == "__main__":
    sys.exit(main())
