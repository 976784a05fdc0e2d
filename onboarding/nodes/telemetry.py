"""GPU telemetry under DCGM's field names, and what a window of samples says.

One sample is a flat mapping `{"t_s": seconds since the sampler started, "gpu": index,
<DCGM field name>: value, ...}`: JSON as it is, the same whether NVML was read directly or a
dcgm-exporter was scraped (resources/telemetry.py), so a burn's trace and a serving benchmark's
point are summarized by the same functions. A field that could not be read is absent from the
sample, never zero: a summary of it is None ("not measured"), not a number that looks healthy.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

POWER_W = "DCGM_FI_DEV_POWER_USAGE"
GPU_TEMP_C = "DCGM_FI_DEV_GPU_TEMP"
MEMORY_TEMP_C = "DCGM_FI_DEV_MEMORY_TEMP"
SM_CLOCK_MHZ = "DCGM_FI_DEV_SM_CLOCK"
MEM_CLOCK_MHZ = "DCGM_FI_DEV_MEM_CLOCK"
GPU_UTIL_PCT = "DCGM_FI_DEV_GPU_UTIL"
FB_USED_MIB = "DCGM_FI_DEV_FB_USED"
CLOCK_REASONS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
ENERGY_MJ = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
XID = "DCGM_FI_DEV_XID_ERRORS"
ECC_DBE_VOL = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ECC_SBE_VOL = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
FIELDS = (POWER_W, GPU_TEMP_C, MEMORY_TEMP_C, SM_CLOCK_MHZ, MEM_CLOCK_MHZ, GPU_UTIL_PCT,
          FB_USED_MIB, CLOCK_REASONS, ENERGY_MJ, XID, ECC_DBE_VOL, ECC_SBE_VOL)
# dcgm-exporter 4.x spells the throttle-reasons field by its newer name.
ALIASES = {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": CLOCK_REASONS}

# NVML's clocks-event (throttle) reason bits; DCGM's field carries the same mask.
CLOCK_REASON_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks_setting",
}

Sample = dict[str, float]


def decode_clock_reasons(mask: float | None) -> tuple[str, ...]:
    """`0x44` -> ("sw_power_cap", "hw_thermal_slowdown"); unknown bits as `bit_0x...`."""
    if mask is None:
        return ()
    m = int(mask)
    names = [name for bit, name in CLOCK_REASON_BITS.items() if m & bit]
    rest = m & ~sum(CLOCK_REASON_BITS)
    return (*names, f"bits_{rest:#x}") if rest else tuple(names)


def values(samples: Iterable[Mapping[str, Any]], name: str, gpu: int | None = None
           ) -> list[float]:
    return [float(s[name]) for s in samples
            if name in s and (gpu is None or int(s["gpu"]) == gpu)]


def window(samples: Sequence[Mapping[str, Any]], start_s: float | None = None,
           end_s: float | None = None) -> list[Mapping[str, Any]]:
    """The samples taken in [start_s, end_s] (seconds since the sampler started)."""
    lo = -math.inf if start_s is None else start_s
    hi = math.inf if end_s is None else end_s
    return [s for s in samples if lo <= float(s["t_s"]) <= hi]


def gpus_in(samples: Iterable[Mapping[str, Any]]) -> list[int]:
    return sorted({int(s["gpu"]) for s in samples})


def energy_j(samples: Sequence[Mapping[str, Any]], gpu: int) -> float | None:
    """Joules one GPU used over the samples: the energy counter's difference where the GPU has
    one (exact), else the power trace integrated by trapezoids; None without either."""
    own = sorted((s for s in samples if int(s["gpu"]) == gpu), key=lambda s: s["t_s"])
    counter = [s for s in own if ENERGY_MJ in s]
    if len(counter) >= 2:
        return (float(counter[-1][ENERGY_MJ]) - float(counter[0][ENERGY_MJ])) / 1e3
    power = [(float(s["t_s"]), float(s[POWER_W])) for s in own if POWER_W in s]
    if len(power) < 2:
        return None
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in itertools.pairwise(power))


@dataclass(frozen=True, kw_only=True)
class GpuWindow:
    """What one GPU did over a window of samples; None where the field was never read."""

    gpu: int
    samples: int
    duration_s: float
    power_mean_w: float | None
    power_max_w: float | None
    temp_max_c: float | None
    temp_end_c: float | None  # median of the last quarter: the plateau when there is one
    memory_temp_max_c: float | None
    sm_clock_min_mhz: float | None
    sm_clock_median_mhz: float | None
    util_mean_pct: float | None
    energy_j: float | None
    clock_reasons: dict[str, float] = field(default_factory=dict)  # reason -> fraction of samples

    def row(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "samples": self.samples, "duration_s": self.duration_s,
                "power_mean_w": self.power_mean_w, "power_max_w": self.power_max_w,
                "temp_max_c": self.temp_max_c, "temp_end_c": self.temp_end_c,
                "sm_clock_min_mhz": self.sm_clock_min_mhz,
                "sm_clock_median_mhz": self.sm_clock_median_mhz,
                "energy_j": self.energy_j,
                "clock_reasons": ", ".join(f"{k} {v:.0%}" for k, v in
                                           sorted(self.clock_reasons.items())) or "none"}


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def summarize(samples: Sequence[Mapping[str, Any]], start_s: float | None = None,
              end_s: float | None = None) -> dict[int, GpuWindow]:
    """Per GPU: power, temperature, clocks, utilization, energy and clock-event reasons over
    [start_s, end_s]. A benchmark point passes its own start and end; a burn its steady part."""
    picked = window(samples, start_s, end_s)
    out: dict[int, GpuWindow] = {}
    for gpu in gpus_in(picked):
        own = sorted((s for s in picked if int(s["gpu"]) == gpu), key=lambda s: s["t_s"])
        times = [float(s["t_s"]) for s in own]
        temps = values(own, GPU_TEMP_C)
        clocks = values(own, SM_CLOCK_MHZ)
        reasons: dict[str, int] = {}
        masks = values(own, CLOCK_REASONS)
        for m in masks:
            for name in decode_clock_reasons(m):
                reasons[name] = reasons.get(name, 0) + 1
        power = values(own, POWER_W)
        tail = temps[len(temps) - max(1, len(temps) // 4):] if temps else []
        out[gpu] = GpuWindow(
            gpu=gpu, samples=len(own), duration_s=(times[-1] - times[0]) if times else 0.0,
            power_mean_w=_mean(power), power_max_w=max(power) if power else None,
            temp_max_c=max(temps) if temps else None,
            temp_end_c=statistics.median(tail) if tail else None,
            memory_temp_max_c=max(values(own, MEMORY_TEMP_C), default=None),
            sm_clock_min_mhz=min(clocks) if clocks else None,
            sm_clock_median_mhz=statistics.median(clocks) if clocks else None,
            util_mean_pct=_mean(values(own, GPU_UTIL_PCT)), energy_j=energy_j(own, gpu),
            clock_reasons={k: n / len(masks) for k, n in reasons.items()})
    return out


def total_energy_j(samples: Sequence[Mapping[str, Any]], start_s: float | None = None,
                   end_s: float | None = None) -> float | None:
    """Joules of every GPU over the window; None when any GPU's energy is unknown."""
    picked = window(samples, start_s, end_s)
    parts = [energy_j(picked, g) for g in gpus_in(picked)]
    if not parts or any(p is None for p in parts):
        return None
    return float(sum(parts))  # type: ignore[arg-type]


def tokens_per_joule(tokens: float, energy: float | None) -> float | None:
    """Output tokens per joule of GPU energy (the serving benchmark's efficiency figure)."""
    if energy is None or energy <= 0:
        return None
    return float(tokens) / energy


def rise_c_per_min(samples: Sequence[Mapping[str, Any]], gpu: int, last_s: float) -> float | None:
    """Least-squares slope of the GPU temperature over its last `last_s` seconds, in C/min:
    near zero once the temperature has reached its plateau."""
    own = [(float(s["t_s"]), float(s[GPU_TEMP_C])) for s in samples
           if int(s["gpu"]) == gpu and GPU_TEMP_C in s]
    if not own:
        return None
    end = max(t for t, _ in own)
    pts = [(t, v) for t, v in own if t >= end - last_s]
    if len(pts) < 3:
        return None
    mt = statistics.fmean(t for t, _ in pts)
    mv = statistics.fmean(v for _, v in pts)
    den = sum((t - mt) ** 2 for t, _ in pts)
    if den == 0:
        return None
    return 60.0 * sum((t - mt) * (v - mv) for t, v in pts) / den


def parse_dcgm_exporter(text: str, t_s: float) -> list[Sample]:
    """One scrape of a dcgm-exporter `/metrics` page -> one sample per GPU (label `gpu`)."""
    per_gpu: dict[int, Sample] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = ALIASES.get(s.name, s.name)
            if name not in FIELDS or "gpu" not in s.labels:
                continue
            try:
                gpu = int(s.labels["gpu"])
            except ValueError:
                continue
            per_gpu.setdefault(gpu, {"t_s": t_s, "gpu": gpu})[name] = float(s.value)
    return [per_gpu[g] for g in sorted(per_gpu)]


def point_columns(samples: Sequence[Mapping[str, Any]], start_s: float, end_s: float,
                  output_tokens: float, unavailable: str = "") -> dict[str, Any]:
    """A serving benchmark point's GPU columns over its measured window [start_s, end_s]:
    power (summed over GPUs), energy, output tokens per joule, hottest GPU, median SM clock and
    the clock-event reasons other than idle. Without samples every column says why."""
    if unavailable or not window(samples, start_s, end_s):
        why = unavailable or "no GPU sample fell inside this point's window"
        return {"gpu_telemetry": f"not checked: {why}"}
    per_gpu = summarize(samples, start_s, end_s)
    power = [w.power_mean_w for w in per_gpu.values()]
    temps = [w.temp_max_c for w in per_gpu.values() if w.temp_max_c is not None]
    clocks = [w.sm_clock_median_mhz for w in per_gpu.values() if w.sm_clock_median_mhz]
    reasons = sorted({r for w in per_gpu.values() for r in w.clock_reasons if r != "gpu_idle"})
    energy = total_energy_j(samples, start_s, end_s)
    return {
        "gpu_telemetry": f"{len(per_gpu)} GPU(s), {sum(w.samples for w in per_gpu.values())} "
                         "samples",
        "gpu_power_w": None if None in power else round(float(sum(power)), 1),  # type: ignore
        "gpu_energy_j": None if energy is None else round(energy, 1),
        "tokens_per_joule": (None if (tpj := tokens_per_joule(output_tokens, energy)) is None
                             else round(tpj, 3)),
        "gpu_temp_max_c": max(temps) if temps else None,
        "sm_clock_median_mhz": statistics.median(clocks) if clocks else None,
        "clock_events": ", ".join(reasons) or "none",
    }
