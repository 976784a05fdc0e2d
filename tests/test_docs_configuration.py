"""docs/configuration.md names every environment variable the product reads and every file under
configs/, so a variable added to the code without a line on that page fails here.

The product is assets/, resources/, pipelines/, onboarding/ and scripts/ (bench/ is tooling with
its own flags). A read is: `os.environ[...]`, `os.environ.get/setdefault/pop(...)`, `... in
os.environ`, `os.getenv(...)`, `EnvVar(...)` / `EnvVar.int(...)`, a keyword of
pipelines/resources.py's `_env(...)` / `_env_int(...)`, a module constant named `*_ENV` (a
name, or a mapping of names), and in shell scripts `${NAME:-...}` and its siblings."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("assets", "resources", "pipelines", "onboarding", "scripts")
DOC = PROJECT_ROOT / "docs" / "configuration.md"
NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
SHELL_READ = re.compile(r"\$\{([A-Z][A-Z0-9_]*)(?::?[-=?+])")
ENV_HELPERS = {"_env", "_env_int"}


def _names(node: ast.AST, constants: dict[str, set[str]]) -> set[str]:
    """The variable names an expression stands for: a string literal, or a module constant."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value):
        return {node.value}
    if isinstance(node, ast.Name):
        return constants.get(node.id, set())
    return set()


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def _callee(func: ast.AST) -> str | None:
    if isinstance(func, ast.Attribute):
        if func.attr == "int" and isinstance(func.value, (ast.Name, ast.Attribute)):
            return _callee(func.value)  # EnvVar.int(...)
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def env_reads_in_python(source: str) -> set[str]:
    """The environment variables one Python module reads (the forms in the module docstring)."""
    tree = ast.parse(source)
    constants: dict[str, set[str]] = {}
    found: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(
                stmt.targets[0], ast.Name):
            target, value = stmt.targets[0].id, stmt.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str) and NAME.match(
                    value.value):
                constants[target] = {value.value}
            if target.endswith("_ENV"):
                values = value.values if isinstance(value, ast.Dict) else [value]
                declared = {v.value for v in values if isinstance(v, ast.Constant)
                            and isinstance(v.value, str) and NAME.match(v.value)}
                constants[target] = declared or constants.get(target, set())
                found |= declared
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(
                node.ctx, ast.Load):
            found |= _names(node.slice, constants)
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            found |= _names(node.left, constants)
        elif isinstance(node, ast.Call):
            name = _callee(node.func)
            on_environ = isinstance(node.func, ast.Attribute) and _is_environ(node.func.value)
            if (on_environ and name in ("get", "setdefault", "pop")) or name in (
                    "getenv", "EnvVar"):
                if node.args:
                    found |= _names(node.args[0], constants)
            elif name in ENV_HELPERS:
                for kw in node.keywords:
                    found |= _names(kw.value, constants)
    return found


def env_reads_in_shell(source: str) -> set[str]:
    return set(SHELL_READ.findall(source))


def product_env_reads() -> dict[str, list[str]]:
    """{variable: the files that read it} over the product's Python and shell files."""
    reads: dict[str, list[str]] = {}
    for folder in PRODUCT:
        for path in sorted((PROJECT_ROOT / folder).rglob("*")):
            if path.suffix == ".py":
                names = env_reads_in_python(path.read_text())
            elif path.suffix == ".sh":
                names = env_reads_in_shell(path.read_text())
            else:
                continue
            for name in names:
                reads.setdefault(name, []).append(str(path.relative_to(PROJECT_ROOT)))
    return reads


def test_the_reader_finds_each_form_of_an_environment_read():
    """The scan is what holds the page complete, so each form it claims to see is seen, and a
    variable only written (an engine's environment) is not taken for a read."""
    source = '''
import os
import dagster as dg
from os import environ
KUBE_ENV = "FORM_CONSTANT"
FIELDS_ENV = {"a": "FORM_MAPPING"}
LOCAL = "FORM_NAMED"
a = os.environ["FORM_SUBSCRIPT"]
b = os.environ.get("FORM_GET")
os.environ.setdefault("FORM_SETDEFAULT", "1")
c = os.getenv("FORM_GETENV")
d = dg.EnvVar("FORM_ENVVAR")
e = dg.EnvVar.int("FORM_ENVVAR_INT")
f = _env(field="FORM_HELPER")
g = "FORM_IN" in os.environ
h = environ.get(LOCAL)
os.environ["WRITTEN_ONLY"] = "1"
env = {**os.environ, "CHILD_ONLY": "1"}
'''
    assert env_reads_in_python(source) == {
        "FORM_CONSTANT", "FORM_MAPPING", "FORM_NAMED", "FORM_SUBSCRIPT", "FORM_GET",
        "FORM_SETDEFAULT", "FORM_GETENV", "FORM_ENVVAR", "FORM_ENVVAR_INT", "FORM_HELPER",
        "FORM_IN"}
    assert env_reads_in_shell('X=${FORM_DEFAULT:-a}; Y=${FORM_EMPTY:-}; Z=$NOT_A_READ; '
                              'W=${FORM_REQUIRED:?set it}') == {
        "FORM_DEFAULT", "FORM_EMPTY", "FORM_REQUIRED"}


def test_the_scan_sees_the_variables_the_resources_are_wired_from():
    """A floor under the scan: the variables pipelines/resources.py wires the resources from,
    in each of its forms, are found in the product (a scan that silently found nothing would
    let the page test below pass)."""
    reads = product_env_reads()
    for name in ("S3_ENDPOINT_URL", "ONBOARDING_CONFIG_DIR", "ENGINE_PORT",
                 "ENGINE_START_TIMEOUT_S", "KSERVE_CRD_PATHS", "ONBOARDING_EXECUTOR",
                 "DAGSTER_HOME"):
        assert name in reads, name


def test_every_environment_variable_the_product_reads_is_on_the_configuration_page():
    doc = DOC.read_text()
    missing = {name: files for name, files in sorted(product_env_reads().items())
               if f"`{name}`" not in doc}
    assert not missing, (
        "docs/configuration.md does not list these environment variables the code reads "
        f"(add a row with its meaning and default): {missing}")


def test_every_config_file_is_on_the_configuration_page():
    """Each file under configs/ (a catalog entry counts as `models/*.yaml`, an eval task or
    calibration file as its folder's pattern) has a row saying what it is for."""
    doc = DOC.read_text()
    configs = PROJECT_ROOT / "configs"
    missing = []
    for path in sorted(p for p in configs.rglob("*") if p.is_file()):
        rel = path.relative_to(configs)
        pattern = f"{rel.parent}/*{path.suffix}" if rel.parent != Path(".") else str(rel)
        if f"`{rel}`" not in doc and pattern not in doc:
            missing.append(str(rel))
    assert not missing, f"docs/configuration.md has no row for these configs/ files: {missing}"
