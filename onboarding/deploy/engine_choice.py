"""Which engine serves a node type, by what was measured.

The plan sizes a node type once (precision, TP, max-num-seqs, context, memory fraction); each
engine template in configs/stack.yaml that has kernels for that precision on that hardware
renders those numbers into its own configuration (its own flags, its own content hash). Where
at least two engines were measured on that node type at exactly their configuration, the one
with the higher goodput at the SLO serves it, and the choice says both numbers and the
recordings they came from. Elsewhere the stack's engine (`images.engine`, the template default)
serves it, and the choice says that nothing decided otherwise.

Goodput at the SLO: requests per second that met the SLO's TTFT and ITL bounds
(`serving_stats.summarize`), at the SLO's target concurrency (or the next measured point above
it), the slowest scenario's, per GPU. Engine names come from the templates, never from here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onboarding.common.errors import ConfigError
from onboarding.fetch.catalog import ModelSpec
from onboarding.serving.engine_config import ConfigInputs, EngineConfig, build_config
from onboarding.serving.stack import EngineTemplate, servable

# The plan's numbers a configuration carries into another engine's template (the template's
# hardware defaults and the model's production parameters are each engine's own).
PLANNED = ("max_model_len", "max_num_seqs", "gpu_memory_utilization", "kv_cache_dtype")

MEASURED = "measured"
DEFAULT = "template default"
SEARCHED = "measured search"  # the configuration search's winner, at the SLO's target rate


def config_for_engine(config: EngineConfig, spec: ModelSpec, template: EngineTemplate,
                      engine: str, engine_version: str, image: str) -> EngineConfig:
    """`config`'s planned numbers rendered by another engine's template: the same node type,
    precision and TP, that engine's defaults and flags, its own hash. Engine switches are the
    first engine's and do not carry over."""
    if engine == config.engine and engine_version == config.engine_version \
            and image == config.image:
        return config
    ok, reason = servable(template, engine, config.hardware, config.precision)
    if not ok:
        raise ValueError(f"{spec.id} on {config.node_type}: {reason}")
    return build_config(template, ConfigInputs(
        spec=spec, node_type=config.node_type, hardware=config.hardware, engine=engine,
        engine_version=engine_version, image=image, precision=config.precision,
        tensor_parallel=config.tensor_parallel,
        planned={k: config.params[k] for k in PLANNED if k in config.params}))


@dataclass(frozen=True)
class Measurement:
    """One engine's serving benchmark at one configuration on one node type."""

    engine: str
    config_hash: str
    node_type: str
    goodput_rps_per_gpu: float  # at the SLO's target concurrency, slowest scenario
    judged_at: int  # the concurrency it was judged at
    source: str  # the recording it came from (file and step, or asset materialization)


@dataclass(frozen=True, kw_only=True)
class EngineChoice:
    """The engine a node type is served by, and why."""

    node_type: str
    engine: str
    basis: str  # MEASURED | DEFAULT
    reason: str
    config_hash: str  # the chosen engine's configuration
    goodput: dict[str, float] = field(default_factory=dict)  # engine -> goodput, if measured
    sources: dict[str, str] = field(default_factory=dict)  # engine -> recording

    def row(self) -> dict[str, Any]:
        """A flat row for tables and asset metadata."""
        return {"node_type": self.node_type, "engine": self.engine, "basis": self.basis,
                "config_hash": self.config_hash, "reason": self.reason,
                **{f"goodput_rps_per_gpu[{e}]": round(g, 3)
                   for e, g in sorted(self.goodput.items())}}


def goodput_at_slo(rows: Sequence[Mapping[str, Any]], target_concurrency: int,
                   gpus: int = 1) -> tuple[float, int] | None:
    """Goodput (requests/s within the SLO) per GPU at the target concurrency or the next
    measured point above it, the slowest scenario's; None when no point reaches the target.
    `rows` are serving-benchmark points (`scenario`, `load`, `goodput_rps`)."""
    by_scenario: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_scenario.setdefault(str(r.get("scenario", "")), []).append(r)
    judged: list[tuple[float, int]] = []
    for pts in by_scenario.values():
        above = [p for p in pts if int(p["load"]) >= target_concurrency]
        if not above:
            return None
        at = min(above, key=lambda p: int(p["load"]))
        g = at.get("goodput_rps")
        if g is None or math.isnan(float(g)):  # NaN: the point had no SLO to count against
            return None
        judged.append((float(g) / max(gpus, 1), int(at["load"])))
    if not judged:
        return None
    return min(judged)


def _median(ms: list[Measurement]) -> Measurement:
    """One engine's runs at one configuration as one measurement: the median goodput, the
    sources joined (with n when more than one)."""
    import statistics

    if len(ms) == 1:
        return ms[0]
    g = statistics.median(m.goodput_rps_per_gpu for m in ms)
    return dataclasses.replace(ms[0], goodput_rps_per_gpu=g, source=f"median of {len(ms)} runs: "
                               + "; ".join(m.source for m in ms))


def choose_engine(node_type: str, candidates: Mapping[str, EngineConfig],
                  measurements: Iterable[Measurement], default_engine: str) -> EngineChoice:
    """The engine for `node_type` among `candidates` (engine -> its configuration there).

    Measured: when two or more candidates were measured on this node type at exactly their
    configuration (same hash), the highest goodput at the SLO (each engine's median over its
    runs there) wins (a tie keeps the default
    engine when it is among the best, else the first by name). Otherwise the default engine,
    saying which engines lacked a measurement."""
    if default_engine not in candidates:
        raise ValueError(f"{node_type}: the default engine {default_engine!r} has no "
                         f"configuration (candidates: {', '.join(sorted(candidates)) or 'none'})")
    runs: dict[str, list[Measurement]] = {}
    for m in measurements:
        c = candidates.get(m.engine)
        if c is None or m.node_type != node_type or m.config_hash != c.hash:
            continue
        runs.setdefault(m.engine, []).append(m)
    # an engine's figure is the median of its runs at that configuration, not its best: the
    # best of several runs against one run of another engine would favour the engine measured
    # more often
    found = {e: _median(ms) for e, ms in runs.items()}
    default_hash = candidates[default_engine].hash
    if len(found) < 2:
        missing = [f"{e} at {c.hash}" for e, c in sorted(candidates.items()) if e not in found]
        have = [f"{e} at {m.config_hash} ({m.goodput_rps_per_gpu:.3g} req/s/GPU within the "
                f"SLO, {m.source})" for e, m in sorted(found.items())]
        alone = "; only " + ", ".join(have) + " measured" if have else ""
        why = (f"{default_engine}, the stack's default engine: no two engines were measured on "
               f"{node_type} at their configurations (unmeasured: {', '.join(missing)}){alone}"
               if len(candidates) > 1 else
               f"{default_engine}, the stack's default engine: the only engine with kernels "
               f"for this precision on {node_type}")
        return EngineChoice(node_type=node_type, engine=default_engine, basis=DEFAULT, reason=why,
                            config_hash=default_hash,
                            goodput={e: m.goodput_rps_per_gpu for e, m in found.items()},
                            sources={e: m.source for e, m in found.items()})
    top = max(m.goodput_rps_per_gpu for m in found.values())
    best = sorted(e for e, m in found.items() if m.goodput_rps_per_gpu == top)
    winner = default_engine if default_engine in best else best[0]
    numbers = "; ".join(
        f"{e} {m.goodput_rps_per_gpu:.3g} req/s/GPU within the SLO at concurrency "
        f"{m.judged_at} (configuration {m.config_hash}, {m.source})"
        for e, m in sorted(found.items(), key=lambda kv: -kv[1].goodput_rps_per_gpu))
    tie = " (a tie: the default engine kept)" if len(best) > 1 else ""
    why = f"{winner}: the higher goodput at the SLO on {node_type}{tie}: {numbers}"
    return EngineChoice(node_type=node_type, engine=winner, basis=MEASURED, reason=why,
                        config_hash=candidates[winner].hash,
                        goodput={e: m.goodput_rps_per_gpu for e, m in found.items()},
                        sources={e: m.source for e, m in found.items()})


def engine_images(stack_data: Mapping[str, Any], engine: str, version: str) -> dict[str, str]:
    """Per GPU architecture, the serving image stack.yaml's tag rule gives `engine` at
    `version` (any engine with a rule, not only `images.engine`)."""
    from onboarding.serving.stack import ImagesConfig

    return ImagesConfig.model_validate(stack_data["images"]).per_arch(engine, version)


# ---- measurements: from the device recordings, and the file the plan reads ----

FORMAT = "onboarding-engine-goodput/1"


def measurements_from_twins(recording: Mapping[str, Any], source: str, node_type: str,
                            engine: str | None = None) -> list[Measurement]:
    """Each step of a `bench/gpu_serving.py twins` recording (`<out>/twins.json`) that swept a
    configuration: its goodput at its SLO's target concurrency. `engine` names the engine of a
    recording made before the steps said theirs (the earlier H200 runs: vLLM 0.22.0)."""
    out = []
    for name, step in recording.get("steps", {}).items():
        rows, slo = step.get("rows"), step.get("slo")
        if not rows or not slo or not step.get("config_hash"):
            continue
        recorded = str(step.get("engine", "")).split(" ")[0] or engine
        if not recorded:
            raise ValueError(f"{source} {name}: the step names no engine; pass the engine the "
                             "recording was made with")
        g = goodput_at_slo(rows, int(slo["target_concurrency"]), int(step.get("tensor_parallel")
                                                                       or 1))
        if g is None:
            continue
        out.append(Measurement(recorded, step["config_hash"], node_type, g[0], g[1],
                               f"{source} {name}"))
    return out


def load_measurements(path: Any) -> list[Measurement]:
    """The measured goodputs the plan chooses engines by (FORMAT); no file: none."""
    import json
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        return []
    data = json.loads(p.read_text())
    if data.get("format") != FORMAT:
        raise ConfigError(str(p), f"format {data.get('format')!r}, expected {FORMAT!r}",
                          "Write it with bench/engine_measurements.py.")
    return [Measurement(**m) for m in data["measurements"]]


def dump_measurements(measurements: Sequence[Measurement], description: str) -> str:
    import json
    from dataclasses import asdict

    return json.dumps({"format": FORMAT, "description": description,
                       "measurements": [asdict(m) for m in measurements]}, indent=1) + "\n"


# ---- the plan: candidates per node type, and the choice ----

def engine_candidates(config: EngineConfig, spec: ModelSpec,
                      templates: Mapping[str, EngineTemplate], stack_data: Mapping[str, Any]
                      ) -> tuple[dict[str, EngineConfig], dict[str, str]]:
    """The plan's configuration of one node type in every engine template (configs/stack.yaml
    `engines`) with kernels for its precision on its hardware, at that engine's version
    (`versions.<engine>`) and the image its tag rule gives; and why the other engines have
    none. `config` (the stack's engine) is always one of them."""
    out, why = {config.engine: config}, {}
    for engine, template in sorted(templates.items()):
        if engine == config.engine:
            continue
        version = stack_data.get("versions", {}).get(engine)
        image, reason = None, ""
        if version:
            try:
                image = engine_images(stack_data, engine, version).get(config.hardware)
            except ValueError as exc:
                reason = str(exc)
        rendered, reason = in_engine(config, spec, template, engine, version, image, reason)
        if rendered is None:
            why[engine] = reason
        else:
            out[engine] = rendered
    return out, why


def in_engine(config: EngineConfig, spec: ModelSpec, template: EngineTemplate, engine: str,
              version: str | None, image: str | None, image_error: str = ""
              ) -> tuple[EngineConfig | None, str]:
    """`config` rendered by `engine`'s template at `version` and `image` (`config_for_engine`),
    or None and why not: no kernels for its precision on its hardware, no pinned version, no
    image for that hardware (`image_error`: why the tag rule gave none), or a template that
    cannot take the model (e.g. a twin where it has no dummy load)."""
    ok, reason = servable(template, engine, config.hardware, config.precision)
    if ok and not version:
        ok, reason = False, f"stack.yaml versions has no {engine}"
    elif ok and image_error:
        ok, reason = False, image_error
    elif ok and not image:
        ok, reason = False, f"stack.yaml images gives {engine} no image for {config.hardware}"
    if not ok:
        return None, reason
    try:
        return config_for_engine(config, spec, template, engine, version, image), ""
    except (ConfigError, ValueError) as exc:
        return None, str(exc)
