"""Recomputing what a source recorded about an object, so a fetched file can be compared with it.

Beyond a recorded sha256, S3 gives two kinds of evidence. Its additional checksums (CRC32,
CRC32C, CRC64NVME, SHA1, SHA256; `x-amz-checksum-*` with `ChecksumMode=ENABLED`) are either of
the whole object or, for a multipart upload, COMPOSITE: the checksum of the concatenated part
checksums, written `<base64>-<parts>`. The ETag is the MD5 of the bytes for a single-part upload
and, for a multipart one, the MD5 of the concatenated part MD5s, `<hex>-<parts>`. Both composite
forms are recomputed from the file once the part size is known. A Hugging Face file stored in
git (not LFS) is named by its git blob sha1.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from onboarding.fetch.checkpoint_manifest import HASH_BLOCK_BYTES

# Strongest first: a file is verified by the first of these its source offers.
EVIDENCE_ORDER = ("sha256", "crc64nvme", "crc32c", "crc32", "sha1", "etag_md5", "etag_multipart",
                  "git_sha1", "size_only")
S3_CHECKSUMS = ("sha256", "crc64nvme", "crc32c", "crc32", "sha1")


class _Digest(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...
    def digest(self) -> bytes: ...


class _Crc32:
    def __init__(self) -> None:
        self.value = 0

    def update(self, data: bytes | memoryview) -> None:
        self.value = zlib.crc32(data, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(4, "big")


class _CrtCrc:
    """CRC32C / CRC64NVME from awscrt (botocore[crt]); Python has no fast implementation."""

    def __init__(self, name: str, width_bytes: int) -> None:
        from awscrt import checksums

        self.fn, self.width_bytes, self.value = getattr(checksums, name), width_bytes, 0

    def update(self, data: bytes | memoryview) -> None:
        self.value = self.fn(bytes(data), self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(self.width_bytes, "big")


def _has_awscrt() -> bool:
    try:
        import awscrt.checksums  # noqa: F401
    except ImportError:
        return False
    return True


_FACTORIES: dict[str, Callable[[], _Digest]] = {
    "sha256": hashlib.sha256, "sha1": hashlib.sha1, "crc32": _Crc32,
    "md5": lambda: hashlib.md5(usedforsecurity=False),
}
if _has_awscrt():
    _FACTORIES["crc32c"] = lambda: _CrtCrc("crc32c", 4)
    _FACTORIES["crc64nvme"] = lambda: _CrtCrc("crc64nvme", 8)


def can_compute(algorithm: str) -> bool:
    return algorithm in _FACTORIES


def parts_of(value: str | None) -> int | None:
    """The part count of a composite checksum or multipart ETag (`…-<parts>`), else None."""
    if value and "-" in value and value.rsplit("-", 1)[1].isdigit():
        return int(value.rsplit("-", 1)[1])
    return None


def _part_digests(path: Path, algorithm: str, part_bytes: int | None) -> list[bytes]:
    """One digest per part (`part_bytes` each, the last shorter), or one for the whole file."""
    size = path.stat().st_size
    step = part_bytes or max(size, 1)
    digests, view = [], memoryview(bytearray(HASH_BLOCK_BYTES))
    with open(path, "rb", buffering=0) as f:
        for start in range(0, max(size, 1), step):  # an empty file is one empty part
            h, left = _FACTORIES[algorithm](), min(step, size - start)
            while left > 0 and (n := f.readinto(view[: min(len(view), left)])):
                h.update(view[:n])
                left -= n
            digests.append(h.digest())
    return digests


def s3_checksum(path: Path, algorithm: str, part_bytes: int | None = None) -> str:
    """`x-amz-checksum-<algorithm>` of a file: base64 of the whole, or COMPOSITE with parts."""
    if part_bytes is None:
        return base64.b64encode(_part_digests(path, algorithm, None)[0]).decode()
    parts = _part_digests(path, algorithm, part_bytes)
    h = _FACTORIES[algorithm]()
    h.update(b"".join(parts))
    return f"{base64.b64encode(h.digest()).decode()}-{len(parts)}"


def s3_etag(path: Path, part_bytes: int | None = None) -> str:
    """The ETag S3 gives an upload of this file: plain MD5, or multipart with `part_bytes`."""
    parts = _part_digests(path, "md5", part_bytes)
    if part_bytes is None:
        return parts[0].hex()
    return f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"


def git_blob_sha1(path: Path) -> str:
    """The id git (and so the Hugging Face Hub) gives a non-LFS file."""
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size, usedforsecurity=False)
    with open(path, "rb", buffering=0) as f:
        while block := f.read(HASH_BLOCK_BYTES):
            h.update(block)
    return h.hexdigest()
