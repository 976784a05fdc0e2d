"""Performance twins: catalog entries whose weights are random (`weights: random`).

A twin is the real model's `config.json` and a tokenizer, no weights. The engine starts it with
random weights (vLLM `--load-format dummy`), so the serving performance of a model whose weights
cannot be had here is measured with the real kernels at the real shape. Its outputs are noise,
so every accuracy gate says "not applicable: random weights" (a WARN that does not pass, never a
silent pass), and it is never published, deployed or ready. What each stage says about a twin,
and the Model Optimizer export marker the quantize stage writes for it, live here
(docs/twins.md).
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from onboarding.common.errors import OnboardingError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.plan import DeploymentPlan
from onboarding.fetch.checkpoint_manifest import MANIFEST_NAME, CheckpointManifest
from onboarding.quantize.variants import (
    AccuracyReport,
    GateOutcome,
    QuantizationError,
    QuantizedSet,
    ServedAccuracyReport,
    write_manifest,
)

# The twins' small data: twins/<id>/config.json, and one tokenizer every twin shares
# (twins/tokenizer/, SmolLM2's: twins/README.md says why).
TWINS_DATA = PROJECT_ROOT / "twins"
TOKENIZER_FILES = ("tokenizer_config.json", "chat_template.jinja")  # + tokenizer.json(.gz)


def twin_source_dir(twin_id: str, dest: Path, data: Path = TWINS_DATA) -> Path:
    """`dest` holding what a twin's source holds: its config.json and the shared tokenizer.
    The demo and the tests upload it; a twin's variants start from it."""
    own = data / twin_id
    if not (own / "config.json").is_file():
        raise OnboardingError(f"performance twin {twin_id}", f"{own}/config.json is missing",
                              "Add the real model's config.json under twins/<id>/.")
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(own.iterdir()):
        if f.is_file():
            shutil.copy2(f, dest / f.name)
    for name in TOKENIZER_FILES:
        shutil.copy2(data / "tokenizer" / name, dest / name)
    (dest / "tokenizer.json").write_bytes(twin_tokenizer_json(data))
    return dest


def twin_tokenizer_json(data: Path = TWINS_DATA) -> bytes:
    """The shared tokenizer.json, stored gzipped (3.5 MB of JSON, 0.8 MB packed)."""
    return gzip.decompress((data / "tokenizer" / "tokenizer.json.gz").read_bytes())

DUMMY_LOAD_FORMAT = "dummy"  # vLLM's and SGLang's --load-format for random weights
NOT_APPLICABLE = "not applicable: random weights"
NOT_APPLICABLE_VERDICT = "not_applicable"  # GateOutcome.verdict of a twin: neither pass nor fail
NO_WEIGHTS = "performance twin: no weights"
NOT_A_WEIGHT_READ = "random weights: not a weight read"
NOT_READY = "performance twin: random weights"
HF_QUANT_CONFIG = "hf_quant_config.json"

# Model Optimizer presets (configs/quantization.yaml) -> the quant_algo its export declares.
# Only whole-model presets: a marker cannot say which layers a partial preset leaves out.
MARKER_ALGOS = {"NVFP4_DEFAULT_CFG": "NVFP4", "FP8_DEFAULT_CFG": "FP8"}
KV_CACHE_ALGOS = {"FP8_KV_CFG": "FP8"}
NVFP4_GROUP_SIZE = 16  # NVFP4's block: one FP8 scale per 16 FP4 values
EXCLUDED_MODULES = ("lm_head",)  # the export keeps the output projection in bf16


def is_weight_file(path: str) -> bool:
    """Weights and their shard index: what a twin leaves at the source."""
    return path.endswith((".safetensors", ".safetensors.index.json"))


def split_weights(paths: Iterable[str]) -> tuple[list[str], list[str]]:
    """(what a twin fetches: config.json, tokenizer, ...; the weight files it leaves out)."""
    paths = list(paths)
    return ([p for p in paths if not is_weight_file(p)], [p for p in paths if is_weight_file(p)])


def marker_hf_quant_config(precision: str, preset: str, kv_cache: str | None,
                           disable: list[str], producer_version: str, where: str) -> dict:
    """`hf_quant_config.json` as Model Optimizer's export writes it for `preset`, with no
    weights behind it: what makes vLLM start this precision's kernels on random weights."""
    algo = MARKER_ALGOS.get(preset)
    kv_algo = KV_CACHE_ALGOS.get(kv_cache) if kv_cache else None
    problem = None
    if algo is None:
        problem = (f"preset {preset} is not one a twin's export marker can declare (known: "
                   f"{', '.join(sorted(MARKER_ALGOS))})")
    elif kv_cache and kv_algo is None:
        problem = (f"KV-cache preset {kv_cache} is not one a twin's export marker can declare "
                   f"(known: {', '.join(sorted(KV_CACHE_ALGOS))})")
    elif disable:
        problem = (f"`disable` {disable} leaves layers unquantized, which the marker cannot "
                   "name without the model's weights")
    if problem:
        raise QuantizationError(where, problem,
                                "Give the twin the default preset of this precision in "
                                "configs/quantization.yaml (`models: {<twin id>: ...}`), or "
                                "leave this precision out of its precision_ladder.")
    quantization: dict[str, Any] = {"quant_algo": algo, "kv_cache_quant_algo": kv_algo}
    if algo == "NVFP4":
        quantization["group_size"] = NVFP4_GROUP_SIZE
    quantization["exclude_modules"] = list(EXCLUDED_MODULES)
    return {"producer": {"name": "modelopt", "version": producer_version},
            "quantization": quantization}


def write_twin_variant(checkpoint_dir: Path, out_dir: Path, hf_quant_config: dict,
                       quantization_config: dict, revision: str) -> CheckpointManifest:
    """A twin's variant: its config.json with `quantization_config`, `hf_quant_config.json`,
    the tokenizer; no weights. Staged, then renamed into place (never half a variant)."""
    staging = out_dir.parent / f".staging-{out_dir.name}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for f in sorted(checkpoint_dir.iterdir()):
        if f.is_file() and f.name not in (MANIFEST_NAME, HF_QUANT_CONFIG, "config.json") \
                and not is_weight_file(f.name):
            shutil.copy2(f, staging / f.name)
    config = json.loads((checkpoint_dir / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (staging / "config.json").write_text(json.dumps(config, indent=4))
    (staging / HF_QUANT_CONFIG).write_text(json.dumps(hf_quant_config, indent=4))
    algo = hf_quant_config["quantization"]["quant_algo"]
    manifest = write_manifest(staging, f"twin-marker:{algo}", revision)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    staging.rename(out_dir)
    return manifest


def marker_problems(variant_dir: Path, quant_algo: str) -> list[str]:
    """What is wrong with a twin's export marker as read back from disk; empty when vLLM will
    find `quant_algo` in both files, the NVFP4 block, lm_head excluded and no weights."""
    problems = []
    try:
        hf = json.loads((variant_dir / HF_QUANT_CONFIG).read_text())["quantization"]
        qc = json.loads((variant_dir / "config.json").read_text())["quantization_config"]
    except (OSError, ValueError, KeyError) as exc:
        return [f"{variant_dir}: the marker cannot be read ({type(exc).__name__}: {exc})"]
    if hf.get("quant_algo") != quant_algo or qc.get("quant_algo") != quant_algo:
        problems.append(f"quant_algo {hf.get('quant_algo')} / {qc.get('quant_algo')} in "
                        f"{HF_QUANT_CONFIG} / config.json, expected {quant_algo}")
    if qc.get("quant_method") != "modelopt":
        problems.append(f"config.json quant_method is {qc.get('quant_method')!r}, not 'modelopt'")
    if quant_algo == "NVFP4":
        groups = [g.get("weights", {}).get("group_size")
                  for g in (qc.get("config_groups") or {}).values()]
        if hf.get("group_size") != NVFP4_GROUP_SIZE or groups != [NVFP4_GROUP_SIZE]:
            problems.append(f"NVFP4 group size {hf.get('group_size')} / {groups}, expected "
                            f"{NVFP4_GROUP_SIZE}")
    if not set(EXCLUDED_MODULES) <= set(qc.get("ignore") or ()):
        problems.append(f"config.json ignore {qc.get('ignore')} does not exclude "
                        f"{', '.join(EXCLUDED_MODULES)}")
    weights = sorted(p.name for p in variant_dir.iterdir() if is_weight_file(p.name))
    if weights:
        problems.append(f"a twin's variant holds weights: {', '.join(weights)}")
    return problems


def twin_precision(model: str, ladder: list[str], plan: DeploymentPlan, node_type: str,
                   can_serve: Callable[[str], tuple[bool, str]]) -> tuple[str, str]:
    """The precision a twin is measured at on the node type at hand, and why: the plan's for a
    planned node type (no accuracy gate to climb), else the first of the ladder the engine at
    hand has kernels for (the CPU build: bf16)."""
    planned = {n.node_type: n for n in plan.nodes}
    if node_type in planned:
        node = planned[node_type]
        if not node.feasible or node.precision is None:
            raise OnboardingError(
                f"performance twin {model!r} on {node_type}", f"the plan serves it nowhere on "
                f"this node type: {node.reason}", "Measure it on a node type the plan fits "
                "(serving_config says which), or lower its context or concurrency.")
        return node.precision, (f"performance twin: no accuracy gate to climb; the plan serves "
                                f"{node.precision} on {node_type} ({node.reason})")
    why_not = []
    for precision in ladder:
        ok, why = can_serve(precision)
        if ok:
            return precision, (f"performance twin: no accuracy gate to climb; {node_type} is no "
                               f"node type of the plan, and {precision} is the first precision "
                               f"of the ladder the engine at hand serves")
        why_not.append(f"{precision}: {why}")
    raise OnboardingError(f"performance twin {model!r} on {node_type}",
                          "the engine at hand serves no precision of its ladder: "
                          + "; ".join(why_not),
                          "Run it on a node type the plan serves (ONBOARDING_NODE_TYPE).")


def unusable_marker(model: str, precision: str, quantized: QuantizedSet) -> OnboardingError | None:
    """The error when the precision a twin is to be measured at has no usable export marker."""
    v = quantized.get(precision)
    if precision == "bf16" or (v is not None and v.usable):
        return None
    return OnboardingError(
        f"performance twin {model!r} at {precision}", "the plan serves this precision here, and "
        f"its export marker is unusable: {v.error if v else 'it was not made'}",
        "Give the twin a whole-model preset of this precision in configs/quantization.yaml "
        "(docs/twins.md) and re-materialize quantized.")


def accuracy_report(model: str, ladder: list[str]) -> AccuracyReport:
    """What `accuracy` stores for a twin: nothing scored, every precision not applicable."""
    return AccuracyReport(model, rows=(), gates=tuple(
        GateOutcome(precision=p, passed=False, reason=NOT_APPLICABLE,
                    verdict=NOT_APPLICABLE_VERDICT) for p in ladder))


def served_report(model: str, ladder: list[str], precisions: Iterable[str]
                  ) -> ServedAccuracyReport:
    """What `served_accuracy` stores for a twin: nothing served for scoring."""
    return ServedAccuracyReport(
        model=model, records=(),
        gates=tuple(GateOutcome(precision=p, passed=False, reason=NOT_APPLICABLE,
                                verdict=NOT_APPLICABLE_VERDICT, source="served")
                    for p in ladder if p != "bf16"),
        not_served={p: NOT_APPLICABLE for p in precisions})


def refusal(model: str, what: str, why: str) -> OnboardingError:
    """The error of a stage that has nothing to do for a twin (publish, deploy)."""
    return OnboardingError(
        f"{what} for {model!r}", f"{NOT_READY}: {why}",
        "A twin measures serving performance only (load_timing, serving_benchmark). To publish "
        "and deploy, onboard the real model: its own catalog entry with weights: real and its "
        "checkpoint at the source.")
