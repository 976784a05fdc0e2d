"""Synthetic prompts are token-exact with the model's own tokenizer."""

import pytest

from onboarding.common.paths import PROJECT_ROOT
from onboarding.serving.prompts import synthetic_prompts

SMOL = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def tokenizer():
    if not (SMOL / "tokenizer.json").is_file():
        pytest.skip(f"{SMOL} not built (scripts/build_smollm2.py builds it offline)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOL, local_files_only=True)


@pytest.mark.parametrize("n_tokens,prefix", [(128, 0), (512, 256), (37, 5)])
def test_prompts_have_exactly_the_requested_tokens(tokenizer, n_tokens, prefix):
    prompts = synthetic_prompts(tokenizer, 6, n_tokens, prefix, seed=1)
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    assert all(len(i) == n_tokens for i in ids)
    assert len({tuple(i) for i in ids}) == 6  # distinct requests
    assert all(i[:prefix] == ids[0][:prefix] for i in ids)  # shared prefix
    if prefix:
        assert len({tuple(i[prefix:prefix + 8]) for i in ids}) > 1
