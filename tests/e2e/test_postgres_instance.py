"""The production instance configuration (dagster-postgres storage) against a real PostgreSQL.

Runs the graph's real first stage (`checkpoint`, fetching from the local S3 server) and a
partitioned two-step job on the project's multiprocess executor, whose step subprocesses write
events and claim `gpu` pool slots through Postgres. Skipped only when the PostgreSQL server
binaries are absent (CI installs them: apt-get install -y postgresql).
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import yaml

from onboarding.common.paths import PROJECT_ROOT
from tests.e2e.postgres import APT_HINT, LocalPostgres, find_bin_dir

HELM_VALUES = PROJECT_ROOT / "deploy" / "helm" / "values.yaml"

BIN_DIR = find_bin_dir()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        BIN_DIR is None,
        reason=f"PostgreSQL server binaries (initdb, pg_ctl) are absent: {APT_HINT}",
    ),
]


@pytest.fixture(scope="module")
def postgres():
    server = LocalPostgres(BIN_DIR)
    try:
        server.start()
        server.create_database("dagster")
        yield server
    finally:
        server.stop()


def _instance_yaml(server: LocalPostgres) -> dict:
    """What the Helm chart renders for an external Postgres, plus the project's pool settings.

    SQLAlchemy 2.1 made psycopg 3 the default driver for `postgresql://`, while dagster-postgres
    ships psycopg2: the scheme names the driver (Helm: postgresql.postgresqlScheme).
    """
    scheme = yaml.safe_load(HELM_VALUES.read_text())["postgresql"]["postgresqlScheme"]
    return {
        "storage": {
            "postgres": {
                "postgres_db": {
                    "scheme": scheme,
                    "username": server.user,
                    "password": {"env": "DAGSTER_PG_PASSWORD"},
                    "hostname": server.host,
                    "db_name": "dagster",
                    "port": server.port,
                }
            }
        },
        "concurrency": {"pools": {"granularity": "op", "default_limit": 1}},
        "telemetry": {"enabled": False},
    }


@pytest.fixture
def pg_instance(postgres, tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(_instance_yaml(postgres)))
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", postgres.password)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance = dg.DagsterInstance.get()
    try:
        instance.wipe()
        yield instance
    finally:
        instance.dispose()


def test_instance_is_postgres_backed(pg_instance):
    from dagster_postgres import (
        PostgresEventLogStorage,
        PostgresRunStorage,
        PostgresScheduleStorage,
    )

    assert isinstance(pg_instance.run_storage, PostgresRunStorage)
    assert isinstance(pg_instance.event_log_storage, PostgresEventLogStorage)
    assert isinstance(pg_instance.schedule_storage, PostgresScheduleStorage)


def test_partitioned_run_on_multiprocess_executor(pg_instance):
    from tests.e2e import pg_graph

    pg_instance.add_dynamic_partitions("models", ["model-a", "model-b"])
    for key in ("model-a", "model-b"):
        result = dg.execute_job(
            dg.reconstructable(pg_graph.pg_job), instance=pg_instance,
            tags={"dagster/partition": key},
        )
        assert result.success
    assert set(pg_instance.get_dynamic_partitions("models")) == {"model-a", "model-b"}
    key = dg.AssetKey("gpu_measurement")
    assert pg_instance.get_materialized_partitions(key) == {"model-a", "model-b"}
    event = pg_instance.get_latest_materialization_event(key)
    materialization = event.asset_materialization
    assert materialization.partition in {"model-a", "model-b"}
    assert materialization.metadata["value"].value == 6
    runs = pg_instance.get_runs()
    assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    # The GPU step claimed, then freed, a slot of the `gpu` pool in Postgres.
    pool = pg_instance.event_log_storage.get_concurrency_info("gpu")
    assert pool.slot_count == 1
    assert pool.active_slot_count == 0 and pool.pending_step_count == 0


def test_checkpoint_stage_against_s3_into_postgres(
        pg_instance, config_dir, configs, s3_store, tiny_checkpoint, unique_prefix, tmp_path):
    from assets.checkpoint import COMPLETE, INTACT, checkpoint
    from resources.huggingface import HuggingFaceStore
    from resources.nvme_cache import NvmeCache
    from tests.conftest import write_spec

    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix)
    write_spec(config_dir, "tiny", f"s3://models/{unique_prefix}")
    pg_instance.add_dynamic_partitions("models", ["tiny"])
    resources = {"s3": s3_store, "hf": HuggingFaceStore(), "configs": configs,
                 "nvme_cache": NvmeCache(root=str(tmp_path / "nvme"), reserve_gb=0)}
    result = dg.materialize([checkpoint], partition_key="tiny", instance=pg_instance,
                            resources=resources)
    assert result.success
    ref = result.output_for_node("checkpoint")
    assert Path(ref.path, "config.json").is_file()

    record = pg_instance.get_latest_materialization_event(dg.AssetKey("checkpoint"))
    assert record.asset_materialization.partition == "tiny"
    assert record.asset_materialization.tags["dagster/data_version"] == ref.content_hash
    checks = {
        e.check_name: e.passed for e in result.get_asset_check_evaluations()
    }
    assert checks == {COMPLETE: True, INTACT: True}
    stored = pg_instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(dg.AssetKey("checkpoint"), COMPLETE)]
    )
    assert stored  # the check's result is in Postgres too
