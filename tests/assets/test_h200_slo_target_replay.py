"""The SLO judged at its target concurrency on an H200 (tests/data/gpu/h200-slo-target/).

The sweep's CSV is what serving_benchmark wrote there; its verdict is recomputed here by the
asset's own `headline` from the points and must be the blocking check the run recorded, judged at
a concurrency the sweep measured (a sweep without 32 is judged at the next point above, never
below).
"""

from __future__ import annotations

from bench.gpu_recordings import MODEL, points, recorded, slo_target_sweep_rows
from onboarding.serving.stats import Slo, headline


def _slo_check() -> dict:
    step = next(b for s, b in recorded("slo_target", "onboard-B")["steps"].items() if MODEL in s.split())
    return next(c for c in step["checks"] if c["check"] == "slo_at_target_concurrency")


def test_the_slo_is_judged_at_its_target_which_the_sweep_measured():
    check = _slo_check()
    slo = Slo(**check["metadata"]["expected"])
    swept = points(slo_target_sweep_rows())
    assert set(swept) == {"chat", "rag", "codegen"}
    for scenario, pts in swept.items():
        assert slo.target_concurrency in [c for c, _ in pts], scenario
    result, _, violations = headline(MODEL, "bf16", "h200", 1, slo, swept, True)
    assert result.slo_pass == check["passed"], violations
    # the verdict is the target point's: every scenario's point at 32 within the SLO
    for scenario, pts in swept.items():
        at = dict(pts)[slo.target_concurrency]
        assert at.ttft_s.p95 <= slo.ttft_p95_s and at.itl_ms.mean <= slo.itl_mean_ms, scenario


def test_a_slower_target_point_would_have_failed_the_same_recording():
    """The rule can fail on this data: the same points with the SLO's TTFT p95 bound below the
    slowest target point's measured p95 must miss."""
    check = _slo_check()
    swept = points(slo_target_sweep_rows())
    worst = max(dict(p)[32].ttft_s.p95 for p in swept.values())
    strict = Slo(**{**check["metadata"]["expected"], "ttft_p95_s": worst * 0.9})
    result, _, violations = headline(MODEL, "bf16", "h200", 1, strict, swept, True)
    assert not result.slo_pass and violations
