"""The `checkpoint` asset in a real Dagster instance against the real local S3 server."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from assets.checkpoint import COMPLETE, INTACT, checkpoint
from resources.huggingface import HuggingFaceStore
from resources.nvme_cache import NvmeCache
from tests.conftest import write_spec
from tests.tiny_models import shard_names


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        inst.add_dynamic_partitions("models", ["tiny", "ghost"])
        yield inst


@pytest.fixture
def resources(s3_store, tmp_path, configs):
    return {"s3": s3_store, "hf": HuggingFaceStore(), "configs": configs,
            "nvme_cache": NvmeCache(root=str(tmp_path / "nvme"), reserve_gb=0)}


def _run(instance, resources, key="tiny"):
    return dg.materialize([checkpoint], partition_key=key, instance=instance,
                          resources=resources, raise_on_error=False)


def _error(result) -> str:
    """The step's error with its causes: Dagster wraps what the asset raised."""
    err, parts = result.failure_data_for_node("checkpoint").error, []
    while err is not None:
        parts.append(err.message)
        err = err.cause
    return "\n".join(parts)


def _checks(result) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def _rot(data: bytes) -> bytes:
    """Bit rot: the last byte flipped, the size unchanged (a size check cannot see it)."""
    return data[:-1] + bytes([data[-1] ^ 0xFF])


@pytest.fixture
def rotten_shard(instance, resources, config_dir, s3_store, tiny_checkpoint, unique_prefix
                 ) -> Path:
    """A fetched, verified cache entry with one shard rotted on disk since."""
    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix)
    write_spec(config_dir, "tiny", f"s3://models/{unique_prefix}")
    ref = _run(instance, resources).output_for_node("checkpoint")
    shard = Path(ref.path) / shard_names(tiny_checkpoint)[1]
    shard.write_bytes(_rot(shard.read_bytes()))
    return shard


@pytest.mark.slow
def test_materializes_with_metadata_checks_and_content_version(
        instance, resources, config_dir, s3_store, tiny_checkpoint, unique_prefix):
    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix)
    write_spec(config_dir, "tiny", f"s3://models/{unique_prefix}")
    first = _run(instance, resources)
    assert first.success, first.all_events
    assert _checks(first) == {COMPLETE: True, INTACT: True}
    ref = first.output_for_node("checkpoint")
    mat = first.asset_materializations_for_node("checkpoint")[0]
    assert mat.tags["dagster/data_version"] == ref.content_hash
    assert mat.metadata["warm_cache"].value is False
    assert mat.metadata["files"].value == len(ref.files) >= 4
    # SeaweedFS gives every object an ETag: each file's version was pinned by it
    assert mat.metadata["version_pinned_by_etag"].value == len(ref.files)
    assert "version_pinned_by_none" not in mat.metadata
    assert Path(ref.path, "config.json").is_file()
    again = _run(instance, resources)
    warm = again.asset_materializations_for_node("checkpoint")[0]
    assert warm.metadata["warm_cache"].value is True
    assert warm.tags["dagster/data_version"] == ref.content_hash


def test_unknown_model_names_the_catalog(instance, resources, config_dir):
    result = _run(instance, resources, key="ghost")
    assert not result.success
    assert "'ghost': not in the catalog" in _error(result)


@pytest.mark.slow
def test_corrupt_object_fails_integrity_and_keeps_the_earlier_entry(
        instance, resources, config_dir, s3_store, tiny_checkpoint, unique_prefix):
    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix)
    write_spec(config_dir, "tiny", f"s3://models/{unique_prefix}")
    good = _run(instance, resources).output_for_node("checkpoint")
    shard = shard_names(tiny_checkpoint)[0]
    head = s3_store.client().head_object(Bucket="models", Key=unique_prefix + shard)
    s3_store.client().put_object(Bucket="models", Key=unique_prefix + shard,
                                 Body=_rot((tiny_checkpoint / shard).read_bytes()),
                                 Metadata=head["Metadata"])
    bad = _run(instance, resources)
    assert not bad.success
    assert _checks(bad) == {INTACT: False}
    assert "failed verification" in _error(bad)
    assert resources["nvme_cache"].verify(Path(good.path), full=True) == []
    latest = instance.get_latest_materialization_event(dg.AssetKey("checkpoint"))
    assert latest.asset_materialization.metadata["cache_path"].value == good.path


def test_missing_shard_fails_completeness(instance, resources, config_dir, s3_store,
                                          tiny_checkpoint, unique_prefix):
    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix)
    s3_store.client().delete_object(Bucket="models",
                                    Key=unique_prefix + shard_names(tiny_checkpoint)[0])
    write_spec(config_dir, "tiny", f"s3://models/{unique_prefix}")
    result = _run(instance, resources)
    assert not result.success and _checks(result) == {COMPLETE: False}


@pytest.mark.slow
def test_bytes_rotted_on_disk_fail_integrity_and_the_next_run_fetches_again(
        instance, resources, tiny_checkpoint, rotten_shard):
    rotten = _run(instance, resources)  # the warm path's size check cannot see the rot
    assert _checks(rotten) == {COMPLETE: True, INTACT: False}
    healed = _run(instance, resources)
    assert healed.success and _checks(healed) == {COMPLETE: True, INTACT: True}
    mat = healed.asset_materializations_for_node("checkpoint")[0]
    assert mat.metadata["warm_cache"].value is False
    assert rotten_shard.read_bytes() == (tiny_checkpoint / rotten_shard.name).read_bytes()


def test_the_integrity_check_says_which_evidence_verified_each_file(
        instance, resources, config_dir, s3_server, s3_store, tiny_checkpoint, unique_prefix):
    from tests.conftest import upload_like_a_tool

    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix)  # sha256 metadata on each
    plain = shard_names(tiny_checkpoint)[0]  # re-uploaded by another tool: no sha256, no CRC
    upload_like_a_tool(s3_server, tiny_checkpoint / plain, unique_prefix + plain)
    write_spec(config_dir, "tiny", f"s3://models/{unique_prefix}")
    result = _run(instance, resources)
    assert result.success
    check = next(e for e in result.get_asset_check_evaluations() if e.check_name == INTACT)
    meta = {k: v.value for k, v in check.metadata.items()}
    assert meta["files_checked_by_etag_md5"] == 1
    assert meta["files_checked_by_sha256"] == len(ref_files(result)) - 1
    assert meta["files_checked_by_size_only"] == 0
    assert f"{plain}: etag_md5" in meta["files_checked_by_per_file"]


def ref_files(result) -> tuple[str, ...]:
    return result.output_for_node("checkpoint").files


def test_a_real_model_without_weights_fails_completeness(instance, resources, config_dir,
                                                         s3_store, tiny_checkpoint, unique_prefix):
    """Only a performance twin (`weights: random`) may come without weights."""
    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix)
    for name in shard_names(tiny_checkpoint) + ["model.safetensors.index.json"]:
        s3_store.client().delete_object(Bucket="models", Key=unique_prefix + name)
    write_spec(config_dir, "tiny", f"s3://models/{unique_prefix}")
    result = _run(instance, resources)
    assert not result.success and _checks(result) == {COMPLETE: False, INTACT: True}
    check = next(e for e in result.get_asset_check_evaluations() if e.check_name == COMPLETE)
    assert "no *.safetensors weight file: nothing to serve" in check.metadata["problems"].value
