"""The quick lane (`-m "not slow"`, README) starts no real engine and no end-to-end service.

A test module that reaches the vLLM CPU engine, PostgreSQL, a browser or `dagster dev` carries
the `slow` marker: module-wide, or on each test that reaches one (directly or through one of
the module's own top-level helpers or fixtures). SeaweedFS (one server for the session,
seconds) and the fake OpenAI engine (tests/fakes) stay in the quick lane on purpose. A test
that reaches the vLLM CPU engine also carries `engine`: under pytest-xdist those run as one
group, one engine at a time (tests/conftest.py). `slow` also marks what keeps the quick lane
from being quick: graph runs in a Dagster instance, subprocess runs and any test over about 5 s
on 2 cores (the lane's figure is in docs/benchmarks.md).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onboarding.common.paths import PROJECT_ROOT

TESTS = PROJECT_ROOT / "tests"
# what a module says when it starts one: the engine's virtualenv, the PostgreSQL helper, the
# browser, the UI server's command
STARTS = {"the vLLM CPU engine": '".venv-engine"', "PostgreSQL": "tests.e2e.postgres",
          "a browser": "/usr/bin/chromium", "dagster dev": '"dagster"), "dev"'}


def _marked(decorators: list[ast.expr], marker: str = "slow") -> bool:
    return any(f"mark.{marker}" in ast.unparse(d) for d in decorators)


def _unmarked_starts(path: Path, root: Path = PROJECT_ROOT, marker: str = "slow",
                     starts: dict[str, str] = STARTS) -> list[str]:
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    for node in tree.body:  # pytestmark = pytest.mark.slow (or a list holding it)
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets) \
                and f"mark.{marker}" in ast.unparse(node.value):
            return []

    def says(node: ast.AST) -> set[str]:
        # a top-level statement's whole lines (ast.get_source_segment re-splits the file per call)
        segment = "\n".join(lines[node.lineno - 1:node.end_lineno])
        return {what for what, token in starts.items() if token in segment}

    # names the module binds at top level to a start (VLLM = ... / "vllm")
    bound = {t.id: says(n) for n in tree.body if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name) if says(n)}
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}

    def names(f: ast.FunctionDef) -> set[str]:
        return {n.id for n in ast.walk(f) if isinstance(n, ast.Name)} | {a.arg for a in
                                                                          f.args.args}

    def direct(f: ast.FunctionDef) -> set[str]:
        return says(f) | {w for name in names(f) & set(bound) for w in bound[name]}

    out = []
    for name, f in funcs.items():
        if not name.startswith("test_") or _marked(f.decorator_list, marker):
            continue
        reached = direct(f) | {w for h in names(f) & set(funcs) for w in direct(funcs[h])}
        out += [f"{path.relative_to(root)}::{name} reaches {w}" for w in sorted(reached)]
    return out


def test_every_test_that_starts_an_engine_or_a_service_is_slow():
    unmarked = [u for p in sorted(TESTS.rglob("test_*.py")) if p != Path(__file__)
                for u in _unmarked_starts(p)]
    assert not unmarked, "mark these @pytest.mark.slow (the quick lane must start none): " + \
        "; ".join(unmarked)


def test_every_test_that_starts_the_engine_is_marked_engine():
    """`engine` puts them in one pytest-xdist group (tests/conftest.py): one engine at a time."""
    engine = {"the vLLM CPU engine": STARTS["the vLLM CPU engine"]}
    unmarked = [u for p in sorted(TESTS.rglob("test_*.py")) if p != Path(__file__)
                for u in _unmarked_starts(p, marker="engine", starts=engine)]
    assert not unmarked, "mark these @pytest.mark.engine (one engine at a time under " \
        "pytest-xdist): " + "; ".join(unmarked)


def test_the_check_sees_an_unmarked_engine_start(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text('VLLM = ROOT / ".venv-engine" / "bin" / "vllm"\n\n'
                      "def needs_engine():\n    assert VLLM.is_file()\n\n"
                      "def test_quick():\n    pass\n\n"
                      "def test_serves():\n    needs_engine()\n")
    found = [u.split("::")[1] for u in _unmarked_starts(sample, tmp_path)]
    assert found == ["test_serves reaches the vLLM CPU engine"]
    found = [u.split("::")[1] for u in _unmarked_starts(sample, tmp_path, marker="engine")]
    assert found == ["test_serves reaches the vLLM CPU engine"]
    sample.write_text(sample.read_text().replace("def test_serves", "@pytest.mark.engine\n"
                                                 "def test_serves"))
    assert _unmarked_starts(sample, tmp_path, marker="engine") == []


@pytest.mark.slow
def test_a_worker_hands_out_the_engine_unit_first_and_keeps_an_alone_first_false_test_in_place():
    """Under pytest-xdist (tests/conftest.py): the engine tests go first, so the `waits` tests
    run beside them; an `alone(first=False)` test stays among its module's tests, so the
    module's engine fixture is set up once."""
    files = ["tests/e2e/test_serving_vllm.py", "tests/e2e/test_twin_vllm.py"]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *files, "tests/test_markers.py"],
                         cwd=PROJECT_ROOT, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTEST_XDIST_WORKER": "gw0"}).stdout
    ids = [line for line in out.splitlines() if "::" in line]
    modules = [i.split("::")[0] for i in ids]
    engine = [n for n, m in enumerate(modules) if m in files]
    assert engine == list(range(len(engine))) and len(engine) < len(ids)  # engine tests first
    serving = [n for n, m in enumerate(modules) if m == files[0]]
    assert serving == list(range(serving[0], serving[-1] + 1))  # one contiguous run
    itl = next(n for n, i in enumerate(ids) if "test_client_itl_is_the_engines" in i)
    assert serving[0] < itl <= serving[-1]
