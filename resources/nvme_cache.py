"""The node-local NVMe cache: `<root>/<model>/<revision>/`, complete or absent.

A fetch stages into `<root>/<model>/.staging-<revision>/` (kept across runs, so a killed fetch
resumes), verifies sizes, checksums, safetensors headers and the shard index, writes the
manifest, and only then renames the staging directory into place. A reader therefore never sees
half a checkpoint, and a failed fetch never touches the entry a previous run verified.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import dagster as dg
from pydantic import Field

from onboarding.common.errors import FetchError, IncompleteCheckpointError, IntegrityError
from onboarding.common.files import write_atomic
from onboarding.fetch import checksums
from onboarding.fetch.catalog import SourceRef
from onboarding.fetch.checkpoint_manifest import (
    MANIFEST_NAME,
    CheckpointManifest,
    FileEntry,
    dir_fsync,
    index_shards,
    read_safetensors_header,
    sha256_file,
    verify_entry,
)
from onboarding.fetch.checksums import EVIDENCE_ORDER
from onboarding.fetch.twins import NO_WEIGHTS, split_weights
from resources.object_store import LogFn, ObjectStore, RemoteCheckpoint, RemoteObject

GIB = 1 << 30
# Under <root>/.quarantine/<model>/: each file that failed verification, with the version and the
# bytes it failed on, so a file broken at the source is not downloaded again on every run.
FAILURES_NAME = "failures.json"


@dataclass(kw_only=True)
class FetchResult:
    path: Path
    manifest: CheckpointManifest
    warm: bool
    seconds: float
    bytes_fetched: int  # over the wire in this run
    bytes_resumed: int = 0  # found already received by an interrupted earlier run
    # What verified each file at fetch time (`onboarding.fetch.checksums.EVIDENCE_ORDER`): path ->
    # kind, with the reason where it is "size_only" (nothing recorded at the source).
    evidence: dict[str, str] = field(default_factory=dict)
    # What pinned each file's version across requests and runs (`RemoteObject.identity`):
    # kind -> files ("etag", "last-modified", "sha256", "git-sha1", "none").
    pinned_by: dict[str, list[str]] = field(default_factory=dict)

    @property
    def version_pins(self) -> dict[str, int | str]:
        """For the checkpoint's metadata: files per kind of version pin, and which files had
        none (a same-size replacement of those at the source cannot be seen)."""
        out: dict[str, int | str] = {k: len(v) for k, v in sorted(self.pinned_by.items())}
        if self.pinned_by.get("none"):
            out["unpinned_files"] = (
                ", ".join(self.pinned_by["none"]) + ": the source gives no ETag, Last-Modified "
                "or checksum, so a resume restarts them from zero and a replacement of the same "
                "size is not seen; the committed files passed the safetensors and JSON checks")
        return out

    @property
    def checked_by(self) -> dict[str, int | str]:
        """For the integrity check's metadata: files per kind of evidence (size_only always
        present), and `per_file`, each file with what verified it."""
        kinds = [e.split(" ", 1)[0] for e in self.evidence.values()]
        counts: dict[str, int | str] = {k: kinds.count(k) for k in EVIDENCE_ORDER
                                        if k in kinds or k == "size_only"}
        if self.evidence:
            counts["per_file"] = "; ".join(f"{p}: {e}" for p, e in sorted(self.evidence.items()))
        return counts

    @property
    def mb_per_s(self) -> float:
        return self.bytes_fetched / 1e6 / self.seconds if self.seconds > 0 else 0.0


class NvmeCache(dg.ConfigurableResource):
    root: str = Field(description="cache root on the node's NVMe, e.g. /data/models")
    reserve_gb: float = Field(default=2.0, ge=0, description="free space left after a fetch")
    lock_timeout_s: float = Field(default=5.0, ge=0,
                                  description="wait for another run's lock on the same entry")
    warm_verify: str = Field(default="sizes", pattern="^(sizes|full)$",
                             description="re-verification of a cached entry: sizes or sha256")
    hash_workers: int = Field(default=2, ge=1)
    refuse_size_only: bool = Field(
        default=False, description="refuse a checkpoint with files the source recorded no "
        "checksum for (they could be verified by size alone)")

    # -- layout -------------------------------------------------------------------------------
    def root_path(self) -> Path:
        root = Path(self.root)
        root.mkdir(parents=True, exist_ok=True)
        return root.resolve()

    def entry_dir(self, model: str, revision: str) -> Path:
        return self.root_path() / model / revision

    def read_manifest(self, entry: Path) -> CheckpointManifest | None:
        path = entry / MANIFEST_NAME
        if not path.is_file():
            return None
        try:
            return CheckpointManifest.read(path)
        except (ValueError, KeyError, TypeError):
            return None

    @contextmanager
    def lock(self, model: str, revision: str) -> Iterator[None]:
        """Exclusive per entry; a second run waits `lock_timeout_s`, then says who holds it."""
        model_dir = self.root_path() / model
        model_dir.mkdir(parents=True, exist_ok=True)
        path = model_dir / f".{revision}.lock"
        with open(path, "a+") as fh:
            deadline = time.monotonic() + self.lock_timeout_s
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        fh.seek(0)
                        holder = fh.read().strip() or "another process"
                        raise FetchError(f"cache entry {model}/{revision}",
                                         f"locked by {holder}", "Wait for that run to finish "
                                         "(or stop it); this run changed nothing.") from None
                    time.sleep(0.2)
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()} on {os.uname().nodename}")
            fh.flush()
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # -- fetch --------------------------------------------------------------------------------
    def fetch(self, model: str, store: ObjectStore, source: SourceRef,
              log: LogFn = lambda _: None, weights: bool = True) -> FetchResult:
        """`weights=False` for a performance twin: config.json and the tokenizer only."""
        remote = store.describe(source, log=log)
        if not weights:
            remote = _without_weights(remote, log)
        self._check_index(store, source, remote, log)
        with self.lock(model, remote.revision):
            entry = self.entry_dir(model, remote.revision)
            t0 = time.monotonic()
            warm = self._verified(entry, remote)
            if warm is not None:
                log(f"warm cache: {entry} already holds {len(warm.files)} verified files")
                return FetchResult(path=entry, manifest=warm, warm=True,
                                   seconds=time.monotonic() - t0, bytes_fetched=0,
                                   pinned_by=_pinned_by(remote))
            self._refuse_size_only(remote)
            self._refuse_known_broken(model, remote)
            staging = entry.parent / f".staging-{remote.revision}"
            staging.mkdir(parents=True, exist_ok=True)
            self._check_free_space(remote, staging)
            with self._disk_errors():
                manifest, resumed, evidence = self._download_and_verify(
                    model, store, source, remote, staging, log)
                (staging / MANIFEST_NAME).write_text(manifest.to_json())
                dir_fsync(staging)
            if entry.exists():  # present but failed verification: keep it for inspection
                self._quarantine(model, remote.revision, entry, "entry failed re-verification")
            os.replace(staging, entry)
            dir_fsync(entry.parent)
            self._drop_stale_staging(entry.parent, keep=staging.name)
            seconds = time.monotonic() - t0
            return FetchResult(path=entry, manifest=manifest, warm=False, seconds=seconds,
                               bytes_fetched=remote.total_bytes - resumed, bytes_resumed=resumed,
                               evidence=evidence, pinned_by=_pinned_by(remote))

    def _refuse_size_only(self, remote: RemoteCheckpoint) -> None:
        """With `refuse_size_only`, a file nothing but its size could verify stops the fetch
        before a byte is transferred."""
        if not self.refuse_size_only:
            return
        bare = [o for o in remote.objects if o.evidence()[0] == "size_only"]
        if bare:
            raise IntegrityError(
                f"{remote.source} ({remote.revision})",
                f"{len(bare)} file(s) could be verified by size alone: "
                + "; ".join(f"{o.path} ({o.size_only_reason()})" for o in bare),
                "Re-upload them with a checksum (our uploader and `aws s3 cp --metadata "
                "sha256=<hex>` record a sha256; `--checksum-algorithm CRC32` an S3 checksum), or "
                "set nvme_cache.refuse_size_only to false to accept size-only files.")

    # -- files broken at the source -------------------------------------------------------------
    def _failures_path(self, model: str) -> Path:
        return self.root_path() / ".quarantine" / model / FAILURES_NAME

    def _read_failures(self, model: str) -> dict[str, dict]:
        try:
            return json.loads(self._failures_path(model).read_text())
        except (OSError, ValueError):
            return {}

    def _refuse_known_broken(self, model: str, remote: RemoteCheckpoint) -> None:
        """A file an earlier run found broken at the source, and the source still holds that
        same version of: fail before a byte is fetched, saying which file to re-upload, instead
        of downloading and quarantining another copy of the same bytes on every run."""
        records = self._read_failures(model)
        known = [(o, records[o.path]) for o in remote.objects
                 if o.path in records and o.identity is not None
                 and records[o.path]["identity"] == o.identity
                 and records[o.path]["size"] == o.size and records[o.path]["at_source"]]
        if not known:
            return
        raise IntegrityError(
            f"{remote.source} ({remote.revision})",
            f"{len(known)} file(s) are broken at the source, as an earlier run found on this "
            "same version (" + known[0][0].identity + "): " + "; ".join(
                f"{o.path}: {r['cause']} (sha256 {r['sha256'][:12]}…, {r['when']})"
                for o, r in known),
            f"Re-upload {', '.join(o.path for o, _ in known)} at the source; nothing was "
            "downloaded again. A new upload is a new version and is fetched as usual (to fetch "
            f"this same version once more anyway, delete {self._failures_path(model)}).")

    def _remember_failures(self, model: str, problems: list[_Problem]) -> list[_Problem]:
        """Record each failure with the version and the bytes it came from; returns the
        problems with `at_source` decided: a file whose bytes match what the source recorded
        but are broken, or the same bytes failing the same way twice, is broken at the source."""
        records = self._read_failures(model)
        decided = []
        for p in problems:
            before = records.get(p.obj.path)
            same = (before is not None and p.obj.identity is not None
                    and before["identity"] == p.obj.identity and before["sha256"] == p.sha256)
            repeats = before["repeats"] + 1 if same else 1
            at_source = p.obj.identity is not None and (
                (p.kind == "structure" and p.evidence != "size_only") or repeats >= 2)
            records[p.obj.path] = {
                "identity": p.obj.identity, "size": p.obj.size, "sha256": p.sha256,
                "cause": p.cause, "kind": p.kind, "repeats": repeats, "at_source": at_source,
                "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
            decided.append(replace(p, at_source=at_source, repeats=repeats))
        path = self._failures_path(model)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(records, indent=1, sort_keys=True))
        return decided

    @contextmanager
    def _disk_errors(self) -> Iterator[None]:
        """A full disk or quota is the cache volume's problem: say so at once, never retry."""
        try:
            yield
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise FetchError(
                f"cache {self.root}", f"the disk filled up during the fetch "
                f"({os.strerror(exc.errno)}: {exc.filename or 'a staging file'})",
                "Free space on the cache volume (old revisions under the cache root can go) and "
                "re-run: the chunks already received are kept and the next run fetches only "
                "the rest.") from None

    def _verified(self, entry: Path, remote: RemoteCheckpoint) -> CheckpointManifest | None:
        manifest = self.read_manifest(entry)
        if manifest is None:
            return None
        expected = {o.path: o.size for o in remote.objects}
        if {f.path: f.size for f in manifest.files} != expected:
            return None
        return None if verify_entry(entry, manifest, self.warm_verify == "full") else manifest

    def _check_index(self, store: ObjectStore, source: SourceRef, remote: RemoteCheckpoint,
                     log: LogFn):
        """A shard the index names but the source lacks fails before any weight is fetched."""
        present = {o.path for o in remote.objects}
        for obj in remote.objects:
            if not obj.path.endswith(".safetensors.index.json"):
                continue
            base = obj.path.rsplit("/", 1)[0] + "/" if "/" in obj.path else ""
            try:
                named = index_shards(store.read_small(source, obj, log=log))
            except ValueError:
                raise IntegrityError(f"{source.uri}{obj.path}", "the shard index is not valid JSON",
                                     "Re-upload the index file.") from None
            absent = sorted(n for n in named if base + n not in present)
            if absent:
                raise IncompleteCheckpointError(
                                 f"{source.uri}{obj.path}",
                                 f"the weight map names {len(absent)} shard(s) the source does not "
                                 f"have: {', '.join(absent[:5])}",
                                 "Upload the missing shards (or wait for the upload to finish).")

    def _check_free_space(self, remote: RemoteCheckpoint, staging: Path) -> None:
        """Bytes still to land must fit: finished files and the blocks a `.part` file already
        holds (a resumed run rewrites those in place) take no new space."""
        have = 0
        for o in remote.objects:
            p, part = staging / o.path, staging / f"{o.path}.part"
            if p.is_file():
                have += min(p.stat().st_size, o.size)
            elif part.is_file():
                have += min(part.stat().st_blocks * 512, o.size)
        needed = remote.total_bytes - have
        free = shutil.disk_usage(staging).free
        reserve = int(self.reserve_gb * GIB)
        if free < needed + reserve:
            raise FetchError(
                f"cache {self.root}", f"{free / GIB:.2f} GiB free, the fetch needs "
                f"{needed / GIB:.2f} GiB plus a {self.reserve_gb:g} GiB reserve",
                "Free space on the cache volume (old revisions under the cache root can go) or "
                "lower nvme_cache.reserve_gb.")

    def _download_and_verify(self, model: str, store: ObjectStore, source: SourceRef,
                             remote: RemoteCheckpoint, staging: Path, log: LogFn):
        progress = _Progress(remote.total_bytes, log)
        hashes: dict[str, Future] = {}
        with ThreadPoolExecutor(self.hash_workers, thread_name_prefix="sha256") as hasher:
            def file_done(obj: RemoteObject, path: Path, sha256: str | None) -> None:
                hashes[obj.path] = hasher.submit(_digest, obj, path, sha256)

            resumed = store.fetch(remote, source, staging, progress.add, file_done, log=log)
            if resumed:
                log(f"resumed: {resumed / GIB:.2f} GiB were already received by an "
                    "interrupted run")
            results = {p: f.result() for p, f in hashes.items()}
        progress.finish()
        files, problems, never, evidence = [], [], [], {}
        for obj in remote.objects:
            if obj.path not in results:
                never.append(obj)
                continue
            size, sha, computed = results[obj.path]
            kind, expected = obj.evidence()

            def problem(what: str, cause: str, obj=obj, sha=sha, kind=kind) -> None:
                problems.append(_Problem(obj=obj, kind=what, cause=cause, sha256=sha,
                                         evidence=kind))

            if size != obj.size:
                problem("size", f"{size} bytes received, {obj.size} at the source")
            elif kind == "sha256" and sha != expected:
                problem("checksum", f"sha256 {sha[:12]}… but the source recorded "
                        f"{expected[:12]}…")
            elif kind not in ("sha256", "size_only") and computed != expected:
                composite = checksums.parts_of(expected) is not None
                parts = f" (parts of {obj.part_bytes} bytes)" if composite else ""
                problem("checksum", f"{kind} {computed} but the source recorded "
                        f"{expected}{parts}")
            elif cause := _structure_problem(staging / obj.path):
                problem("structure", cause)
            files.append(FileEntry(obj.path, size, sha))
            evidence[obj.path] = (kind if kind != "size_only"
                                  else f"size_only ({obj.size_only_reason()})")
        if problems:
            problems = self._remember_failures(model, problems)
        if problems or never:
            raise self._verification_failed(model, remote, staging, problems, never)
        return CheckpointManifest(source=remote.source, revision=remote.revision,
                                  files=files), resumed, evidence

    # -- quarantine ---------------------------------------------------------------------------
    def _quarantine_dir(self, model: str, revision: str) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        return self.root_path() / ".quarantine" / model / f"{revision}-{stamp}"

    def _verification_failed(self, model: str, remote: RemoteCheckpoint, staging: Path,
                             problems: list[_Problem],
                             never: list[RemoteObject]) -> IntegrityError:
        """Move what failed out of staging, then say what was moved where: the next run then
        fetches those objects again instead of failing the same way on the same leftovers,
        unless a file is known to be broken at the source (then it says which to re-upload).

        A file that failed verification may have been corrupted in transit or at the source;
        one that never completed is the store's bug (every store finishes or raises), and
        its part and journal go too, so nothing of it is trusted on the next run."""
        bad = [p.obj for p in problems]
        target, moved = self._quarantine_files(model, remote.revision, staging, bad, never)
        causes = [f"{p.obj.path}: {p.cause}" for p in problems] + [
            f"{o.path}: never completed (the store returned without finishing it)" for o in never]
        if moved:
            fix = f"Moved out of staging to {target}: {', '.join(moved)}."
        else:
            fix = "Nothing of them was left in staging."
        at_source = [p for p in problems if p.at_source]
        again = [p for p in problems if not p.at_source]
        if again or never:
            fix += (" The next run fetches " + ", ".join(
                [p.obj.path for p in again] + [o.path for o in never])
                + " again; the previous good cache entry is untouched.")
        if at_source:
            fix += (" Broken at the source, re-upload: " + "; ".join(
                f"{p.obj.path} ({p.why_at_source()})" for p in at_source)
                + ". The next run fails at once on this same version instead of fetching it "
                "again.")
        for p in again:
            fix += f" {p.obj.path}: {p.why_again()}."
        if never:
            fix += " A file that never completed is a bug in the object store: report it."
        return IntegrityError(f"{remote.source} ({remote.revision})",
                              f"{len(causes)} object(s) failed verification: "
                              + "; ".join(causes), fix)

    def _quarantine_files(self, model, revision, staging: Path, bad: list[RemoteObject],
                          never: list[RemoteObject] = ()) -> tuple[Path, list[str]]:
        """Move the bad files, and whatever a never-completed object left (the file, its part,
        its journal), into quarantine; returns the directory and what was really moved."""
        target = self._quarantine_dir(model, revision)
        names = [o.path for o in bad] + [
            name for o in never for name in (o.path, f"{o.path}.part", f"{o.path}.part.chunks")]
        moved = []
        for name in names:
            src = staging / name
            if src.exists():
                dst = target / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
                moved.append(name)
        return target, moved

    def _quarantine(self, model: str, revision: str, entry: Path, why: str) -> Path:
        target = self._quarantine_dir(model, revision)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(entry, target)
        (target / "QUARANTINED").write_text(why + "\n")
        return target

    def _drop_stale_staging(self, model_dir: Path, keep: str) -> None:
        for d in model_dir.glob(".staging-*"):
            if d.name != keep and d.is_dir():
                shutil.rmtree(d, ignore_errors=True)

    def verify(self, entry: Path, full: bool = True) -> list[str]:
        """Problems in a committed entry (for the integrity check); empty means intact.

        A full check that finds problems moves the entry to quarantine, as a failed fetch does,
        so the next run fetches it again instead of failing the same way on the same bytes.
        """
        manifest = self.read_manifest(entry)
        if manifest is None:
            return [f"{entry}: no readable {MANIFEST_NAME}"]
        problems = verify_entry(entry, manifest, full, workers=self.hash_workers)
        if problems and full:
            problems.append(self._quarantine_bad_entry(entry, problems))
        return problems

    def _quarantine_bad_entry(self, entry: Path, problems: list[str]) -> str:
        model, revision = entry.parent.name, entry.name
        try:
            with self.lock(model, revision):
                if not entry.is_dir():
                    return f"{entry} was already moved away; the next run fetches it again"
                target = self._quarantine(model, revision, entry,
                                          "failed its integrity check: " + "; ".join(problems))
        except FetchError as exc:  # another run holds the entry: leave it, say what to do
            return (f"{entry} was not quarantined ({exc.cause}); delete it and re-run to "
                    "fetch it again")
        return f"the entry was moved to {target}; the next run fetches it again"


@dataclass(frozen=True, kw_only=True)
class _Problem:
    """One file that failed verification: what kind of failure, on which bytes."""

    obj: RemoteObject
    kind: str  # size | checksum | structure
    cause: str
    sha256: str  # of the bytes received
    evidence: str  # the kind of evidence the source recorded (EVIDENCE_ORDER)
    at_source: bool = False
    repeats: int = 1

    def why_at_source(self) -> str:
        if self.kind == "structure":
            return (f"the bytes received match what the source recorded ({self.evidence}), so "
                    "the file is broken as stored" if self.evidence != "size_only" else
                    "the same bytes failed the same way on two fetches")
        return ("the same bytes failed the same way on two fetches: the source holds bytes "
                "that differ from what it recorded; re-upload it or fix its recorded checksum")

    def why_again(self) -> str:
        if self.obj.identity is None:
            return ("the source gives no version for it, so a transfer error cannot be told "
                    "from a broken upload; if it keeps failing, re-upload it")
        if self.kind == "structure":  # size_only: a transfer error is possible
            return ("the source records no checksum for it, so a transfer error cannot be "
                    "ruled out; if the same bytes fail again, it is broken at the source")
        return ("a transfer error or the source: if the same bytes fail again, the source's "
                "bytes differ from what it recorded (re-upload it or fix its recorded checksum)")


def _pinned_by(remote: RemoteCheckpoint) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for o in remote.objects:
        out.setdefault(o.identity.split(" ", 1)[0] if o.identity else "none", []).append(o.path)
    return out


def _structure_problem(path: Path) -> str | None:
    """What a reader would trip on, checked before commit: a safetensors header whose tensors
    lie outside the file, a JSON file that does not parse (config.json, the index, the
    tokenizer). None when the file reads."""
    if path.name.endswith(".safetensors"):
        try:
            read_safetensors_header(path)
        except IntegrityError as exc:
            return exc.cause
    elif path.name.endswith(".json"):
        try:
            json.loads(path.read_bytes())
        except ValueError as exc:
            where = (f" (line {exc.lineno}, column {exc.colno}: {exc.msg})"
                     if isinstance(exc, json.JSONDecodeError) else f" ({exc})")
            return "not valid JSON" + where
    return None


def _without_weights(remote: RemoteCheckpoint, log: LogFn) -> RemoteCheckpoint:
    """What a performance twin fetches: everything but the weights and their index; the real
    model's config.json is required, since it is all the twin is."""
    keep, left_out = split_weights(o.path for o in remote.objects)
    if "config.json" not in keep:
        raise IncompleteCheckpointError(
            f"{remote.source} ({remote.revision})", "performance twin: the source holds no "
            "config.json, and a twin is the real model's config.json and a tokenizer",
            "Upload the real model's config.json and tokenizer files under this prefix.")
    log(f"{NO_WEIGHTS}: fetching {len(keep)} file(s)"
        + (f"; {len(left_out)} weight file(s) at the source left out" if left_out else ""))
    return RemoteCheckpoint(source=remote.source, revision=remote.revision,
                            objects=[o for o in remote.objects if o.path in keep],
                            ignored=[*remote.ignored, *left_out])


def _digest(obj: RemoteObject, path: Path, sha256: str | None) -> tuple[int, str, str | None]:
    """Size, sha256 (unless the store streamed it), and the value of the object's evidence
    recomputed from the file where that evidence is not the sha256 itself."""
    kind, _ = obj.evidence()
    computed = None
    if kind == "etag_md5":
        computed = checksums.s3_etag(path)
    elif kind == "etag_multipart":
        computed = checksums.s3_etag(path, obj.part_bytes)
    elif kind in checksums.S3_CHECKSUMS and kind != "sha256":
        composite = checksums.parts_of(obj.checksum) is not None
        computed = checksums.s3_checksum(path, kind, obj.part_bytes if composite else None)
    elif kind == "git_sha1":
        computed = checksums.git_blob_sha1(path)
    return path.stat().st_size, sha256 or sha256_file(path), computed


class _Progress:
    """Logs bytes, percent and MB/s every few seconds: long downloads must show they move."""

    def __init__(self, total: int, log: LogFn, every_s: float = 5.0):
        self.total, self.log, self.every_s = total, log, every_s
        self.done = 0
        self.t0 = self.last = time.monotonic()
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            if now - self.last >= self.every_s:
                self.last = now
                self._emit(now)

    def _emit(self, now: float) -> None:
        rate = self.done / 1e6 / max(now - self.t0, 1e-9)
        pct = 100.0 * self.done / self.total if self.total else 100.0
        self.log(f"fetched {self.done / GIB:.2f} of {self.total / GIB:.2f} GiB ({pct:.0f}%), "
                 f"{rate:.0f} MB/s")

    def finish(self) -> None:
        self._emit(time.monotonic())
