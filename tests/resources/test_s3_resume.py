"""Resuming a fetch that was killed: whatever a run left in staging, the next run ends with the
source's bytes, and a failed verification never repeats itself on the next run."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from onboarding.common.errors import IntegrityError
from onboarding.fetch.catalog import parse_source
from onboarding.fetch.checkpoint_manifest import MANIFEST_NAME
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


# -- a fetch killed at chosen points, then run again ------------------------------------------

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
BIG = SHARDS[0]  # three chunks of 1 MiB: it can be killed between chunks


@pytest.fixture(scope="module")
def five_files(tmp_path_factory) -> Path:
    """config.json, generation_config.json, a shard index and two shards, one of them three
    chunks long: a five-file fetch like the issue's."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    src = tmp_path_factory.mktemp("five-files")
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (src / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    rng = np.random.default_rng(30)
    save_file({"a": rng.integers(0, 255, (5 * MIB) // 2, dtype=np.uint8)}, str(src / SHARDS[0]))
    save_file({"b": rng.integers(0, 255, 4096, dtype=np.uint8)}, str(src / SHARDS[1]))
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": SHARDS[0], "b": SHARDS[1]}}))
    return src


def _die() -> None:
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)  # what an operator's `kill -9` does: nothing runs after


def _install_kill_point(point: str, name: str | None) -> None:
    """In the forked child only: SIGKILL the fetch at `point` of file `name`.

    mid: after the first of several chunks is journaled; before_last_journal: every byte
    written, the last chunk not yet journaled; before_rename: the journal complete, the part
    not yet renamed; after_rename: renamed, the journal not yet unlinked; after_finish: the
    file finished, the cache not yet told; manifest_written: every file verified and the
    manifest written, staging not yet renamed; entry_renamed: the entry in place, the old
    stagings not yet dropped."""
    import os

    from resources import nvme_cache
    from resources.s3 import _PartFile

    commit, finish, replace, dir_fsync = (_PartFile.commit, _PartFile.finish, os.replace,
                                          nvme_cache.dir_fsync)

    def killing_commit(self, i):
        if point == "before_last_journal" and self.obj.path == name and \
                len(self._written | {i}) == self.n_chunks:
            _die()
        last = commit(self, i)
        if point == "mid" and self.obj.path == name and 0 < len(self._done) < self.n_chunks:
            _die()
        return last

    def killing_finish(self):
        if point == "before_rename" and self.obj.path == name:
            _die()
        sha = finish(self)
        if point == "after_finish" and self.obj.path == name:
            _die()
        return sha

    def killing_replace(src, dst, **kw):
        replace(src, dst, **kw)
        if point == "after_rename" and name and str(dst).endswith("/" + name):
            _die()
        if point == "entry_renamed" and Path(src).name.startswith(".staging-"):
            _die()

    def killing_dir_fsync(path):
        dir_fsync(path)
        if point == "manifest_written" and path.name.startswith(".staging-"):
            _die()

    _PartFile.commit, _PartFile.finish, os.replace = killing_commit, killing_finish, \
        killing_replace
    nvme_cache.dir_fsync = killing_dir_fsync


def _fetch_killed_at(point: str, name: str | None, root: Path, endpoint: str, source) -> None:
    """Fork, fetch in the child with a kill point installed, and insist that it was killed
    there (not finished, not failed)."""
    import os
    import signal
    import time

    from tests.conftest import ACCESS_KEY, SECRET_KEY

    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            _install_kill_point(point, name)
            store = S3ObjectStore(endpoint_url=endpoint, access_key_id=ACCESS_KEY,
                                  secret_access_key=SECRET_KEY, chunk_size_mb=1,
                                  # one worker journals one chunk at a time: "mid" is then
                                  # reached every time (four may journal all three together)
                                  max_concurrency=1 if point == "mid" else 4, max_attempts=2)
            NvmeCache(root=str(root), reserve_gb=0).fetch("m", store, source)
        except BaseException:  # noqa: BLE001 - said on stderr, then the exit status tells
            import traceback

            traceback.print_exc()
        finally:
            os._exit(3)  # the kill point was never reached
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the fetch killed at {point} of {name} hung")
        time.sleep(0.01)
    status = done[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
        f"{point} of {name} was never reached (exit status {status})"


FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", *SHARDS)
KILL_POINTS = [("mid", BIG)] + [
    (point, name) for name in FILES
    for point in ("before_last_journal", "before_rename", "after_rename", "after_finish")
] + [("manifest_written", None), ("entry_renamed", None)]


@pytest.mark.slow
def test_a_fetch_killed_at_any_point_ends_byte_exact_on_the_next_run(
        s3_server, s3_store, five_files, unique_prefix, tmp_path):
    """The fetch is SIGKILLed before, during and after each file's last journal
    write and rename, and after the manifest and the entry's rename; every re-run must end
    with the source's bytes, with nothing quarantined and nothing left in staging."""
    s3_store.upload_dir(five_files, "models", unique_prefix)
    source = parse_source(f"s3://models/{unique_prefix}")
    wrong = []
    for n, (point, name) in enumerate(KILL_POINTS):
        root = tmp_path / f"cache-{n}"
        _fetch_killed_at(point, name, root, s3_server.endpoint_url, source)
        try:
            result = NvmeCache(root=str(root), reserve_gb=0).fetch("m", s3_store, source)
            assert_byte_exact(result, five_files)
            assert not (root / ".quarantine").exists(), "something was quarantined"
        except (IntegrityError, AssertionError) as exc:
            wrong.append(f"killed at {point} of {name}: {type(exc).__name__}: {exc}")
    assert not wrong, "\n".join(wrong)


# -- a new version of an object between or during runs ----------------------------------------

def _new_version_of_big(five_files: Path, tmp_path: Path) -> Path:
    """The five files with BIG rewritten: the same size and header, other bytes (what a
    re-upload of a retrained shard looks like to a server that records only sizes)."""
    import numpy as np
    from safetensors.numpy import save_file

    new = tmp_path / "v2"
    shutil.copytree(five_files, new)
    rng = np.random.default_rng(31)
    save_file({"a": rng.integers(0, 255, (5 * MIB) // 2, dtype=np.uint8)}, str(new / BIG))
    assert (new / BIG).stat().st_size == (five_files / BIG).stat().st_size
    assert (new / BIG).read_bytes() != (five_files / BIG).read_bytes()
    return new


def _via(proxy) -> S3ObjectStore:
    """A store reaching SeaweedFS through the proxy. The proxy serves from threads of this test
    process, so on a loaded machine a HEAD through it can take longer than the default 10 s
    read timeout; these tests are about what is fetched, not about timeouts (tests/resources/
    test_s3.py holds those), so silence is allowed a minute."""
    from tests.conftest import ACCESS_KEY, SECRET_KEY

    return S3ObjectStore(endpoint_url=proxy.endpoint_url, access_key_id=ACCESS_KEY,
                         secret_access_key=SECRET_KEY, chunk_size_mb=1, max_concurrency=4,
                         max_attempts=2, list_read_timeout_s=60, list_deadline_s=180,
                         range_read_timeout_s=60)


@pytest.mark.slow
@pytest.mark.parametrize("hidden", ["etag", "etag and last-modified"])
def test_a_resume_never_joins_two_versions_of_one_file(
        hidden, s3_store, s3_proxy, five_files, unique_prefix, tmp_path):
    """A server with no ETag and no checksum: the fetch is killed with BIG partly received, BIG
    is re-uploaded with other bytes of the same size, and the next run must end with the new
    version whole, never the old chunks joined to the new ones."""
    import time

    s3_store.upload_dir(five_files, "models", unique_prefix)
    s3_proxy.hide_identity(last_modified=hidden == "etag and last-modified")
    source = parse_source(f"s3://models/{unique_prefix}")
    root = tmp_path / "cache"
    _fetch_killed_at("mid", BIG, root, s3_proxy.endpoint_url, source)
    time.sleep(1.1)  # Last-Modified has a one-second resolution
    new = _new_version_of_big(five_files, tmp_path)
    s3_store.client().put_object(Bucket="models", Key=unique_prefix + BIG,
                                 Body=(new / BIG).read_bytes())
    logged: list[str] = []
    result = NvmeCache(root=str(root), reserve_gb=0).fetch("m", _via(s3_proxy), source,
                                                          log=logged.append)
    assert_byte_exact(result, new)
    pin = "none" if hidden == "etag and last-modified" else "last-modified"
    assert result.pinned_by == {pin: sorted(FILES)}
    assert ("unpinned_files" in result.version_pins) is (pin == "none")
    if hidden == "etag and last-modified":
        assert any(f"{BIG}: the source gives no ETag, Last-Modified or checksum" in line
                   for line in logged)


@pytest.mark.slow
@pytest.mark.parametrize("hidden", ["nothing", "etag"])
def test_an_object_replaced_during_the_fetch_fails_it_and_the_next_run_gets_the_new_one(
        hidden, s3_store, s3_proxy, five_files, unique_prefix, tmp_path):
    """BIG's range requests are held while BIG is re-uploaded, then let through: the server
    now has only the new version. No byte of it may join the old one's."""
    import threading
    import time

    from onboarding.common.errors import FetchError

    s3_store.upload_dir(five_files, "models", unique_prefix)
    if hidden == "etag":
        s3_proxy.hide_identity()
    source = parse_source(f"s3://models/{unique_prefix}")
    cache = NvmeCache(root=str(tmp_path / "cache"), reserve_gb=0)
    s3_proxy.hold(unique_prefix + BIG)
    outcome: list[BaseException | None] = []

    def fetch() -> None:
        try:
            cache.fetch("m", _via(s3_proxy), source)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    worker = threading.Thread(target=fetch)
    worker.start()
    deadline = time.monotonic() + 30
    while s3_proxy.count("GET", unique_prefix + BIG) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.1)  # Last-Modified has a one-second resolution
    new = _new_version_of_big(five_files, tmp_path)
    s3_store.client().put_object(Bucket="models", Key=unique_prefix + BIG,
                                 Body=(new / BIG).read_bytes())
    s3_proxy.release()
    worker.join(60)
    assert outcome and isinstance(outcome[0], FetchError), outcome
    assert "replaced at the source while it was being fetched" in str(outcome[0])
    assert_byte_exact(cache.fetch("m", _via(s3_proxy), source), new)


# -- a file broken at the source --------------------------------------------------------------

def _broken_copy(tiny_checkpoint: Path, tmp_path: Path, name: str) -> tuple[Path, str]:
    """The tiny checkpoint with `name` broken as it could be uploaded: config.json cut short
    (not JSON), or a shard's data section truncated. Uploaded by our uploader, its recorded
    sha256 is that of the broken bytes: the transfer is faithful, the file is not."""
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    data = (broken / name).read_bytes()
    (broken / name).write_bytes(data[: len(data) // 2])
    return broken, name


@pytest.mark.slow
@pytest.mark.parametrize("what", ["config.json", "shard"])
def test_a_file_broken_at_the_source_is_named_and_not_downloaded_again(
        what, s3_store, s3_proxy, tiny_checkpoint, unique_prefix, tmp_path):
    from tests.tiny_models import shard_names

    name = "config.json" if what == "config.json" else shard_names(tiny_checkpoint)[0]
    broken, name = _broken_copy(tiny_checkpoint, tmp_path, name)
    s3_store.upload_dir(broken, "models", unique_prefix)
    source = parse_source(f"s3://models/{unique_prefix}")
    cache = NvmeCache(root=str(tmp_path / "cache"), reserve_gb=0)
    cause = "not valid JSON" if what == "config.json" else "data section"
    with pytest.raises(IntegrityError, match=cause) as first:
        cache.fetch("tiny", _via(s3_proxy), source)
    message = str(first.value)
    assert f"Broken at the source, re-upload: {name}" in message
    assert "match what the source recorded (sha256)" in message
    assert "differ from what the source recorded" not in message  # the checksum matched
    assert not list((Path(cache.root) / "tiny").glob("s3-*"))  # nothing committed

    gets = s3_proxy.count("GET", unique_prefix + name)
    with pytest.raises(IntegrityError, match="broken at the source, as an earlier run found") \
            as second:
        cache.fetch("tiny", _via(s3_proxy), source)
    assert f"Re-upload {name} at the source; nothing was downloaded again" in str(second.value)
    assert s3_proxy.count("GET", unique_prefix + name) == gets  # not fetched again
    assert len(list((Path(cache.root) / ".quarantine").rglob(name))) == 1  # one copy kept

    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix)  # the fix: a new version
    assert_byte_exact(cache.fetch("tiny", _via(s3_proxy), source), tiny_checkpoint)


def test_a_size_only_file_that_fails_twice_on_the_same_bytes_is_taken_as_broken_at_the_source(
        s3_store, s3_proxy, tiny_checkpoint, unique_prefix, tmp_path):
    """No checksum at the source: one failure may be a transfer error, so the next run fetches
    the file once more; the same bytes failing the same way again settle it."""
    broken, name = _broken_copy(tiny_checkpoint, tmp_path, "config.json")
    s3_store.upload_dir(broken, "models", unique_prefix)
    s3_proxy.hide_identity()  # no ETag, no checksum: Last-Modified and the size only
    source = parse_source(f"s3://models/{unique_prefix}")
    cache = NvmeCache(root=str(tmp_path / "cache"), reserve_gb=0)
    with pytest.raises(IntegrityError, match="a transfer error cannot be ruled out"):
        cache.fetch("tiny", _via(s3_proxy), source)
    with pytest.raises(IntegrityError, match="the same bytes failed the same way on two"):
        cache.fetch("tiny", _via(s3_proxy), source)
    gets = s3_proxy.count("GET", unique_prefix + name)
    with pytest.raises(IntegrityError, match="broken at the source, as an earlier run found"):
        cache.fetch("tiny", _via(s3_proxy), source)
    assert s3_proxy.count("GET", unique_prefix + name) == gets
