"""configs/search.yaml: validated, merged per node type."""

import dataclasses

import pytest

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.search_settings import load_search_file, rate_slo, search_settings

SEARCH = PROJECT_ROOT / "configs" / "search.yaml"


def test_the_shipped_file_loads_and_node_types_override_defaults():
    f = load_search_file(SEARCH)
    gpu, cpu = rate_slo(f, "b300"), rate_slo(f, "cpu")
    assert gpu.percentile == 99 and gpu.ttft_p_s == 2.0 and gpu.tpot_p_ms == 200
    assert cpu.percentile == 90 and cpu.target_rate_rps == 1.0 and cpu.confidence == 0.9
    s = search_settings(f, "cpu")
    assert s.max_candidates == 3 and s.max_num_seqs == [2, 4, 8]
    assert search_settings(f, "h200").budget_minutes == 60


@pytest.mark.parametrize("text,said", [
    ("rate_verdict: {defaults: {target_rate_rps: 1}}\nsearch: {defaults: {}}", "unset"),
    ("rate_verdict: {defaults: {}}\nsearch: {defaults: {}}\nextra: 1", "extra"),
    ("rate_verdict: {defaults: {}, node_types: {cpu: {percentile: 100}}}\nsearch: {defaults: {}}",
     "percentile"),
])
def test_a_bad_file_is_an_error_naming_the_field(tmp_path, text, said):
    p = tmp_path / "search.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=said):
        load_search_file(p)


def test_a_run_that_could_never_show_met_is_refused(tmp_path):
    p = tmp_path / "search.yaml"
    p.write_text(SEARCH.read_text().replace("max_seconds: 150", "max_seconds: 60"))
    with pytest.raises(ConfigError, match="every run would end undecided"):
        rate_slo(load_search_file(p), "cpu")


def test_the_models_own_rate_is_the_target_over_the_node_types(tmp_path):
    """A catalog entry's slo.target_rate_rps is the verdict's target rate on every node type
    (the traffic is the model's); the rest stays the node type's, and a rate whose runs could
    never show met is refused, naming the entry."""
    from onboarding.fetch.catalog import ModelSpec
    from onboarding.serving.profiles import load_slo_section, resolve_slo

    f = load_search_file(SEARCH)
    spec = ModelSpec.model_validate({"id": "m", "source": "s3://models/m/",
                                     "served_name": "m",
                                     "slo": {"target_rate_rps": 12.5, "ttft_p95_s": 1.0}})
    gpu = rate_slo(f, "h200", spec)
    assert gpu.target_rate_rps == 12.5 and gpu == dataclasses.replace(
        rate_slo(f, "h200"), target_rate_rps=12.5)
    assert rate_slo(f, "h200", spec.model_copy(update={"slo": spec.slo.model_copy(
        update={"target_rate_rps": None})})).target_rate_rps == 4.0
    # the judged SLO takes the entry's other fields and leaves the rate to the verdict
    slo = resolve_slo(load_slo_section(PROJECT_ROOT / "configs" / "gates.yaml"), "h200", spec)
    assert slo.ttft_p95_s == 1.0 and not hasattr(slo, "target_rate_rps")
    with pytest.raises(ConfigError, match="m's catalog entry slo.target_rate_rps.*undecided"):
        rate_slo(f, "cpu", spec.model_copy(update={"slo": spec.slo.model_copy(
            update={"target_rate_rps": 0.1})}))
