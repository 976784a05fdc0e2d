"""Model Optimizer on CPU with a tiny random Llama: quantize, export, and the export check.

The CPU path is the one CI can run: modelopt calibrates and exports, and the pure-torch NVFP4
backend stands in for the CUDA-only fake-quant kernel.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from onboarding.common.paths import PROJECT_ROOT
from onboarding.quantize.variants import QuantizationError, variant_dir
from resources.config_files import ConfigFiles
from resources.quantizer import CPU_NVFP4_BACKEND, ModelOptQuantizer, attach_cpu_backend
from tests.engine_python import ENGINE_PY, engine_python
from tests.quantize_support import build_tiny_causal_lm, save_byte_tokenizer

# real Model Optimizer quantization and exports, seconds a test (the quick lane leaves them out)
pytestmark = pytest.mark.slow

def small_config(tmp_path: Path, **calibration) -> ConfigFiles:
    """A config dir whose quantization.yaml has a short calibration and held-out set."""
    cfg = yaml.safe_load((PROJECT_ROOT / "configs" / "quantization.yaml").read_text())
    cfg["calibration"].update({"samples": 4, "seq_len": 64, "batch_size": 2, **calibration})
    cfg["export_check"].update({"samples": 2, "seq_len": 64})
    root = PROJECT_ROOT / "configs"
    for section in ("calibration", "export_check"):
        cfg[section]["dataset"] = str(root / cfg[section]["dataset"])
    p = tmp_path / "quantization.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return ConfigFiles(config_dir=str(tmp_path))


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return build_tiny_causal_lm(tmp_path_factory.mktemp("tinylm") / "m" / "rev1")


@pytest.fixture(scope="module")
def quantizer(tmp_path_factory) -> ModelOptQuantizer:
    return ModelOptQuantizer(device="cpu",
                             configs=small_config(tmp_path_factory.mktemp("qcfg")))


@pytest.fixture(scope="module")
def nvfp4(tiny_lm, quantizer):
    return quantizer.quantize("tiny", tiny_lm, "nvfp4", variant_dir(tiny_lm, "nvfp4"), "rev1")


def test_nvfp4_export_is_packed_valid_and_smaller(nvfp4, tiny_lm):
    assert nvfp4.export_valid and nvfp4.error is None, nvfp4.error
    out = Path(nvfp4.path)
    qcfg = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert qcfg["quant_algo"] == "NVFP4" and qcfg["group_size"] == 16
    tensors = load_file(str(out / "model.safetensors"))
    w = tensors["model.layers.0.mlp.down_proj.weight"]
    assert w.dtype == torch.uint8 and w.shape == (64, 64)  # 128 inputs packed two per byte
    assert tensors["model.layers.0.mlp.down_proj.weight_scale"].dtype == torch.float8_e4m3fn
    assert (out / "tokenizer.json").is_file() and (out / "onboarding-manifest.json").is_file()
    assert Path(nvfp4.state_path).is_file()
    s = nvfp4.stats
    assert s["weight_bytes"] < s["baseline_weight_bytes"] and s["compression_ratio"] > 1
    assert s["cpu_nvfp4_backend_quantizers"] > 0
    assert s["check_weights_only_ppl_rel_diff"] <= 0.03
    assert not list(out.parent.glob(".staging-*"))


def test_fp8_export_holds_fp8_weights(tiny_lm, quantizer):
    lines: list[str] = []
    v = quantizer.quantize("tiny", tiny_lm, "fp8", variant_dir(tiny_lm, "fp8"), "rev1",
                           log=lines.append)
    assert v.export_valid, v.error
    # its phases, in order, for the event log (each is seconds to minutes on a real model)
    phases = ["fp8: baseline", "fp8: calibration batch 2/2", "fp8: calibrated in",
              "fp8: exported in", "fp8: export check passed"]
    at = [next(i for i, ln in enumerate(lines) if ln.startswith(p)) for p in phases]
    assert at == sorted(at), lines
    tensors = load_file(str(Path(v.path) / "model.safetensors"))
    assert tensors["model.layers.1.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn


def test_restored_model_is_the_calibrated_one(nvfp4, tiny_lm, quantizer):
    model, tok = quantizer.load_for_eval(tiny_lm, nvfp4)
    ids = tok("The engineer tests the pump", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        quant = model(ids).logits
    backends = {m.backend for n, m in model.named_modules() if n.endswith("input_quantizer")
                and m.is_enabled}
    assert backends == {CPU_NVFP4_BACKEND}
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.bfloat16)
    with torch.no_grad():
        assert not torch.equal(base(ids).logits, quant)


def test_the_baselines_held_out_perplexity_is_measured_once_per_checkpoint(
        nvfp4, tiny_lm, tmp_path, monkeypatch):
    """Every precision's export check reports the bf16 baseline's perplexity on the same held-out
    text: the second check reuses it instead of loading and running the baseline again; a
    checkpoint rewritten in place (new mtime) is measured again."""
    (tmp_path / "cfg").mkdir()
    counting = ModelOptQuantizer(device="cpu", configs=small_config(tmp_path / "cfg"))
    loads: list[Path] = []
    real = ModelOptQuantizer._load_baseline

    def counted(self, checkpoint_dir):
        loads.append(checkpoint_dir)
        return real(self, checkpoint_dir)

    monkeypatch.setattr(ModelOptQuantizer, "_load_baseline", counted)
    dst, state = _copy_variant(nvfp4, tmp_path)
    checkpoint = shutil.copytree(tiny_lm, tmp_path / "checkpoint")  # rewritten below
    first = counting.verify_export(checkpoint, dst, state)
    assert len(loads) == 2  # the restore and the baseline (a new checkpoint path: not cached)
    second = counting.verify_export(checkpoint, dst, state)
    assert second.ppl_baseline == first.ppl_baseline
    assert len(loads) == 3  # the restore only
    weights = checkpoint / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    third = counting.verify_export(checkpoint, dst, state)
    assert len(loads) == 5  # the restore and the baseline, measured again
    assert third.ppl_baseline == pytest.approx(first.ppl_baseline)


def _copy_variant(v, tmp_path) -> tuple[Path, Path]:
    dst = tmp_path / "copy" / "nvfp4"
    shutil.copytree(v.path, dst)
    state = dst.parent / "nvfp4.modelopt.pt"
    shutil.copy(v.state_path, state)
    return dst, state


def test_export_check_fails_on_corrupted_weights(nvfp4, tiny_lm, quantizer, tmp_path):
    dst, state = _copy_variant(nvfp4, tmp_path)
    f = dst / "model.safetensors"
    tensors = load_file(str(f))
    for name, t in tensors.items():  # scramble every packed FP4 weight's nibbles
        if t.dtype == torch.uint8:
            tensors[name] = t ^ 0x5A
    save_file(tensors, str(f), metadata={"format": "pt"})
    check = quantizer.verify_export(tiny_lm, dst, state)
    assert not check.passed
    assert "weights only" in check.problem
    assert check.weights_only.ppl_rel_diff > 0.03


def test_export_check_fails_on_a_wrong_activation_scale(nvfp4, tiny_lm, quantizer, tmp_path):
    dst, state = _copy_variant(nvfp4, tmp_path)
    f = dst / "model.safetensors"
    tensors = load_file(str(f))
    tensors["model.layers.0.self_attn.o_proj.input_scale"] *= 4
    save_file(tensors, str(f), metadata={"format": "pt"})
    check = quantizer.verify_export(tiny_lm, dst, state)
    assert not check.passed
    assert "model.layers.0.self_attn.o_proj.input_scale" in check.problem


def test_export_missing_a_tensor_is_named(nvfp4, tiny_lm, quantizer, tmp_path):
    dst, state = _copy_variant(nvfp4, tmp_path)
    f = dst / "model.safetensors"
    tensors = load_file(str(f))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(f), metadata={"format": "pt"})
    check = quantizer.verify_export(tiny_lm, dst, state)
    assert not check.passed
    assert "model.layers.1.mlp.up_proj.weight" in check.problem
    assert "missing" in check.problem


def test_architecture_modelopt_cannot_quantize_raises_a_quantization_error(tmp_path, quantizer):
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    model = BloomForCausalLM(BloomConfig(n_layer=1, hidden_size=64, n_head=4, vocab_size=257))
    ckpt = tmp_path / "bloom" / "r"
    model.to(torch.bfloat16).save_pretrained(ckpt)
    save_byte_tokenizer(ckpt)
    with pytest.raises(QuantizationError) as err:
        quantizer.quantize("bloom", ckpt, "nvfp4", variant_dir(ckpt, "nvfp4"), "r")
    assert "BloomForCausalLM" in str(err.value)
    assert "precision_ladder" in err.value.fix
    assert not variant_dir(ckpt, "nvfp4").exists()


def test_too_short_calibration_set_fails_before_quantizing(tmp_path, tiny_lm):
    short = tmp_path / "short.jsonl"
    short.write_text('{"text": "only a few words"}\n')
    q = ModelOptQuantizer(device="cpu",
                          configs=small_config(tmp_path, dataset=str(short)))
    with pytest.raises(QuantizationError, match="1 are configured|4 are configured"):
        q.quantize("tiny", tiny_lm, "nvfp4", tmp_path / "out", "rev1")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    q = ModelOptQuantizer(device="cpu",
                          configs=small_config(tmp_path, dataset=str(empty)))
    with pytest.raises(QuantizationError, match="is empty"):
        q.quantize("tiny", tiny_lm, "nvfp4", tmp_path / "out", "rev1")


def test_backend_is_attached_only_to_nvfp4_quantizers(tiny_lm):
    import copy

    import modelopt.torch.quantization as mtq
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.bfloat16)
    ids = torch.randint(0, 256, (1, 32))
    fp8 = mtq.quantize(model, copy.deepcopy(mtq.FP8_DEFAULT_CFG), lambda m: m(ids))
    assert attach_cpu_backend(fp8) == 0


TWIN_ID = "llama-3-1-8b-instruct-twin"


@pytest.fixture(scope="module")
def twin_variants(tmp_path_factory, quantizer) -> dict:
    from onboarding.fetch.twins import twin_source_dir

    ckpt = twin_source_dir(TWIN_ID, tmp_path_factory.mktemp("twin") / "twin" / "rev1")
    return {p: quantizer.twin_variant("twin", ckpt, p, variant_dir(ckpt, p), "rev1")
            for p in ("nvfp4", "fp8")}


def test_a_twins_variant_is_model_optimizers_marker_without_weights(twin_variants):
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format

    for v in twin_variants.values():
        assert v.usable and v.state_path is None and v.stats["weight_bytes"] == 0, v.error
        out = Path(v.path)
        assert not list(out.glob("*.safetensors")) and (out / "tokenizer.json").is_file()
        hf = json.loads((out / "hf_quant_config.json").read_text())
        assert hf["producer"] == {"name": "modelopt", "version": "0.47.0"}
        config = json.loads((out / "config.json").read_text())
        assert config["quantization_config"] == convert_hf_quant_config_format(hf)
        assert config["num_hidden_layers"] == 32 and config["quantization_config"][
            "quant_method"] == "modelopt" and config["quantization_config"]["ignore"] == [
            "lm_head"]
    assert twin_variants["nvfp4"].stats["quant_algo"] == "NVFP4"
    assert json.loads((Path(twin_variants["fp8"].path) / "hf_quant_config.json").read_text())[
        "quantization"]["kv_cache_quant_algo"] == "FP8"  # as FP8_KV_CFG makes the real export


@pytest.mark.slow
@pytest.mark.skipif(not ENGINE_PY.is_file(), reason=f"needs the engine venv "
                    f"({ENGINE_PY}, scripts/setup.sh)")
def test_vllm_reads_a_twins_marker_as_model_optimizers_export(twin_variants):
    """The engine's own config classes: what makes `--load-format dummy` start FP8 and NVFP4
    kernels (vLLM 0.32 CPU build here; the H200 run uses 0.22)."""
    code = ("import json\n"
            "from vllm.model_executor.layers.quantization.modelopt import (\n"
            "    ModelOptFp8Config, ModelOptNvFp4Config)\n"
            "for path in argv:\n"
            "    qc = json.load(open(path))['quantization_config']\n"
            "    for cls in (ModelOptFp8Config, ModelOptNvFp4Config):\n"
            "        name = cls.override_quantization_method(qc, None)\n"
            "        if name:\n"
            "            c = cls.from_config(qc)\n"
            "            print(json.dumps([name, c.exclude_modules,\n"
            "                              getattr(c, 'group_size', None)]))\n")
    paths = [str(Path(twin_variants[p].path) / "config.json") for p in ("fp8", "nvfp4")]
    out = engine_python().run(code, *paths)  # the session's one engine Python
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("[")]
    assert lines == [["modelopt", ["lm_head"], None], ["modelopt_fp4", ["lm_head"], 16]]


def test_a_twin_with_a_partial_preset_is_refused_naming_the_config(tmp_path, twin_variants):
    cfg = yaml.safe_load((PROJECT_ROOT / "configs" / "quantization.yaml").read_text())
    cfg["models"] = {"twin": {"nvfp4": {"preset": "NVFP4_MLP_ONLY_CFG"}}}
    (tmp_path / "quantization.yaml").write_text(yaml.safe_dump(cfg))
    q = ModelOptQuantizer(device="cpu", configs=ConfigFiles(config_dir=str(tmp_path)))
    ckpt = Path(twin_variants["fp8"].path).parents[1] / "rev1"
    with pytest.raises(QuantizationError, match=r"twin twin at nvfp4.*NVFP4_MLP_ONLY_CFG"):
        q.twin_variant("twin", ckpt, "nvfp4", tmp_path / "out", "rev1")


def test_the_cpu_nvfp4_backend_reproduces_model_optimizers_nvfp4_round_trip_bit_for_bit():
    """The CPU backend rounds to the E2M1 grid directly instead of packing and unpacking codes
    through `NVFP4QTensor` (3-4x faster); its output must be Model Optimizer's, bit
    for bit: random activations at many scales, in bf16 and fp32, with the calibrated amax,
    below it (values past 6 saturate) and none (dynamic); whole blocks of zeros and negative
    values that round to zero (+0 in the code table); inputs built to land exactly on every
    E2M1 tie after scaling; scales clamped at 2**-9; and a last dimension that is not a whole
    number of blocks (padded by `NVFP4QTensor`)."""
    from types import SimpleNamespace

    from resources.quantizer import _cpu_nvfp4_fake_quant

    gen = torch.Generator().manual_seed(0)
    cases = []
    for i, shape in enumerate([(4, 7, 64), (3, 96), (2, 5, 48), (1, 1, 16), (2, 40)]):
        for spread in (1e-6, 0.02, 1.0, 37.0, 3e4):
            cases.append(torch.randn(shape, generator=gen) * spread)
        zeros = torch.randn(shape, generator=gen)
        zeros[..., :16] = 0.0
        zeros[..., 16:32] *= 1e-12
        cases.append(zeros)
        # multiples of 0.25 x a power of two: with the block's scale a power of two as well
        # (amax 6 x 2**k per block), these are the E2M1 grid's values and its midpoints
        ties = torch.randint(-24, 25, shape, generator=gen).float() * 0.25 * 2.0 ** (i - 2)
        cases.append(ties)
    for x in cases:
        for dtype in (torch.bfloat16, torch.float32):
            x = x.to(dtype)
            for amax in (x.abs().amax().float(), x.abs().amax().float() * 0.6, None):
                block = {-1: 16}
                q = SimpleNamespace(amax=amax, block_sizes=block)
                got = _cpu_nvfp4_fake_quant(x, q)
                want = _nvfp4_round_trip(x, x.detach().abs().amax() if amax is None else amax,
                                         16)
                bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
                assert got.dtype == dtype and got.shape == x.shape
                assert torch.equal(got.view(bits), want.view(bits)), (x.shape, dtype, amax)


def _nvfp4_round_trip(inputs, amax, block: int):
    """Model Optimizer's own NVFP4 quantize and dequantize of `inputs`: the reference the CPU
    backend is held to. (`dequantize` cannot crop what `quantize` padded, so a last
    dimension that is not whole blocks is padded with zeros here and cropped after.)"""
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    if pad := -inputs.shape[-1] % block:
        padded = torch.nn.functional.pad(inputs, (0, pad))
        return _nvfp4_round_trip(padded, amax, block)[..., :inputs.shape[-1]]
    global_scale = amax.float().amax() / (6.0 * 448.0)
    q, scale, global_scale = NVFP4QTensor.quantize(inputs.float(), block,
                                                   weights_scaling_factor_2=global_scale)
    out = q.dequantize(dtype=torch.float32, scale=scale, double_scale=global_scale,
                       block_sizes={-1: block})
    return out.reshape(inputs.shape).to(inputs.dtype)
