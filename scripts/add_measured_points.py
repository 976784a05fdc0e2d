"""Add a GPU serving sweep to the measured points the predictions are calibrated by.

Reads the `serving_benchmark.csv` the serving_benchmark asset writes (one row per scenario x
concurrency), or the rows of one precision in a `bench/gpu_serving.py twins` recording
(`--twins-json`: the same rows, `PointStats.row()` per scenario x concurrency, under
`steps.<twin>:<precision>.rows`), turns each steady, error-free point into a measured point
(onboarding.predictions.predict.points_from_sweep_rows) with the model's config.json beside it, and writes
predict.yaml's points file (configs/predict/h200_points.json) with them added; a point of the
same configuration measured by the same engine is replaced. Then regenerate the docs:
`.venv/bin/python bench/predictions.py` (and `--record` for the CPU tests' recorded answers).

    .venv/bin/python scripts/add_measured_points.py --csv .data/reports/<model>/serving_benchmark.csv \\
        --model llama-3.1-8b-twin --config-json <dir>/config.json --config-key llama-3.1-8b \\
        --precision fp8 --tp 1 --gpus 1 --engine "vllm 0.22.0" --source "H200, tests/data/gpu/h200"
    .venv/bin/python scripts/add_measured_points.py --twins-json <run>/vllm-twins.json \\
        --model llama-3-1-8b-instruct-twin --config-json twins/llama-3-1-8b-instruct-twin/config.json \\
        --config-key llama-3.1-8b --precision fp8 --tp 1 --gpus 1 --engine "vllm 0.22.0" \\
        --max-num-seqs 32 --source "<run and date>"

A twins recording also says what ran (tensor parallel, engine, GPUs, --max-num-seqs); a flag
that contradicts it is refused, so a point is never labelled with a configuration it did not
measure.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onboarding.common.errors import ConfigError
from onboarding.common.files import write_atomic
from onboarding.predictions.predict import Scenario, add_points, points_from_sweep_rows
from resources.config_files import ConfigFiles

ROW_KEYS = ("scenario", "load", "completed")  # what points_from_sweep_rows reads of every row


def twins_step(path: Path, precision: str, step: str | None = None
               ) -> tuple[str, dict[str, Any]]:
    """The one step of a `bench/gpu_serving.py twins` recording at `precision` (or named `step`)
    that has sweep rows: (its key, its entry). ConfigError when the file is not such a
    recording, has no rows at that precision, or has several steps that do."""
    fix = "Pass a `bench/gpu_serving.py twins` recording (tests/data/gpu/*/vllm-twins.json)."
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(str(path), f"cannot be read ({exc.strerror})", fix) from None
    except ValueError as exc:
        raise ConfigError(str(path), f"is not JSON ({exc})", fix) from None
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, dict):
        raise ConfigError(str(path), "has no `steps` object: not a twins recording", fix)
    at = {k: e for k, e in steps.items() if isinstance(e, dict) and e.get("precision") == precision
          and (step is None or k == step)}
    swept = {k: e for k, e in at.items() if e.get("rows")}
    if not swept:
        seen = "; ".join(f"{k}: " + (f"{len(e['rows'])} rows" if e.get("rows") else
                                     str(e.get("error") or e.get("skipped") or "no rows"))
                         for k, e in steps.items() if isinstance(e, dict) and "precision" in e)
        raise ConfigError(str(path), f"has no sweep rows at precision {precision}"
                          + (f" in step {step!r}" if step else "") + f" (steps: {seen or 'none'})",
                          "Pass the precision (and --twins-step) the recording swept.")
    if len(swept) > 1:
        raise ConfigError(str(path), f"has {len(swept)} steps with rows at precision {precision} "
                          f"({', '.join(swept)})", "Pass --twins-step with the one to add.")
    key, entry = next(iter(swept.items()))
    if not isinstance(entry["rows"], list):
        raise ConfigError(f"{path}: steps.{key}.rows", "is not a list of sweep rows", fix)
    for i, row in enumerate(entry["rows"]):
        missing = [k for k in ROW_KEYS if k not in row] if isinstance(row, dict) else ROW_KEYS
        if missing:
            raise ConfigError(f"{path}: steps.{key}.rows.{i}", f"lacks {', '.join(missing)}: "
                              "not a serving sweep row (PointStats.row())", fix)
    return key, entry


def check_against_recording(key: str, entry: dict[str, Any], args: argparse.Namespace) -> None:
    """Refuse a flag that contradicts what the recording says ran (where it says so)."""
    params = entry.get("argv_params") or {}
    recorded = {"--tp": (args.tp, entry.get("tensor_parallel")),
                "--engine": (args.engine, entry.get("engine")),
                "--gpus": (args.gpus, len(entry["gpus"]) if isinstance(entry.get("gpus"), list)
                           else None),
                "--max-num-seqs": (args.max_num_seqs, params.get("max_num_seqs")),
                "--kv-cache-dtype": (args.kv_cache_dtype, params.get("kv_cache_dtype"))}
    wrong = [f"{flag} {ours} but it ran {theirs}" for flag, (ours, theirs) in recorded.items()
             if ours is not None and theirs is not None and ours != theirs]
    if wrong:
        raise ConfigError(f"{args.twins_json}: steps.{key}", "; ".join(wrong),
                          "Pass what the recording ran.")


def main() -> int:
    try:
        return add(parse_args())
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sweep = ap.add_mutually_exclusive_group(required=True)
    sweep.add_argument("--csv", type=Path, help="serving_benchmark.csv of the sweep")
    sweep.add_argument("--twins-json", type=Path, help="a `bench/gpu_serving.py twins` "
                       "recording (twins.json): the rows of its step at --precision")
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
    ap.add_argument("--twins-step", default=None, help="--twins-json: the step's key (e.g. "
                    "llama-3-1-8b-instruct-twin:fp8) where several have rows at --precision")
    return ap.parse_args()


def add(args: argparse.Namespace) -> int:
    if args.twins_json is not None:
        key, entry = twins_step(args.twins_json, args.precision, args.twins_step)
        check_against_recording(key, entry, args)
        rows = list(entry["rows"])
        ran = (entry.get("argv_params") or {}).get("max_num_seqs")
        if args.max_num_seqs is None and ran is not None:
            print(f"note: {key} ran --max-num-seqs {ran}; without --max-num-seqs {ran} the "
                  "loads above it (a queue, not a batch) are kept")
    else:
        with args.csv.open(newline="") as f:
            rows = list(csv.DictReader(f))

    configs = ConfigFiles(config_dir=args.config_dir)
    cfg = configs.predict()
    profile = configs.profiles()[args.profile]
    scenarios = {name: Scenario(input_tokens=s.input_tokens, output_tokens=s.output_tokens)
                 for name, s in profile.scenarios.items()}
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
