"""`scripts/dev.sh ui` on the user's own S3 endpoint (scripts/demo.py --ui): with S3_ENDPOINT_URL
and its credentials set, no local server starts and nothing overwrites them; without it, the
local SeaweedFS (tests/scripts/test_script_smoke.py runs that path). The endpoint here is the
tests' real SeaweedFS server, standing in for the user's."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

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


def _read_lines(stream, lines: list[str]) -> None:
    lines.extend(stream)


@pytest.mark.slow
def test_ui_on_the_users_endpoint_starts_no_server_and_stops_without_a_traceback(
        s3_env, s3_store, tmp_path):
    """The whole `--ui` path: the UI answers, the local server's data dir was never made, the
    user's bucket is untouched by the demo model, `dagster dev`'s superseded-command warning is
    not printed; then a plain stop (what Ctrl+C does) ends every process without a traceback
    (DagsterUserCodeUnreachableError from a daemon that outlives the code server it polls)."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "configs" / "dagster.yaml", home / "dagster.yaml")
    port = free_port()
    before = s3_store.client().list_objects_v2(Bucket="models", Prefix="smollm2-135m-instruct/")
    proc = subprocess.Popen(
        [sys.executable, "scripts/demo.py", "--ui", "--port", str(port)],
        cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
        env={**os.environ, **s3_env, "ONBOARDING_DATA_DIR": str(tmp_path / "data"),
             "DAGSTER_HOME": str(home), "ONBOARDING_DISCOVERED_DIR": str(tmp_path / "disc"),
             "PYTHONPATH": str(PROJECT_ROOT)})
    lines: list[str] = []
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
                    break
            except OSError:
                time.sleep(1)
        text = "".join(lines)
        assert proc.poll() is None, text
        assert f"your S3 endpoint {s3_env['S3_ENDPOINT_URL']}" in text
        assert "local S3 (SeaweedFS)" not in text
        assert not (tmp_path / "data" / "seaweedfs").exists()
        after = s3_store.client().list_objects_v2(Bucket="models",
                                                  Prefix="smollm2-135m-instruct/")
        assert after.get("KeyCount") == before.get("KeyCount")
        time.sleep(35)  # a tick of every sensor against the code server
        proc.send_signal(signal.SIGTERM)  # demo.py only: it stops what it started
        proc.wait(timeout=90)
        reader.join(timeout=10)
        text = "".join(lines)
        assert "DagsterUserCodeUnreachableError" not in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        assert "SupersessionWarning" not in text, text[-3000:]  # `dagster dev`'s, explained once
    finally:
        reap_group(proc, grace_s=30)
