"""The SGLang payload for the H200 (bench/sglang-wheels.txt) against what its
wheels require (their Requires-Dist, read from PyPI and kept in tests/data/gpu/sglang/) and what
the H200 run recorded of the machine (tests/data/gpu/h200-client-accounting/prepare.json), and the SGLang
rendering of the h200 plan that bench/gpu_serving.py starts there."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from assets.deploy import build_plan
from bench.gpu_recordings import folder
from onboarding.deploy.engine_choice import config_for_engine, engine_images
from onboarding.deploy.serving_plan import serving_plan
from resources.config_files import ConfigFiles

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / "bench" / "sglang-wheels.txt"
REQUIRES = ROOT / "tests" / "data" / "gpu" / "sglang"
PREPARE = folder("client_accounting") / "prepare.json"
LINUX = {"sys_platform": "linux", "platform_machine": "x86_64", "python_version": "3.12",
         "python_full_version": "3.12.3", "platform_system": "Linux", "os_name": "posix",
         "implementation_name": "cpython", "platform_python_implementation": "CPython",
         "extra": ""}


def pins() -> dict[str, str]:
    """bench/sglang-wheels.txt as {canonical name: version}."""
    out = {}
    for line in WHEELS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{line!r}: every wheel is pinned exactly"
            out[canonicalize_name(name)] = version
    return out


def requires(name: str) -> list[Requirement]:
    """A recorded wheel's Requires-Dist (extras left out), those that apply on the H200."""
    reqs = [Requirement(x) for x in (REQUIRES / f"{name}.requires.txt").read_text().splitlines()
            if x and not x.startswith("#")]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(LINUX)]


def device_torch() -> str:
    return json.loads(PREPARE.read_text())["steps"]["versions"]["torch"].split("+")[0]


def test_the_carried_sglang_pins_the_torch_the_h200_run_recorded():
    sglang = pins()["sglang"]
    torch = [r for r in requires(f"sglang-{sglang}") if r.name == "torch"]
    assert [str(r.specifier) for r in torch] == [f"=={device_torch()}"]


@pytest.mark.parametrize("newer", ["0.5.18", "0.5.23"])
def test_the_releases_after_it_pin_another_torch(newer):
    """The next release and the newest read both move torch: 0.5.17 is the newest that runs
    on the device's torch without replacing it (docs/gpu.md, the versions walked)."""
    (torch,) = [r for r in requires(f"sglang-{newer}") if r.name == "torch"]
    assert not torch.specifier.contains(device_torch())


def test_every_exact_pin_sglang_states_is_carried_at_that_version():
    carried = pins()
    for r in requires(f"sglang-{carried['sglang']}"):
        name = canonicalize_name(r.name)
        if name in carried:
            assert r.specifier.contains(carried[name], prereleases=True), (
                f"sglang {carried['sglang']} requires {r}, the payload carries "
                f"{name}=={carried[name]}")


def test_the_carried_tokenizers_is_one_transformers_accepts_at_import():
    """transformers checks tokenizers' version when it is imported; 5.12.1 refuses the
    device's 0.23.2 (the H200 image's pip list, KINDS.md), so the payload carries its own."""
    carried = pins()
    (tok,) = [r for r in requires(f"transformers-{carried['transformers']}")
              if r.name == "tokenizers"]
    assert tok.specifier.contains(carried["tokenizers"])
    assert not tok.specifier.contains("0.23.2")


@pytest.fixture(scope="module")
def twin_h200():
    cf = ConfigFiles()
    spec = cf.spec("llama-3-1-8b-instruct-twin")
    nodes, stack = cf.nodes(), cf.stack()
    templates = cf.stack().templates
    splan = serving_plan(spec, build_plan(spec, nodes, None, None), nodes, stack)
    return cf, spec, templates, splan.config("h200")


def other_engine(cf, base) -> str:
    others = sorted(e for e in cf.stack().templates if e != base.engine)
    assert others, "stack.yaml has a second engine template"
    return others[0]


def test_another_engine_renders_the_plans_numbers_through_its_own_flags(twin_h200):
    cf, spec, templates, base = twin_h200
    engine = other_engine(cf, base)
    template = templates[engine]
    image = engine_images(cf.stack_config(), engine, "0.5.17")[base.hardware]
    other = config_for_engine(base, spec, template, engine, "0.5.17", image)
    assert (other.engine, other.engine_version, other.image) == (engine, "0.5.17", image)
    assert (other.node_type, other.precision, other.tensor_parallel) == \
        (base.node_type, base.precision, base.tensor_parallel)
    for key in ("max_model_len", "max_num_seqs", "gpu_memory_utilization", "load_format"):
        assert other.params[key] == base.params[key]
        flag = template.args[key].flag
        assert f"{flag}={base.params[key]}" in other.param_args
    for key, value in template.hardware["gpu"].defaults.items():
        assert other.params[key] == value
    assert other.hash != base.hash


def test_another_engine_without_kernels_for_the_precision_is_refused(twin_h200):
    cf, spec, templates, base = twin_h200
    engine = other_engine(cf, base)
    missing = [p for p in ("nvfp4", "fp8", "bf16")
               if p not in templates[engine].serves.get(base.hardware, [])]
    if not missing:
        pytest.skip(f"{engine} serves every precision on {base.hardware}")
    with pytest.raises(ValueError, match=f"not {missing[0]}"):
        config_for_engine(dataclasses.replace(base, precision=missing[0]), spec,
                          templates[engine], engine, "0.5.17", "img")


def test_a_fully_cold_sglang_start_also_empties_its_jit_kernel_cache():
    """SGLang 0.5.17 compiles its small CUDA kernels on first use through apache-tvm-ffi, cached
    under TVM_FFI_CACHE_DIR (default ~/.cache/tvm-ffi: tvm_ffi/cpp/extension.py of the carried
    0.1.11). load_timing's fully cold start points the template's `cache_env` at an empty
    directory; without this one the JIT cache stays warm and the start is not fully cold."""
    template = ConfigFiles().stack().templates["sglang"]
    assert {"TVM_FFI_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"} <= set(
        template.cache_env)
    assert len(set(template.cache_env.values())) == len(template.cache_env)  # one dir each


def test_expert_parallel_on_sglang_is_its_ep_size_at_the_tensor_parallel_size():
    """SGLang removed `--enable-ep-moe`: "Please set `--ep-size` to the same value as
    `--tp-size` instead" (SGLang docs/advanced_features/server_arguments.md, quoted in
    SemiAnalysisAI/InferenceX PR 242; sgl-project/SpecForge PR 246). 0.5.17's ServerArgs has
    `ep_size` and no `enable_ep_moe`. A MoE model planned with expert parallelism at TP > 1
    renders `--ep-size=<TP>` through the SGLang template."""
    cf = ConfigFiles()
    spec = cf.spec("qwen3-235b-a22b-instruct")
    nodes, stack = cf.nodes(), cf.stack()
    base = serving_plan(spec, build_plan(spec, nodes, None, None), nodes, stack).config("h200")
    assert base.tensor_parallel > 1 and base.params.get("enable_expert_parallel") is True
    image = engine_images(cf.stack_config(), "sglang", "0.5.17")[base.hardware]
    sgl = config_for_engine(base, spec, stack.templates["sglang"], "sglang", "0.5.17", image)
    assert f"--ep-size={base.tensor_parallel}" in sgl.param_args
    assert f"--tp-size={base.tensor_parallel}" in sgl.param_args
    assert "--enable-ep-moe" not in sgl.param_args
