"""Launching from the UI: `register_model` takes a model in plain terms and onboards it.

The launchpad shows `RegisterModel`'s fields with their defaults (source, precision ladder,
scenarios, quick/full sweep). The run validates them with the catalog's rules, writes the spec
where every stage resolves it (the discovered-specs directory), registers the partition, and on
success `onboard_registered_model` requests the onboarding run with the chosen sweep as run
config of the stages that take one. A catalogued model needs none of this: its partition is
registered by `catalog_partitions_sensor`, and "Materialize" on it launches `onboard_model`.
"""

import dagster as dg
from pydantic import Field

from assets.partitions import models_partitions
from onboarding.common.errors import ConfigError
from onboarding.fetch.catalog import parse_spec
from onboarding.fetch.discovery import write_discovered_spec
from pipelines.jobs import onboard_model
from resources.config_files import ConfigFiles


class RegisterModel(dg.Config):
    """One model to onboard. Unset fields take the catalog's defaults (configs/models/
    _defaults.yaml), as a catalog entry and a dropped checkpoint do."""

    id: str = Field(description="partition key: lowercase letters, digits and '-'")
    source: str = Field(description="s3://<bucket>/<prefix>/ or hf://<org>/<name>@<revision>")
    served_name: str | None = Field(default=None, description="OpenAI model name; default: id")
    precision_ladder: list[str] | None = Field(
        default=None, description="tried in order; the first that passes the accuracy gate is "
        "served; empty: the catalog's default (configs/models/_defaults.yaml)")
    scenarios: list[str] | None = Field(
        default=None, description="traffic profiles from configs/scenarios.yaml; empty: the "
        "catalog's default (configs/models/_defaults.yaml)")
    sweep: str = Field(
        default="", description="a sweep of configs/automation.yaml launch.sweeps (quick is a "
        "smoke pass, full the profile's whole sweep); empty: launch.default_sweep")
    description: str = ""


@dg.op(description="Validate the model spec, store it, register the partition.")
def register_model_spec(context: dg.OpExecutionContext, config: RegisterModel,
                        configs: ConfigFiles) -> dg.Output:
    data = config.model_dump(exclude={"sweep"}, exclude_none=True)
    catalog = configs.catalogued()
    spec = parse_spec({"served_name": config.id, **data}, "register_model launch config",
                      defaults=catalog.defaults)
    launch = configs.automation().launch
    sweep = config.sweep or launch.default_sweep
    catalogued = catalog.specs
    if spec.id in catalogued:
        raise ConfigError(f"register_model: id {spec.id!r}", "is a catalog entry "
                          f"(source {catalogued[spec.id].source})", "Launch onboard_model on "
                          "that partition (edit configs/models to change it), or pick another "
                          "id.")
    known = configs.discovered().specs
    if spec.id in known and known[spec.id].source != spec.source:
        raise ConfigError(f"register_model: id {spec.id!r}", "is already registered with "
                          f"source {known[spec.id].source}", "Pick another id.")
    launch.run_config(sweep)  # an unknown sweep fails here, not later
    path = write_discovered_spec(configs.discovered_path, spec, "register_model")
    context.instance.add_dynamic_partitions(models_partitions.name, [spec.id])
    context.log.info(f"registered {spec.id!r} from {spec.source}; onboarding follows "
                     f"({sweep} sweep)")
    return dg.Output(spec.id, metadata={"spec_path": dg.MetadataValue.path(str(path)),
                                        "spec": dg.MetadataValue.json(spec.model_dump()),
                                        "sweep": sweep})


@dg.job(description="Register a model (source, precision ladder, scenarios, sweep) and "
        "onboard it.", tags={"onboarding/trigger": "ui"})
def register_model():
    register_model_spec()


def job_stages(repository_def, job_name: str) -> set[str] | None:
    """Asset names of a job in the loaded code location, or None where it cannot be seen."""
    if repository_def is None or not repository_def.has_job(job_name):
        return None
    job = repository_def.get_job(job_name)
    return {k.to_user_string() for k in job.asset_layer.executable_asset_keys}


@dg.run_status_sensor(run_status=dg.DagsterRunStatus.SUCCESS, monitored_jobs=[register_model],
                      request_job=onboard_model, default_status=dg.DefaultSensorStatus.RUNNING,
                      description="Starts onboarding a model registered from the UI.")
def onboard_registered_model(context: dg.RunStatusSensorContext, configs: ConfigFiles):
    config = context.dagster_run.run_config["ops"]["register_model_spec"]["config"]
    launch = configs.automation().launch
    sweep = config.get("sweep") or launch.default_sweep
    stages = job_stages(context.repository_def, onboard_model.name)
    return dg.RunRequest(
        partition_key=config["id"],
        run_key=f"register-{context.dagster_run.run_id}",
        run_config=launch.run_config(sweep, stages),
        tags={"onboarding/trigger": "ui", "onboarding/sweep": sweep,
              "onboarding/registered_by": context.dagster_run.run_id},
    )
