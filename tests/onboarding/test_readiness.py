"""Ready means every gate at the deployed configuration: accuracy, SLOs measured at exactly the
manifest's hash on its node type and judged as a gate, published weights, a valid manifest."""

from __future__ import annotations

import dataclasses

from onboarding.common.refs import VariantRef
from onboarding.deploy.readiness import ManifestFacts, judge
from onboarding.serving.stats import ServingBenchmarkResult

VARIANT = VariantRef("m", "fp8", "/c/fp8", 10, "h", 8)
GOOD = ManifestFacts(True, {"h200": "aaaaaaaaaaaa", "b300": "bbbbbbbbbbbb"},
                     {"h200": True, "b300": True})
BENCH = ServingBenchmarkResult("m", "fp8", "h200", 1, True, 900.0, 32, True,
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
