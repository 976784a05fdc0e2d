"""Asset-check helpers more than one stage yields: the accuracy gate's check (in process on
`accuracy`, served on `served_accuracy`) and the not-applicable warning of a performance twin.

Not a stage (no `defs`): stage modules import each other never, and this module instead
(`tests/test_floors.py`). Its checks say what they expected, so a red check explains itself.
"""

import dagster as dg

from onboarding.fetch.twins import NOT_APPLICABLE, NOT_APPLICABLE_VERDICT
from onboarding.quantize.accuracy_gate import AccuracyGates
from onboarding.quantize.variants import GateOutcome

QUANTIZED_PRECISIONS = ("nvfp4", "fp8")


def not_applicable_check(name: str, reason: str = NOT_APPLICABLE,
                         metadata: dict | None = None) -> dg.AssetCheckResult:
    """A check whose subject a performance twin does not have (accuracy, a weight read): a
    warning that does not pass, so it never reads as a silent pass (docs/twins.md)."""
    return dg.AssetCheckResult(check_name=name, passed=False,
                               severity=dg.AssetCheckSeverity.WARN,
                               metadata={"status": NOT_APPLICABLE_VERDICT, "reason": reason,
                                         **(metadata or {})})


def gate_check(name: str, outcome: GateOutcome | None, rows: tuple[dict, ...], precision: str,
               gates: AccuracyGates, not_checked: str = "not in this model's precision ladder"
               ) -> dg.AssetCheckResult:
    """A gate's check: the verdict, the items it used, and per task the drop's interval against
    the allowed drop, so a red check explains itself."""
    if outcome is None:
        return dg.AssetCheckResult(check_name=name, passed=True,
                                   metadata={"status": not_checked})
    if outcome.verdict == NOT_APPLICABLE_VERDICT:
        return not_applicable_check(name, outcome.reason)
    meta: dict = {"verdict": outcome.verdict, "reason": outcome.reason,
                  "source": outcome.source, "items_used": outcome.items,
                  "inconclusive_policy": gates.inconclusive.policy,
                  "interval": f"drop ± z·se: z {gates.z:g} ({gates.confidence:.0%} two-sided) "
                              "for one look at every item, wider at a look that more items "
                              "may follow (group-sequential; per task below)"}
    for r in rows:
        if r["precision"] == precision:
            t = r["task"]
            # scores and their differences are fractions of items: 4 decimals (0.01 points)
            meta[f"{t}_actual"] = round(float(r["variant"]), 4)
            meta[f"{t}_expected"] = round(float(r["baseline"]), 4)
            meta[f"{t}_delta"] = round(float(r["delta"]), 4)
            meta[f"{t}_se_delta"] = round(float(r["se_delta"]), 4)
            meta[f"{t}_drop_interval"] = f"[{r['drop_low']:.4f}, {r['drop_high']:.4f}]"
            if r.get("z") is not None:
                meta[f"{t}_z"] = round(float(r["z"]), 3)
            meta[f"{t}_allowed_drop"] = round(float(r["allowed_drop"]), 4)
            meta[f"{t}_tolerance"] = gates.tolerance_for(t).describe(float(r["baseline"]))
            meta[f"{t}_verdict"] = r["verdict"]
            meta[f"{t}_items"] = int(r["n"])
    meta["tolerance"] = dg.MetadataValue.json(gates.tolerance.model_dump(exclude_none=True))
    return dg.AssetCheckResult(check_name=name, passed=outcome.passed, metadata=meta,
                               severity=dg.AssetCheckSeverity.WARN)
