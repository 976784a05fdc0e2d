"""One check of a node (pass, fail or not checked, with why, the threshold and where the
threshold comes from) and the builder every phase uses.

A check that cannot be made (the tool is absent, the node is a VM, nothing was read) is "not
checked" and blocks acceptance, unless the node type's `waivers` in acceptance.yaml accepts it
without that check and says why; a check with nothing of its kind on the node (NVLink on one
GPU) is "not checked" and not required. Nothing unread is ever a pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PASS, FAIL, NOT_CHECKED = "pass", "fail", "not checked"


@dataclass(frozen=True, kw_only=True)
class Check:
    phase: int
    name: str
    status: str  # pass | fail | not checked
    measured: str = ""
    expected: str = ""
    reason: str = ""
    required: bool = True
    source: str = ""  # where the threshold comes from (acceptance.yaml `sources`/`deviations`)

    def row(self) -> dict[str, Any]:
        return {"phase": self.phase, "check": self.name, "result": self.status,
                "measured": self.measured, "expected": self.expected, "source": self.source,
                "reason": self.reason, "required": self.required}


class Checker:
    """Builds the checks of one node type: the threshold's source from its config, a waived
    check that cannot be made not required (its reason names the waiver)."""

    def __init__(self, thresholds: Any = None):
        self.thresholds = thresholds
        self.checks: list[Check] = []

    def _source(self, name: str) -> str:
        if self.thresholds is None:
            return ""
        key = "allreduce" if name.startswith("allreduce_tp") else name
        return self.thresholds.source(key)

    def _waiver(self, name: str) -> str | None:
        waivers: Mapping[str, str] = getattr(self.thresholds, "waivers", None) or {}
        key = "allreduce" if name.startswith("allreduce_tp") else name
        return waivers.get(key)

    def add(self, phase: int, name: str, ok: bool, measured: Any, expected: Any,
            reason: str = "") -> None:
        self.checks.append(Check(phase=phase, name=name, status=PASS if ok else FAIL,
                                 measured=_fmt(measured), expected=_fmt(expected),
                                 reason="" if ok else reason, required=True,
                                 source=self._source(name)))

    def skip(self, phase: int, name: str, why: str, expected: Any = "",
             required: bool = True) -> None:
        """Not checked, with why: blocks unless waived. `required=False` only where there is
        nothing of the kind to check on this node (one GPU: no NVLink)."""
        waiver = self._waiver(name) if required else None
        if waiver:
            why = f"{why} (waived: {waiver})"
        self.checks.append(Check(phase=phase, name=name, status=NOT_CHECKED, measured="",
                                 expected=_fmt(expected), reason=f"not checked: {why}",
                                 required=required and not waiver, source=self._source(name)))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
