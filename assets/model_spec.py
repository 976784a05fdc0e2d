"""`model_spec`: each model's catalog entry as a versioned input, one partition per model.

Its data version per partition is a sha256 over the resolved spec (every field with its
defaults, as JSON: comments, key order and the file's layout do not count). The stages that read
the spec name it in their decorators (`deps=[MODEL_SPEC]`, beside `SERVING_STACK`), so editing
one entry's eval tasks, SLO overrides or engine args marks that model's results stale in the UI
and for the re-validation schedule, and no other model's. `checkpoint` does not depend on it
(its data version is the content it fetched), nor does `published_variant` (its content hash).

A materialization, not an observation as for `serving_stack`: Dagster 1.13 records a
partitioned dependency's input data version from the dependency's materializations only (an
observation of a partitioned source asset leaves every input version at the hash of nothing:
`dagster/_core/execution/context/data_version_cache.py`, `_get_partitions_data_version_from_keys`,
"TODO: this needs to account for observations also"). It stores no value: the stages read the
spec from the catalog, and record the version they read (`spec_metadata`). Recorded by
`catalog_partitions_sensor` (a runless materialization only for a partition whose version
changed), first in every onboarding and re-validation run (the jobs select it), and from the UI.
"""

import hashlib
import json

import dagster as dg

from assets.partitions import models_partitions
from onboarding.fetch.catalog import ModelSpec
from resources.config_files import ConfigFiles
from resources.upstream import latest_materialization

MODEL_SPEC = dg.AssetKey("model_spec")
DATA_VERSION_TAG = "dagster/data_version"
SPEC_VERSION_KEY = "model_spec_version"


def spec_version(spec: ModelSpec) -> str:
    """sha256 over the resolved spec: what the stages read, not how the file is written."""
    data = spec.model_dump(mode="json")
    if data.get("node_types") is None:  # unset: the version a spec had before the field
        data.pop("node_types", None)
    body = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def spec_metadata(spec: ModelSpec) -> dict[str, str]:
    """Metadata entry for a spec-dependent asset: the version of the spec this step read."""
    return {SPEC_VERSION_KEY: spec_version(spec)}


def recorded_version(instance: dg.DagsterInstance, model: str) -> str | None:
    """The version of `model`'s latest `model_spec` materialization (None before the first)."""
    mat = latest_materialization(instance, MODEL_SPEC, model)
    return (mat.tags or {}).get(DATA_VERSION_TAG) if mat is not None else None


def _metadata(version: str, before: str | None) -> dict[str, str]:
    return {"version": version, "previous_version": before or "none"}


def spec_events(instance: dg.DagsterInstance, configs: ConfigFiles, models: list[str]
                ) -> list[dg.AssetMaterialization]:
    """A runless materialization for each of `models` whose catalog entry resolves and whose
    version differs from the recorded one (a broken entry is the catalog sensor's to report)."""
    specs = configs.catalog().specs
    events = []
    for model in sorted(m for m in models if m in specs):
        version, before = spec_version(specs[model]), recorded_version(instance, model)
        if version != before:
            events.append(dg.AssetMaterialization(
                asset_key=MODEL_SPEC, partition=model, tags={DATA_VERSION_TAG: version},
                metadata=_metadata(version, before)))
    return events


@dg.asset(
    key=MODEL_SPEC,
    partitions_def=models_partitions,
    group_name="stack",
    description="The model's catalog entry (configs/models/*.yaml or a discovered spec), "
    "versioned by a hash of the resolved spec; stores nothing. An edit marks that model's "
    "spec-dependent results stale.",
)
def model_spec(context: dg.AssetExecutionContext, configs: ConfigFiles) -> dg.MaterializeResult:
    version = spec_version(configs.spec(context.partition_key))
    before = recorded_version(context.instance, context.partition_key)
    return dg.MaterializeResult(data_version=dg.DataVersion(version),
                                metadata=_metadata(version, before))


defs = dg.Definitions(assets=[model_spec])
