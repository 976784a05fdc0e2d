"""One check of a node (pass, fail or not checked, with why) and the builder every phase uses:
a check is required unless acceptance.yaml lists it under `optional`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

PASS, FAIL, NOT_CHECKED = "pass", "fail", "not checked"


@dataclass(frozen=True)
class Check:
    phase: int
    name: str
    status: str  # pass | fail | not checked
    measured: str = ""
    expected: str = ""
    reason: str = ""
    required: bool = True

    def row(self) -> dict[str, Any]:
        return {"phase": self.phase, "check": self.name, "result": self.status,
                "measured": self.measured, "expected": self.expected, "reason": self.reason,
                "required": self.required}


class Checker:
    """Builds checks for one node setting: a check is optional when acceptance.yaml says so."""

    def __init__(self, optional: Iterable[str] = ()):
        self.optional = set(optional)
        self.checks: list[Check] = []

    def add(self, phase: int, name: str, ok: bool, measured: Any, expected: Any,
            reason: str = "") -> None:
        self.checks.append(Check(phase, name, PASS if ok else FAIL, _fmt(measured),
                                 _fmt(expected), "" if ok else reason,
                                 name not in self.optional))

    def skip(self, phase: int, name: str, why: str, expected: Any = "",
             required: bool | None = None) -> None:
        """Not checked, with why. `required=False` for a check with nothing to judge against
        (no threshold configured, nothing of the kind on this node)."""
        req = name not in self.optional if required is None else required and \
            name not in self.optional
        self.checks.append(Check(phase, name, NOT_CHECKED, "", _fmt(expected),
                                 f"not checked: {why}", req))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
