"""On the H200 after SGLang's payload is unpacked: does the carried SGLang import
what its server needs for a Llama on Hopper, against this machine's torch? Prints each module's
version or the error, and exits 1 on the first missing piece, before any device minute goes to
an engine start that would fail the same way.

Run with SGLang's interpreter (PYTHONPATH=/tmp/sgl-site first; bench/gpu_device.sh writes it).
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import shutil
import sys

# the modules the server imports on its way to serving a Llama (FP8 and bf16) with FlashAttention
# 3, in the order the server loads them; a guarded import elsewhere is not listed
MODULES = ("torch", "sgl_kernel", "flashinfer", "tvm_ffi", "transformers", "sglang",
           "sglang.srt.server_args", "sglang.srt.entrypoints.http_server",
           "sglang.srt.managers.scheduler", "sglang.srt.model_executor.model_runner",
           "sglang.srt.models.llama", "sglang.srt.layers.attention.flashattention_backend",
           "sglang.srt.layers.quantization.modelopt_quant", "sglang.srt.layers.sampler")
DISTS = ("torch", "sglang", "sglang-kernel", "flashinfer-python", "apache-tvm-ffi",
         "transformers", "tokenizers", "openai", "xgrammar", "regex", "huggingface-hub")


def main() -> int:
    for dist in DISTS:
        try:
            print(f"{dist}=={md.version(dist)}")
        except md.PackageNotFoundError:
            print(f"{dist}: not installed")
    # SGLang's own JIT kernels (activation, RMSNorm, KV store) build with nvcc through tvm-ffi
    # on first use; the image has nvcc 13.0 (KINDS.md)
    print("nvcc:", shutil.which("nvcc") or os.environ.get("CUDA_HOME") or "not found")
    failed = 0
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - every missing piece is reported, then exit 1
            print(f"FAIL import {name}: {type(exc).__name__}: {exc}")
            failed += 1
            continue
        print(f"ok   import {name} ({getattr(mod, '__file__', '')})")
    if not failed:
        import torch

        print("cuda:", torch.version.cuda, torch.cuda.get_device_name(0),
              torch.cuda.get_device_capability(0))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
