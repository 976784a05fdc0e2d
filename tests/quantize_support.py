"""A tiny random Llama with a byte-level tokenizer, for the quantize stage's fast tests.

Its own 257-token tokenizer keeps the model at about 0.1 MB and independent of SmolLM2's files;
layer widths are multiples of 16 so NVFP4's 16-wide blocks tile every weight.
"""

from __future__ import annotations

from pathlib import Path

from tests.tiny_models import build_tiny_llama

EOS = "<|endoftext|>"


def save_byte_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab[EOS] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   bos_token=EOS)
    fast.save_pretrained(out)


def build_tiny_causal_lm(out: Path, seed: int = 0) -> Path:
    """Single-shard tiny Llama (hidden 64, 2 layers) plus a byte tokenizer, bf16 safetensors."""
    build_tiny_llama(out, shards=1, hidden=64, layers=2, vocab=257, seed=seed)
    save_byte_tokenizer(out)
    return out
