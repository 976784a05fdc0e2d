"""Markdown tables for asset metadata and reports: one way to build them, everywhere."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def _cell(value: Any, floatfmt: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, floatfmt)
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None,
             floatfmt: str = ".4g", empty: str = "(none)") -> str:
    """A GitHub-flavoured Markdown table: `columns` (default: the first row's keys) in order;
    numbers right-aligned; None as an empty cell; `empty` when there are no rows."""
    rows = list(rows)
    if not rows:
        return empty
    cols = list(columns or rows[0])
    numeric = {c: all(isinstance(r.get(c), int | float) and not isinstance(r.get(c), bool)
                      for r in rows if r.get(c) is not None) for c in cols}
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "|".join("---:" if numeric[c] else "---" for c in cols) + "|"]
    lines += ["| " + " | ".join(_cell(r.get(c), floatfmt) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def read_md_table(text: str) -> list[dict[str, str]]:
    """The rows of a table `md_table` wrote, every cell as text (the inverse, as far as text
    goes: numbers keep the format they were written in). Stored metadata is read back this way
    when only its Markdown was kept (a recording of a run elsewhere)."""
    def cells(line: str) -> list[str]:
        parts = re.split(r"(?<!\\)\|", line.strip().removeprefix("|").removesuffix("|"))
        return [c.strip().replace("\\|", "|") for c in parts]

    lines = [ln for ln in text.strip().splitlines() if ln.strip().startswith("|")]
    if len(lines) < 2:
        return []
    cols = cells(lines[0])
    return [dict(zip(cols, cells(ln), strict=True)) for ln in lines[2:]]


def splice_generated(doc: str, name: str, body: str) -> str:
    """`doc` with the text between its `<!-- generated: name -->` and `<!-- end generated: name
    -->` markers replaced by `body` (the docs' tables that scripts regenerate from data)."""
    begin, end = f"<!-- generated: {name} -->", f"<!-- end generated: {name} -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(doc):
        raise ValueError(f"markers {begin} ... {end} not found")
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", doc)


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """The same rows as a CSV file (columns: the union of keys, first-seen order)."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=cols)
        writer.writeheader()
        writer.writerows(rows)
    return path
