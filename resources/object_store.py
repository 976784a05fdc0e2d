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

from onboarding.catalog import SourceRef


@dataclass(frozen=True)
class RemoteObject:
    path: str  # relative to the checkpoint root, POSIX, already checked for traversal
    size: int
    etag: str | None = None  # plain MD5 for single-part S3 uploads, "md5-N" for multipart
    sha256: str | None = None  # what the source recorded, if anything
    key: str = ""  # the full key or filename at the source


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
