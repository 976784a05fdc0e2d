"""A credential pasted into a catalog source never lands anywhere: planted in each form a user
pastes, it is looked for, after real runs of the CLI against a real instance, in the CLI's
output, every file of the Dagster instance (run and event databases, compute logs), the cache
and the rendered manifests and reports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from onboarding.common.paths import PROJECT_ROOT

USERINFO = "s3://AKIAPLANTED0USERINFO:Planted/Secret+Key@models/base/"
QUERY = ("s3://models/base/?X-Amz-Credential=AKIAPLANTED0QUERY%2F20261206&"
         "X-Amz-Signature=plantedsignature0123")
PLANTED = ("AKIAPLANTED0USERINFO", "Planted/Secret+Key", "AKIAPLANTED0QUERY",
           "plantedsignature0123")


def _leaks_in(root: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path}: {p}" for p in PLANTED if p.encode() in data]
    return found


@pytest.mark.slow
def test_a_planted_credential_is_refused_shown_redacted_and_stored_nowhere(
        config_dir, s3_env, tmp_path):
    plan_only = yaml.safe_load((PROJECT_ROOT / "configs/models/bge-m3.yaml").read_text())
    (config_dir / "models" / "leaky-userinfo.yaml").write_text(yaml.safe_dump(
        {"id": "leaky-userinfo", "source": USERINFO, "served_name": "leaky"}))
    (config_dir / "models" / "leaky-query.yaml").write_text(yaml.safe_dump(
        {**plan_only, "id": "leaky-query", "source": QUERY}))
    home, out = tmp_path / "dagster_home", tmp_path / "out"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "configs" / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, **s3_env, "DAGSTER_HOME": str(home),
           "ONBOARDING_CONFIG_DIR": str(config_dir),
           "ONBOARDING_DISCOVERED_DIR": str(out / "discovered"),
           "ONBOARDING_CACHE_ROOT": str(out / "nvme"),
           "ONBOARDING_OUTPUT_DIR": str(out / "manifests"),
           "ONBOARDING_REPORTS_DIR": str(out / "reports")}
    # registered before the entries were edited to carry the secrets (the sensor registers
    # only entries that validate)
    register = ("import dagster as dg; dg.DagsterInstance.get()"
                ".add_dynamic_partitions('models', ['leaky-userinfo', 'leaky-query'])")
    subprocess.run([sys.executable, "-c", register], env=env, check=True, timeout=120)
    dagster = [sys.executable, "-m", "dagster"]
    commands = [
        [*dagster, "asset", "materialize", "-m", "pipelines.definitions",
         "--select", "checkpoint", "--partition", "leaky-userinfo"],
        [*dagster, "asset", "materialize", "-m", "pipelines.definitions",
         "--select", "serving_config,kserve_manifest", "--partition", "leaky-query"],
        [*dagster, "sensor", "preview", "catalog_partitions_sensor", "-m",
         "pipelines.definitions"],
    ]
    said = []
    for cmd in commands:
        done = subprocess.run(cmd, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True,
                              timeout=300, check=False)
        said.append(done.stdout + done.stderr)
    text = "\n".join(said)
    assert "s3://***@models/base/" in text and "s3://models/base/?***" in text, text[-3000:]
    assert not [p for p in PLANTED if p in text]
    assert not _leaks_in(home)
    assert not _leaks_in(out)
    assert not list(out.rglob("*.yaml"))  # no manifest rendered for either entry
