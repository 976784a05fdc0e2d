"""The measured configuration search on the engine at hand, and its record.

Starts each candidate of one model's configuration on this machine's engine (the `Engine`
resource: the vLLM CPU build here), judges it with the rate verdict at the node type's target
rate (configs/search.yaml, the model's SLO from configs/gates.yaml, one scenario's shapes from
the profile), prints the search table and the margin, and writes the winner's record (the file
format of configs/searched_configs.json; docs/serving.md "Measured configuration search").

    .venv/bin/python bench/config_search.py --model smollm2-135m \\
        --model-dir .cache/smollm2-135m-instruct [--node-type cpu] [--scenario chat] \\
        [--tokens IN OUT] [--rate RPS] [--percentile P] [--ttft-s S] [--tpot-ms MS] \\
        [--repeats N] [--max-seconds S] [--min-requests N] [--look-every N] \\
        [--max-num-seqs 2 4 8] [--max-num-batched-tokens 512 2048] [--max-candidates N] \\
        [--budget-min M] [--start-s S] [--out record.json] [--dry-run]

`--dry-run`: resolve everything and print the candidates, start nothing. Exit 2 when no
candidate met the SLO (the search fails closed), 1 on a configuration error.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
for k, v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
             "VLLM_NO_USAGE_STATS": "1", "DAGSTER_DISABLE_TELEMETRY": "1"}.items():
    os.environ.setdefault(k, v)

from onboarding.common.errors import OnboardingError
from onboarding.common.refs import VariantRef
from onboarding.common.tables import md_table
from onboarding.serving.config_search import SearchFailed, candidates
from onboarding.serving.profiles import resolve_slo
from onboarding.serving.search_settings import load_search_file, rate_slo, search_settings
from onboarding.serving.searched import SearchRecord, dump_records
from resources.config_files import ConfigFiles
from resources.engine import Engine
from resources.loadgen import LoadGenerator
from resources.search_runner import Traffic, candidate_cost_s, run_search


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--model-dir", required=True, type=Path)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--node-type", default="cpu")
    p.add_argument("--hardware", default="cpu")
    p.add_argument("--scenario", default="chat")
    p.add_argument("--tokens", nargs=2, type=int, metavar=("IN", "OUT"))
    p.add_argument("--rate", type=float)
    p.add_argument("--percentile", type=float)
    p.add_argument("--confidence", type=float)
    p.add_argument("--ttft-s", type=float)
    p.add_argument("--tpot-ms", type=float)
    p.add_argument("--repeats", type=int)
    p.add_argument("--max-seconds", type=float)
    p.add_argument("--min-requests", type=int)
    p.add_argument("--look-every", type=int)
    p.add_argument("--slo-ttft-p95-s", type=float)
    p.add_argument("--slo-itl-mean-ms", type=float)
    p.add_argument("--max-num-seqs", nargs="+", type=int)
    p.add_argument("--max-num-batched-tokens", nargs="+", type=int)
    p.add_argument("--max-candidates", type=int)
    p.add_argument("--budget-min", type=float)
    p.add_argument("--start-s", type=float, default=60.0,
                   help="estimated seconds of one engine start (budget arithmetic)")
    p.add_argument("--out", type=Path)
    p.add_argument("--dry-run", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    configs = ConfigFiles()
    spec = configs.spec(a.model)
    logs = Path(tempfile.mkdtemp(prefix="config-search-logs-"))
    engine = Engine(hardware=a.hardware, node_type=a.node_type, log_dir=str(logs),
                    start_timeout_s=600)
    template = engine.template()
    base = engine.local_config(spec, a.precision)
    slo = resolve_slo(configs.slo_section(), a.node_type, spec)
    slo = dataclasses.replace(slo, **{k: v for k, v in (
        ("ttft_p95_s", a.slo_ttft_p95_s), ("itl_mean_ms", a.slo_itl_mean_ms)) if v is not None})
    f = load_search_file(configs.path("search.yaml"))
    rate = rate_slo(f, a.node_type)
    rate = dataclasses.replace(rate, **{k: v for k, v in (
        ("target_rate_rps", a.rate), ("percentile", a.percentile), ("ttft_p_s", a.ttft_s),
        ("tpot_p_ms", a.tpot_ms), ("repeats", a.repeats), ("max_seconds", a.max_seconds),
        ("min_requests", a.min_requests), ("look_every", a.look_every),
        ("confidence", a.confidence)) if v is not None})
    settings = search_settings(f, a.node_type)
    _, profile = configs.profile(None, a.hardware)
    sc = profile.scenarios[a.scenario]
    tin, tout = a.tokens or (sc.input_tokens, sc.output_tokens)
    traffic = Traffic(tin, tout, sc.prefix_tokens if not a.tokens else 0,
                      profile.sweep.warmup_requests, profile.sweep.request_timeout_s,
                      template.load_generator.count_tokens_by)
    cands, left_out, basis = candidates(
        template, base, a.max_num_seqs or settings.max_num_seqs,
        a.max_num_batched_tokens or settings.max_num_batched_tokens, slo.target_concurrency,
        a.max_candidates or settings.max_candidates)
    budget_s = (a.budget_min or settings.budget_minutes) * 60
    print(f"{spec.id} on {a.node_type}: {len(cands)} candidates (order: {basis}); left out: "
          f"{'; '.join(left_out) or 'none'}")
    print(f"rate verdict: {rate}\nSLO: {slo}\ntraffic: {traffic}")
    print(f"budget {budget_s / 60:.1f} min, one candidate at most "
          f"{candidate_cost_s(rate, a.start_s) / 60:.1f} min")
    for c in cands:
        print(f"  {c.config.hash} {c.label}{' (the plan)' if c.baseline else ''}")
    if a.dry_run:
        return 0
    from transformers import AutoTokenizer

    # a private copy: another process mapping the weights must not share this run's page cache
    work = Path(tempfile.mkdtemp(prefix="config-search-"))
    model_dir = work / a.model_dir.name
    shutil.copytree(a.model_dir, model_dir)
    size = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    variant = VariantRef(spec.id, a.precision, str(model_dir), size, "bench")
    t0 = time.monotonic()
    try:
        result = run_search(engine, LoadGenerator(), variant, cands, basis, slo, rate, traffic,
                            AutoTokenizer.from_pretrained(model_dir, local_files_only=True),
                            budget_s=budget_s, start_s=a.start_s,
                            min_margin=settings.min_margin,
                            log=lambda s: print(s, flush=True))
    except SearchFailed as exc:
        print(f"FAILED CLOSED: {exc}")
        return 2
    except OnboardingError as exc:
        print(f"error: {exc}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(md_table(result.table()))
    print(f"\nwinner {result.winner.hash}: {result.margin}")
    print(f"search: {result.measured} measured, {result.crashed} crashed, "
          f"{time.monotonic() - t0:.0f} s in all; engine logs in {logs}")
    if a.out:
        a.out.write_text(dump_records([SearchRecord.of(spec.id, result)]))
        print(f"record: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
