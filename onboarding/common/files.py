"""Rendered files (manifests, reports, configs) written so that a reader never sees half of one
and other users can read them."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from onboarding.common.errors import OutputError


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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide it from other readers
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _unwritable(path, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _unwritable(path: Path, exc: OSError) -> OutputError:
    """A full disk, a quota, a read-only volume: named with the file and what to do."""
    fix = (f"Free space on the volume holding {path.parent} (df -h {path.parent}) and re-run"
           if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else
           f"Check that {path.parent} is writable by this process and re-run")
    return OutputError(str(path), f"cannot be written ({exc.strerror or exc})",
                       fix + f"; the previous {path.name}, if any, is unchanged.")
