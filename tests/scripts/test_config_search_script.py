"""bench/config_search.py resolves a search without starting anything (--dry-run); the real
search it runs is tests/e2e/test_config_search_vllm.py's (CPU) and the recording in
tests/data/gpu/config-search (GPU, made by bench/gpu_search.sh). bench/search_vs_auto_tune.py
reports that recording against vLLM's auto_tune."""

import re
import subprocess
import sys

import pytest

from onboarding.common.paths import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "bench" / "config_search.py"


def test_config_search_dry_run_lists_the_candidates_and_the_budget():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "smollm2-135m", "--model-dir",
         str(PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"), "--dry-run"],
        capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT, check=True).stdout
    assert "smollm2-135m on cpu: 3 candidates" in out
    assert "(the plan)" in out and "max_num_seqs=4, max_num_batched_tokens=2048" in out
    assert "budget 15.0 min" in out and "percentile=90.0" in out


def test_config_search_plan_dry_run_starts_from_the_h100_plan():
    """--plan: the rule's configuration serving_config gives the 8B twin on h100 comes first."""
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "llama-3-1-8b-instruct-twin", "--model-dir",
         "/nonexistent", "--precision", "fp8", "--node-type", "h100", "--hardware", "sm90",
         "--plan", "--max-num-seqs", "64", "128", "--max-num-batched-tokens", "8192", "2048",
         "--max-candidates", "4", "--dry-run"],
        capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT, check=True).stdout
    assert "llama-3-1-8b-instruct-twin on h100: 4 candidates" in out
    assert "max_num_seqs=32, max_num_batched_tokens=engine default (the plan)" in out


def test_config_search_other_engines_start_where_installed(tmp_path):
    """--other-starts with --engine-bin-for: the plan's configuration in SGLang's template starts
    the grid too (its own hash, its own label); an engine that cannot take the twin says why."""
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "llama-3-1-8b-instruct-twin", "--model-dir",
         "/nonexistent", "--precision", "fp8", "--node-type", "h100", "--hardware", "sm90",
         "--plan", "--max-num-seqs", "128", "--max-num-batched-tokens", "8192",
         "--max-candidates", "4", "--other-starts", "--engine-bin-for", f"sglang={tmp_path}",
         "--dry-run"],
        capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT, check=True).stdout
    assert "sglang fp8 TP 1, max_num_seqs=128, max_num_batched_tokens=8192" in out
    assert "engine trtllm: performance twin" in out
    without = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "llama-3-1-8b-instruct-twin", "--model-dir",
         "/nonexistent", "--precision", "fp8", "--node-type", "h100", "--hardware", "sm90",
         "--plan", "--other-starts", "--dry-run"],
        capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT, check=True).stdout
    assert re.search(r"engine sglang [\w.]+: not installed where this search runs", without)
    assert "sglang fp8" not in without.split("budget", 1)[1]


BENCH = PROJECT_ROOT / "bench"


def test_search_vs_auto_tune_report_prints_the_ratio_from_the_recording():
    rec = PROJECT_ROOT / "tests" / "data" / "gpu" / "config-search"
    out = subprocess.run([sys.executable, str(BENCH / "search_vs_auto_tune.py"), "report",
                          str(rec)], capture_output=True, text=True, timeout=120,
                         cwd=PROJECT_ROOT, check=True).stdout
    assert "search: 4 candidates" in out and "ratio auto_tune/search" in out


def test_search_vs_auto_tune_sets_the_variables_and_refuses_a_changed_script():
    """The peer's edits apply to the script's lines as they stand (a stand-in text holding
    them here: the upstream script is not part of this repository), and a script without
    one of them is refused, not run half-edited."""
    import argparse

    sys.path.insert(0, str(BENCH))
    import search_vs_auto_tune as peer

    names = ("MODEL", "SYSTEM", "TP", "INPUT_LEN", "OUTPUT_LEN", "MAX_MODEL_LEN",
             "MIN_CACHE_HIT_PCT", "MAX_LATENCY_ALLOWED_MS", "NUM_SEQS_LIST",
             "NUM_BATCHED_TOKENS_LIST")
    text = "".join(f"{n}=x\n" for n in names) + "\nbest_throughput=0\n" + \
        "".join(old for old, _ in peer.EDITS)
    a = argparse.Namespace(model="/m", in_len=512, out_len=256, max_model_len=8192,
                           max_e2el_ms=9680, seqs="32 64", tokens="2048 8192")
    done = peer.configured(text, a)
    assert 'NUM_SEQS_LIST="32 64"' in done and "pkill" not in done
    assert "--disable-log-requests" not in done and "stop_server() {" in done
    with pytest.raises(SystemExit, match="changed"):
        peer.configured(text.replace("    pkill -if vllm\n", ""), a)


def test_gpu_search_steps_parse_and_refuse_an_unknown_step():
    sh = BENCH / "gpu_search.sh"
    subprocess.run(["bash", "-n", str(sh)], check=True)
    p = subprocess.run(["bash", str(sh), "nope"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"}, check=False)
    assert p.returncode == 2 and "unknown step nope" in p.stderr


def test_the_bc_for_auto_tune_answers_its_comparisons_and_sums():
    """The lines auto_tune.sh pipes to `bc -l`: its memory-utilization walk, its latency test
    (an empty number, from a benchmark that printed none, is false) and its throughput test."""
    lines = "0.97 >= 0.9\n0.89 >= 0.9\n0.98 - 0.01\n <= 9680\n2250.3 <= 9680\n14.28 > 0\n"
    out = subprocess.run([sys.executable, str(BENCH / "auto_tune_bc.py")], input=lines,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == ["1", "0", "0.97", "0", "1", "1"]


def test_twin_variant_writes_the_fp8_export_marker_and_no_weights(tmp_path):
    subprocess.run([sys.executable, str(BENCH / "twin_variant.py"), "llama-3-1-8b-instruct-twin",
                    "fp8", str(tmp_path)], capture_output=True, text=True, timeout=300,
                   cwd=PROJECT_ROOT, check=True)
    import json

    out = tmp_path / "llama-3-1-8b-instruct-twin-fp8"
    hf = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert hf["quant_algo"] == "FP8" and hf["kv_cache_quant_algo"] == "FP8"
    config = json.loads((out / "config.json").read_text())
    assert config["hidden_size"] == 4096 and config["quantization_config"]
    assert (out / "tokenizer.json").is_file() and not list(out.glob("*.safetensors"))


@pytest.mark.parametrize("done", [True, False])
def test_gpu_search_watch_reports_a_drive_with_no_peer_or_search_output_yet(tmp_path, done):
    """`watch` returns what the drive wrote so far and says whether it is done, whatever is not
    written yet (no peer log while the search runs, no search log before it starts)."""
    res = tmp_path / "w" / "res"
    res.mkdir(parents=True)
    (res / "card.txt").write_text("card: test\n")
    if done:
        (res / "DONE").touch()
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.run(["bash", str(BENCH / "gpu_search.sh"), "watch", "0"], capture_output=True,
                       text=True, timeout=60, cwd=PROJECT_ROOT, check=False,
                       env={"PATH": "/usr/bin:/bin", "W": str(tmp_path / "w"), "OUT": str(out)})
    assert p.returncode == 0, p.stderr
    assert ("DRIVE-DONE" if done else "DRIVE-RUNNING") in p.stdout
    assert (out / "card.txt").read_text() == "card: test\n" and (out / "res.tar.gz").is_file()
