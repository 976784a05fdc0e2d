"""The object-store interface every source implements (S3, Hugging Face).

Assets only see this interface: `describe` lists what a checkpoint is at the source, `fetch`
brings it into a staging directory (resuming what an earlier run left), `read_small` reads a
small object (an index) without staging it.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from onboarding.fetch import checksums
from onboarding.fetch.catalog import SourceRef


@dataclass(frozen=True, kw_only=True)
class RemoteObject:
    path: str  # relative to the checkpoint root, POSIX, already checked for traversal
    size: int
    etag: str | None = None  # plain MD5 for single-part S3 uploads, "md5-N" for multipart
    sha256: str | None = None  # what the source recorded, if anything
    key: str = ""  # the full key or filename at the source
    # An S3 additional checksum (`x-amz-checksum-*`): algorithm ("crc32", "crc64nvme", ...) and
    # its value as S3 gives it, base64, with "-<parts>" when COMPOSITE over a multipart upload.
    checksum_algorithm: str | None = None
    checksum: str | None = None
    # Bytes per part of a multipart upload (the last part shorter), from HeadObject(PartNumber)
    # when every part but the last has that size; None when unknown or irregular.
    part_bytes: int | None = None
    etag_is_digest: bool = True  # False where the ETag is no digest of the bytes (SSE-KMS, SSE-C)
    git_sha1: str | None = None  # a Hub file stored in git (not LFS): its blob id
    evidence_note: str = ""  # why no stronger evidence is usable, said in the check's metadata
    # When the source last wrote the object (S3 Last-Modified, ISO 8601, one-second resolution):
    # its identity where the server gives no ETag.
    last_modified: str | None = None

    @property
    def identity(self) -> str | None:
        """What pins this object's version across requests and runs, so a resume never joins
        bytes of two versions: the ETag, else Last-Modified; None when the source gives neither
        (then nothing an earlier run left of it is trusted)."""
        if self.etag:
            return f"etag {self.etag}"
        if self.last_modified:
            return f"last-modified {self.last_modified}"
        if self.sha256 or self.git_sha1:  # a recorded digest: a changed object fails it
            return f"sha256 {self.sha256}" if self.sha256 else f"git-sha1 {self.git_sha1}"
        return None

    def evidence(self) -> tuple[str, str | None]:
        """What verifies this object once fetched: (kind, the value to compare with), the
        strongest first (`onboarding.fetch.checksums.EVIDENCE_ORDER`); ("size_only", None) if none."""
        if self.sha256:
            return "sha256", self.sha256
        alg, value = self.checksum_algorithm, self.checksum
        if alg and value and checksums.can_compute(alg) and (
                checksums.parts_of(value) is None or self.part_bytes):
            return alg, value
        if self.etag and self.etag_is_digest:
            if len(self.etag) == 32 and "-" not in self.etag:
                return "etag_md5", self.etag
            if checksums.parts_of(self.etag) and self.part_bytes:
                return "etag_multipart", self.etag
        if self.git_sha1:
            return "git_sha1", self.git_sha1
        return "size_only", None

    def size_only_reason(self) -> str:
        """Why a size-only object has nothing better, for the check's metadata and errors."""
        if self.evidence_note:
            return self.evidence_note
        alg = self.checksum_algorithm
        if alg and not checksums.can_compute(alg):
            return (f"the source recorded a {alg} checksum, which needs awscrt to recompute "
                    "(pip install 'botocore[crt]')")
        if self.etag and not self.etag_is_digest:
            return "the ETag is not a digest of the bytes (server-side encryption with KMS or SSE-C)"
        return "the source recorded no checksum"


@dataclass
class RemoteCheckpoint:
    source: str
    revision: str  # HF commit, or S3 content id from keys, sizes and ETags
    objects: list[RemoteObject] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # keys that are not checkpoint files

    @property
    def total_bytes(self) -> int:
        return sum(o.size for o in self.objects)


ProgressFn = Callable[[int], None]  # bytes just received
LogFn = Callable[[str], None]  # one line for the operator (the run's log in Dagster)
# An object is complete in staging; the digest is its sha256 when the store computed it while
# writing (hashing hot pages as chunks land), else None and the cache hashes the file itself.
FileDoneFn = Callable[[RemoteObject, Path, str | None], None]


def log_to_python(line: str) -> None:
    """The default `log`: Python's logging, for callers outside a Dagster run."""
    logging.getLogger("resources.object_store").info(line)


class ObjectStore(dg.ConfigurableResource, ABC):
    @abstractmethod
    def describe(self, source: SourceRef, log: LogFn = log_to_python) -> RemoteCheckpoint: ...

    @abstractmethod
    def fetch(self, remote: RemoteCheckpoint, source: SourceRef, staging: Path,
              on_progress: ProgressFn, on_file_done: FileDoneFn,
              log: LogFn = log_to_python) -> int:
        """Bring every object into `staging/<path>`, resuming partial work found there.

        Returns the bytes found already received by an earlier, interrupted run. A write that
        fails (a full disk) raises its OSError unchanged: it is the cache's problem, not the
        source's, and retrying cannot help.
        """

    @abstractmethod
    def read_small(self, source: SourceRef, obj: RemoteObject,
                   log: LogFn = log_to_python) -> bytes: ...
