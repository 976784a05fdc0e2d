"""A small partitioned graph for the Postgres instance test: a CPU asset, then one in the `gpu`
pool carrying the local GPU-slot tag, run by the project's multiprocess executor so that step
subprocesses write their events and claim pool slots through Postgres."""

import dagster as dg

from assets.partitions import models_partitions
from assets.step_tags import GPU_SLOT_TAG
from pipelines.executors import onboarding_executor


@dg.asset(partitions_def=models_partitions)
def weights_manifest(context: dg.AssetExecutionContext) -> dict:
    return {"model": context.partition_key, "files": 3}


@dg.asset(partitions_def=models_partitions, pool="gpu", op_tags={GPU_SLOT_TAG: "true"})
def gpu_measurement(context: dg.AssetExecutionContext, weights_manifest: dict) -> dg.Output:
    value = weights_manifest["files"] * 2
    return dg.Output(value, metadata={"model": context.partition_key, "value": value},
                     data_version=dg.DataVersion(f"{context.partition_key}-{value}"))


def pg_job() -> dg.JobDefinition:
    return dg.Definitions(
        assets=[weights_manifest, gpu_measurement],
        jobs=[dg.define_asset_job("pg_onboard",
                                  executor_def=onboarding_executor("multiprocess"))],
    ).resolve_job_def("pg_onboard")
