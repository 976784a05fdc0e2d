"""`load_timing` and `serving_benchmark` in a real Dagster instance, against the fake engine
fixture (fast); the real vLLM CPU engine is exercised in tests/e2e/test_serving_vllm.py. Both are
cells (model x node type): the upstream stages are stored at their levels (the per-model ones
under the model), the measurements run in the cell of the engine's node type."""

import json
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import yaml

from assets.node_gate import NODE_CHECK
from assets.partitions import cell_key, nodes_partitions
from assets.serving import (
    COLD_START_CHECK,
    KERNEL_CHECK,
    SLO_CHECK,
    config_search,
    load_timing,
    serving_benchmark,
)
from assets.stack import current_stack
from bench.gpu_recordings import folder
from bench.openai_stream_server import install_as_vllm
from onboarding.common.refs import CheckpointRef, VariantRef
from onboarding.deploy.serving_plan import ServingPlan
from onboarding.nodes.acceptance import NodeAcceptance
from onboarding.quantize.variants import QuantizedSet
from onboarding.serving.stats import LoadTimingResult
from resources.config_files import ConfigFiles, OutputDirs
from resources.engine import Engine
from resources.loadgen import LoadGenerator
from resources.stack_facts import nvidia_facts
from resources.telemetry import GpuTelemetry
from resources.upstream import optional_upstream
from tests.conftest import tiny_with_smol_tokenizer, write_spec
from tests.dagster_support import metadata, register, store_upstream, upstream_specs

KEY = "tiny-model"
CELL = str(cell_key(KEY, "cpu"))  # the fake engine's cell


@pytest.fixture
def model_dir(tiny_checkpoint, tmp_path) -> Path:
    """The tiny random Llama plus SmolLM2's tokenizer (the benchmark builds token-exact prompts)."""
    return tiny_with_smol_tokenizer(tiny_checkpoint, tmp_path / "variant")


@pytest.fixture
def fake_engine(tmp_path, monkeypatch, configs: ConfigFiles) -> Engine:
    monkeypatch.setenv("FAKE_TTFT_MS", "5")
    monkeypatch.setenv("FAKE_ITL_MS", "2")
    return Engine(bin_dir=str(install_as_vllm(tmp_path / "bin")), hardware="cpu",
                  node_type="cpu", start_timeout_s=30,
                  log_dir=str(tmp_path / "logs"), configs=configs)


def stub_variant(path: Path, precision: str = "bf16") -> dict:
    """What the upstream stages store: the baseline checkpoint and the chosen variant."""
    return {
        "checkpoint": CheckpointRef(model=KEY, source="s3://models/tiny/", revision="r",
                                    path=str(path), content_hash="base", total_bytes=1),
        "serving_variant": VariantRef(model=KEY, precision=precision, path=str(path),
                                      total_bytes=1, content_hash="stub"),
        "quantized": QuantizedSet(KEY, str(path), 1, ()),
        # No node type of nodes.yaml is "cpu": the engine at hand runs its own configuration.
        "serving_config": ServingPlan(plan=None, configs={}),
    }


RUN_CONFIG = {"ops": {
    "load_timing": {"config": {"cold_repeats": 2, "cold_weights_repeats": 1, "warm_repeats": 1}},
    "serving_benchmark": {"config": {"concurrency": [1, 2, 4], "requests_per_point": 8}},
}}


def run_levels(upstream: dict, assets: list, engine: Engine, run_config, instance=None,
               **resources):
    """The `upstream` values stored at their levels (the per-model ones under the model), then
    `assets` run in the cell of the engine's node type."""
    instance = instance or dg.DagsterInstance.ephemeral()
    register(instance, KEY, engine.node_type)
    store_upstream(instance, KEY, node_type=engine.node_type, **upstream)
    return dg.materialize(
        [*upstream_specs(*upstream, *([] if config_search in assets else ["config_search"])),
         *assets], instance=instance,
        partition_key=str(cell_key(KEY, engine.node_type)),
        resources={"engine": engine, "configs": engine.configs,
                   "optional_upstream": optional_upstream, **resources},
        run_config=run_config, raise_on_error=False)


def materialize(upstream, engine: Engine, run_config=RUN_CONFIG, instance=None):
    """The engine's configs are the test's; reports go beside its logs."""
    outputs = OutputDirs(reports_dir=str(Path(engine.log_dir).parent / "reports"))
    return run_levels(upstream, [load_timing, serving_benchmark], engine, run_config,
                      instance, loadgen=LoadGenerator(), telemetry=GpuTelemetry(),
                      optional_upstream=optional_upstream, outputs=outputs)


def b_hash(result) -> str:
    return metadata(result, "serving_benchmark")["config_hash"]


def check_result(result, name: str = SLO_CHECK) -> dg.AssetCheckEvaluation:
    return next(e.event_specific_data for e in result.all_events
                if e.event_type_value == "ASSET_CHECK_EVALUATION"
                and e.event_specific_data.check_name == name)


@pytest.mark.slow
def test_timing_and_benchmark_emit_what_the_plan_reads(config_dir, model_dir, fake_engine):
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat", "rag"],
               engine_args={"max_model_len": 2048})
    result = materialize(stub_variant(model_dir), fake_engine)
    assert result.success
    t = metadata(result, "load_timing")
    for key in ("cold_start_p95_s", "cold_start_p50_s", "warm_start_p50_s", "weight_bytes",
                "weights_load_gbps", "raw_read_gbps"):
        assert isinstance(t[key], int | float) and t[key] > 0, key
    assert t["weight_bytes"] == sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    assert all(k in t["starts"] for k in ("fully_cold", "cold_weights", "warm"))
    assert t["cold_weights_p50_s"] > 0 and "empty" in t["which_caches_were_cold"]
    assert t["config_hash"] == b_hash(result) and len(t["config_hash"]) == 12
    assert t["servable"] is True and t["substituted"] == "no"
    cold_check = check_result(result, COLD_START_CHECK)
    assert cold_check.passed and cold_check.metadata["expected_max_s"].value == 120
    kernel_check = check_result(result, KERNEL_CHECK)  # bf16 on the CPU: no rule
    assert kernel_check.passed and kernel_check.metadata["status"].value == "not judged"
    b = metadata(result, "serving_benchmark")
    assert b["node_type"] == "cpu" and b["gpus"] == 0
    assert b["saturation_concurrency"] == 4 and b["slo_pass"] is True
    assert b["tokens_per_s_per_gpu"] > 0
    assert "| chat" in b["sweep"] and "| rag" in b["sweep"]
    assert b["plot"].startswith("![sweep](data:image/png;base64,")
    assert Path(b["plot_path"]).read_bytes()[:4] == b"\x89PNG"
    # the cell's folder: a measurement on one node type never overwrites another's
    assert Path(b["plot_path"]).parent == Path(fake_engine.log_dir).parent / "reports" / KEY / "cpu"
    ev = check_result(result)
    assert ev.check_name == SLO_CHECK and ev.passed
    value = result.output_for_node("serving_benchmark")
    assert value.saturation_concurrency == 4 and value.slo_pass
    assert t["serving_stack_fingerprint"] == b["serving_stack_fingerprint"] == \
        current_stack(fake_engine.configs)[0]
    sweep = pd.read_csv(Path(b["plot_path"]).with_suffix(".csv"))
    assert set(sweep["engine_exited"]) == {False}
    # The engine's frontend (here the fake engine's one process) read beside every point.
    # /proc CPU ticks are 10 ms: a short point can read 0, but the sampler must see the server
    assert (sweep["frontend_cpu_cores"] >= 0).all() and (sweep["frontend_cpu_cores"] > 0).any()
    assert sweep["frontend_bound"].dtype == bool
    assert "frontend_cpu_cores" in b["sweep"]
    assert b["frontend_bound_points"] == [
        f"{r.scenario} @ {r.load}" for r in sweep.itertuples() if r.frontend_bound]
    # measured on this host, whose acceptance the cpu profile does not require
    assert t["node"] == b["node"] == fake_engine.resolved_node_name()
    node_checks = node_check_results(result)
    assert all(c.passed and c.metadata["required"].value is False
               for c in node_checks.values()) and set(node_checks) == {
                   "load_timing", "serving_benchmark"}


def node_check_results(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.asset_key.to_user_string(): e for e in result.get_asset_check_evaluations()
            if e.check_name == NODE_CHECK}


def accept(instance: dg.DagsterInstance, node: str, qualified: bool, facts: dict) -> None:
    """A node_acceptance of `node` storing the value the real asset stores (what the gate
    reads)."""
    @dg.asset(name="node_acceptance", partitions_def=nodes_partitions)
    def _acceptance():
        return NodeAcceptance(node=node, node_type="h200", qualified=qualified,
                              reasons=() if qualified else ("phase 2 burn_xid: XID 79",),
                              phases=(), checks=(), stack_facts=facts, stack_fingerprint="fp",
                              accepted_at=1.7e9)

    instance.add_dynamic_partitions(nodes_partitions.name, [node])
    assert dg.materialize([_acceptance], instance=instance, partition_key=node).success


@pytest.mark.slow
def test_a_profile_requiring_acceptance_counts_results_only_on_an_accepted_node(
        config_dir, model_dir, fake_engine):
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat"],
               engine_args={"max_model_len": 2048})
    scenarios = yaml.safe_load((config_dir / "scenarios.yaml").read_text())
    scenarios["profiles"]["cpu"]["require_node_acceptance"] = True
    (config_dir / "scenarios.yaml").write_text(yaml.safe_dump(scenarios))
    engine = Engine(bin_dir=fake_engine.bin_dir, hardware="cpu", node_type="cpu",
                    node_name="gpu-node-07", start_timeout_s=30, log_dir=fake_engine.log_dir,
                    configs=fake_engine.configs)
    cfg = {"ops": {"load_timing": {"config": {"cold_repeats": 1, "warm_repeats": 0}},
                   "serving_benchmark": {"config": {"concurrency": [1], "requests_per_point":
                                                    2}}}}
    instance = dg.DagsterInstance.ephemeral()
    result = materialize(stub_variant(model_dir), engine, cfg, instance)
    checks = node_check_results(result)
    for asset in ("load_timing", "serving_benchmark"):
        assert not checks[asset].passed and checks[asset].severity == \
            dg.AssetCheckSeverity.ERROR
        assert "'gpu-node-07' has no node_acceptance" in checks[asset].metadata[
            "acceptance"].value
    assert metadata(result, "load_timing")["node"] == "gpu-node-07"  # measured, not counted
    accept(instance, "gpu-node-07", False, nvidia_facts())
    checks = node_check_results(materialize(stub_variant(model_dir), engine, cfg, instance))
    assert "is not qualified: phase 2 burn_xid: XID 79" in checks["load_timing"].metadata[
        "acceptance"].value
    accept(instance, "gpu-node-07", True, nvidia_facts())
    checks = node_check_results(materialize(stub_variant(model_dir), engine, cfg, instance))
    assert all(c.passed for c in checks.values()) and len(checks) == 2


@pytest.mark.slow
def test_slo_miss_fails_the_check_with_the_numbers(config_dir, model_dir, fake_engine):
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat"],
               slo={"itl_mean_ms": 0.5})
    scenarios = yaml.safe_load((config_dir / "scenarios.yaml").read_text())
    scenarios["profiles"]["cpu"]["slo_severity"] = "error"
    (config_dir / "scenarios.yaml").write_text(yaml.safe_dump(scenarios))
    result = materialize(stub_variant(model_dir), fake_engine)
    b = metadata(result, "serving_benchmark")
    assert b["slo_pass"] is False and b["saturation_concurrency"] == 0
    ev = check_result(result)
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
    violations = ev.metadata["violations"].value
    assert any("mean ITL" in v and "> 0.5 ms" in v for v in violations)


@pytest.mark.slow
def test_nvfp4_on_cpu_measures_the_baseline_in_its_place_and_says_so(config_dir, model_dir,
                                                                       fake_engine):
    write_spec(config_dir, KEY, "s3://models/tiny/")
    result = materialize(stub_variant(model_dir, "nvfp4"), fake_engine)
    assert result.success
    t = metadata(result, "load_timing")
    assert t["servable"] is False and t["precision"] == "bf16"
    assert t["serving_precision"] == "nvfp4"
    assert "bf16 baseline in place of nvfp4" in t["substituted"]
    assert "nvfp4 needs sm100, sm103" in t["substituted"]
    assert t["cold_start_p95_s"] > 0 and t["servable_precisions"] == ["bf16"]
    b = metadata(result, "serving_benchmark")
    assert b["precision"] == "bf16" and b["servable"] is False
    assert b["tokens_per_s_per_gpu"] > 0


def test_without_substitution_nvfp4_on_cpu_is_recorded_and_nothing_starts(
        config_dir, model_dir, fake_engine):
    write_spec(config_dir, KEY, "s3://models/tiny/")
    cfg = {"ops": {"load_timing": {"config": {"substitute_baseline": False}},
                   "serving_benchmark": {"config": {"substitute_baseline": False}}}}
    result = materialize(stub_variant(model_dir, "nvfp4"), fake_engine, cfg)
    assert result.success
    t = metadata(result, "load_timing")
    assert t["servable"] is False and "nvfp4 needs sm100, sm103" in t["reason"]
    assert t["servable_precisions"] == ["bf16"] and "cold_start_p95_s" not in t
    b = metadata(result, "serving_benchmark")
    assert b["servable"] is False and b["slo_pass"] is False
    assert not check_result(result).passed
    assert not check_result(result, COLD_START_CHECK).passed
    assert not Path(fake_engine.log_dir).exists()  # no engine was started


@pytest.mark.slow
def test_scenario_longer_than_max_model_len_fails_before_the_engine_starts(
        config_dir, model_dir, fake_engine):
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["rag"],
               engine_args={"max_model_len": 256})
    cfg = {"ops": {**RUN_CONFIG["ops"],
                   "load_timing": {"config": {"cold_repeats": 1, "cold_weights_repeats": 0,
                                              "warm_repeats": 0}}}}
    result = materialize(stub_variant(model_dir), fake_engine, cfg)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "serving_benchmark"
    assert "max-model-len 256" in failure.event_specific_data.error.to_string()
    logs = list(Path(fake_engine.log_dir).glob("*.log"))
    assert len(logs) == 1  # the one load_timing start; none for the refused benchmark


def stub_load_timing() -> LoadTimingResult:
    return LoadTimingResult(model=KEY, precision="bf16", servable=True, reason="")


@pytest.mark.slow
def test_an_engine_that_dies_mid_sweep_fails_the_step_with_its_exit_code_and_keeps_the_points(
        config_dir, model_dir, fake_engine, tmp_path, monkeypatch):
    """The fake engine crashes during the 15th completion (the readiness probe is the 1st,
    point 1 is 2 warm-up + 8, so this is inside point 2)."""
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat"])
    monkeypatch.setenv("FAKE_FAULT", "exit")
    monkeypatch.setenv("FAKE_FAULT_EVERY", "15")
    monkeypatch.setenv("FAKE_EXIT_CODE", "7")
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(tmp_path / "record.json"))
    instance = dg.DagsterInstance.ephemeral()
    result = run_levels(
        {**stub_variant(model_dir), "load_timing": stub_load_timing()}, [serving_benchmark],
        fake_engine,
        {"ops": {"serving_benchmark": {"config": {
            "concurrency": [1, 2, 4], "requests_per_point": 8}}}}, instance,
        loadgen=LoadGenerator(), telemetry=GpuTelemetry(), optional_upstream=optional_upstream,
        outputs=OutputDirs(reports_dir=str(tmp_path / "reports")))
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "serving_benchmark"
    message = failure.event_specific_data.error.to_string()
    assert "exited with code 7 during point chat @ 2" in message
    assert "injected crash mid-stream" in message  # the engine's log tail
    [csv] = list((tmp_path / "reports" / KEY / "cpu").glob("serving_benchmark.partial-*.csv"))
    assert str(csv) in message
    rows = pd.read_csv(csv)
    assert list(rows["load"]) == [1, 2]  # the sweep stopped; point 3 was never run
    assert list(rows["engine_exited"]) == [False, True]
    assert rows["completed"][0] == 8 and rows["failed"][0] == 0
    assert "connect_failed" in rows["errors_by_cause"][1]
    [obs] = instance.fetch_observations(dg.AssetKey("serving_benchmark"), limit=1).records
    md = obs.asset_observation.metadata
    assert obs.asset_observation.partition == CELL
    assert md["engine_exit_code"].value == 7 and md["partial_csv"].value == str(csv)
    assert "| chat" in md["partial_sweep"].value
    assert not instance.fetch_materializations(dg.AssetKey("serving_benchmark"), limit=1).records
    from tests.resources.test_engine import _fake_engine_group_gone

    assert _fake_engine_group_gone(tmp_path / "record.json")


@pytest.mark.slow
def test_the_sweep_runs_where_load_timing_never_materialized(config_dir, model_dir, fake_engine,
                                                             tmp_path):
    """load_timing fails on a node that cannot evict the page cache (a gVisor sandbox: fadvise
    is a no-op there); the benchmark does not need its numbers, only its place in the graph,
    so a later run of serving_benchmark alone still measures."""
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat"])
    result = run_levels(
        stub_variant(model_dir), [*upstream_specs("load_timing", "config_search"), serving_benchmark],
        fake_engine, {"ops": {"serving_benchmark": {"config": {
            "concurrency": [1, 2], "requests_per_point": 4}}}},
        loadgen=LoadGenerator(), telemetry=GpuTelemetry(), optional_upstream=optional_upstream,
        outputs=OutputDirs(reports_dir=str(tmp_path / "reports")))
    assert result.success
    assert result.output_for_node("serving_benchmark").tokens_per_s_per_gpu > 0
    assert metadata(result, "serving_benchmark")["engine_start"].startswith("started for")


def _starts(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_the_quick_pass_makes_one_start_the_cold_start_check_judges_and_benchmarks_on_it(
        config_dir, model_dir, fake_engine, tmp_path, monkeypatch):
    """The shipped quick sweep (configs/automation.yaml): load_timing starts the
    engine once, fully cold, the kind its check judges; the benchmark then runs on that start
    (no second one) and says which it was; the skipped kinds read as not measured."""
    from resources.config_files import ConfigFiles

    starts = tmp_path / "starts.jsonl"
    monkeypatch.setenv("FAKE_ENGINE_STARTS", str(starts))
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat"])
    quick = ConfigFiles().automation().launch.run_config("quick")
    result = materialize(stub_variant(model_dir), fake_engine, quick)
    assert result.success
    assert len(_starts(starts)) == 1
    t = metadata(result, "load_timing")
    assert t["cold_start_p95_s"] > 0 and check_result(result, COLD_START_CHECK).passed
    assert t["warm_start_p50_s"] is None and t["cold_weights_p50_s"] is None
    b = metadata(result, "serving_benchmark")
    assert b["engine_start"].startswith("reused load_timing's fully_cold start")


@pytest.mark.slow
def test_the_benchmark_measures_on_load_timings_last_start_not_a_start_of_its_own(
        config_dir, model_dir, fake_engine, tmp_path, monkeypatch):
    """One run, one configuration: load_timing's starts (2 fully cold, 1 cold weights, 1 warm)
    are its measurement; the sweep then runs on the warm start's engine (no fifth start) and
    says so; no engine is left when the run ends."""
    from tests.resources.test_engine import group_members

    starts = tmp_path / "starts.jsonl"
    monkeypatch.setenv("FAKE_ENGINE_STARTS", str(starts))
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat"])
    result = materialize(stub_variant(model_dir), fake_engine)
    assert result.success
    seen = _starts(starts)
    assert len(seen) == 4
    b = metadata(result, "serving_benchmark")
    assert b["engine_start"].startswith("reused load_timing's warm start")
    assert b["config_hash"] in b["engine_start"]
    assert "prefix cache" in b["engine_start"]
    assert [group_members(s["pid"]) for s in seen] == [[], [], [], []]


@pytest.mark.slow
def test_a_handed_off_engine_is_reaped_at_the_end_of_a_run_without_the_benchmark(
        config_dir, model_dir, fake_engine, tmp_path, monkeypatch):
    from tests.resources.test_engine import group_members

    starts = tmp_path / "starts.jsonl"
    monkeypatch.setenv("FAKE_ENGINE_STARTS", str(starts))
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat"])
    result = run_levels(stub_variant(model_dir), [load_timing], fake_engine,
                        {"ops": {"load_timing": RUN_CONFIG["ops"]["load_timing"]}})
    assert result.success
    seen = _starts(starts)
    assert len(seen) == 4 and [group_members(s["pid"]) for s in seen] == [[], [], [], []]


class RecordingLoadGenerator(LoadGenerator):
    """The real load generator, which also writes down the prompts each point sent (one JSON
    line per point: its measured prompts and its warm-up prompts)."""

    record_to: str

    def run_point(self, base_url, bodies, **kw):
        prompts = [json.loads(b)["prompt"] for b in bodies]
        warm = [json.loads(b)["prompt"] for b in kw.get("warmup_bodies", ())]
        with open(self.record_to, "a") as f:
            f.write(json.dumps({"measured": prompts, "warmup": warm,
                                "load": kw.get("concurrency", kw.get("rate_rps")),
                                "warmup_concurrency": kw.get("warmup_concurrency")}) + "\n")
        return super().run_point(base_url, bodies, **kw)


def _recorded_sweep(config_dir, model_dir, fake_engine, tmp_path, concurrency: list[int]
                    ) -> list[dict]:
    """`serving_benchmark` over chat and rag at `concurrency` (4 requests per point) against
    the fake engine, and what each point sent (RecordingLoadGenerator's lines)."""
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat", "rag"],
               engine_args={"max_model_len": 2048})
    record = tmp_path / "prompts.jsonl"
    result = run_levels(
        stub_variant(model_dir), [*upstream_specs("load_timing", "config_search"), serving_benchmark],
        fake_engine, {"ops": {"serving_benchmark": {"config": {
            "concurrency": concurrency, "requests_per_point": 4}}}},
        loadgen=RecordingLoadGenerator(record_to=str(record)), telemetry=GpuTelemetry(),
        optional_upstream=optional_upstream,
        outputs=OutputDirs(reports_dir=str(tmp_path / "reports")))
    assert result.success
    return [json.loads(line) for line in record.read_text().splitlines()]


@pytest.mark.slow
def test_each_scenario_is_warmed_once_before_its_first_point_with_its_warmups_together(
        config_dir, model_dir, fake_engine, tmp_path):
    """Warm-up requests exist to take the engine past its first requests of a scenario's
    shapes; a point that follows a measured point of the same scenario on the same engine is
    past them already. So the sweep warms each scenario once, before its first point, with its
    warm-up requests in flight together (up to the sweep's widest concurrency), not again
    before every point at that point's concurrency (a third of the quick pass's
    benchmark on the CPU; the GPU profile sent eight 2048-token codegen warm-ups one after
    another before its concurrency-1 point)."""
    points = _recorded_sweep(config_dir, model_dir, fake_engine, tmp_path, [1, 4])
    warmups = fake_engine.configs.profile("cpu", "cpu")[1].sweep.warmup_requests
    assert warmups >= 2  # so that "together" is something the old code did not do at 1
    assert [(p["load"], len(p["warmup"])) for p in points] == [(1, warmups), (4, 0)] * 2
    assert [p["warmup_concurrency"] for p in points[::2]] == [4, 4]
    assert len({w for p in points for w in p["warmup"]}) == 2 * warmups  # each scenario its own


@pytest.mark.slow
def test_no_point_of_the_sweep_resends_a_prompt_an_earlier_point_sent(config_dir, model_dir,
                                                                        fake_engine, tmp_path):
    """Every load point measures prompts the engine has not seen: a prompt sent again is served
    from the engine's prefix cache (on by default in vLLM), which skips its prefill and flatters
    that point's TTFT and throughput. Every point of a scenario once took the first N
    prompts of one list, so each point after the first re-sent the earlier points' prompts; the
    scenario's `prefix_tokens` are the only tokens its prompts are meant to share."""
    points = _recorded_sweep(config_dir, model_dir, fake_engine, tmp_path, [1, 2, 4])
    assert len(points) == 6  # chat and rag, three loads each
    measured = [p for point in points for p in point["measured"]]
    assert [len(p["measured"]) for p in points] == [4, 4, 8] * 2
    assert len(set(measured)) == len(measured), "a point re-sent a prompt already sent"
    assert not set(measured) & {p for point in points for p in point["warmup"]}


def _recorded_nvfp4_start(tmp_path: Path) -> Path:
    """One recorded start of the 8B twin's NVFP4 variant on the H200 (vLLM 0.22.0): its log
    names MarlinNvFp4LinearKernel, Hopper's weight-only FP4."""
    import tarfile
    with tarfile.open(folder("fresh_prompts") / "engine-logs.tar.gz") as tar:
        member = tar.getmember("engine-logs/engine-llama-3-1-8b-instruct-twin-50117-"
                               "1796410664.log")
        out = tmp_path / "nvfp4-start.log"
        out.write_bytes(tar.extractfile(member).read())
    assert "variants/nvfp4" in out.read_text().splitlines()[0]
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("hardware", "node_type", "passed"),
                         [("sm90", "h200", True), ("sm103", "b300", False)])
def test_the_kernel_check_reads_what_each_start_ran(config_dir, model_dir, tmp_path, monkeypatch,
                                                    configs, hardware, node_type, passed):
    """The fake engine prints the recorded H200 NVFP4 start's log; the engine resource says it
    runs on `hardware`, in the cell of the node type that has it. On Hopper the Marlin start
    passes as weight-only FP4 and says so; on a B300's sm103 the same start is a fallback and
    fails, naming the kernel and what was expected. The value stores each start's kernels."""
    write_spec(config_dir, KEY, "s3://models/tiny/")
    monkeypatch.setenv("FAKE_ENGINE_LOG_FROM", str(_recorded_nvfp4_start(tmp_path)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    engine = Engine(bin_dir=str(install_as_vllm(tmp_path / "bin")), hardware=hardware,
                    node_type=node_type, start_timeout_s=30, log_dir=str(tmp_path / "logs"),
                    configs=configs)
    run_config = {"ops": {"load_timing": {"config": {
        "cold_repeats": 1, "cold_weights_repeats": 0, "warm_repeats": 1}}}}
    result = run_levels(stub_variant(model_dir, "nvfp4"), [load_timing], engine, run_config)
    assert result.success
    value = result.output_for_node("load_timing")
    assert [k.kind for k in value.kernels] == ["fully_cold", "warm"]
    assert all(k.facts["linear_kernel"] == ("MarlinNvFp4LinearKernel",) for k in value.kernels)
    check = check_result(result, KERNEL_CHECK)
    assert check.passed is passed
    t = metadata(result, "load_timing")
    assert "MarlinNvFp4LinearKernel" in t["kernels"]
    if passed:
        assert check.metadata["passes_as"].value == (
            "weight-only FP4 (Marlin): Blackwell-only speed not measured")
    else:
        assert check.severity == dg.AssetCheckSeverity.ERROR
        assert "MarlinNvFp4LinearKernel" in check.metadata["seen_instead"].value
        assert "native FP4" in check.metadata["expected"].value


def _rate_at(config_dir: Path, **rate) -> dict:
    """configs/search.yaml's cpu rate verdict made short for the fake engine (20 req/s, a
    p90 and the catalog's p95 shown met in about 110 requests), and a run config asking it."""
    search = yaml.safe_load((config_dir / "search.yaml").read_text())
    search["rate_verdict"]["node_types"]["cpu"].update(
        {"target_rate_rps": 20.0, "min_requests": 30, "min_seconds": 0, "max_seconds": 10,
         "look_every": 10, "repeats": 2, **rate})
    (config_dir / "search.yaml").write_text(yaml.safe_dump(search))
    sb = {**RUN_CONFIG["ops"]["serving_benchmark"]["config"], "rate_verdict": True}
    return {"ops": {**RUN_CONFIG["ops"], "serving_benchmark": {"config": sb}}}


@pytest.mark.slow
def test_the_slo_is_met_at_the_target_rate_too_with_n_and_goodput(config_dir, model_dir,
                                                                  fake_engine):
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat"])
    result = materialize(stub_variant(model_dir), fake_engine, _rate_at(config_dir))
    b = metadata(result, "serving_benchmark")
    assert b["slo_pass"] is True and b["rate_verdict"] == "met"
    assert b["rate_verdict_n"] >= 2 * 100  # two runs, each until both percentiles showed met
    assert "at 20 req/s (Poisson, chat, 2 runs)" in b["rate_verdict_detail"]
    assert 0 < b["rate_goodput_rps"] <= 20 * 1.5
    bench = result.output_for_node("serving_benchmark")
    assert bench.rate_verdict == "met" and bench.rate_target_rps == 20.0
    assert bench.rate_n == b["rate_verdict_n"]


@pytest.mark.slow
def test_a_miss_at_the_target_rate_fails_the_slo_the_sweep_met(config_dir, model_dir,
                                                               fake_engine):
    """The fake engine answers its first token in 5 ms: inside the catalog's bounds at every
    concurrency of the sweep, over a 1 ms TTFT bound at the rate. One run decides it; none
    follows."""
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat"])
    result = materialize(stub_variant(model_dir), fake_engine,
                         _rate_at(config_dir, ttft_s=0.001))
    b = metadata(result, "serving_benchmark")
    assert b["slo_pass"] is False and b["rate_verdict"] == "not met"
    assert "at 20 req/s (Poisson, chat, 1 run):" in b["rate_verdict_detail"]
    ev = check_result(result)
    assert not ev.passed
    [why] = [v for v in ev.metadata["violations"].value if "req/s (Poisson" in v]
    assert why.startswith("at 20 req/s (Poisson, chat, 1 run): not met (n=")
    assert "ttft_p90" in why


def _search_on(config_dir: Path) -> None:
    """configs/search.yaml's cpu search switched on and made small for the fake engine: two
    candidates (the local configuration and 4 sequences), the rate verdict in seconds."""
    search = yaml.safe_load((config_dir / "search.yaml").read_text())
    search["search"]["node_types"]["cpu"].update(
        {"in_pipeline": True, "max_num_seqs": [4], "max_num_batched_tokens": [2048],
         "max_candidates": 2, "start_seconds": 10, "budget_minutes": 10})
    search["rate_verdict"]["node_types"]["cpu"].update(
        {"target_rate_rps": 20.0, "min_requests": 30, "min_seconds": 0, "max_seconds": 10,
         "look_every": 10, "repeats": 2})
    (config_dir / "search.yaml").write_text(yaml.safe_dump(search))


def materialize_searched(upstream, engine: Engine):
    outputs = OutputDirs(reports_dir=str(Path(engine.log_dir).parent / "reports"))
    return run_levels(upstream, [config_search, load_timing, serving_benchmark], engine,
                      RUN_CONFIG, loadgen=LoadGenerator(), telemetry=GpuTelemetry(),
                      optional_upstream=optional_upstream, outputs=outputs)


def test_a_search_that_is_off_starts_nothing_and_the_cell_keeps_its_configuration(
        config_dir, model_dir, fake_engine):
    """search.in_pipeline is false for cpu as shipped: the asset records why and starts no
    engine; the cell's measurements use the configuration they would without it."""
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat"])
    outputs = OutputDirs(reports_dir=str(Path(fake_engine.log_dir).parent / "reports"))
    result = run_levels(stub_variant(model_dir), [config_search], fake_engine, None,
                        loadgen=LoadGenerator(), outputs=outputs)
    assert result.success
    found = result.output_for_node("config_search")
    assert found.record is None and "in_pipeline is false for cpu" in found.note
    assert metadata(result, "config_search")["searched"] is False
    assert not list(Path(fake_engine.log_dir).glob("*.log"))  # no engine was started


@pytest.mark.slow
def test_the_cells_search_winner_is_what_the_cell_measures(config_dir, model_dir,
                                                           fake_engine):
    """With the search on, the cell's run searches first (two candidates, each started and
    judged at the target rate, n stated), and load timing and the sweep measure the winner's
    hash, not the plan's."""
    write_spec(config_dir, KEY, "s3://models/tiny/", scenarios=["chat"])
    _search_on(config_dir)
    result = materialize_searched(stub_variant(model_dir), fake_engine)
    assert result.success
    found = result.output_for_node("config_search")
    rec = found.record
    assert rec is not None and rec.node_type == "cpu" and rec.candidates == 2
    m = metadata(result, "config_search")
    assert m["searched"] is True and m["measured"] == 2 and m["crashed"] == 0
    assert m["measured_precision"] == "bf16" and m["substituted"] == "no"
    assert m["winner_hash"] == rec.winner_hash and m["baseline_hash"] == rec.base_hash
    assert [row["n"] >= 30 for row in rec.table] == [True, True]
    assert "n=" in found.note
    assert metadata(result, "load_timing")["config_hash"] == rec.winner_hash
    assert b_hash(result) == rec.winner_hash


def test_a_cells_search_starts_its_own_engine_only_and_says_why():
    """In the pipeline the cell's pod runs one engine's image and has the plan's precision's
    weights: the cell's search starts the plan's configuration at other TPs only, and says why
    the other precisions and engines are left out (bench/config_search.py searches those)."""
    from assets.serving import _tp_starts
    from bench.config_search import planned_serving

    cf = ConfigFiles()
    spec = cf.spec("llama-3-1-8b-instruct-twin")
    splan = planned_serving(cf, spec)
    config = splan.config("h100")
    engine = Engine(hardware="sm90", node_type="h100", gpus="0", configs=cf)
    starts, left_out = _tp_starts(cf, spec, splan, config, engine)
    assert starts == []  # one GPU at hand: no other TP
    said = "; ".join(left_out)
    assert "not published for this cell" in said
    assert f"engine sglang {cf.stack().versions['sglang']}: not installed where this search " \
        "runs" in said
    assert "engine trtllm: performance twin" in said
    assert all(not w.startswith(f"engine {config.engine}") for w in left_out)
