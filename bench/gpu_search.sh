#!/usr/bin/env bash
# The device side of the measured configuration search on one GPU (tests/data/gpu/config-search
# has what it recorded and the exact calls). Each step is one device call, back to back on one
# machine; the pieces and the code travel as carried folders under build/gpu-search/:
#
#   bash bench/gpu_search.sh stage T S     (here, on a CPU) build/gpu-search/: the payload tar T
#                                          (the wheels below, under whl/) split in pieces p0-pN,
#                                          and code/: its sha256, the twin's FP8 variant (Model
#                                          Optimizer's export marker, no weights) and its BF16
#                                          checkpoint (config and tokenizer), vLLM's
#                                          auto_tune.sh from S and a `bc` for it
#   bash bench/gpu_search.sh piece K       keep pK's part of the vLLM payload under /tmp/asm
#   bash bench/gpu_search.sh sglang-piece K   keep .sglK's part of SGLang's payload (made here by
#                                          `PIECE=44m bash bench/sglang_payload.sh`) under
#                                          /tmp/sglasm; `install` then unpacks it too and the
#                                          search starts SGLang's candidates beside vLLM's
#   bash bench/gpu_search.sh install       with the last piece and code/: assemble, check,
#                                          install into /tmp/site, the working tree and code/
#                                          into /tmp/code, then start `drive` in its own
#                                          session (it outlives the call; `watch` follows it)
#   bash bench/gpu_search.sh watch S       wait up to S seconds for `drive`, then return what it
#                                          wrote so far under $OUT (called until it is done)
#
# `drive`: the stack pinned to the installed engine (bench/gpu_serving.py pinned_configs, so the
# plan's hash is the one the engine runs), the search (bench/config_search.py --plan on the 8B
# twin in FP8 at the node type of this card; RATE, REPEATS, MAX_SECONDS, BUDGET_MIN,
# SEARCH_SEQS, SEARCH_TOKENS, MAX_CANDIDATES and OTHER_STARTS set it, SEARCH_DEADLINE_S bounds
# it, SEARCH=0 skips it; with SGLang's pieces sent, its engine starts the grid too), then vLLM's
# auto_tune as the peer
# (bench/search_vs_auto_tune.py peer) on the same variant, until DRIVE_DEADLINE_S.
#
# The payload: vLLM 0.22.0 and its wheels (bench/gpu_device.sh's list without nvidia-modelopt,
# whose only use here, the twin's FP8 marker, is written beforehand into code/variant/), plus
# dagster's import closure from wheels-pipeline.txt; tarred and split in pieces p0-pN.
set -euo pipefail
W=${W:-/tmp/gsearch}
CARRY=build/gpu-search
export PYTHONPATH=/tmp/site:/tmp/code PATH=/tmp/site/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DAGSTER_DISABLE_TELEMETRY=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
TWIN=llama-3-1-8b-instruct-twin

case "$1" in
  stage)
    tarball=${2:?the payload tar}; script=${3:?the path of vLLM benchmarks/auto_tune/auto_tune.sh}
    rm -rf "$CARRY" && mkdir -p "$CARRY/code/peer/bin" "$CARRY/code/variant" "$CARRY/split"
    # a call carries the working tree too (about 14 MB) within its 64 MiB: 44 MiB a piece
    split -b 44m -d -a 2 "$tarball" "$CARRY/split/part."
    k=0
    for f in "$CARRY"/split/part.*; do mkdir -p "$CARRY/p$k" && mv "$f" "$CARRY/p$k/" && k=$((k + 1)); done
    rmdir "$CARRY/split"
    sha256sum "$tarball" | cut -d' ' -f1 > "$CARRY/code/payload.sha256"
    cp "$script" "$CARRY/code/peer/auto_tune.sh"
    cp bench/auto_tune_bc.py "$CARRY/code/peer/bin/bc" && chmod +x "$CARRY/code/peer/bin/bc"
    for precision in fp8 bf16; do
      .venv/bin/python bench/twin_variant.py llama-3-1-8b-instruct-twin $precision "$CARRY/code/variant"
    done
    du -sh "$CARRY"/* ;;
  piece)
    mkdir -p /tmp/asm && cp "$CARRY/p$2"/part.* /tmp/asm/ && ls -l /tmp/asm
    if [ "$2" = 0 ]; then
      nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv
      python3 -c 'import torch, sys; print("torch", torch.__version__, sys.version)'
      for t in curl bc setsid; do printf '%s: %s\n' "$t" "$(command -v $t || echo missing)"; done
      pwd; df -h /tmp | tail -1
    fi ;;
  sglang-piece)
    mkdir -p /tmp/sglasm && cp ".sgl$2"/part.* /tmp/sglasm/
    [ -f ".sgl$2/sgl.sha256" ] && cp ".sgl$2/sgl.sha256" /tmp/sglasm/
    ls -l /tmp/sglasm ;;
  install)
    rm -rf /tmp/code && mkdir -p /tmp/code
    tar cf - --exclude=./build . | tar xf - -C /tmp/code  # the working tree, then code/'s extras
    cp -r "$CARRY/code/." /tmp/code/
    n=$(ls -d "$CARRY"/p[0-9]* | sort -V | tail -1)
    cp "$n"/part.* /tmp/asm/
    cd /tmp/asm && cat $(ls part.* | sort -V) > payload.tar
    echo "$(cat /tmp/code/payload.sha256)  payload.tar" | sha256sum -c -
    tar xf payload.tar && rm -f part.* payload.tar
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site whl/*.whl
    for s in whl/*.tar.gz; do
      python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site "$s"
    done
    rm -rf whl
    python3 -c "import vllm, torch, dagster; print('vllm', vllm.__version__, 'torch', torch.__version__, 'dagster', dagster.__version__)"
    mkdir -p "$W/res"
    if [ -f /tmp/sglasm/sgl.sha256 ]; then
      # SGLang beside vLLM: its own tree first on the engine's path (bench/gpu_device.sh sglang)
      bash /tmp/code/bench/sglang_unpack.sh /tmp/sglasm /tmp/sglasm/sgl.sha256 "$W/bin-sglang"
      rm -rf /tmp/sglasm
      "$W/bin-sglang/python" -c "import sglang; print('sglang', sglang.__version__)"
    fi
    cd /tmp/code && setsid nohup bash bench/gpu_search.sh drive > "$W/res/drive.log" 2>&1 < /dev/null &
    sleep 2; echo "drive started" ;;
  drive)
    set -x
    T0=$(date +%s)
    cd /tmp/code
    mkdir -p "$W/res"
    python3 - "$W" <<'EOF'
import json, sys
from pathlib import Path
from bench.gpu_serving import engine_bin, installed, pinned_configs
w = Path(sys.argv[1])
versions = installed()
bin_dir = engine_bin(w)
cfg, changed = pinned_configs(w, versions)
(w / "res" / "versions.json").write_text(json.dumps({"versions": versions, "configs_changed": changed,
                                                      "engine_bin": str(bin_dir)}, indent=1))
print(versions)
EOF
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    case "$gpu" in
      *H200*) NT=h200; RATE=${RATE:-34} ;;
      *) NT=h100; RATE=${RATE:-26} ;;
    esac
    echo "card: $gpu, node type $NT, rate $RATE" | tee "$W/res/card.txt"
    rm -rf "$W/variant" && cp -r /tmp/code/variant "$W/variant"
    V="$W/variant/$TWIN-fp8"
    # OTHER_STARTS=1: the plan's configuration in BF16 (the twin's source precision) starts the
    # grid too, served from the twin's checkpoint
    starts=""
    [ "${OTHER_STARTS:-0}" = 1 ] && starts="--other-starts --variant bf16=$W/variant/$TWIN-bf16"
    # SGLang unpacked by `install`: the plan's configuration in its template starts the grid too
    [ -x "$W/bin-sglang/python" ] && starts="${starts:---other-starts} --engine-bin-for sglang=$W/bin-sglang"
    set +e
    if [ "${SEARCH:-1}" != 1 ]; then echo "search not run (SEARCH=0)" | tee -a "$W/res/card.txt"; else
    timeout "${SEARCH_DEADLINE_S:-1000}" python3 bench/config_search.py --model "$TWIN" \
        --model-dir "$V" --precision fp8 --node-type "$NT" --hardware sm90 --plan \
        --config-dir "$W/configs" --engine-bin "$W/bin" --gpus 0 --log-dir "$W/res/engine-logs" \
        --max-num-seqs ${SEARCH_SEQS:-64 128} --max-num-batched-tokens ${SEARCH_TOKENS:-8192 2048} \
        --max-candidates "${MAX_CANDIDATES:-4}" $starts \
        --rate "$RATE" --repeats "${REPEATS:-3}" --max-seconds "${MAX_SECONDS:-60}" --min-seconds 20 --min-requests 300 \
        --look-every 100 --budget-min "${BUDGET_MIN:-30}" --start-s 150 \
        --out "$W/res/searched_configs.json" --samples "$W/res/samples.jsonl" \
        --table-out "$W/res/search.json" > "$W/res/search.log" 2>&1
    echo "search rc $? after $(( $(date +%s) - T0 )) s" | tee -a "$W/res/card.txt"; fi
    export PATH=$W/bin:/tmp/code/peer/bin:$PATH  # `vllm` (python3 -m vllm.entrypoints.cli.main), `bc`
    left=$(( ${DRIVE_DEADLINE_S:-1500} - ($(date +%s) - T0) ))
    if [ "$left" -gt 240 ]; then
      python3 bench/search_vs_auto_tune.py peer --script /tmp/code/peer/auto_tune.sh \
          --script-source "${PEER_SOURCE:-vllm-project/vllm benchmarks/auto_tune/auto_tune.sh}" \
          --model "$V" --out "$W/res" --work /tmp/peer --seqs "${PEER_SEQS:-32 64}" --tokens "${PEER_TOKENS:-8192}" \
          --deadline-s "$left" > "$W/res/peer.out" 2>&1
      echo "peer rc $? after $(( $(date +%s) - T0 )) s" | tee -a "$W/res/card.txt"
    else
      echo "peer not run: $left s left of the drive's deadline" | tee -a "$W/res/card.txt"
    fi
    touch "$W/res/DONE" ;;
  watch)
    end=$(( $(date +%s) + ${2:-500} ))
    while [ ! -f "$W/res/DONE" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    cd "$W/res"
    # the engines' key lines: version, kernels, KV cache, graphs, readiness
    grep -h -E "vLLM API server version|non-default args|Using .*(backend|kernel)|KV cache|Maximum concurrency|CUDA graph|Graph capturing|torch.compile|Application startup complete|ERROR|Error" \
        engine-logs/*.log 2>/dev/null | cut -c1-400 > engine-key-lines.txt || true
    if [ -d /tmp/peer/auto-benchmark ]; then
      grep -h -E "vLLM API server version|non-default args|KV cache|Maximum concurrency|ERROR|Error|unrecognized" \
          /tmp/peer/auto-benchmark/*/vllm_log_* 2>/dev/null | cut -c1-400 > peer-engine-key-lines.txt || true
      cp /tmp/peer/auto-benchmark/*/result.txt peer-result.txt 2>/dev/null || true
    fi
    tar czf "$OUT/res.tar.gz" --exclude='*.tar.gz' --exclude=profile . /tmp/peer/auto-benchmark 2>/dev/null || true
    for f in search.json card.txt searched_configs.json peer.json versions.json; do
      if [ -f "$f" ]; then cp "$f" "$OUT/"; fi
    done
    # what is written so far: a drive still searching has no peer log yet
    ls -la; for f in card.txt:5 search.log:25 peer-log.txt:8; do
      if [ -f "${f%:*}" ]; then tail -"${f#*:}" "${f%:*}"; fi
    done
    if [ -f DONE ]; then echo DRIVE-DONE; else echo DRIVE-RUNNING; fi ;;
  *) echo "unknown step $1" >&2; exit 2 ;;
esac
