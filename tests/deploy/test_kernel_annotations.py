"""The manifest carries the kernels its measured starts ran, and the kernel gate's reading.

A load timing at exactly the manifest's configuration, whose start's kernels are read from a
recorded H200 vLLM 0.22.0 start of an FP8 variant (tests/data/gpu), reaches the
InferenceService's annotations; a manifest with nothing measured there carries none.
"""

from __future__ import annotations

from bench.gpu_recordings import folder
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.kserve import LABEL_PREFIX, RenderInputs, load_deploy, render, storage_for
from onboarding.deploy.plan import Measured, load_nodes, plan, plan_inputs, shape_from_hint
from onboarding.deploy.serving_plan import serving_plan
from onboarding.fetch.catalog import load_catalog
from onboarding.serving.engine_config import evidence
from onboarding.serving.kernels import StartKernels, judge, read_kernel_facts
from onboarding.serving.stack import load_stack
from onboarding.serving.stats import LoadTimingResult

CONFIGS = PROJECT_ROOT / "configs"
FP8_START = folder("stages") / "engine-logs/engine-llama-3-1-8b-instruct-twin-54287-1796071496.log"


def _annotations(with_timing: bool) -> dict[str, str]:
    nodes, deploy = load_nodes(CONFIGS / "nodes.yaml"), load_deploy(CONFIGS / "deploy.yaml")
    stack = load_stack(CONFIGS / "stack.yaml")
    spec = load_catalog(CONFIGS / "models")["llama-3-1-70b-instruct"]
    spec = spec.model_copy(update={"precision_ladder": ["fp8"]})
    p = plan(plan_inputs(spec, nodes, shape_from_hint(spec.architecture, spec.id), Measured()),
             nodes)
    config = serving_plan(spec, p, nodes, stack).config("h200")
    timing = None
    if with_timing:
        facts = read_kernel_facts(stack.templates[config.engine].kernel_facts,
                                  FP8_START.read_text().splitlines())
        starts = (StartKernels("fully_cold", facts), StartKernels("warm", facts))
        timing = LoadTimingResult(
            model=spec.id, precision=config.precision, servable=True, reason="",
            cold_start_p50_s=90.0, cold_start_p95_s=99.0,
            node_type="h200", config_hash=config.hash, kernels=starts,
            kernel_verdict=judge(nodes.kernel_gate, config.engine, config.precision,
                                 nodes.node_types["h200"].arch, starts))
    r = render(RenderInputs(spec=spec, plan=p, node_type="h200", node=nodes.node_types["h200"],
                            stack=stack, deploy=deploy, config=config,
                            evidence=evidence(config, timing, None),
                            storage=storage_for(spec, config.precision, "bf16", deploy, None)))
    isvc = next(d for d in r.docs if d["kind"] == "InferenceService")
    return isvc["metadata"]["annotations"]


def test_the_manifest_says_which_kernels_ran():
    a = _annotations(with_timing=True)
    kernels = a[f"{LABEL_PREFIX}/kernels"]
    assert "linear_kernel=CutlassFP8ScaledMMLinearKernel" in kernels
    assert "quantization=modelopt" in kernels and "kv_cache_dtype=fp8_e4m3" in kernels
    assert a[f"{LABEL_PREFIX}/kernel-gate"].startswith("fp8 on sm90 (vllm): native FP8")


def test_nothing_measured_claims_no_kernels():
    a = _annotations(with_timing=False)
    assert f"{LABEL_PREFIX}/kernels" not in a and f"{LABEL_PREFIX}/kernel-gate" not in a

