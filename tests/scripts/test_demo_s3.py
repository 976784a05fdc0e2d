"""`scripts/dev.sh ui` on the user's own S3 endpoint (scripts/demo.py --ui): with S3_ENDPOINT_URL
and its credentials set, no local server starts and nothing overwrites them; without it, the
local SeaweedFS (tests/scripts/test_script_smoke.py runs that path). The endpoint here is the
tests' real SeaweedFS server, standing in for the user's."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.processes import free_port, reap_group
from scripts import demo


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "DATA", tmp_path / "data")
    return tmp_path / "data"


def test_no_endpoint_means_the_local_server(monkeypatch, data_dir):
    monkeypatch.delenv("S3_ENDPOINT_URL", raising=False)
    assert demo.use_user_s3() is None


def test_the_users_endpoint_is_kept_and_its_secret_not_written(s3_env, data_dir, monkeypatch):
    monkeypatch.setenv("ONBOARDING_CACHE_ROOT", str(data_dir / "nvme"))
    assert demo.use_user_s3() == s3_env["S3_ENDPOINT_URL"]
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == s3_env["AWS_SECRET_ACCESS_KEY"]
    env_file = (data_dir / "onboarding.env").read_text()
    assert f"S3_ENDPOINT_URL={s3_env['S3_ENDPOINT_URL']}\n" in env_file
    assert f"ONBOARDING_CACHE_ROOT={data_dir / 'nvme'}\n" in env_file
    assert s3_env["AWS_SECRET_ACCESS_KEY"] not in env_file
    assert not (data_dir / "seaweedfs").exists()


def test_an_endpoint_without_credentials_says_which_are_missing(s3_env, data_dir, monkeypatch):
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(SystemExit, match="AWS_SECRET_ACCESS_KEY is not: export"):
        demo.use_user_s3()


def test_credentials_the_endpoint_refuses_stop_before_anything_starts(s3_env, data_dir,
                                                                      monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(SystemExit, match=r"refuses AWS_ACCESS_KEY_ID .*SignatureDoesNotMatch"):
        demo.use_user_s3()
    assert not (data_dir / "onboarding.env").exists()


def test_an_endpoint_that_does_not_answer_names_the_url(s3_env, data_dir, monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("S3_ENDPOINT_URL", url)
    with pytest.raises(SystemExit, match=f"S3_ENDPOINT_URL {url} does not answer"):
        demo.use_user_s3()


@pytest.mark.slow
def test_ui_on_the_users_endpoint_starts_no_server_and_uploads_nothing(s3_env, s3_store,
                                                                      tmp_path):
    """The whole `--ui` path up to `dagster dev`: the UI line printed, the local server's data
    dir never made, the user's bucket untouched by the demo model."""
    home = tmp_path / "home"
    home.mkdir()
    before = s3_store.client().list_objects_v2(Bucket="models", Prefix="smollm2-135m-instruct/")
    proc = subprocess.Popen(
        [sys.executable, "scripts/demo.py", "--ui", "--port", str(free_port())],
        cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
        env={**os.environ, **s3_env, "ONBOARDING_DATA_DIR": str(tmp_path / "data"),
             "DAGSTER_HOME": str(home), "ONBOARDING_DISCOVERED_DIR": str(tmp_path / "disc"),
             "PYTHONPATH": str(PROJECT_ROOT)})
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Dagster UI:"):
                break
        text = "".join(lines)
        assert "Dagster UI:" in text, text
        assert f"your S3 endpoint {s3_env['S3_ENDPOINT_URL']}" in text
        assert "local S3 (SeaweedFS)" not in text
        assert not (tmp_path / "data" / "seaweedfs").exists()
        after = s3_store.client().list_objects_v2(Bucket="models",
                                                  Prefix="smollm2-135m-instruct/")
        assert after.get("KeyCount") == before.get("KeyCount")
    finally:
        reap_group(proc, grace_s=30)
