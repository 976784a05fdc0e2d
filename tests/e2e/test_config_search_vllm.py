"""The configuration search on the real engine: PyPI's vLLM CPU build serving SmolLM2-135M.

Three candidates (the local configuration with one sequence at a time, max-num-seqs 4, and
max-num-seqs 4 behind two API server processes: the frontend axis), each started, judged at a
Poisson rate by the rate verdict (p90 here, the `cpu` node type's percentile); the winner is a
met candidate and the plan the search returns carries it for the node type, one hash. Skipped, with the reason, when the engine venv or the model has
not been built.
"""

import os
import shutil
from pathlib import Path

import pytest

from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import VariantRef
from onboarding.deploy.serving_plan import ServingPlan, config_at_hand, with_searched
from onboarding.fetch.catalog import ModelSpec
from onboarding.serving.config_search import candidates
from onboarding.serving.rate_verdict import MET, RateSlo
from onboarding.serving.searched import SearchRecord, dump_records, load_records
from onboarding.serving.stats import Slo
from resources.engine import Engine
from resources.loadgen import LoadGenerator
from resources.search_runner import Traffic, run_search

pytestmark = [pytest.mark.slow, pytest.mark.engine]

SMOL = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"
VLLM = PROJECT_ROOT / ".venv-engine" / "bin" / "vllm"

if not VLLM.is_file() or not (SMOL / "model.safetensors").is_file():
    pytest.skip(f"needs the engine venv ({VLLM}, scripts/setup.sh) and the model ({SMOL}, "
                "scripts/build_smollm2.py)", allow_module_level=True)


@pytest.fixture
def model_dir(tmp_path) -> Path:
    d = tmp_path / "smollm2"
    shutil.copytree(SMOL, d)
    os.sync()
    return d


def test_a_small_search_on_the_real_engine_picks_a_met_candidate(tmp_path, model_dir):
    from transformers import AutoTokenizer

    size = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    variant = VariantRef(model="smollm2-135m", precision="bf16", path=str(model_dir),
                         total_bytes=size, content_hash="e2e")
    spec = ModelSpec(id="smollm2-135m", source="s3://models/smollm2-135m-instruct/",
                     served_name="smol", engine_args={"max_model_len": 1024, "max_num_seqs": 1})
    engine = Engine(hardware="cpu", log_dir=str(tmp_path / "logs"), start_timeout_s=300)
    base = engine.local_config(spec, "bf16")
    cands, left_out, basis = candidates(engine.template(), base, [4], [1024],
                                        target_concurrency=4, max_candidates=3,
                                        api_server_count=[1, 2])
    assert [c.config.max_num_seqs for c in cands] == [1, 4, 4] and not left_out
    assert [c.config.param("api_server_count") for c in cands] == [None, None, 2]
    # bounds a shared two-core machine meets at one request a second with these shapes; the
    # p95 needs about 77 requests to be shown met at alpha 0.1 over 5 looks
    slo = Slo(ttft_p95_s=5.0, itl_mean_ms=1000, error_rate_max=0.0, target_concurrency=4)
    rate = RateSlo(target_rate_rps=1.0, ttft_p_s=5.0, tpot_p_ms=1000, percentile=90,
                   confidence=0.9, min_requests=20, max_seconds=150, look_every=40, repeats=1)
    result = run_search(engine, LoadGenerator(), variant, cands, basis, slo, rate,
                        Traffic(input_tokens=16, output_tokens=4),
                        AutoTokenizer.from_pretrained(model_dir, local_files_only=True),
                        budget_s=20 * 60, start_s=60, log=lambda s: print(s, flush=True))
    table = result.table()
    for row in table:
        print(row)
    print(result.margin)
    assert result.measured == 3 and result.crashed == 0
    chosen = [row for row in table if row["chosen"]]
    assert len(chosen) == 1 and chosen[0]["verdict"] == MET and chosen[0]["n"] >= 20
    winner = result.winner
    assert winner.hash == chosen[0]["hash"] and winner.hash in {c.config.hash for c in cands}
    assert f"--max-num-seqs={winner.max_num_seqs}" in winner.args("/m", 1)
    assert all(row["goodput_rps"] > 0 and row["good"] <= row["n"] for row in table)
    assert all(row["n"] > 0 for row in table)
    # recorded and applied: the engine at hand starts the winner, one hash (the manifest of a
    # planned node type renders it the same way: tests/onboarding/test_searched.py)
    path = tmp_path / "searched_configs.json"
    path.write_text(dump_records([SearchRecord.of(spec.id, result)]))
    splan = with_searched(ServingPlan(plan=None, configs={}), spec, {"vllm": engine.template()},
                          load_records(path))
    local = engine.local("bf16")
    assert config_at_hand(splan, spec, engine.template(), local).hash == winner.hash
