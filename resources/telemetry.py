"""One GPU telemetry sampler for every stage that runs GPU work: NVML read directly, or a
dcgm-exporter scraped when one is configured.

    sampler = telemetry.sampler()            # the GpuTelemetry resource
    sampler.start()
    t0 = sampler.elapsed_s()
    ...                                      # a burn, a benchmark point
    samples = sampler.stop()                 # list of flat dicts, DCGM field names
    onboarding.nodes.telemetry.summarize(samples, t0, sampler_end)   # per GPU window

Samples are taken on a background thread every `interval_s`; NVML calls release the GIL, so
the work being measured keeps its pace. XID events come from NVML's event set (a second thread)
or from the exporter's `DCGM_FI_DEV_XID_ERRORS`. Where nothing can be read (no driver, no
NVML, no exporter), `unavailable` says why and `stop()` returns no samples: callers report
"not checked: <why>", never a reading.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, Self

import dagster as dg
from pydantic import Field

from onboarding.nodes.telemetry import (
    CLOCK_REASONS,
    ECC_DBE_VOL,
    ECC_SBE_VOL,
    ENERGY_MJ,
    FB_USED_MIB,
    GPU_TEMP_C,
    GPU_UTIL_PCT,
    MEM_CLOCK_MHZ,
    MEMORY_TEMP_C,
    POWER_W,
    SM_CLOCK_MHZ,
    Sample,
    parse_dcgm_exporter,
)

XID_WAIT_MS = 250


class NvmlSource:
    """Reads every (or the listed) GPU through nvidia-ml-py. Raises RuntimeError with the reason
    when NVML cannot be used at all; single fields that fail are recorded in `unreadable`."""

    def __init__(self, gpus: list[int] | None = None):
        try:
            import pynvml
        except ImportError as exc:
            raise RuntimeError(f"nvidia-ml-py is not importable ({exc})") from None
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise RuntimeError(f"NVML did not initialise ({exc}): no NVIDIA driver here") from None
        count = pynvml.nvmlDeviceGetCount()
        self.gpus = list(range(count)) if gpus is None else [g for g in gpus if g < count]
        self.handles = {g: pynvml.nvmlDeviceGetHandleByIndex(g) for g in self.gpus}
        self.unreadable: dict[str, str] = {}
        self._xid_thread: threading.Thread | None = None  # watch_xids' thread, joined by close()
        n = pynvml
        reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        self.readers: dict[str, Callable[[Any], float]] = {
            POWER_W: lambda h: n.nvmlDeviceGetPowerUsage(h) / 1e3,
            GPU_TEMP_C: lambda h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
            MEMORY_TEMP_C: self._memory_temp,
            SM_CLOCK_MHZ: lambda h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            MEM_CLOCK_MHZ: lambda h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
            GPU_UTIL_PCT: lambda h: n.nvmlDeviceGetUtilizationRates(h).gpu,
            FB_USED_MIB: lambda h: n.nvmlDeviceGetMemoryInfo(h).used / 2**20,
            CLOCK_REASONS: reasons,
            ENERGY_MJ: n.nvmlDeviceGetTotalEnergyConsumption,
            ECC_DBE_VOL: lambda h: n.nvmlDeviceGetTotalEccErrors(
                h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
            ECC_SBE_VOL: lambda h: n.nvmlDeviceGetTotalEccErrors(
                h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
        }

    def _memory_temp(self, handle) -> float:
        n = self.nvml
        v = n.nvmlDeviceGetFieldValues(handle, [n.NVML_FI_DEV_MEMORY_TEMP])[0]
        if v.nvmlReturn != n.NVML_SUCCESS:
            raise n.NVMLError(v.nvmlReturn)
        return float(v.value.uiVal if v.valueType == n.NVML_VALUE_TYPE_UNSIGNED_INT
                     else v.value.ullVal)

    def read(self, t_s: float) -> list[Sample]:
        out = []
        for g, h in self.handles.items():
            s: Sample = {"t_s": t_s, "gpu": g}
            for name, reader in self.readers.items():
                if name in self.unreadable:
                    continue
                try:
                    s[name] = float(reader(h))
                except self.nvml.NVMLError as exc:
                    self.unreadable[name] = str(exc)  # not supported here: stop asking
            out.append(s)
        return out

    def watch_xids(self, stop: threading.Event, t0: float, sink: list[dict]) -> str:
        """Collect XID events until `stop`; returns "" or why XIDs cannot be watched."""
        n = self.nvml
        try:
            event_set = n.nvmlEventSetCreate()
            for h in self.handles.values():
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, event_set)
        except n.NVMLError as exc:
            return f"NVML XID events unavailable ({exc})"

        def loop() -> None:
            try:
                while not stop.is_set():
                    try:
                        data = n.nvmlEventSetWait_v2(event_set, XID_WAIT_MS)
                    except n.NVMLError_Timeout:
                        continue
                    sink.append({"t_s": time.monotonic() - t0,
                                 "gpu": n.nvmlDeviceGetIndex(data.device),
                                 "xid": int(data.eventData)})
            finally:
                try:
                    n.nvmlEventSetFree(event_set)
                except n.NVMLError:
                    pass  # NVML already shut down (close() gave up waiting): it freed the set

        self._xid_thread = threading.Thread(target=loop, name="nvml-xid", daemon=True)
        self._xid_thread.start()
        return ""

    def close(self) -> None:
        """Shuts NVML down after the XID thread has freed its event set (the caller has set
        its stop event): freeing after `nvmlShutdown` raises NVMLError_Uninitialized."""
        if self._xid_thread is not None:
            self._xid_thread.join(timeout=4 * XID_WAIT_MS / 1e3 + 1)
        self.nvml.nvmlShutdown()


class DcgmExporterSource:
    """Scrapes a dcgm-exporter `/metrics` URL (DCGM's own sampling, e.g. the node's DaemonSet)."""

    def __init__(self, url: str, timeout_s: float = 2.0):
        self.url, self.timeout_s = url, timeout_s
        self.unreadable: dict[str, str] = {}
        self.read(0.0)  # unreachable fails here, with the reason

    def read(self, t_s: float) -> list[Sample]:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as r:
                text = r.read().decode()
        except (urllib.error.URLError, OSError) as exc:
            raise RuntimeError(f"dcgm-exporter at {self.url} did not answer ({exc})") from None
        return parse_dcgm_exporter(text, t_s)

    def watch_xids(self, stop: threading.Event, t0: float, sink: list[dict]) -> str:
        return ""  # the exporter's DCGM_FI_DEV_XID_ERRORS field carries them in the samples

    def close(self) -> None:
        pass


class TelemetrySampler:
    """Samples GPUs on a background thread between `start()` and `stop()`."""

    def __init__(self, open_source: Callable[[], Any], interval_s: float):
        self._open = open_source
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.xids: list[dict] = []
        self.unavailable = ""  # why nothing is sampled ("" while sampling works)
        self.xid_watch = ""  # why XIDs are not watched ("" when they are)
        self.read_errors: list[str] = []
        self.unreadable: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._source: Any = None
        self._t0 = time.monotonic()
        self.started_at = time.time()  # wall clock of t_s = 0, to place other processes' times

    def elapsed_s(self) -> float:
        """Seconds since `start()`, on the samples' clock (for windows)."""
        return time.monotonic() - self._t0

    def start(self) -> TelemetrySampler:
        self._t0, self.started_at = time.monotonic(), time.time()
        try:
            self._source = self._open()
        except RuntimeError as exc:
            self.unavailable = str(exc)
            return self
        self.xid_watch = self._source.watch_xids(self._stop, self._t0, self.xids)
        self._thread = threading.Thread(target=self._loop, name="gpu-telemetry", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.samples.extend(self._source.read(time.monotonic() - self._t0))
            except RuntimeError as exc:  # a scrape that failed mid-run: counted, not fatal
                self.read_errors.append(str(exc))
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def at(self, wall_time: float) -> float:
        """A wall-clock time (`time.time()`, e.g. from another process) on the samples' clock."""
        return wall_time - self.started_at

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 * self.interval_s + 5)
        if self._source is not None:
            self.unreadable = dict(self._source.unreadable)
            self._source.close()
            self._source = None
        return list(self.samples)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class GpuTelemetry(dg.ConfigurableResource):
    """Builds samplers: NVML on this node, or the configured dcgm-exporter."""

    interval_s: float = Field(default=1.0, gt=0, description="seconds between samples")
    dcgm_exporter_url: str = Field(default="", description="a dcgm-exporter /metrics URL to "
                                   "scrape instead of NVML (ONBOARDING_DCGM_EXPORTER_URL)")

    def sampler(self, gpus: list[int] | None = None, interval_s: float | None = None
                ) -> TelemetrySampler:
        def open_source():
            if self.dcgm_exporter_url:
                return DcgmExporterSource(self.dcgm_exporter_url)
            return NvmlSource(gpus)

        return TelemetrySampler(open_source, interval_s or self.interval_s)
