"""What a layout renders: launchers (run against named stand-ins for numactl and the engine),
the LiteLLM gateway config (loaded by LiteLLM's own parser where its venv exists), the
Prometheus config (`promtool check config` where installed), PriorityClasses, the picture, and
expert parallelism exactly where EP > 1.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.kserve import load_deploy, to_yaml
from onboarding.layouts.plot import layout_png
from onboarding.layouts.render import (
    check_configmap,
    check_gateway,
    check_priority_class,
    check_prometheus,
    layout_files,
    render_layout,
    write_layout_files,
)
from onboarding.serving.stack import load_stack
from tests.onboarding.test_layout import CATALOG, CFG, CONFIGS, INPUTS, NODES, planned

# A fixed fingerprint (the one the goldens were reviewed at): goldens pin the rendering, not
# the content of stack.yaml, so adding an engine there leaves them as they are.
STACK = dataclasses.replace(load_stack(CONFIGS / "stack.yaml"), fingerprint="b44522541f7f")
DEPLOY = load_deploy(CONFIGS / "deploy.yaml")
LITELLM_PY = PROJECT_ROOT / ".cache" / "litellm-venv" / "bin" / "python"
PROMTOOL = shutil.which("promtool")


def rendered(name: str):
    p = planned(name)
    return p, render_layout(p, CATALOG, INPUTS, CFG, NODES, STACK, DEPLOY)


def write(tmp_path: Path, name: str) -> Path:
    return write_layout_files(tmp_path, *rendered(name))


def isvc_args(r, model: str) -> list[str]:
    return r.manifests[model][1]["spec"]["predictor"]["model"]["args"]


def test_expert_parallel_only_where_ep_is_above_one():
    _, b = rendered("b300-deepseek")
    assert b.manifests["deepseek-r1"][1]["metadata"]["name"] == "deepseek-r1-b300-deepseek"
    assert "--enable-expert-parallel" in isvc_args(b, "deepseek-r1")
    assert "--tensor-parallel-size=8" in isvc_args(b, "deepseek-r1")
    assert "'--enable-expert-parallel'" not in b.launchers["deepseek-r1.sh"]
    assert "  --enable-expert-parallel \\" in b.launchers["deepseek-r1.sh"]
    _, a = rendered("b300-mixed")
    assert CATALOG["qwen3-235b-a22b-instruct"].engine_args["enable_expert_parallel"] is True
    assert "--enable-expert-parallel" not in isvc_args(a, "qwen3-235b-a22b-instruct"), \
        "TP 4, EP 1: the spec's flag is the layout's to decide"
    assert "enable-expert-parallel" not in a.launchers["qwen3-235b-a22b-instruct.sh"]


def test_inference_services_carry_the_layout():
    p, r = rendered("b300-mixed")
    runtime, isvc, pdb = r.manifests["qwen3-32b"]
    assert runtime["kind"] == "ServingRuntime"
    # pinned to the packed node: a surge pod finds no GPU, so KServe's RollingUpdate would stall
    assert isvc["spec"]["predictor"]["deploymentStrategy"] == {"type": "Recreate"}
    assert pdb["spec"]["selector"]["matchLabels"]["serving.kserve.io/inferenceservice"] == \
        isvc["metadata"]["name"]
    meta = isvc["metadata"]
    assert meta["name"] == "qwen3-32b-b300-mixed"
    assert meta["labels"]["model-onboarding.io/layout"] == "b300-mixed"
    assert meta["labels"]["model-onboarding.io/layout-qos"] == "latency-critical"
    assert meta["labels"]["model-onboarding.io/throughput-basis"] == "rule"
    assert "bare-metal GPUs 4,5 (NUMA 1)" in meta["annotations"]["model-onboarding.io/layout-gpus"]
    pred = isvc["spec"]["predictor"]
    assert pred["priorityClassName"] == "model-latency-critical"
    assert pred["model"]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "--gpu-memory-utilization=0.88" in pred["model"]["args"]
    shared = r.manifests["bge-m3"][1]["metadata"]["annotations"]
    assert "shares GPU 7 with bge-reranker-v2-m3" in shared["model-onboarding.io/layout-gpus"]
    # in its MIG slice (an isolated GPU to the engine) the model's own fraction applies, not
    # the bare-metal split of the shared GPU, which the launcher keeps
    split = p.placement("bge-m3").gpu_memory_utilization
    own = INPUTS["bge-m3"].gpu_memory_utilization
    assert split < own
    assert f"--gpu-memory-utilization={own:g}" in isvc_args(r, "bge-m3")
    assert f"--gpu-memory-utilization={split:g}" in r.launchers["bge-m3.sh"]
    assert "--runner=pooling" in isvc_args(r, "bge-m3")


def test_launchers_pin_gpus_numa_port_and_memory(tmp_path):
    """Each launcher runs against two named stand-ins on PATH (this machine has neither GPUs nor
    a second socket): `numactl` records its binding and execs the rest, `vllm` records its
    argv and environment."""
    out = write(tmp_path / "layout", "b300-mixed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "record.jsonl"
    (bin_dir / "numactl").write_text(
        "#!/usr/bin/env bash\n# stand-in: records the binding, then runs the command\n"
        f'echo "{{\\"numactl\\": \\"$1 $2\\"}}" >> {record}\nshift 2\nexec "$@"\n')
    (bin_dir / "vllm").write_text(
        "#!/usr/bin/env python3\n# stand-in for the engine: records what it was started with\n"
        "import json, os, sys\n"
        f"open({str(record)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], "
        "'gpus': os.environ.get('CUDA_VISIBLE_DEVICES')}) + '\\n')\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MODEL_PATH": "/models/x"}
    expected = {"qwen3-235b-a22b-instruct.sh": ("0,1,2,3", "0", 8001, "0.88"),
                "qwen3-32b.sh": ("4,5", "1", 8002, "0.88"),
                "llama-3-1-8b-instruct.sh": ("6", "1", 8003, "0.88"),
                "bge-m3.sh": ("7", "1", 8004, "0.44")}
    for script, (gpus, numa, port, util) in expected.items():
        record.unlink(missing_ok=True)
        proc = subprocess.run(["bash", str(out / "launchers" / script)], env=env,
                              capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 0, proc.stderr
        binding, engine = (json.loads(line) for line in record.read_text().splitlines())
        assert binding["numactl"] == f"--cpunodebind={numa} --membind={numa}"
        assert engine["gpus"] == gpus
        assert engine["argv"][:3] == ["serve", "/models/x", "--host=127.0.0.1"]
        assert f"--port={port}" in engine["argv"]
        assert f"--gpu-memory-utilization={util}" in engine["argv"]


def test_tp8_launcher_spans_both_halves_without_binding(tmp_path):
    out = write(tmp_path, "b300-deepseek")
    text = (out / "launchers" / "deepseek-r1.sh").read_text()
    assert 'NUMACTL="${NUMACTL-}"' in text and "no NUMA binding" in text
    assert "export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in text
    assert subprocess.run(["bash", "-n", str(out / "launchers" / "deepseek-r1.sh")],
                          check=False).returncode == 0


def test_gateway_routes_by_model_with_the_qos_policy():
    _, r = rendered("b300-mixed")
    routes = {d["model_name"]: d for d in r.gateway["model_list"]}
    assert routes["qwen3-32b"]["litellm_params"]["api_base"] == "http://127.0.0.1:8002/v1"
    assert routes["qwen3-32b"]["litellm_params"]["timeout"] == 60
    assert routes["bge-m3"]["litellm_params"]["max_parallel_requests"] == 256
    assert routes["bge-m3"]["model_info"]["mode"] == "embedding"
    assert routes["bge-reranker-v2-m3"]["model_info"]["mode"] == "rerank"
    assert check_gateway(r.gateway) == []


def test_structural_checks_catch_what_they_claim_to():
    _, r = rendered("b300-mixed")
    bad = json.loads(json.dumps(r.gateway))
    del bad["model_list"][0]["litellm_params"]["api_base"]
    bad["model_list"][1]["model_name"] = bad["model_list"][2]["model_name"]
    errors = check_gateway(bad)
    assert any("model_list.0.litellm_params.api_base': required" in e for e in errors)
    bad = json.loads(json.dumps(r.gateway))
    bad["model_list"][1]["model_name"] = bad["model_list"][2]["model_name"]
    assert check_gateway(bad) == ["model_name 'llama-3.1-8b-instruct' routes to two engines"]
    prom = json.loads(json.dumps(r.prometheus))
    prom["scrape_configs"][0]["static_configs"][0]["targets"] = ["127.0.0.1:80a1"]
    prom["scrape_configs"][1]["job_name"] = prom["scrape_configs"][2]["job_name"]
    errors = check_prometheus(prom)
    assert "job_name 'engine-llama-3-1-8b-instruct' appears twice" in errors
    assert any("target '127.0.0.1:80a1' is not host:port" in e for e in errors)
    pc = dict(r.priority_classes[0], value=2_000_000_000)
    assert check_priority_class(pc) == [
        "value 2000000000: an integer of at most 1000000000 for user classes"]
    assert [check_priority_class(d) for d in r.priority_classes] == [[], []]


def test_dcgm_gpus_are_labelled_with_their_models():
    _, r = rendered("b300-mixed")
    dcgm = next(j for j in r.prometheus["scrape_configs"] if j["job_name"] == "dcgm-exporter")
    assert dcgm["static_configs"][0]["targets"] == ["127.0.0.1:9400"]
    assert {x["regex"]: x["replacement"] for x in dcgm["metric_relabel_configs"]} == {
        "0|1|2|3": "qwen3-235b-a22b-instruct", "4|5": "qwen3-32b",
        "6": "llama-3.1-8b-instruct", "7": "bge-m3+bge-reranker-v2-m3"}
    engines = [j for j in r.prometheus["scrape_configs"] if j["job_name"].startswith("engine-")]
    assert sorted(j["static_configs"][0]["targets"][0] for j in engines) == [
        f"127.0.0.1:{p}" for p in range(8001, 8006)]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package "
                    "`prometheus`: apt-get install prometheus); the structural check ran above")
def test_promtool_accepts_the_scrape_config_and_refuses_a_broken_one(tmp_path):
    for name in CFG.layouts:
        out = write(tmp_path / name, name)
        proc = subprocess.run([PROMTOOL, "check", "config", str(out / "prometheus.yml")],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    _, r = rendered("b300-mixed")
    broken = json.loads(json.dumps(r.prometheus))
    broken["scrape_configs"].append(broken["scrape_configs"][0])
    path = tmp_path / "broken.yml"
    path.write_text(to_yaml([broken]))
    proc = subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode != 0 and "found multiple scrape configs with job name" in (
        proc.stdout + proc.stderr)


def _litellm(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LITELLM_PY), str(PROJECT_ROOT / "scripts" /
                                                "check_gateway_config.py"), str(path)],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})


@pytest.mark.slow
@pytest.mark.skipif(not LITELLM_PY.is_file(), reason="LiteLLM's venv is absent: `bash "
                    "scripts/setup_litellm.sh` makes .cache/litellm-venv; the structural check "
                    "of the gateway config ran above")
def test_litellm_own_parser_loads_the_gateway_config(tmp_path):
    out = write(tmp_path / "ok", "b300-mixed")
    proc = _litellm(out / "litellm-config.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    assert parsed["routing_strategy"] == "simple-shuffle"
    by_name = {d["model_name"]: d for d in parsed["deployments"]}
    assert set(by_name) == {"qwen3-235b-a22b-instruct", "qwen3-32b", "llama-3.1-8b-instruct",
                            "bge-m3", "bge-reranker-v2-m3"}
    assert by_name["qwen3-32b"]["litellm_params"] == {
        "model": "hosted_vllm/qwen3-32b", "api_base": "http://127.0.0.1:8002/v1",
        "timeout": 60.0, "stream_timeout": 60.0, "max_parallel_requests": 64}
    assert by_name["bge-m3"]["model_info"] == {"id": "b300-mixed/bge-m3", "mode": "embedding"}
    broken = yaml.safe_load((out / "litellm-config.yaml").read_text())
    del broken["model_list"][0]["litellm_params"]["model"]
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(broken))
    refused = _litellm(tmp_path / "broken.yaml")
    assert refused.returncode != 0 and "KeyError: 'model'" in refused.stderr


def test_the_picture_is_a_png_of_the_layout():
    p, _ = rendered("b300-mixed")
    png = layout_png(p)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_files_of_a_layout():
    p, r = rendered("h200-mixed")
    files = layout_files(p, r)
    assert set(files) == {
        "qwen3-235b-a22b-instruct.yaml", "qwen3-32b.yaml", "llama-3-1-8b-instruct.yaml",
        "bge-m3.yaml", "bge-reranker-v2-m3.yaml", "priority-classes.yaml", "gpu-sharing.yaml",
        "litellm-config.yaml", "prometheus.yml", "layout.json", "launchers/gateway.sh",
        *(f"launchers/{m}.sh" for m in ("qwen3-235b-a22b-instruct", "qwen3-32b",
                                         "llama-3-1-8b-instruct", "bge-m3",
                                         "bge-reranker-v2-m3"))}
    pcs = list(yaml.safe_load_all(files["priority-classes.yaml"]))
    assert [(d["metadata"]["name"], d["value"], d["preemptionPolicy"]) for d in pcs] == [
        ("model-batch", 1000, "Never"), ("model-latency-critical", 100000,
                                          "PreemptLowerPriority")]
    assert "--port 4000" in files["launchers/gateway.sh"]


SMOLLM2 = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"


@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(), reason="the SmolLM2 checkpoint is "
                    "built by `bash scripts/dev.sh setup`")
def test_noisy_neighbour_script_plans_one_engine_per_gpu_dry_run(tmp_path):
    """The GPU script (not run here: it needs a 2-GPU H200) plans and renders through the
    project's code; its dry run is what can be checked without GPUs."""
    proc = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "scripts" / "gpu_noisy_neighbour.py"),
         "--model-dir", str(SMOLLM2), "--params-billion", "0.135", "--out", str(tmp_path),
         "--dry-run"], capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert {m: p["gpus"] for m, p in summary["placements"].items()} == {
        "twin-a": [0], "twin-b": [1]}
    script = (tmp_path / "layout" / "launchers" / "twin-b.sh").read_text()
    assert "export CUDA_VISIBLE_DEVICES=1" in script and "--port=8002" in script


# ---- Layouts Kubernetes can grant ------------------------------------------------

def _gpu_requests(r) -> dict[str, dict[str, int]]:
    out = {}
    for model, docs in r.manifests.items():
        isvc = next(d for d in docs if d["kind"] == "InferenceService")
        req = isvc["spec"]["predictor"]["model"]["resources"]["requests"]
        out[model] = {k: int(v) for k, v in req.items() if k.startswith("nvidia.com/")}
    return out


@pytest.mark.parametrize("name", sorted(CFG.layouts))
def test_a_layout_requests_no_more_gpus_than_its_node_has_and_stays_on_one_node(name):
    plan, r = rendered(name)
    node = NODES.node_types[plan.node_type]
    requests = _gpu_requests(r)
    whole = sum(q.get("nvidia.com/gpu", 0) for q in requests.values())
    mig = [k for q in requests.values() for k in q if k.startswith("nvidia.com/mig-")]
    # MIG slices come from GPUs taken out of the whole-GPU pool: one GPU per shared set
    mig_gpus = len({p.gpu_ids for p in plan.placements if p.shares_gpu_with})
    assert whole + mig_gpus <= node.gpus_per_node, (name, requests)
    assert len(mig) == sum(1 for p in plan.placements if p.shares_gpu_with)
    selectors = {json.dumps(next(d for d in docs if d["kind"] == "InferenceService")[
        "spec"]["predictor"]["nodeSelector"], sort_keys=True) for docs in r.manifests.values()}
    assert len(selectors) == 1 and f'"model-onboarding.io/layout": "{name}"' in selectors.pop()


@pytest.mark.parametrize("name", sorted(CFG.layouts))
def test_the_shipped_layouts_are_grantable(name):
    _, r = rendered(name)
    assert r.grant_problems == ()


def test_the_layout_check_fails_what_a_cluster_cannot_grant():
    plan = planned("b300-mixed")
    ts = CFG.model_copy(update={"gpu_sharing": CFG.gpu_sharing.model_copy(
        update={"mode": "time-slicing"})})
    r = render_layout(plan, CATALOG, INPUTS, ts, NODES, STACK, DEPLOY)
    assert any("shares every GPU of the node" in p for p in r.grant_problems)
    bare = CFG.model_copy(update={"gpu_sharing": CFG.gpu_sharing.model_copy(
        update={"node_types": {}})})
    r = render_layout(plan, CATALOG, INPUTS, bare, NODES, STACK, DEPLOY)
    assert any("9 whole GPU(s)" in p and "of 8 allocatable" in p for p in r.grant_problems)
    assert any("not available on b300" in p for p in r.grant_problems)


def test_a_mig_layout_renders_the_mig_parted_config_beside_it():
    _, r = rendered("h200-mixed")
    [cm] = r.gpu_sharing
    config = yaml.safe_load(cm["data"]["config.yaml"])["mig-configs"]["h200-mixed"]
    assert config[1] == {"devices": [7], "mig-enabled": True, "mig-devices": {"3g.71gb": 2}}
    assert config[0]["devices"] == [0, 1, 2, 3, 4, 5, 6] and not config[0]["mig-enabled"]
    assert _gpu_requests(r)["bge-m3"] == {"nvidia.com/mig-3g.71gb": 1}


@pytest.mark.parametrize("name", sorted(CFG.layouts))
def test_golden_kubernetes_objects_of_each_layout(name):
    """tests/golden/layouts/<layout>/ beside its plan: every Kubernetes object the layout
    renders (InferenceServices, ServingRuntimes, PriorityClasses, the GPU-sharing ConfigMap)."""
    from tests.conftest import assert_golden

    p, r = rendered(name)
    files = layout_files(p, r)
    k8s = {f for f in files if f.endswith(".yaml") and f != "litellm-config.yaml"}
    for f in sorted(k8s):
        assert_golden(PROJECT_ROOT / "tests" / "golden" / "layouts" / name / f, files[f],
                      f"{name}/{f} changed")
    assert ("gpu-sharing.yaml" in k8s) == any(x.shares_gpu_with for x in p.placements)
    for doc in r.gpu_sharing:
        assert check_configmap(doc) == []


# ---- what a cluster grants and what a layout's pods load ---------------------------------------

def test_layout_manifests_deploy_the_published_variant_or_the_real_source():
    """A layout's InferenceService deploys what the pipeline published and verified, like a
    single-model manifest, and reads the source precision from the checkpoint: DeepSeek-R1's
    config.json declares block-scaled FP8 (quantization_config.quant_method) beside
    torch_dtype bfloat16, so its FP8 manifest points at the source, not at a variant nobody
    published."""
    from onboarding.common.refs import PublishedVariant
    from onboarding.deploy.kserve import checkpoint_dtype
    from onboarding.layouts.render import ModelSource

    plan = planned("h200-deepseek")
    p = plan.placement("deepseek-r1")
    assert p.precision == "fp8"
    r1_config = {"torch_dtype": "bfloat16", "quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}
    assert checkpoint_dtype(r1_config) == "fp8"
    assert checkpoint_dtype({"torch_dtype": "bfloat16"}) == "bfloat16"
    src = render_layout(plan, CATALOG, INPUTS, CFG, NODES, STACK, DEPLOY, {
        "deepseek-r1": ModelSource(checkpoint_dtype(r1_config), None)})
    isvc = next(d for d in src.manifests["deepseek-r1"] if d["kind"] == "InferenceService")
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == CATALOG["deepseek-r1"].source
    pub = PublishedVariant(model="deepseek-r1", precision="fp8",
                           uri="s3://model-serving/deepseek-r1/fp8/abc/", content_hash="abc",
                           total_bytes=700 * 10**9, files=163, skipped=False)
    published = render_layout(plan, CATALOG, INPUTS, CFG, NODES, STACK, DEPLOY, {
        "deepseek-r1": ModelSource(None, {"fp8": pub})})
    isvc = next(d for d in published.manifests["deepseek-r1"]
                if d["kind"] == "InferenceService")
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == pub.uri
    assert isvc["metadata"]["labels"]["model-onboarding.io/published"] == "true"


def test_grant_check_counts_cpu_and_memory_not_only_gpus():
    """The scheduler places a pod only where CPU and memory fit too: a layout whose pods ask
    for more than the node has never starts, whatever its GPUs say."""
    from onboarding.layouts.render import grant_problems

    plan = planned("h200-mixed")
    r = render_layout(plan, CATALOG, INPUTS, CFG, NODES, STACK, DEPLOY)
    assert grant_problems(plan, r.manifests, CFG, NODES) == []
    node = NODES.node_types["h200"]
    heavy = copy.deepcopy(r.manifests)
    isvc = next(d for d in heavy["qwen3-32b"] if d["kind"] == "InferenceService")
    isvc["spec"]["predictor"]["model"]["resources"]["requests"].update(
        {"cpu": str(node.cpu_per_gpu * node.gpus_per_node),
         "memory": f"{node.host_memory_gib_per_gpu * node.gpus_per_node}Gi"})
    problems = grant_problems(plan, heavy, CFG, NODES)
    assert any("CPUs requested" in p for p in problems), problems
    assert any("GiB of memory requested" in p for p in problems), problems
