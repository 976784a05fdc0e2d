"""Ready means every gate at the deployed configuration: accuracy, SLOs measured at exactly the
manifest's hash on its node type and judged as a gate, the cold start within its budget there,
published weights, a valid manifest."""

from __future__ import annotations

import dataclasses

from onboarding.common.refs import VariantRef
from onboarding.deploy.readiness import ManifestFacts, cold_start_budgets, judge
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult
from resources.config_files import ConfigFiles

VARIANT = VariantRef("m", "fp8", "/c/fp8", 10, "h", 8)
GOOD = ManifestFacts(True, {"h200": "aaaaaaaaaaaa", "b300": "bbbbbbbbbbbb"},
                     {"h200": True, "b300": True})
BENCH = ServingBenchmarkResult(model="m", precision="fp8", node_type="h200", gpus=1, servable=True,
                               tokens_per_s_per_gpu=900.0, saturation_concurrency=32, slo_pass=True,
                               config_hash="aaaaaaaaaaaa", slo_blocking=True)


def test_ready_where_every_gate_holds_at_the_deployed_configuration():
    r = judge("m", ["b300", "h200"], VARIANT, BENCH, GOOD)
    assert r.ready and r.summary() == "ready on h200"
    b300 = next(n for n in r.nodes if n.node_type == "b300")
    assert not b300.ready and "never measured at configuration bbbbbbbbbbbb on b300" in \
        b300.reasons[0]


def test_each_missing_gate_is_named():
    assert judge("m", ["h200"], None, BENCH, GOOD).reasons[0].startswith(
        "no precision passed its accuracy gate")
    other_hash = dataclasses.replace(BENCH, config_hash="cccccccccccc")
    r = judge("m", ["h200"], VARIANT, other_hash, GOOD)
    assert not r.ready and "(benchmarked h200 at cccccccccccc)" in r.nodes[0].reasons[0]
    stand_in = dataclasses.replace(BENCH, slo_blocking=False)
    assert "warning only" in judge("m", ["h200"], VARIANT, stand_in, GOOD).nodes[0].reasons[0]
    missed = dataclasses.replace(BENCH, slo_pass=False, slo_violations=("chat @ 32: ITL",))
    assert "SLOs missed: chat @ 32: ITL" in judge("m", ["h200"], VARIANT, missed,
                                                   GOOD).nodes[0].reasons
    unpublished = dataclasses.replace(GOOD, published={"h200": False})
    assert "not published" in judge("m", ["h200"], VARIANT, BENCH,
                                    unpublished).nodes[0].reasons[0]
    invalid = dataclasses.replace(GOOD, valid=False)
    assert "manifest invalid" in judge("m", ["h200"], VARIANT, BENCH, invalid).nodes[0].reasons[0]


# ---- the cold start at the deployed configuration ----

TIMING = LoadTimingResult(model="m", precision="fp8", servable=True, reason="",
                          cold_start_p50_s=41.0, cold_start_p95_s=55.2, warm_start_p50_s=12.3,
                          node_type="h200", config_hash="aaaaaaaaaaaa", cold_start_samples=3)
BUDGETS = {"h200": 120.0, "b300": 120.0}


def test_the_cold_start_is_a_criterion_at_the_deployed_configuration():
    """gates.yaml's `cold_start_p95_max_s` (a 70B model ready in 1-2 min) holds readiness:
    the fully cold p95 measured at exactly the manifest's hash and node type."""
    ok = judge("m", ["h200"], VARIANT, BENCH, GOOD, timing=TIMING, cold_start_budgets_s=BUDGETS)
    assert ok.ready
    slow = dataclasses.replace(TIMING, cold_start_p95_s=185.4)
    r = judge("m", ["h200"], VARIANT, BENCH, GOOD, timing=slow, cold_start_budgets_s=BUDGETS)
    assert not r.ready and r.nodes[0].reasons == (
        ("cold start p95 185 s over the 120 s budget (gates.yaml slo.cold_start_p95_max_s for "
         "h200; fully cold, n=3)"),)
    elsewhere = dataclasses.replace(TIMING, config_hash="cccccccccccc")
    r = judge("m", ["h200"], VARIANT, BENCH, GOOD, timing=elsewhere,
              cold_start_budgets_s=BUDGETS)
    assert r.nodes[0].reasons == (("cold start never measured at configuration aaaaaaaaaaaa "
                                   "on h200 (load-timed h200 at cccccccccccc)"),)
    assert not judge("m", ["h200"], VARIANT, BENCH, GOOD, cold_start_budgets_s=BUDGETS).ready
    none_cold = dataclasses.replace(TIMING, cold_start_p95_s=None, reason="page cache not "
                                    "evictable")
    assert "no fully cold start measured" in judge(
        "m", ["h200"], VARIANT, BENCH, GOOD, timing=none_cold,
        cold_start_budgets_s=BUDGETS).nodes[0].reasons[0]
    # no budget for the node type: no criterion (the caller resolves gates.yaml's)
    assert judge("m", ["h200"], VARIANT, BENCH, GOOD, timing=slow,
                 cold_start_budgets_s={"h200": None}).ready


def test_the_cpu_profile_is_judged_but_never_ready():
    """On the cpu profile the SLOs are a stand-in's warning: not ready whatever the cold start;
    the cold start is judged against the cpu node type's budget, the 120 s default (the shipped
    gates.yaml), and named only when it misses."""
    configs = ConfigFiles()
    spec = next(iter(configs.catalog().specs.values()))
    section = configs.slo_section()
    assert cold_start_budgets(section, spec, ["cpu"]) == {"cpu": 120.0}
    cpu = ManifestFacts(True, {"cpu": "c0ffee000cpu"}, {"cpu": True})
    bench = dataclasses.replace(BENCH, node_type="cpu", config_hash="c0ffee000cpu",
                                slo_blocking=False)
    timing = dataclasses.replace(TIMING, node_type="cpu", config_hash="c0ffee000cpu",
                                 cold_start_p95_s=39.3)
    r = judge("m", ["cpu"], VARIANT, bench, cpu, timing=timing,
              cold_start_budgets_s=cold_start_budgets(section, spec, ["cpu"]))
    assert not r.ready and r.nodes[0].reasons == (
        "SLOs judged as a warning only (a stand-in profile), not as a gate",)


def test_a_cells_failed_served_gate_for_the_serving_precision_keeps_it_not_ready():
    from onboarding.quantize.variants import GateOutcome, ServedAccuracyReport

    failed = ServedAccuracyReport(model="m", records=(), gates=(GateOutcome(
        precision="fp8", passed=False, reason="gsm8k drop beyond 0.02", source="served"),))
    r = judge("m", ["h200"], VARIANT, BENCH, GOOD, served=failed)
    assert not r.ready
    assert r.nodes[0].reasons == (
        "served accuracy gate of fp8 failed on h200: gsm8k drop beyond 0.02",)
    passed = ServedAccuracyReport(model="m", records=(), gates=(GateOutcome(
        precision="fp8", passed=True, reason="", source="served"),))
    assert judge("m", ["h200"], VARIANT, BENCH, GOOD, served=passed).ready
    # a gate of another precision says nothing of the one served
    other = ServedAccuracyReport(model="m", records=(), gates=(GateOutcome(
        precision="nvfp4", passed=False, reason="x", source="served"),))
    assert judge("m", ["h200"], VARIANT, BENCH, GOOD, served=other).ready


def test_a_cell_without_a_manifest_says_why_there_is_none():
    facts = ManifestFacts(True, {}, {}, {"cpu": "cpu is not a deployment target"})
    r = judge("m", ["cpu"], VARIANT, None, facts)
    assert r.nodes[0].reasons == ("no manifest: cpu is not a deployment target",)
