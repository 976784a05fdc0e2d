"""Kernel facts read from real engine logs, and the gate that judges them.

The logs are the engine's own, recorded: vLLM 0.22.0 on an H200 (tests/data/gpu: the 8B
twin's starts in bf16, FP8 and NVFP4, SmolLM2 in bf16, and an NVFP4 start that failed) and one
start of the vLLM CPU build (tests/data/cpu-engine). The patterns are configs/stack.yaml's and
the rules configs/nodes.yaml's, the ones load_timing applies. Which precision a start served is
read from its argv (the log's first line: the variant's directory), not from the lines parsed.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest

from bench.gpu_recordings import folder
from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.plan import NodesConfig, load_nodes
from onboarding.serving.kernels import (
    KernelFactPatterns,
    KernelRule,
    StartKernels,
    judge,
    read_kernel_facts,
    summarize_facts,
)
from onboarding.serving.stack import load_stack

DATA = PROJECT_ROOT / "tests" / "data"
H200_LOGS = folder("stages") / "engine-logs"
TWIN_LOGS = folder("fresh_prompts") / "engine-logs.tar.gz"  # the 8B twin, every precision
FAILED_NVFP4 = folder("client_accounting") / "engine-logs" / "served-nvfp4-marlin-refused.log"
CPU_LOG = DATA / "cpu-engine" / "vllm-cpu-smollm2-start.log"
WEIGHT_ONLY = "weight-only FP4 (Marlin): Blackwell-only speed not measured"


@pytest.fixture(scope="module")
def patterns() -> KernelFactPatterns:
    return load_stack(PROJECT_ROOT / "configs" / "stack.yaml").templates["vllm"].kernel_facts


@pytest.fixture(scope="module")
def nodes() -> NodesConfig:
    return load_nodes(PROJECT_ROOT / "configs" / "nodes.yaml")


def _twin_logs() -> dict[str, list[str]]:
    """The eight recorded starts of the 8B twin, by file name."""
    out = {}
    with tarfile.open(TWIN_LOGS) as tar:
        for m in tar.getmembers():
            if m.isfile():
                out[Path(m.name).name] = tar.extractfile(m).read().decode(errors="replace") \
                    .splitlines()
    return out


def _served_precision(lines: list[str]) -> str:
    """nvfp4 / fp8 / bf16 from the argv line's model path (a variant directory or the
    checkpoint itself)."""
    model = json.loads(lines[0])[2]
    m = re.search(r"\.variants/(\w+)$", model)
    return m.group(1) if m else "bf16"


def _starts(patterns, logs: list[list[str]]) -> list[StartKernels]:
    return [StartKernels("fully_cold", read_kernel_facts(patterns, lines)) for lines in logs]


def test_the_h200_twin_starts_name_their_kernels(patterns):
    by_precision: dict[str, list[dict]] = {}
    for lines in _twin_logs().values():
        by_precision.setdefault(_served_precision(lines), []).append(
            read_kernel_facts(patterns, lines))
    assert set(by_precision) == {"bf16", "fp8", "nvfp4"}
    for facts in by_precision["nvfp4"]:
        assert facts["quantization"] == ("modelopt_fp4",)
        assert facts["linear_kernel"] == ("MarlinNvFp4LinearKernel",)
    for facts in by_precision["fp8"]:
        assert facts["quantization"] == ("modelopt",)
        assert facts["linear_kernel"] == ("CutlassFP8ScaledMMLinearKernel",)
        assert facts["kv_cache_dtype"] == ("fp8_e4m3",)
    for facts in by_precision["bf16"]:
        assert facts["quantization"] == ("None",) and "linear_kernel" not in facts
    for facts in (f for fs in by_precision.values() for f in fs):
        assert facts["attention_backend"] == ("FLASH_ATTN",)
        assert facts["cuda_graph_mode"] == ("FULL_AND_PIECEWISE",)
        assert "moe_backend" not in facts  # a dense model: no MoE layer, no MoE line


def test_an_eager_start_says_no_cuda_graphs(patterns):
    facts = read_kernel_facts(patterns, FAILED_NVFP4.read_text().splitlines())
    assert facts["cuda_graph_mode"] == ("NONE",)
    assert facts["linear_kernel"] == ("MarlinNvFp4LinearKernel",)


def test_the_cpu_engine_start(patterns):
    lines = CPU_LOG.read_text().splitlines()
    assert "--enforce-eager" in json.loads(lines[0])
    facts = read_kernel_facts(patterns, lines)
    assert facts == {"quantization": ("None",), "kv_cache_dtype": ("auto",),
                     "cuda_graph_mode": ("NONE",)}


def test_hopper_passes_nvfp4_on_marlin_as_what_it_is(patterns, nodes):
    logs = [lines for lines in _twin_logs().values() if _served_precision(lines) == "nvfp4"]
    assert logs
    v = judge(nodes.kernel_gate, "vllm", "nvfp4", nodes.node_types["h200"].arch,
              _starts(patterns, logs))
    assert v.passed is True
    assert v.passes_as == WEIGHT_ONLY and WEIGHT_ONLY in v.summary


def test_blackwell_fails_the_same_marlin_start(patterns, nodes):
    logs = [lines for lines in _twin_logs().values() if _served_precision(lines) == "nvfp4"]
    for node_type in ("b300", "b200"):
        v = judge(nodes.kernel_gate, "vllm", "nvfp4", nodes.node_types[node_type].arch,
                  _starts(patterns, logs))
        assert v.passed is False, node_type
        assert v.problems == ("fully_cold start ran linear_kernel MarlinNvFp4LinearKernel",)
        assert "native FP4" in v.expected and "not Marlin" in v.expected
        assert v.expected in v.summary


def test_fp8_on_hopper_is_native(patterns, nodes):
    logs = [lines for lines in _twin_logs().values() if _served_precision(lines) == "fp8"]
    logs.append((H200_LOGS / "engine-llama-3-1-8b-instruct-twin-54287-1796071496.log")
                .read_text().splitlines())
    v = judge(nodes.kernel_gate, "vllm", "fp8", "sm90", _starts(patterns, logs))
    assert v.passed is True and not v.passes_as
    assert "native FP8" in v.summary


def test_fp8_on_marlin_fails(patterns, nodes):
    """The recorded FP8 start with its GEMM line as vLLM logs its weight-only FP8 fallback
    (kernels/linear/scaled_mm/marlin.py's class), everything else as recorded."""
    lines = [line.replace("Selected CutlassFP8ScaledMMLinearKernel",
                          "Selected MarlinFP8ScaledMMLinearKernel")
             for line in (H200_LOGS / "engine-llama-3-1-8b-instruct-twin-54287-1796071496.log")
             .read_text().splitlines()]
    v = judge(nodes.kernel_gate, "vllm", "fp8", "sm100", _starts(patterns, [lines]))
    assert v.passed is False
    assert v.problems == ("fully_cold start ran linear_kernel MarlinFP8ScaledMMLinearKernel",)


def test_a_log_that_names_no_kernel_fails_a_required_fact(patterns, nodes):
    """A changed log line must not pass as a native kernel: the FP8 start without its GEMM
    line fails, saying what it looked for."""
    lines = [line for line in (H200_LOGS / "engine-llama-3-1-8b-instruct-twin-54287-"
                                           "1796071496.log").read_text().splitlines()
             if "CutlassFP8ScaledMMLinearKernel" not in line]
    v = judge(nodes.kernel_gate, "vllm", "fp8", "sm90", _starts(patterns, [lines]))
    assert v.passed is False
    assert len(v.problems) == 1 and "names no linear_kernel" in v.problems[0]


def test_bf16_and_the_cpu_are_recorded_not_judged(patterns, nodes):
    starts = _starts(patterns, [CPU_LOG.read_text().splitlines()])
    for precision, arch in (("bf16", "cpu"), ("bf16", "sm90")):
        v = judge(nodes.kernel_gate, "vllm", precision, arch, starts)
        assert v.passed is None and "recorded, not judged" in v.summary


def test_the_summary_says_where_starts_differed():
    a = StartKernels("fully_cold", {"linear_kernel": ("A",), "cuda_graph_mode": ("NONE",)})
    b = StartKernels("warm", {"linear_kernel": ("B",), "cuda_graph_mode": ("NONE",)})
    assert summarize_facts([a, b]) == {"linear_kernel": "A | B", "cuda_graph_mode": "NONE"}


def test_patterns_and_rules_are_strict(tmp_path):
    with pytest.raises(ValueError, match="value"):
        KernelFactPatterns(linear_kernel=["Using (\\w+) for"])
    with pytest.raises(ValueError, match="sm<major><minor>"):
        KernelRule(engine="e", precision="fp8", archs=["hopper"], expected="x",
                   facts={"linear_kernel": {"match": "x"}})
    text = (PROJECT_ROOT / "configs" / "nodes.yaml").read_text()
    dup = text + ("  - engine: vllm\n    precision: fp8\n    archs: [sm90]\n    expected: x\n"
                  "    facts:\n      linear_kernel: {match: x}\n")
    (tmp_path / "nodes.yaml").write_text(dup)
    with pytest.raises(ConfigError, match="both rule fp8 on sm90"):
        load_nodes(tmp_path / "nodes.yaml")
