"""Page-cache control for load timing: evict files, measure residency, time a raw read.

A "cold start" is only cold if the weights are not in the page cache; after one start they are,
so every cold repeat evicts first and proves it with `mincore` residency. The raw sequential
read of the same files is the physical reference an engine's weight-load GB/s is compared with.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from onboarding.common.errors import OnboardingError

READ_BLOCK_BYTES = 16 << 20
_PAGE_BYTES = mmap.PAGESIZE
_PROT_READ = 0x1
_MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]


class PageCacheError(OnboardingError):
    """A page-cache operation failed, so a cold/warm measurement would be meaningless."""


@dataclass(frozen=True)
class Residency:
    resident_bytes: int
    total_bytes: int

    @property
    def fraction(self) -> float:
        return self.resident_bytes / self.total_bytes if self.total_bytes else 1.0


@dataclass(frozen=True)
class RawRead:
    total_bytes: int
    seconds: float

    @property
    def gbps(self) -> float:
        return self.total_bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


def evict(paths: Iterable[Path]) -> None:
    """Write back, then drop the files' pages from the page cache (`POSIX_FADV_DONTNEED`).

    DONTNEED skips dirty pages, and a checkpoint fetched a moment ago is dirty: fsync first.
    """
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def file_residency(path: Path) -> Residency:
    """Bytes of `path` resident in the page cache, by `mincore` over a read-only mapping.

    Mapping does not fault pages in, so asking does not change the answer.
    """
    size = os.stat(path).st_size
    if size == 0:
        return Residency(0, 0)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise PageCacheError(str(path), f"mmap failed ({os.strerror(err)})",
                                 "Check that the file is a regular, readable file.")
        try:
            pages = (size + _PAGE_BYTES - 1) // _PAGE_BYTES
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                err = ctypes.get_errno()
                raise PageCacheError(str(path), f"mincore failed ({os.strerror(err)})",
                                     "Run on Linux with a filesystem that supports mmap.")
            resident = sum(b & 1 for b in bytes(vec))
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return Residency(min(resident * _PAGE_BYTES, size), size)


def residency(paths: Iterable[Path]) -> Residency:
    resident = total = 0
    for p in paths:
        r = file_residency(p)
        resident += r.resident_bytes
        total += r.total_bytes
    return Residency(resident, total)


def sequential_read(paths: Iterable[Path], block: int = READ_BLOCK_BYTES) -> RawRead:
    """Read every byte once, sequentially, with large unbuffered reads; the time it took."""
    buf = bytearray(block)
    total = 0
    start = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return RawRead(total, time.perf_counter() - start)


def make_cold(paths: list[Path], max_resident_fraction: float = 0.05) -> Residency:
    """Evict and verify; raises when the kernel kept the pages (e.g. a tmpfs or locked memory)."""
    evict(paths)
    r = residency(paths)
    if r.fraction > max_resident_fraction:
        holders = mapped_by(paths)
        who = f"; mapped by {', '.join(holders)}" if holders else ""
        raise PageCacheError(
            f"{len(paths)} weight files",
            f"{r.fraction:.0%} still resident in the page cache after POSIX_FADV_DONTNEED "
            f"(tmpfs, or a process that maps or locks them, keeps them){who}",
            "Put the model cache on a block-device filesystem (the node's NVMe), or stop the "
            "process that maps the files; a cold start cannot be measured otherwise.",
        )
    return r


def mapped_by(paths: Iterable[Path], limit: int = 5) -> list[str]:
    """'pid (command)' of processes that map any of the files: mapped pages cannot be evicted."""
    wanted = {str(Path(p).resolve()) for p in paths}
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            maps = (d / "maps").read_text()
            if any(w in maps for w in wanted):
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                me = " = this process" if int(d.name) == os.getpid() else ""
                out.append(f"pid {d.name}{me} ({cmd.strip()[:80]})")
        except OSError:
            continue
        if len(out) >= limit:
            break
    return out


def make_warm(paths: list[Path]) -> Residency:
    """Read the files so they are in the page cache, as after a previous start."""
    sequential_read(paths)
    return residency(paths)
