"""Token-exact synthetic prompts, built with the served model's own tokenizer.

Prompts are sequences of whole-word tokens (" apple", " river" ...) chosen so that decoding and
re-encoding gives back the same ids: words split on spaces before BPE merges, so a concatenation
of such tokens encodes to exactly those tokens. The server then sees `input_tokens` tokens (plus
the special tokens it adds itself), which is what a 4096-token RAG profile promises.
"""

from __future__ import annotations

import random
import re
from typing import Protocol

from onboarding.common.errors import OnboardingError

_WORD = re.compile(r"^ [a-z]{3,10}$")


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def get_vocab(self) -> dict[str, int]: ...


def word_tokens(tok: Tokenizer, limit: int = 4096) -> list[int]:
    """Ids of whole-word tokens that survive decode -> encode unchanged."""
    out = []
    for _, tid in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]):
        text = tok.decode([tid])
        if _WORD.match(text) and tok.encode(text, add_special_tokens=False) == [tid]:
            out.append(tid)
            if len(out) >= limit:
                break
    if len(out) < 64:
        raise OnboardingError(
            "synthetic prompts", f"the tokenizer has only {len(out)} whole-word tokens that "
            "round-trip (decode then encode) unchanged, too few for varied prompts",
            "Use a tokenizer with a word-level vocabulary (BPE/SentencePiece), or supply a "
            "prompt file.")
    return out


def synthetic_prompts(tok: Tokenizer, n: int, input_tokens: int, prefix_tokens: int = 0,
                      seed: int = 0) -> list[str]:
    """`n` prompts of exactly `input_tokens` tokens; the first `prefix_tokens` shared by all."""
    rng = random.Random(seed)
    words = word_tokens(tok)
    prefix = [rng.choice(words) for _ in range(prefix_tokens)]
    prompts = []
    for _ in range(n):
        ids = prefix + [rng.choice(words) for _ in range(input_tokens - prefix_tokens)]
        text = tok.decode(ids)
        got = len(tok.encode(text, add_special_tokens=False))
        if got != input_tokens:
            raise OnboardingError(
                "synthetic prompts", f"a prompt built from {input_tokens} tokens re-encodes to "
                f"{got} tokens with this tokenizer", "Report it; the word-token filter missed "
                "a merge rule of this tokenizer.")
        prompts.append(text)
    return prompts
