"""Check that configs/stack.yaml's matrix can be installed: each pinned engine release's own
declared requirements (its wheel's METADATA `Requires-Dist`) against the matrix's torch, CUDA
and FlashInfer pins (onboarding/serving/matrix.py). Prints one line per engine; every conflict
names the wheel's requirement and the stack.yaml pin it contradicts.

    .venv/bin/python scripts/check_stack_matrix.py --download            # from PyPI (pip)
    .venv/bin/python scripts/check_stack_matrix.py --metadata-dir tests/data/stack-matrix

`--metadata-dir` reads `<distribution>-<version>.METADATA` files (what the wheel's
.dist-info/METADATA holds); `--download` runs `pip download --no-deps` for each engine's wheel
and reads the METADATA inside it. `--engines` limits the check to some engines (default: every
engine with a template and a versions pin). Exit 0: every engine checked agrees; 1: a conflict;
2: an engine's metadata could not be read (what to do is printed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onboarding.common.errors import OnboardingError
from onboarding.serving.matrix import (
    conflicts,
    metadata_identity,
    pins_for,
    requires_dist,
)
from onboarding.serving.stack import load_stack, read_stack_config


def _from_dir(directory: Path, dist: str, version: str) -> str:
    path = directory / f"{dist}-{version}.METADATA"
    if not path.is_file():
        raise OnboardingError(f"{dist} {version}", f"no {path.name} in {directory}",
                              f"Put the wheel's .dist-info/METADATA there as {path.name} (pip "
                              f"download --no-deps {dist}=={version}), or use --download.")
    return path.read_text()


def _downloaded(dist: str, version: str) -> str:
    with tempfile.TemporaryDirectory(prefix="stack-matrix-") as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                               "--only-binary", ":all:", "-d", tmp, f"{dist}=={version}"],
                              capture_output=True, text=True, check=False)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise OnboardingError(f"{dist} {version}", "pip download found no wheel: "
                                  + (proc.stderr.strip().splitlines() or ["no output"])[-1],
                                  "Check the version exists on the index pip uses, or pass "
                                  "--metadata-dir with its METADATA.")
        with zipfile.ZipFile(wheels[0]) as whl:
            name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
            return whl.read(name).decode()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", type=Path, default=Path(__file__).resolve().parents[1]
                    / "configs" / "stack.yaml")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--metadata-dir", type=Path)
    source.add_argument("--download", action="store_true")
    ap.add_argument("--engines", nargs="+", default=None)
    args = ap.parse_args(argv)

    data = read_stack_config(args.stack)
    stack = load_stack(args.stack)
    versions, engine_pins = data["versions"], data.get("engine_pins") or {}
    engines = args.engines or [e for e in stack.templates if e in versions]
    found, missing = [], []
    for engine in engines:
        if engine not in stack.templates or engine not in versions:
            print(f"{engine}: no template or no versions.{engine} in {args.stack}",
                  file=sys.stderr)
            return 2
        dist, version = stack.templates[engine].distributions[0], versions[engine]
        try:
            text = (_downloaded(dist, version) if args.download
                    else _from_dir(args.metadata_dir, dist, version))
        except OnboardingError as exc:
            missing.append(str(exc))
            continue
        if metadata_identity(text) != (dist, version):
            missing.append(f"{dist} {version}: the METADATA read is {metadata_identity(text)}")
            continue
        pins, where = pins_for(engine, versions, engine_pins)
        found += (bad := conflicts(engine, version, requires_dist(text), pins, where))
        state = "CONFLICT" if bad else "ok"
        print(f"{state}: {engine} {version} ({dist}) against torch {pins['pytorch']}, CUDA "
              f"{pins['cuda']}, FlashInfer {pins['flashinfer']}")
        for c in bad:
            print(f"  {c}")
    for m in missing:
        print(f"not checked: {m}", file=sys.stderr)
    return 1 if found else 2 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
