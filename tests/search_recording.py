"""One GPU recording of the measured configuration search (tests/data/gpu/config-search*/),
read back the way the product reads it: its table and settings (search.json), every request of
every run judged again by `rate_verdict.judge` (samples.jsonl.gz), the candidates rebuilt by
`config_search.candidates` from the plan serving_config gives on the stack pinned to the engine
that ran (versions.json), and `config_search.search` replayed over the recorded runs.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from onboarding.serving.config_search import Measured, SearchResult, candidates, search
from onboarding.serving.rate_verdict import RateSlo, RateVerdict, combine, judge, max_looks
from onboarding.serving.stats import RequestRecord, Slo

MODEL = "llama-3-1-8b-instruct-twin"


def judged_runs(samples: Path, slo: Slo, rate: RateSlo) -> dict[str, list[RateVerdict]]:
    """Per candidate hash in a search's samples.jsonl.gz, its runs in order, each judged again
    by `rate_verdict.judge` from its requests at the run's looks."""
    runs: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    bodies: dict[tuple[str, int], int] = {}
    with gzip.open(samples, "rt") as fh:
        for line in fh:
            s = json.loads(line)
            runs[s["hash"]][s["repetition"]].append(RequestRecord(
                ok=s["ok"], error=s["error"], start_s=s["start_s"], ttft_s=s["ttft_s"],
                e2e_s=s["e2e_s"], output_tokens=s["output_tokens"],
                stream_tokens=s["stream_tokens"]))
            bodies[(s["hash"], s["repetition"])] = s["bodies"]
    return {h: [judge(recs, slo, rate, max_looks(bodies[(h, i)], rate))
                for i, recs in sorted(reps.items())] for h, reps in runs.items()}


@dataclass(frozen=True)
class SearchRecording:
    path: Path

    def missing(self) -> str:
        """Why this recording cannot be replayed ("" when it can)."""
        absent = [f for f in ("search.json", "samples.jsonl.gz", "versions.json")
                  if not (self.path / f).is_file()]
        return (f"no GPU recording of the configuration search in {self.path} ({', '.join(absent)} "
                "absent; made by bench/gpu_search.sh on a GPU machine)") if absent else ""

    def recorded(self) -> dict:
        return json.loads((self.path / "search.json").read_text())

    def versions(self) -> dict:
        return json.loads((self.path / "versions.json").read_text())["versions"]

    def settings(self) -> tuple[Slo, RateSlo]:
        rec = self.recorded()
        return Slo(**rec["slo"]), RateSlo(**rec["rate"])

    def runs_by_candidate(self) -> dict[str, list[RateVerdict]]:
        """Per candidate hash, its runs in order, each judged again from its requests."""
        return judged_runs(self.path / "samples.jsonl.gz", *self.settings())

    def pinned_configs(self, tmp_path: Path) -> Path:
        """configs/ pinned to the engine, torch, CUDA and driver that ran (as the device did)."""
        from bench.gpu_serving import pinned_configs as pin

        cfg, _ = pin(tmp_path, self.versions())
        return cfg

    def candidates(self, tmp_path: Path):
        """The plan's configuration on the pinned stack and the recorded grid around it, built
        the way the search built them: (the plan's configuration, candidates, basis)."""
        from bench.config_search import planned_base, planned_serving
        from onboarding.deploy.serving_plan import search_bases
        from resources.config_files import ConfigFiles

        rec = self.recorded()
        slo, _ = self.settings()
        cf = ConfigFiles(config_dir=str(self.pinned_configs(tmp_path)))
        spec = cf.spec(MODEL)
        base = planned_base(cf, spec, rec["node_type"])
        grid = [r for r in rec["table"] if not r["baseline"]
                and isinstance(r["max_num_batched_tokens"], int)]
        seqs = sorted({r["max_num_seqs"] for r in grid})
        tokens = sorted({r["max_num_batched_tokens"] for r in grid}, reverse=True)
        # other starts: the precisions and TPs the recorded candidates served beside the plan's
        served = {(r.get("precision"), r.get("tensor_parallel")) for r in rec["table"]} - {
            (base.precision, base.tensor_parallel), (None, None)}
        starts = []
        if served:
            bases, _ = search_bases(planned_serving(cf, spec), spec, cf.nodes(), cf.stack(),
                                    rec["node_type"], max_tensor_parallel=1)
            starts = [b for b in bases if (b.precision, b.tensor_parallel) in served]
        cands, _, basis = candidates(cf.stack().templates[base.engine], base, seqs, tokens,
                                     slo.target_concurrency, len(rec["table"]), starts=starts)
        return base, cands, basis

    def replayed_search(self, tmp_path: Path, judged: dict[str, list[RateVerdict]]
                        ) -> SearchResult:
        """`config_search.search` over the recorded runs (`judged`), today's rule deciding. A
        candidate the device stopped early has the runs it had."""
        rec = self.recorded()
        _, rate = self.settings()
        _, cands, basis = self.candidates(tmp_path)

        def measure(c, bar):
            return Measured(combine(judged[c.config.hash], rate.confidence))

        ticks = iter(range(10_000))
        return search(rec["node_type"], cands, measure, rec["budget_s"], 1.0, basis,
                      clock=lambda: float(next(ticks)), min_margin=rec["min_margin"])
