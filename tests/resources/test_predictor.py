"""The AIConfigurator predictor against the installed library, offline, with the catalog's models.

Needs the `predict` extra (scripts/dev.sh installs it); without it these tests skip and say so,
and tests/onboarding/test_predict.py still replays the library's recorded answers.
"""

from __future__ import annotations

import json
from importlib import util
from pathlib import Path

import pytest
import yaml

from onboarding.common.errors import OnboardingError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.fetch.catalog import ModelSpec
from onboarding.predictions.predict import config_from_hint, load_predict_config, make_request
from resources import predictor as predictor_module
from resources.predictor import AIConfiguratorPredictor, library_version

pytestmark = pytest.mark.skipif(
    library_version() is None,
    reason="AIConfigurator is not installed: `.venv/bin/pip install -e '.[predict]'`")

CONFIGS = PROJECT_ROOT / "configs"
CFG = load_predict_config(CONFIGS / "predict.yaml")
# SmolLM2-135M-Instruct's config.json as scripts/build_smollm2.py writes it (3 KV heads of 64)
SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
           "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
           "head_dim": 64, "vocab_size": 49152, "max_position_embeddings": 8192,
           "tie_word_embeddings": True, "rms_norm_eps": 1e-5, "model_type": "llama"}


def spec(model_id: str) -> ModelSpec:
    return ModelSpec.model_validate(yaml.safe_load((CONFIGS / "models" /
                                                    f"{model_id}.yaml").read_text()))


@pytest.fixture(scope="module")
def predictor(tmp_path_factory) -> AIConfiguratorPredictor:
    return AIConfiguratorPredictor(work_dir=str(tmp_path_factory.mktemp("aic")))


def ask(predictor, model_id, node_type, precision, tp, batch=32, config=None):
    """The catalog entry's hint (or `config`) with the entry's expert parallelism."""
    s = spec(model_id) if (CONFIGS / "models" / f"{model_id}.yaml").is_file() else None
    cfg = config or config_from_hint(s.architecture)
    ep = bool(s and s.engine_args.get("enable_expert_parallel"))
    return predictor.predict(make_request(CFG, model_id, cfg, node_type, precision, tp, batch,
                                          expert_parallel=ep))


def packaged_config(name: str) -> dict:
    """A config.json the library itself ships (its model_configs/), read offline."""
    root = Path(util.find_spec("aiconfigurator_core").origin).parent / "model_configs"
    return json.loads((root / f"{name}_config.json").read_text())


@pytest.mark.slow
def test_catalog_70b_on_b300_nvfp4_is_covered_and_faster_than_bf16(predictor):
    nvfp4 = ask(predictor, "llama-3-1-70b-instruct", "b300", "nvfp4", 4)
    bf16 = ask(predictor, "llama-3-1-70b-instruct", "b300", "bf16", 4)
    assert nvfp4.status == "covered", nvfp4.notes
    assert nvfp4.data_set.startswith("b300_sxm/vllm/") and nvfp4.aic_version == "0.12.0"
    assert nvfp4.executed_modes["gemm"] == "nvfp4"
    assert 1 < nvfp4.tpot_ms < bf16.tpot_ms < 100  # FP4 GEMMs beat bf16 ones in decode
    assert nvfp4.tokens_per_s_per_gpu > bf16.tokens_per_s_per_gpu > 0
    assert nvfp4.silicon_share > 0.5  # most of the step time comes from measured tables


@pytest.mark.slow
def test_catalog_moe_with_expert_parallel_is_covered(predictor):
    p = ask(predictor, "qwen3-235b-a22b-instruct", "b300", "nvfp4", 8)
    assert p.status == "covered", p.notes
    assert p.request.expert_parallel == 8 and p.executed_modes["moe"] == "nvfp4"


@pytest.mark.parametrize(("model_id", "packaged"), [
    ("llama-3-1-70b-instruct", "meta-llama--Meta-Llama-3.1-70B"),
    ("qwen3-235b-a22b-instruct", "Qwen--Qwen3-235B-A22B"),
])
def test_the_catalog_hint_predicts_as_the_published_config_does(predictor, model_id, packaged):
    """The hint turned into a config is the model as far as the performance model can tell."""
    from_hint = ask(predictor, model_id, "b300", "fp8", 4)
    from_config = ask(predictor, model_id, "b300", "fp8", 4, config=packaged_config(packaged))
    for metric in ("ttft_ms", "tpot_ms", "tokens_per_s_per_gpu"):
        assert getattr(from_hint, metric) == pytest.approx(getattr(from_config, metric),
                                                           rel=1e-6)


@pytest.mark.slow
def test_h200_has_no_nvfp4_gemm_data_and_says_so(predictor):
    p = ask(predictor, "llama-3-1-70b-instruct", "h200", "nvfp4", 8)
    assert p.status == "not_covered" and not p.covered
    assert p.ttft_ms is p.tpot_ms is p.tokens_per_s_per_gpu is None
    assert "nvfp4" in p.notes[0] and "h200_sxm" in p.notes[0]
    assert p.data_set.startswith("h200_sxm/vllm/") and "current" not in p.data_set


@pytest.mark.slow
def test_a_shape_without_measured_attention_is_not_covered(predictor):
    """SmolLM2's 64-wide heads with 3 KV heads have no attention table in the data set."""
    p = ask(predictor, "smollm2-135m", "h200", "bf16", 1, batch=4, config=SMOLLM2)
    assert p.status == "not_covered" and "head_size: 64" in p.notes[0]
    assert "lane_order" not in p.notes[0]  # the lanes it tried are trimmed from the reason


def test_an_architecture_it_does_not_model_is_not_covered(predictor):
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "num_hidden_layers": 2, "hidden_size": 64,
            "num_attention_heads": 2, "vocab_size": 100, "max_position_embeddings": 128}
    p = ask(predictor, "gpt2", "b300", "bf16", 1, config=gpt2)
    assert p.status == "not_covered" and "GPT2LMHeadModel is not supported" in p.notes[0]


def test_a_model_that_does_not_fit_is_oom_not_a_number(predictor):
    p = ask(predictor, "qwen3-235b-a22b-instruct", "b300", "bf16", 1)
    assert p.status == "oom" and p.ttft_ms is None
    assert "qwen3-235b-a22b-instruct" in p.notes[0] and "/tmp" not in p.notes[0]


def test_without_the_library_the_error_says_how_to_install(monkeypatch, predictor):
    monkeypatch.setattr(predictor_module, "library_version", lambda: None)
    with pytest.raises(OnboardingError, match=r"pip install -e '\.\[predict\]'"):
        ask(predictor, "llama-3-1-70b-instruct", "b300", "nvfp4", 4)
