"""Wide records are built by keyword: a dataclass of WIDE or more fields is `kw_only`, and no
call anywhere passes one of them positionally (a run of positional values is where two fields
of one type swap unnoticed). Pickled values stay loadable: `kw_only` changes `__init__` only."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from onboarding.common.paths import PROJECT_ROOT

WIDE = 7  # init fields from which a record is built by keyword only
PRODUCT = ("pipelines", "assets", "resources", "onboarding", "bench")
CALLERS = (*PRODUCT, "scripts", "tests")


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _files(roots: tuple[str, ...], base: Path) -> list[Path]:
    return sorted(p for r in roots for p in (base / r).rglob("*.py"))


def _dataclass(node: ast.ClassDef) -> ast.expr | None:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if (target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")) \
                == "dataclass":
            return d
    return None


def _init_fields(node: ast.ClassDef) -> int:
    def in_init(s: ast.AnnAssign) -> bool:
        if "ClassVar" in ast.unparse(s.annotation):
            return False
        return not (isinstance(s.value, ast.Call) and any(
            k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
            for k in s.value.keywords))
    return sum(1 for s in node.body if isinstance(s, ast.AnnAssign) and in_init(s))


def wide_records(base: Path = PROJECT_ROOT, roots: tuple[str, ...] = PRODUCT
                 ) -> dict[str, tuple[str, bool]]:
    """Class name -> (where, whether kw_only) for each dataclass of WIDE or more init fields."""
    out = {}
    for p in _files(roots, base):
        for node in ast.walk(_parse(p)):
            if isinstance(node, ast.ClassDef) and (d := _dataclass(node)) is not None \
                    and _init_fields(node) >= WIDE:
                kw = isinstance(d, ast.Call) and any(
                    k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value
                    for k in d.keywords)
                out[node.name] = (f"{p.relative_to(base)}:{node.lineno}", kw)
    return out


def _bound_elsewhere(tree: ast.Module, path: str, records: dict[str, tuple[str, bool]]
                     ) -> set[str]:
    """Names this module binds to another class than the wide record of that name (its own
    class, or one imported from another module)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in records and \
                records[node.name][0].split(":")[0] != path:
            out.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            # the record's own module, or a package above it (which re-exports it)
            where = node.module.replace(".", "/")
            out |= {a.asname or a.name for a in node.names if a.name in records
                    and not _defined_in(records[a.name][0].split(":")[0], where)}
    return out


def _defined_in(path: str, module: str) -> bool:
    return path == module + ".py" or path.startswith(module + "/")


def positional_calls(records: dict[str, tuple[str, bool]], files: list[Path], base: Path
                     ) -> list[str]:
    """`file:line: Name with N positional` for each call of a wide record (or of `cls` in one
    of its classmethods) with positional arguments."""
    bad = []
    called = re.compile(r"\b(?:cls|" + "|".join(map(re.escape, records)) + r")\(")
    for p in files:
        if not called.search(p.read_text()):  # most files call none: no need to parse them
            continue
        rel = str(p.relative_to(base))
        tree = _parse(p)
        names = set(records) - _bound_elsewhere(tree, rel, records)
        calls = [(n, None) for n in ast.walk(tree) if isinstance(n, ast.Call)]
        calls += [(n, c.name) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                  and c.name in names for n in ast.walk(c)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                  and n.func.id == "cls"]
        for node, owner in calls:
            f = node.func
            name = owner or (f.id if isinstance(f, ast.Name) else f.attr
                             if isinstance(f, ast.Attribute) else None)
            if node.args and name in names:
                bad.append(f"{rel}:{node.lineno}: {name} with {len(node.args)} positional")
    return bad


def test_wide_records_are_keyword_only():
    bad = [f"{where}: {name}" for name, (where, kw) in wide_records().items() if not kw]
    assert not bad, f"dataclasses of {WIDE}+ fields without kw_only=True:\n" + "\n".join(bad)


def test_no_call_passes_a_wide_record_positional_values():
    bad = positional_calls(wide_records(), _files(CALLERS, PROJECT_ROOT), PROJECT_ROOT)
    assert not bad, "name the fields:\n" + "\n".join(bad)


def test_the_checks_see_a_positional_wide_record(tmp_path):
    (tmp_path / "bench").mkdir()
    fields = "\n".join(f"    f{i}: int" for i in range(WIDE))
    (tmp_path / "bench" / "probe.py").write_text(
        "from dataclasses import dataclass\n\n"
        f"@dataclass(frozen=True)\nclass Wide:\n{fields}\n\n"
        f"@dataclass(kw_only=True)\nclass Named:\n{fields}\n\n"
        "    @classmethod\n    def of(cls, x):\n        return cls(x)\n\n"
        "@dataclass\nclass Narrow:\n    a: int\n\n"
        f"w = Wide({', '.join('0' * WIDE)})\nn = Named(f0=1)\nm = Narrow(1)\n")
    # a class of the same name from elsewhere is not the record; the package re-exports it
    (tmp_path / "bench" / "other.py").write_text("from elsewhere import Wide\n\nw = Wide(1)\n")
    (tmp_path / "bench" / "user.py").write_text("from bench import Wide\n\nw = Wide(1)\n")
    found = wide_records(tmp_path, ("bench",))
    assert {k: v[1] for k, v in found.items()} == {"Wide": False, "Named": True}
    files = [tmp_path / "bench" / n for n in ("other.py", "probe.py", "user.py")]
    assert positional_calls(found, files, tmp_path) == [
        f"bench/probe.py:{17 + 2 * WIDE}: Wide with {WIDE} positional",
        f"bench/probe.py:{11 + 2 * WIDE}: Named with 1 positional",  # its classmethod's cls()
        "bench/user.py:3: Wide with 1 positional"]
