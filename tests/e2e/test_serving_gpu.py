"""The engine launcher on a GPU node: hardware detection, the servable matrix, one real start.

Needs an NVIDIA GPU and a GPU build of vLLM whose `vllm` is in ENGINE_BIN_DIR; CI is CPU-only,
so these are skipped there with that reason. Results go to docs/gpu.md when run on an H200.
"""

import os
import shutil
from pathlib import Path

import pytest

from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import VariantRef
from resources.engine import Engine, detect_hardware

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

BIN_DIR = os.environ.get("ENGINE_BIN_DIR", "")
SMOL = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"

if shutil.which("nvidia-smi") is None or not (Path(BIN_DIR) / "vllm").is_file():
    pytest.skip("GPU serving tests: need nvidia-smi and a GPU vLLM build at ENGINE_BIN_DIR "
                "(CI is CPU-only)", allow_module_level=True)


def test_detected_hardware_and_what_it_serves():
    hw = detect_hardware()
    assert hw.startswith("sm") and hw != "cpu"
    engine = Engine(bin_dir=BIN_DIR, hardware="auto")
    served = engine.servable_precisions()
    assert "bf16" in served
    major = int(hw[2:-1])
    assert ("fp8" in served) == (int(hw[2:]) >= 89)
    assert ("nvfp4" in served) == (major >= 10)
    assert engine.gpu_count() >= 1


def test_one_real_start_on_the_gpu(tmp_path):
    if not (SMOL / "model.safetensors").is_file():
        pytest.skip(f"{SMOL} not built (scripts/build_smollm2.py)")
    engine = Engine(bin_dir=BIN_DIR, hardware="auto", log_dir=str(tmp_path), gpus="0",
                    start_timeout_s=600)
    v = VariantRef("smollm2-135m", "bf16", str(SMOL), 0, "gpu")
    with engine.serve(v, "smol", {"max_model_len": 2048, "gpu_memory_utilization": 0.5}) as r:
        assert r.phases.first_token_s is not None
        assert "--gpu-memory-utilization" in r.argv and "--enforce-eager" not in r.argv
