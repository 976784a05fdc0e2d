"""A performance twin's quantized variant as the quantize stage writes it, for a GPU machine
without Model Optimizer: the twin's config.json and tokenizer with Model Optimizer's export
marker for the precision's configured preset (configs/quantization.yaml), no weights: the
quantize stage's own `ModelOptQuantizer.twin_variant`, which also reads the marker back. For
bf16, the source precision, the twin's checkpoint as fetched (config.json and tokenizer).

    .venv/bin/python bench/twin_variant.py llama-3-1-8b-instruct-twin fp8 OUT_DIR
writes OUT_DIR/<twin>-<precision>/.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onboarding.fetch.twins import twin_source_dir
from resources.quantizer import ModelOptQuantizer


def main(twin: str, precision: str, out: Path) -> int:
    if precision == "bf16":  # the source precision: the pipeline serves the checkpoint itself
        twin_source_dir(twin, out / f"{twin}-{precision}")
        print(out / f"{twin}-{precision}", sorted(p.name for p in (out / f"{twin}-{precision}").iterdir()))
        return 0
    ckpt = Path(tempfile.mkdtemp()) / twin
    twin_source_dir(twin, ckpt)
    v = ModelOptQuantizer(device="cpu").twin_variant(twin, ckpt, precision,
                                                    out / f"{twin}-{precision}", "twin")
    if not v.export_valid:
        print(v.error, file=sys.stderr)
        return 1
    print(v.path, sorted(p.name for p in Path(v.path).iterdir()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
