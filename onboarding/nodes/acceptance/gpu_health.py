"""`gpu_health`: dcgmi diag and the burn (compute results, XIDs, ECC deltas, temperature
plateau, clocks and power over its steady part), and the GPUs' PCIe links read while it runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from onboarding.nodes import telemetry as tm
from onboarding.nodes.acceptance.checks import Check, Checker
from onboarding.nodes.acceptance.host import pcie_under_load_check
from onboarding.nodes.acceptance.inventory import NodeInventory
from onboarding.nodes.acceptance.schema import BurnLimits, NodeSetting
from onboarding.nodes.acceptance.tools import Runs
from onboarding.nodes.facts import DcgmDiag, GpuFacts


@dataclass(frozen=True, kw_only=True)
class GpuHealth:
    node: str
    burn: dict[str, Any]  # the worker's result, `duration_s`, per-GPU iterations and errors
    samples: tuple[dict, ...]  # telemetry during the burn (onboarding.nodes.telemetry samples)
    windows: tuple[dict, ...]  # per-GPU summary of the steady part
    xids: tuple[dict, ...]
    dcgm: DcgmDiag | None
    checks: tuple[Check, ...]


def dcgm_check(c: Checker, diag: DcgmDiag | None, why_not: str, level: int,
               level_min: int = 3) -> None:
    """A full pass at `level_min` (the procedure's level 3) or above; a lower level that passed
    is not the check made."""
    want = f"dcgmi diag -r {level_min} passes"
    if diag is None:
        c.skip(2, "dcgm_diag", why_not, want)
        return
    failed = diag.failed()
    if failed:
        c.add(2, "dcgm_diag", False, f"{len(failed)} failed at level {level}", want,
              "; ".join(f"{r.test} GPU{r.gpu}: {' '.join(r.messages) or 'Fail'}"
                        for r in failed))
    elif not diag.results or len(diag.not_run()) == len(diag.results):
        c.skip(2, "dcgm_diag", f"dcgmi diag -r {level} ran no test", want)
    elif diag.not_run():
        c.skip(2, "dcgm_diag", "dcgmi diag did not run " + ", ".join(
            sorted({f"{r.test} ({r.status})" for r in diag.not_run()})), want)
    elif level < level_min:
        c.skip(2, "dcgm_diag", f"dcgmi diag -r {level} passed; level {level_min} is the "
               "check", want)
    else:
        warned = [r for r in diag.results if r.status == "warn"]
        c.add(2, "dcgm_diag", True, f"{len(diag.results)} results pass at level {level}"
              + (f", {len(warned)} warn" if warned else ""), want)


def burn_checks(s: NodeSetting, gpus: Sequence[GpuFacts], burn: Mapping[str, Any],
                samples: Sequence[Mapping[str, Any]], xids: Sequence[Mapping[str, Any]],
                telemetry_why: str, xid_why: str, c: Checker) -> list[dict]:
    """The burn's verdicts: compute results against the reference, XIDs, ECC deltas,
    temperature plateau, clocks and power over the steady part (after `warmup_s`).
    Returns the per-GPU window summaries."""
    b = s.thresholds.burn
    if burn.get("error"):
        c.add(2, "burn_compute", False, "did not finish", "runs for the burn duration",
              str(burn["error"]))
    duration = float(burn.get("duration_s") or 0.0)
    c.add(2, "burn_duration", duration >= b.min_duration_s, f"{duration:.0f} s",
          f">= {b.min_duration_s:.0f} s", f"burn of {duration:.0f} s is shorter than the "
          f"{b.min_duration_s:.0f} s the node type requires")
    per_gpu = burn.get("per_gpu") or []
    if not burn.get("error"):
        bad = [f"GPU{g['gpu']}: {g['errors']} wrong elements in {g['checks']} checks"
               + ("" if g.get("reference_ok", True) else ", reference differs from the CPU")
               for g in per_gpu if g["errors"] or not g.get("reference_ok", True)]
        idle = [f"GPU{g['gpu']}" for g in per_gpu if not g["iterations"]]
        missing = sorted({x.index for x in gpus} - {int(g["gpu"]) for g in per_gpu})
        c.add(2, "burn_compute", not (bad or idle or missing) and bool(per_gpu),
              "; ".join(bad) or f"0 errors in {sum(g['checks'] for g in per_gpu)} checks",
              "0 wrong results",
              "; ".join(bad + [f"{x} did no work" for x in idle]
                        + [f"GPU{m} not burned" for m in missing]) or "no GPU burned")
    if b.matmul_tflops_min is None:
        c.skip(2, "burn_tflops", "no matmul_tflops_min configured for this node type")
    elif per_gpu:
        slow = [f"GPU{g['gpu']} {g['tflops']:.0f}" for g in per_gpu
                if g["tflops"] < b.matmul_tflops_min]
        c.add(2, "burn_tflops", not slow, "; ".join(slow) or
              f"min {min(g['tflops'] for g in per_gpu):.0f} TFLOP/s",
              f">= {b.matmul_tflops_min:.0f} TFLOP/s", "slow GPU(s): " + ", ".join(slow))
    if xid_why:
        c.skip(2, "burn_xid", xid_why)
    else:
        field_xids = [{"gpu": int(x["gpu"]), "xid": int(x[tm.XID]), "t_s": x["t_s"]}
                      for x in samples if x.get(tm.XID)]
        seen = list(xids) + field_xids
        c.add(2, "burn_xid", not seen, f"{len(seen)} XID event(s)", "none",
              "XID during the burn: " + ", ".join(
                  sorted({f"GPU{x['gpu']} XID {x['xid']}" for x in seen})))
    if telemetry_why:
        for name in ("burn_ecc", "ecc_sbe_rate", "burn_temperature", "burn_clocks",
                     "burn_power"):
            c.skip(2, name, f"no telemetry: {telemetry_why}")
        return []
    # The burn's own span on the samples' clock (the job starts CUDA before it computes and the
    # sampler runs a little past its end): judged from `warmup_s` into it, to its end.
    start, end = burn.get("window_s") or (0.0, max((float(x["t_s"]) for x in samples),
                                                   default=0.0))
    burning = tm.window(samples, start, end)
    steady = tm.summarize(burning, start_s=start + b.warmup_s)
    _ecc_delta(c, samples)
    _ecc_sbe_rate(c, s.thresholds.gpu_stack.ecc_sbe_max_per_hour, burning)
    _temperature(c, b, burning, steady, end - start)
    _clocks(c, b, gpus, steady)
    _power(c, b, gpus, steady)
    return [w.row() for w in steady.values()]


def _ecc_delta(c: Checker, samples: Sequence[Mapping[str, Any]]) -> None:
    deltas = {}
    for g in tm.gpus_in(samples):
        vals = tm.values(samples, tm.ECC_DBE_VOL, g)
        if len(vals) >= 2:
            deltas[g] = vals[-1] - vals[0]
    if not deltas:
        c.skip(2, "burn_ecc", "ECC counters not readable during the burn")
        return
    grew = [f"GPU{g} +{int(d)}" for g, d in sorted(deltas.items()) if d > 0]
    c.add(2, "burn_ecc", not grew, ", ".join(grew) or "no new uncorrectable",
          "0 new uncorrectable", "new uncorrectable ECC errors during the burn: "
          + ", ".join(grew))


def _ecc_sbe_rate(c: Checker, most_per_hour: float, samples: Sequence[Mapping[str, Any]]
                  ) -> None:
    """New single-bit (corrected) ECC errors per GPU-hour of the burn."""
    want = f"<= {most_per_hour:g} new single-bit ECC per GPU-hour"
    rates, span = {}, {}
    for g in tm.gpus_in(samples):
        pts = sorted((float(x["t_s"]), float(x[tm.ECC_SBE_VOL])) for x in samples
                     if int(x["gpu"]) == g and x.get(tm.ECC_SBE_VOL) is not None)
        if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
            span[g] = pts[-1][0] - pts[0][0]
            rates[g] = (pts[-1][1] - pts[0][1]) / (span[g] / 3600)
    if not rates:
        c.skip(2, "ecc_sbe_rate", "single-bit ECC counters not readable during the burn", want)
        return
    high = [f"GPU{g} {r:.1f}/h" for g, r in sorted(rates.items()) if r > most_per_hour]
    c.add(2, "ecc_sbe_rate", not high, ", ".join(high) or ", ".join(
          f"GPU{g} {r:g}/h" for g, r in sorted(rates.items())), want,
          "single-bit ECC errors during the burn (a GPU whose memory is wearing): "
          + ", ".join(high))


def _temperature(c: Checker, b: BurnLimits, samples, steady: dict[int, tm.GpuWindow],
                 span_s: float) -> None:
    temps = {g: w for g, w in steady.items() if w.temp_max_c is not None}
    if not temps:
        c.skip(2, "burn_temperature", "GPU temperature not read")
        return
    hot = [f"GPU{g} max {w.temp_max_c:.0f} C" for g, w in temps.items()
           if w.temp_max_c >= b.temperature_max_c]
    rising = {g: r for g in temps if (r := tm.rise_c_per_min(samples, g, b.plateau_window_s))
              is not None and r > b.plateau_max_rise_c_per_min}
    measured = ", ".join(f"GPU{g} {w.temp_end_c:.0f} C" for g, w in temps.items())
    if hot:
        c.add(2, "burn_temperature", False, "; ".join(hot), f"< {b.temperature_max_c:.0f} C",
              "at or over the throttle point (check airflow/cooling): " + "; ".join(hot))
    elif rising or span_s < b.plateau_window_s:
        c.skip(2, "burn_temperature", f"no plateau yet ({measured}; rising "
               + (", ".join(f"GPU{g} {r:.1f} C/min" for g, r in rising.items()) or
                  f"unknown: burn shorter than the {b.plateau_window_s:.0f} s window")
               + ")", f"plateau < {b.temperature_max_c:.0f} C")
    else:
        c.add(2, "burn_temperature", True, measured, f"plateau < {b.temperature_max_c:.0f} C")


def _clocks(c: Checker, b: BurnLimits, gpus: Sequence[GpuFacts],
            steady: dict[int, tm.GpuWindow]) -> None:
    """No clock drop: the steady part's lowest SM clock within `sm_clock_drop_max_fraction`
    of its median (a GPU at its power cap dithers around a steady clock; a drop is a fall
    out of that band), and none of the forbidden clock-event reasons."""
    max_clock = {g.index: g.sm_clock_max_mhz for g in gpus}
    rows, bad = [], []
    for g, w in steady.items():
        if w.sm_clock_min_mhz is None or not w.sm_clock_median_mhz:
            continue
        top = max_clock.get(g)
        floor = (1 - b.sm_clock_drop_max_fraction) * w.sm_clock_median_mhz
        rows.append(f"GPU{g} min {w.sm_clock_min_mhz:.0f} median {w.sm_clock_median_mhz:.0f}"
                    + (f" of {top:.0f} MHz" if top else " MHz"))
        if w.sm_clock_min_mhz < floor:
            bad.append(f"GPU{g} dropped to {w.sm_clock_min_mhz:.0f} MHz (< {floor:.0f}, "
                       f"{b.sm_clock_drop_max_fraction:.0%} under its median)")
        held = sorted(r for r in w.clock_reasons if r in b.forbidden_clock_reasons)
        if held:
            bad.append(f"GPU{g} held back by " + ", ".join(
                f"{r} {w.clock_reasons[r]:.0%} of samples" for r in held))
    if not rows:
        c.skip(2, "burn_clocks", "SM clock not read")
        return
    c.add(2, "burn_clocks", not bad, "; ".join(rows),
          f"no drop (min >= {1 - b.sm_clock_drop_max_fraction:.0%} of the median), none of "
          f"{', '.join(b.forbidden_clock_reasons)}", "clock drop: " + "; ".join(bad))


def _power(c: Checker, b: BurnLimits, gpus: Sequence[GpuFacts],
           steady: dict[int, tm.GpuWindow]) -> None:
    limit = {g.index: g.power_limit_w for g in gpus}
    rows, low = [], []
    for g, w in steady.items():
        if w.power_mean_w is None or not limit.get(g):
            continue
        rows.append(f"GPU{g} {w.power_mean_w:.0f} of {limit[g]:.0f} W")
        if w.power_mean_w < b.power_min_fraction * limit[g]:
            low.append(f"GPU{g} {w.power_mean_w:.0f} W < {b.power_min_fraction:.0%} of "
                       f"{limit[g]:.0f} W")
    if not rows:
        c.skip(2, "burn_power", "power draw or power limit not read")
        return
    c.add(2, "burn_power", not low, "; ".join(rows), f">= {b.power_min_fraction:.0%} of the "
          "power limit (about TDP)", "power well below the limit under full load (a GPU not doing the "
          "work, or capped elsewhere): " + "; ".join(low))


HEALTH_CHECKS = ("dcgm_diag", "burn_duration", "burn_compute", "burn_xid", "burn_ecc",
                 "ecc_sbe_rate", "burn_temperature", "burn_clocks", "burn_power")


def build_health(s: NodeSetting, inv: NodeInventory, *, diag: DcgmDiag | None, diag_why: str,
                 level: int, burn: Mapping[str, Any] | None, samples: Sequence[dict],
                 xids: Sequence[dict], telemetry_why: str, xid_why: str,
                 links: Runs | None = None) -> GpuHealth:
    """The burn's checks, DCGM's, and the GPUs' PCIe links as read while the burn ran (`links`:
    the `*-load` recordings; `burn["links_read_s"]` is when, on the samples' clock)."""
    c = Checker(s.thresholds)
    if inv.no_gpu:
        for name in HEALTH_CHECKS:
            c.skip(2, name, inv.no_gpu)
        c.skip(1, "pcie_lnksta_load", inv.no_gpu)
        return GpuHealth(node=s.name, burn={}, samples=(), windows=(), xids=(), dcgm=None,
                         checks=tuple(c.checks))
    dcgm_check(c, diag, diag_why, level, s.thresholds.dcgm_diag_level_min)
    pcie_under_load_check(c, links or {}, (burn or {}).get("links_read_s"),
                          (burn or {}).get("window_s"))
    if burn is None:
        for name in HEALTH_CHECKS[1:]:
            c.skip(2, name, "the burn did not run")
        return GpuHealth(node=s.name, burn={}, samples=(), windows=(), xids=(), dcgm=diag,
                         checks=tuple(c.checks))
    gpus = inv.smi.gpus if inv.smi else ()
    windows = burn_checks(s, gpus, burn, samples, xids, telemetry_why, xid_why, c)
    return GpuHealth(node=s.name, burn=dict(burn), samples=tuple(samples), windows=tuple(windows),
                     xids=tuple(xids), dcgm=diag, checks=tuple(c.checks))
