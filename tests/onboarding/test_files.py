"""Rendered files: a full disk names the file and keeps the previous one whole."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from onboarding.common.paths import PROJECT_ROOT


def test_a_file_the_disk_cannot_hold_names_its_path_and_keeps_the_old_one(tmp_path):
    """The write runs in a child whose file-size limit is 1 KiB (SIGXFSZ ignored, so the write
    fails with EFBIG as a full disk fails with ENOSPC): the error must name the path and what
    to do, and the manifest rendered before must be left as it was, with no temporary file."""
    target = tmp_path / "manifests" / "h200.yaml"
    target.parent.mkdir()
    target.write_text("old: manifest\n")
    code = textwrap.dedent(f"""
        import resource, signal, sys
        sys.path.insert(0, {str(PROJECT_ROOT)!r})
        from pathlib import Path
        from onboarding.common.files import write_atomic
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
        try:
            write_atomic(Path({str(target)!r}), "x" * 65536)
        except Exception as exc:
            print(type(exc).__name__, exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False).stdout
    assert out.startswith("OutputError "), out
    assert str(target) in out and "Free space on the volume" in out
    assert target.read_text() == "old: manifest\n"
    assert sorted(p.name for p in Path(target.parent).iterdir()) == ["h200.yaml"]
