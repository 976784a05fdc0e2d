"""The B300 predictions of docs/predictions.md, regenerated offline on a CPU.

Runs the project's own code (onboarding/predictions/predict.py, resources/predictor.py) exactly as the
`calibration` and `predictions` assets do: the recorded H200 points of configs/predict.yaml are
predicted by AIConfigurator and give measured/predicted per metric; then every catalog model is
predicted on `--node-type` (b300) for each precision of its ladder and TP 1-8 at the SLA scenario,
corrected by that calibration, judged against the node type's SLO, beside plan.py's memory
verdict, with the TP/--max-num-seqs the SLA would choose. Writes the generated sections of
docs/predictions.md (between its `generated` markers) and the calibration plot beside it.

    .venv/bin/python bench/predictions.py [--node-type b300] [--check]
    .venv/bin/python bench/predictions.py --record tests/data/predict/recorded_predictions.json

`--check` regenerates into memory and exits 1 when docs/predictions.md differs (stale numbers).
`--record` writes the library's raw answers for the calibration points and llama-3-1-70b on the
node type (the CPU tests replay them through the calibration and the SLA choice).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onboarding.common.errors import ConfigError
from onboarding.common.tables import md_table, splice_generated
from onboarding.deploy.plan import (
    Measured,
    NodesConfig,
    PlanInputs,
    param_count_from_safetensors,
    plan_inputs,
    shape_from_config,
    shape_from_hint,
)
from onboarding.fetch.catalog import ModelSpec
from onboarding.predictions.predict import (
    Calibration,
    PredictionTable,
    calibrate_points,
    model_config_for,
    point_request,
    predict_model,
    prediction_to_dict,
)
from onboarding.serving.plots import calibration_png
from onboarding.serving.profiles import resolve_slo
from resources.config_files import ConfigFiles
from resources.predictor import AIConfiguratorPredictor

DOC = ROOT / "docs" / "predictions.md"
PLOT = ROOT / "docs" / "predictions-calibration.png"
CHECKPOINTS = ROOT / ".cache"  # the demo model's converted checkpoint, when set up


def _checkpoint(spec: ModelSpec) -> Path | None:
    name = spec.source.rstrip("/").rsplit("/", 1)[-1]
    path = CHECKPOINTS / name
    return path if (path / "config.json").is_file() else None


def _inputs(spec: ModelSpec, nodes: NodesConfig) -> tuple[dict, str, PlanInputs]:
    ckpt = _checkpoint(spec)
    config = json.loads((ckpt / "config.json").read_text()) if ckpt else None
    model_config, origin = model_config_for(spec, config)
    if ckpt is not None:
        shape, params = shape_from_config(config, str(ckpt)), param_count_from_safetensors(ckpt)
    else:
        shape, params = shape_from_hint(spec.architecture, spec.id), None
    return model_config, origin, plan_inputs(spec, nodes, shape, Measured(), params)


def calibration_section(cal: Calibration, points_file: str) -> str:
    return "\n\n".join([
        (f"Measured points: `configs/{points_file}` ({cal.points} configurations); predicted "
         f"by AIConfigurator {cal.aic_version} from `{cal.data_set}`."),
        md_table(cal.rows()),
        md_table(cal.pair_rows(), empty="(no measured point yet)"),
        *([f"Not paired: {'; '.join(cal.skipped)}"] if cal.skipped else []),
        f"![predicted vs measured on the H200]({PLOT.name})"])


def model_section(table: PredictionTable, origin: str, node_type: str) -> str:
    rows = [{k: v for k, v in r.items() if k != "node_type"}
            for r in table.table_rows(node_type)]
    choice = [c.row() for c in table.choices if c.node_type == node_type]
    covered = [r.prediction.basis for r in table.rows
               if r.prediction.covered and r.prediction.prediction.request.node_type == node_type]
    return "\n\n".join([
        f"### {table.model}", f"Model config: {origin}.", md_table(rows),
        "SLA choice (TP and --max-num-seqs by the predicted SLO, within memory):",
        md_table(choice),
        f"Basis: {covered[0] if covered else 'nothing covered'}."])


def generate(node_type: str) -> tuple[str, str, bytes, float]:
    configs = ConfigFiles()
    predictor = AIConfiguratorPredictor()
    cfg, nodes, section = configs.predict(), configs.nodes(), configs.slo_section()
    cfg = cfg.model_copy(update={"node_types": [node_type]})
    t0 = time.monotonic()
    cal, _ = calibrate_points(cfg, configs.measured_points(), predictor.predict,
                              predictor.version())
    parts = []
    for spec in sorted(configs.catalogued().strict().values(), key=lambda s: s.id):
        try:
            model_config, origin, inputs = _inputs(spec, nodes)
        except ConfigError as exc:  # the predictions asset fails the same way, saying this
            parts.append(f"### {spec.id}\n\nNot predicted: {exc}")
            continue
        table = predict_model(cfg, spec, model_config, inputs, nodes,
                              lambda nt, s=spec: resolve_slo(section, nt, s), predictor.predict,
                              cal)
        parts.append(model_section(table, origin, node_type))
    png = calibration_png(cal.pair_rows(), f"{cal.node_type}: measured vs AIConfigurator "
                          f"{cal.aic_version} ({cal.points} points)")
    return (calibration_section(cal, cfg.calibration.points), "\n\n".join(parts), png,
            time.monotonic() - t0)


def record(path: Path, node_type: str) -> None:
    """The library's answers for the calibration points and one catalog model, verbatim."""
    configs, predictor = ConfigFiles(), AIConfiguratorPredictor()
    cfg, nodes, section = configs.predict(), configs.nodes(), configs.slo_section()
    cfg = cfg.model_copy(update={"node_types": [node_type]})
    points = configs.measured_points()
    answers = [predictor.predict(point_request(cfg, points, p)) for p in points.points]
    spec = configs.catalogued().resolve("llama-3-1-70b-instruct")
    model_config = _inputs(spec, nodes)[0]
    seen: list = []

    def keep(request):
        p = predictor.predict(request)
        seen.append(p)
        return p

    for ladder in (spec.precision_ladder, ["bf16"]):  # bf16 alone: where the SLA binds
        s = spec.model_copy(update={"precision_ladder": ladder})
        inputs = _inputs(s, nodes)[2]
        predict_model(cfg, s, model_config, inputs, nodes,
                      lambda nt, s=s: resolve_slo(section, nt, s), keep, None)
    seen = list({p.request: p for p in seen}.values())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "recorded_by": "bench/predictions.py --record", "aiconfigurator": predictor.version(),
        "points": [prediction_to_dict(p) for p in answers],
        "model": spec.id, "predictions": [prediction_to_dict(p) for p in seen]}, indent=1) + "\n")
    print(f"recorded {len(answers)} point and {len(seen)} model predictions in {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--node-type", default="b300")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--record", type=Path, help="write the raw predictions here and stop")
    args = ap.parse_args()
    if args.record:
        record(args.record, args.node_type)
        return 0
    cal_md, table_md, png, seconds = generate(args.node_type)
    doc = DOC.read_text()
    new = splice_generated(splice_generated(doc, "calibration", cal_md),
                           f"{args.node_type} table", table_md)
    print(f"predicted in {seconds:.1f} s")
    if args.check:
        print("docs/predictions.md is current" if new == doc else
              "docs/predictions.md is stale: run bench/predictions.py")
        return 0 if new == doc else 1
    DOC.write_text(new)
    PLOT.write_bytes(png)
    print(f"wrote {DOC.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
