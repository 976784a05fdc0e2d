"""The verdict as a sentence a person acts on: where the model is ready, where not and why in
plain words (no hashes), and the one next step.

`readiness` states its reasons precisely (onboarding/deploy/readiness.py, with configuration
hashes); the pages keep those words in the table below the verdict. This module reads them into
a few kinds, each with its plain reason and its next step, ordered the way the graph runs: the
first unmet step is the one to take next.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from onboarding.fetch.twins import NOT_READY as TWIN


@dataclass(frozen=True)
class Kind:
    starts: str  # the readiness reason starts with this
    plain: str
    next_step: str


# In the order of the graph: an earlier kind's step unblocks the later ones.
MODEL_KINDS = (
    Kind(TWIN, "it is a performance twin (random weights), which is never ready",
         "onboard the real model's checkpoint; the twin's serving numbers stay in its report"),
    Kind("no precision passed its accuracy gate", "no precision passed its accuracy gate",
         "read the accuracy gates (`accuracy`'s checks): add bf16 to the precision ladder, or "
         "loosen configs/gates.yaml only with a reason"),
    Kind("no manifest was rendered", "no manifest was rendered",
         "materialize `kserve_manifest` (onboard_model runs it)"),
)
NODE_KINDS = (
    Kind("no manifest for this node type", "no manifest was rendered for it",
         "see `serving_config`: why it planned no configuration for that node type"),
    Kind("manifest invalid", "its manifest does not validate against the KServe CRDs",
         "fix the errors `kserve_manifest` lists"),
    Kind("weights not published", "its weights are not published and verified",
         "materialize `published_variant`"),
    Kind("SLOs never measured", "its SLOs were never measured at the configuration deployed "
         "there", "benchmark on a node of that type: run `load_timing` and `serving_benchmark` "
         "there (docs/serving.md)"),
    Kind("SLOs judged as a warning only", "its SLOs were judged on a stand-in profile, not as "
         "a gate", "benchmark on a GPU node of that type, whose profile makes the SLOs a gate"),
    Kind("SLOs missed", "it missed its SLOs",
         "read `serving_benchmark`'s sweep: lower slo.target_concurrency or pick a larger node "
         "type"),
    Kind("cold start never measured", "its cold start was never measured at the configuration "
         "deployed there", "run `load_timing` on a node of that type (docs/serving.md)"),
    Kind("no fully cold start measured", "no fully cold start was measured there",
         "read `load_timing`'s reason: a node that cannot evict its page cache measures no "
         "fully cold start"),
    Kind("cold start p95", "a new pod takes longer to come up than the cold-start budget",
         "read `load_timing`'s phases (weight read, compile, CUDA graphs): a faster cache, a "
         "published variant on the node cache, or a budget that says why in configs/gates.yaml"),
)
_HASH = re.compile(r"\b[0-9a-f]{12,64}\b")


def _kind(reason: str, kinds: Sequence[Kind]) -> Kind:
    return next((k for k in kinds if reason.startswith(k.starts)),
                Kind(reason, _HASH.sub("…", reason), "read the reasons below"))


def _names(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def sentence(ready: bool, reasons: Sequence[str],
             nodes: Sequence[tuple[str, bool, Sequence[str]]]) -> tuple[str, str]:
    """(the verdict in a sentence, the next step) from a verdict's model-level reasons and its
    (node type, ready, reasons) per target node type."""
    if reasons:
        kinds = sorted({_kind(r, MODEL_KINDS) for r in reasons},
                       key=lambda k: MODEL_KINDS.index(k) if k in MODEL_KINDS else len(
                           MODEL_KINDS))
        return (f"Not ready: {'; '.join(k.plain for k in kinds)}.",
                f"Next: {kinds[0].next_step}.")
    ready_on = [nt for nt, ok, _ in nodes if ok]
    by_kinds: dict[tuple[Kind, ...], list[str]] = {}
    for nt, ok, why in nodes:
        if not ok:
            kinds = tuple(sorted({_kind(r, NODE_KINDS) for r in why or ("no verdict",)},
                                 key=_node_order))
            by_kinds.setdefault(kinds, []).append(nt)
    if ready and not by_kinds:
        return (f"Ready on {_names(ready_on)}.",
                f"Next: deploy the {_names(ready_on)} manifest (docs/deploy.md).")
    parts = [f"on {_names(nts)} {_names([k.plain for k in kinds])}"
             for kinds, nts in by_kinds.items()]
    head = f"Ready on {_names(ready_on)}; not ready" if ready_on else "Not ready"
    first = min(by_kinds, key=lambda kinds: _node_order(kinds[0]))
    return (f"{head}: {'; '.join(parts)}.",
            f"Next, for {_names(by_kinds[first])}: {first[0].next_step}.")


def _node_order(kind: Kind) -> int:
    return NODE_KINDS.index(kind) if kind in NODE_KINDS else len(NODE_KINDS)
