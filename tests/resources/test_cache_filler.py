"""The node cache filler against the real local S3 server: a published variant fetched into
KServe's `models/<storage key>/` folder layout, verified, one copy of the bytes; run again on
the folder it filled, it fetches nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.kserve import agent_model_dir
from onboarding.fetch.checkpoint_manifest import MANIFEST_NAME, sha256_file
from onboarding.quantize.variants import write_manifest
from resources.cache_filler import VERIFIED_DIR, fill
from resources.publisher import publish_variant
from resources.s3 import S3ObjectStore
from tests.conftest import ACCESS_KEY, SECRET_KEY

BUCKET = "model-serving"


@pytest.fixture
def store(s3_store) -> S3ObjectStore:
    return s3_store


@pytest.fixture
def published(store, tiny_checkpoint, tmp_path):
    variant = tmp_path / "variant"
    shutil.copytree(tiny_checkpoint, variant)
    write_manifest(variant, "test", "r1")
    pub = publish_variant(store, variant, "tiny", "fp8",
                          f"s3://{BUCKET}/t-{uuid.uuid4().hex[:8]}/fp8/", read_back_mib=1,
                          log=print)
    return pub, variant


def test_an_empty_node_folder_is_filled_verified_and_a_second_run_fetches_nothing(
        store, published, tmp_path):
    pub, variant = published
    # where KServe's agent keeps this variant on a node whose cache root is tmp_path/cache
    folder = Path(agent_model_dir(str(tmp_path / "cache"), pub.uri))
    first = fill(store, pub.uri, folder, log=print)
    assert not first.warm and first.bytes_fetched > 0
    files = json.loads((variant / MANIFEST_NAME).read_text())["files"]
    for f in files:
        top = folder / f["path"]
        assert sha256_file(top) == f["sha256"], f["path"]
        # one copy: the top-level file is the verified entry's inode
        [entry] = list((folder / VERIFIED_DIR / "variant").glob(f"*/{f['path']}"))
        assert os.path.samefile(top, entry)
    # the folder the first run filled (as the pipeline would on its node): nothing fetched
    again = fill(store, pub.uri, folder, log=print)
    assert again.warm and again.bytes_fetched == 0 and again.files == first.files
    for f in files:
        assert sha256_file(folder / f["path"]) == f["sha256"]


def test_only_published_s3_variants_are_filled(store, tmp_path):
    with pytest.raises(ConfigError, match="S3 only"):
        fill(store, "hf://org/model", tmp_path / "m", log=print)


@pytest.mark.slow
def test_the_download_container_command_fills_an_empty_folder_then_fetches_nothing(
        s3_server, published, tmp_path):
    """What KServe's download Job runs, with its two arguments and the S3 environment its
    credential builder injects (AWS_ENDPOINT_URL, the keys)."""
    pub, variant = published
    folder = Path(agent_model_dir(str(tmp_path / "node-cache"), pub.uri))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))},
           "AWS_ENDPOINT_URL": s3_server.endpoint_url, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    def run() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "resources.cache_filler", pub.uri,
                               str(folder)], cwd=PROJECT_ROOT, env=env, capture_output=True,
                              text=True, timeout=300, check=False)

    first = run()
    assert first.returncode == 0, first.stderr
    assert "fetched (" in first.stdout
    files = json.loads((variant / MANIFEST_NAME).read_text())["files"]
    assert all(sha256_file(folder / f["path"]) == f["sha256"] for f in files)
    second = run()
    assert second.returncode == 0, second.stderr
    assert "already here, nothing fetched" in second.stdout
    bad = subprocess.run([sys.executable, "-m", "resources.cache_filler", pub.uri],
                         cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and "usage" in bad.stderr
