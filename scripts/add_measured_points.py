"""Add a GPU serving sweep to the measured points the predictions are calibrated by.

Reads the `serving_benchmark.csv` the serving_benchmark asset writes (one row per scenario x
concurrency), turns each steady, error-free point into a measured point
(onboarding.predictions.predict.points_from_sweep_rows) with the model's config.json beside it, and writes
predict.yaml's points file (configs/predict/h200_points.json) with them added; a point of the
same configuration measured by the same engine is replaced. Then regenerate the docs:
`.venv/bin/python bench/predictions.py` (and `--record` for the CPU tests' recorded answers).

    .venv/bin/python scripts/add_measured_points.py --csv .data/reports/<model>/serving_benchmark.csv \\
        --model llama-3.1-8b-twin --config-json <dir>/config.json --config-key llama-3.1-8b \\
        --precision fp8 --tp 1 --gpus 1 --engine "vllm 0.22.0" --source "H200 run, issue 14"
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onboarding.common.files import write_atomic
from onboarding.predictions.predict import Scenario, add_points, points_from_sweep_rows
from resources.config_files import ConfigFiles


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, required=True, help="serving_benchmark.csv of the sweep")
    ap.add_argument("--model", required=True, help="a name for the measured model")
    ap.add_argument("--config-json", type=Path, required=True, help="the model's config.json")
    ap.add_argument("--config-key", required=True, help="its key under model_configs")
    ap.add_argument("--precision", required=True, choices=["bf16", "fp8", "nvfp4"])
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--engine", required=True, help="e.g. 'vllm 0.22.0'")
    ap.add_argument("--source", required=True, help="the run these numbers come from")
    ap.add_argument("--kv-cache-dtype", default=None)
    ap.add_argument("--profile", default="gpu", help="scenarios.yaml profile the sweep ran")
    ap.add_argument("--node-type", default=None, help="default: predict.yaml calibration's")
    ap.add_argument("--measured-on", default=date.today().isoformat())
    ap.add_argument("--config-dir", default="", help="default: the repository's configs/")
    ap.add_argument("--max-num-seqs", type=int, default=None,
                    help="the engine's --max-num-seqs: rows above it measured a queue, left out")
    ap.add_argument("--client-error-cause", action="append", default=[],
                    help="an error cause that is the client's accounting, not the engine's "
                    "(e.g. no_content for the twins): such rows keep TTFT and TPOT, not tokens/s")
    args = ap.parse_args()

    configs = ConfigFiles(config_dir=args.config_dir)
    cfg = configs.predict()
    profile = configs.profiles()[args.profile]
    scenarios = {name: Scenario(input_tokens=s.input_tokens, output_tokens=s.output_tokens)
                 for name, s in profile.scenarios.items()}
    with args.csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    new = points_from_sweep_rows(
        rows, scenarios, model=args.model, config=args.config_key, precision=args.precision,
        node_type=args.node_type or cfg.calibration.node_type, tensor_parallel=args.tp,
        gpus=args.gpus, engine=args.engine, source=args.source, measured_on=args.measured_on,
        expert_parallel=args.ep, kv_cache_dtype=args.kv_cache_dtype,
        max_num_seqs=args.max_num_seqs, client_error_causes=frozenset(args.client_error_cause))
    path = configs.data_path(cfg.calibration.points)
    updated = add_points(configs.measured_points(), new, args.config_key,
                         json.loads(args.config_json.read_text()))
    write_atomic(path, json.dumps(updated.model_dump(), indent=1) + "\n")
    print(f"{len(new)} of {len(rows)} sweep rows added to {path} "
          f"({len(updated.points)} points in all)")
    for p in new:
        print(f"  {p.key}: TTFT p50 {p.ttft_p50_ms} ms, p95 {p.ttft_p95_ms} ms, "
              f"TPOT {p.tpot_mean_ms} ms, output tokens/s {p.output_tokens_per_s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
