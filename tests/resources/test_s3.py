"""S3ObjectStore against a real SeaweedFS server: listing, ranged fetch and every failure mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from onboarding.catalog import parse_source
from onboarding.errors import FetchError
from onboarding.processes import free_port
from resources.nvme_cache import NvmeCache
from resources.s3 import S3ObjectStore
from tests.conftest import ACCESS_KEY


def test_describe_lists_checkpoint_files_with_recorded_sha256(s3_store, tiny_checkpoint,
                                                               unique_prefix):
    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix)
    s3_store.client().put_object(Bucket="models", Key=unique_prefix + "README.md", Body=b"x")
    remote = s3_store.describe(parse_source(f"s3://models/{unique_prefix}"))
    paths = [o.path for o in remote.objects]
    assert "config.json" in paths and "model.safetensors.index.json" in paths
    assert "README.md" not in paths and remote.ignored == [unique_prefix + "README.md"]
    assert all(o.sha256 and len(o.sha256) == 64 for o in remote.objects)
    assert remote.revision.startswith("s3-")


def test_revision_changes_when_an_object_changes(s3_store, tiny_checkpoint, unique_prefix):
    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix)
    src = parse_source(f"s3://models/{unique_prefix}")
    before = s3_store.describe(src).revision
    s3_store.client().put_object(Bucket="models", Key=unique_prefix + "config.json", Body=b"{}")
    assert s3_store.describe(src).revision != before


def test_missing_bucket_is_named(s3_store):
    with pytest.raises(FetchError, match="bucket does not exist"):
        s3_store.describe(parse_source("s3://no-such-bucket-here/x/"))


def test_empty_prefix_is_named(s3_store):
    with pytest.raises(FetchError, match="no objects under this prefix"):
        s3_store.describe(parse_source("s3://models/never-uploaded/"))


def test_wrong_credentials_are_named(s3_server):
    bad = S3ObjectStore(endpoint_url=s3_server.endpoint_url, access_key_id=ACCESS_KEY,
                        secret_access_key="wrong-secret", max_attempts=1)
    with pytest.raises(FetchError, match="rejected the credentials") as info:
        bad.describe(parse_source("s3://models/x/"))
    assert "wrong-secret" not in str(info.value)


def test_unreachable_endpoint_fails_after_bounded_retries():
    down = S3ObjectStore(endpoint_url=f"http://127.0.0.1:{free_port()}", access_key_id="a",
                         secret_access_key="b", max_attempts=2, connect_timeout_s=1)
    with pytest.raises(FetchError, match="cannot reach the S3 endpoint .* after 2 attempts"):
        down.describe(parse_source("s3://models/x/"))


def test_chunked_fetch_reassembles_large_objects_exactly(s3_store, tmp_path, unique_prefix):
    """Several chunks per file, a file smaller than one chunk, and an empty file."""
    import hashlib
    import os

    src_dir = tmp_path / "src"
    src_dir.mkdir()
    blobs = {"model.safetensors": os.urandom((3 << 20) + 12345), "config.json": b"{}",
             "generation_config.json": b""}
    for name, data in blobs.items():
        (src_dir / name).write_bytes(data)
    s3_store.upload_dir(src_dir, "models", unique_prefix)
    src = parse_source(f"s3://models/{unique_prefix}")
    remote = s3_store.describe(src)
    staging = tmp_path / "staging"
    done = []
    s3_store.fetch(remote, src, staging, lambda n: None,
                   lambda o, p, sha: done.append((o.path, sha)))
    assert sorted(path for path, _ in done) == sorted(blobs)
    streamed = dict(done)  # the sha256 hashed while chunks landed equals the file's
    for name, data in blobs.items():
        assert streamed[name] == hashlib.sha256(data).hexdigest()
        assert hashlib.sha256((staging / name).read_bytes()).digest() == \
            hashlib.sha256(data).digest()
    assert not list(staging.glob("*.part*"))


def test_fetch_refuses_when_disk_too_small(s3_store, tiny_checkpoint, unique_prefix, tmp_path):
    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix)
    cache = NvmeCache(root=str(tmp_path / "cache"), reserve_gb=10_000_000)
    with pytest.raises(FetchError, match=r"GiB free, the fetch needs .* reserve"):
        cache.fetch("tiny", s3_store, parse_source(f"s3://models/{unique_prefix}"))
    assert not any(Path(tmp_path / "cache" / "tiny").glob("s3-*"))
