"""Publishing a served variant to the serving bucket, content-addressed and verified.

`<variants_uri>/<content-hash>/` holds the variant's files, each with its sha256 as
`x-amz-meta-sha256`. A variant is published only when every file is there at its size and
sha256 (listing + HEAD) and the marker `PUBLISHED.json` was written after that verification:
an interrupted upload leaves a prefix without the marker, which nothing points at, and the
versions published before stay untouched (they live under their own hashes). A re-run finds
the marker, re-verifies and uploads nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import BotoCoreError, ClientError

from onboarding.common.errors import OnboardingError
from onboarding.common.refs import PublishedVariant
from onboarding.fetch.catalog import parse_source
from onboarding.fetch.checkpoint_manifest import MANIFEST_NAME
from resources.s3 import S3ObjectStore

MARKER = "PUBLISHED.json"


class PublishError(OnboardingError):
    """A variant could not be published or verified; what was published before is intact."""


def _manifest(local_dir: Path) -> dict:
    path = local_dir / MANIFEST_NAME
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PublishError(str(path), f"the variant's manifest cannot be read ({exc})",
                           "Re-materialize the variant (checkpoint or quantized).") from None


def _head(client, bucket: str, key: str) -> dict | None:
    try:
        return client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def verify_published(client, bucket: str, prefix: str, files: list[dict]) -> list[str]:
    """Problems with the published copy: a file missing from the listing, or whose size or
    recorded sha256 differs from the manifest. Empty means verified."""
    listed: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        listed.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    problems = []
    for f in files:
        key = prefix + f["path"]
        if key not in listed:
            problems.append(f"{f['path']}: not listed")
            continue
        head = _head(client, bucket, key)
        meta = (head or {}).get("Metadata", {})
        if listed[key] != f["size"] or (head or {}).get("ContentLength") != f["size"]:
            problems.append(f"{f['path']}: size {listed[key]} != {f['size']}")
        elif meta.get("sha256") != f["sha256"]:
            problems.append(f"{f['path']}: sha256 {meta.get('sha256')} != {f['sha256']}")
    return problems


def _read_back(client, bucket: str, prefix: str, local_dir: Path, files: list[dict],
               max_bytes: int) -> tuple[int, float]:
    """GET the first `max_bytes` of the largest file; compare them with the local bytes; the
    measured GET throughput is what the storage initializer would see from this bucket."""
    big = max(files, key=lambda f: f["size"])
    n = min(max_bytes, big["size"])
    if n == 0:
        return 0, 0.0
    t0 = time.perf_counter()
    body = client.get_object(Bucket=bucket, Key=prefix + big["path"],
                             Range=f"bytes=0-{n - 1}")["Body"].read()
    seconds = time.perf_counter() - t0
    with open(local_dir / big["path"], "rb") as f:
        if f.read(n) != body:
            raise PublishError(f"s3://{bucket}/{prefix}{big['path']}",
                               f"the first {n} bytes read back differ from the local file",
                               "Check the serving bucket's storage; nothing points at this "
                               "copy yet.")
    return n, seconds


def publish_variant(s3: S3ObjectStore, local_dir: Path, model: str, precision: str,
                    base_uri: str, read_back_mib: int, log: Callable[[str], None] = print
                    ) -> PublishedVariant:
    """Publish `local_dir` (a checkpoint or exported variant with its manifest) under
    `base_uri`<content-hash>/, or find it already published; verify either way."""
    manifest = _manifest(local_dir)
    files, content_hash = manifest["files"], manifest["content_hash"]
    ref = parse_source(base_uri)
    bucket, prefix = ref.location, f"{ref.path}{content_hash[:16]}/"
    uri = f"s3://{bucket}/{prefix}"
    client = s3.client()
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError:
        raise PublishError(f"s3://{bucket}", "the serving bucket does not exist (or these "
                           "credentials may not see it)", "Create the bucket (deploy.yaml "
                           "storage.variants_uri names it) or fix the credentials.") from None
    except BotoCoreError as exc:
        raise PublishError(f"s3://{bucket}", f"{type(exc).__name__}: {exc}",
                           "Check S3_ENDPOINT_URL and that the S3 server is up.") from None
    try:
        skipped = _head(client, bucket, prefix + MARKER) is not None and \
            not verify_published(client, bucket, prefix, files)
        uploaded = 0
        if not skipped:
            for f in files:
                head = _head(client, bucket, prefix + f["path"])
                if head and head.get("ContentLength") == f["size"] and \
                        head.get("Metadata", {}).get("sha256") == f["sha256"]:
                    continue  # an interrupted earlier publish got this far
                client.upload_file(str(local_dir / f["path"]), bucket, prefix + f["path"],
                                   ExtraArgs={"Metadata": {"sha256": f["sha256"]}})
                uploaded += f["size"]
            problems = verify_published(client, bucket, prefix, files)
            if problems:
                raise PublishError(uri, "verification after upload failed: " +
                                   "; ".join(problems[:5]),
                                   "Re-run; the previously published version is untouched.")
            client.put_object(Bucket=bucket, Key=prefix + MARKER, Body=json.dumps(
                {"model": model, "precision": precision, "content_hash": content_hash,
                 "files": files}, indent=1).encode())
        n, seconds = _read_back(client, bucket, prefix, local_dir, files,
                                read_back_mib << 20)
    except FileNotFoundError as exc:
        raise PublishError(f"{local_dir}", f"a file of the manifest is missing on disk "
                           f"({exc.filename})", "Re-materialize the variant; nothing points "
                           "at the partial upload and earlier versions are intact.") from None
    except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
        # S3UploadFailedError: boto3's wrapper of an upload that failed every attempt; it is
        # neither of botocore's two, so without it here boto3's own message escapes.
        raise PublishError(uri, f"{type(exc).__name__}: {exc}", "Check the serving bucket "
                           "exists, the credentials may write to it and the S3 endpoint's "
                           "logs (an error that outlasts max_attempts); re-run. Earlier "
                           "versions are intact.") from None
    log(f"{precision}: {'already published' if skipped else f'published {uploaded:,} bytes'} "
        f"at {uri}")
    total = sum(f["size"] for f in files)
    return PublishedVariant(model=model, precision=precision, uri=uri,
                            content_hash=content_hash, total_bytes=total, files=len(files),
                            skipped=skipped, bytes_uploaded=uploaded, read_back_bytes=n,
                            read_back_s=seconds)
