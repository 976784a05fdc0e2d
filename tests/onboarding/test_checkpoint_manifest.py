"""Pure checks on checkpoint files: traversal keys, safetensors headers, shard index."""

from __future__ import annotations

import json
import struct

import pytest

from onboarding.common.errors import FetchError, IntegrityError
from onboarding.fetch.checkpoint_manifest import (
    CheckpointManifest,
    FileEntry,
    is_checkpoint_file,
    missing_shards,
    read_safetensors_header,
    safe_relative_path,
    verify_entry,
)


@pytest.mark.parametrize("key", ["../config.json", "a/../../b", "/etc/passwd", "a//b", "a/./b",
                                 "a\\..\\b", "", "x\0y"])
def test_escaping_keys_are_refused(key):
    with pytest.raises(FetchError, match="outside the cache directory"):
        safe_relative_path(key, "s3://b/p/")


@pytest.mark.parametrize("key", ["config.json", "sub/model-00001-of-00002.safetensors", "a..b"])
def test_ordinary_keys_pass(key):
    assert safe_relative_path(key, "s3://b/p/") == key


def test_checkpoint_file_filter():
    assert is_checkpoint_file("model-00001-of-00003.safetensors")
    assert is_checkpoint_file("sub/tokenizer.json")
    assert not is_checkpoint_file("README.md") and not is_checkpoint_file("pytorch_model.bin")


def _safetensors(path, header: dict, data: bytes):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_truncated_safetensors_is_detected(tmp_path):
    p = tmp_path / "m.safetensors"
    _safetensors(p, {"w": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}}, b"x" * 8)
    with pytest.raises(IntegrityError, match="spans bytes 0..16 but the data section has 8"):
        read_safetensors_header(p)
    _safetensors(p, {"w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}, b"x" * 8)
    assert "w" in read_safetensors_header(p)


def test_missing_shards_and_verify_entry(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}))
    (tmp_path / "model-1.safetensors").write_bytes(b"12345")
    present = {"model.safetensors.index.json", "model-1.safetensors"}
    assert missing_shards(tmp_path, present) == {
        "model.safetensors.index.json": ["model-2.safetensors"]}
    m = CheckpointManifest("s3://b/p/", "r", [FileEntry("model-1.safetensors", 5, "0" * 64),
                                             FileEntry("model.safetensors.index.json", 1, "")])
    problems = verify_entry(tmp_path, m, full=True)
    assert any("sha256 differs" in p for p in problems)
    assert any("model-2.safetensors" in p for p in problems)


def test_content_hash_ignores_order_and_source():
    a = CheckpointManifest("s3://x/", "r1", [FileEntry("a", 1, "aa"), FileEntry("b", 2, "bb")])
    b = CheckpointManifest("hf://o/n", "r2", [FileEntry("b", 2, "bb"), FileEntry("a", 1, "aa")])
    c = CheckpointManifest("hf://o/n", "r2", [FileEntry("b", 2, "bc"), FileEntry("a", 1, "aa")])
    assert a.content_hash == b.content_hash != c.content_hash
