"""Every script under bench/ and scripts/ runs to its end here, or a named test runs it.

A script nothing runs breaks quietly: bench/fetch.py measured its cold fetch and then died in its
warm-path part when the assets started taking their configuration from the `configs` resource,
and bench/serving_sweep.py lost its upstream assets the same way. Each script gets
the smallest arguments that reach its end (or its dry run), and the inventory below must name
every file in those folders, so a new script cannot arrive without one. A script CI cannot run
to its end (it needs a GPU) is run as far as a CPU goes, and the test says where it stops.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench.gpu_recordings import recorded
from onboarding.common.paths import PROJECT_ROOT

SMOL = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"
VLLM = PROJECT_ROOT / ".venv-engine" / "bin" / "vllm"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "DAGSTER_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1"}

# Scripts run to their end by a test elsewhere: the test file must name the script.
ELSEWHERE = {
    "bench/config_search.py": "tests/scripts/test_config_search_script.py",  # --dry-run
    "bench/gpu_search.sh": "tests/scripts/test_config_search_script.py",
    "bench/search_vs_auto_tune.py": "tests/scripts/test_config_search_script.py",
    "bench/auto_tune_bc.py": "tests/scripts/test_config_search_script.py",
    "bench/twin_variant.py": "tests/scripts/test_config_search_script.py",
    "bench/engine_measurements.py": "tests/onboarding/test_engine_choice.py",
    "bench/gpu_h200_doc.py": "tests/scripts/test_gpu_scripts.py",  # --check
    "scripts/add_measured_points.py": "tests/onboarding/test_predict.py",
    "scripts/rekey_cells.py": "tests/scripts/test_rekey_cells.py",
    "scripts/check_gateway_config.py": "tests/onboarding/test_layout_render.py",
    "scripts/check_stack_matrix.py": "tests/scripts/test_check_stack_matrix.py",
    "scripts/gpu_node_probe.py": "tests/e2e/test_gpu_node_probe.py",
    "scripts/gpu_noisy_neighbour.py": "tests/onboarding/test_layout_render.py",  # --dry-run
    # bench modules the tests import (a recording's reader, the fake engine, the hub cache)
    "bench/gpu_recordings.py": "tests/deploy/test_observability.py",
    "bench/gpu_recordings_x2.py": "tests/assets/test_h200x2_replay.py",
    "bench/openai_stream_server.py": "tests/assets/test_serving.py",
    "bench/hub_cache.py": "tests/resources/test_huggingface.py",
}
# Scripts this module runs, each by the test named.
HERE = {
    "bench/fetch.py": "test_fetch_bench_reaches_its_warm_path",
    "bench/definitions_load.py": "test_definitions_load_compares_with_its_peer",
    "bench/record_engine_metrics.py": "test_record_engine_metrics_imports_and_says_its_use",
    "scripts/record_node_tools.sh": "test_record_node_tools_writes_one_framed_file_per_command",
    "bench/write_block.py": "test_write_block_prints_both_write_lengths_and_the_ratio",
    "bench/eval_call.py": "test_eval_call_prints_the_ratio_against_lm_evals_default",
    "bench/gate_looks.py": "test_gate_looks_prints_the_ratio_against_the_rule_before",
    "bench/gate_relook.py": "test_gate_relook_prints_the_ratio_against_the_prefix",
    "bench/gpu_device.sh": "test_shell_scripts_parse_and_gpu_device_refuses_an_unknown_step",
    "bench/gpu_serving.py":
        "test_gpu_serving_prepare_builds_the_model_and_pins_the_configs_on_a_cpu",
    "bench/gpu_x2.py": "test_gpu_x2_dry_runs_print_the_probe_thresholds_and_the_pairs_launchers",
    "bench/gpu_x2_doc.py": "test_gpu_x2_doc_sections_are_current",
    "bench/loadgen.py": "test_loadgen_against_the_fake_server_reaches_its_summary",
    "bench/predictions.py": "test_predictions_record_is_the_committed_recording",
    "bench/quantize.py": "test_quantize_bench_prints_its_ratio_against_modelopt_direct",
    "bench/quantize_gpu.py": "test_quantize_gpu_tiny_runs_the_quantize_stage_on_a_cpu",
    "bench/served_accuracy_gpu.py": "test_served_accuracy_gpu_scores_bf16_through_the_cpu_engine",
    "bench/serving_sweep.py": "test_serving_sweep_dry_run_builds_its_job_with_every_resource",
    "bench/sglang_check.py": "test_sglang_steps_parse_and_the_check_stops_where_a_cpu_has_no_build",
    "bench/sglang_payload.sh":
        "test_sglang_steps_parse_and_the_check_stops_where_a_cpu_has_no_build",
    "bench/sglang_unpack.sh": "test_sglang_unpack_checks_unpacks_and_wraps_the_interpreter",
    "scripts/build_smollm2.py": "test_build_smollm2_keeps_a_complete_output",
    "scripts/demo.py": "test_demo_fetch_only_reaches_its_summary",
    "scripts/dev.sh": "test_shell_scripts_parse_and_gpu_device_refuses_an_unknown_step",
    "scripts/layout_pictures.py": "test_layout_pictures_draws_every_feasible_layout",
    "scripts/make_quantize_data.py": "test_make_quantize_data_reproduces_the_committed_files",
    "scripts/setup_engine.sh": "test_shell_scripts_parse_and_gpu_device_refuses_an_unknown_step",
    "scripts/setup_litellm.sh": "test_shell_scripts_parse_and_gpu_device_refuses_an_unknown_step",
}


def _scripts() -> set[str]:
    return {str(p.relative_to(PROJECT_ROOT)) for d in ("bench", "scripts")
            for p in (PROJECT_ROOT / d).iterdir() if p.suffix in (".py", ".sh")}


def test_every_script_is_run_by_a_test():
    assert _scripts() == set(ELSEWHERE) | set(HERE), (
        "a script under bench/ or scripts/ without a smoke test (add it to HERE with a test "
        "below, or to ELSEWHERE with the test that runs it)")
    for script, test in ELSEWHERE.items():
        text = (PROJECT_ROOT / test).read_text()  # by path, or imported by its module name
        assert script in text or Path(script).stem in text, f"{test} does not run {script}"
    for script, test in HERE.items():
        assert callable(globals().get(test)), f"{script}: no {test} in this module"


def run_script(argv: list[str], tmp_path: Path, timeout_s: float = 600,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *argv], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=timeout_s, check=False,
                          env={**os.environ, **OFFLINE, "PYTHONPATH": str(PROJECT_ROOT),
                               "TMPDIR": str(tmp_path), **(env or {})})
    assert proc.returncode == 0, f"{argv[0]} exited {proc.returncode}:\n" \
        f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def needs_model():
    if not (SMOL / "model.safetensors").is_file():
        pytest.skip(f"needs the SmolLM2 checkpoint ({SMOL}; `bash scripts/dev.sh setup`)")


def needs_engine():
    needs_model()
    if not VLLM.is_file():
        pytest.skip(f"needs the vLLM CPU engine ({VLLM}; `bash scripts/dev.sh setup`)")


# ---- fast: pure computation or the fake server ----

def test_gate_looks_prints_the_ratio_against_the_rule_before(tmp_path):
    out = tmp_path / "looks.json"
    proc = run_script(["bench/gate_looks.py", "--runs", "40", "--size", "100", "--json",
                       str(out)], tmp_path)
    assert "error at the limit, shipped ÷ before:" in proc.stdout
    rows = json.loads(out.read_text())
    assert rows["runs"] == 40 and 0 <= rows["at_limit/shipped"]["pass_rate"] <= 1


@pytest.mark.slow
def test_eval_call_prints_the_ratio_against_lm_evals_default(tmp_path):
    needs_model()
    proc = run_script(["bench/eval_call.py", "--repeats", "1", "--limit", "2"], tmp_path)
    assert "x 2 tasks):" in proc.stdout and "per-item results identical" in proc.stdout


@pytest.mark.slow
def test_gate_relook_prints_the_ratio_against_the_prefix(tmp_path):
    needs_model()
    out = tmp_path / "relook.json"
    proc = run_script(["bench/gate_relook.py", "--repeats", "1", "--first", "2", "--upto",
                       "4", "--json", str(out)], tmp_path)
    assert "faster per model (items 2-3)" in proc.stdout
    got = json.loads(out.read_text())
    assert got["items_agree"] == "2 of 2" and len(got["seconds"]["prefix"]) == 1


@pytest.mark.slow
def test_predictions_record_is_the_committed_recording(tmp_path):
    """`--record` asks AIConfigurator for the calibration points and one model's ladder (6 s
    here, 42 s before the data set's version was resolved once per process; regenerating
    docs/predictions.md asks for every model): what it
    writes must be, byte for byte, the recording the CPU tests replay."""
    out = tmp_path / "recorded.json"
    run_script(["bench/predictions.py", "--record", str(out)], tmp_path)
    committed = PROJECT_ROOT / "tests" / "data" / "predict" / "recorded_predictions.json"
    assert out.read_text() == committed.read_text(), \
        "the library answers otherwise now: run bench/predictions.py --record and the docs"


@pytest.mark.slow
def test_layout_pictures_draws_every_feasible_layout(tmp_path):
    proc = run_script(["scripts/layout_pictures.py", "--out", str(tmp_path)], tmp_path)
    drawn = sorted(p.name for p in tmp_path.glob("layout-*.png"))
    assert drawn and all((tmp_path / n).read_bytes()[:4] == b"\x89PNG" for n in drawn)
    assert len(drawn) == proc.stdout.count(".png")


def test_make_quantize_data_reproduces_the_committed_files(tmp_path):
    """The generator is seeded: run into an empty directory, it writes exactly what configs/
    holds (a list edited without re-running the script shows here)."""
    run_script(["scripts/make_quantize_data.py", str(tmp_path)], tmp_path)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written
    for p in written:
        committed = PROJECT_ROOT / "configs" / p.relative_to(tmp_path)
        assert committed.is_file(), f"{committed} is not committed"
        assert p.read_bytes() == committed.read_bytes(), f"{committed} differs from its generator"


@pytest.mark.slow
def test_loadgen_against_the_fake_server_reaches_its_summary(tmp_path):
    out = tmp_path / "rows.json"
    proc = run_script(["bench/loadgen.py", "--quick", "--repeats", "1", "--tools",
                       "ours (aiohttp)", "--json", str(out)], tmp_path)
    rows = json.loads(out.read_text())
    assert rows and all("error" not in r and r["completed"] > 0 for r in rows), rows
    assert "| case | tool |" in proc.stdout


def test_shell_scripts_parse_and_gpu_device_refuses_an_unknown_step(tmp_path):
    """dev.sh and setup_engine.sh run in full on every CI run (`.ci/run` is `dev.sh test`, whose
    setup calls setup_engine.sh); setup_litellm.sh makes the gateway check's venv and
    gpu_device.sh runs only on the H200: here they are parsed, and gpu_device.sh's dispatcher
    is run as far as a CPU goes."""
    for script in ("scripts/dev.sh", "scripts/setup_engine.sh", "scripts/setup_litellm.sh",
                   "bench/gpu_device.sh"):
        done = subprocess.run(["bash", "-n", script], cwd=PROJECT_ROOT, capture_output=True,
                              text=True, check=False)
        assert done.returncode == 0, f"{script}: {done.stderr}"
    done = subprocess.run(["bash", "bench/gpu_device.sh", "no-such-step"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "OUT": str(tmp_path)})
    assert done.returncode == 2 and "unknown step no-such-step" in done.stderr


@pytest.mark.parametrize("step", [["twins"], ["onboard", "T"], ["frontend"],
                                  ["sglang", "check"], ["sglang", "twins"]])
def test_gpu_device_steps_refuse_to_run_before_the_payload_is_installed(tmp_path, step):
    """A device call that ran before the payload was installed went on, and the sweeps
    died inside Python on `No module named 'dagster'`. A step that needs the installed vLLM
    payload now stops first, exit 3, saying what to run."""
    done = subprocess.run(["bash", "bench/gpu_device.sh", *step], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "OUT": str(tmp_path),
                               "SITE": str(tmp_path / "no-site")})
    assert done.returncode == 3, done.stderr
    assert "the vLLM payload is not installed" in done.stderr
    assert "bash bench/gpu_device.sh install" in done.stderr


@pytest.mark.slow
def test_sglang_steps_parse_and_the_check_stops_where_a_cpu_has_no_build(tmp_path):
    """The SGLang steps run only on the H200 (bench/sglang_payload.sh downloads 431 MiB
    of wheels; docs/gpu.md has the run): the payload script parses, gpu_device.sh's sglang
    dispatcher refuses an unknown step, and sglang_check.py, run here without SGLang, names
    every version it reads and fails the import of the kernel library, exit 1."""
    done = subprocess.run(["bash", "-n", "bench/sglang_payload.sh"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    done = subprocess.run(["bash", "bench/gpu_device.sh", "sglang", "no-such-step"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "OUT": str(tmp_path)})
    assert done.returncode == 2 and "unknown sglang step no-such-step" in done.stderr
    proc = subprocess.run([sys.executable, "bench/sglang_check.py"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, **OFFLINE, "PYTHONPATH": str(PROJECT_ROOT)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "sglang-kernel: not installed" in proc.stdout
    assert "FAIL import sgl_kernel: ModuleNotFoundError" in proc.stdout


def test_sglang_unpack_checks_unpacks_and_wraps_the_interpreter(tmp_path):
    """The device steps' SGLang unpack, on a payload shaped as bench/sglang_payload.sh makes it
    (an xz tar of sgl-site/, split in parts, its sha256 beside): the interpreter it writes
    imports from the unpacked tree; a corrupted part stops it before anything is unpacked."""
    site = tmp_path / "src" / "sgl-site" / "sglang"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text('__version__ = "0.0.unpack-test"\n')
    tar = tmp_path / "sgl.tar.xz"
    subprocess.run(["tar", "-C", str(tmp_path / "src"), "-cJf", str(tar), "sgl-site"], check=True)
    data = tar.read_bytes()
    parts = tmp_path / "parts"
    parts.mkdir()
    half = len(data) // 2
    (parts / "part.0").write_bytes(data[:half])
    (parts / "part.1").write_bytes(data[half:])
    import hashlib

    (tmp_path / "sgl.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    root.mkdir()

    def unpack() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "bench/sglang_unpack.sh", str(parts),
                               str(tmp_path / "sgl.sha256"), str(bin_dir), str(root)],
                              cwd=PROJECT_ROOT, capture_output=True, text=True, check=False)

    done = unpack()
    assert done.returncode == 0, done.stderr
    out = subprocess.run([str(bin_dir / "python"), "-c",
                          "import sglang; print(sglang.__version__, sglang.__file__)"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("0.0.unpack-test " + str(root / "sgl-site"))
    assert not (root / "sgl.tar.xz").exists()
    shutil.rmtree(root / "sgl-site")
    (parts / "part.1").write_bytes(data[half:][::-1])
    done = unpack()
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr
    assert not (root / "sgl-site").exists() and not (root / "sgl.tar.xz").exists()


def test_write_block_prints_both_write_lengths_and_the_ratio(tmp_path):
    """Two small rounds, each after a small churn: both write lengths are timed in every round
    and the summary names the peer the ratio is taken against."""
    proc = run_script(["bench/write_block.py", "--gb", "0.02", "--reps", "2", "--churn-gb",
                       "0.05", "--settle", "0"], tmp_path)
    out = proc.stdout
    assert out.count("256 KiB writes (ours)  wall") == 2 and out.count("1 MiB writes (before)  wall") == 2
    assert "round 2: free blocks by order 0-10:" in out
    assert "system time: 1 MiB writes (before) / 256 KiB writes (ours) = " in out
    assert not list((PROJECT_ROOT / ".cache").glob("bench-write-block-*"))


# ---- slow: real services, the real model, the real engine ----

@pytest.mark.slow
def test_fetch_bench_reaches_its_warm_path(tmp_path):
    """The run that used to die: the cold fetch against boto3 and awscli, then the warm
    `checkpoint` materialization with its checks, on a 20 MB two-file checkpoint."""
    proc = run_script(["bench/fetch.py", "--gb", "0.02", "--files", "2", "--reps", "1"],
                      tmp_path)
    assert "transfer: best peer" in proc.stdout
    assert "warm re-materialization of the verified" in proc.stdout


@pytest.mark.slow
def test_quantize_gpu_tiny_runs_the_quantize_stage_on_a_cpu(tmp_path):
    """Its GPU run needs the H200; `--tiny` is the same code on a model small enough here."""
    needs_model()
    run_script(["bench/quantize_gpu.py", "--out", str(tmp_path / "out"), "--work",
                str(tmp_path / "work"), "--tiny", "--skip-eval"], tmp_path)
    [report] = list((tmp_path / "out").glob("gpu_*.json"))
    body = json.loads(report.read_text())
    assert body["device"] == "cpu"
    assert body["quantize_nvfp4"]["export_valid"] and body["quantize_fp8"]["export_valid"]


@pytest.mark.slow
def test_quantize_bench_prints_its_ratio_against_modelopt_direct(tmp_path):
    needs_model()
    import yaml

    configs = tmp_path / "configs"  # a smaller calibration, the same for ours and the peer
    shutil.copytree(PROJECT_ROOT / "configs", configs)
    q = yaml.safe_load((configs / "quantization.yaml").read_text())
    q["calibration"].update(samples=4, seq_len=64, batch_size=4)
    q["export_check"].update(samples=1, seq_len=64)
    (configs / "quantization.yaml").write_text(yaml.safe_dump(q, sort_keys=False))
    proc = run_script(["bench/quantize.py", "--rounds", "1", "--eval-items-per-task", "0",
                       "--config-dir", str(configs)], tmp_path)
    assert "vs modelopt direct" in proc.stdout and "(passed: True)" in proc.stdout


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """`bench/gpu_serving.py prepare` without the node probe, run once for the two tests that
    need it (its SmolLM2 build from the GGUF took about 20 s of each): its `out` and `work`.
    A test that goes on from it works on a copy."""
    needs_model()
    root = tmp_path_factory.mktemp("prepared")
    run_script(["bench/gpu_serving.py", "prepare", "--out", str(root / "out"), "--work",
                str(root / "work"), "--probe-burn-s", "0", "--node-type", "cpu"], root)
    return root


@pytest.mark.slow
def test_gpu_serving_prepare_builds_the_model_and_pins_the_configs_on_a_cpu(prepared):
    """`prepare` (the first device call) without the node probe; `onboard` and `twins` need the
    H200 and run there (bench/gpu_device.sh), their recordings replayed in tests/assets/."""
    work = prepared / "work"
    assert (work / "smollm2-135m-instruct" / "model.safetensors").is_file()  # build_smollm2.py
    assert (work / "configs" / "stack.yaml").is_file()


@pytest.mark.slow
def test_demo_fetch_only_reaches_its_summary(tmp_path):
    """The README's first command as far as `--select checkpoint`: the local S3 server, the
    upload, the Dagster run, the summary; its own data dir and instance, not the checkout's."""
    needs_model()
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "configs" / "dagster.yaml", home / "dagster.yaml")
    proc = run_script(["scripts/demo.py", "--select", "checkpoint"], tmp_path, env={
        "ONBOARDING_DATA_DIR": str(tmp_path / "data"), "DAGSTER_HOME": str(home),
        "ONBOARDING_CACHE_ROOT": str(tmp_path / "nvme"),
        "ONBOARDING_OUTPUT_DIR": str(tmp_path / "manifests"),
        "ONBOARDING_REPORTS_DIR": str(tmp_path / "reports"),
        "ONBOARDING_DISCOVERED_DIR": str(tmp_path / "discovered")})
    assert "onboard_model[smollm2-135m]: SUCCESS" in proc.stdout, proc.stdout[-2000:]
    assert "materialized: checkpoint" in proc.stdout
    # one line per step on the terminal; every event, DEBUG included, in the file it names
    assert re.search(r"^  checkpoint: done in \d+ s, checks \d+ of \d+ passed$", proc.stdout,
                     re.MULTILINE), proc.stdout[-2000:]
    assert "STEP_START" not in proc.stdout + proc.stderr
    [log_file] = re.findall(r"the libraries' own output in (\S+\.log)", proc.stdout)
    assert " DEBUG   checkpoint STEP_START: " in Path(log_file).read_text()
    # the breakdown from the run's own step records: the one step, its wall and CPU seconds
    assert "where the time went (run " in proc.stdout
    row = re.compile(r"^  checkpoint +\d+\.\d +\d+\.\d ", re.MULTILINE)
    assert row.search(proc.stdout), proc.stdout[-2000:]
    [fetched] = list((tmp_path / "nvme").rglob("model.safetensors"))
    assert fetched.stat().st_size == (SMOL / "model.safetensors").stat().st_size
    assert (tmp_path / "data" / "s3-credentials.json").is_file()


@pytest.mark.slow
def test_serving_sweep_dry_run_builds_its_job_with_every_resource(tmp_path):
    """Its real run is four engine starts (the full cpu profile by default); the e2e test of
    the same assets (tests/e2e/test_serving_vllm.py) runs the engine. Here what broke it:
    each resource the assets ask for, and the run config, checked without starting one."""
    needs_model()
    proc = run_script(["bench/serving_sweep.py", "--scenarios", "chat", "--concurrency", "2",
                       "--requests-per-point", "4", "--dry-run"], tmp_path)
    assert "'concurrency': [2]" in proc.stdout and "valid" in proc.stdout


@pytest.mark.slow
@pytest.mark.engine
def test_served_accuracy_gpu_scores_bf16_through_the_cpu_engine(tmp_path):
    """Its documented CPU mode (bf16 only: the CPU build serves nothing else)."""
    needs_engine()
    # vLLM's IPC sockets go under TMPDIR: a pytest-xdist worker's tmp_path (popen-gwN/ more)
    # took their paths past the 107 characters a unix socket path may have
    with tempfile.TemporaryDirectory(prefix="onb-") as short:
        run_script(["bench/served_accuracy_gpu.py", "--out", str(tmp_path / "out"), "--work",
                    str(tmp_path / "work"), "--precisions", "bf16", "--limit", "4",
                    "--checkpoint", str(SMOL)], tmp_path, timeout_s=900, env={"TMPDIR": short})
    [report] = list((tmp_path / "out").glob("served_accuracy_*.json"))
    body = json.loads(report.read_text())  # both phases reached: in process, then served
    assert set(body["in_process"]) == set(body["served"]) == {"bf16"}
    assert set(body["agreements"]) == {"bf16"} and body["serving_variant"]["precision"]


def test_build_smollm2_keeps_a_complete_output(tmp_path):
    """Setup runs it in full on every fresh machine (CI included), and gpu_serving's prepare
    above does too; here its idempotence: an existing complete output is kept, not rebuilt."""
    needs_model()
    before = (SMOL / "model.safetensors").stat()
    run_script(["scripts/build_smollm2.py", str(SMOL)], tmp_path)
    after = (SMOL / "model.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def _device_step(step: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """A step of bench/gpu_device.sh with DRY_RUN=1: as far as a CPU goes, this venv's python."""
    return subprocess.run(["bash", "bench/gpu_device.sh", step], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, **OFFLINE, "OUT": str(tmp_path / "out"),
                               "WORK": str(tmp_path / "work"), "DRY_RUN": "1",
                               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})


def test_the_device_steps_name_the_carried_kserve_crds_for_the_manifest_step(tmp_path):
    """The manifest step validates against deploy/kserve-crds/ unless KSERVE_CRD_PATHS names
    other CRDs. A carried `.kserve-crds/` is kept (CRD_DIR, /tmp there) and named in
    KSERVE_CRD_PATHS for that call and the later ones; without it nothing is set."""
    import shutil

    def crd_paths(cwd: Path) -> str:
        done = subprocess.run(["bash", str(PROJECT_ROOT / "bench/gpu_device.sh"), "crd-paths"],
                              cwd=cwd, capture_output=True, text=True, timeout=60, check=False,
                              env={**os.environ, "OUT": str(tmp_path / "out"),
                                   "CRD_DIR": str(tmp_path / "kept")})
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().removeprefix("KSERVE_CRD_PATHS=")

    bare, carried = tmp_path / "bare", tmp_path / "carried"
    bare.mkdir()
    assert crd_paths(bare) == ""
    (carried / ".kserve-crds").mkdir(parents=True)
    for name in ("serving.kserve.io_inferenceservices.yaml",
                 "serving.kserve.io_servingruntimes.yaml"):
        shutil.copy(PROJECT_ROOT.parent / "shared" / "kserve" / name
                    if (PROJECT_ROOT.parent / "shared" / "kserve" / name).is_file()
                    else PROJECT_ROOT / "pyproject.toml", carried / ".kserve-crds" / name)
    kept = sorted(str(tmp_path / "kept" / n) for n in os.listdir(carried / ".kserve-crds"))
    assert crd_paths(carried).split(":") == kept
    assert crd_paths(bare).split(":") == kept  # a later call without the carry keeps them


@pytest.mark.slow
def test_gpu_x2_dry_runs_print_the_probe_thresholds_and_the_pairs_launchers(tmp_path):
    """The interconnect and neighbour steps (two H200s) as far as a CPU goes: the probe's
    argv at acceptance.yaml's sizes and the thresholds it is judged by; the pair planned by the
    layout code and rendered, one twin per GPU."""
    from resources.config_files import ConfigFiles

    cf = ConfigFiles()
    done = _device_step("x2-interconnect", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    body = json.loads(done.stdout)
    assert body["env"]["NCCL_NVLS_ENABLE"] == "0"
    argv = body["probe_argv"]
    assert argv[argv.index("--gpus") + 1] == "2"
    sizes = argv[argv.index("--allreduce-sizes-mib") + 1]
    assert sizes == ",".join(map(str, cf.acceptance().probe.allreduce_sizes_mib))
    want = cf.acceptance().node_types["h200"].interconnect.allreduce_busbw_min_gbps[2]
    assert body["thresholds"]["allreduce_busbw_min_gbps"]["2"] == want
    done = _device_step("x2-neighbour", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    body = json.loads(done.stdout)
    assert {m: p["gpus"] for m, p in body["result"]["placements"].items()} == {
        "twin-a": [0], "twin-b": [1]}
    assert "export CUDA_VISIBLE_DEVICES=1" in body["launchers"]["twin-b"]
    assert "--tensor-parallel-size=1" in body["launchers"]["twin-a"]


@pytest.mark.slow
def test_gpu_x2_doc_sections_are_current(tmp_path):
    """docs/gpu.md's two-H200 sections are what plan.json and the recordings say."""
    proc = run_script(["bench/gpu_x2_doc.py", "--check"], tmp_path)
    assert "current" in proc.stdout


@pytest.mark.slow
def test_gpu_x2_twins_dry_run_plans_the_configurations_the_h200_recorded(prepared, tmp_path):
    """x2-twins and x2-tp on a CPU: prepare (the module's one run, copied), the configs pinned
    to the H200's recorded versions, the twins' onboard CPU part for h200, then each step's dry
    run. The planned hashes must be the ones the SLO-target recording holds; TP 2 runs on GPUs 0
    and 1."""
    out, work = tmp_path / "out", tmp_path / "work"
    shutil.copytree(prepared / "out", out, symlinks=True)
    shutil.copytree(prepared / "work", work, symlinks=True)
    run_script(["bench/gpu_x2.py", "pin", "--work", str(work)], tmp_path)
    run_script(["bench/gpu_serving.py", "onboard", "--out", str(out), "--work", str(work),
                "--node-type", "h200", "--tag", "x2-plan", "--models",
                "llama-3-1-8b-instruct-twin,llama-3-1-70b-instruct-twin", "--select",
                "serving_stack,checkpoint,quantized,accuracy,serving_variant,serving_config"],
               tmp_path)
    rec = recorded("slo_target", "onboard-A")["assets"]
    device = {m: a["serving_config"]["config_hashes"]["h200"] for m, a in rec.items()
              if "serving_config" in a}
    for step in ("x2-twins", "x2-tp"):
        done = _device_step(step, tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    twins = json.loads((out / "x2-twins.json").read_text())["steps"]
    [big] = twins.values()
    assert big["config_hash"] == device["llama-3-1-70b-instruct-twin"]
    assert big["tensor_parallel"] == 2 and big["cuda_visible_devices"] == "0,1"
    tp = json.loads((out / "x2-tp.json").read_text())["steps"]
    one, two = tp["llama-3-1-8b-instruct-twin:fp8@tp1"], tp["llama-3-1-8b-instruct-twin:fp8@tp2"]
    assert one["config_hash"] == device["llama-3-1-8b-instruct-twin"]
    assert one["cuda_visible_devices"] == "0" and two["cuda_visible_devices"] == "0,1"
    assert two["config_hash"] != one["config_hash"] and "--tensor-parallel-size=2" in \
        two["engine_argv"]


@pytest.mark.slow
def test_record_engine_metrics_imports_and_says_its_use():
    """Only that it imports and parses its arguments: a real recording starts the CPU engine
    (about a minute); what it wrote is replayed by tests/deploy/test_observability.py."""
    out = subprocess.run([sys.executable, str(PROJECT_ROOT / "bench/record_engine_metrics.py"),
                          "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "--out" in out.stdout


@pytest.mark.slow
def test_record_node_tools_writes_one_framed_file_per_command(tmp_path):
    """Run for real on this machine (no GPU tools here): every file names its command and ends
    with its exit status; a tool that is absent records 127, which acceptance reads as not
    checked."""
    subprocess.run(["bash", str(PROJECT_ROOT / "scripts/record_node_tools.sh"),
                    str(tmp_path), "0"], capture_output=True, text=True, timeout=300,
                   check=True)
    files = sorted(tmp_path.glob("*.txt"))
    assert len(files) >= 40
    for f in files:
        lines = f.read_text().splitlines()
        assert lines[0].startswith("$ ") and re.fullmatch(r"# exit \d+", lines[-1]), f.name
    tools = (tmp_path / "which-tools.txt").read_text()
    assert "nvidia-smi:" in tools and "dcgmi:" in tools


@pytest.mark.slow
def test_definitions_load_compares_with_its_peer(tmp_path):
    """One pair against this checkout's own HEAD: both load, and the ratio is printed with n."""
    proc = run_script(["bench/definitions_load.py", "--peer-ref", "HEAD", "--repeats", "1"],
                      tmp_path)
    assert "pair 1: peer " in proc.stdout
    assert "(n=1 each); ratio here/peer " in proc.stdout
