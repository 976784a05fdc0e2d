"""The onboarding graph with trivial bodies, wired by the real automation code.

Stage names, argument inputs, `deps` (serving_stack named in the decorator, beside argument
inputs, as the real stages do) and the serving stages' config classes mirror the real modules.
The automation under test, the serving_stack asset, the sensors, the schedule and the jobs, is
the real one, and so is the stack fingerprint each stack-dependent stage records
(`stack_metadata`). No `from __future__ import annotations`: Dagster reads the config
annotations at decoration.
"""

import dagster as dg

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


@dg.asset(partitions_def=P, deps=[SERVING_STACK])
def quantized(checkpoint: str, configs: ConfigFiles):
    return dg.Output(checkpoint + "+q", metadata=stack_metadata(configs))


@dg.asset(partitions_def=P, deps=[SERVING_STACK],
          check_specs=[dg.AssetCheckSpec(GATE, asset="accuracy", blocking=True)])
def accuracy(quantized: str, configs: ConfigFiles):
    """The gate fails on the stack version BROKEN_VLLM, as a real regression would."""
    vllm = configs.stack_config()["versions"]["vllm"]
    yield dg.Output(quantized + "+acc", metadata=stack_metadata(configs))
    yield dg.AssetCheckResult(check_name=GATE, passed=vllm != BROKEN_VLLM,
                              metadata={"vllm": vllm})


@dg.asset(partitions_def=P)
def serving_variant(accuracy: str) -> str:
    return accuracy + "+variant"


@dg.asset(partitions_def=P, deps=[SERVING_STACK])
def load_timing(context: dg.AssetExecutionContext, config: LoadTimingConfig,
                serving_variant: str, configs: ConfigFiles) -> str:
    context.add_output_metadata({"cold_repeats": config.cold_repeats or 0,
                                 **stack_metadata(configs)})
    return serving_variant + "+load"


@dg.asset(partitions_def=P, deps=[SERVING_STACK])
def serving_benchmark(context: dg.AssetExecutionContext, config: ServingBenchmarkConfig,
                      load_timing: str, configs: ConfigFiles) -> str:
    context.add_output_metadata({"concurrency": str(config.concurrency),
                                 **stack_metadata(configs)})
    return load_timing + "+bench"


@dg.asset(partitions_def=P, deps=["checkpoint", "serving_benchmark", SERVING_STACK])
def serving_config(configs: ConfigFiles):
    return dg.Output("plan", metadata=stack_metadata(configs))


@dg.asset(partitions_def=P, deps=[SERVING_STACK])
def kserve_manifest(serving_config: str, configs: ConfigFiles):
    return dg.Output(serving_config + "+yaml", metadata=stack_metadata(configs))


STAGES = [checkpoint, quantized, accuracy, serving_variant, load_timing, serving_benchmark,
          serving_config, kserve_manifest]


def build_defs(resources: dict | None = None, configs: ConfigFiles | None = None
               ) -> dg.Definitions:
    return dg.Definitions(
        assets=[serving_stack, *STAGES], jobs=[onboard_model, revalidate_job, register_model],
        schedules=[revalidation_schedule],
        sensors=[*sensors, *revalidation_sensors, onboard_registered_model],
        resources={"configs": configs or ConfigFiles(), **(resources or {})})
