#!/usr/bin/env bash
# SGLang's payload (bench/sglang_payload.sh's pieces, their parts gathered in PARTS) checked
# against its sha256, unpacked into ROOT/sgl-site, and BIN/python written: the machine's python3
# with that tree ahead of PYTHONPATH, for the engine process only (SGLang's pins, transformers
# 5.12.1, tokenizers 0.22.2, openai 2.6.1, tvm-ffi 0.1.11, ahead of the vLLM payload's). The
# Engine resource starts SGLang as BIN/python -m sglang.launch_server. Used by
# bench/gpu_device.sh (`sglang install`) and bench/gpu_search.sh (`install`).
#
#   bash bench/sglang_unpack.sh PARTS SHA256_FILE BIN [ROOT=/tmp]
set -euo pipefail
parts=${1:?the folder of part.K files}; sha=${2:?the payload sha256 file}; bin=${3:?the bin dir}
root=${4:-/tmp}
cat $(ls "$parts"/part.* | sort -V) > "$root/sgl.tar.xz"
echo "$(cat "$sha")  $root/sgl.tar.xz" | sha256sum -c - || { rm -f "$root/sgl.tar.xz"; exit 1; }
rm -rf "$root/sgl-site"
if command -v xz >/dev/null; then xz -dc -T0 "$root/sgl.tar.xz" | tar -C "$root" -xf -
else python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
    "$root/sgl.tar.xz" "$root"
fi
rm -f "$root/sgl.tar.xz"
mkdir -p "$bin"
printf '#!/bin/sh\nPYTHONPATH=%s/sgl-site${PYTHONPATH:+:$PYTHONPATH} exec %s "$@"\n' \
    "$root" "$(command -v python3)" > "$bin/python"
chmod +x "$bin/python"
