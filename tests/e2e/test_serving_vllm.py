"""The real engine: PyPI's vLLM CPU build in .venv-engine serving SmolLM2-135M (bf16).

Real starts take 25-50 s and ~4 GB here, so the suite makes few: one Dagster run (1 cold + 1
warm start, the benchmark on the warm one) on a reduced sweep, one benchmark whose engine is killed in its
second point, then one module-scoped engine for the client checks. Skipped, with the reason,
when the engine venv or the model has not been built.
"""

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import yaml

from assets.partitions import cell_key
from assets.serving import SLO_CHECK, load_timing, serving_benchmark
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.processes import free_port
from onboarding.common.refs import CheckpointRef, VariantRef
from onboarding.deploy.dashboard import dashboard_queries, render_dashboard
from onboarding.deploy.observability import (
    Evaluation,
    Target,
    local_scrape_config,
    render_operations,
)
from onboarding.deploy.serving_plan import ServingPlan
from onboarding.quantize.variants import QuantizedSet
from onboarding.serving.profiles import resolve_slo
from onboarding.serving.prompts import synthetic_prompts
from onboarding.serving.stats import (
    LoadTimingResult,
    headline,
    histogram_mean_delta,
    parse_metrics,
    summarize,
)
from resources.engine import Engine
from resources.loadgen import LoadGenerator, completion_bodies
from resources.telemetry import GpuTelemetry
from resources.upstream import optional_upstream
from tests.conftest import write_spec
from tests.dagster_support import register, store_upstream, upstream_specs
from tests.e2e.docs_screenshots import keep_for_docs
from tests.e2e.prometheus_server import PROMETHEUS, alerts_page, prometheus_server

pytestmark = [pytest.mark.slow, pytest.mark.engine]

SMOL = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"
VLLM = PROJECT_ROOT / ".venv-engine" / "bin" / "vllm"
KEY = "smollm2-135m"
CELL = str(cell_key(KEY, "cpu"))  # the embedded engine's cell
# what the serving stages read of the model's own stages (stored under the model beforehand)
UPSTREAM = upstream_specs("checkpoint", "serving_variant", "quantized", "serving_config",
                          "config_search")

if not VLLM.is_file() or not (SMOL / "model.safetensors").is_file():
    pytest.skip(f"needs the engine venv ({VLLM}, scripts/setup.sh) and the model ({SMOL}, "
                "scripts/build_smollm2.py)", allow_module_level=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A private copy: a file another process maps (a quantizer, a debugger) cannot be evicted,
    and the cold start would be refused, rightly."""
    d = tmp_path_factory.mktemp("model") / "smollm2"
    shutil.copytree(SMOL, d)
    os.sync()
    return d


def smol(model_dir: Path, precision: str = "bf16") -> VariantRef:
    size = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    return VariantRef(model=KEY, precision=precision, path=str(model_dir), total_bytes=size,
                      content_hash="e2e")


def store_model_stages(instance: dg.DagsterInstance, model_dir: Path) -> None:
    """The model's own stages the serving stages read, stored under the model."""
    v = smol(model_dir)
    store_upstream(
        instance, KEY,
        checkpoint=CheckpointRef(model=KEY, source="s3://models/smollm2-135m-instruct/",
                                 revision="e2e", path=v.path, content_hash=v.content_hash,
                                 total_bytes=v.total_bytes),
        serving_variant=v,
        quantized=QuantizedSet(KEY, "", 1, ()),  # nothing quantized: bf16 is served
        # No node type of nodes.yaml is "cpu": the engine at hand runs its own configuration.
        serving_config=ServingPlan(plan=None, configs={}))
    register(instance, KEY, "cpu")


def test_dagster_run_times_and_benchmarks_the_real_engine(config_dir, configs, outputs,
                                                          tmp_path, model_dir):
    """Load timing (1 cold, 1 warm) and a reduced chat sweep, in a real instance.

    First in the module, so the module-scoped engine is not yet running beside it.
    """
    write_spec(config_dir, KEY, "s3://models/smollm2-135m-instruct/", scenarios=["chat"],
               engine_args={"max_model_len": 1024, "max_num_seqs": 16})

    instance = dg.DagsterInstance.ephemeral()
    store_model_stages(instance, model_dir)
    engine = Engine(hardware="cpu", log_dir=str(tmp_path / "logs"), start_timeout_s=300,
                    configs=configs)
    result = dg.materialize(
        [*UPSTREAM, load_timing, serving_benchmark], partition_key=CELL,
        instance=instance, resources={"engine": engine, "loadgen": LoadGenerator(),
                                      "telemetry": GpuTelemetry(),
                                      "optional_upstream": optional_upstream, "configs": configs,
                                      "outputs": outputs},
        run_config={"ops": {
            "load_timing": {"config": {"cold_repeats": 1, "cold_weights_repeats": 0,
                                       "warm_repeats": 1}},
            # the quick sweep's rule (configs/automation.yaml): 2 requests at 1, 8 at 4
            "serving_benchmark": {"config": {"concurrency": [1, 4],
                                             "requests_per_point": 2}}}})
    assert result.success
    md = {k: getattr(v, "value", v) for k, v in next(
        iter(result.asset_materializations_for_node("load_timing"))).metadata.items()}
    assert md["cold_start_p95_s"] >= md["cold_start_p50_s"] > 0
    assert md["warm_start_p50_s"] > 0 and md["raw_read_gbps"] > 0
    assert md["weight_bytes"] == smol(model_dir).total_bytes and md["weights_load_gbps"] > 0
    bench = result.output_for_node("serving_benchmark")
    assert bench.node_type == "cpu" and bench.tokens_per_s_per_gpu > 0
    assert bench.saturation_concurrency in (0, 1, 4)
    ev = next(e.event_specific_data for e in result.all_events
              if e.event_type_value == "ASSET_CHECK_EVALUATION"
              and e.event_specific_data.check_name == SLO_CHECK)
    assert ev.check_name == SLO_CHECK and ev.passed == bench.slo_pass
    # each point measured prefills, not vLLM's prefix cache: chat shares no prefix, and no point
    # re-sends an earlier one's prompts (a point that did would measure the prefix cache); the
    # engine's own counters say so
    rows = pd.read_csv(outputs.reports / KEY / "cpu" / "serving_benchmark.csv")
    assert list(rows["load"]) == [1, 4]
    assert (rows["prefix_cache_hit_fraction"] < 0.1).all(), rows["prefix_cache_hit_fraction"]
    # two starts (fully cold, warm; the cold-weights kind is the fake engine's to test, in
    # tests/resources/test_engine.py, and the demo's): the sweep ran on the warm one, handed
    # off by load_timing, rather than a third
    assert len(list((tmp_path / "logs").glob("engine-*.log"))) == 2
    b_md = next(iter(result.asset_materializations_for_node("serving_benchmark"))).metadata
    assert b_md["engine_start"].value.startswith("reused load_timing's warm start")
    print(json.dumps({"load_timing": {k: md[k] for k in (
        "cold_start_p50_s", "cold_start_p95_s", "warm_start_p50_s", "weights_load_gbps",
        "raw_read_gbps")}, "benchmark": bench.__dict__}, default=str))


def _group_leader(port: int) -> int | None:
    """The engine's process group leader: the vLLM API server serving on `port`."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            stat = (d / "stat").read_text()
        except OSError:
            continue
        pgrp = int(stat[stat.rfind(")") + 2:].split()[2])
        on_port = str(port).encode() in argv or f"--port={port}".encode() in argv
        if b"serve" in argv and on_port and pgrp == int(d.name):
            return int(d.name)
    return None


def _group_members(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            f = stat[stat.rfind(")") + 2:].split()
            if int(f[2]) == pgid and f[0] != "Z":
                out.append(int(d.name))
    return out


def test_the_real_engine_killed_during_a_point_fails_the_step_and_keeps_the_points(
        config_dir, configs, outputs, tmp_path, model_dir):
    """SIGKILL to the vLLM API server once the second point (concurrency 4) is under way: the
    scenario's warm-ups (in flight together) and point 1 (one request at a time) have finished,
    by the server's own `request_success_total`, and its `num_requests_running` gauge reads 2 or
    more, which in point 1 it cannot. The point the kill lands in is the harness's timing, not the code's
    behaviour (a slow scrape can let it land later), so the test reads it from the error and
    holds the partial CSV to it: every earlier point complete, the dying one marked."""
    write_spec(config_dir, KEY, "s3://models/smollm2-135m-instruct/", scenarios=["chat"],
               engine_args={"max_model_len": 1024, "max_num_seqs": 16})

    port = free_port()
    killed: dict[str, int] = {}
    stop = threading.Event()
    before_point_2 = configs.profile("cpu", "cpu")[1].sweep.warmup_requests + 2

    def kill_during_point_2() -> None:
        url = f"http://127.0.0.1:{port}/metrics"
        while not stop.wait(0.05):
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    seen = parse_metrics(r.read().decode())
            except OSError:
                continue
            if (seen.get("vllm:request_success_total", 0) >= before_point_2
                    and seen.get("vllm:num_requests_running", 0) >= 2):
                pid = _group_leader(port)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed["pid"] = pid
                return

    killer = threading.Thread(target=kill_during_point_2, daemon=True)
    killer.start()
    instance = dg.DagsterInstance.ephemeral()
    store_model_stages(instance, model_dir)
    store_upstream(instance, CELL, load_timing=LoadTimingResult(
        model=KEY, precision="bf16", servable=True, reason=""))
    engine = Engine(hardware="cpu", log_dir=str(tmp_path / "logs"), start_timeout_s=300,
                    port=port, configs=configs)
    try:
        result = dg.materialize(
            [*UPSTREAM, *upstream_specs("load_timing"), serving_benchmark],
            partition_key=CELL, instance=instance,
            resources={"engine": engine, "loadgen": LoadGenerator(),
                       "telemetry": GpuTelemetry(),
                       "optional_upstream": optional_upstream, "configs": configs, "outputs": outputs},
            run_config={"ops": {"serving_benchmark": {"config": {
                "concurrency": [1, 4, 8], "requests_per_point": 2}}}}, raise_on_error=False)
    finally:
        stop.set()
        killer.join()
    failures = [e.event_specific_data.error.to_string()[-1500:] for e in result.all_events
                if e.event_type_value == "STEP_FAILURE"]
    assert "pid" in killed, f"the engine was never killed (step failures: {failures})"
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.event_specific_data.error.to_string()
    said = message[message.find("EngineError"):][:600]
    dying = re.search(r"was killed by SIGKILL \(exit code -9\) during point chat @ (\d+);", message)
    assert dying, said
    assert "last lines:" in message, said
    [csv] = list((outputs.reports / KEY / "cpu").glob("serving_benchmark.partial-*.csv"))
    rows = pd.read_csv(csv)
    assert int(dying.group(1)) in (4, 8) and rows["load"].iloc[-1] == int(dying.group(1)), said
    assert list(rows["load"]) == [1, 4, 8][:len(rows)] and len(rows) >= 2
    assert list(rows["engine_exited"]) == [False] * (len(rows) - 1) + [True]
    # every earlier point complete: each of its requests (2 at concurrency 1, 8 at 4)
    assert (rows["completed"][:-1] == rows["requests"][:-1]).all()
    assert list(rows["requests"][:-1]) == [2, 8][:len(rows) - 1] and rows["failed"].iloc[-1] > 0
    assert _group_members(killed["pid"]) == []  # EngineCore and workers reaped too
    print(json.dumps({"error": message[message.index("EngineError"):][:400],
                      "rows": rows[["load", "completed", "failed", "errors_by_cause",
                                    "scrape_failures", "engine_exited"]].to_dict("records")},
                     default=str))


@pytest.fixture(scope="module")
def running(tmp_path_factory, model_dir):
    engine = Engine(hardware="cpu", log_dir=str(tmp_path_factory.mktemp("engine-logs")),
                    start_timeout_s=300)
    with engine.serve(smol(model_dir), "smol", {"max_model_len": 1024, "max_num_seqs": 16}) as r:
        yield engine, r


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOL, local_files_only=True)


# Points compared with the engine's own histograms need both scrapes. A /metrics answer can
# take over 5 s (the default bound) while 16 streams share 2 busy cores with a neighbour's load,
# and a timed-out scrape ends the point's scraping; the property here is agreement, not scrape
# latency (bounded in tests/resources/test_loadgen.py), so these points wait up to a minute.
HISTOGRAM_READER = LoadGenerator(scrape_timeout_s=60.0)


def _histograms(run) -> tuple[dict, dict]:
    """The before/after scrapes of a point, parsed; a lost one fails with its reason."""
    assert run.metrics_before is not None and run.metrics_after is not None, (
        f"{run.scrape_failures} /metrics scrape(s) failed: {run.scrape_last_error}")
    return parse_metrics(run.metrics_before), parse_metrics(run.metrics_after)


def test_start_phases_are_ordered(running):
    _, r = running
    ph = r.phases
    assert 0 < ph.weights_loaded_s < ph.health_ready_s <= ph.first_token_s
    assert ph.engine_weights_load_s is not None and ph.engine_weights_load_s > 0


def test_the_real_engine_names_its_kernels(running):
    """The CPU build's own log, read with the template's kernel_facts once it was ready:
    unquantized, KV cache at the model's dtype, eager (no CUDA graphs)."""
    _, r = running
    assert r.kernels["quantization"] == ("None",)
    assert r.kernels["kv_cache_dtype"] == ("auto",)
    assert r.kernels["cuda_graph_mode"] == ("NONE",)


def test_token_exact_prompts_and_exact_output_lengths(running, tokenizer):
    engine, r = running
    prompts = synthetic_prompts(tokenizer, 8, 100, prefix_tokens=20)
    run = HISTOGRAM_READER.run_point(r.base_url, completion_bodies("smol", prompts, 24),
                                     concurrency=4, max_seconds=120, request_timeout_s=60)
    s = summarize(run.records, run.duration_s)
    assert s.failed == 0 and s.completed == 8
    n_special = len(tokenizer.encode("x")) - len(tokenizer.encode("x", add_special_tokens=False))
    assert {rec.prompt_tokens for rec in run.records} == {100 + n_special}
    assert {rec.output_tokens for rec in run.records} == {24}
    # The server's own histograms agree with the client on what it measured.
    m = engine.template().metrics
    before, after = _histograms(run)
    server_ttft = histogram_mean_delta(before, after, m.ttft_histogram)
    assert server_ttft is not None and server_ttft <= s.ttft_s.mean
    server_itl = histogram_mean_delta(before, after, m.itl_histogram)
    assert server_itl == pytest.approx(s.itl_ms.mean / 1e3, rel=0.25)


def _point_vs_engine(engine: Engine, r, tokenizer, out_tokens: int) -> dict:
    """16 requests at a time (the engine's max_num_seqs), 32 of them: client vs histograms,
    the tokens counted as the serving benchmark has this engine count them (its template)."""
    prompts = synthetic_prompts(tokenizer, 32, 20)
    count = engine.template().load_generator.count_tokens_by
    run = HISTOGRAM_READER.run_point(r.base_url,
                                     completion_bodies("smol", prompts, out_tokens,
                                                       count_tokens_by=count),
                                     concurrency=16, max_seconds=300, request_timeout_s=300)
    s = summarize(run.records, run.duration_s)
    m = engine.template().metrics
    before, after = _histograms(run)
    server_itl_ms = histogram_mean_delta(before, after, m.itl_histogram) * 1e3
    per_text_chunk_ms = 1e3 * sum(sum(x.itl_s) for x in run.records) / sum(
        x.content_chunks - 1 for x in run.records)  # what one token per chunk would say
    return {"completed": s.completed, "tokens_per_chunk": s.tokens_per_chunk,
            "itl_basis": s.itl_basis, "client_itl_ms": s.itl_ms.mean,
            "server_itl_ms": server_itl_ms, "per_text_chunk_itl_ms": per_text_chunk_ms,
            "client_ttft_s": s.ttft_s.mean,
            "server_ttft_s": histogram_mean_delta(before, after, m.ttft_histogram)}


def stutter_plan(steady_itl_ms: float, tokens_per_stop: float = 3.0,
                 stopped_share: float = 0.3) -> tuple[float, float]:
    """(stop_s, period_s) for a SIGSTOP that spans `tokens_per_stop` of the engine's steps.

    The fault must cause what it is for on any machine: the API server stopped long enough for
    about three tokens to pile up per request, whatever one token takes here (54 ms on a quiet
    2-core machine, 122 ms on a slower one, where a fixed 0.15 s stop spanned about one token
    and hardly merged anything). Never shorter than the 0.15 s it was tuned with;
    stopped `stopped_share` of the time."""
    stop_s = max(0.15, tokens_per_stop * steady_itl_ms / 1e3)
    return stop_s, stop_s / stopped_share


def test_stutter_scales_with_the_measured_itl():
    assert stutter_plan(54.0) == pytest.approx((0.162, 0.54))
    assert stutter_plan(122.5) == pytest.approx((0.3675, 1.225))
    assert stutter_plan(10.0) == pytest.approx((0.15, 0.5))  # the floor it was tuned with


# a neighbour's load moved the steady reading to 3.4 % (client 52.2 ms, engine 54.1 ms, one
# whole-suite run of three on 2026-12-05; it passed alone). Likely, not measured: the API
# server, short of CPU, delays first chunks more than last ones, shortening the client's span
@pytest.mark.alone(first=False)
def test_client_itl_is_the_engines_even_when_its_api_server_lags(running, tokenizer):
    """Mean ITL per token agrees with vLLM's `inter_token_latency_seconds` histogram.

    On 2 cores vLLM hardly coalesces by itself: the CPU engine's step grows with the batch, so
    its API server keeps up (1.0002 tokens per chunk measured at 256 concurrent requests). A
    starved API server is made here the way it happens on a GPU, by stopping it: SIGSTOP for
    about three of the steady point's ITLs, 30 % of the time, while the engine core keeps
    generating (`stutter_plan`). Its outputs pile up and go out merged (1.15-1.20 tokens per
    chunk measured), which read as one token per chunk would be 15-20 % too slow. Tolerance
    3 %: a pause over a request's first or last chunk shifts its sum of gaps by at most three
    ITLs over 127 gaps (2.4 %); the pooled mean measured within 0.2 %. Where the stops still
    merged too little to tell the two readings apart, that is said with the numbers (a skip),
    since the property the test is about needs merged chunks to be shown at all.
    """
    engine, r = running
    steady = _point_vs_engine(engine, r, tokenizer, 128)
    assert steady["completed"] == 32 and steady["itl_basis"] == "per token"
    assert steady["client_itl_ms"] == pytest.approx(steady["server_itl_ms"], rel=0.03)
    stop_s, period_s = stutter_plan(steady["server_itl_ms"])
    stop = threading.Event()

    def stutter() -> None:
        while not stop.wait(period_s - stop_s):
            os.kill(r.pid, signal.SIGSTOP)
            try:
                time.sleep(stop_s)
            finally:
                os.kill(r.pid, signal.SIGCONT)

    lagging = threading.Thread(target=stutter, daemon=True)
    lagging.start()
    try:
        stalled = _point_vs_engine(engine, r, tokenizer, 128)
    finally:
        stop.set()
        lagging.join()
    measured = {"steady": steady, "stalled_api_server": stalled,
                "stop_s": stop_s, "period_s": period_s}
    print(json.dumps(measured))
    assert stalled["completed"] == 32
    # The property holds or fails whatever merged; assert it before deciding whether it showed.
    assert stalled["client_itl_ms"] == pytest.approx(stalled["server_itl_ms"], rel=0.03)
    if stalled["tokens_per_chunk"] <= 1.05:
        pytest.skip(f"stopping the API server {stop_s:.3f} s every {period_s:.3f} s merged only "
                    f"{stalled['tokens_per_chunk']:.3f} tokens per chunk (need > 1.05 to tell a "
                    f"per-token reading from a per-chunk one); steady ITL "
                    f"{steady['server_itl_ms']:.1f} ms, stalled client "
                    f"{stalled['client_itl_ms']:.2f} ms vs engine "
                    f"{stalled['server_itl_ms']:.2f} ms")
    assert stalled["per_text_chunk_itl_ms"] > 1.05 * stalled["server_itl_ms"]


def test_a_prompt_over_max_model_len_is_an_http_error_with_cause(running, tokenizer):
    _, r = running
    prompt = synthetic_prompts(tokenizer, 1, 1100)
    run = LoadGenerator().run_point(r.base_url, completion_bodies("smol", prompt, 8),
                                    concurrency=1, max_seconds=60, request_timeout_s=60)
    assert [rec.error for rec in run.records] == ["http_400"]


def test_metrics_names_in_the_template_exist(running):
    engine, r = running
    with urllib.request.urlopen(r.base_url + "/metrics") as resp:
        names = parse_metrics(resp.read().decode())
    m = engine.template().metrics
    for name in (m.running, m.waiting, m.kv_cache_usage, f"{m.ttft_histogram}_count",
                 f"{m.itl_histogram}_sum", m.prefix_cache_queries, m.prefix_cache_hits):
        assert name in names, name



@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package "
                    "`prometheus`; scripts/dev.sh setup installs it)")
def test_a_real_prometheus_evaluates_the_rendered_rules_on_the_real_engine(running, tokenizer,
                                                                           configs, tmp_path):
    """Debian's Prometheus on 127.0.0.1 scrapes the engine through the rendered scrape config and
    evaluates the rendered rules (evaluation shortened to seconds): the recording rules have
    values, the dashboard's queries parse, the queue alert stays quiet at the measured operating
    point (one request at a time) and fires on an overload of 8 at once, as the server's own
    Alerts page shows (its screenshot is docs/screenshot-prometheus-alert.png)."""
    engine, r = running
    m = engine.template().metrics
    write_spec(configs, KEY, "s3://models/smollm2-135m-instruct/")
    slo = dataclasses.replace(resolve_slo(configs.slo_section(), "cpu", configs.spec(KEY)),
                              target_concurrency=1)
    # the saturation point, measured here: one point at concurrency 1 judged at the cpu SLO
    run = LoadGenerator().run_point(r.base_url, completion_bodies(
        "smol", synthetic_prompts(tokenizer, 3, 32), 16), concurrency=1, max_seconds=120,
        request_timeout_s=60)
    bench, _, violations = headline(KEY, "bf16", "cpu", 1, slo,
                                    {"chat": [(1, summarize(run.records, run.duration_s))]},
                                    by_concurrency=True)
    bench = dataclasses.replace(bench, config_hash="cpu-e2e")
    assert bench.saturation_concurrency == 1, f"the engine missed the cpu SLO: {violations}"
    ops = configs.operations().model_copy(update={"evaluation": Evaluation.model_validate(
        {"window": "20s", "for": "2s", "engine_down_for": "5s", "scrape_interval": "1s"})})
    t = Target(model=KEY, served_name="smol", node_type="cpu", namespace="models",
               service=f"{KEY}-cpu", precision="bf16", tensor_parallel=1, config_hash="cpu-e2e",
               port=r.port, metrics_path=m.path, gpu_product="cpu")
    rendered = render_operations(t, m, slo, bench, None, ops)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rendered.rule_file(), sort_keys=False))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(local_scrape_config(
        t, f"127.0.0.1:{r.port}", [str(tmp_path / "rules.yml")], ops), sort_keys=False))
    sel = f'{{model="{KEY}", node_type="cpu"}}'
    with prometheus_server(tmp_path / "prometheus.yml", tmp_path / "tsdb",
                           tmp_path / "prometheus.log") as prom:
        target = prom.wait_for("the engine's target up", lambda: [
            x for x in prom.get("/api/v1/targets")["data"]["activeTargets"]
            if x["health"] == "up"], 60)[0]
        assert {k: target["labels"][k] for k in ("model", "node_type", "precision", "tp")} == \
            {"model": KEY, "node_type": "cpu", "precision": "bf16", "tp": "1"}
        # the measured operating point (one request at a time): the queue alert stays quiet
        seen = _alerts_during(prom, r.base_url, completion_bodies(
            "smol", synthetic_prompts(tokenizer, 6, 32), 16), concurrency=1)
        assert "ModelQueueAboveSaturation" not in seen, seen
        for rec_name in ("requests_in_flight:per_instance", "ttft_seconds:p95_20s",
                         "itl_seconds:mean_20s", "kv_cache_usage:max"):
            result = prom.wait_for(f"a value of model_onboarding:{rec_name}", lambda n=rec_name: (
                prom.query(f"model_onboarding:{n}{sel}")["data"]["result"]), 30)
            assert float(result[0]["value"][1]) >= 0
        for expr in dashboard_queries(render_dashboard(t, rendered, ops.evaluation.window)):
            assert prom.query(expr)["status"] == "success", expr
        assert prom.query(f"{m.running}{sel} +")["errorType"] == "bad_data"  # a parse error
        overload = completion_bodies("smol", synthetic_prompts(tokenizer, 24, 16), 48)
        # Prometheus's own Alerts page while it fires (docs/operations.md shows it)
        shot = PROJECT_ROOT / "test-artifacts" / "e2e" / "prometheus-alert.png"
        with alerts_page() as shoot, _sustained(r.base_url, overload, concurrency=8):
            firing = prom.wait_for("ModelQueueAboveSaturation firing", lambda: [
                a for a in prom.alerts() if a["labels"]["alertname"] ==
                "ModelQueueAboveSaturation" and a["state"] == "firing"], 180)
            shown = shoot(prom, "ModelQueueAboveSaturation", shot)
    assert shown == "firing" and shot.stat().st_size > 20_000
    keep_for_docs(shot, "screenshot-prometheus-alert.png")
    assert firing[0]["labels"]["model"] == KEY
    assert float(firing[0]["value"]) > bench.saturation_concurrency
    assert "measured saturation concurrency 1" in firing[0]["annotations"]["source"]


@contextlib.contextmanager
def _sustained(base_url: str, bodies: list[bytes], concurrency: int,
               max_seconds: float = 300.0) -> Iterator[None]:
    """`bodies` sent at `concurrency`, round after round, until the block ends: an alert's
    `for` must see the load last however fast this machine serves one round (a single round
    can end before a rule evaluated it twice)."""
    stop = threading.Event()

    def rounds() -> None:
        end = time.monotonic() + max_seconds
        while not stop.is_set() and time.monotonic() < end:
            LoadGenerator().run_point(base_url, bodies, concurrency=concurrency,
                                      max_seconds=60, request_timeout_s=300)

    load = threading.Thread(target=rounds, daemon=True)
    load.start()
    try:
        yield
    finally:
        stop.set()
        load.join()


def _alerts_during(prom, base_url: str, bodies: list[bytes], concurrency: int) -> set[str]:
    """The alerts (pending or firing) the server reports at any poll while a point runs."""
    point = threading.Thread(target=LoadGenerator().run_point, args=(base_url, bodies),
                             kwargs={"concurrency": concurrency, "max_seconds": 120,
                                     "request_timeout_s": 60})
    seen: set[str] = set()
    point.start()
    while point.is_alive():
        seen |= {a["labels"]["alertname"] for a in prom.alerts()}
        time.sleep(0.5)
    point.join()
    return seen
