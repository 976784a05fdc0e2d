"""Served accuracy against the real engine: SmolLM2-135M (bf16) scored in process by lm-eval and
through vLLM's CPU build (lm-eval's local-completions on its OpenAI endpoint), in a real Dagster
instance: accuracy -> served_accuracy -> serving_variant.

Slow (94-143 s here): one engine start (25-50 s) and 30 items per task through it. The CPU
build serves bf16 only, so the quantized precisions are recorded as not served and the in-process
gate decides for them; the served gate on FP8/NVFP4 is exercised on the H200
(bench/served_accuracy_gpu.py) and, on recorded results, in tests/resources/.
"""

import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.partitions import cell_key, models_partitions
from assets.quantize import accuracy, serving_variant
from assets.served_accuracy import agreement_check_name, served_accuracy, served_gate_check_name
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.refs import CheckpointRef
from onboarding.quantize.variants import QuantizedSet, QuantizedVariant
from resources.engine import Engine
from resources.evaluator import LmEvalEvaluator
from resources.quantizer import ModelOptQuantizer
from resources.upstream import optional_upstream
from tests.conftest import write_spec
from tests.dagster_support import Runs, metadata, register

pytestmark = [pytest.mark.slow, pytest.mark.engine]

SMOL = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"
VLLM = PROJECT_ROOT / ".venv-engine" / "bin" / "vllm"
KEY = "smollm2-135m"
ITEMS = 30

if not VLLM.is_file() or not (SMOL / "model.safetensors").is_file():
    pytest.skip(f"needs the engine venv ({VLLM}, scripts/setup.sh) and the model ({SMOL}, "
                "scripts/build_smollm2.py)", allow_module_level=True)


def stand_ins(ckpt: Path) -> list[dg.AssetsDefinition]:
    """`checkpoint` and `quantized` as what they store; FP8 was not produced in this test
    (tests/e2e/test_quantize_smollm2.py quantizes; the CPU engine could not serve it anyway)."""
    @dg.asset(name="checkpoint", partitions_def=models_partitions)
    def _checkpoint() -> CheckpointRef:
        return CheckpointRef(model=KEY, source="s3://models/smollm2-135m-instruct/",
                             revision="rev", path=str(ckpt), content_hash="base",
                             total_bytes=sum(p.stat().st_size for p in ckpt.iterdir()))

    @dg.asset(name="quantized", partitions_def=models_partitions)
    def _quantized() -> QuantizedSet:
        return QuantizedSet(KEY, str(ckpt), 1, (QuantizedVariant(
            precision="fp8", path=None, state_path=None, error="not quantized in this test"),))

    return [_checkpoint, _quantized]


def test_smollm2_scored_in_process_and_through_the_cpu_engine(config_dir, configs, tmp_path):
    ckpt = tmp_path / "cache" / KEY / "rev"
    shutil.copytree(SMOL, ckpt)
    write_spec(config_dir, KEY, "s3://models/smollm2-135m-instruct/",
               precision_ladder=["fp8", "bf16"],
               engine_args={"max_model_len": 2048, "max_num_seqs": 64})
    gates = yaml.safe_load((config_dir / "gates.yaml").read_text())
    gates["accuracy"].update({"min_items": ITEMS, "inconclusive": {"max_items": ITEMS}})
    (config_dir / "gates.yaml").write_text(yaml.safe_dump(gates))
    instance = dg.DagsterInstance.ephemeral()
    register(instance, KEY, "cpu")
    assets = [*stand_ins(ckpt), accuracy, served_accuracy, serving_variant]
    resources = {"configs": configs, "optional_upstream": optional_upstream,
                 "quantizer": ModelOptQuantizer(device="cpu", configs=configs),
                 "evaluator": LmEvalEvaluator(limit=ITEMS, batch_size=32, configs=configs),
                 "engine": Engine(configs=configs, log_dir=str(tmp_path / "logs"))}
    # in process (the model's), served on the embedded engine (its cpu cell's), then the
    # variant chosen from both (the model's again, reading the cell's served gates)
    runs = []
    for key, selection in ((KEY, ["checkpoint", "quantized", "accuracy"]),
                           (str(cell_key(KEY, "cpu")), ["served_accuracy"]),
                           (KEY, ["serving_variant"])):
        runs.append(dg.materialize(assets, partition_key=key, selection=selection,
                                   instance=instance, raise_on_error=False,
                                   resources=resources))
        assert runs[-1].success, selection
    result = Runs(runs)
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    in_process = result.output_for_node("accuracy").record("bf16")
    report = result.output_for_node("served_accuracy")
    served = report.record("bf16")
    assert served.source == "served" and served.content_hash == "base"
    for task in ("onb_facts_mc", "onb_arith_gen"):
        s, ip = served.scores[task], in_process.scores[task]
        assert s.n == ip.n == ITEMS and set(s.per_item) == set(ip.per_item) == set(range(ITEMS))
        assert s.size == ip.size > ITEMS
        assert set(s.per_item.values()) <= {0.0, 1.0}
    # the served mode scores real loglikelihoods and greedy answers: far above chance (0.27 on
    # the multiple choice) and, being the same bf16 weights, not apart from the in-process score
    assert served.scores["onb_facts_mc"].value > 0.4
    assert served.scores["onb_arith_gen"].value > 0.1
    bf16 = report.agreement("bf16")
    assert bf16.verdict != "disagree", bf16.reason
    meta = checks[agreement_check_name("bf16")].metadata
    assert checks[agreement_check_name("bf16")].passed
    assert meta["onb_facts_mc_served"].value == served.scores["onb_facts_mc"].value
    assert meta["onb_facts_mc_in_process"].value == in_process.scores["onb_facts_mc"].value
    # FP8: nothing to serve here; the in-process gate (which failed: no variant) decides
    assert report.not_served == {"fp8": "not evaluated in process (not quantized in this test)"}
    assert "not checked" in checks[served_gate_check_name("fp8")].metadata["status"].value
    ref = result.output_for_node("serving_variant")
    assert ref.precision == "bf16"
    assert metadata(result, "serving_variant")["served_on"] == ["cpu"]  # read the cell's report
    assert report.eval_s["bf16"] > 0
