#!/usr/bin/env bash
# Build SGLang's payload for the H200: the wheels of bench/sglang-wheels.txt,
# installed here into one tree for the device's Python 3.12 (pip --target, no dependencies: the
# rest comes from the device image and the vLLM payload), compressed with xz and split into
# pieces .sgl1..N of at most PIECE each (git-ignored), the last one holding the checksum.
# Run from the repository root; needs the package registry (pip) and xz.
#
#   bash bench/sglang_payload.sh            # then: bash bench/gpu_device.sh sglang piece K ...
#
# xz instead of the wheels' deflate: sglang-kernel's FlashAttention 3 library (flash_ops, 1.1 GB
# of sm80/sm90 cubins) is 383 MB as a wheel and about 170 MB as xz, which halves the pieces.
# Dropped: sgl_kernel/sm100/ (the Blackwell build of common_ops; an sm90 GPU loads sm90/ only,
# sgl_kernel/load_utils.py).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${WORK:-$(mktemp -d)}
PIECE=${PIECE:-56m}
PIP=${PIP:-python3 -m pip}
plat=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 --platform any)
tags=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3
      --abi none "${plat[@]}")
mkdir -p "$WORK/whl"
$PIP download -q --no-deps "${tags[@]}" -d "$WORK/whl" -r "$HERE/sglang-wheels.txt"
n_whl=$(ls "$WORK"/whl/*.whl | wc -l)
n_req=$(grep -cE '^[A-Za-z]' "$HERE/sglang-wheels.txt")
[ "$n_whl" = "$n_req" ] || { echo "downloaded $n_whl wheels for $n_req pins" >&2; exit 1; }
rm -rf "$WORK/sgl-site"
$PIP install -q --no-deps --no-index --no-compile --target "$WORK/sgl-site" "${tags[@]}" \
    "$WORK"/whl/*.whl
rm -rf "$WORK/sgl-site/sgl_kernel/sm100" "$WORK/sgl-site/bin"
(cd "$WORK/sgl-site" && ls -d *.dist-info | sed 's/\.dist-info$//' | sort) > "$WORK/sgl-site/PAYLOAD"
tar -C "$WORK" -cf - sgl-site | xz -T"${XZ_THREADS:-2}" -6 > "$WORK/sgl.tar.xz"
sha256sum "$WORK/sgl.tar.xz" | cut -d' ' -f1 > "$WORK/sgl.sha256"
rm -rf .sgl[0-9]*
split -b "$PIECE" -d -a 1 "$WORK/sgl.tar.xz" "$WORK/part."
n=0
for p in "$WORK"/part.*; do n=$((n + 1)); mkdir -p ".sgl$n"; mv "$p" ".sgl$n/"; done
cp "$WORK/sgl.sha256" ".sgl$n/"
exclude=$(git rev-parse --git-common-dir)/info/exclude
grep -qx '/.sgl\*/' "$exclude" 2>/dev/null || echo '/.sgl*/' >> "$exclude"
du -sh .sgl[0-9]*
echo "sglang pieces: $n ($(du -sm "$WORK/sgl.tar.xz" | cut -f1) MiB xz; installed tree" \
     "$(du -sm "$WORK/sgl-site" | cut -f1) MiB); send them with bash bench/gpu_device.sh sglang piece K"
