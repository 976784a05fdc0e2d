"""Small checkpoints built on the spot (random weights), so tests never touch a model hub."""

from __future__ import annotations

import json
from pathlib import Path


def build_tiny_llama(out: Path, shards: int = 2, hidden: int = 64, layers: int = 2,
                     vocab: int = 256, seed: int = 0) -> Path:
    """A random Llama saved as bf16 safetensors, split into `shards` files with an index."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
                      max_position_embeddings=256, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.config.architectures = ["LlamaForCausalLM"]
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    shard_bytes = max(total // shards + 1, 1)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=shard_bytes)
    if shards > 1 and not list(out.glob("*.safetensors.index.json")):
        raise RuntimeError("transformers did not shard the tiny model; lower max_shard_size")
    return out


def shard_names(ckpt: Path) -> list[str]:
    index = next(ckpt.glob("*.safetensors.index.json"))
    return sorted(set(json.loads(index.read_text())["weight_map"].values()))
