"""Engines are data: no engine's name is written in the code.

Every string constant in pipelines/, assets/, resources/ and onboarding/ is scanned (an AST walk,
so comments never count) for the names of the engines configs/stack.yaml lists, as a word in any
case (`vllm`, `$VLLM serve`, `-m sglang.launch_server`, `VLLM_CPU_KVCACHE_SPACE`). Docstrings may
name engines: they explain to a reader, they select nothing. Adding an engine is a template in
configs/stack.yaml (docs/architecture.md, "Adding an engine"); code that names one is a second
place to change, which this test refuses.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from onboarding.common.paths import PROJECT_ROOT

CODE_DIRS = ("pipelines", "assets", "resources", "onboarding")
# (file, the constant's text): advice to a person that names the one engine measured here, and
# selects nothing. Keep this short; a new entry needs a reason as good.
ALLOWED = {
    ("onboarding/serving/frontend.py", "FRONTEND_ADVICE"),  # "vLLM --api-server-count N", shown in reports
}


def engine_names() -> list[str]:
    stack = yaml.safe_load((PROJECT_ROOT / "configs" / "stack.yaml").read_text())
    return sorted(stack["engines"])


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _assigned_names(tree: ast.AST) -> dict[int, str]:
    """id(constant) -> the module-level name it is assigned to (for the allowlist)."""
    out = {}
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            for sub in ast.walk(node.value):
                out[id(sub)] = node.targets[0].id
    return out


def engine_literals(root: Path, names: list[str]) -> list[str]:
    """`path:line: 'constant'` for every string constant outside docstrings naming an engine."""
    word = re.compile(r"(?<![a-z0-9])(" + "|".join(map(re.escape, names)) + r")(?![a-z0-9])",
                      re.IGNORECASE)
    found = []
    for top in CODE_DIRS:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(), filename=rel)
            docs, assigned = _docstrings(tree), _assigned_names(tree)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                        and id(node) not in docs and word.search(node.value)
                        and (rel, assigned.get(id(node))) not in ALLOWED):
                    found.append(f"{rel}:{node.lineno}: {node.value[:80]!r}")
    return found


def test_the_stack_lists_the_engines_the_scan_looks_for():
    assert {"vllm", "sglang", "trtllm"} <= set(engine_names())


def test_no_engine_name_is_written_in_code():
    found = engine_literals(PROJECT_ROOT, engine_names())
    assert not found, ("engine names written in code (make it data in configs/stack.yaml's "
                       "engine template):\n" + "\n".join(found))


def test_the_scan_finds_a_name_in_code_and_skips_docstrings(tmp_path: Path):
    (tmp_path / "onboarding").mkdir()
    (tmp_path / "onboarding" / "m.py").write_text(
        '"""Starts vLLM or SGLang."""\n'
        "def f():\n"
        '    """vllm is fine here."""\n'
        '    return ["$VLLM serve", "-m sglang.launch_server", "VLLM_CPU_KVCACHE_SPACE",\n'
        '            "vllm-openai", "vllmx", "flashinfer"]\n')
    found = engine_literals(tmp_path, ["sglang", "vllm"])
    assert [f.split(": ", 1)[1] for f in found] == [
        "'$VLLM serve'", "'-m sglang.launch_server'", "'VLLM_CPU_KVCACHE_SPACE'",
        "'vllm-openai'"]
