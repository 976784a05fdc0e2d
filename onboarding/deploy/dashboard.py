"""A Grafana dashboard per model and node type, built with Grafana's own typed builders
(`grafana-foundation-sdk`, generated from Grafana's schemas): the recording rules of the
deployment's PrometheusRule, with the SLO and the measured values drawn as threshold lines.

Why this library: it is Grafana Labs' maintained SDK, generated from the same schemas Grafana
validates dashboards by, so a panel option the server does not know fails at build time here.
grafanalib (the older community library) is hand-written and lags Grafana's panel model, and
grafonnet needs a Jsonnet toolchain. docs/operations.md has the comparison.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import common as gcommon
from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus as gprom
from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cmodels
from grafana_foundation_sdk.models import dashboard as dmodels

from onboarding.deploy.observability import RECORD_PREFIX, Operations, Target, selector

DATASOURCE = dmodels.DataSourceRef(type_val="prometheus", uid="${datasource}")


def _panel(title: str, unit: str, queries: list[tuple[str, str]],
           lines: list[tuple[float, str]]) -> timeseries.Panel:
    """A time series of `queries` (expr, legend) with a red threshold line at each value."""
    steps = [dmodels.Threshold(value=None, color="green")] + [
        dmodels.Threshold(value=v, color="red") for v, _ in sorted(lines)]
    panel = (timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE).height(8).span(12)
             .thresholds(gdash.ThresholdsConfig().mode(dmodels.ThresholdsMode.ABSOLUTE)
                         .steps(steps))
             .thresholds_style(gcommon.GraphThresholdsStyleConfig().mode(
                 cmodels.GraphTresholdsStyleMode.LINE)))
    if lines:
        panel = panel.description("; ".join(f"{v:g}: {why}" for v, why in lines))
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(gprom.Dataquery().expr(expr).legend_format(legend)
                                  .ref_id(chr(ord("A") + i)))
    return panel


def dashboard_builder(t: Target, ops: Operations, window: str) -> gdash.Dashboard:
    th = {x.name: x for x in ops.thresholds}

    def line(name: str) -> list[tuple[float, str]]:
        return [(th[name].value, th[name].source)] if name in th else []

    sel = "{" + selector(t) + "}"
    legend = "{{node_type}} {{precision}} TP{{tp}}"
    rec = f"{RECORD_PREFIX}:"
    return (
        gdash.Dashboard(f"{t.served_name} on {t.node_type}")
        .uid(f"mo-{t.service}"[:40]).tags(["model-onboarding", t.model, t.node_type])
        .refresh("30s").time("now-6h", "now")
        .with_variable(gdash.DatasourceVariable("datasource").type("prometheus"))
        .with_panel(_panel("TTFT", "s", [(f"{rec}ttft_seconds:p95_{window}{sel}", f"p95 {legend}"),
                                         (f"{rec}ttft_seconds:p99_{window}{sel}", f"p99 {legend}")],
                           line("ttft_p95_s") + line("ttft_p99_s")))
        .with_panel(_panel("Mean inter-token latency", "s",
                           [(f"{rec}itl_seconds:mean_{window}{sel}", legend)], line("itl_mean_s")))
        .with_panel(_panel("Requests in flight per engine", "short",
                           [(f"{rec}requests_in_flight:per_instance{sel}", "{{instance}}"),
                            (f"{rec}requests_waiting:sum{sel}", f"waiting {legend}")],
                           line("requests_in_flight_max") + line("queue_target_per_replica")))
        .with_panel(_panel("KV-cache usage", "percentunit",
                           [(f"{rec}kv_cache_usage:max{sel}", legend)],
                           line("kv_cache_usage_info") + line("kv_cache_usage_warning")
                           + line("kv_cache_usage_max")))
        .with_panel(_panel("Engines up", "short",
                           [(f"sum(up{sel})", "engines answering /metrics")], []))
    )


def render_dashboard(t: Target, ops: Operations, window: str) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (import it, or provision it)."""
    built = dashboard_builder(t, ops, window).build()
    return json.loads(json.dumps(built, cls=JSONEncoder))


def dashboard_queries(doc: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard's panels."""
    return [tgt["expr"] for p in doc.get("panels", []) for tgt in p.get("targets", [])
            if tgt.get("expr")]
