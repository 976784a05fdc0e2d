"""Predicted serving performance: `calibration` (over the recorded H200 points) -> `predictions`.

`calibration` predicts every measured point of predict.yaml's calibration file with
AIConfigurator and records measured/predicted per metric. `predictions` tabulates, per model,
every node type x precision x TP at the SLA scenario, corrected by that calibration, each with
its SLO verdict, coverage and plan.py's memory verdict, plus the TP and --max-num-seqs the SLA
would choose per node type. docs/predictions.md says how to read them.
"""


import base64
import json
from pathlib import Path

import dagster as dg

from assets.model_spec import MODEL_SPEC, spec_metadata
from assets.partitions import models_partitions
from onboarding.common.files import write_atomic
from onboarding.common.refs import CheckpointRef, VariantRef
from onboarding.common.tables import md_table
from onboarding.deploy.plan import build_plan
from onboarding.predictions.predict import (
    Calibration,
    PredictionTable,
    calibrate_points,
    predict_model,
)
from onboarding.predictions.predict import model_config_for as config_for
from onboarding.serving.plots import calibration_png
from onboarding.serving.profiles import resolve_slo
from resources.config_files import ConfigFiles, OutputDirs
from resources.predictor import AIConfiguratorPredictor

GROUP = "predict"
OPTIONAL = "optional_upstream"


@dg.asset(group_name=GROUP, description="AIConfigurator's predictions of the recorded H200 "
          "measurements, measured/predicted per metric: the correction every other node type's "
          "prediction carries.")
def calibration(configs: ConfigFiles, outputs: OutputDirs,
                predictor: AIConfiguratorPredictor) -> dg.Output[Calibration]:
    points = configs.measured_points()
    result, _ = calibrate_points(configs.predict(), points, predictor.predict,
                                 predictor.version())
    pairs = result.pair_rows()
    png = calibration_png(pairs, f"{result.node_type}: measured vs AIConfigurator "
                          f"{result.aic_version} ({result.points} points)")
    png_path = outputs.reports / "calibration" / "calibration.png"
    png_path.parent.mkdir(parents=True, exist_ok=True)
    png_path.write_bytes(png)
    return dg.Output(result, metadata={
        "calibration": dg.MetadataValue.md(md_table(result.rows())),
        "pairs": dg.MetadataValue.md(md_table(pairs, empty="(no measured point yet)")),
        "points": result.points,
        "skipped": dg.MetadataValue.json(list(result.skipped)),
        "aiconfigurator_version": result.aic_version,
        "data_set": result.data_set or "none",
        "plot": dg.MetadataValue.md(
            f"![calibration](data:image/png;base64,{base64.b64encode(png).decode()})"),
        "plot_path": dg.MetadataValue.path(str(png_path))})


def _checkpoint_config(checkpoint: CheckpointRef | None) -> dict | None:
    path = Path(checkpoint.path) / "config.json" if checkpoint else None
    return json.loads(path.read_text()) if path and path.is_file() else None


@dg.asset(partitions_def=models_partitions, group_name=GROUP, deps=[MODEL_SPEC],
          ins={"checkpoint": dg.AssetIn(input_manager_key=OPTIONAL),
               "serving_variant": dg.AssetIn(input_manager_key=OPTIONAL),
               "calibration": dg.AssetIn(input_manager_key=OPTIONAL)},
          description="Predicted TTFT, TPOT and tokens/s/GPU per node type x precision x TP "
          "(b300 above all), corrected by the H200 calibration, with SLO verdicts, coverage "
          "and the TP/max-num-seqs the SLA would choose.")
def predictions(context: dg.AssetExecutionContext, configs: ConfigFiles, outputs: OutputDirs,
                predictor: AIConfiguratorPredictor, checkpoint: CheckpointRef | None,
                serving_variant: VariantRef | None, calibration: Calibration | None
                ) -> dg.Output[PredictionTable]:
    spec, nodes, section = configs.spec(context.partition_key), configs.nodes(), \
        configs.slo_section()
    model_config, origin = config_for(spec, _checkpoint_config(checkpoint))
    # the SLA choice starts at the precision that passed the accuracy gate, as the plan does
    inputs = build_plan(spec, nodes, checkpoint, serving_variant).inputs
    table = predict_model(configs.predict(), spec, model_config, inputs, nodes,
                          lambda nt: resolve_slo(section, nt, spec), predictor.predict,
                          calibration)
    path = write_atomic(outputs.reports / spec.id / "predictions.md", table.markdown())
    covered = [r for r in table.rows if r.prediction.covered]
    lead = configs.predict().node_types[0]  # the node type listed first, shown on its own
    return dg.Output(table, metadata={
        lead: dg.MetadataValue.md(md_table(table.table_rows(lead))),
        "all_rows": dg.MetadataValue.md(md_table(table.table_rows())),
        "sla_choice": dg.MetadataValue.md(md_table([c.row() for c in table.choices])),
        "covered_rows": len(covered), "not_covered_rows": len(table.rows) - len(covered),
        "basis": covered[0].prediction.basis if covered else "nothing covered",
        "calibration": "absent (never materialized): uncorrected" if calibration is None
        else f"{calibration.points} points on {calibration.node_type}",
        "model_config_origin": origin, **spec_metadata(spec),
        "report_path": dg.MetadataValue.path(str(path))})


defs = dg.Definitions(assets=[calibration, predictions])
