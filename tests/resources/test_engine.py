"""The engine launcher against a fake engine executable (the fake streaming server fixture in
vLLM's CLI shape): readiness, phases, env, every start failure, and no orphan afterwards."""

import json
import os
import re
import socket
import sys
from pathlib import Path

import pytest

from bench.openai_stream_server import install_as_vllm
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import VariantRef
from resources.engine import REAP_GRACE_AFTER_DEADLINE_S, Engine, EngineError


@pytest.fixture
def fake_bin(tmp_path) -> Path:
    return install_as_vllm(tmp_path / "bin")


@pytest.fixture
def variant(tiny_checkpoint) -> VariantRef:
    return VariantRef(model="tiny", precision="bf16", path=str(tiny_checkpoint),
                      total_bytes=0, content_hash="x")


def engine(fake_bin, tmp_path, **kw) -> Engine:
    kw.setdefault("start_timeout_s", 30)
    return Engine(bin_dir=str(fake_bin), hardware="cpu", log_dir=str(tmp_path / "logs"), **kw)


def start_once(e: Engine, v: VariantRef) -> None:
    with e.serve(v, "x"):
        pass


def group_members(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                s = (d / "stat").read_text()
            except OSError:
                continue
            f = s[s.rfind(")") + 2:].split()
            if int(f[2]) == pgid and f[0] != "Z":
                out.append(int(d.name))
    return out


@pytest.mark.slow
@pytest.mark.waits
def test_ready_phases_env_and_the_whole_group_is_reaped(fake_bin, tmp_path, variant,
                                                        monkeypatch):
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(record))
    monkeypatch.setenv("FAKE_ENGINE_CHILD", "1")
    e = engine(fake_bin, tmp_path, gpus="0,1", cpu_kvcache_space_gib=3)
    with e.serve(variant, "tiny-served", {"max_num_seqs": 4}) as r:
        pid = r.pid
        assert len(group_members(pid)) >= 2  # the server and its child
        ph = r.phases
        assert 0 < ph.weights_loaded_s <= ph.health_ready_s <= ph.first_token_s
        assert ph.engine_weights_load_s is not None
    assert group_members(pid) == []
    rec = json.loads(record.read_text())
    env = rec["env"]
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    argv = rec["argv"]
    assert "--enforce-eager" in argv and "--max-num-seqs=4" in argv
    assert "--served-model-name=tiny-served" in argv
    assert e.gpu_count() == 2


def test_missing_binary_says_how_to_build_it(tmp_path, variant):
    e = Engine(bin_dir=str(tmp_path / "nowhere"), hardware="cpu")
    with pytest.raises(EngineError, match="missing or not executable.*setup.sh"):
        start_once(e, variant)


@pytest.mark.slow
@pytest.mark.waits
def test_exit_during_start_carries_the_log_tail(fake_bin, tmp_path, variant, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_EXIT_CODE", "3")
    monkeypatch.setenv("FAKE_ENGINE_CHILD", "1")
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(tmp_path / "record.json"))
    with pytest.raises(EngineError) as e, engine(fake_bin, tmp_path).serve(variant, "x"):
        pass
    msg = str(e.value)
    assert "exited with code 3" in msg and "injected failure while loading weights" in msg
    assert _fake_engine_group_gone(tmp_path / "record.json")  # its child too


@pytest.mark.parametrize("case", ["absent", "no config.json", "a file"])
def test_a_model_path_that_cannot_be_served_is_refused_before_the_engine_starts(
        case, fake_bin, tmp_path, monkeypatch):
    """vLLM found a missing model path only 16 s into its start, with the
    cause buried in its log tail; the launcher says it at once, without starting anything."""
    path = tmp_path / "models" / "tiny"
    if case == "no config.json":
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"")
    elif case == "a file":
        path.parent.mkdir(parents=True)
        path.write_text("{}")
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(record))
    broken = VariantRef(model="tiny", precision="bf16", path=str(path), total_bytes=0,
                        content_hash="x")
    with pytest.raises(EngineError) as info:
        start_once(engine(fake_bin, tmp_path), broken)
    assert str(path) in info.value.what
    said = {"absent": "does not exist", "no config.json": "holds no config.json",
            "a file": "is not a directory"}[case]
    assert said in info.value.cause and "Re-materialize" in info.value.fix
    assert not record.exists()  # the engine was never started


@pytest.mark.slow
@pytest.mark.waits
def test_never_ready_times_out_and_is_reaped(fake_bin, tmp_path, variant, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_NEVER_READY", "1")
    monkeypatch.setenv("FAKE_ENGINE_CHILD", "1")
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(tmp_path / "record.json"))
    with pytest.raises(EngineError, match=r"not ready after 2 s \(health never answered"):
        start_once(engine(fake_bin, tmp_path, start_timeout_s=2), variant)
    assert _fake_engine_group_gone(tmp_path / "record.json")


@pytest.mark.slow
@pytest.mark.waits
def test_a_start_whose_completions_hang_fails_within_its_timeout(fake_bin, tmp_path, variant,
                                                                 monkeypatch):
    """/health answers 200 but the completion probe never does, and the engine ignores SIGTERM
    (as a busy vLLM may): the timeout is the whole budget, probe included, and the reap after
    it waits only the short grace before SIGKILL. (It took 5 + 60 + 15 s before.)"""
    import time

    monkeypatch.setenv("FAKE_ENGINE_HANG_COMPLETIONS", "1")
    monkeypatch.setenv("FAKE_ENGINE_IGNORE_SIGTERM", "1")
    monkeypatch.setenv("FAKE_ENGINE_CHILD", "1")
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(tmp_path / "record.json"))
    t0 = time.monotonic()
    with pytest.raises(EngineError) as err:
        start_once(engine(fake_bin, tmp_path, start_timeout_s=5), variant)
    elapsed_s = time.monotonic() - t0
    assert elapsed_s < 5 + REAP_GRACE_AFTER_DEADLINE_S + 5  # timeout + grace + generous slack
    assert re.search(r"not ready after 5 s \(health answered 200; the completion probe "
                     r"did not succeed: .*timed out", str(err.value))
    assert _fake_engine_group_gone(tmp_path / "record.json")


def test_port_taken_is_refused_before_start(fake_bin, tmp_path, variant):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(EngineError, match=f"port {port} .*already in use"):
            start_once(engine(fake_bin, tmp_path, port=port), variant)
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").glob("*.log"))


def test_failure_inside_the_step_still_reaps(fake_bin, tmp_path, variant):
    pids = []

    def step() -> None:
        with engine(fake_bin, tmp_path).serve(variant, "x") as r:
            pids.append(r.pid)
            raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        step()
    assert group_members(pids[0]) == []


def test_unservable_precision_is_refused_with_the_reason(fake_bin, tmp_path, variant):
    fp4 = VariantRef(**{**variant.__dict__, "precision": "nvfp4"})
    e = engine(fake_bin, tmp_path)
    assert e.servable_precisions() == ["bf16"]
    with pytest.raises(EngineError, match="serves bf16, not nvfp4; nvfp4 needs sm100, sm103"):
        start_once(e, fp4)


@pytest.mark.slow
def test_three_kinds_of_start_weights_and_caches(fake_bin, tmp_path, variant, monkeypatch):
    """fully_cold: weights evicted and an empty compile cache each time; cold_weights: weights
    evicted, the last fully cold start's cache; warm: weights resident, same cache."""
    starts = tmp_path / "starts.jsonl"
    monkeypatch.setenv("FAKE_ENGINE_STARTS", str(starts))
    e = engine(fake_bin, tmp_path)
    samples, raw = e.time_starts(variant, e.adhoc_config(variant, "x"),
                                 {"fully_cold": 2, "cold_weights": 1, "warm": 1})
    assert [s.kind for s in samples] == ["fully_cold", "fully_cold", "cold_weights", "warm"]
    assert all(s.resident_fraction < 0.05 for s in samples if s.kind != "warm")
    assert samples[-1].resident_fraction > 0.95
    seen = [json.loads(line) for line in starts.read_text().splitlines()]
    assert [s["cache_was_warm"] for s in seen] == [False, False, True, True]
    roots = [s["cache_root"] for s in seen]
    assert roots[0] != roots[1] and roots[1] == roots[2] == roots[3]
    assert not Path(roots[0]).exists()  # the scratch caches are removed afterwards
    assert raw.total_bytes == sum(p.stat().st_size for p in Path(variant.path).glob(
        "*.safetensors"))


def _fake_engine_group_gone(record: Path) -> bool:
    """The fake engine wrote its pid (= its process group) before failing; nothing of it is left."""
    pid = json.loads(record.read_text())["pid"]
    return group_members(pid) == []


@pytest.mark.slow
def test_engine_dies_with_a_killed_step_process(fake_bin, tmp_path, tiny_checkpoint):
    """SIGKILL of the step process runs no `finally`; the parent-death signal still stops the
    engine, so a killed run worker leaves no engine holding the machine."""
    import signal
    import subprocess
    import time

    record = tmp_path / "record.json"
    script = (
        "import sys, time\n"
        "from onboarding.common.refs import VariantRef\n"
        "from resources.engine import Engine\n"
        f"v = VariantRef('tiny', 'bf16', {str(tiny_checkpoint)!r}, 0, 'x')\n"
        f"e = Engine(bin_dir={str(fake_bin)!r}, hardware='cpu', start_timeout_s=30)\n"
        "with e.serve(v, 'x'):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(600)\n"
    )
    env = {**os.environ, "FAKE_ENGINE_RECORD": str(record)}
    step = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        assert step.stdout.readline().strip() == b"ready"
        pid = json.loads(record.read_text())["pid"]
        assert group_members(pid)
        step.send_signal(signal.SIGKILL)
        step.wait()
        deadline = time.monotonic() + 15
        while group_members(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group_members(pid) == []
    finally:
        step.kill()
        step.wait()
        step.stdout.close()


def test_gpu_count_from_config_else_visible_devices(monkeypatch):
    assert Engine(hardware="cpu").gpu_count() == 0
    assert Engine(hardware="sm90", gpus="0,1,2,3").gpu_count() == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert Engine(hardware="sm100").gpu_count() == 2  # a step pod given two GPUs


@pytest.mark.slow
def test_a_twins_starts_read_no_weights_and_say_so(fake_bin, tmp_path, monkeypatch):
    """A performance twin's configuration (load_format dummy): the engine is started with
    `--load-format=dummy` on a directory without weights; nothing is evicted or read."""
    from onboarding.common.paths import PROJECT_ROOT
    from onboarding.deploy.serving_plan import local_config
    from onboarding.fetch.catalog import load_catalog
    from onboarding.fetch.twins import twin_source_dir

    spec = load_catalog(PROJECT_ROOT / "configs" / "models")["llama-3-1-8b-instruct-twin"]
    twin = VariantRef(model=spec.id, precision="bf16",
                      path=str(twin_source_dir(spec.id, tmp_path / "twin")), total_bytes=0,
                      content_hash="x")
    record = tmp_path / "record.json"
    e = engine(fake_bin, tmp_path)
    config = local_config(spec, e.template(), "vllm", "0.32.0", "cpu", "cpu", "bf16")
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(record))
    samples, raw = e.time_starts(twin, config, {"fully_cold": 1, "cold_weights": 1, "warm": 1})
    assert "--load-format=dummy" in json.loads(record.read_text())["argv"]
    assert [s.kind for s in samples] == ["fully_cold", "cold_weights", "warm"]
    assert all(s.resident_fraction != s.resident_fraction for s in samples)  # NaN: no weights
    assert all(s.weights_loaded_s is None and s.first_token_s > 0 for s in samples)
    assert (raw.total_bytes, raw.seconds) == (0, 0.0)
    with pytest.raises(EngineError, match=r"no \*.safetensors weight files"):
        e.time_starts(twin, e.adhoc_config(twin, "x"), {"warm": 1})  # a real model's config


def _starts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_the_last_start_handed_off_serves_a_later_step_of_the_same_configuration(
        fake_bin, tmp_path, variant, monkeypatch):
    """load_timing's last start, once measured, is the engine the benchmark would start (same
    configuration): `serve_shared` takes it instead of starting a fifth, says so, and reaps it
    (and the start's scratch caches) when done."""
    starts = tmp_path / "starts.jsonl"
    monkeypatch.setenv("FAKE_ENGINE_STARTS", str(starts))
    e = engine(fake_bin, tmp_path)
    config = e.adhoc_config(variant, "x")
    samples, _ = e.time_starts(variant, config, {"fully_cold": 2, "cold_weights": 1, "warm": 1},
                               hand_off=True)
    assert [s.kind for s in samples] == ["fully_cold", "fully_cold", "cold_weights", "warm"]
    seen = _starts(starts)
    assert len(seen) == 4 and group_members(seen[-1]["pid"])  # the warm start is still up
    assert [group_members(s["pid"]) for s in seen[:-1]] == [[], [], []]
    with e.serve_shared(variant, config) as running:
        assert running.pid == seen[-1]["pid"]
        assert running.reused_from == "warm"
        assert running.exit_code() is None
    assert len(_starts(starts)) == 4  # no fifth start
    assert group_members(seen[-1]["pid"]) == []
    assert not Path(seen[-1]["cache_root"]).exists()  # its scratch caches went with it


@pytest.mark.slow
def test_a_handed_off_engine_never_outlives_the_run_nor_meets_another_engine(
        fake_bin, tmp_path, variant, monkeypatch):
    """Another configuration starts its own engine after the parked one is reaped (one engine
    at a time); one nothing takes is reaped at the run's end (the resource's teardown)."""
    starts = tmp_path / "starts.jsonl"
    monkeypatch.setenv("FAKE_ENGINE_STARTS", str(starts))
    e = engine(fake_bin, tmp_path)
    config = e.adhoc_config(variant, "x")
    e.time_starts(variant, config, {"warm": 1}, hand_off=True)
    parked = _starts(starts)[-1]["pid"]
    other = e.adhoc_config(variant, "y")
    assert other.hash != config.hash
    with e.serve_shared(variant, other) as running:
        assert running.reused_from == "" and running.pid != parked
        assert group_members(parked) == []
    e.time_starts(variant, config, {"warm": 1}, hand_off=True)
    parked = _starts(starts)[-1]["pid"]
    assert group_members(parked)
    e.teardown_after_execution(None)
    assert group_members(parked) == []
    with e.serve_shared(variant, config) as running:  # nothing parked any more: a fresh start
        assert running.reused_from == "" and running.pid != parked


@pytest.mark.slow
def test_each_start_records_the_kernels_its_log_names(fake_bin, tmp_path, variant, monkeypatch):
    """The fake prints a real CPU engine's recorded start (tests/data/cpu-engine): every start
    carries the facts the template's kernel_facts read there; a log naming none, none."""
    monkeypatch.setenv("FAKE_ENGINE_LOG_FROM",
                       str(PROJECT_ROOT / "tests/data/cpu-engine/vllm-cpu-smollm2-start.log"))
    e = engine(fake_bin, tmp_path)
    samples, _ = e.time_starts(variant, e.adhoc_config(variant, "x"),
                               {"fully_cold": 1, "warm": 1})
    cpu = {"quantization": ("None",), "kv_cache_dtype": ("auto",), "cuda_graph_mode": ("NONE",)}
    assert [s.kernels for s in samples] == [cpu, cpu]
    monkeypatch.delenv("FAKE_ENGINE_LOG_FROM")
    with e.serve(variant, "x") as running:
        assert running.kernels == {}
