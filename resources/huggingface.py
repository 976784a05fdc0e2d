"""Hugging Face Hub source through huggingface_hub itself (online, or its offline cache).

Online, `model_info(files_metadata=True)` gives the commit and every file's size and LFS sha256;
offline (`HF_HUB_OFFLINE=1`) the same facts come from the local hub cache, where LFS blobs are
named by their sha256. Either way `snapshot_download` does the transfer (pinned to the resolved
commit, restricted to checkpoint files) and files are hard-linked into our staging directory,
so the hub cache and the NVMe cache share bytes instead of doubling them.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from pydantic import Field

from onboarding.common.errors import FetchError
from onboarding.fetch.catalog import SourceRef, check_revision
from onboarding.fetch.checkpoint_manifest import (
    CHECKPOINT_PATTERNS,
    is_checkpoint_file,
    safe_relative_path,
)
from resources.object_store import (
    FileDoneFn,
    LogFn,
    ObjectStore,
    ProgressFn,
    RemoteCheckpoint,
    RemoteObject,
    log_to_python,
)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


class HuggingFaceStore(ObjectStore):
    cache_dir: str | None = Field(default=None, description="hub cache; None = HF_HUB_CACHE")
    endpoint: str | None = Field(default=None, description="None = HF_ENDPOINT or the Hub")
    token: str | None = Field(default=None, description="set from EnvVar('HF_TOKEN')")
    max_workers: int = 8

    def _snapshot(self, source: SourceRef, revision: str | None, patterns, local_only: bool) -> Path:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        if revision is not None:
            try:
                check_revision(revision)  # the catalog checks it too; a SourceRef can be built
            except ValueError as exc:
                raise FetchError(source.uri, str(exc), "Fix the revision after '@'.") from None
        try:
            return Path(snapshot_download(
                source.location, revision=revision, allow_patterns=patterns,
                cache_dir=self.cache_dir, endpoint=self.endpoint, token=self.token,
                local_files_only=local_only, max_workers=self.max_workers))
        except LocalEntryNotFoundError:
            raise FetchError(source.uri, "not in the local Hugging Face cache and the hub is "
                             "offline (HF_HUB_OFFLINE=1)", "Pre-seed the hub cache on this node "
                             "(`hf download` where the hub is reachable) or unset "
                             "HF_HUB_OFFLINE.") from None
        except (RepositoryNotFoundError, GatedRepoError) as exc:
            raise FetchError(source.uri, f"the repository is not accessible ({type(exc).__name__})",
                             "Check the repo id, and HF_TOKEN for gated or private repos.") from None
        except RevisionNotFoundError:
            raise FetchError(source.uri, f"revision {revision!r} does not exist",
                             "Pin an existing commit, branch or tag after '@'.") from None

    def describe(self, source: SourceRef, log: LogFn = log_to_python) -> RemoteCheckpoint:
        if _offline():
            snap = self._snapshot(source, source.revision, list(CHECKPOINT_PATTERNS), True)
            objects = []
            for f in sorted(p for p in snap.rglob("*") if p.is_file()):
                rel = safe_relative_path(f.relative_to(snap).as_posix(), source.uri)
                if not is_checkpoint_file(rel):
                    continue
                blob = Path(os.path.realpath(f)).name  # LFS: its sha256; git: its blob sha1
                objects.append(RemoteObject(path=rel, size=f.stat().st_size, key=rel,
                                            sha256=blob if _SHA256.match(blob) else None,
                                            git_sha1=blob if _SHA1.match(blob) else None))
            return RemoteCheckpoint(source=source.uri, revision=snap.name, objects=objects)
        from huggingface_hub import HfApi

        try:
            info = HfApi(endpoint=self.endpoint, token=self.token).model_info(
                source.location, revision=source.revision, files_metadata=True)
        except Exception as exc:  # noqa: BLE001 - re-raised with the cause named
            raise FetchError(source.uri, f"cannot read the repository ({type(exc).__name__}: {exc})",
                             "Check the repo id, revision, HF_TOKEN and the hub's reachability.") from None
        objects, ignored = [], []
        for s in info.siblings or []:
            rel = safe_relative_path(s.rfilename, source.uri)
            if not is_checkpoint_file(rel):
                ignored.append(rel)
                continue
            objects.append(RemoteObject(path=rel, size=s.size or 0, key=rel,
                                        sha256=s.lfs.sha256 if s.lfs else None,
                                        git_sha1=None if s.lfs else s.blob_id))
        return RemoteCheckpoint(source=source.uri, revision=info.sha, objects=objects,
                                ignored=ignored)

    def fetch(self, remote: RemoteCheckpoint, source: SourceRef, staging: Path,
              on_progress: ProgressFn, on_file_done: FileDoneFn,
              log: LogFn = log_to_python) -> int:
        snap = self._snapshot(source, remote.revision, [o.path for o in remote.objects], _offline())
        for obj in remote.objects:
            src, dst = snap / obj.path, staging / obj.path
            if not src.exists():
                raise FetchError(f"{source.uri}: {obj.path}", "absent from the downloaded snapshot",
                                 "The revision changed or the download was cut; re-run.")
            real = self._inside_hub_cache(snap, src, source)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.unlink(missing_ok=True)
            try:
                os.link(real, dst)
            except OSError:  # another filesystem: copy instead of sharing the blob
                shutil.copyfile(real, dst)
            on_progress(obj.size)
            on_file_done(obj, dst, None)
        return 0  # huggingface_hub resumes its own partial downloads in the hub cache

    @staticmethod
    def _inside_hub_cache(snap: Path, src: Path, source: SourceRef) -> str:
        """A snapshot entry must resolve to a blob of the same repo cache, never elsewhere."""
        real = os.path.realpath(src)
        repo_root = os.path.realpath(snap.parent.parent)  # models--org--name/
        if not real.startswith(repo_root + os.sep):
            raise FetchError(f"{source.uri}: {src.relative_to(snap)}",
                             f"the hub cache entry is a link to {real}, outside {repo_root}",
                             "Delete that hub cache entry and fetch again; links are refused.")
        return real

    def read_small(self, source: SourceRef, obj: RemoteObject,
                   log: LogFn = log_to_python) -> bytes:
        snap = self._snapshot(source, source.revision, [obj.path], _offline())
        return (snap / obj.path).read_bytes()
