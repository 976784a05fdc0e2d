"""A performance twin's quantized variant as the quantize stage writes it, for a GPU machine
without Model Optimizer: the twin's config.json and tokenizer with Model Optimizer's export
marker for the precision's configured preset (configs/quantization.yaml), no weights.

    .venv/bin/python bench/twin_variant.py llama-3-1-8b-instruct-twin fp8 OUT_DIR
writes OUT_DIR/<twin>-<precision>/.
"""

from __future__ import annotations

import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format

from onboarding.fetch.twins import (
    marker_hf_quant_config,
    twin_source_dir,
    write_twin_variant,
)
from resources.config_files import ConfigFiles


def main(twin: str, precision: str, out: Path) -> int:
    settings = ConfigFiles().quantization().variant_for(twin, precision)
    ckpt = Path(tempfile.mkdtemp()) / twin
    twin_source_dir(twin, ckpt)
    hf = marker_hf_quant_config(precision, settings.preset, settings.kv_cache,
                                list(settings.disable), version("nvidia-modelopt"),
                                f"performance twin {twin} at {precision}")
    dest = out / f"{twin}-{precision}"
    write_twin_variant(ckpt, dest, hf, convert_hf_quant_config_format(hf), "twin")
    print(dest, sorted(p.name for p in dest.iterdir()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
