"""Record the CPU engine's /metrics around one load point, as the operations tests replay it:
SmolLM2-135M (bf16) on the vLLM CPU build in .venv-engine, 8 prompts at concurrency 4 (the
cpu SLO's target concurrency, configs/gates.yaml) after one such point as warm-up (the first
requests of a fresh CPU engine pay its one-time work), the engine's exposition text before and
after the recorded point, and the client's view of the same point.

    .venv/bin/python bench/record_engine_metrics.py [--out tests/data/operations/cpu-engine]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from onboarding.common.refs import VariantRef
from onboarding.serving.prompts import synthetic_prompts
from onboarding.serving.stats import summarize
from resources.engine import Engine
from resources.loadgen import LoadGenerator, completion_bodies

MODEL = ROOT / ".cache" / "smollm2-135m-instruct"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "operations" /
                    "cpu-engine")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL, local_files_only=True)
    size = sum(p.stat().st_size for p in MODEL.glob("*.safetensors"))
    variant = VariantRef("smollm2-135m", "bf16", str(MODEL), size, "recording")
    engine = Engine(hardware="cpu", log_dir=tempfile.mkdtemp(), start_timeout_s=300)
    with engine.serve(variant, "smol", {"max_model_len": 1024, "max_num_seqs": 16}) as r:
        count = engine.template().load_generator.count_tokens_by
        bodies = completion_bodies("smol", synthetic_prompts(tok, 8, 100, prefix_tokens=20), 32,
                                   count_tokens_by=count)
        for _ in range(2):  # the first is the warm-up
            run = LoadGenerator().run_point(r.base_url, bodies, concurrency=4, max_seconds=300,
                                            request_timeout_s=120)
    s = summarize(run.records, run.duration_s)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metrics-before.prom").write_text(run.metrics_before or "")
    (args.out / "metrics-after.prom").write_text(run.metrics_after or "")
    (args.out / "point.json").write_text(json.dumps(s.row(), indent=1, default=str) + "\n")
    print(json.dumps({k: s.row()[k] for k in ("completed", "ttft_p95_s", "itl_mean_ms",
                                              "duration_s")}))


if __name__ == "__main__":
    main()
