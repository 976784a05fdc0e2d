"""Fill KServe's node cache folder for one published variant with the project's own fetch.

KServe's local-model download Job runs a container with two arguments, the LocalModelCache's
sourceModelUri and the folder its PVC mounts (`models/<storage key>/` of the node group's
volume; kserve v0.20.0 pkg/controller/v1alpha1/localmodelnode/controller.go launchJob), and a
ClusterStorageContainer whose `supportedUriFormats` match the URI picks that container
(getContainerSpecForStorageUri, same file). This is what such a container runs: the NVMe cache's
fetch (resumable, verified file by file, renamed into place only when complete) into a hidden
entry inside the folder, then each verified file hard-linked to the folder's top level, where
the engine reads it. A folder that already holds the verified entry (an earlier fill on this
node, or `prefill` from the pipeline's own verified variant) finishes at once with nothing
fetched, so KServe's Job succeeds and the node's status becomes Downloaded without a second copy
of the bytes. Its last step writes `.onboarding-complete`, which the model pods' init container
waits for (onboarding/deploy/kserve.py cache_gate).
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from onboarding.common.errors import ConfigError, IntegrityError, OnboardingError
from onboarding.common.files import write_atomic
from onboarding.deploy.kserve import CACHE_COMPLETE
from onboarding.fetch.catalog import parse_source
from resources.nvme_cache import NvmeCache
from resources.object_store import LogFn, ObjectStore
from resources.s3 import S3ObjectStore

VERIFIED_DIR = ".onboarding-verified"  # hidden: the engine loads the folder's top level only


@dataclass(frozen=True)
class FillResult:
    folder: Path
    warm: bool  # the folder already held the verified files: nothing was fetched
    bytes_fetched: int
    files: int


def fill(store: ObjectStore, uri: str, folder: Path, log: LogFn = print) -> FillResult:
    """Make `folder` hold the published variant at `uri`, verified, and say what it took."""
    source = parse_source(uri)
    if source.kind != "s3":
        raise ConfigError(uri, "the node cache filler reads published variants on S3 only",
                          "Publish the variant (published_variant) and cache its s3:// URI.")
    folder.mkdir(parents=True, exist_ok=True)
    complete = folder / CACHE_COMPLETE
    complete.unlink(missing_ok=True)  # a pod arriving while this runs waits (kserve.cache_gate)
    cache = NvmeCache(root=str(folder / VERIFIED_DIR))
    result = cache.fetch("variant", store, source, log=log)
    for entry in result.manifest.files:
        _link(result.path / entry.path, folder / entry.path)
    write_atomic(complete, f"{uri} {result.manifest.content_hash} "
                 f"{len(result.manifest.files)} files\n")
    log(f"{folder}: {len(result.manifest.files)} verified files of {uri} "
        + ("already here, nothing fetched" if result.warm
           else f"fetched ({result.bytes_fetched} bytes over the wire)"))
    return FillResult(folder, result.warm, result.bytes_fetched, len(result.manifest.files))


def prefill(store: ObjectStore, uri: str, folder: Path, local_dir: Path,
            log: LogFn = print) -> FillResult:
    """Fill `folder` (KServe's `models/<storage key>/` on this node) from the pipeline's own
    copy of the published variant at `uri` (`local_dir`, the files `published_variant`
    uploaded), with no byte over the wire: each local file of the published size is
    hard-linked (copied across filesystems) into the staging folder `fill` resumes from, then
    `fill` verifies every file's sha256 against what the store recorded, renames it into place,
    links it to the top level and marks the folder complete. KServe's download Job, run later
    on this node, then finds the folder verified and fetches nothing."""
    source = parse_source(uri)
    if source.kind != "s3":
        raise ConfigError(uri, "the node cache filler reads published variants on S3 only",
                          "Publish the variant (published_variant) and cache its s3:// URI.")
    remote = store.describe(source, log=log)
    staging = folder / VERIFIED_DIR / "variant" / f".staging-{remote.revision}"
    placed = 0
    for obj in remote.objects:
        src, dst = local_dir / obj.path, staging / obj.path
        if not src.is_file() or src.stat().st_size != obj.size or dst.exists():
            continue  # not ours to place: fill fetches (or keeps) it
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            shutil.copyfile(src, dst)  # another filesystem: a local copy, still no download
        placed += 1
    log(f"{folder}: {placed} of {len(remote.objects)} files placed from {local_dir}")
    try:
        return fill(store, uri, folder, log=log)
    except IntegrityError as exc:  # a local file is not the published one: quarantined by the
        # verified fetch, so the second fill takes that file from the store
        log(f"{folder}: a local file differs from the published variant ({exc}); fetching it")
        return fill(store, uri, folder, log=log)


def _link(src: Path, dst: Path) -> None:
    """`dst` becomes the verified file itself (one inode, no copy), replaced atomically."""
    if dst.exists() and os.path.samefile(src, dst):
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.link")
    tmp.unlink(missing_ok=True)
    os.link(src, tmp)
    os.replace(tmp, dst)


def store_from_env(env: dict[str, str]) -> S3ObjectStore:
    """The S3 store as KServe's credential builder hands it to the download container: the
    service account's secret as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, its endpoint
    annotation as AWS_ENDPOINT_URL (kserve v0.20.0 pkg/credentials/s3/s3_secret.go); the
    project's own S3_ENDPOINT_URL where that is absent."""
    return S3ObjectStore(
        endpoint_url=env.get("AWS_ENDPOINT_URL") or env.get("S3_ENDPOINT_URL") or None,
        access_key_id=env.get("AWS_ACCESS_KEY_ID"),
        secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
        region_name=env.get("AWS_DEFAULT_REGION") or "us-east-1")


def main(argv: list[str] | None = None) -> int:
    """`python -m resources.cache_filler <sourceModelUri> <folder>`: KServe's Job arguments."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m resources.cache_filler <s3://bucket/prefix/> <folder>",
              file=sys.stderr)
        return 2
    try:
        fill(store_from_env(dict(os.environ)), args[0], Path(args[1]))
    except OnboardingError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
