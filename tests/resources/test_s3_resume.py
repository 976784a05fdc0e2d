"""Resuming a fetch that was killed: whatever a run left in staging, the next run ends with the
source's bytes, and a failed verification never repeats itself on the next run (issue 30)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from onboarding.catalog import parse_source
from onboarding.checkpoint_manifest import MANIFEST_NAME
from onboarding.errors import IntegrityError
from resources.nvme_cache import NvmeCache
from resources.s3 import S3ObjectStore

MIB = 1 << 20


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_byte_exact(result, source_dir: Path) -> None:
    """The entry holds exactly the source's files, each with the source's bytes, and nothing
    else: no journal, no part, no staging or quarantine left behind."""
    expected = {p.name: _sha(p) for p in source_dir.iterdir() if p.is_file()}
    held = {p.name: _sha(p) for p in result.path.iterdir() if p.name != MANIFEST_NAME}
    assert held == expected
    assert not list(result.path.parent.glob(".staging-*"))


def lay_killed_staging(cache: NvmeCache, model: str, revision: str, source_dir: Path,
                       killed: str, data: bytes | None = None) -> Path:
    """What a run killed after `killed`'s last chunk was journaled, before its rename, leaves:
    the other files finished, `killed` as `.part` with every chunk in its journal."""
    staging = Path(cache.root) / model / f".staging-{revision}"
    staging.mkdir(parents=True)
    for path in source_dir.iterdir():
        if path.name != killed:
            shutil.copyfile(path, staging / path.name)
    body = (source_dir / killed).read_bytes() if data is None else data
    (staging / f"{killed}.part").write_bytes(body)
    n_chunks = -(-len(body) // MIB)
    (staging / f"{killed}.part.chunks").write_text("".join(f"{i}\n" for i in range(n_chunks)))
    return staging


@pytest.fixture
def uploaded(s3_store, tiny_checkpoint, unique_prefix):
    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix)
    source = parse_source(f"s3://models/{unique_prefix}")
    return source, s3_store.describe(source).revision


@pytest.mark.parametrize("killed", ["config.json", "model.safetensors.index.json"])
def test_a_part_whose_journal_is_complete_is_verified_and_finished(
        killed, s3_store, tiny_checkpoint, uploaded, tmp_path):
    source, revision = uploaded
    cache = NvmeCache(root=str(tmp_path / "cache"), reserve_gb=0)
    lay_killed_staging(cache, "tiny", revision, tiny_checkpoint, killed)
    result = cache.fetch("tiny", s3_store, source)
    assert_byte_exact(result, tiny_checkpoint)
    assert result.bytes_resumed == result.manifest.total_bytes  # nothing fetched again
    assert not (Path(cache.root) / ".quarantine").exists()


def test_a_complete_part_with_wrong_bytes_is_quarantined_and_the_next_run_refetches_it(
        s3_store, tiny_checkpoint, uploaded, tmp_path):
    source, revision = uploaded
    cache = NvmeCache(root=str(tmp_path / "cache"), reserve_gb=0)
    good = (tiny_checkpoint / "config.json").read_bytes()
    bad = good[:-2] + bytes([good[-2] ^ 0x01]) + good[-1:]  # one bit, same size
    lay_killed_staging(cache, "tiny", revision, tiny_checkpoint, "config.json", bad)
    with pytest.raises(IntegrityError, match=r"config.json: sha256 .* but the source recorded"
                       ) as info:
        cache.fetch("tiny", s3_store, source)
    moved = list((Path(cache.root) / ".quarantine" / "tiny").rglob("config.json"))
    assert len(moved) == 1 and moved[0].read_bytes() == bad  # really moved where it says
    assert str(moved[0].parent) in info.value.fix
    again = cache.fetch("tiny", s3_store, source)
    assert_byte_exact(again, tiny_checkpoint)
    assert again.bytes_fetched == len(good)  # only the quarantined file was fetched again


class _LosesOneFile(S3ObjectStore):
    """The real store, except that the cache never hears that `lost` completed: what a store
    with a bug in its bookkeeping would do. The only way left to reach "never completed"."""

    lost: str = ""

    def fetch(self, remote, source, staging, on_progress, on_file_done, log=print):
        def told(obj, path, sha256):
            if obj.path != self.lost:
                on_file_done(obj, path, sha256)
        return super().fetch(remote, source, staging, on_progress, told, log)


def test_never_completed_says_what_happened_and_the_next_run_does_not_repeat_it(
        s3_server, s3_store, tiny_checkpoint, uploaded, tmp_path):
    from tests.conftest import ACCESS_KEY, SECRET_KEY

    source, _ = uploaded
    cache = NvmeCache(root=str(tmp_path / "cache"), reserve_gb=0)
    buggy = _LosesOneFile(endpoint_url=s3_server.endpoint_url, access_key_id=ACCESS_KEY,
                          secret_access_key=SECRET_KEY, chunk_size_mb=1,
                          lost="model.safetensors.index.json")
    with pytest.raises(IntegrityError, match="model.safetensors.index.json: never completed"
                       ) as info:
        cache.fetch("tiny", buggy, source)
    message = str(info.value)
    assert "Re-upload" not in message  # the source is fine
    quarantine = Path(cache.root) / ".quarantine"
    moved = list(quarantine.rglob("model.safetensors.index.json*"))
    if moved:  # whatever it says was moved is there
        assert all(str(p.parent) in message for p in moved)
    else:
        assert ".quarantine" not in message
    staging = next((Path(cache.root) / "tiny").glob(".staging-*"))
    assert not list(staging.glob("model.safetensors.index.json*"))  # nothing left to repeat
    assert "next run fetches" in message
    assert_byte_exact(cache.fetch("tiny", s3_store, source), tiny_checkpoint)
