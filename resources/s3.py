"""S3 (or any S3-compatible store) through boto3: concurrent ranged GETs, resumable, bounded memory.

Why not `download_file`: s3transfer cannot resume a killed transfer and works file by file. Here
every object is split into fixed chunks that a pool of workers fetches with ranged GETs across
all files at once; each finished chunk is recorded beside the `.part` file, so a killed run
resumes where it stopped. Memory stays at `max_concurrency x read_block` whatever the size.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ResponseStreamingError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)
from pydantic import Field, PrivateAttr

from onboarding.catalog import SourceRef
from onboarding.checkpoint_manifest import is_checkpoint_file, safe_relative_path
from onboarding.discovery import Listed
from onboarding.errors import FetchError
from resources.object_store import (
    FileDoneFn,
    ObjectStore,
    ProgressFn,
    RemoteCheckpoint,
    RemoteObject,
)

_READ_BLOCK = 1 << 20
_AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"}


class S3ObjectStore(ObjectStore):
    """S3 source. Credentials come from EnvVar config and are never logged."""

    endpoint_url: str | None = Field(default=None, description="None means AWS S3 itself")
    region_name: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    max_concurrency: int = Field(default=16, ge=1, le=256, description="parallel ranged GETs")
    chunk_size_mb: int = Field(default=16, ge=1, le=1024, description="bytes per ranged GET")
    max_attempts: int = Field(default=5, ge=1, description="per request, with backoff")
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0

    _client: Any = PrivateAttr(default=None)
    _client_lock: Any = PrivateAttr(default_factory=threading.Lock)

    # -- client -------------------------------------------------------------------------------
    def client(self):
        """One client per resource: connection pools are reused across calls and threads."""
        with self._client_lock:
            if self._client is None:
                self._client = boto3.session.Session().client(
                    "s3", endpoint_url=self.endpoint_url or None, region_name=self.region_name,
                    aws_access_key_id=self.access_key_id or None,
                    aws_secret_access_key=self.secret_access_key or None,
                    config=Config(
                        max_pool_connections=self.max_concurrency + 4,
                        retries={"max_attempts": self.max_attempts, "mode": "standard"},
                        connect_timeout=self.connect_timeout_s,
                        read_timeout=self.read_timeout_s,
                        s3={"addressing_style": "path"}, tcp_keepalive=True,
                    ),
                )
            return self._client

    def _explain(self, exc: Exception, what: str) -> FetchError:
        where = self.endpoint_url or "AWS S3"
        if isinstance(exc, EndpointConnectionError | BotoConnectionError):
            return FetchError(what, f"cannot reach the S3 endpoint {where} after "
                              f"{self.max_attempts} attempts ({type(exc).__name__})",
                              "Start the S3 server or fix S3_ENDPOINT_URL, then re-run.")
        if isinstance(exc, NoCredentialsError):
            return FetchError(what, "no S3 credentials are configured",
                              "Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.")
        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchBucket",):
                return FetchError(what, "the bucket does not exist at " + where,
                                  "Create the bucket or fix the model's source URI.")
            if code in _AUTH_CODES:
                return FetchError(what, f"the S3 endpoint {where} rejected the credentials ({code})",
                                  "Check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the "
                                  "identity's permissions on the bucket.")
            if code in ("NoSuchKey", "404"):
                return FetchError(what, "the object disappeared while fetching",
                                  "The checkpoint changed at the source; re-run to fetch the new one.")
            return FetchError(what, f"S3 error {code}: {exc}", "See the S3 server's logs.")
        return FetchError(what, f"{type(exc).__name__}: {exc}", "See the S3 server's logs.")

    # -- describe -----------------------------------------------------------------------------
    def describe(self, source: SourceRef) -> RemoteCheckpoint:
        uri = source.uri
        listed: list[dict] = []
        try:
            pages = self.client().get_paginator("list_objects_v2").paginate(
                Bucket=source.location, Prefix=source.path)
            for page in pages:
                listed.extend(page.get("Contents", []))
        except (ClientError, BotoCoreError) as exc:
            raise self._explain(exc, uri) from None
        if not listed:
            raise FetchError(uri, "no objects under this prefix",
                             "Check the prefix (it must end with '/') or upload the checkpoint.")
        objects, ignored = [], []
        for item in listed:
            key = item["Key"]
            if key.endswith("/"):
                continue
            rel = safe_relative_path(key[len(source.path):], uri)
            if not is_checkpoint_file(rel):
                ignored.append(key)
                continue
            objects.append(RemoteObject(path=rel, size=item["Size"], key=key,
                                        etag=item.get("ETag", "").strip('"') or None))
        if not objects:
            raise FetchError(uri, f"{len(ignored)} objects, none of them checkpoint files",
                             "Upload config.json and *.safetensors under this prefix.")
        objects = self._with_recorded_sha256(source, objects)
        h = hashlib.sha256()
        for o in sorted(objects, key=lambda o: o.path):
            h.update(f"{o.path}\0{o.size}\0{o.etag}\n".encode())
        return RemoteCheckpoint(source=uri, revision="s3-" + h.hexdigest()[:16],
                                objects=sorted(objects, key=lambda o: o.path), ignored=ignored)

    def _with_recorded_sha256(self, source: SourceRef, objects: list[RemoteObject]):
        """HEAD each object for `x-amz-meta-sha256` (our uploader and `aws s3 cp --metadata`)."""
        def head(o: RemoteObject) -> RemoteObject:
            try:
                meta = self.client().head_object(Bucket=source.location, Key=o.key)["Metadata"]
            except (ClientError, BotoCoreError) as exc:
                raise self._explain(exc, f"s3://{source.location}/{o.key}") from None
            return RemoteObject(o.path, o.size, o.etag, meta.get("sha256"), o.key)

        with ThreadPoolExecutor(min(self.max_concurrency, len(objects))) as pool:
            return list(pool.map(head, objects))

    def read_small(self, source: SourceRef, obj: RemoteObject) -> bytes:
        try:
            return self.client().get_object(Bucket=source.location, Key=obj.key)["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            raise self._explain(exc, f"s3://{source.location}/{obj.key}") from None

    # -- listing for discovery -----------------------------------------------------------------
    def list_page(self, bucket: str, prefix: str, after: str, max_keys: int
                  ) -> tuple[list[Listed], bool]:
        """One bounded page of keys under `prefix` after `after`, and whether more follow (the
        new-checkpoint sensor's scan: at most `max_keys` keys per request)."""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": max_keys}
        if after:
            kwargs["StartAfter"] = after
        try:
            resp = self.client().list_objects_v2(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise self._explain(exc, f"s3://{bucket}/{prefix} (listing after {after!r})") from None
        objects = [Listed(o["Key"], o["Size"], o.get("ETag", "").strip('"') or None)
                   for o in resp.get("Contents", [])]
        return objects, bool(resp.get("IsTruncated"))

    def read_object(self, bucket: str, key: str) -> bytes:
        """A small object's bytes (a spec or a completion marker beside the weights)."""
        try:
            return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            raise self._explain(exc, f"s3://{bucket}/{key}") from None

    def read_throughput(self, bucket: str, key: str, max_bytes: int) -> tuple[int, float]:
        """(bytes, seconds) to GET the first `max_bytes` of one object the way `fetch` does:
        `chunk_size_mb` ranges on `max_concurrency` workers, the bytes read and dropped. Node
        acceptance's S3 GET throughput to the configured endpoint."""
        what = f"s3://{bucket}/{key}"
        try:
            size = self.client().head_object(Bucket=bucket, Key=key)["ContentLength"]
        except (ClientError, BotoCoreError) as exc:
            raise self._explain(exc, what) from None
        total = min(size, max_bytes)
        chunk = self.chunk_size_mb << 20
        ranges = [(s, min(s + chunk, total) - 1) for s in range(0, total, chunk)]

        def get(r: tuple[int, int]) -> int:
            try:
                body = self.client().get_object(Bucket=bucket, Key=key,
                                                 Range=f"bytes={r[0]}-{r[1]}")["Body"]
                n = 0
                while data := body.read(_READ_BLOCK):
                    n += len(data)
                return n
            except (ClientError, BotoCoreError) as exc:
                raise self._explain(exc, what) from None

        t0 = time.perf_counter()
        with ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="s3-get") as pool:
            received = sum(pool.map(get, ranges))
        seconds = time.perf_counter() - t0
        if received != total:
            raise FetchError(what, f"received {received} of {total} bytes",
                             "Check the S3 endpoint's logs.")
        return total, seconds

    # -- fetch --------------------------------------------------------------------------------
    def fetch(self, remote: RemoteCheckpoint, source: SourceRef, staging: Path,
              on_progress: ProgressFn, on_file_done: FileDoneFn) -> int:
        chunk = self.chunk_size_mb << 20
        resumed = 0
        jobs: list[tuple[_PartFile, int]] = []
        parts: list[_PartFile] = []
        for obj in remote.objects:
            final = staging / obj.path
            if final.is_file() and final.stat().st_size == obj.size:
                resumed += obj.size
                on_progress(obj.size)
                on_file_done(obj, final, None)  # finished by an earlier run; hashed by the cache
                continue
            part = _PartFile(obj, final, chunk)
            done = part.open()
            resumed += sum(part.chunk_len(i) for i in done)
            on_progress(sum(part.chunk_len(i) for i in done))
            parts.append(part)
            jobs.extend((part, i) for i in range(part.n_chunks) if i not in done)
        if not parts:
            return resumed
        stop = threading.Event()

        def run(part: _PartFile, index: int) -> None:
            if stop.is_set():
                return
            self._get_range(source, part, index, on_progress, stop)
            last = part.mark_done(index)
            part.hash_ready(wait=last)
            if last:
                on_file_done(part.obj, part.final, part.finish())

        try:
            with ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="s3-get") as pool:
                futures = [pool.submit(run, p, i) for p, i in jobs]
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                for f in done:
                    if f.exception() is not None:
                        stop.set()
                        for other in futures:
                            other.cancel()
                        raise f.exception()
            for part in parts:  # zero-length objects have no chunks to complete them
                if part.n_chunks == 0:
                    on_file_done(part.obj, part.final, part.finish())
        finally:
            for part in parts:
                part.close()
        return resumed

    def _get_range(self, source: SourceRef, part: _PartFile, index: int,
                   on_progress: ProgressFn, stop: threading.Event) -> None:
        start = index * part.chunk
        end = min(start + part.chunk, part.obj.size)  # exclusive
        what = f"s3://{source.location}/{part.obj.key}"
        last: Exception | None = None
        for attempt in range(self.max_attempts):
            if stop.is_set():
                return
            pos, received = start, 0
            try:
                body = self.client().get_object(Bucket=source.location, Key=part.obj.key,
                                                 Range=f"bytes={start}-{end - 1}")["Body"]
                while pos < end and (data := body.read(min(_READ_BLOCK, end - pos))):
                    os.pwrite(part.fd, data, pos)
                    pos += len(data)
                    received += len(data)
                    on_progress(len(data))
                body.close()
                if pos == end:
                    return
                last = FetchError(what, f"range {start}-{end - 1}: the server sent {pos - start} "
                                  f"of {end - start} bytes", "")
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if status < 500:
                    raise self._explain(exc, what) from None
                last = exc
            except (BotoConnectionError, ResponseStreamingError, BotoCoreError, OSError) as exc:
                last = exc
            on_progress(-received)  # the retry fetches these again
            time.sleep(min(8.0, 0.25 * 2 ** attempt) * (0.5 + random.random()))
        raise FetchError(what, f"size {part.obj.size} bytes; range {start}-{end - 1} failed "
                         f"{self.max_attempts} times, last: {type(last).__name__}: {last}",
                         "Check the S3 endpoint's logs or raise max_attempts. The chunks "
                         "already received are kept and the next run resumes from them.")

    # -- upload (demo, tests, the sensor's users) ---------------------------------------------
    def upload_dir(self, local_dir: Path, bucket: str, prefix: str) -> list[str]:
        """Upload a checkpoint directory with each file's sha256 as `x-amz-meta-sha256`."""
        from boto3.s3.transfer import TransferConfig

        from onboarding.checkpoint_manifest import sha256_file

        cfg = TransferConfig(multipart_chunksize=self.chunk_size_mb << 20,
                             max_concurrency=self.max_concurrency)
        keys = []
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            rel = path.relative_to(local_dir).as_posix()
            if not is_checkpoint_file(rel):
                continue
            key = prefix + rel
            try:
                self.client().upload_file(str(path), bucket, key, Config=cfg, ExtraArgs={
                    "Metadata": {"sha256": sha256_file(path)}})
            except (ClientError, BotoCoreError) as exc:
                raise self._explain(exc, f"s3://{bucket}/{key}") from None
            keys.append(key)
        return keys


class _PartFile:
    """One object being fetched: `<name>.part` plus `<name>.part.chunks` (finished chunk ids).

    The sha256 is computed in order as chunks land, by whichever worker finds the next chunk
    done, reading it back while its pages are still hot; so hashing overlaps the transfer
    instead of re-reading the whole file afterwards.
    """

    def __init__(self, obj: RemoteObject, final: Path, chunk: int):
        self.obj, self.final, self.chunk = obj, final, chunk
        self.part = final.with_name(final.name + ".part")
        self.journal = final.with_name(final.name + ".part.chunks")
        self.n_chunks = -(-obj.size // chunk)
        self.fd = -1
        self._done: set[int] = set()
        self._lock = threading.Lock()
        self._journal_fh = None
        self._sha = hashlib.sha256()
        self._next_hash = 0  # the first chunk not yet hashed
        self._hash_lock = threading.Lock()
        self._buf = bytearray(_READ_BLOCK)

    def chunk_len(self, i: int) -> int:
        return min(self.chunk, self.obj.size - i * self.chunk)

    def open(self) -> set[int]:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        if self.part.exists() and self.journal.exists():
            done = {int(x) for x in self.journal.read_text().split() if x.isdigit()}
            # A journal from another chunk size or a truncated part cannot be trusted.
            if self.part.stat().st_size != self.obj.size or any(i >= self.n_chunks for i in done):
                done = set()
        else:
            done = set()
        if not done:
            self.journal.write_text("")
        flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        self.fd = os.open(self.part, flags, 0o644)
        os.ftruncate(self.fd, self.obj.size)
        self._journal_fh = open(self.journal, "a")  # noqa: SIM115 - held until close()
        self._done = done
        return set(done)

    def mark_done(self, i: int) -> bool:
        """Record chunk i; True when it was the last one."""
        with self._lock:
            self._done.add(i)
            self._journal_fh.write(f"{i}\n")
            self._journal_fh.flush()
            return len(self._done) == self.n_chunks

    def hash_ready(self, wait: bool) -> None:
        """Hash every contiguous finished chunk; `wait` blocks until no one else is hashing."""
        while self._hash_lock.acquire(blocking=wait):
            try:
                with self._lock:
                    upto = self._next_hash
                    while upto in self._done:
                        upto += 1
                if upto > self._next_hash:
                    self._hash_range(self._next_hash * self.chunk,
                                     min(upto * self.chunk, self.obj.size))
                    self._next_hash = upto
            finally:
                self._hash_lock.release()
            with self._lock:  # a chunk may have landed while we hashed: go round again
                if self._next_hash not in self._done:
                    return

    def _hash_range(self, start: int, end: int) -> None:
        view = memoryview(self._buf)
        with open(self.part, "rb", buffering=0) as fh:
            fh.seek(start)
            while start < end:
                n = fh.readinto(view[: min(len(view), end - start)])
                if not n:
                    raise FetchError(str(self.part), "shorter than its finished chunks",
                                     "The staging file was truncated; delete it and re-run.")
                self._sha.update(view[:n])
                start += n

    def finish(self) -> str:
        """Make the file durable under its final name; returns its sha256."""
        if self._next_hash < self.n_chunks:
            self.hash_ready(wait=True)
        os.fsync(self.fd)
        os.replace(self.part, self.final)
        self.journal.unlink(missing_ok=True)
        return self._sha.hexdigest()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._journal_fh:
            self._journal_fh.close()
            self._journal_fh = None
