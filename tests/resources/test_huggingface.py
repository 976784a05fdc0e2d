"""The Hugging Face store through huggingface_hub itself, offline, against a seeded hub cache.

What this does not cover: the online path (`model_info` + downloads from the Hub), since this
machine cannot reach the Hub; it runs the same snapshot_download call with the network allowed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.hub_cache import seed_hub_cache
from onboarding.common.errors import FetchError
from onboarding.fetch.catalog import SourceRef, parse_source
from onboarding.fetch.checkpoint_manifest import sha256_file
from resources.huggingface import HuggingFaceStore
from resources.nvme_cache import NvmeCache


@pytest.fixture
def hub(tmp_path, tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cache_dir = tmp_path / "hub"
    commit = seed_hub_cache(cache_dir, "acme/tiny-llama", tiny_checkpoint)
    return HuggingFaceStore(cache_dir=str(cache_dir)), commit


def test_fetch_from_offline_hub_cache_verifies_lfs_sha256(hub, tmp_path, tiny_checkpoint):
    store, commit = hub
    cache = NvmeCache(root=str(tmp_path / "nvme"), reserve_gb=0)
    result = cache.fetch("tiny", store, parse_source("hf://acme/tiny-llama@main"))
    assert result.manifest.revision == commit
    weights = [f for f in result.manifest.files if f.path.endswith(".safetensors")]
    assert weights and all(f.sha256 == sha256_file(tiny_checkpoint / f.path) for f in weights)
    assert not any(p.is_symlink() for p in result.path.rglob("*"))
    assert cache.fetch("tiny", store, parse_source(f"hf://acme/tiny-llama@{commit}")).warm


def test_tampered_hub_blob_is_caught(hub, tmp_path, tiny_checkpoint):
    store, _ = hub
    snap = next((tmp_path / "hub").glob("models--acme--tiny-llama/snapshots/*"))
    shard = next(snap.glob("*.safetensors"))
    blob = Path(os.path.realpath(shard))
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    cache = NvmeCache(root=str(tmp_path / "nvme"), reserve_gb=0)
    with pytest.raises(FetchError, match="sha256 .* but the source recorded"):
        cache.fetch("tiny", store, parse_source("hf://acme/tiny-llama@main"))


def test_link_out_of_the_hub_cache_is_refused(hub, tmp_path):
    store, _ = hub
    snap = next((tmp_path / "hub").glob("models--acme--tiny-llama/snapshots/*"))
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    (snap / "config.json").unlink()
    (snap / "config.json").symlink_to(outside)
    cache = NvmeCache(root=str(tmp_path / "nvme"), reserve_gb=0)
    with pytest.raises(FetchError, match="outside"):
        cache.fetch("tiny", store, parse_source("hf://acme/tiny-llama@main"))


def test_repo_absent_from_offline_cache_says_how_to_seed_it(hub, tmp_path):
    store, _ = hub
    with pytest.raises(FetchError, match="not in the local Hugging Face cache"):
        store.describe(parse_source("hf://acme/other@main"))


@pytest.mark.parametrize("revision", ["../snapshots", "../../..", "main/../../x"])
def test_a_revision_that_would_leave_the_hub_cache_is_refused(hub, revision):
    store, _ = hub
    source = SourceRef(kind="hf", location="acme/tiny-llama", path="", revision=revision)
    with pytest.raises(FetchError, match="not a branch, tag or commit"):
        store.describe(source)
