"""A source checkpoint that is not bf16 (DeepSeek-R1 ships block-scaled FP8) is planned and
deployed as what it is: the catalog's `source_precision`, validated against the ladder, is the
ungated baseline of the plan and the precision whose manifest points at the source itself."""

from __future__ import annotations

import pytest

from onboarding.common.errors import ConfigError
from onboarding.deploy.kserve import source_precision
from onboarding.deploy.plan import Measured, plan, plan_inputs, shape_from_hint
from onboarding.deploy.serving_plan import render_targets, serving_plan
from onboarding.fetch.catalog import ModelSpec
from tests.onboarding.test_kserve import CATALOG, DEPLOY, NODES, STACK


def _plan(spec: ModelSpec, measured: Measured | None = None):
    shape = shape_from_hint(spec.architecture, f"catalog {spec.id}")
    return plan(plan_inputs(spec, NODES, shape, measured or Measured()), NODES)


def test_the_catalog_declares_deepseek_r1_fp8_at_source():
    assert CATALOG["deepseek-r1"].source_precision == "fp8"
    assert all(s.source_precision == "bf16" for k, s in CATALOG.items() if k != "deepseek-r1")


def test_a_ladder_wider_than_the_source_is_refused_with_what_to_do():
    body = CATALOG["deepseek-r1"].model_dump()
    body["precision_ladder"] = ["fp8", "bf16"]
    with pytest.raises(ValueError, match=r"lists bf16, wider than source_precision fp8.*remove"):
        ModelSpec.model_validate(body)
    body["source_precision"] = "int4"
    with pytest.raises(ValueError, match="source_precision"):
        ModelSpec.model_validate(body)


def test_the_source_precision_needs_no_gate():
    """An accuracy gate that passed nothing leaves the source's own weights servable: for a
    bf16 source that is bf16, for DeepSeek-R1 fp8 (H200 serves fp8 natively)."""
    r1 = _plan(CATALOG["deepseek-r1"], Measured(passed_precisions=()))
    h200 = r1.node("h200")
    assert h200.feasible and h200.precision == "fp8", h200.reason
    assert r1.inputs.source_precision == "fp8"


def test_a_plan_only_fp8_source_deploys_from_the_source_not_a_variant_nobody_published():
    spec = CATALOG["deepseek-r1"]
    p = _plan(spec)
    splan = serving_plan(spec, p, NODES, STACK)
    rendered, _ = render_targets(spec, splan, NODES, STACK, DEPLOY, None)
    fp8 = [r for r in rendered if splan.config(r.node_type).precision == "fp8"]
    assert fp8
    for r in fp8:
        isvc = next(d for d in r.docs if d["kind"] == "InferenceService")
        uri = isvc["spec"]["predictor"]["model"]["storageUri"]
        assert uri == "hf://deepseek-ai/DeepSeek-R1", uri


def test_a_fetched_config_that_disagrees_with_the_catalog_is_a_clear_error():
    assert source_precision(None, "fp8") == "fp8"
    assert source_precision("fp8", "fp8") == "fp8"
    assert source_precision("bfloat16") == "bf16"
    with pytest.raises(ConfigError, match="Set source_precision: bf16"):
        source_precision("bfloat16", "fp8")
