"""Seed a Hugging Face hub cache in huggingface_hub's own on-disk layout, offline.

This is how a node that cannot reach the Hub gets checkpoints (`hf download` elsewhere, then
copy the cache); the HF store's tests run huggingface_hub itself against such a cache.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def seed_hub_cache(cache_dir: Path, repo_id: str, files_dir: Path, ref: str = "main") -> str:
    repo = cache_dir / ("models--" + repo_id.replace("/", "--"))
    blobs = repo / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    commit = hashlib.sha1(repo_id.encode() + str(sorted(os.listdir(files_dir))).encode()).hexdigest()
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(p for p in files_dir.rglob("*") if p.is_file()):
        data = f.read_bytes()
        # LFS files (weights) are named by sha256; small git files by their git blob sha1.
        if f.suffix == ".safetensors":
            name = hashlib.sha256(data).hexdigest()
        else:
            name = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (blobs / name).write_bytes(data)
        link = snap / f.relative_to(files_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(blobs / name, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return commit
