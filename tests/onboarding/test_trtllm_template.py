"""TensorRT-LLM as data: the `trtllm` template of configs/stack.yaml renders, validates
against the KServe CRDs, uses only flags its CLI documents, and says everywhere that it was
never measured here. No code names it: a stack whose `images.engine` is `trtllm` goes through
the same plan, renderer and launcher as vLLM.

Its CLI, read from NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py at
00209af149e7774406881a37283dce303571eb11 (the `serve` command's click options, long names and
aliases), is `TRTLLM_SERVE_OPTIONS` below; its Prometheus route and series from
tensorrt_llm/serve/openai_server.py (00057725d9a6591f033e44f31c219e2426827bb7, `mount_metrics`)
and tensorrt_llm/metrics/collector.py (050f80def8df236e326949c8bd9dee10fd896a83).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.kserve import RenderInputs, load_deploy, render, storage_for
from onboarding.deploy.plan import Measured, load_nodes, plan, plan_inputs, shape_from_hint
from onboarding.deploy.serving_plan import render_targets, serving_plan
from onboarding.fetch.catalog import load_catalog
from onboarding.layouts.render import render_layout
from onboarding.serving.engine_config import evidence
from onboarding.serving.stack import load_stack
from onboarding.serving.stats import LoadTimingResult, ServingBenchmarkResult
from resources.loadgen import completion_bodies
from resources.manifest_validator import DEFAULT_CRD_DIR, ManifestValidator

CONFIGS = PROJECT_ROOT / "configs"
NODES = load_nodes(CONFIGS / "nodes.yaml")
DEPLOY = load_deploy(CONFIGS / "deploy.yaml")
CATALOG = load_catalog(CONFIGS / "models")
NEVER = "never measured here (trtllm)"

# `trtllm-serve serve` options at the cited commit (long name and alias of each).
TRTLLM_SERVE_OPTIONS = {
    "--tokenizer", "--custom_tokenizer", "--host", "--port", "--backend", "--custom_module_dirs",
    "--log_level", "--max_beam_width", "--max_batch_size", "--max_num_tokens", "--max_seq_len",
    "--tensor_parallel_size", "--tp_size", "--pipeline_parallel_size", "--pp_size",
    "--context_parallel_size", "--cp_size", "--moe_expert_parallel_size", "--ep_size",
    "--moe_cluster_parallel_size", "--cluster_size", "--gpus_per_node",
    "--free_gpu_memory_fraction", "--kv_cache_free_gpu_memory_fraction",
    "--num_postprocess_workers", "--trust_remote_code", "--revision", "--config",
    "--extra_llm_api_options", "--reasoning_parser", "--tool_parser",
    "--metadata_server_config_file", "--server_role", "--fail_fast_on_attention_window_too_large",
    "--otlp_traces_endpoint", "--disagg_cluster_uri", "--enable_chunked_prefill",
    "--media_io_kwargs", "--chat_template",
}
# The request-body fields of OpenAI's completions API the load generator uses; anything else it
# sends is an extension every engine's template must list (load_generator.request_extensions).
OPENAI_COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "stream", "temperature",
                            "stream_options", "stream_options.include_usage"}


def trtllm_stack(tmp_path: Path):
    """configs/stack.yaml with the manifests running trtllm: the one edit a deployer makes."""
    data = yaml.safe_load((CONFIGS / "stack.yaml").read_text())
    data["images"]["engine"] = "trtllm"
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_stack(path)


def planned(model_id: str, stack):
    spec = CATALOG[model_id]
    p = plan(plan_inputs(spec, NODES, shape_from_hint(spec.architecture, spec.id), Measured()),
             NODES)
    return spec, p, serving_plan(spec, p, NODES, stack)


def flags(argv) -> set[str]:
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def test_the_template_uses_only_documented_flags():
    t = load_stack(CONFIGS / "stack.yaml").templates["trtllm"]
    used = {a.flag for a in t.args.values() if a.flag} | {
        a.off_flag for a in t.args.values() if a.off_flag} | {t.host_flag, t.port_flag}
    assert used <= TRTLLM_SERVE_OPTIONS, used - TRTLLM_SERVE_OPTIONS
    assert t.container_command == ["trtllm-serve", "serve"] and t.model_arg == ""
    assert t.served_name_flag == ""  # serve.py has no served-model-name option
    assert t.metrics.path == "/prometheus/metrics" and t.metrics.enable_arg is None
    assert {t.metrics.running, t.metrics.waiting, t.metrics.kv_cache_usage,
            t.metrics.ttft_histogram, t.metrics.itl_histogram} == {
        "trtllm_num_requests_running", "trtllm_num_requests_waiting",
        "trtllm_kv_cache_utilization", "trtllm_time_to_first_token_seconds",
        "trtllm_time_per_output_token_seconds"}
    assert t.distributions == ["tensorrt-llm"] and t.never_measured_here
    assert any("00209af149e7774406881a37283dce303571eb11" in s for s in t.sources)


def test_its_image_follows_ngc_release_naming():
    stack = load_stack(CONFIGS / "stack.yaml")
    version = stack.versions["trtllm"]
    assert stack.images_by_engine["trtllm"] == {
        arch: f"nvcr.io/nvidia/tensorrt-llm/release:{version}" for arch in ("sm90", "sm100",
                                                                            "sm103")}


@pytest.mark.parametrize("model_id", ["llama-3-1-70b-instruct", "qwen3-235b-a22b-instruct"])
def test_the_plan_configures_it_from_the_template_and_never_claims_a_measurement(
        tmp_path, model_id):
    stack = trtllm_stack(tmp_path)
    spec, _, splan = planned(model_id, stack)
    for nt in ("h200", "b300"):
        c = splan.config(nt)
        argv = c.args("/mnt/models", 8080)
        assert argv[0] == "/mnt/models" and flags(argv) <= TRTLLM_SERVE_OPTIONS, argv
        assert f"--tp_size={c.tensor_parallel}" in argv
        assert f"--max_batch_size={c.max_num_seqs}" in argv
        assert "--served-model-name" not in flags(argv)
        # the plan's gpu_memory_utilization is not trtllm's free-memory fraction: dropped, said
        assert "gpu_memory_utilization" in c.dropped
        assert c.image == f"nvcr.io/nvidia/tensorrt-llm/release:{stack.engine_version}"
        assert c.never_measured.startswith(NEVER) and NEVER not in json.dumps(c.content())
        # a result at exactly this configuration still is not evidence of a measurement here
        timing = LoadTimingResult(model=spec.id, precision=c.precision, servable=True, reason="",
                                  cold_start_p50_s=60.0, cold_start_p95_s=60.0, node_type=nt,
                                  config_hash=c.hash)
        bench = ServingBenchmarkResult(model=spec.id, precision=c.precision, node_type=nt,
                                       gpus=c.tensor_parallel, servable=True,
                                       tokens_per_s_per_gpu=1000.0, saturation_concurrency=32,
                                       slo_pass=True, config_hash=c.hash)
        ev = evidence(c, timing, bench)
        assert not ev.measured and ev.cold_start_p95_s is None and ev.slo_pass is None
        assert NEVER in ev.basis


def test_a_moe_flag_it_does_not_take_is_dropped_and_reported(tmp_path):
    _, _, splan = planned("qwen3-235b-a22b-instruct", trtllm_stack(tmp_path))
    c = splan.config("b300")
    assert "enable_expert_parallel" in c.dropped or "enable_expert_parallel" in " ".join(c.notes)
    assert "--enable-expert-parallel" not in c.args("/mnt/models", 8080)


@pytest.mark.slow
@pytest.mark.skipif(not (DEFAULT_CRD_DIR / "serving.kserve.io_inferenceservices.yaml").is_file(),
                    reason=f"KServe CRDs not found in {DEFAULT_CRD_DIR}")
@pytest.mark.parametrize("node_type", ["h200", "b300"])
def test_its_manifests_are_crd_valid_and_say_never_measured(tmp_path, node_type):
    stack = trtllm_stack(tmp_path)
    spec, p, splan = planned("llama-3-1-70b-instruct", stack)
    c = splan.config(node_type)
    r = render(RenderInputs(spec=spec, plan=p, node_type=node_type,
                            node=NODES.node_types[node_type], stack=stack, deploy=DEPLOY, config=c,
                            evidence=evidence(c, None, None),
                            storage=storage_for(spec, c.precision, "bf16", DEPLOY, None)))
    validator = ManifestValidator()
    for doc in r.docs:
        assert validator.validate(doc) == [], doc["kind"]
    runtime = next(d for d in r.docs if d["kind"] == "ServingRuntime")
    isvc = next(d for d in r.docs if d["kind"] == "InferenceService")
    container = runtime["spec"]["containers"][0]
    assert container["command"] == ["trtllm-serve", "serve"]
    assert container["image"] == c.image
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/path"] == "/prometheus/metrics"
    assert runtime["metadata"]["labels"]["model-onboarding.io/engine"] == "trtllm"
    assert runtime["metadata"]["annotations"]["model-onboarding.io/engine-measured"].startswith(
        NEVER)
    notes = isvc["metadata"]["annotations"]
    assert notes["model-onboarding.io/engine-measured"].startswith(NEVER)
    assert notes["model-onboarding.io/configuration"].startswith(f"unmeasured: {NEVER}")
    args = isvc["spec"]["predictor"]["model"]["args"]
    assert flags(args) <= TRTLLM_SERVE_OPTIONS, args
    assert isvc["spec"]["predictor"]["annotations"]["prometheus.io/path"] == "/prometheus/metrics"
    assert not r.measured


def test_render_targets_never_mark_it_measured(tmp_path):
    stack = trtllm_stack(tmp_path)
    spec, _, splan = planned("llama-3-1-70b-instruct", stack)
    c = splan.config("h200")
    timing = LoadTimingResult(model=spec.id, precision=c.precision, servable=True, reason="",
                              cold_start_p50_s=60.0, cold_start_p95_s=60.0, node_type="h200",
                              config_hash=c.hash)
    rendered, _ = render_targets(spec, splan, NODES, stack, DEPLOY, None, timing, None, None)
    assert rendered and not any(r.measured for r in rendered)


def test_its_layout_launcher_is_the_template_command(tmp_path):
    from onboarding.layouts.placement import load_layouts
    from tests.onboarding.test_layout import CATALOG as LAYOUT_CATALOG
    from tests.onboarding.test_layout import INPUTS
    from tests.onboarding.test_layout import planned as planned_layout

    stack = trtllm_stack(tmp_path)
    cfg = load_layouts(CONFIGS / "layouts.yaml")
    p = planned_layout("h200-deepseek")
    r = render_layout(p, LAYOUT_CATALOG, INPUTS, cfg, NODES, stack, DEPLOY)
    script = r.launchers["deepseek-r1.sh"]
    assert 'TRTLLM="${TRTLLM:-trtllm-serve}"' in script
    assert 'exec $NUMACTL $TRTLLM serve "$MODEL_PATH" --host=127.0.0.1 \\' in script
    assert f"# {NEVER}" in script
    assert "VLLM" not in script and "sglang" not in script
    assert all(j["metrics_path"] == "/prometheus/metrics"
               for j in r.prometheus["scrape_configs"] if j["job_name"].startswith("engine-"))
    for docs in r.manifests.values():
        for d in docs:
            if d["kind"] == "InferenceService":
                assert d["metadata"]["annotations"]["model-onboarding.io/engine-measured"]


def _extensions(body: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in body.items():
        name = f"{prefix}{k}"
        out |= _extensions(v, f"{name}.") if isinstance(v, dict) else {name}
    return out


def test_every_engine_accepts_what_the_load_generator_sends_it():
    """Each engine gets the bodies its template's count_tokens_by makes (vLLM: its own
    return_token_ids, the others continuous usage), and lists every extension in them."""
    modes = {}
    for name, t in load_stack(CONFIGS / "stack.yaml").templates.items():
        lg = t.load_generator
        sent = set()
        for body in completion_bodies("m", ["p"], 4, count_tokens_by=lg.count_tokens_by) + \
                completion_bodies("m", ["p"], 4, temperature=0.0,
                                  count_tokens_by=lg.count_tokens_by):
            sent |= _extensions(json.loads(body))
        extensions = sent - OPENAI_COMPLETION_FIELDS
        assert extensions <= set(lg.request_extensions), name
        modes[name] = (lg.count_tokens_by, extensions)
    assert modes["vllm"] == ("token_ids", {"ignore_eos", "return_token_ids"})
    assert modes["sglang"] == ("usage", {"ignore_eos", "stream_options.continuous_usage_stats"})


def test_a_template_that_counts_by_a_field_it_does_not_accept_is_refused():
    from pydantic import ValidationError

    from onboarding.serving.stack import LoadGeneratorNeeds

    with pytest.raises(ValidationError, match="return_token_ids"):
        LoadGeneratorNeeds(request_extensions=["ignore_eos"], count_tokens_by="token_ids")
    with pytest.raises(ValidationError, match="continuous_usage_stats"):
        LoadGeneratorNeeds(request_extensions=[], count_tokens_by="usage")
    # a template that names no way of counting (a recorded run's stack file) keeps the default
    assert LoadGeneratorNeeds().count_tokens_by == "usage"
    assert LoadGeneratorNeeds(request_extensions=[], count_tokens_by="text").count_tokens_by \
        == "text"


def test_every_template_names_its_distribution_and_the_fingerprint_reads_it():
    from onboarding.serving.stack import fingerprint_packages, read_stack_config

    stack = load_stack(CONFIGS / "stack.yaml")
    packages = fingerprint_packages(read_stack_config(CONFIGS / "stack.yaml"))
    for name, t in stack.templates.items():
        assert t.distributions, name
        assert t.distributions[0] in packages, name


def test_the_stack_refuses_an_engine_without_a_template(tmp_path):
    from onboarding.common.errors import ConfigError

    data = yaml.safe_load((CONFIGS / "stack.yaml").read_text())
    data["images"]["engine"] = "tgi"
    data["versions"]["tgi"] = "3.0.0"
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"images\.engine: 'tgi' has no template"):
        load_stack(path)


@pytest.mark.slow
def test_the_plan_table_and_the_report_page_say_never_measured(tmp_path):
    from onboarding.reports.pages import model_page, to_markdown
    from tests.report_facts import BIG, facts_of, ready_model

    stack = trtllm_stack(tmp_path)
    _, _, splan = planned(BIG, stack)
    assert all(c.summary()["engine"].endswith("(never measured here)")
               for c in splan.configs.values())
    facts = facts_of(ready_model())
    vllm_page = to_markdown(model_page(facts))
    page = to_markdown(model_page(dataclasses.replace(facts, serving_plan=splan)))
    assert NEVER not in vllm_page
    assert page.count(NEVER) >= len(splan.configs)
