"""What a complete, intact checkpoint is: its file list, checksums, and shard index.

The manifest (`onboarding-manifest.json` in each cache entry) is the checkpoint's identity: its
hash is the asset's data version, so a new revision marks every descendant stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from onboarding.common.errors import FetchError, IntegrityError

MANIFEST_NAME = "onboarding-manifest.json"
HASH_BLOCK_BYTES = 8 << 20
# Files that make up a servable checkpoint; everything else in a prefix is ignored.
CHECKPOINT_PATTERNS = (
    "*.safetensors", "*.safetensors.index.json", "config.json", "generation_config.json",
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
    "hf_quant_config.json", "onboarding.yaml",
)


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, POSIX
    size: int
    sha256: str


@dataclass
class CheckpointManifest:
    source: str
    revision: str
    files: list[FileEntry] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def content_hash(self) -> str:
        """Hash of (path, size, sha256) only, so the same bytes from another source agree."""
        h = hashlib.sha256()
        for f in sorted(self.files, key=lambda f: f.path):
            h.update(f"{f.path}\0{f.size}\0{f.sha256}\n".encode())
        return h.hexdigest()

    def to_json(self) -> str:
        body = {"source": self.source, "revision": self.revision,
                "content_hash": self.content_hash, "files": [asdict(f) for f in self.files]}
        return json.dumps(body, indent=1, sort_keys=True)

    @classmethod
    def read(cls, path: Path) -> CheckpointManifest:
        body = json.loads(path.read_text())
        return cls(source=body["source"], revision=body["revision"],
                   files=[FileEntry(**f) for f in body["files"]])


def is_checkpoint_file(rel_path: str) -> bool:
    name = PurePosixPath(rel_path).name
    return any(PurePosixPath(name).match(p) for p in CHECKPOINT_PATTERNS)


def safe_relative_path(key: str, what: str) -> str:
    """Refuse keys that would land outside the cache entry (`..`, absolute, backslashes, NUL)."""
    bad = (
        not key or key.startswith("/") or "\\" in key or "\0" in key
        or any(part in ("..", ".", "") for part in key.split("/"))
    )
    if bad:
        raise FetchError(
            f"{what}: key {key!r}",
            "it would resolve outside the cache directory (absolute path, '..', '.', empty "
            "segment or backslash)",
            "Remove or rename that object in the source; the fetch refuses it on purpose.",
        )
    return key


def sha256_file(path: Path, block: int = HASH_BLOCK_BYTES) -> str:
    h = hashlib.sha256()
    buf = bytearray(block)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def read_safetensors_header(path: Path) -> dict:
    """Parse the JSON header and check every tensor's byte range lies inside the file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise IntegrityError(str(path), "shorter than a safetensors header", "Re-fetch it.")
        (n,) = struct.unpack("<Q", raw)
        if n > min(size - 8, 100 << 20):
            raise IntegrityError(str(path), f"header length {n} is impossible for a file of "
                                 f"{size} bytes", "The file is truncated or not safetensors; re-fetch it.")
        try:
            header = json.loads(f.read(n))
        except ValueError:
            raise IntegrityError(str(path), "safetensors header is not valid JSON",
                                 "The object is corrupted; re-upload it.") from None
    data_bytes = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if not 0 <= start <= end <= data_bytes:
            raise IntegrityError(
                str(path), f"tensor {name!r} spans bytes {start}..{end} but the data section has "
                f"{data_bytes}", "The file is truncated; re-fetch or re-upload it.")
    return header


def missing_shards(root: Path, present: set[str]) -> dict[str, list[str]]:
    """For every `*.safetensors.index.json`, the shards its weight map names that are absent."""
    out: dict[str, list[str]] = {}
    for rel in sorted(p for p in present if p.endswith(".safetensors.index.json")):
        index = json.loads((root / rel).read_text())
        base = PurePosixPath(rel).parent
        names = sorted(set(index.get("weight_map", {}).values()))
        absent = [n for n in names if str(base / n) not in present]
        if absent:
            out[rel] = absent
    return out


def index_shards(index_bytes: bytes) -> set[str]:
    return set(json.loads(index_bytes).get("weight_map", {}).values())


def verify_entry(root: Path, manifest: CheckpointManifest, full: bool,
                 workers: int = 2) -> list[str]:
    """Problems found in a cache entry against its manifest: sizes always, sha256 when `full`
    (files hashed in parallel: hashlib releases the GIL)."""
    problems, to_hash = [], []
    for f in manifest.files:
        p = root / f.path
        if p.is_symlink() or not p.is_file():
            problems.append(f"{f.path}: missing")
            continue
        if (size := p.stat().st_size) != f.size:
            problems.append(f"{f.path}: {size} bytes on disk, {f.size} in the manifest")
        elif full:
            to_hash.append(f)
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for f, digest in zip(to_hash, pool.map(lambda f: sha256_file(root / f.path), to_hash)):
            if digest != f.sha256:
                problems.append(f"{f.path}: sha256 differs from the manifest")
    present = {f.path for f in manifest.files}
    for index, absent in missing_shards(root, present).items():
        problems.append(f"{index}: names shards that are absent: {', '.join(absent)}")
    return problems


def dir_fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
