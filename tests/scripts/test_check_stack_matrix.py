"""scripts/check_stack_matrix.py on the engine wheels' recorded METADATA (tests/data/stack-matrix:
vLLM 0.32.0, SGLang 0.5.17 and 0.5.9, fetched from PyPI with pip download; README there).

configs/stack.yaml must pass; the matrix as it stood before (SGLang 0.5.9 and FlashInfer 0.6.1
beside torch 2.13.0 and CUDA 13.0) must fail with every conflict named from both sides.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.matrix import conflicts, pins_for, requires_dist

SCRIPT = PROJECT_ROOT / "scripts" / "check_stack_matrix.py"
RECORDED = PROJECT_ROOT / "tests" / "data" / "stack-matrix"
STACK = PROJECT_ROOT / "configs" / "stack.yaml"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--metadata-dir", str(RECORDED), *args],
                          capture_output=True, text=True, timeout=120, check=False)


def _stack_as_before(tmp_path: Path) -> Path:
    data = yaml.safe_load(STACK.read_text())
    data["versions"].update(sglang="0.5.9", flashinfer="0.6.1")
    data.pop("engine_pins", None)
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_pinned_matrix_is_installable():
    proc = _run("--engines", "vllm", "sglang")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [
        "ok: vllm 0.32.0 (vllm) against torch 2.13.0, CUDA 13.0, FlashInfer 0.7.0.post1",
        "ok: sglang 0.5.17 (sglang) against torch 2.11.0, CUDA 13.0, FlashInfer 0.6.15.post1"]


def test_the_matrix_as_it_was_names_every_conflict(tmp_path):
    proc = _run("--stack", str(_stack_as_before(tmp_path)), "--engines", "vllm", "sglang")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    for line in (
            ("sglang 0.5.9 requires torch==2.9.1 (its wheel's Requires-Dist), the matrix pins "
            "versions.pytorch 2.13.0"),
            ("sglang 0.5.9 requires cuda-python==12.9 (its wheel's Requires-Dist), the matrix "
            "pins versions.cuda 13.0"),
            ("sglang 0.5.9 requires flashinfer_python==0.6.3 (its wheel's Requires-Dist), the "
            "matrix pins versions.flashinfer 0.6.1"),
            ("vllm 0.32.0 requires flashinfer-python==0.7.0.post1 (its wheel's Requires-Dist), "
            "the matrix pins versions.flashinfer 0.6.1")):
        assert line in out, line
    assert out.count("CONFLICT:") == 2


def test_an_engine_without_metadata_is_said_not_checked():
    proc = _run()  # every pinned engine: TensorRT-LLM has no METADATA here
    assert proc.returncode == 2
    assert "not checked: tensorrt-llm 1.2.1: no tensorrt-llm-1.2.1.METADATA" in proc.stderr
    assert proc.stdout.count("ok:") == 2


def test_markers_extras_and_cuda_builds():
    """A requirement behind an extra or another platform is not the image's; a cu12 build is
    a CUDA 12 requirement."""
    requires = requires_dist((RECORDED / "vllm-0.32.0.METADATA").read_text())
    assert any(r.startswith("zentorch") and 'extra == "zen"' in r for r in requires)
    pins, where = pins_for("vllm", {"pytorch": "2.13.0", "cuda": "13.0",
                                    "flashinfer": "0.7.0.post1"}, {})
    assert conflicts("vllm", "0.32.0", requires, pins, where) == []
    bad = conflicts("e", "1", ["nvidia-nccl-cu12==2.27.3", "x[cu13]==1"], pins, where)
    assert [str(c) for c in bad] == [
        ("e 1 requires nvidia-nccl-cu12==2.27.3 (its wheel's Requires-Dist), the matrix pins "
        "versions.cuda 13.0 (CUDA 13)")]
