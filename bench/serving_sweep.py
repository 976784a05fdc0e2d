"""The serving stage on the real vLLM CPU engine with the full `cpu` profile, in Dagster.

Materializes `load_timing` and `serving_benchmark` for SmolLM2-135M (bf16, a private copy so
no other process pins its pages) in an ephemeral instance, in the model's `cpu` cell, with
stand-ins for `checkpoint` and `serving_variant` stored under the model, then prints the load
timing, the sweep table, and our client's TTFT/ITL against the engine's own /metrics
histograms over the same requests (the named peer: vLLM's server-side measurement).

    .venv/bin/python bench/serving_sweep.py [--scenarios chat rag codegen] [--cold 3 --warm 2]
        [--concurrency 1 4 ...] [--requests-per-point N]   (default: the cpu profile's sweep)
        [--dry-run]   build the job and its resources, start nothing (the suite's smoke test)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
for k, v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
             "VLLM_NO_USAGE_STATS": "1", "DAGSTER_DISABLE_TELEMETRY": "1"}.items():
    os.environ.setdefault(k, v)

import dagster as dg
import pandas as pd
import yaml

from assets.partitions import cell_key, cells_partitions, models_partitions
from assets.serving import load_timing, serving_benchmark
from onboarding.common.refs import CheckpointRef, VariantRef
from onboarding.deploy.serving_plan import ServingPlan
from onboarding.quantize.variants import QuantizedSet
from resources.config_files import ConfigFiles, OutputDirs
from resources.engine import Engine
from resources.loadgen import LoadGenerator
from resources.telemetry import GpuTelemetry
from resources.upstream import optional_upstream

SMOL = ROOT / ".cache" / "smollm2-135m-instruct"
KEY = "smollm2-135m"


def stand_in(name: str, value) -> dg.AssetsDefinition:
    """An asset named like an upstream stage that stores exactly `value`."""
    @dg.asset(name=name, partitions_def=models_partitions)
    def _stand_in():
        return value

    return _stand_in


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", nargs="+", default=["chat", "rag", "codegen"])
    ap.add_argument("--cold", type=int, default=3)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=None)
    ap.add_argument("--requests-per-point", type=int, default=None)
    ap.add_argument("--dry-run", action="store_true", help="validate the job, start nothing")
    args = ap.parse_args()
    sweep = {k: v for k, v in {"concurrency": args.concurrency,
                               "requests_per_point": args.requests_per_point}.items()
             if v is not None}
    work = Path(tempfile.mkdtemp(prefix="serving-sweep-", dir=ROOT / ".cache"))
    try:
        model = work / "model"
        shutil.copytree(SMOL, model)
        os.sync()
        configs = work / "configs"
        shutil.copytree(ROOT / "configs", configs, ignore=shutil.ignore_patterns("models"))
        (configs / "models").mkdir()
        (configs / "models" / f"{KEY}.yaml").write_text(yaml.safe_dump({
            "id": KEY, "source": "s3://models/smollm2-135m-instruct/",
            "served_name": "smollm2-135m-instruct", "scenarios": args.scenarios,
            "engine_args": {"max_model_len": 2048, "max_num_seqs": 64}}))
        config_files = ConfigFiles(config_dir=str(configs))
        outputs = OutputDirs(reports_dir=str(work / "reports"))
        size = sum(p.stat().st_size for p in model.glob("*.safetensors"))

        @dg.asset(name="checkpoint", partitions_def=models_partitions)
        def checkpoint() -> CheckpointRef:
            return CheckpointRef(model=KEY, source="s3://models/smollm2-135m-instruct/",
                                 revision="bench", path=str(model), content_hash="bench",
                                 total_bytes=size)

        @dg.asset(name="serving_variant", partitions_def=models_partitions)
        def serving_variant() -> VariantRef:
            return VariantRef(KEY, "bf16", str(model), size, "bench")

        # Nothing quantized (the bf16 checkpoint is served) and no planned node type: the CPU
        # engine runs its own configuration, as in the demo.
        upstream = [checkpoint, serving_variant,
                    stand_in("quantized", QuantizedSet(KEY, "", 1, ())),
                    stand_in("serving_config", ServingPlan(plan=None, configs={}))]
        engine = Engine(hardware="cpu", log_dir=str(work / "logs"), configs=config_files)
        # The measurements are kept per (model, node type) cell, the stand-ins per model: one
        # run each (a run cannot mix the two), the cell's reading the stored stand-ins.
        cell = str(cell_key(KEY, engine.node_type))
        assets = [*(dg.AssetSpec(a.key, partitions_def=models_partitions) for a in upstream),
                  dg.AssetSpec("config_search", partitions_def=cells_partitions),
                  load_timing, serving_benchmark]
        resources = {"engine": engine,
                     "loadgen": LoadGenerator(), "telemetry": GpuTelemetry(),
                     "optional_upstream": optional_upstream, "configs": config_files,
                     "outputs": outputs}
        run_config = {"ops": {"load_timing": {"config": {"cold_repeats": args.cold,
                                                          "warm_repeats": args.warm}},
                              "serving_benchmark": {"config": sweep}}}
        if args.dry_run:  # every resource an asset asks for, and the run config, checked
            defs = dg.Definitions(assets=assets, resources=resources)
            dg.Definitions.validate_loadable(defs)
            job = defs.resolve_implicit_global_asset_job_def()
            checked = dg.validate_run_config(job, run_config)
            print(f"dry run: {len(assets)} assets, resources {sorted(resources)}, run config "
                  f"{checked['ops']['serving_benchmark']['config']} valid")
            return
        instance = dg.DagsterInstance.ephemeral()
        instance.add_dynamic_partitions("models", [KEY])
        instance.add_dynamic_partitions("node_types", [engine.node_type])
        dg.materialize(upstream, partition_key=KEY, instance=instance)
        result = dg.materialize(assets, partition_key=cell, instance=instance,
                                resources=resources, run_config=run_config)
        t = {k: getattr(v, "value", v) for k, v in next(
            iter(result.asset_materializations_for_node("load_timing"))).metadata.items()}
        print("\n## load_timing\n")
        for k in ("cold_start_p50_s", "cold_start_p95_s", "cold_start_spread_s",
                  "warm_start_p50_s", "weight_bytes", "weights_load_gbps", "raw_read_gbps"):
            print(f"{k}: {t[k]}")
        print(t["starts"])
        b = result.output_for_node("serving_benchmark")
        print(f"\n## serving_benchmark\n\n{b}\n")
        table = pd.read_csv(work / "reports" / KEY / engine.node_type /
                            "serving_benchmark.csv")
        table["client_vs_server_itl"] = table.itl_mean_ms / table.server_itl_mean_ms
        table["client_vs_server_ttft"] = table.ttft_mean_s / table.server_ttft_mean_s
        cols = ["scenario", "load", "request_throughput_rps", "output_tokens_per_s",
                "ttft_p50_s", "ttft_p95_s", "itl_mean_ms", "tpot_mean_ms", "error_rate",
                "goodput_rps", "server_itl_mean_ms", "client_vs_server_itl",
                "client_vs_server_ttft", "peak_running", "peak_kv_cache_usage", "meets_slo"]
        print(table[cols].to_markdown(index=False, floatfmt=".3g"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
