"""The onboarding graph with trivial bodies, wired by the real automation code.

Stage names, argument inputs, `deps` (serving_stack and model_spec named in the decorator,
beside argument inputs, as the real stages do), partitioning and level tags (a model's own
stages per model; what is measured on a GPU, or judged from such a measurement, per
(model, node type) cell) and the serving stages' config classes mirror the real modules. The
automation under test, the serving_stack and model_spec assets, the sensors, the schedules and
the jobs, is the real one, and so are the stack fingerprint and the spec version each dependent
stage records (`stack_metadata`, `spec_metadata`). No `from __future__ import annotations`:
Dagster reads the config annotations at decoration.
"""

import dagster as dg

from assets.model_spec import MODEL_SPEC, model_spec, spec_metadata
from assets.partitions import (
    CELL_DERIVED,
    CELL_MEASURED,
    cell_key,
    cells_partitions,
    model_of,
    models_partitions,
)
from assets.serving import LoadTimingConfig, ServingBenchmarkConfig
from assets.stack import SERVING_STACK, serving_stack, stack_metadata
from pipelines.cells import cells_after_model
from pipelines.jobs import onboard_cell, onboard_model, plan_cell
from pipelines.launch import onboard_registered_model, register_model
from pipelines.schedules import (
    cell_revalidation_schedule,
    revalidate_cell_job,
    revalidate_job,
    revalidation_schedule,
    revalidation_sensors,
)
from pipelines.sensors import sensors
from resources.config_files import ConfigFiles

P = models_partitions
GATE = "accuracy_gate"  # a model-level check (blocking, as the real accuracy gate)
SLO = "slo_met"  # a cell-level check (blocking, as the real serving_benchmark SLO check)
BROKEN_VLLM = "0.34.0-regressed"  # fails the accuracy gate
SLOW_VLLM = "0.35.0-slow"  # passes the accuracy gate, misses the SLO on every node type


@dg.asset(partitions_def=P)
def checkpoint() -> str:
    return "ckpt"


def _recorded(context: dg.AssetExecutionContext, configs: ConfigFiles) -> dict:
    """What a stage that depends on both inputs records: the stack and the spec it read."""
    return {**stack_metadata(configs), **spec_metadata(configs.spec(model_of(context)))}


def _vllm(configs: ConfigFiles) -> str:
    return configs.stack_config()["versions"]["vllm"]


@dg.asset(partitions_def=P, deps=[SERVING_STACK, MODEL_SPEC])
def quantized(context: dg.AssetExecutionContext, checkpoint: str, configs: ConfigFiles):
    return dg.Output(checkpoint + "+q", metadata=_recorded(context, configs))


@dg.asset(partitions_def=P, deps=[SERVING_STACK, MODEL_SPEC],
          check_specs=[dg.AssetCheckSpec(GATE, asset="accuracy", blocking=True)])
def accuracy(context: dg.AssetExecutionContext, quantized: str, configs: ConfigFiles):
    """The gate fails on the stack version BROKEN_VLLM, as a real regression would."""
    vllm = _vllm(configs)
    yield dg.Output(quantized + "+acc", metadata=_recorded(context, configs))
    yield dg.AssetCheckResult(check_name=GATE, passed=vllm != BROKEN_VLLM,
                              metadata={"vllm": vllm})


@dg.asset(partitions_def=P, deps=[MODEL_SPEC])
def serving_variant(context: dg.AssetExecutionContext, accuracy: str, configs: ConfigFiles):
    return dg.Output(accuracy + "+variant",
                     metadata=spec_metadata(configs.spec(model_of(context))))


@dg.asset(partitions_def=P, deps=["checkpoint", SERVING_STACK, MODEL_SPEC])
def serving_config(context: dg.AssetExecutionContext, configs: ConfigFiles):
    """Per model: the plan of every node type; it reads no cell (a cell reads it)."""
    return dg.Output("plan", metadata=_recorded(context, configs))


@dg.asset(partitions_def=cells_partitions, tags=CELL_MEASURED, deps=[SERVING_STACK, MODEL_SPEC])
def load_timing(context: dg.AssetExecutionContext, config: LoadTimingConfig,
                serving_variant: str, serving_config: str, configs: ConfigFiles) -> str:
    context.add_output_metadata({"cold_repeats": config.cold_repeats or 0,
                                 **_recorded(context, configs)})
    return serving_variant + "+load"


@dg.asset(partitions_def=cells_partitions, tags=CELL_MEASURED, deps=[SERVING_STACK, MODEL_SPEC],
          check_specs=[dg.AssetCheckSpec(SLO, asset="serving_benchmark", blocking=True)])
def serving_benchmark(context: dg.AssetExecutionContext, config: ServingBenchmarkConfig,
                      load_timing: str, configs: ConfigFiles):
    """The SLO check fails on the stack version SLOW_VLLM, as a real slowdown would."""
    vllm = _vllm(configs)
    yield dg.Output(load_timing + "+bench",
                    metadata={"concurrency": str(config.concurrency),
                              **_recorded(context, configs)})
    yield dg.AssetCheckResult(check_name=SLO, passed=vllm != SLOW_VLLM, metadata={"vllm": vllm})


@dg.asset(partitions_def=cells_partitions, tags=CELL_DERIVED, deps=[SERVING_STACK, MODEL_SPEC])
def kserve_manifest(context: dg.AssetExecutionContext, serving_config: str,
                    serving_benchmark: str, configs: ConfigFiles):
    return dg.Output(serving_config + "+" + serving_benchmark + "+yaml",
                     metadata=_recorded(context, configs))


MODEL_STAGES = [checkpoint, quantized, accuracy, serving_variant, serving_config]
CELL_STAGES = [load_timing, serving_benchmark, kserve_manifest]
STAGES = [*MODEL_STAGES, *CELL_STAGES]


def build_defs(resources: dict | None = None, configs: ConfigFiles | None = None
               ) -> dg.Definitions:
    return dg.Definitions(
        assets=[serving_stack, model_spec, *STAGES],
        jobs=[onboard_model, onboard_cell, plan_cell, revalidate_job, revalidate_cell_job,
              register_model],
        schedules=[revalidation_schedule, cell_revalidation_schedule],
        sensors=[*sensors, *revalidation_sensors, onboard_registered_model, cells_after_model],
        resources={"configs": configs or ConfigFiles(), "io_manager": dg.FilesystemIOManager(),
                   **(resources or {})})


def store_readiness(instance: dg.DagsterInstance, verdict, node_type: str = "h200") -> None:
    """A `readiness` materialization of the cell (verdict.model, node_type) that stores exactly
    `verdict` (a Readiness), and records no metadata: what reads the verdict must read the
    stored value. Both partitions must be registered."""

    @dg.asset(name="readiness", partitions_def=cells_partitions, tags=CELL_DERIVED)
    def _readiness():
        return verdict

    assert dg.materialize([_readiness], instance=instance,
                          partition_key=cell_key(verdict.model, node_type)).success
