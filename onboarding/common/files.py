"""Rendered files (manifests, reports, configs) written so that a reader never sees half of one
and other users can read them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    """The process umask; Linux says it in /proc, elsewhere reading it means setting it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, text: str) -> Path:
    """Write to a temporary sibling and rename, so a reader never sees half a manifest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide it from other readers
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
