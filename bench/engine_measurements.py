"""configs/engine_measurements.json from device recordings: for every configuration a
`bench/gpu_serving.py twins` recording swept, its goodput at the SLO (requests/s within the SLO
per GPU, at the target concurrency, slowest scenario), which serving_config chooses each node
type's engine by (onboarding/deploy/engine_choice.py).

    .venv/bin/python bench/engine_measurements.py \\
        tests/data/gpu/h200-engine-choice/{vllm,sglang}-{twins,smollm2}.json \\
        tests/data/gpu/h200-cold-start/{vllm,sglang}-twins.json \\
        > configs/engine_measurements.json

The committed file holds the recordings made with today's load generator: the engine-choice
recording (vLLM and SGLang on one H200: the 8B twin in FP8, SmolLM2) and the cold-start one (the
8B twin in bf16 on both). The earlier twins (tests/data/gpu/h200/,
h200-client-accounting/) were swept by the client when it forced greedy decoding
and cost vLLM's frontend per token (the FP8 twin's goodput at c=32: 18.3 then, 21.8 now at the
same configuration), so they are not measurements of what the plan would serve with.

`--engine` names the engine of recordings whose steps do not (the earlier recordings: vLLM
0.22.0, their READMEs say); a step that names its engine keeps it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onboarding.deploy.engine_choice import dump_measurements, measurements_from_twins

DESCRIPTION = ("Goodput at the SLO (requests/s within TTFT p95 and ITL bounds, per GPU, at the "
               "SLO's target concurrency or the next point above, slowest scenario) of each "
               "configuration swept on a GPU, computed by bench/engine_measurements.py from "
               "the recordings named in each `source`. Measured, not estimated.")


def build(paths: list[Path], node_type: str, engine: str | None) -> str:
    out = []
    for p in paths:
        rel = p.resolve().relative_to(ROOT) if p.resolve().is_relative_to(ROOT) else p
        out += measurements_from_twins(json.loads(p.read_text()), str(rel), node_type, engine)
    return dump_measurements(out, DESCRIPTION)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recordings", nargs="+", type=Path)
    ap.add_argument("--node-type", default="h200")
    ap.add_argument("--engine", default=None, help="engine of steps that name none")
    args = ap.parse_args()
    sys.stdout.write(build(args.recordings, args.node_type, args.engine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
