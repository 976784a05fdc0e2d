"""The onboarding graph with trivial bodies, wired by the real automation code.

Stage names, argument inputs, `deps`, the serving stages' config classes and the stack
fingerprint each stack-dependent stage records (`stack_metadata`) mirror the real modules
(argument inputs matter: adding the `serving_stack` dep must keep them). The automation
under test, the serving_stack asset, the sensors, the schedule and the jobs, is the real one.
No `from __future__ import annotations`: Dagster reads the config annotations at decoration.
"""

import dagster as dg

from assets.serving import LoadTimingConfig, ServingBenchmarkConfig
from assets.stack import serving_stack, stack_metadata
from onboarding.paths import config_dir
from onboarding.stack import read_stack_config
from pipelines.automation import with_automation
from pipelines.jobs import onboard_model
from pipelines.partitions import models_partitions

P = models_partitions
GATE = "accuracy_gate"
BROKEN_VLLM = "0.34.0-regressed"


@dg.asset(partitions_def=P)
def checkpoint() -> str:
    return "ckpt"


@dg.asset(partitions_def=P)
def quantized(checkpoint: str):
    return dg.Output(checkpoint + "+q", metadata=stack_metadata())


@dg.asset(partitions_def=P, check_specs=[dg.AssetCheckSpec(GATE, asset="accuracy",
                                                          blocking=True)])
def accuracy(quantized: str):
    """The gate fails on the stack version BROKEN_VLLM, as a real regression would."""
    vllm = read_stack_config(config_dir() / "stack.yaml")["versions"]["vllm"]
    yield dg.Output(quantized + "+acc", metadata=stack_metadata())
    yield dg.AssetCheckResult(check_name=GATE, passed=vllm != BROKEN_VLLM,
                              metadata={"vllm": vllm})


@dg.asset(partitions_def=P)
def serving_variant(accuracy: str) -> str:
    return accuracy + "+variant"


@dg.asset(partitions_def=P)
def load_timing(context: dg.AssetExecutionContext, config: LoadTimingConfig,
                serving_variant: str) -> str:
    context.add_output_metadata({"cold_repeats": config.cold_repeats or 0, **stack_metadata()})
    return serving_variant + "+load"


@dg.asset(partitions_def=P)
def serving_benchmark(context: dg.AssetExecutionContext, config: ServingBenchmarkConfig,
                      load_timing: str) -> str:
    context.add_output_metadata({"concurrency": str(config.concurrency), **stack_metadata()})
    return load_timing + "+bench"


@dg.asset(partitions_def=P, deps=["checkpoint", "serving_benchmark"])
def deployment_plan():
    return dg.Output("plan", metadata=stack_metadata())


@dg.asset(partitions_def=P)
def kserve_manifest(deployment_plan: str):
    return dg.Output(deployment_plan + "+yaml", metadata=stack_metadata())


STAGES = [checkpoint, quantized, accuracy, serving_variant, load_timing, serving_benchmark,
          deployment_plan, kserve_manifest]


def build_defs(resources: dict | None = None) -> dg.Definitions:
    return with_automation(dg.Definitions(assets=[serving_stack, *STAGES], jobs=[onboard_model],
                                          resources=resources or {}))
