"""The CPU-runnable parts of the GPU scripts (the GPU runs themselves are recorded under
tests/data/gpu/ and replayed elsewhere): the config copy bench/gpu_serving.py pins to the
machine, its engine-histogram means, and the noisy-neighbour verdict of
scripts/gpu_noisy_neighbour.py."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from bench.gpu_h200_doc import regenerated
from bench.gpu_serving import BUDGET_SWEEP, _hist_delta, pinned_configs
from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.stack import load_stack
from scripts.gpu_noisy_neighbour import degradation

H200 = PROJECT_ROOT / "tests" / "data" / "gpu" / "h200"


def test_pinned_configs_from_the_recorded_versions_are_the_configs_the_h200_run_used(tmp_path):
    prepare = json.loads((H200 / "prepare.json").read_text())["steps"]
    cfg, changed = pinned_configs(tmp_path, prepare["versions"])
    recorded = prepare["configs"]["changed"]
    # images.* are no longer pinned: they follow versions.vllm through the tag rule (below)
    assert {k: v[1] for k, v in changed.items()} == {
        k: v[1] for k, v in recorded.items() if not k.startswith("images.")}
    stack, ran = (yaml.safe_load((d / "stack.yaml").read_text()) for d in (cfg, H200 / "configs"))
    pinned = ("vllm", "pytorch", "cuda", "nvidia_driver")
    assert {k: stack["versions"][k] for k in pinned} == {k: ran["versions"][k] for k in pinned}
    # The run's stack.yaml named images by hand; ours derives them from the tag rule. The H200
    # image is the one it ran; its Blackwell tags carried the -cu130 suffix vLLM stopped
    # publishing at 0.20, which the rule no longer produces.
    images = load_stack(cfg / "stack.yaml").images
    assert images["sm90"] == ran["images"]["vllm"]["sm90"]
    assert {images[a] + "-cu130" for a in ("sm100", "sm103")} == {
        ran["images"]["vllm"][a] for a in ("sm100", "sm103")}
    scenarios = yaml.safe_load((cfg / "scenarios.yaml").read_text())
    assert scenarios["profiles"]["gpu"]["require_node_acceptance"] is False
    automation = yaml.safe_load((cfg / "automation.yaml").read_text())
    assert automation["launch"]["sweeps"]["device_budget"] == BUDGET_SWEEP


def test_pinned_configs_keep_the_driver_when_nvidia_smi_said_nothing(tmp_path):
    versions = {"vllm": "0.22.0", "torch": "2.11.0+cu130", "cuda": "13.0", "gpu": ""}
    cfg, changed = pinned_configs(tmp_path, versions)
    assert "versions.nvidia_driver" not in changed
    ours = yaml.safe_load((PROJECT_ROOT / "configs" / "stack.yaml").read_text())
    stack = yaml.safe_load((cfg / "stack.yaml").read_text())
    assert stack["versions"]["nvidia_driver"] == ours["versions"]["nvidia_driver"]
    assert stack["versions"]["pytorch"] == "2.11.0"


def test_histogram_means_between_two_scrapes_in_milliseconds():
    metrics = load_stack(PROJECT_ROOT / "configs" / "stack.yaml").templates["vllm"].metrics

    def scrape(ttft_sum, ttft_count, itl_sum, itl_count) -> str:
        return "\n".join([
            f"# TYPE {metrics.ttft_histogram} histogram",
            f'{metrics.ttft_histogram}_sum{{model_name="m"}} {ttft_sum}',
            f'{metrics.ttft_histogram}_count{{model_name="m"}} {ttft_count}',
            f"# TYPE {metrics.itl_histogram} histogram",
            f'{metrics.itl_histogram}_sum{{model_name="m"}} {itl_sum}',
            f'{metrics.itl_histogram}_count{{model_name="m"}} {itl_count}', ""])

    before, after = scrape(1.0, 10, 2.0, 400), scrape(3.0, 20, 2.0, 400)
    assert _hist_delta(before, after, metrics) == {"ttft_mean_ms": 200.0, "itl_mean_ms": None}


def test_noisy_neighbour_verdict_is_within_only_when_every_ratio_is_under_the_bound():
    alone = {"p95_ttft_ms": 100.0, "mean_itl_ms": 10.0}
    ok = degradation(alone, {"p95_ttft_ms": 109.0, "mean_itl_ms": 10.5}, 0.10)
    assert ok["within"] and ok["bound"] == 1.1 and ok["ratios"]["p95_ttft_ms"] == 1.09
    worse = degradation(alone, {"p95_ttft_ms": 105.0, "mean_itl_ms": 11.5}, 0.10)
    assert not worse["within"]
    unmeasured = degradation({"p95_ttft_ms": 0.0, "mean_itl_ms": 10.0},
                             {"p95_ttft_ms": 50.0, "mean_itl_ms": 10.0}, 0.10)
    assert unmeasured["ratios"] == {"mean_itl_ms": 1.0} and unmeasured["within"]


def test_served_accuracy_script_gives_the_engine_a_python_to_read_its_version(tmp_path,
                                                                             monkeypatch):
    """Away from the CPU engine's venv (the GPU machine), bench/served_accuracy_gpu.py used to
    write only a `vllm` wrapper, so the Engine found no `bin_dir/python` and took the engine
    version as 'unknown' (the version keys the engine's flags). It now makes gpu_serving's
    two wrappers; the `python` one is the running interpreter with its packages."""
    import subprocess

    import bench.served_accuracy_gpu as script

    monkeypatch.setattr(script, "ROOT", tmp_path / "no-engine-venv-here")
    bin_dir = script.engine_bin_dir(tmp_path / "work", None)
    assert {p.name for p in bin_dir.iterdir()} == {"vllm", "python"}
    out = subprocess.run([str(bin_dir / "python"), "-c", "import yaml; print(yaml.__name__)"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "yaml"


def test_docs_gpu_h200_tables_are_the_recordings_computed_again():
    """docs/gpu.md says every number in its H200 tables is computed from tests/data/gpu/h200;
    regenerating them changes nothing, and a number typed over is put back."""
    doc = (PROJECT_ROOT / "docs" / "gpu.md").read_text()
    assert regenerated(doc) == doc
    typed = doc.replace("Job A (fetch, quantize, gate, plan, publish) took 171 s.",
                        "Job A (fetch, quantize, gate, plan, publish) took 17 s.")
    assert typed != doc and regenerated(typed) == doc


TYPED = "Typed by hand"


def test_every_table_of_docs_gpu_is_generated_or_labelled_typed_by_hand():
    """A table outside bench/gpu_h200_doc.py's generated blocks has no recording behind it that
    a test recomputes; its section must say so at its head, so no reader takes it for one."""
    import re

    doc = (PROJECT_ROOT / "docs" / "gpu.md").read_text()
    bare = re.sub(r"<!-- generated: (.*?) -->.*?<!-- end generated: \1 -->", "", doc,
                  flags=re.DOTALL)
    for section in bare.split("\n## ")[1:]:
        title, _, body = section.partition("\n")
        if any(line.startswith("|") for line in body.splitlines()):
            head = body.split("\n### ", 1)[0]
            assert TYPED in head, f"## {title}: a table with no recording behind it, and the " \
                f"section does not say '{TYPED}'"


def test_the_frontend_variants_each_differ_from_ours_by_the_ingredient_they_name():
    """The frontend experiment's clients (bench/gpu_serving.py frontend, H200 only): each body
    is the project's own with one ingredient changed, so a req/s difference on the device points at
    that ingredient; and `--frontend-clients` reads names that hold commas."""
    import json

    from bench.gpu_serving import client_names, frontend_bodies

    bodies = {k: json.loads(v[0]) for k, v in
              frontend_bodies("m", ["a b", "c d"], 8, [[1, 2], [3, 4]]).items()}
    ours = bodies["ours"]
    assert ours["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert bodies["ours, token ids per chunk"] == {
        **ours, "return_token_ids": True, "stream_options": {"include_usage": True}}
    assert bodies["ours, no count per chunk"] == {**ours, "stream_options": {"include_usage": True}}
    assert bodies["ours, random-token prompts"] == {**ours, "prompt": [1, 2]}
    assert bodies["ours, greedy, random-token prompts"] == {**ours, "prompt": [1, 2],
                                                            "temperature": 0.0}
    assert client_names("ours;ours, token ids per chunk;vllm bench serve") == (
        "ours", "ours, token ids per chunk", "vllm bench serve")
    assert client_names("ours,vllm bench serve") == ("ours", "vllm bench serve")


def test_a_frontend_round_against_a_fake_server_times_each_client_and_its_own_cpu(tmp_path):
    """One round of bench/gpu_serving.py's frontend experiment (H200 only) against the fake
    streaming server: every client asked for gives one row, in the rotated order, with the
    client's own CPU seconds beside the API server's (whether a client that cannot keep up
    explains its req/s), and an unknown client name is refused before anything is sent."""
    from types import SimpleNamespace

    import pytest
    from transformers import AutoTokenizer

    from bench.gpu_serving import frontend_point
    from bench.openai_stream_server import running_fake_server

    smol = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"
    if not (smol / "tokenizer.json").is_file():
        pytest.skip(f"{smol} not built (scripts/build_smollm2.py builds it offline)")
    tok = AutoTokenizer.from_pretrained(smol, local_files_only=True)
    vllm = load_stack(PROJECT_ROOT / "configs" / "stack.yaml").templates["vllm"]
    engine = SimpleNamespace(template=lambda: vllm)
    clients = ("ours", "ours, no count per chunk")
    with running_fake_server(ttft_ms=5, itl_ms=2) as url:
        running = SimpleNamespace(base_url=url, pid=os.getpid())  # any live pid has a /proc
        rows = frontend_point(running, engine, "m", tok, smol, tmp_path, 2, 1, 16,
                              8, only=clients)
        with pytest.raises(SystemExit, match="unknown"):
            frontend_point(running, engine, "m", tok, smol, tmp_path, 2, 0, 16, 8,
                           only=("ours", "no such client"))
    assert [r["client"] for r in rows] == [clients[1], clients[0]]  # repetition 1 starts at the second
    for r in rows:
        assert r["completed"] == 4 and r["concurrency"] == 2 and r["run"] == 1
        assert r["client_cpu_s"] > 0 and r["client_itl_ms"] > 0
    assert rows[1]["tokens_per_chunk"] == 1.0  # the fake sends one token a chunk by default


def test_the_fresh_prompts_peer_draws_new_prompts_per_run_and_the_old_one_repeats(
        tmp_path, monkeypatch):
    """The req/s gap with four API servers: `vllm bench serve` at its default seed sends the same
    random prompts in every run, which the engine's prefix cache then holds, while the project's
    client draws fresh ones. The fresh-prompts peer passes a `--seed` per run and point (the
    project's own prompt seed); the old one passes none. The peer here is a script in place of
    the engine's interpreter that records its argv and writes vllm bench's result file."""
    from types import SimpleNamespace

    import pytest
    from transformers import AutoTokenizer

    from bench.gpu_serving import PEER_SEEDS, frontend_point
    from bench.openai_stream_server import running_fake_server

    smol = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"
    if not (smol / "tokenizer.json").is_file():
        pytest.skip(f"{smol} not built (scripts/build_smollm2.py builds it offline)")
    tok = AutoTokenizer.from_pretrained(smol, local_files_only=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv_log = tmp_path / "argv.log"
    peer = bin_dir / "python"
    peer.write_text(f"""#!/bin/sh
echo "$*" >> {argv_log}
while [ $# -gt 0 ]; do [ "$1" = --result-dir ] && dir=$2; shift; done
echo '{{"completed": 4, "duration": 1.0, "request_throughput": 4.0}}' > $dir/vllm-bench.json
""")
    peer.chmod(0o755)
    vllm = load_stack(PROJECT_ROOT / "configs" / "stack.yaml").templates["vllm"]
    engine = SimpleNamespace(template=lambda: vllm)
    monkeypatch.setenv("ENGINE_BIN_DIR", str(bin_dir))
    with running_fake_server(ttft_ms=5, itl_ms=2) as url:
        running = SimpleNamespace(base_url=url, pid=os.getpid())
        rows = frontend_point(running, engine, "m", tok, smol, tmp_path, 2, 1, 16, 8,
                              only=tuple(PEER_SEEDS))
    calls = dict(zip([r["client"] for r in rows], argv_log.read_text().splitlines(),
                     strict=True))
    assert "--seed 2001" in calls["vllm bench serve, fresh prompts per run"]  # 1000 c + run
    assert "--seed" not in calls["vllm bench serve"]
    assert all(r["req_s"] == 4.0 and r["completed"] == 4 for r in rows)


@pytest.mark.slow
def test_the_frontend_warm_up_round_completes_on_prompts_no_measured_run_sends():
    """The discarded round after the engine start (bench/gpu_serving.py frontend, H200 only):
    one request per stream, all answered, on prompts drawn from a seed no measured run uses
    (1000 x concurrency + run), so it primes no prefix cache for them."""
    from types import SimpleNamespace

    import pytest
    from transformers import AutoTokenizer

    from bench.gpu_serving import WARMUP_SEED, frontend_warmup
    from bench.openai_stream_server import running_fake_server
    from onboarding.serving.prompts import synthetic_prompts

    smol = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"
    if not (smol / "tokenizer.json").is_file():
        pytest.skip(f"{smol} not built (scripts/build_smollm2.py builds it offline)")
    tok = AutoTokenizer.from_pretrained(smol, local_files_only=True)
    with running_fake_server(ttft_ms=5, itl_ms=2) as url:
        got = frontend_warmup(SimpleNamespace(base_url=url), "m", tok, 4, 16, 8)
    assert got["requests"] == got["completed"] == 4 and got["concurrency"] == 4
    measured = {tuple(synthetic_prompts(tok, 4, 16, 0, seed=1000 * c + run))
                for c in (4, 32, 128, 256) for run in range(10)}
    assert tuple(synthetic_prompts(tok, 4, 16, 0, seed=WARMUP_SEED)) not in measured
    assert all(WARMUP_SEED != 1000 * c + run for c in range(1, 1025) for run in range(100))


def test_the_frontend_divides_the_token_counter_by_how_often_each_request_was_counted():
    """vLLM 0.32 (CPU) with --api-server-count 2 counted 8 request_success for 4 requests; the
    frontend experiment's CPU per 1,000 tokens must not halve because of it."""
    from bench.gpu_serving import _counted_per_request

    before = {"vllm:request_success_total": 10.0}
    assert _counted_per_request(before, {"vllm:request_success_total": 18.0}, 4) == 2
    assert _counted_per_request(before, {"vllm:request_success_total": 14.0}, 4) == 1
    assert _counted_per_request(before, {"vllm:request_success_total": 14.0}, 0) == 1
    assert _counted_per_request({}, {}, 4) == 1  # no counter: nothing to divide by


def test_the_twins_sweep_sends_each_point_prompts_no_earlier_point_sent(tmp_path):
    """bench/gpu_serving.py twins (H200 only) sweeps through the serving benchmark's own
    `run_sweep` with PointRecorder in place of the load generator, as the device runs it, here
    against the fake streaming server: one line per point, and no prompt digest in two points
    (were every point to take the first N prompts of one list, the points at 2 and 4 would
    re-send the first point's, and vLLM's prefix cache would serve them without prefill);
    the warm-up prompts are none of them. Each line's records summarize to its sweep row."""
    from types import SimpleNamespace

    import pytest
    from transformers import AutoTokenizer

    from bench.gpu_recordings import itl_mean_ms_of, stats_of_point
    from bench.gpu_serving import REQUEST_FIELDS, PointRecorder, sweep_log
    from bench.openai_stream_server import running_fake_server
    from onboarding.serving.frontend import FrontendSampler
    from onboarding.serving.profiles import resolve_slo
    from resources.config_files import ConfigFiles
    from resources.loadgen import LoadGenerator
    from resources.sweep import run_sweep
    from resources.telemetry import GpuTelemetry

    smol = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"
    if not (smol / "tokenizer.json").is_file():
        pytest.skip(f"{smol} not built (scripts/build_smollm2.py builds it offline)")
    tok = AutoTokenizer.from_pretrained(smol, local_files_only=True)
    cf = ConfigFiles()
    twin = "llama-3-1-8b-instruct-twin"
    _, profile = cf.profile("gpu", "h200")
    # the gpu profile's chat scenario and sweep (warm-up, rounds per stream), made small
    scenarios = {"chat": profile.scenarios["chat"].model_copy(update={"output_tokens": 4})}
    sweep = profile.sweep.model_copy(update={"concurrency": [1, 2, 4], "requests_per_point": 6,
                                             "max_seconds_per_point": 30})
    slo = resolve_slo(cf.slo_section(), "h200", cf.spec(twin))
    vllm = load_stack(PROJECT_ROOT / "configs" / "stack.yaml").templates["vllm"]
    path = tmp_path / "twins-requests.jsonl"
    with running_fake_server(ttft_ms=5, itl_ms=1) as url, \
            GpuTelemetry().sampler([0]) as sampler, FrontendSampler(os.getpid()) as frontend:
        running = SimpleNamespace(base_url=url, pid=os.getpid(), exited=lambda _=None: False)
        rows, _ = run_sweep(sweep_log(twin), PointRecorder(LoadGenerator(), path, f"{twin}:fp8"),
                            running, vllm, "m", scenarios, sweep, slo, tok, sampler, frontend)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["load"] for x in lines] == [1, 2, 4] == [r["load"] for r in rows]
    assert [len(x["sent"]) for x in lines] == [6, 6, 8] == [r["requests"] for r in rows]
    sent = [d for x in lines for d in x["sent"]]
    assert len(set(sent)) == len(sent), "a point re-sent a prompt an earlier point sent"
    warm = {d for x in lines for d in x["warmup"]}
    assert len(warm) == sweep.warmup_requests and not warm & set(sent)
    for x, row in zip(lines, rows, strict=True):
        assert x["fields"] == list(REQUEST_FIELDS)
        stats = stats_of_point(x, slo)
        assert stats.ttft_s.p50 == row["ttft_p50_s"] and stats.ttft_s.p95 == row["ttft_p95_s"]
        assert stats.output_tokens_per_s == row["output_tokens_per_s"]
        assert stats.tpot_ms.mean == row["tpot_mean_ms"]
        assert abs(itl_mean_ms_of(x) - row["itl_mean_ms"]) < 1e-9
        # the fake server keeps no prefix-cache counters: they read 0, and the row's share None
        assert x["counters_after"]["prefix_cache_queries_total"] == 0
