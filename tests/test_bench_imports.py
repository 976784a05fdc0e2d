"""bench/ is a client of the product and of the recordings, never of the test suite: the tests
may import bench (they check its scripts and replay its recordings); bench imports no test."""

from __future__ import annotations

import ast
from pathlib import Path

from onboarding.common.paths import PROJECT_ROOT


def imports_of_tests(path: Path, root: Path = PROJECT_ROOT) -> list[str]:
    tree = ast.parse(path.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    return [f"{path.relative_to(root)}: {m}" for m in names
            if m == "tests" or m.startswith("tests.")]


def test_bench_imports_nothing_from_the_tests():
    bad = [b for p in sorted((PROJECT_ROOT / "bench").rglob("*.py")) for b in imports_of_tests(p)]
    assert not bad, "move the helper into bench/ or the product:\n" + "\n".join(bad)


def test_the_check_sees_both_import_forms(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "probe.py").write_text("from tests.dagster_support import stand_in\n"
                                    "import tests.hub_cache\nimport testsuite\n")
    got = [b.split(": ")[1] for b in imports_of_tests(bench / "probe.py", root=tmp_path)]
    assert got == ["tests.hub_cache", "tests.dagster_support"]
