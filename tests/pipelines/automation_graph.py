"""The onboarding graph with trivial bodies, wired by the real automation code.

Stage names, argument inputs, `deps` (serving_stack and model_spec named in the decorator,
beside argument inputs, as the real stages do) and the serving stages' config classes mirror the
real modules. The automation under test, the serving_stack and model_spec assets, the sensors,
the schedule and the jobs, is the real one, and so are the stack fingerprint and the spec
version each dependent stage records (`stack_metadata`, `spec_metadata`). No
`from __future__ import annotations`: Dagster reads the config
annotations at decoration.
"""

import dagster as dg

from assets.model_spec import MODEL_SPEC, model_spec, spec_metadata
from assets.partitions import models_partitions
from assets.serving import LoadTimingConfig, ServingBenchmarkConfig
from assets.stack import SERVING_STACK, serving_stack, stack_metadata
from pipelines.jobs import onboard_model
from pipelines.launch import onboard_registered_model, register_model
from pipelines.schedules import revalidate_job, revalidation_schedule, revalidation_sensors
from pipelines.sensors import sensors
from resources.config_files import ConfigFiles

P = models_partitions
GATE = "accuracy_gate"
BROKEN_VLLM = "0.34.0-regressed"


@dg.asset(partitions_def=P)
def checkpoint() -> str:
    return "ckpt"


def _recorded(context: dg.AssetExecutionContext, configs: ConfigFiles) -> dict:
    """What a stage that depends on both inputs records: the stack and the spec it read."""
    return {**stack_metadata(configs), **spec_metadata(configs.spec(context.partition_key))}


@dg.asset(partitions_def=P, deps=[SERVING_STACK, MODEL_SPEC])
def quantized(context: dg.AssetExecutionContext, checkpoint: str, configs: ConfigFiles):
    return dg.Output(checkpoint + "+q", metadata=_recorded(context, configs))


@dg.asset(partitions_def=P, deps=[SERVING_STACK, MODEL_SPEC],
          check_specs=[dg.AssetCheckSpec(GATE, asset="accuracy", blocking=True)])
def accuracy(context: dg.AssetExecutionContext, quantized: str, configs: ConfigFiles):
    """The gate fails on the stack version BROKEN_VLLM, as a real regression would."""
    vllm = configs.stack_config()["versions"]["vllm"]
    yield dg.Output(quantized + "+acc", metadata=_recorded(context, configs))
    yield dg.AssetCheckResult(check_name=GATE, passed=vllm != BROKEN_VLLM,
                              metadata={"vllm": vllm})


@dg.asset(partitions_def=P, deps=[MODEL_SPEC])
def serving_variant(context: dg.AssetExecutionContext, accuracy: str, configs: ConfigFiles):
    return dg.Output(accuracy + "+variant",
                     metadata=spec_metadata(configs.spec(context.partition_key)))


@dg.asset(partitions_def=P, deps=[SERVING_STACK, MODEL_SPEC])
def load_timing(context: dg.AssetExecutionContext, config: LoadTimingConfig,
                serving_variant: str, configs: ConfigFiles) -> str:
    context.add_output_metadata({"cold_repeats": config.cold_repeats or 0,
                                 **_recorded(context, configs)})
    return serving_variant + "+load"


@dg.asset(partitions_def=P, deps=[SERVING_STACK, MODEL_SPEC])
def serving_benchmark(context: dg.AssetExecutionContext, config: ServingBenchmarkConfig,
                      load_timing: str, configs: ConfigFiles) -> str:
    context.add_output_metadata({"concurrency": str(config.concurrency),
                                 **_recorded(context, configs)})
    return load_timing + "+bench"


@dg.asset(partitions_def=P, deps=["checkpoint", "serving_benchmark", SERVING_STACK, MODEL_SPEC])
def serving_config(context: dg.AssetExecutionContext, configs: ConfigFiles):
    return dg.Output("plan", metadata=_recorded(context, configs))


@dg.asset(partitions_def=P, deps=[SERVING_STACK, MODEL_SPEC])
def kserve_manifest(context: dg.AssetExecutionContext, serving_config: str, configs: ConfigFiles):
    return dg.Output(serving_config + "+yaml", metadata=_recorded(context, configs))


STAGES = [checkpoint, quantized, accuracy, serving_variant, load_timing, serving_benchmark,
          serving_config, kserve_manifest]


def build_defs(resources: dict | None = None, configs: ConfigFiles | None = None
               ) -> dg.Definitions:
    return dg.Definitions(
        assets=[serving_stack, model_spec, *STAGES],
        jobs=[onboard_model, revalidate_job, register_model],
        schedules=[revalidation_schedule],
        sensors=[*sensors, *revalidation_sensors, onboard_registered_model],
        resources={"configs": configs or ConfigFiles(), "io_manager": dg.FilesystemIOManager(),
                   **(resources or {})})


def store_readiness(instance: dg.DagsterInstance, verdict) -> None:
    """A `readiness` materialization that stores exactly `verdict` (a Readiness), and records
    no metadata: what reads the verdict must read the stored value."""

    @dg.asset(name="readiness", partitions_def=P)
    def _readiness():
        return verdict

    assert dg.materialize([_readiness], instance=instance, partition_key=verdict.model).success
