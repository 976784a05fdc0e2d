#!/usr/bin/env bash
# A throwaway virtualenv with LiteLLM's proxy config parser, for checking rendered gateway
# configs (tests/onboarding/test_layout_render.py, scripts/check_gateway_config.py). Kept out of
# the project's .venv: the proxy's web stack is large and the pipeline never imports it.
# litellm[proxy] 1.110.2 requires a `litellm-proxy` distribution that is not on PyPI, so the
# proxy's own dependencies that its config loader imports are listed here instead. 1.107.0 was a
# compromised release; this pin is later.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.cache/litellm-venv
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import litellm.proxy.proxy_server" \
    >/dev/null 2>&1; then
  echo "litellm venv ready: $venv"; exit 0
fi
"${PY:-python3}" -m venv "$venv"
"$venv/bin/pip" install -q litellm==1.110.2 websockets==15.0.1 fastapi==0.165.0 \
  uvicorn==0.54.0 backoff==2.2.1 orjson==3.13.0 APScheduler==3.11.3 python-multipart==0.0.34 \
  cryptography==50.0.2 PyJWT==2.15.1 rq==2.12.0 PyNaCl==1.6.2 rich==13.9.4 fastapi-sso==0.23.0 \
  gunicorn==23.0.0 semver==3.1.2 Expression==5.8.0 mcp==2.3.0 soundfile==0.14.0
LITELLM_LOCAL_MODEL_COST_MAP=True "$venv/bin/python" -c "import litellm.proxy.proxy_server"
echo "litellm venv ready: $venv"
