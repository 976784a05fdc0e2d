"""Load a rendered LiteLLM gateway config with LiteLLM's own proxy config parser.

Runs in the throwaway LiteLLM virtualenv (`bash scripts/setup_litellm.sh` makes
`.cache/litellm-venv`), never in the project's: LiteLLM's proxy pulls in a web stack the
pipeline does not need. Prints what the parser built (the router's deployments) as JSON;
exits non-zero with LiteLLM's own error when it refuses the file.

    .cache/litellm-venv/bin/python scripts/check_gateway_config.py <litellm-config.yaml>
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import


async def _load(path: str) -> dict:
    from litellm.proxy.proxy_server import ProxyConfig

    router, _, _ = await ProxyConfig().load_config(router=None, config_file_path=path)
    return {
        "routing_strategy": router.routing_strategy,
        "deployments": [{
            "model_name": d["model_name"],
            "litellm_params": {k: v for k, v in d["litellm_params"].items()
                               if k in ("model", "api_base", "timeout", "stream_timeout",
                                        "max_parallel_requests")},
            "model_info": {k: v for k, v in (d.get("model_info") or {}).items()
                           if k in ("id", "mode")},
        } for d in router.model_list],
    }


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(asyncio.run(_load(sys.argv[1])), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
