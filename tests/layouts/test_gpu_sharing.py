"""A layout whose GPUs the device plugin time-slices (or shares through MPS) must still be
scheduled on its node: what gpu-feature-discovery labels and the device plugin advertises under
the rendered config, per NVIDIA k8s-device-plugin v0.20.0, against what the pods select and
request."""

from __future__ import annotations

import pytest
import yaml

from onboarding.layouts.render import SHARED_GPU, render_layout
from tests.onboarding.test_layout import CATALOG, CFG, INPUTS, NODES, planned
from tests.onboarding.test_layout_render import DEPLOY, STACK


def gfd_product_label(product: str, sharing: dict) -> str:
    """internal/lm/resource.go getProductName at v0.20.0: a replicated nvidia.com/gpu that is
    not renamed gets "-SHARED" appended to `nvidia.com/gpu.product`; renameByDefault (api/config/
    v1/replicas.go) renames it and leaves the product as it is."""
    for strategy in sharing.values():
        for r in strategy.get("resources", []):
            if r["name"] == "nvidia.com/gpu" and r.get("replicas", 1) > 1 \
                    and not strategy.get("renameByDefault") and not r.get("rename"):
                return f"{product}-SHARED"
    return product


def advertised(sharing: dict) -> str:
    """The resource name the device plugin advertises for the node's GPUs
    (consts.go DefaultSharedResourceNameSuffix ".shared" under renameByDefault)."""
    for strategy in sharing.values():
        for r in strategy.get("resources", []):
            if r["name"] == "nvidia.com/gpu" and strategy.get("renameByDefault"):
                return "nvidia.com/gpu.shared"
    return "nvidia.com/gpu"


@pytest.mark.parametrize("mode", ["time-slicing", "mps"])
def test_time_sliced_layout_pods_match_the_labels_and_resources_of_their_node(mode):
    plan = planned("b300-mixed")
    cfg = CFG.model_copy(update={"gpu_sharing": CFG.gpu_sharing.model_copy(
        update={"mode": mode})})
    r = render_layout(plan, CATALOG, INPUTS, cfg, NODES, STACK, DEPLOY)
    [cm] = r.gpu_sharing
    sharing = yaml.safe_load(cm["data"][plan.name])["sharing"]
    node = NODES.node_types[plan.node_type]
    label = gfd_product_label(node.gpu_product, sharing)
    resource = advertised(sharing)
    for model, docs in r.manifests.items():
        pred = next(d for d in docs if d["kind"] == "InferenceService")["spec"]["predictor"]
        assert pred["nodeSelector"]["nvidia.com/gpu.product"] == label, model
        req = pred["model"]["resources"]["requests"]
        assert "nvidia.com/gpu" not in req and resource in req, (model, req)
        assert pred["model"]["resources"]["limits"][resource] == req[resource]
    assert resource == SHARED_GPU
    # replicas are not distinct GPUs: a member with TP > 1 is a grant problem, not a surprise
    multi = [p.model for p in plan.placements if p.tensor_parallel > 1]
    assert multi and any(f"more than one {SHARED_GPU}" in g for g in r.grant_problems)


def test_a_mig_layout_keeps_whole_gpus_as_nvidia_com_gpu():
    """Under MIG the device plugin config is not rendered: whole GPUs stay nvidia.com/gpu."""
    r = render_layout(planned("h200-mixed"), CATALOG, INPUTS, CFG, NODES, STACK, DEPLOY)
    reqs = [next(d for d in docs if d["kind"] == "InferenceService")["spec"]["predictor"][
        "model"]["resources"]["requests"] for docs in r.manifests.values()]
    assert not any(SHARED_GPU in q for q in reqs)
    assert any("nvidia.com/gpu" in q for q in reqs)
