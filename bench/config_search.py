"""The measured configuration search on the engine at hand, and its record.

Starts each candidate of one model's configuration on this machine's engine (the `Engine`
resource: the vLLM CPU build here), judges it with the rate verdict at the node type's target
rate (configs/search.yaml, the model's SLO from configs/gates.yaml, one scenario's shapes from
the profile), prints the search table and the margin, and writes the winner's record (the file
format of configs/searched_configs.json; docs/serving.md "Measured configuration search").

    .venv/bin/python bench/config_search.py --model smollm2-135m \\
        --model-dir .cache/smollm2-135m-instruct [--node-type cpu] [--scenario chat] \\
        [--tokens IN OUT] [--rate RPS] [--percentile P] [--ttft-s S] [--tpot-ms MS] \\
        [--repeats N] [--max-seconds S] [--min-requests N] [--min-seconds S] [--look-every N] \\
        [--max-num-seqs 2 4 8] [--max-num-batched-tokens 512 2048] \\
        [--api-server-count 1 2] [--max-candidates N] [--other-starts] \\
        [--variant PRECISION=DIR ...] [--engine-bin-for ENGINE=DIR ...] \\
        [--budget-min M] [--start-s S] [--out record.json] [--dry-run] \\
        [--plan] [--config-dir DIR] [--engine-bin DIR] [--gpus 0] [--log-dir DIR] \\
        [--samples requests.jsonl] [--table-out search.json]

`--plan`: start from the configuration serving_config plans for the node type (the rule's:
`--max-num-seqs` = the SLO's target concurrency), as on a GPU node type, instead of the engine
at hand's local one. `--samples`: every run's requests (one JSON line each: candidate hash,
repetition, bodies, the fields the verdict reads), which tests/serving judge again;
`--table-out`: the search table, margin, settings and each candidate's engine argv.
`--other-starts` (with `--plan`): the plan's configuration at the other precisions and TPs it
may serve on the node type (serving_plan.search_bases: the ladder past the gate, TP up to the
GPUs in `--gpus`) start the grid too, each precision served from its `--variant` directory
(`--model-dir` is `--precision`'s); a precision without one is left out and said. The plan's
configuration in each other engine template with kernels for it there (serving_plan.
engine_bases: SGLang's flags for the same numbers) starts the grid too where
`--engine-bin-for ENGINE=DIR` says where that engine is installed (the directory its template's
command runs from: `python` for SGLang); an engine without one is left out and said.
`--dry-run`: resolve everything and print the candidates, start nothing. Exit 2 when no
candidate met the SLO (the search fails closed), 1 on a configuration error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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

# what a sample line keeps of a request: what the rate verdict reads (rate_verdict._value)
SAMPLE_FIELDS = ("ok", "error", "start_s", "ttft_s", "e2e_s", "output_tokens", "stream_tokens")


def planned_serving(configs: ConfigFiles, spec):
    """The serving plan serving_config gives `spec` (assets/deploy.py), the search records left
    out: the search starts from the rule's configuration."""
    from onboarding.deploy.plan import build_plan
    from onboarding.deploy.serving_plan import serving_plan, with_engine_choices

    nodes, stack = configs.nodes(), configs.stack()
    return with_engine_choices(serving_plan(spec, build_plan(spec, nodes, None, None), nodes,
                                            stack), spec, stack.templates,
                               configs.stack_config(), configs.engine_measurements(),
                               stack.engine)


def planned_base(configs: ConfigFiles, spec, node_type: str):
    """What serving_config plans for `node_type` (`planned_serving`)."""
    splan = planned_serving(configs, spec)
    config = splan.config(node_type)
    if config is None:
        raise SystemExit(f"serving_config plans nothing for {spec.id} on {node_type}: "
                         f"{splan.skipped.get(node_type, '?')}")
    return config


def other_dirs(given: list[str], flag: str = "--variant") -> dict[str, Path]:
    """`--variant PRECISION=DIR` (or `--engine-bin-for ENGINE=DIR`) values as name ->
    directory."""
    out = {}
    for item in given:
        precision, sep, path = item.partition("=")
        if not sep or not precision or not path:
            raise SystemExit(f"{flag} {item!r}: expected NAME=DIR")
        if not Path(path).is_dir():
            raise SystemExit(f"{flag} {item!r}: {path} is not a directory")
        out[precision] = Path(path)
    return out


def other_starts(configs: ConfigFiles, spec, a: argparse.Namespace, dirs: dict[str, Path]
                 ) -> tuple[list, list[str]]:
    """The plan's configuration at the node type's other precisions and TPs
    (`search_bases`), those with weights given; and what was left out."""
    from onboarding.deploy.serving_plan import engine_bases, search_bases

    if not a.plan:
        raise SystemExit("--other-starts needs --plan: other starts are the plan's")
    gpus = len([g for g in a.gpus.split(",") if g.strip()]) or 1
    bases, left_out = search_bases(planned_serving(configs, spec), spec, configs.nodes(),
                                   configs.stack(), a.node_type, max_tensor_parallel=gpus)
    kept = [b for b in bases if b.precision in dirs]
    left_out += [f"{b.precision} TP {b.tensor_parallel}: no --variant {b.precision}=DIR given"
                 for b in bases if b.precision not in dirs]
    engines, engines_left_out = engine_bases(planned_serving(configs, spec), spec,
                                             configs.stack(), a.node_type,
                                             at_hand=frozenset(other_dirs(a.engine_bin_for,
                                                                          "--engine-bin-for")))
    return kept + engines, left_out + engines_left_out


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
    p.add_argument("--min-seconds", type=float)
    p.add_argument("--look-every", type=int)
    p.add_argument("--slo-ttft-p95-s", type=float)
    p.add_argument("--slo-itl-mean-ms", type=float)
    p.add_argument("--max-num-seqs", nargs="+", type=int)
    p.add_argument("--max-num-batched-tokens", nargs="+", type=int)
    p.add_argument("--api-server-count", nargs="+", type=int)
    p.add_argument("--max-candidates", type=int)
    p.add_argument("--other-starts", action="store_true",
                   help="with --plan: other precisions and TPs start the grid too")
    p.add_argument("--variant", action="append", default=[], metavar="PRECISION=DIR",
                   help="the weights of another precision (--other-starts)")
    p.add_argument("--engine-bin-for", action="append", default=[], metavar="ENGINE=DIR",
                   help="where another engine template's command runs from (--other-starts)")
    p.add_argument("--budget-min", type=float)
    p.add_argument("--start-s", type=float, default=60.0,
                   help="estimated seconds of one engine start (budget arithmetic)")
    p.add_argument("--out", type=Path)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--plan", action="store_true",
                   help="start from serving_config's plan for the node type")
    p.add_argument("--config-dir", default="")
    p.add_argument("--engine-bin", default="")
    p.add_argument("--gpus", default="")
    p.add_argument("--log-dir", type=Path)
    p.add_argument("--samples", type=Path)
    p.add_argument("--table-out", type=Path)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    configs = ConfigFiles(config_dir=a.config_dir)
    spec = configs.spec(a.model)
    logs = a.log_dir or Path(tempfile.mkdtemp(prefix="config-search-logs-"))
    engine = Engine(hardware=a.hardware, node_type=a.node_type, log_dir=str(logs),
                    start_timeout_s=600, configs=configs,
                    **{k: v for k, v in (("bin_dir", a.engine_bin), ("gpus", a.gpus)) if v})
    template = engine.template()
    base = planned_base(configs, spec, a.node_type) if a.plan else \
        engine.local_config(spec, a.precision)
    slo = resolve_slo(configs.slo_section(), a.node_type, spec)
    slo = dataclasses.replace(slo, **{k: v for k, v in (
        ("ttft_p95_s", a.slo_ttft_p95_s), ("itl_mean_ms", a.slo_itl_mean_ms)) if v is not None})
    f = load_search_file(configs.path("search.yaml"))
    rate = rate_slo(f, a.node_type, spec)
    rate = dataclasses.replace(rate, **{k: v for k, v in (
        ("target_rate_rps", a.rate), ("percentile", a.percentile), ("ttft_p_s", a.ttft_s),
        ("tpot_p_ms", a.tpot_ms), ("repeats", a.repeats), ("max_seconds", a.max_seconds),
        ("min_requests", a.min_requests), ("look_every", a.look_every),
        ("min_seconds", a.min_seconds),
        ("confidence", a.confidence)) if v is not None})
    settings = search_settings(f, a.node_type)
    _, profile = configs.profile(None, a.hardware)
    sc = profile.scenarios[a.scenario]
    traffic = Traffic.of(sc, profile.sweep, template)
    if a.tokens:  # exact shapes asked: no shared prefix
        traffic = dataclasses.replace(traffic, input_tokens=a.tokens[0],
                                      output_tokens=a.tokens[1], prefix_tokens=0)
    dirs = {a.precision: a.model_dir, **other_dirs(a.variant)}
    starts, starts_left_out = other_starts(configs, spec, a, dirs) if a.other_starts else ([], [])
    cands, left_out, basis = candidates(
        template, base, a.max_num_seqs or settings.max_num_seqs,
        a.max_num_batched_tokens or settings.max_num_batched_tokens, slo.target_concurrency,
        a.max_candidates or settings.max_candidates,
        api_server_count=a.api_server_count or settings.api_server_count, starts=starts,
        templates=configs.stack().templates)
    left_out = starts_left_out + left_out
    budget_s = (a.budget_min or settings.budget_minutes) * 60
    print(f"{spec.id} on {a.node_type}: {len(cands)} candidates (order: {basis}); left out: "
          f"{'; '.join(left_out) or 'none'}")
    print(f"rate verdict: {rate}\nSLO: {slo}\ntraffic: {traffic}")
    if base.precision != a.precision:
        print(f"error: the plan serves {base.precision} on {a.node_type}, not {a.precision}")
        return 1
    print(f"budget {budget_s / 60:.1f} min, one candidate at most "
          f"{candidate_cost_s(rate, a.start_s) / 60:.1f} min")
    for c in cands:
        print(f"  {c.config.hash} {c.label}{' (the plan)' if c.baseline else ''}")
    if a.dry_run:
        return 0
    from transformers import AutoTokenizer

    # private copies: another process mapping the weights must not share this run's page cache
    work = Path(tempfile.mkdtemp(prefix="config-search-"))
    variants = {}
    for precision in sorted({c.config.precision for c in cands}):
        copy = work / precision / dirs[precision].name
        shutil.copytree(dirs[precision], copy)
        size = sum(p.stat().st_size for p in copy.glob("*.safetensors"))
        variants[precision] = VariantRef(spec.id, precision, str(copy), size, "bench")
    model_dir = Path(variants[a.precision].path)
    t0 = time.monotonic()
    if a.samples:
        a.samples.write_text("")

    def on_run(c, i, run, n_bodies):
        if a.samples:
            with a.samples.open("a") as fh:
                for r in run.records:
                    fh.write(json.dumps({"hash": c.config.hash, "repetition": i,
                                         "bodies": n_bodies, "stopped": run.stopped,
                                         **{k: getattr(r, k) for k in SAMPLE_FIELDS}}) + "\n")

    def write_table(result=None, failed: str = "") -> None:
        if a.table_out:
            a.table_out.write_text(json.dumps({
                "model": spec.id, "node_type": a.node_type, "basis": basis,
                "left_out": left_out, "rate": dataclasses.asdict(rate),
                "slo": dataclasses.asdict(slo), "traffic": dataclasses.asdict(traffic),
                "min_margin": settings.min_margin, "budget_s": budget_s,
                "candidates": [{"hash": c.config.hash, "label": c.label, "baseline": c.baseline,
                                "engine": c.config.engine, "precision": c.config.precision,
                                "tensor_parallel": c.config.tensor_parallel,
                                "argv": c.config.args(variants[c.config.precision].path, 0,
                                                      "127.0.0.1")}
                               for c in cands],
                "table": result.table() if result else [],
                "winner": result.winner.hash if result else None,
                "baseline": result.baseline.hash if result else cands[0].config.hash,
                "margin": result.margin if result else "", "failed_closed": failed,
                "search_s": round(time.monotonic() - t0, 1)}, indent=1, default=str) + "\n")

    engines = {base.engine: engine}
    for name, bin_dir in other_dirs(a.engine_bin_for, "--engine-bin-for").items():
        engines[name] = Engine(engine=name, bin_dir=str(bin_dir), hardware=a.hardware,
                               node_type=a.node_type, log_dir=str(logs), start_timeout_s=900,
                               configs=configs, **({"gpus": a.gpus} if a.gpus else {}))
    try:
        result = run_search(engines, LoadGenerator(), variants, cands, basis, slo, rate, traffic,
                            AutoTokenizer.from_pretrained(model_dir, local_files_only=True),
                            budget_s=budget_s, start_s=a.start_s,
                            min_margin=settings.min_margin,
                            log=lambda s: print(s, flush=True), on_run=on_run)
    except SearchFailed as exc:
        print(f"FAILED CLOSED: {exc}")
        write_table(failed=str(exc))
        return 2
    except OnboardingError as exc:
        print(f"error: {exc}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(md_table(result.table()))
    print(f"\nwinner {result.winner.hash}: {result.margin}")
    write_table(result)
    print(f"search: {result.measured} measured, {result.crashed} crashed, "
          f"{time.monotonic() - t0:.0f} s in all; engine logs in {logs}")
    if a.out:
        a.out.write_text(dump_records([SearchRecord.of(spec.id, result)]))
        print(f"record: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
