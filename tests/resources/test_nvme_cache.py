"""The NVMe cache: atomic entries, warm hits, quarantine, missing shards, locks, resume."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from onboarding.common.errors import FetchError, IntegrityError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.fetch.catalog import parse_source
from onboarding.fetch.checkpoint_manifest import MANIFEST_NAME, sha256_file
from resources.nvme_cache import NvmeCache
from tests.tiny_models import shard_names


@pytest.fixture
def cache(tmp_path) -> NvmeCache:
    return NvmeCache(root=str(tmp_path / "nvme"), reserve_gb=0, lock_timeout_s=0.5)


def _upload(s3_store, ckpt, prefix):
    s3_store.upload_dir(ckpt, "models", prefix)
    return parse_source(f"s3://models/{prefix}")


def test_fetch_then_warm_hit(cache, s3_store, tiny_checkpoint, unique_prefix):
    src = _upload(s3_store, tiny_checkpoint, unique_prefix)
    cold = cache.fetch("tiny", s3_store, src)
    assert not cold.warm and cold.bytes_fetched == cold.manifest.total_bytes
    for f in cold.manifest.files:
        assert sha256_file(cold.path / f.path) == sha256_file(tiny_checkpoint / f.path)
    assert (cold.path / MANIFEST_NAME).is_file()
    assert not list(cold.path.parent.glob(".staging-*"))
    warm = cache.fetch("tiny", s3_store, src)
    assert warm.warm and warm.bytes_fetched == 0 and warm.path == cold.path
    assert warm.manifest.content_hash == cold.manifest.content_hash


def test_corrupted_object_is_quarantined_and_previous_entry_survives(
        cache, s3_store, tiny_checkpoint, unique_prefix):
    src = _upload(s3_store, tiny_checkpoint, unique_prefix)
    good = cache.fetch("tiny", s3_store, src)
    shard = shard_names(tiny_checkpoint)[0]
    key = unique_prefix + shard
    head = s3_store.client().head_object(Bucket="models", Key=key)
    data = bytearray((tiny_checkpoint / shard).read_bytes())
    data[-10:] = b"\xff" * 10  # same size, wrong bytes, the stale sha256 metadata kept
    s3_store.client().put_object(Bucket="models", Key=key, Body=bytes(data),
                                 Metadata=head["Metadata"])
    with pytest.raises(IntegrityError, match=f"{shard}: sha256 .* but the source recorded"):
        cache.fetch("tiny", s3_store, src)
    quarantined = list((Path(cache.root) / ".quarantine" / "tiny").rglob(shard))
    assert len(quarantined) == 1 and quarantined[0].read_bytes() == bytes(data)
    assert cache.verify(good.path, full=True) == []  # the earlier good entry is intact


def test_missing_shard_fails_before_any_weight_is_fetched(cache, s3_store, tiny_checkpoint,
                                                          unique_prefix):
    src = _upload(s3_store, tiny_checkpoint, unique_prefix)
    gone = shard_names(tiny_checkpoint)[1]
    s3_store.client().delete_object(Bucket="models", Key=unique_prefix + gone)
    with pytest.raises(FetchError, match=f"names 1 shard.*{gone}"):
        cache.fetch("tiny", s3_store, src)
    assert not (Path(cache.root) / "tiny").exists() or not any(
        (Path(cache.root) / "tiny").glob(".staging-*/*.safetensors*"))


def test_second_run_on_the_same_entry_is_locked_out(cache, s3_store, tiny_checkpoint,
                                                    unique_prefix):
    src = _upload(s3_store, tiny_checkpoint, unique_prefix)
    revision = s3_store.describe(src).revision
    held, release = threading.Event(), threading.Event()

    def hold():
        with cache.lock("tiny", revision):
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    try:
        with pytest.raises(FetchError, match="locked by pid"):
            cache.fetch("tiny", s3_store, src)
    finally:
        release.set()
        t.join()
    assert cache.fetch("tiny", s3_store, src).warm is False


RESUME_SCRIPT = """
import sys, time
from onboarding.fetch.catalog import parse_source
from resources.nvme_cache import NvmeCache
from resources.s3 import S3ObjectStore
endpoint, root, prefix = sys.argv[1:4]
store = S3ObjectStore(endpoint_url=endpoint, access_key_id="{ak}", secret_access_key="{sk}",
                      chunk_size_mb=1, max_concurrency=1)
orig = store._get_range
def slow(*a, **k):
    orig(*a, **k)
    time.sleep(0.3)  # slow enough for the test to kill us midway
store.__dict__["_get_range"] = slow
NvmeCache(root=root, reserve_gb=0).fetch("big", store, parse_source("s3://models/" + prefix))
"""


@pytest.mark.slow
def test_killed_fetch_resumes_and_finishes_with_the_same_checksums(
        cache, s3_store, s3_server, tmp_path, unique_prefix):
    from tests.conftest import ACCESS_KEY, SECRET_KEY

    src_dir = tmp_path / "big"
    src_dir.mkdir()
    (src_dir / "config.json").write_text("{}")
    import numpy as np
    from safetensors.numpy import save_file

    weights = np.frombuffer(os.urandom(12 << 20), dtype=np.uint8)
    save_file({"w": weights}, str(src_dir / "model.safetensors"))
    src = _upload(s3_store, src_dir, unique_prefix)
    script = RESUME_SCRIPT.replace("{ak}", ACCESS_KEY).replace("{sk}", SECRET_KEY)
    proc = subprocess.Popen([sys.executable, "-c", script, s3_server.endpoint_url, cache.root,
                             unique_prefix], cwd=PROJECT_ROOT)
    journal = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        hits = list(Path(cache.root).glob("big/.staging-*/model.safetensors.part.chunks"))
        if hits and len(hits[0].read_text().split()) >= 3:
            journal = hits[0]
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert journal is not None, "the fetch never got going"
    chunks_before = len(journal.read_text().split())
    result = cache.fetch("big", s3_store, src)
    assert result.bytes_resumed >= chunks_before << 20
    assert result.bytes_fetched == result.manifest.total_bytes - result.bytes_resumed
    assert sha256_file(result.path / "model.safetensors") == \
        sha256_file(src_dir / "model.safetensors")


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A real 8 MiB filesystem that really fills up: a tmpfs, else a loop-mounted ext4 image."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    tried = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                           check=False, capture_output=True, text=True)
    if tried.returncode != 0:
        image = tmp_path / "small-disk.img"
        with open(image, "wb") as f:
            f.truncate(8 << 20)
        for step in (["mkfs.ext4", "-q", "-m", "0", str(image)],
                     ["mount", "-o", "loop", str(image), str(mnt)]):
            done = subprocess.run(step, check=False, capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip("no small filesystem for ENOSPC here: `mount -t tmpfs` said "
                            f"{tried.stderr.strip()!r}, {step[0]} said {done.stderr.strip()!r}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_full_disk_is_a_disk_error_at_once_and_the_resume_counts_what_is_on_disk(
        small_disk, s3_store, s3_proxy, tmp_path, unique_prefix):
    """On an 8 MiB filesystem: another writer fills the disk while the fetch
    runs; ENOSPC must fail the fetch as a disk problem without retrying a single range. After
    the space is freed, the re-run must count the chunks already in the `.part` file."""
    from tests.conftest import ACCESS_KEY, SECRET_KEY
    from tests.resources.test_s3 import MIB, _safetensors, _via

    src_dir = tmp_path / "src"
    src_dir.mkdir()
    (src_dir / "config.json").write_text("{}")
    data = _safetensors(src_dir / "model.safetensors", 5 * MIB)
    n_chunks = -(-len(data) // MIB)
    src = _upload(s3_store, src_dir, unique_prefix)
    key = unique_prefix + "model.safetensors"
    cache = NvmeCache(root=str(small_disk / "cache"), reserve_gb=0)
    s3_proxy.hold(key)
    failure: list[BaseException] = []

    def first_run():
        try:
            cache.fetch("m", _via(s3_proxy), src)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)

    runner = threading.Thread(target=first_run)
    runner.start()
    deadline = time.monotonic() + 30
    while s3_proxy.count("GET", key) < n_chunks and runner.is_alive():
        assert time.monotonic() < deadline, "the fetch never asked for every range"
        time.sleep(0.02)
    filler = small_disk / "another-writer.bin"
    filler.write_bytes(b"\1" * (4 * MIB))  # the disk now has room for less than the shard
    s3_proxy.release()
    runner.join(60)
    assert len(failure) == 1 and isinstance(failure[0], FetchError), failure
    assert "disk filled up" in str(failure[0]) and "S3" not in failure[0].cause
    assert s3_proxy.count("GET", key) == n_chunks  # not one range retried

    filler.unlink()  # space freed: less than the shard, more than what is still missing
    free_bytes = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    assert free_bytes < len(data)
    direct = type(s3_store)(endpoint_url=s3_store.endpoint_url, access_key_id=ACCESS_KEY,
                            secret_access_key=SECRET_KEY, chunk_size_mb=1, max_concurrency=8)
    result = cache.fetch("m", direct, src)
    assert result.bytes_resumed > 0
    assert (result.path / "model.safetensors").read_bytes() == data


def test_bit_rot_in_a_warm_entry_is_quarantined_and_the_next_run_fetches_again(
        cache, s3_store, tiny_checkpoint, unique_prefix):
    src = _upload(s3_store, tiny_checkpoint, unique_prefix)
    first = cache.fetch("tiny", s3_store, src)
    shard = shard_names(tiny_checkpoint)[0]
    rotten = bytearray((first.path / shard).read_bytes())
    rotten[-5] ^= 0x01  # one bit flips on the NVMe; the size stays
    (first.path / shard).write_bytes(bytes(rotten))
    warm = cache.fetch("tiny", s3_store, src)
    assert warm.warm  # sizes match, so the entry is served; its integrity check re-hashes it
    problems = cache.verify(warm.path, full=True)  # what the checkpoint_integrity check runs
    assert any(f"{shard}: sha256 differs" in p for p in problems), problems
    assert any(".quarantine" in p and "next run" in p for p in problems), problems
    assert not warm.path.exists()
    assert list((Path(cache.root) / ".quarantine" / "tiny").rglob(shard))
    again = cache.fetch("tiny", s3_store, src)
    assert not again.warm
    assert sha256_file(again.path / shard) == sha256_file(tiny_checkpoint / shard)


def test_a_twin_fetches_config_and_tokenizer_and_leaves_the_weights(cache, s3_store,
                                                                    tiny_checkpoint,
                                                                    unique_prefix):
    """A bucket that holds the real weights too: the twin fetches none of them."""
    src = _upload(s3_store, tiny_checkpoint, unique_prefix)
    logged: list[str] = []
    twin = cache.fetch("twin", s3_store, src, log=logged.append, weights=False)
    files = {f.path for f in twin.manifest.files}
    assert "config.json" in files and not [f for f in files if "safetensors" in f]
    assert sorted(p.name for p in twin.path.iterdir() if p.name != MANIFEST_NAME) == \
        sorted(files)
    assert twin.bytes_fetched == twin.manifest.total_bytes < 10_000
    weights = len([p for p in tiny_checkpoint.iterdir() if "safetensors" in p.name])
    assert weights >= 2 and any(
        line.startswith("performance twin: no weights: fetching")
        and f"{weights} weight file(s) at the source left out" in line for line in logged)
    assert cache.fetch("twin", s3_store, src, weights=False).warm


def test_a_twin_whose_source_has_no_config_json_is_incomplete(cache, s3_store, tmp_path,
                                                             unique_prefix):
    from onboarding.common.errors import IncompleteCheckpointError

    only_tokenizer = tmp_path / "tok"
    only_tokenizer.mkdir()
    (only_tokenizer / "tokenizer.json").write_text("{}")
    src = _upload(s3_store, only_tokenizer, unique_prefix)
    with pytest.raises(IncompleteCheckpointError, match="performance twin: the source holds no "
                       "config.json"):
        cache.fetch("twin", s3_store, src, weights=False)
    assert not (Path(cache.root) / "twin").exists() or not list(
        (Path(cache.root) / "twin").glob("s3-*"))
