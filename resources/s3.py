"""S3 (or any S3-compatible store) through boto3: concurrent ranged GETs, resumable, bounded memory.

Why not `download_file`: s3transfer cannot resume a killed transfer and works file by file. Here
every object is split into fixed chunks that a pool of workers fetches with ranged GETs across
all files at once; each chunk is recorded beside the `.part` file once its bytes are on disk and
synced, so a killed or failed run resumes where it stopped and never trusts a chunk it did not
receive. Memory stays at `max_concurrency x read_block` whatever the size.

Retries are ours alone (boto3's are off, so the two never multiply): every request (a listing
page, a HEAD, a range) gets `max_attempts` with jittered backoff inside a total deadline, each
retry and each recovery is logged with its cause, and the final error says how many attempts
were really made and whether they timed out.
"""

from __future__ import annotations

import base64
import errno
import gc
import hashlib
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import replace
from datetime import datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any, TypeVar

import boto3
from boto3.exceptions import S3UploadFailedError
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)
from pydantic import Field, PrivateAttr

from onboarding.common.errors import FetchError
from onboarding.fetch import checksums
from onboarding.fetch.catalog import SourceRef
from onboarding.fetch.checkpoint_manifest import is_checkpoint_file, safe_relative_path
from onboarding.fetch.discovery import Listed
from resources.object_store import (
    FileDoneFn,
    LogFn,
    ObjectStore,
    ProgressFn,
    RemoteCheckpoint,
    RemoteObject,
    log_to_python,
)

READ_BLOCK = 1 << 20
# Each pwrite is at most this long. Linux sizes the page-cache folio a buffered write allocates
# from the write's length (include/linux/pagemap.h write_begin_get_folio: fgf_set_order(len),
# which ext4_write_begin calls); on the 2-core VM, 1 MiB writes (1 MiB folios) cost the fetch
# 2-3 s of system time per GB in some machine states where 256 KiB writes cost 0.5-0.7 s
# (docs/benchmarks.md, "The write block"). 256 KiB is s3transfer's default
# io_chunksize, the size download_file writes in.
WRITE_BLOCK = 256 << 10
_AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"}
_TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                    "InternalError", "ServiceUnavailable"}
T = TypeVar("T")


class _Cancelled(Exception):
    """Raised in a worker whose run was given up by another range: nothing is journaled."""


class S3ObjectStore(ObjectStore):
    """S3 source. Credentials come from EnvVar config and are never logged."""

    endpoint_url: str | None = Field(default=None, description="None means AWS S3 itself")
    region_name: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    max_concurrency: int = Field(default=16, ge=1, le=256, description="parallel ranged GETs")
    chunk_size_mb: int = Field(default=16, ge=1, le=1024, description="bytes per ranged GET")
    max_attempts: int = Field(default=5, ge=1, description="per request, the first included; "
                              "the only retries (boto3's own are off)")
    backoff_base_s: float = Field(default=0.25, ge=0, description="wait before the first retry; "
                                  "doubles per retry, capped at 8 s, jittered x0.5-1.5")
    connect_timeout_s: float = Field(default=5.0, gt=0)
    list_read_timeout_s: float = Field(default=10.0, gt=0, description="silence allowed while "
                                       "waiting for a listing page, a HEAD or a small object")
    range_read_timeout_s: float = Field(default=30.0, gt=0, description="silence allowed while a "
                                        "range streams (per read, not for the whole range)")
    list_deadline_s: float = Field(default=25.0, gt=0, description="every attempt of one listing "
                                   "page, HEAD or small read together; a hung endpoint fails "
                                   "within it")
    range_deadline_s: float = Field(default=300.0, gt=0, description="every attempt of one range "
                                    "together")

    _clients: dict[str, Any] = PrivateAttr(default_factory=dict)
    _client_lock: Any = PrivateAttr(default_factory=threading.Lock)
    _session: Any = PrivateAttr(default=None)

    # -- clients ------------------------------------------------------------------------------
    def client(self):
        """For callers outside the store's own retry loop (the sensor's listing, uploads,
        tests): boto3's standard retries, `max_attempts` requests in all."""
        return self._client("general", self.list_read_timeout_s, self.max_attempts)

    def _list_client(self):
        """Listings, HEADs and small reads under `_call`: no boto3 retries, ours only."""
        return self._client("list", self.list_read_timeout_s, 1)

    def _ranges_client(self):
        return self._client("range", self.range_read_timeout_s, 1)

    def _client(self, purpose: str, read_timeout_s: float, total_attempts: int):
        """One client per purpose and resource: connection pools are reused across calls. The
        clients share one session, whose loader parses botocore's S3 model once (a session
        each parsed it per client: 0.1 s of CPU per client, measured). They are built with the
        garbage collector paused (`_without_gc`)."""
        with self._client_lock:
            if self._session is None:
                self._session = _without_gc(boto3.session.Session)
            if purpose not in self._clients:
                self._clients[purpose] = _without_gc(lambda: self._session.client(
                    "s3", endpoint_url=self.endpoint_url or None, region_name=self.region_name,
                    aws_access_key_id=self.access_key_id or None,
                    aws_secret_access_key=self.secret_access_key or None,
                    config=Config(
                        max_pool_connections=self.max_concurrency + 4,
                        retries={"total_max_attempts": total_attempts, "mode": "standard"},
                        connect_timeout=self.connect_timeout_s, read_timeout=read_timeout_s,
                        s3={"addressing_style": "path"}, tcp_keepalive=True,
                    ),
                ))
            return self._clients[purpose]

    # -- errors and retries -------------------------------------------------------------------
    def _explain(self, exc: Exception, what: str) -> FetchError:
        """An error no retry can cure, with its fix."""
        where = self.endpoint_url or "AWS S3"
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

    def _transient(self, exc: Exception, read_timeout_s: float) -> tuple[str, str] | None:
        """(kind, cause) of a failure worth retrying; None for one no retry can cure."""
        if isinstance(exc, ClientError):
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            code = exc.response.get("Error", {}).get("Code", "")
            if status >= 500 or status == 429 or code in _TRANSIENT_CODES:
                if not code or code == str(status):  # a HEAD has no body to name the error
                    code = _status_phrase(status)
                return "server", f"{status} {code}".strip()
            return None
        if isinstance(exc, ConnectTimeoutError):
            return "timeout", f"connect timed out after {self.connect_timeout_s:g} s"
        if isinstance(exc, ReadTimeoutError):
            return "timeout", f"read timed out after {read_timeout_s:g} s"
        if isinstance(exc, EndpointConnectionError):
            return "unreachable", "connection refused or unreachable"
        if isinstance(exc, HTTPClientError | IncompleteReadError | BotoConnectionError):
            return "dropped", f"the connection dropped ({type(exc).__name__})"
        return None

    def _timed_out_s(self, exc: Exception, read_timeout_s: float) -> float:
        """The timeout that ended an attempt, 0 when none did."""
        if isinstance(exc, ConnectTimeoutError):
            return self.connect_timeout_s
        return read_timeout_s if isinstance(exc, ReadTimeoutError) else 0.0

    def _give_up(self, what: str, retry: _Retry, scope: str, detail: str = "") -> FetchError:
        """The error after the last attempt: the true count, the causes, timeouts named."""
        where = self.endpoint_url or "AWS S3"
        timeout_knob, deadline_knob = f"{scope}_read_timeout_s", f"{scope}_deadline_s"
        timeout_s, deadline_s = getattr(self, timeout_knob), getattr(self, deadline_knob)
        n = retry.attempt
        attempts = f"{n} attempt{'s' if n != 1 else ''} in {retry.elapsed_s:.1f} s"
        causes = ", ".join(f"{count}x {cause}" if count > 1 else cause
                           for cause, count in Counter(retry.causes).items())
        ran_out = (f"; no time was left for another attempt in the {deadline_knob} of "
                   f"{deadline_s:g} s" if retry.deadline_hit else "")
        prefix = f"{detail}: " if detail else ""
        if retry.last_kind == "unreachable":
            return FetchError(what, f"{prefix}cannot reach the S3 endpoint {where} after "
                              f"{attempts} ({causes}){ran_out}",
                              "Start the S3 server or fix S3_ENDPOINT_URL, then re-run.")
        resume = (" The chunks already received are kept and the next run resumes from them."
                  if scope == "range" else "")
        if retry.last_kind == "timeout":
            return FetchError(
                what, f"{prefix}the S3 endpoint {where} timed out: {attempts} ({causes}){ran_out}",
                "The endpoint accepts connections but does not answer in time: check that "
                "S3_ENDPOINT_URL is a live S3 server and not a proxy or firewall that swallows "
                f"requests. If it is only slow, raise {timeout_knob} (now {timeout_s:g} s) or "
                f"{deadline_knob} (now {deadline_s:g} s)." + resume)
        return FetchError(what, f"{prefix}{attempts} failed ({causes}){ran_out}",
                          f"Check the S3 endpoint's logs, or raise max_attempts (now "
                          f"{self.max_attempts}) or {deadline_knob} (now {deadline_s:g} s)."
                          + resume)

    def _call(self, what: str, action: str, fn: Callable[[], T], log: LogFn,
              probe: bool = False) -> T | None:
        """`fn()` (one small request) with our retries. `probe`: a request the server may not
        support; a client error then returns None instead of failing the fetch."""
        retry = _Retry(f"{action} of {what}", self.max_attempts, self.backoff_base_s,
                       self.list_deadline_s, log)
        while True:
            retry.begin()
            try:
                result = fn()
            except (ClientError, BotoCoreError) as exc:
                found = self._transient(exc, self.list_read_timeout_s)
                if found is None:
                    if probe and isinstance(exc, ClientError):
                        return None
                    raise self._explain(exc, what) from None
                if not retry.failed(*found, self._timed_out_s(exc, self.list_read_timeout_s)):
                    raise self._give_up(what, retry, "list") from None
                continue
            retry.succeeded()
            return result

    # -- describe -----------------------------------------------------------------------------
    def describe(self, source: SourceRef, log: LogFn = log_to_python) -> RemoteCheckpoint:
        uri = source.uri
        listed: list[dict] = []
        args: dict[str, str] = {"Bucket": source.location, "Prefix": source.path}
        while True:
            page = self._call(uri, "listing", lambda: self._list_client().list_objects_v2(**args), log)
            listed.extend(page.get("Contents", []))
            if not page.get("IsTruncated") or not page.get("NextContinuationToken"):
                break
            args["ContinuationToken"] = page["NextContinuationToken"]
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
        with ThreadPoolExecutor(min(self.max_concurrency, len(objects))) as pool:
            objects = list(pool.map(lambda o: self._evidence(source.location, o, log), objects))
        h = hashlib.sha256()
        for o in sorted(objects, key=lambda o: o.path):
            # Without an ETag, Last-Modified tells a re-upload of the same size apart: a new
            # version is a new revision, staged afresh (the line is unchanged where an ETag is).
            lm = "" if o.etag else f"\0{o.last_modified}"
            h.update(f"{o.path}\0{o.size}\0{o.etag}{lm}\n".encode())
        return RemoteCheckpoint(source=uri, revision="s3-" + h.hexdigest()[:16],
                                objects=sorted(objects, key=lambda o: o.path), ignored=ignored)

    def _evidence(self, bucket: str, obj: RemoteObject, log: LogFn) -> RemoteObject:
        """What the source recorded about an object: `x-amz-meta-sha256` (our uploader, `aws s3
        cp --metadata`), an S3 additional checksum, whether the ETag is a digest, part sizes."""
        where = f"s3://{bucket}/{obj.key}"
        head = self._call(where, "HEAD", lambda: self._list_client().head_object(
            Bucket=bucket, Key=obj.key, ChecksumMode="ENABLED"), log)
        sha256 = head.get("Metadata", {}).get("sha256")
        algorithm = value = None
        for name in checksums.S3_CHECKSUMS:
            if found := head.get(f"Checksum{name.upper()}"):
                algorithm, value = name, found
                break
        if algorithm == "sha256" and not sha256 and checksums.parts_of(value) is None:
            sha256 = base64.b64decode(value).hex()  # a whole-object SHA256: what we stream
        etag_is_digest = (head.get("ServerSideEncryption") not in ("aws:kms", "aws:kms:dsse")
                          and not head.get("SSECustomerAlgorithm"))
        modified = head.get("LastModified")
        obj = replace(obj, sha256=sha256, checksum_algorithm=algorithm, checksum=value,
                      etag_is_digest=etag_is_digest,
                      etag=head.get("ETag", "").strip('"') or obj.etag,
                      last_modified=modified.isoformat() if modified else None)
        n_parts = checksums.parts_of(obj.etag) or checksums.parts_of(value)
        whole = bool(algorithm and checksums.can_compute(algorithm)
                     and checksums.parts_of(value) is None)
        if n_parts and not sha256 and not whole:  # only a composite form needs the part size
            part_bytes, note = self._part_layout(bucket, obj, n_parts, log)
            obj = replace(obj, part_bytes=part_bytes, evidence_note=note)
        return obj

    def _part_layout(self, bucket: str, obj: RemoteObject, n_parts: int,
                     log: LogFn) -> tuple[int | None, str]:
        """The part size of a multipart upload, if every part but the last has it: that is
        what recomputing a multipart ETag or a composite checksum needs."""
        where = f"s3://{bucket}/{obj.key}"

        def part(number: int) -> int | None:
            got = self._call(where, f"HEAD part {number}", lambda: self._list_client().head_object(
                Bucket=bucket, Key=obj.key, PartNumber=number), log, probe=True)
            return None if got is None else got["ContentLength"]

        first = part(1)
        last = first if n_parts == 1 else part(n_parts)
        if first is None or last is None:
            return None, ("the server does not answer HeadObject with a PartNumber, so the "
                          "multipart upload's ETag cannot be recomputed")
        if first * (n_parts - 1) + last == obj.size and 0 < last <= first:
            return first, ""
        return None, (f"the multipart upload's {n_parts} parts differ in size, so its ETag "
                      "cannot be recomputed")

    def read_small(self, source: SourceRef, obj: RemoteObject, log: LogFn = log_to_python) -> bytes:
        where = f"s3://{source.location}/{obj.key}"
        return self._call(where, "GET", lambda: self._list_client().get_object(
            Bucket=source.location, Key=obj.key)["Body"].read(), log)

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
                while data := body.read(READ_BLOCK):
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
              on_progress: ProgressFn, on_file_done: FileDoneFn,
              log: LogFn = log_to_python) -> int:
        """Every object is finished here or fails the run: a part whose journal an earlier run
        completed (killed between its last journal write and its rename) is hashed and renamed
        like one whose last chunk lands now, so it is verified like any other file."""
        chunk = self.chunk_size_mb << 20
        resumed = 0
        jobs: list[tuple[_PartFile, int | None]] = []  # None: every chunk is in; finish it
        parts: list[_PartFile] = []
        for obj in remote.objects:
            final = staging / obj.path
            part = _PartFile(obj, final, chunk)
            if obj.identity is None and (final.exists() or part.part.exists()):
                log(f"{obj.path}: the source gives no ETag, Last-Modified or checksum for it, "
                    "so what an earlier run fetched of it cannot be told from a newer version "
                    "of the same size: fetching it from the start")
                final.unlink(missing_ok=True)
                part.drop_leftovers()
            if final.is_file() and final.stat().st_size == obj.size:
                part.drop_leftovers()  # a run killed between the rename and the journal's unlink
                resumed += obj.size
                on_progress(obj.size)
                on_file_done(obj, final, None)  # finished by an earlier run; hashed by the cache
                continue
            done = part.open()
            resumed += sum(part.chunk_len(i) for i in done)
            on_progress(sum(part.chunk_len(i) for i in done))
            parts.append(part)
            missing = [(part, i) for i in range(part.n_chunks) if i not in done]
            jobs.extend(missing or [(part, None)])  # complete already (or empty): finish it
        if not parts:
            return resumed
        stop = threading.Event()

        def run(part: _PartFile, index: int | None) -> None:
            if stop.is_set():
                raise _Cancelled
            if index is not None:
                self._get_range(source, part, index, on_progress, stop, log)
                if not part.commit(index):  # synced, then journaled
                    part.hash_ready(wait=False)
                    return
            part.hash_ready(wait=True)  # the whole file is durable: hash the rest, finish
            on_file_done(part.obj, part.final, part.finish())

        try:
            with ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="s3-get") as pool:
                futures = [pool.submit(run, p, i) for p, i in jobs]
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                failures = [f.exception() for f in done if f.exception() is not None]
                if failures:
                    stop.set()  # every other range raises _Cancelled: nothing more is journaled
                    for other in futures:
                        other.cancel()
                    raise next(e for e in failures if not isinstance(e, _Cancelled))
        finally:
            for part in parts:
                part.close()
        return resumed

    def _get_range(self, source: SourceRef, part: _PartFile, index: int,
                   on_progress: ProgressFn, stop: threading.Event, log: LogFn) -> None:
        """Write one chunk into the part file; returns only when every byte of it is written.

        Raises _Cancelled when another range failed the run, FetchError when this one gives up,
        and a write's OSError (a full disk) at once: no retry can fix the cache volume.
        """
        start = index * part.chunk
        end = min(start + part.chunk, part.obj.size)  # exclusive
        where = f"s3://{source.location}/{part.obj.key}"
        span = f"range bytes={start}-{end - 1}"
        retry = _Retry(f"{span} of {where}", self.max_attempts, self.backoff_base_s,
                       self.range_deadline_s, log, stop)
        while True:
            retry.begin()
            pos = start
            try:
                resp = self._ranges_client().get_object(
                    Bucket=source.location, Key=part.obj.key, Range=f"bytes={start}-{end - 1}",
                    **_unchanged_since_seen(part.obj))
                body = resp["Body"]
                try:
                    _check_same_version(part.obj, resp, where)
                    while pos < end and retry.elapsed_s < self.range_deadline_s:
                        if stop.is_set():
                            raise _Cancelled
                        data = body.read(min(READ_BLOCK, end - pos))
                        if not data:
                            break
                        pwrite_all(part.fd, data, pos, part.part)
                        pos += len(data)
                        on_progress(len(data))
                finally:
                    body.close()
            except (ClientError, BotoCoreError) as exc:
                if _precondition_failed(exc):
                    raise _changed_while_fetching(part.obj, where, "the server refused the "
                                                  "range: precondition failed") from None
                found = self._transient(exc, self.range_read_timeout_s)
                if found is None:
                    raise self._explain(exc, where) from None
                kind, cause = found
                timed_out_s = self._timed_out_s(exc, self.range_read_timeout_s)
            else:
                if pos == end:
                    retry.succeeded()
                    return
                kind, cause = "dropped", f"the server sent {pos - start} of {end - start} bytes"
                timed_out_s = 0.0
                if retry.elapsed_s >= self.range_deadline_s:
                    kind, cause = "timeout", f"{pos - start} of {end - start} bytes in the deadline"
            on_progress(-(pos - start))  # the retry fetches these again
            if not retry.failed(kind, cause, timed_out_s):
                raise self._give_up(where, retry, "range",
                                    f"{span} (object of {part.obj.size} bytes)") from None

    # -- upload (demo, tests, the sensor's users) ---------------------------------------------
    def upload_dir(self, local_dir: Path, bucket: str, prefix: str) -> list[str]:
        """Upload a checkpoint directory with each file's sha256 as `x-amz-meta-sha256`."""
        from boto3.s3.transfer import TransferConfig

        from onboarding.fetch.checkpoint_manifest import sha256_file

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
            except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
                raise self._explain(exc, f"s3://{bucket}/{key}") from None
            keys.append(key)
        return keys


class _Retry:
    """The attempts of one request: jittered backoff inside a total deadline, a log line for
    each retry and for a recovery, and the true count for the final error."""

    def __init__(self, what: str, max_attempts: int, base_s: float, deadline_s: float,
                 log: LogFn, stop: threading.Event | None = None):
        self.what, self.max_attempts, self.base_s = what, max_attempts, base_s
        self.deadline_s, self.log, self.stop = deadline_s, log, stop
        self.t0 = time.monotonic()
        self.attempt = 0
        self.causes: list[str] = []
        self.last_kind = ""
        self.deadline_hit = False

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def begin(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise _Cancelled
        self.attempt += 1

    def succeeded(self) -> None:
        if self.causes:
            self.log(f"{self.what}: succeeded on attempt {self.attempt}/{self.max_attempts} "
                     f"after {self.causes[-1]}")

    def failed(self, kind: str, cause: str, timed_out_s: float = 0.0) -> bool:
        """Record a failed attempt and wait out the backoff; False when none is left.

        `timed_out_s`: the timeout that ended this attempt. The next attempt is expected to
        wait as long, and is not made when that would end past the deadline: so a hung
        endpoint fails within the deadline, not one whole timeout after it."""
        self.causes.append(cause)
        self.last_kind = kind
        if self.attempt >= self.max_attempts:
            return False
        delay_s = min(8.0, self.base_s * 2 ** (self.attempt - 1)) * (0.5 + random.random())
        if self.elapsed_s + delay_s + timed_out_s >= self.deadline_s:
            self.deadline_hit = True
            return False
        self.log(f"retry {self.attempt + 1}/{self.max_attempts} for {self.what}: {cause} "
                 f"(waiting {delay_s:.1f} s)")
        if self.stop is None:
            time.sleep(delay_s)
        elif self.stop.wait(delay_s):
            raise _Cancelled
        return True


def _without_gc(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(...)` with the garbage collector paused, then left as it was found.

    For building a botocore client: some 38 000 allocations (the S3 model and its shapes), all
    long-lived. Counted by the collector, they set off a full collection, which in a process
    holding Dagster's heap (136 000 objects in bench/fetch.py's) cost 0.14-0.2 s of CPU inside
    every fetch; paused, they are counted once.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        return fn(*args, **kwargs)
    finally:
        if was:
            gc.enable()


def _unchanged_since_seen(obj: RemoteObject) -> dict[str, Any]:
    """The conditions that make the server refuse a range of another version of `obj` (412):
    If-Match on the ETag, else If-Unmodified-Since on Last-Modified (one-second resolution)."""
    if obj.etag:
        return {"IfMatch": f'"{obj.etag}"'}
    if obj.last_modified:
        return {"IfUnmodifiedSince": datetime.fromisoformat(obj.last_modified)}
    return {}


def _check_same_version(obj: RemoteObject, resp: dict, where: str) -> None:
    """A server that ignores the conditions still names the version it sent: bytes of any other
    version than the one the fetch pinned never reach the part file."""
    etag = resp.get("ETag", "").strip('"') or None
    modified = resp.get("LastModified")
    if obj.etag and etag and etag != obj.etag:
        raise _changed_while_fetching(obj, where, f"ETag {obj.etag} became {etag}")
    if not obj.etag and obj.last_modified and modified is not None and \
            modified != datetime.fromisoformat(obj.last_modified):
        raise _changed_while_fetching(obj, where, f"Last-Modified {obj.last_modified} became "
                                      f"{modified.isoformat()}")


def _precondition_failed(exc: Exception) -> bool:
    if not isinstance(exc, ClientError):
        return False
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return status == 412 or exc.response.get("Error", {}).get("Code") == "PreconditionFailed"


def _changed_while_fetching(obj: RemoteObject, where: str, how: str) -> FetchError:
    return FetchError(where, f"the object was replaced at the source while it was being fetched "
                      f"({how}); no byte of the new version was written beside the old ones",
                      "Re-run when the upload has finished: the next run sees the new version "
                      "as a new revision and fetches it from the start.")


def _status_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def pwrite_all(fd: int, data: bytes, offset: int, path: Path) -> None:
    """Write `data` in pieces of at most WRITE_BLOCK. pwrite may write less than asked (a
    filesystem nearly full): write the rest or raise the OSError, named after the file, for
    the cache to report as a disk problem."""
    view = memoryview(data)
    while view:
        try:
            n = os.pwrite(fd, view[:WRITE_BLOCK], offset)
        except OSError as exc:
            exc.filename = exc.filename or str(path)
            raise
        if n <= 0:
            raise OSError(errno.EIO, "pwrite wrote nothing", str(path))
        view, offset = view[n:], offset + n


class _PartFile:
    """One object being fetched: `<name>.part` plus `<name>.part.chunks` (finished chunk ids).

    A chunk id enters the journal only after all its bytes were written and fdatasync'd, so a
    resumed run never trusts bytes that never arrived. Chunks written while one worker syncs
    are synced together by it in its next round (group commit); nobody waits for a sync.

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
        self._done: set[int] = set()  # durable and journaled
        self._written: set[int] = set()  # every byte written, maybe not yet durable
        self._completed = False
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._journal_fh = None
        self._sha = hashlib.sha256()
        self._next_hash = 0  # the first chunk not yet hashed
        self._hash_lock = threading.Lock()
        self._buf = bytearray(READ_BLOCK)

    def chunk_len(self, i: int) -> int:
        return min(self.chunk, self.obj.size - i * self.chunk)

    def drop_leftovers(self) -> None:
        """The file is already under its final name: a part or journal beside it is what a
        run killed after the rename left; kept, it would land in the cache entry."""
        self.part.unlink(missing_ok=True)
        self.journal.unlink(missing_ok=True)

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
        self._done, self._written = set(done), set(done)
        return set(done)

    def commit(self, i: int) -> bool:
        """Chunk i is written: make it durable, then journal it. One worker at a time syncs
        every chunk written so far; the others go on fetching instead of queueing for a sync.
        True for the one call that saw the whole file durable (it then finishes the file)."""
        with self._lock:
            self._written.add(i)
        completed = False
        while self._sync_lock.acquire(blocking=False):
            try:
                with self._lock:
                    batch = sorted(self._written - self._done)
                if batch:
                    os.fdatasync(self.fd)
                    self._journal_fh.write("".join(f"{j}\n" for j in batch))
                    self._journal_fh.flush()
                with self._lock:
                    self._done.update(batch)
                    if len(self._done) == self.n_chunks and not self._completed:
                        self._completed = completed = True
            finally:
                self._sync_lock.release()
            with self._lock:  # a chunk may have been written while we synced: go round again
                if not self._written - self._done:
                    break
        return completed

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
