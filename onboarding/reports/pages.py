"""The readiness report: one page per model and one for the fleet, as HTML and as Markdown.

Pure: assets/report.py hands over the values the other assets stored (each None where that
stage never ran for the model) and writes what comes back. A page is first described as
sections of blocks (text, tables, figures, verdicts), then rendered twice from that one
description, so the self-contained HTML file (CSS inline, plots as data: URIs) and the
Markdown in the asset's metadata say the same thing. Every number carries where it came from:
measured (on which node type, at which configuration hash), predicted (by which library, with
which calibration), or estimated (by which rule).

"Since when" is the time of the `readiness` materialization that first had the current
ready/not-ready state: each report carries it over from the previous report of the model
while the state holds (`carry_since`).
"""

from __future__ import annotations

import base64
import csv
import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from onboarding.common.refs import CheckpointRef, PublishedVariant, VariantRef
from onboarding.common.tables import md_table
from onboarding.deploy.kserve import ProbeConfig
from onboarding.deploy.plan import GIB, NodePlan, plan_rows
from onboarding.deploy.readiness import Readiness
from onboarding.deploy.serving_plan import ServingPlan
from onboarding.predictions.predict import PredictionTable
from onboarding.quantize.accuracy_gate import AccuracyGates
from onboarding.quantize.variants import AccuracyReport, QuantizedSet
from onboarding.reports.plots import DropPoint, accuracy_png, curves_png, starts_png
from onboarding.reports.verdict import sentence
from onboarding.serving.engine_config import EngineConfig, evidence
from onboarding.serving.frontend import FRONTEND_ADVICE, FRONTEND_BOUND_CORES, frontend_bound_points
from onboarding.serving.kernels import facts_table
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult, Slo

# ---- the document: described once, rendered to HTML and to Markdown ----


@dataclass(frozen=True)
class Link:
    text: str
    href: str  # relative: the pages stay movable as a directory


@dataclass(frozen=True)
class Text:
    text: str  # `code` and **bold** marks are kept in both renderings


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    rows: tuple[dict[str, Any], ...]
    empty: str = "(none)"


@dataclass(frozen=True)
class Figure:
    name: str  # the image's element id is plot-<name>
    png: bytes
    caption: str


@dataclass(frozen=True)
class Verdict:
    ready: bool
    text: str  # exactly the readiness asset's words
    since: str
    element_id: str = "verdict"
    sentence: str = ""  # the same in plain words, and the next step (onboarding/reports/verdict.py)
    next_step: str = ""


Block = Text | Bullets | Table | Figure | Verdict


@dataclass(frozen=True)
class Section:
    title: str
    blocks: tuple[Block, ...]
    anchor: str
    level: int = 2


@dataclass(frozen=True)
class Page:
    title: str
    intro: tuple[Block, ...]
    sections: tuple[Section, ...]

    def figures(self) -> list[Figure]:
        blocks = [*self.intro, *(b for s in self.sections for b in s.blocks)]
        return [b for b in blocks if isinstance(b, Figure)]


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1d2330;margin:0;
background:#f6f7f9}
main{max-width:1300px;margin:0 auto;padding:24px 32px 64px;background:#fff}
h1{font-size:24px;margin:8px 0 12px}h2{font-size:19px;margin:32px 0 8px;border-bottom:1px solid
#dde1e7;padding-bottom:4px}h3{font-size:16px;margin:22px 0 6px}
table{border-collapse:collapse;margin:8px 0 14px;font-size:12.5px;display:block;
overflow-x:auto;max-width:100%}
th,td{border:1px solid #dde1e7;padding:3px 7px;vertical-align:top;text-align:left}
td{max-width:460px;overflow-wrap:anywhere}td.long{min-width:280px}
th{background:#eef1f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
code{background:#eef1f5;padding:0 3px;border-radius:3px;font-size:12px}
figure{margin:10px 0 18px}figure img{max-width:100%;border:1px solid #dde1e7}
figcaption{font-size:12px;color:#566}
.verdict{padding:8px 12px;border-radius:6px;margin:8px 0;border:1px solid}
.verdict.ready{background:#e9f7ee;border-color:#5cb176}
.verdict.not-ready{background:#fdeeee;border-color:#d66}
.badge{font-weight:700;margin-right:8px}.since{display:block;font-size:12px;color:#566}
td.yes{color:#1f7a3a;font-weight:600}td.no{color:#b02a2a;font-weight:600}
.verdict .sentence{font-weight:600}.verdict .next{display:block;margin-top:2px}
.verdict .detail{display:block;font-size:12px;color:#566}
"""

# yes/no columns: yes is green and no red, except where yes is the bad value, and where the
# value is a fact rather than a verdict (no colour).
BAD_WHEN_TRUE = frozenset({"frontend_bound"})
NOT_A_VERDICT = frozenset({"skipped_upload"})


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "" if math.isnan(value) else format(value, ".4g")
    if isinstance(value, Link):
        return value.text
    return str(value)


def _inline_html(text: str) -> str:
    """`code` and **bold**, the two Markdown marks the pages use."""
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def _html_cell(value: Any, column: str = "") -> str:
    if isinstance(value, Link):
        return f'<td><a href="{html.escape(value.href)}">{html.escape(value.text)}</a></td>'
    if isinstance(value, bool):
        if column in NOT_A_VERDICT:
            return f"<td>{_cell_text(value)}</td>"
        good = not value if column in BAD_WHEN_TRUE else value
        return f'<td class="{"yes" if good else "no"}">{_cell_text(value)}</td>'
    if isinstance(value, int | float):
        return f'<td class="num">{html.escape(_cell_text(value))}</td>'
    text = _cell_text(value)
    wide = ' class="long"' if len(text) > 60 else ""
    return f"<td{wide}>{_inline_html(text)}</td>"


def _html_table(t: Table) -> str:
    if not t.rows:
        return f"<p>{html.escape(t.empty)}</p>"
    cols = list(dict.fromkeys(k for r in t.rows for k in r))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_html_cell(r.get(c), c) for c in cols) + "</tr>"
                   for r in t.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _html_block(b: Block) -> str:
    if isinstance(b, Text):
        return f"<p>{_inline_html(b.text)}</p>"
    if isinstance(b, Bullets):
        return "<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in b.items) + "</ul>"
    if isinstance(b, Table):
        return _html_table(b)
    if isinstance(b, Figure):
        return (f'<figure><img class="plot" id="plot-{b.name}" alt="{html.escape(b.caption)}" '
                f'src="{_data_uri(b.png)}"><figcaption>{_inline_html(b.caption)}</figcaption>'
                "</figure>")
    state = "ready" if b.ready else "not-ready"
    if b.sentence:
        # the sentence opens with "Ready"/"Not ready" and the box's colour says it: no badge
        return (f'<div class="verdict {state}"><span class="sentence" '
                f'id="{b.element_id}-sentence">{_inline_html(b.sentence)}</span><span '
                f'class="next">{_inline_html(b.next_step)}</span><span class="detail">'
                f'readiness: <span id="{b.element_id}">{html.escape(b.text)}</span>, since '
                f"{html.escape(b.since)}</span></div>")
    return (f'<div class="verdict {state}"><span class="badge">'
            f'{"READY" if b.ready else "NOT READY"}</span><span id="{b.element_id}">'
            f'{html.escape(b.text)}</span><span class="since">since {html.escape(b.since)}'
            "</span></div>")


def to_html(page: Page) -> str:
    """One self-contained file: no stylesheet, script or image is fetched from anywhere."""
    parts = ['<!doctype html>\n<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html.escape(page.title)}</title><style>{CSS}</style></head>",
             f"<body><main><h1>{html.escape(page.title)}</h1>"]
    parts += [_html_block(b) for b in page.intro]
    for s in page.sections:
        parts.append(f'<section id="{s.anchor}"><h{s.level}>{html.escape(s.title)}'
                     f"</h{s.level}>")
        parts += [_html_block(b) for b in s.blocks]
        parts.append("</section>")
    parts.append("</main></body></html>\n")
    return "\n".join(parts)


def _md_block(b: Block) -> str:
    if isinstance(b, Text):
        return b.text
    if isinstance(b, Bullets):
        return "\n".join(f"- {i}" for i in b.items)
    if isinstance(b, Table):
        rows = [{k: (f"[{v.text}]({v.href})" if isinstance(v, Link) else v)
                 for k, v in r.items()} for r in b.rows]
        cols = list(dict.fromkeys(k for r in rows for k in r))
        return md_table(rows, columns=cols, empty=b.empty)
    if isinstance(b, Figure):
        return f"![{b.caption}]({_data_uri(b.png)})\n\n*{b.caption}*"
    if b.sentence:
        return f"**{b.sentence}** {b.next_step}\n\nreadiness: {b.text} (since {b.since})"
    return f"**{'READY' if b.ready else 'NOT READY'}**: {b.text} (since {b.since})"


def to_markdown(page: Page) -> str:
    parts = [f"# {page.title}", *(_md_block(b) for b in page.intro)]
    for s in page.sections:
        parts.append(f"{'#' * s.level} {s.title}")
        parts += [_md_block(b) for b in s.blocks]
    return "\n\n".join(parts) + "\n"


def when(ts: float | None) -> str:
    if ts is None:
        return "never"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _gb(n: int | None) -> str:
    return "" if n is None else f"{n:,} bytes ({n / 1e9:.3g} GB)"


# ---- the verdict and since when: what readiness_report stores ----


@dataclass(frozen=True)
class NodeVerdict:
    node_type: str
    ready: bool
    reasons: tuple[str, ...]
    config_hash: str
    since: float  # the readiness materialization that first had this ready/not-ready state


@dataclass(frozen=True, kw_only=True)
class ModelReport:
    """What `readiness_report` stores: the verdict the page shows, since when, and where the
    page is. `fleet_report` reads these, the next report carries `since` over from them."""

    model: str
    ready: bool
    summary: str  # Readiness.summary(), word for word
    reasons: tuple[str, ...]  # model-level: why no node type can be ready
    since: float
    nodes: tuple[NodeVerdict, ...]
    readiness_at: float  # the readiness materialization this report was made from
    html_path: str = ""

    def node(self, node_type: str) -> NodeVerdict | None:
        return next((n for n in self.nodes if n.node_type == node_type), None)


def carry_since(previous: ModelReport | None, readiness: Readiness, readiness_at: float
                ) -> ModelReport:
    """The verdict of `readiness`, each ready/not-ready state dated by the first readiness
    materialization that had it: the previous report's date while the state holds, else
    `readiness_at` (the reasons may change within a state; the page shows the current ones)."""
    def held(prev_ready: bool | None, prev_since: float | None, ready: bool) -> float:
        return prev_since if prev_ready is ready and prev_since is not None else readiness_at

    nodes = []
    for n in readiness.nodes:
        before = previous.node(n.node_type) if previous else None
        nodes.append(NodeVerdict(n.node_type, n.ready, n.reasons, n.config_hash,
                                 held(before.ready if before else None,
                                      before.since if before else None, n.ready)))
    return ModelReport(model=readiness.model, ready=readiness.ready,
                       summary=readiness.summary(), reasons=readiness.reasons,
                       since=held(previous.ready if previous else None,
                                  previous.since if previous else None, readiness.ready),
                       nodes=tuple(nodes), readiness_at=readiness_at)


# ---- what the model page is made of ----


@dataclass(frozen=True, kw_only=True)
class ManifestRow:
    """One rendered manifest file, with what its InferenceService says about its numbers."""

    node_type: str
    path: str
    service: str
    config_hash: str
    measured: bool
    published: bool
    valid: bool
    storage_uri: str = ""
    notes: dict[str, str] = field(default_factory=dict)  # model-onboarding.io/<name> -> text


ANNOTATION = "model-onboarding.io/"


def manifest_row(node_type: str, path: str, service: str, config_hash: str, measured: bool,
                 published: bool, valid: bool, text: str | None) -> ManifestRow:
    """The manifest's storageUri and its `model-onboarding.io/` annotations (where the
    startup probe, the throughput and the storage came from), read from the rendered YAML."""
    isvc = next((d for d in yaml.safe_load_all(text or "") if isinstance(d, dict)
                 and d.get("kind") == "InferenceService"), None) or {}
    model = isvc.get("spec", {}).get("predictor", {}).get("model", {})
    notes = {k.removeprefix(ANNOTATION): str(v) for k, v in
             (isvc.get("metadata", {}).get("annotations") or {}).items()
             if k.startswith(ANNOTATION)}
    return ManifestRow(node_type=node_type, path=path, service=service, config_hash=config_hash,
                       measured=measured, published=published, valid=valid,
                       storage_uri=str(model.get("storageUri", "")), notes=notes)


def read_sweep_csv(path: Path) -> tuple[dict[str, Any], ...]:
    """The sweep table serving_benchmark wrote, numbers as numbers (empty: none)."""
    if not path.is_file():
        return ()

    def value(text: str) -> Any:
        if text in ("True", "False"):
            return text == "True"
        if text == "":
            return None
        try:
            return float(text)
        except ValueError:
            return text

    with open(path, newline="") as f:
        return tuple({k: value(v) for k, v in row.items()} for row in csv.DictReader(f))


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    """Everything the model page shows; None where that stage never ran for the model."""

    model: str
    description: str
    verdict: ModelReport
    targets: tuple[str, ...]
    ladder: tuple[str, ...]
    gates: AccuracyGates | None = None
    checkpoint: CheckpointRef | None = None
    quantized: QuantizedSet | None = None
    accuracy: AccuracyReport | None = None
    serving_variant: VariantRef | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # precision -> why not served
    serving_plan: ServingPlan | None = None
    load_timing: LoadTimingResult | None = None
    benchmark: ServingBenchmarkResult | None = None
    slos: dict[str, Slo] = field(default_factory=dict)  # node type -> SLO there
    sweep_rows: tuple[dict[str, Any], ...] = ()
    sweep_source: str = ""
    published: dict[str, PublishedVariant] | None = None
    manifests: tuple[ManifestRow, ...] | None = None
    manifest_skipped: dict[str, str] = field(default_factory=dict)
    predictions: PredictionTable | None = None
    # fewer fully cold starts than this claim no p95 (configs/deploy.yaml probes.min_p95_samples)
    min_p95_samples: int = ProbeConfig.model_fields["min_p95_samples"].default


# ---- sections of the model page ----


def _verdict_section(f: ModelFacts) -> Section:
    v = f.verdict
    said, step = sentence(v.ready, v.reasons, [(n.node_type, n.ready, n.reasons)
                                               for n in v.nodes])
    blocks: list[Block] = [Verdict(v.ready, v.summary, when(v.since), sentence=said,
                                   next_step=step)]
    if v.reasons:
        blocks.append(Bullets(v.reasons))
    blocks.append(Table(tuple({
        "node_type": n.node_type, "ready": n.ready, "config_hash": n.config_hash or "",
        "why not": "; ".join(n.reasons), "since": when(n.since)} for n in v.nodes),
        empty="no node type was judged (see the reasons above)"))
    blocks.append(Text(f"From the `readiness` materialization of {when(v.readiness_at)}: ready "
                       "on a node type means the accuracy gate passed, the SLOs were met at "
                       "exactly the configuration its manifest deploys (same hash, measured on "
                       "that node type, judged as a blocking gate), its fully cold start "
                       "was within budget at the same configuration, the weights were "
                       "published and verified, and the manifest validated."))
    return Section("Verdict", tuple(blocks), "verdict-section")


def _fetched_section(f: ModelFacts) -> Section:
    c = f.checkpoint
    if c is None:
        return Section("What was fetched", (Text(
            "Nothing: `checkpoint` was never materialized for this model (a plan-only catalog "
            "entry, or onboarding has not fetched it yet)."),), "fetched")
    return Section("What was fetched", (Table(({
        "source": c.source, "revision": c.revision, "bytes": _gb(c.total_bytes),
        "files": len(c.files), "content_hash": c.content_hash, "cache_path": c.path},)),
        Text("From `checkpoint`: every file's size and sha256 verified against what the source "
             "recorded, then renamed into the NVMe cache.")), "fetched")


def _allowed_drop(row: dict, gates: AccuracyGates | None) -> float | None:
    if row.get("allowed_drop") is not None:
        return float(row["allowed_drop"])
    if gates is None:
        return None
    tol = gates.tolerance_for(row["task"])
    return min(tol.max_abs_drop, tol.max_rel_drop * abs(float(row["baseline"])))


def drop_points(report: AccuracyReport, gates: AccuracyGates | None
                ) -> tuple[list[DropPoint], list[dict[str, Any]]]:
    """Per task and quantized variant: the drop (baseline - variant) with its interval, as plot
    points and table rows. The interval is the gate's own (`drop_low`/`drop_high`) when the
    report carries one, else the drop +- z standard errors of the paired differences."""
    z = float(getattr(gates, "z", 1.645) or 1.645)
    points, rows = [], []
    for r in report.rows:
        if r["precision"] == "bf16":
            continue
        drop = -float(r["delta"])
        if r.get("drop_low") is not None and r.get("drop_high") is not None:
            low, high, basis = float(r["drop_low"]), float(r["drop_high"]), "the gate's interval"
        else:
            se = float(r.get("se_delta") or 0.0)
            low, high, basis = drop - z * se, drop + z * se, f"drop ± {z:g} x paired SE"
        allowed = _allowed_drop(r, gates)
        verdict = str(r.get("verdict") or ("pass" if r["passed"] else "fail"))
        points.append(DropPoint(task=r["task"], precision=r["precision"], drop_pts=100 * drop,
                                low_pts=100 * low, high_pts=100 * high,
                                allowed_pts=100 * allowed if allowed is not None else math.nan,
                                verdict=verdict))
        rows.append({"task": r["task"], "metric": r.get("metric"), "precision": r["precision"],
                     "n": r.get("n"), "baseline": r.get("baseline"), "variant": r.get("variant"),
                     "drop_pts": 100 * drop, "low_pts": 100 * low, "high_pts": 100 * high,
                     "allowed_pts": 100 * allowed if allowed is not None else None,
                     "verdict": verdict, "interval": basis})
    return points, rows


def _accuracy_section(f: ModelFacts) -> Section:
    blocks: list[Block] = []
    if f.quantized is not None:
        blocks.append(Table(tuple({
            "precision": v.precision, "usable": v.usable, "total_bytes": v.total_bytes or None,
            "weight_bytes": v.stats.get("weight_bytes"),
            "compression_ratio": v.stats.get("compression_ratio"),
            "content_hash": v.content_hash[:16], "problem": v.error or ""}
            for v in f.quantized.variants), empty="no quantized precision in the ladder"))
        blocks.append(Text(f"From `quantized` (baseline {_gb(f.quantized.baseline_bytes)}); "
                           "each export checked by dequantizing it independently of Model "
                           "Optimizer."))
    else:
        blocks.append(Text("No variants: `quantized` was never materialized for this model."))
    if f.accuracy is None:
        blocks.append(Text("No accuracy result: `accuracy` was never materialized."))
        return Section("Variants and accuracy", tuple(blocks), "accuracy")
    points, rows = drop_points(f.accuracy, f.gates)
    if points:
        blocks.append(Figure("accuracy", accuracy_png(points, f"{f.model}: accuracy lost per "
                                                      "task and variant"),
                             "Drop from the bf16 baseline per task and variant (points), with "
                             "its interval; dashed: the allowed drop, shaded: beyond it."))
    blocks.append(Table(tuple(rows), empty="no quantized variant was evaluated"))
    blocks.append(Bullets(tuple(
        f"{g.precision}: {getattr(g, 'verdict', '') or ('pass' if g.passed else 'fail')} "
        f"({getattr(g, 'source', 'in_process')} score): {g.reason}" for g in f.accuracy.gates)))
    blocks.append(Text("From `accuracy`: lm-eval on the same items for the baseline and each "
                       "variant; the drop's standard error from the per-item differences; "
                       "allowed drop = min(max_abs_drop, max_rel_drop x baseline) of "
                       "configs/gates.yaml unless the report carries its own."))
    return Section("Variants and accuracy", tuple(blocks), "accuracy")


def gates_table(gates: Sequence[Any]) -> str:
    """The accuracy decision per precision as a Markdown table (the `gates` metadata in the UI):
    verdict, which score decided, items judged, and the reason in words."""
    return md_table(({"precision": g.precision,
                      "verdict": getattr(g, "verdict", "") or ("pass" if g.passed else "fail"),
                      "decided by": f"{getattr(g, 'source', 'in_process')} score",
                      "items": getattr(g, "items", 0) or None,
                      "reason": g.reason} for g in gates), empty="no precision was judged")


def _precision_section(f: ModelFacts) -> Section:
    served = f.serving_variant.precision if f.serving_variant else None
    rows, reached = [], True
    for p in f.ladder:
        if p == served:
            rows.append({"precision": p, "outcome": "served", "why": "first rung that passed "
                         "its export check and accuracy gate" if p != "bf16"
                         else "the baseline: every earlier rung was skipped"})
            reached = False
        elif reached and p in f.skipped:
            rows.append({"precision": p, "outcome": "skipped", "why": f.skipped[p]})
        else:
            rows.append({"precision": p, "outcome": "not reached" if not reached else "unknown",
                         "why": "an earlier rung serves" if not reached else
                         "no gate result for it"})
    head = (f"Ladder {' → '.join(f.ladder)}: serves **{served}** "
            f"({_gb(f.serving_variant.weight_bytes or f.serving_variant.total_bytes)}, content "
            f"{f.serving_variant.content_hash[:16]})." if f.serving_variant else
            f"Ladder {' → '.join(f.ladder)}: nothing serves (`serving_variant` never "
            "materialized or failed).")
    return Section("Which precision serves, and why", (Text(head), Table(tuple(rows))),
                   "precision")


def _at(result: Any, node_type: str, config_hash: str) -> bool:
    return (result is not None and getattr(result, "node_type", "") == node_type
            and getattr(result, "config_hash", "") == config_hash)


def _measured_blocks(f: ModelFacts) -> list[Block]:
    """Start times and the sweep, where and at which configuration they were measured."""
    blocks: list[Block] = []
    t, b = f.load_timing, f.benchmark
    if t is not None:
        where = f"`load_timing` on {t.node_type or '?'} at configuration {t.config_hash or '-'}"
        if not t.servable and t.cold_start_p50_s is None:
            blocks.append(Text(f"Start times: not measured ({where}): {t.reason}"))
        else:
            phases = [("fully_cold", t.cold_start_p50_s, t.cold_start_p95_s),
                      ("cold_weights", t.cold_weights_p50_s, t.cold_weights_p95_s),
                      ("warm", t.warm_start_p50_s, None)]
            budget = f.slos.get(t.node_type).cold_start_p95_max_s if t.node_type in f.slos \
                else None
            blocks.append(Figure("starts", starts_png(phases, f"{f.model} ({t.precision}) on "
                                                      f"{t.node_type}: starts", budget),
                                 f"Start to first token per kind of start, {where}"
                                 + (f"; dashed: the cold-start budget {budget:g} s" if budget
                                    else "")))
            n_cold = getattr(t, "cold_start_samples", 0)
            blocks.append(Table(tuple({"start": k, "p50_s": p50, "p95_s": p95,
                                       "n": n_cold if k == "fully_cold" and n_cold else "",
                                       "source": where + (
                                           f" (p95 of n={n_cold}: fewer than "
                                           f"{f.min_p95_samples} starts)"
                                           if k == "fully_cold"
                                           and 0 < n_cold < f.min_p95_samples else "")}
                                      for k, p50, p95 in phases)))
            def gbps(v: float | None) -> str:
                return "(not measured)" if v is None else f"{v:.3g} GB/s"

            blocks.append(Text(f"Weights {_gb(t.weight_bytes)} loaded at "
                               f"{gbps(t.weights_load_gbps)} (raw sequential read "
                               f"{gbps(t.raw_read_gbps)}), precision measured {t.precision}"
                               + (f"; {t.reason}" if t.reason else "") + "."))
            blocks += _kernel_blocks(t)
    if b is not None:
        blocks += _benchmark_blocks(f, b)
    return blocks


def _kernel_blocks(t: LoadTimingResult) -> list[Block]:
    """The kernels each start ran, as the engine's log named them, and the gate's reading."""
    starts, v = getattr(t, "kernels", ()), getattr(t, "kernel_verdict", None)
    if not starts:
        return [Text("Kernels: not read (this load timing predates the kernel facts).")]
    blocks: list[Block] = [Table(tuple(facts_table(starts)))]
    if v is not None:
        status = {True: "pass", False: "FAIL", None: "not judged"}[v.passed]
        blocks.append(Text(f"Kernel gate ({status}): {v.summary}."))
        if v.problems:
            blocks.append(Bullets(v.problems))
    return blocks


def _benchmark_blocks(f: ModelFacts, b: ServingBenchmarkResult) -> list[Block]:
    where = f"`serving_benchmark` on {b.node_type} at configuration {b.config_hash or '-'}"
    slo = f.slos.get(b.node_type)
    gate = "a blocking gate" if b.slo_blocking else "a warning only (a stand-in profile)"
    # no GPU (the CPU engine): the throughput is the process's, not per GPU
    per = "tokens_per_s_per_gpu" if b.gpus else "tokens_per_s (no GPU)"
    blocks: list[Block] = [Table(({
        "precision_measured": b.precision, "gpus": b.gpus,
        per: b.tokens_per_s_per_gpu,
        "saturation_concurrency": b.saturation_concurrency, "slo_pass": b.slo_pass,
        "slo_judged_as": gate, "source": where},))]
    if b.slo_violations:
        blocks.append(Bullets(tuple(b.slo_violations)))
    if f.sweep_rows:
        blocks.append(Figure("curves", curves_png(
            f.sweep_rows, f"{f.model} ({b.precision}) on {b.node_type}",
            slo.ttft_p95_s if slo else None, slo.itl_mean_ms if slo else None,
            slo.target_concurrency if slo else None),
            f"Latency-throughput per scenario, {where}, from {f.sweep_source}; dashed: the "
            f"SLOs (TTFT p95, mean ITL), dotted/ringed: the target concurrency"
            + (f" {slo.target_concurrency}" if slo else "")))
        cols = ("scenario", "load", "output_tokens_per_s", "ttft_p95_s", "itl_mean_ms",
                "tpot_mean_ms", "error_rate", "meets_slo", "frontend_cpu_cores",
                "frontend_bound")
        blocks.append(Table(tuple({c: r.get(c) for c in cols} for r in f.sweep_rows)))
        if bound := frontend_bound_points(f.sweep_rows):
            blocks.append(Text(FRONTEND_ADVICE.format(cores=FRONTEND_BOUND_CORES)))
            blocks.append(Bullets(tuple(
                f"{r['scenario']} @ {r['load']:g}: frontend-bound, its API server at "
                f"{r['frontend_cpu_cores']:.2f} of a core" for r in bound)))
    else:
        blocks.append(Text(f"No sweep table at {f.sweep_source or 'the reports directory'}."))
    return blocks


def _plan_node(f: ModelFacts, node_type: str) -> NodePlan | None:
    if f.serving_plan is None:
        return None
    return next((n for n in f.serving_plan.plan.nodes if n.node_type == node_type), None)


def _predicted(f: ModelFacts, node_type: str, precision: str, tp: int | None) -> Any:
    if f.predictions is None:
        return None
    return next((r for r in f.predictions.rows
                 if (r.prediction.prediction.request.node_type,
                     r.prediction.prediction.request.precision,
                     r.prediction.prediction.request.tensor_parallel)
                 == (node_type, precision, tp) and r.prediction.covered), None)


def node_numbers(f: ModelFacts, node_type: str, config: EngineConfig) -> list[dict[str, Any]]:
    """The numbers a node type's deployment rests on, each with where it came from."""
    node, ev = _plan_node(f, node_type), evidence(config, f.load_timing, f.benchmark)
    inputs = f.serving_plan.plan.inputs if f.serving_plan else None
    rows: list[dict[str, Any]] = [
        {"quantity": "tensor parallel", "value": config.tensor_parallel,
         "source": node.tp_basis if node else "serving_config"},
        {"quantity": "max-num-seqs", "value": config.max_num_seqs,
         "source": "plan (target concurrency or the SLA choice)"}]
    if node is not None:
        rows.append({"quantity": "weights", "value": _gb(node.weight_bytes),
                     "source": "measured: the variant's files" if node.weight_basis ==
                     "measured" else f"estimate: parameters ({inputs.param_count_origin}) x "
                     f"bytes per parameter of {node.precision} (configs/nodes.yaml)"})
        rows.append({"quantity": "KV cache per GPU (GiB)",
                     "value": (node.kv_bytes_per_gpu or 0) / GIB,
                     "source": f"rule: {inputs.target_concurrency} sequences x "
                     f"{inputs.context_tokens} tokens x KV bytes per token (plan.py)"})
    n = ev.cold_start_samples
    rows.append({"quantity": "cold start p95 (s)", "value": ev.cold_start_p95_s,
                 "source": ev.basis + (f" (n={n}: fewer than {f.min_p95_samples} starts, so "
                                       "the startup probe is sized from their maximum)"
                                       if n and n < f.min_p95_samples else "")
                 if ev.cold_start_p95_s is not None else
                 f"{ev.basis}: the startup probe uses configs/deploy.yaml's default"})
    pred = _predicted(f, node_type, config.precision, config.tensor_parallel)
    if ev.tokens_per_s_per_gpu is not None:
        rows.append({"quantity": "tokens/s/GPU", "value": ev.tokens_per_s_per_gpu,
                     "source": ev.basis})
    elif pred is not None:
        p = pred.prediction
        rows += [{"quantity": "tokens/s/GPU", "value": p.tokens_per_s_per_gpu,
                  "source": p.basis},
                 {"quantity": "TTFT (ms)", "value": p.ttft_ms, "source": p.basis},
                 {"quantity": "TPOT (ms)", "value": p.tpot_ms, "source": p.basis}]
    else:
        rows.append({"quantity": "tokens/s/GPU", "value": None,
                     "source": f"absent: {ev.basis}; no covered prediction"})
    if ev.slo_pass is not None:
        gate = "blocking" if f.benchmark and f.benchmark.slo_blocking else "warning only"
        rows.append({"quantity": "SLO at target concurrency",
                     "value": "pass" if ev.slo_pass else "fail",
                     "source": f"{ev.basis} ({gate})"})
    elif pred is not None:
        rows.append({"quantity": "SLO at target concurrency (predicted)",
                     "value": "-" if pred.slo_pass is None else
                     ("pass" if pred.slo_pass else "fail"), "source": pred.slo_why})
    else:
        rows.append({"quantity": "SLO at target concurrency", "value": "not checked",
                     "source": ev.basis})
    return rows


def _manifest(f: ModelFacts, node_type: str) -> ManifestRow | None:
    return next((m for m in f.manifests or () if m.node_type == node_type), None)


def _node_section(f: ModelFacts, node_type: str) -> list[Section]:
    v = f.verdict.node(node_type)
    blocks: list[Block] = []
    if v is not None:
        said, step = sentence(v.ready, (), [(node_type, v.ready, v.reasons)])
        blocks.append(Verdict(v.ready, "ready" if v.ready else "not ready: "
                              + "; ".join(v.reasons), when(v.since), f"verdict-{node_type}",
                              said, step))
    else:
        blocks.append(Verdict(False, "not ready: " + "; ".join(f.verdict.reasons),
                              when(f.verdict.since), f"verdict-{node_type}"))
    config = f.serving_plan.config(node_type) if f.serving_plan else None
    if config is None:
        why = (f.serving_plan.skipped.get(node_type, "not in the plan") if f.serving_plan
               else "`serving_config` was never materialized")
        blocks.append(Text(f"No serving configuration: {why}"))
        return [Section(node_type, tuple(blocks), f"node-{node_type}")]
    blocks.append(Table(({**config.summary(), "image": config.image},)))
    if config.never_measured:
        blocks.append(Text(config.never_measured))
    blocks.append(Table(tuple(node_numbers(f, node_type, config))))
    m = _manifest(f, node_type)
    if m is not None:
        blocks.append(Table(({"manifest": m.path, "storageUri": m.storage_uri,
                              "published": m.published, "measured_at_config": m.measured,
                              "valid": m.valid},)))
        blocks.append(Bullets(tuple(f"{k}: {m.notes[k]}" for k in
                                    ("configuration", "startup-probe", "throughput", "storage")
                                    if k in m.notes)))
    elif node_type in f.manifest_skipped:
        blocks.append(Text(f"No manifest: {f.manifest_skipped[node_type]}"))
    if f.predictions is not None:
        rows = [r for r in f.predictions.table_rows(node_type)
                if r["precision"] == config.precision]
        if rows:
            blocks.append(Text(f"Predicted at {f.predictions.input_tokens} input / "
                               f"{f.predictions.output_tokens} output tokens, concurrency "
                               f"{f.predictions.concurrency} (`predictions`):"))
            blocks.append(Table(tuple(rows)))
    out = [Section(node_type, tuple(blocks), f"node-{node_type}")]
    if _at(f.benchmark, node_type, config.hash) or _at(f.load_timing, node_type, config.hash):
        out.append(Section(f"{node_type}: measured at configuration {config.hash}",
                           tuple(_measured_blocks(f)), f"measured-{node_type}", level=3))
    return out


def _measured_elsewhere(f: ModelFacts) -> list[Section]:
    """Measurements taken where no target node type's configuration was (the CPU stand-in)."""
    if f.load_timing is None and f.benchmark is None:
        return [Section("Measured", (Text("Nothing measured: `load_timing` and "
                                          "`serving_benchmark` never ran for this model."),),
                        "measured")]
    configs = f.serving_plan.configs if f.serving_plan else {}
    at_target = any(_at(r, nt, configs[nt].hash) for nt in f.targets if nt in configs
                    for r in (f.load_timing, f.benchmark))
    if at_target:
        return []
    where = (f.benchmark or f.load_timing).node_type
    return [Section(f"Measured on {where} (not a target node type's configuration)", (
        Text("These numbers count for no manifest: they were taken on the engine at hand, at "
             "a configuration no target node type deploys."), *_measured_blocks(f)),
        "measured")]


def _plan_section(f: ModelFacts) -> Section:
    if f.serving_plan is None:
        return Section("Plan", (Text("No plan: `serving_config` was never materialized."),),
                       "plan")
    i = f.serving_plan.plan.inputs
    rows = plan_rows(f.serving_plan.plan)
    engines = tuple(f"{c.node_type}: engine {c.reason}" for c in f.serving_plan.engines)
    return Section("Plan (every node type)", (
        Table(tuple({k: v for k, v in r.items() if k != "reason"} for r in rows)),
        Bullets(tuple(f"{r['node_type']}: {r['reason']}" for r in rows) + engines),
        Text(f"From `serving_config`: weights + KV cache ({i.target_concurrency} sequences x "
             f"{i.context_tokens} tokens) + reserve against each GPU's memory at "
             f"{i.gpu_memory_utilization:.2f} utilization; model shape from {i.shape.origin}; "
             f"parameters from {i.param_count_origin}."), *_search_blocks(f.serving_plan)),
        "plan")


def _search_blocks(splan: ServingPlan) -> list[Block]:
    """Each recorded configuration search of the model: its table (per candidate: predicted or
    by rule, verdict, n, headroom, chosen), the margin, and whether the plan applied it."""
    out: list[Block] = []
    applied = dict(getattr(splan, "search_notes", ()))
    for r in getattr(splan, "searched", ()):
        out += [Text(f"Configuration search on {r.node_type}: {r.candidates} candidates "
                     f"measured ({r.crashed} crashed), order: {r.basis}. "
                     f"{applied.get(r.node_type, 'no planned node type: the engine at hand starts it where its configuration matches')}."),
                Table(tuple(r.table)), Text(f"Margin: {r.margin}")]
    return out


def _manifests_section(f: ModelFacts) -> Section:
    if f.manifests is None:
        return Section("Manifests", (Text("No manifest: `kserve_manifest` was never "
                                          "materialized."),), "manifests")
    rows = tuple({"node_type": m.node_type, "service": m.service, "path": m.path,
                  "storageUri": m.storage_uri, "published": m.published,
                  "measured_at_config": m.measured, "config_hash": m.config_hash,
                  "valid": m.valid} for m in f.manifests)
    blocks: list[Block] = [Table(rows)]
    if f.manifest_skipped:
        blocks.append(Bullets(tuple(f"{k}: no manifest: {v}"
                                    for k, v in sorted(f.manifest_skipped.items()))))
    if f.published:
        blocks.append(Table(tuple({"precision": p, "uri": v.uri, "bytes": v.total_bytes,
                                   "files": v.files, "skipped_upload": v.skipped,
                                   "read_gbps": v.read_gbps}
                                  for p, v in sorted(f.published.items()))))
    return Section("Manifests", tuple(blocks), "manifests")


def model_page(f: ModelFacts) -> Page:
    intro: list[Block] = [Text(f.description)] if f.description else []
    sections = [_verdict_section(f), _fetched_section(f), _accuracy_section(f),
                _precision_section(f)]
    for nt in f.targets:
        sections += _node_section(f, nt)
    sections += _measured_elsewhere(f)
    sections += [_plan_section(f), _manifests_section(f)]
    return Page(f"Readiness of {f.model}", tuple(intro), tuple(sections))


# ---- the fleet page ----


@dataclass(frozen=True)
class NodeAcceptanceRow:
    """A node's latest acceptance (the `node_acceptance` value, as far as shown)."""

    node: str
    node_type: str
    qualified: bool
    reasons: tuple[str, ...]
    accepted_at: float | None
    phases: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class FleetEntry:
    model: str
    plan_only: bool
    reports: Mapping[str, ModelReport] = field(default_factory=dict)  # node type -> its cell's
    hrefs: Mapping[str, str] = field(default_factory=dict)  # node type -> the cell's page


@dataclass(frozen=True, kw_only=True)
class FleetRow:
    model: str
    node_type: str
    ready: bool
    why: str
    since: float | None
    config_hash: str
    href: str
    plan_only: bool = False  # a plan-only entry: never judged, by design


@dataclass(frozen=True)
class FleetReport:
    """What `fleet_report` stores: one row per catalogued model x target node type."""

    rows: tuple[FleetRow, ...]
    html_path: str = ""
    nodes: tuple[NodeAcceptanceRow, ...] | None = None

    def ready_models(self) -> list[str]:
        return sorted({r.model for r in self.rows if r.ready})


def fleet_rows(entries: Iterable[FleetEntry], node_types: Sequence[str]) -> tuple[FleetRow, ...]:
    """One row per model x node type: each cell's own verdict, never another cell's."""
    rows = []
    for e in sorted(entries, key=lambda e: e.model):
        for nt in node_types:
            r, href = e.reports.get(nt), e.hrefs.get(nt, "")
            n = r.node(nt) if r else None
            if r is None:
                why = ("never judged: a plan-only catalog entry is never fetched, so it has no "
                       "readiness" if e.plan_only else "never judged: no readiness_report of "
                       "this cell yet")
                rows.append(FleetRow(model=e.model, node_type=nt, ready=False, why=why, since=None,
                                     config_hash="", href=href, plan_only=e.plan_only))
            elif n is None:
                why = "; ".join(r.reasons) or "no verdict for this node type"
                rows.append(FleetRow(model=e.model, node_type=nt, ready=False, why=why,
                                     since=r.since, config_hash="", href=href))
            else:
                why = ("every gate holds at the deployed configuration" if n.ready
                       else "; ".join(n.reasons))
                rows.append(FleetRow(model=e.model, node_type=nt, ready=n.ready, why=why,
                                     since=n.since, config_hash=n.config_hash, href=href))
    return tuple(rows)


def _nodes_section(nodes: Sequence[NodeAcceptanceRow] | None) -> Section:
    if nodes is None:
        return Section("GPU nodes", (Text(
            "No node acceptance to show: no GPU node is registered (the `nodes` partitions of "
            "`node_acceptance` are empty, or that asset is not in this code location); node "
            "verdicts appear here when there are some (docs/report.md)."),), "nodes")
    rows = tuple({"node": n.node, "node_type": n.node_type, "qualified": n.qualified,
                  "phases": ", ".join(f"{p.get('phase')}: {p.get('verdict')}" for p in n.phases),
                  "why not": "; ".join(n.reasons), "accepted": when(n.accepted_at)}
                 for n in sorted(nodes, key=lambda n: n.node))
    return Section("GPU nodes", (Table(rows, empty="no node has been through acceptance"),
                                 Text("From each node's latest `node_acceptance` (the go/no-go "
                                      "per phase; a check that could not run is never a pass)."
                                      )), "nodes")


def cell_mark(r: FleetRow) -> str:
    """One grid cell in a word: ready, not ready, never judged or plan only."""
    if r.plan_only:
        return "plan only"
    if r.since is None and not r.ready:
        return "never judged"
    return "ready" if r.ready else "not ready"


def readiness_grid(report: FleetReport, node_types: Sequence[str]) -> tuple[dict, ...]:
    """Models as rows, node types as columns, each cell's verdict in a word."""
    by = {(r.model, r.node_type): r for r in report.rows}
    return tuple({"model": m, **{nt: cell_mark(by[(m, nt)]) if (m, nt) in by else "" for nt
                                 in node_types}}
                 for m in sorted({r.model for r in report.rows}))


def fleet_page(report: FleetReport, targets: Sequence[str]) -> Page:
    ready = report.ready_models()
    models = sorted({r.model for r in report.rows})
    table = tuple({"model": Link(r.model, r.href) if r.href else r.model,
                   "node_type": r.node_type, "ready": "plan only" if r.plan_only else r.ready,
                   "why": r.why,
                   "since": when(r.since) if r.since is not None else "",
                   "config_hash": r.config_hash} for r in report.rows)
    intro = (Text(f"{len(ready)} of {len(models)} catalogued models ready on at least one "
                  f"node type ({', '.join(targets)}): {', '.join(ready) or 'none'}."),)
    return Page("Fleet readiness", intro, (
        Section("Readiness grid", (Table(readiness_grid(report, targets),
                                         empty="no model in the catalog"), Text(
            "One cell per (model, node type): its own measurements and verdict; measuring a "
            "model on one node type never changes another cell.")), "grid"),
        Section("Models x node types", (Table(table, empty="no model in the catalog"), Text(
            "Each row from the cell's latest `readiness_report` (its verdict comes from the "
            "cell's `readiness`); since: the readiness materialization that first had this "
            "ready/not-ready state.")), "models"),
        _nodes_section(report.nodes)))
