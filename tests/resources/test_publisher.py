"""Publishing a variant to the real local S3 server: content-addressed, verified, idempotent, and
an interrupted upload never disturbs what was published before."""

from __future__ import annotations

import json
import re
import shutil
import uuid
from pathlib import Path
from typing import ClassVar

import pytest

from onboarding.fetch.checkpoint_manifest import MANIFEST_NAME
from onboarding.quantize.variants import write_manifest
from resources.publisher import MARKER, PublishError, publish_variant, verify_published
from resources.s3 import S3ObjectStore
from tests.conftest import ACCESS_KEY, SECRET_KEY

BUCKET = "model-serving"


class PutCountingS3(S3ObjectStore):
    """The real store; its client records every object it writes (botocore event)."""

    puts: ClassVar[list[str]] = []

    def client(self):
        client = super().client()
        if not getattr(client, "_onboarding_counted", False):
            for op in ("PutObject", "CreateMultipartUpload"):
                client.meta.events.register(f"before-parameter-build.s3.{op}",
                                            lambda params, **_: self.puts.append(params["Key"]))
            client._onboarding_counted = True
        return client


@pytest.fixture
def store(s3_server) -> PutCountingS3:
    PutCountingS3.puts.clear()
    return PutCountingS3(endpoint_url=s3_server.endpoint_url, access_key_id=ACCESS_KEY,
                         secret_access_key=SECRET_KEY, chunk_size_mb=1, max_concurrency=4,
                         max_attempts=2)


@pytest.fixture
def variant(tiny_checkpoint, tmp_path) -> Path:
    d = tmp_path / "variant"
    shutil.copytree(tiny_checkpoint, d)
    write_manifest(d, "test", "r1")
    return d


def base() -> str:
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:8]}/fp8/"


def test_publish_verifies_and_a_rerun_uploads_nothing(store, variant):
    uri = base()
    first = publish_variant(store, variant, "tiny", "fp8", uri, read_back_mib=1, log=print)
    manifest = json.loads((variant / MANIFEST_NAME).read_text())
    assert first.uri == f"{uri}{manifest['content_hash'][:16]}/"
    assert not first.skipped and first.bytes_uploaded == first.total_bytes > 0
    assert first.read_back_bytes > 0 and first.read_gbps > 0 and first.pull_s > 0
    prefix = first.uri.split(f"s3://{BUCKET}/", 1)[1]
    assert verify_published(store.client(), BUCKET, prefix, manifest["files"]) == []
    head = store.client().head_object(Bucket=BUCKET, Key=prefix + manifest["files"][0]["path"])
    assert head["Metadata"]["sha256"] == manifest["files"][0]["sha256"]
    PutCountingS3.puts.clear()
    again = publish_variant(store, variant, "tiny", "fp8", uri, read_back_mib=1, log=print)
    assert again.skipped and again.bytes_uploaded == 0 and again.uri == first.uri
    assert PutCountingS3.puts == []  # nothing written at all


def test_an_interrupted_upload_leaves_the_published_version_intact(store, variant, tmp_path):
    uri = base()
    old = publish_variant(store, variant, "tiny", "fp8", uri, read_back_mib=1, log=print)
    # A new revision of the variant whose last shard vanished from the cache mid-publish.
    new = tmp_path / "new"
    shutil.copytree(variant, new)
    (new / "config.json").write_text((new / "config.json").read_text() + "\n")
    manifest = write_manifest(new, "test", "r2")
    last = max(f.path for f in manifest.files)
    (new / last).unlink()
    with pytest.raises(PublishError, match=f"missing on disk.*{last}.*earlier versions are "
                       "intact"):
        publish_variant(store, new, "tiny", "fp8", uri, read_back_mib=1, log=print)
    client = store.client()
    new_prefix = f"{uri.split(f's3://{BUCKET}/', 1)[1]}{manifest.content_hash[:16]}/"
    listed = [o["Key"] for o in client.list_objects_v2(
        Bucket=BUCKET, Prefix=new_prefix).get("Contents", [])]
    assert listed and new_prefix + MARKER not in listed  # partial, never marked published
    old_prefix = old.uri.split(f"s3://{BUCKET}/", 1)[1]
    files = json.loads((variant / MANIFEST_NAME).read_text())["files"]
    assert verify_published(client, BUCKET, old_prefix, files) == []
    assert publish_variant(store, variant, "tiny", "fp8", uri, read_back_mib=1, log=print).skipped


def test_a_tampered_copy_is_not_taken_as_published(store, variant):
    uri = base()
    first = publish_variant(store, variant, "tiny", "fp8", uri, read_back_mib=1, log=print)
    prefix = first.uri.split(f"s3://{BUCKET}/", 1)[1]
    files = json.loads((variant / MANIFEST_NAME).read_text())["files"]
    victim = files[0]["path"]
    store.client().put_object(Bucket=BUCKET, Key=prefix + victim, Body=b"not the weights",
                              Metadata={"sha256": "0" * 64})
    problems = verify_published(store.client(), BUCKET, prefix, files)
    assert problems and problems[0].startswith(f"{victim}: size")
    repaired = publish_variant(store, variant, "tiny", "fp8", uri, read_back_mib=1, log=print)
    assert not repaired.skipped and repaired.bytes_uploaded == files[0]["size"]
    assert verify_published(store.client(), BUCKET, prefix, files) == []


def test_a_missing_bucket_names_the_cause(store, variant):
    with pytest.raises(PublishError, match="serving bucket does not exist.*Create the bucket"):
        publish_variant(store, variant, "tiny", "fp8", "s3://no-such-serving-bucket/x/",
                        read_back_mib=1, log=print)


def test_an_upload_that_keeps_failing_is_a_publish_error_with_its_advice(s3_proxy, store,
                                                                         variant):
    """boto3 wraps a failed upload in S3UploadFailedError, which is neither a
    ClientError nor a BotoCoreError; it must still reach the user as a PublishError."""
    uri = base()
    manifest = json.loads((variant / MANIFEST_NAME).read_text())
    prefix = f"{uri.split(f's3://{BUCKET}/', 1)[1]}{manifest['content_hash'][:16]}/"
    victim = manifest["files"][0]["path"]
    s3_proxy.fail(prefix + victim, method="PUT")  # every upload of it: 503 SlowDown
    via_proxy = S3ObjectStore(endpoint_url=s3_proxy.endpoint_url, access_key_id=ACCESS_KEY,
                              secret_access_key=SECRET_KEY, max_attempts=2)
    with pytest.raises(PublishError, match=rf"{re.escape(victim)}.*SlowDown.*re-run. Earlier "
                       "versions are intact"):
        publish_variant(via_proxy, variant, "tiny", "fp8", uri, read_back_mib=1, log=print)
    assert s3_proxy.count("PUT", prefix + victim) == 2  # it did keep failing
    assert _head_or_none(store, prefix + MARKER) is None  # never marked published


def _head_or_none(store, key):
    from botocore.exceptions import ClientError

    try:
        return store.client().head_object(Bucket=BUCKET, Key=key)
    except ClientError:
        return None
