"""The telemetry sampler: NVML absent here (no driver), a real dcgm-exporter page served over
HTTP on 127.0.0.1, and the sampling thread's start/stop contract."""

import http.server
import threading
import time

import pytest

from onboarding.nodes import telemetry as tm
from resources.telemetry import GpuTelemetry, TelemetrySampler
from tests.onboarding.test_telemetry import EXPORTER_PAGE


def wait_for(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def test_without_a_driver_nvml_is_unavailable_with_the_reason():
    pytest.importorskip("pynvml")
    sampler = GpuTelemetry().sampler()
    sampler.start()
    try:
        nvml_here = not sampler.unavailable
    finally:
        samples = sampler.stop()
    if nvml_here:
        pytest.skip("this machine has an NVIDIA driver")
    assert "NVML did not initialise" in sampler.unavailable and samples == []
    assert sampler.xid_watch == ""  # never got as far as watching


class StubSource:
    """Stands in for NVML: two GPUs whose power rises by 1 W per read."""

    def __init__(self):
        self.unreadable = {"DCGM_FI_DEV_MEMORY_TEMP": "Not Supported"}
        self.reads, self.closed = 0, False

    def read(self, t_s):
        self.reads += 1
        return [{"t_s": t_s, "gpu": g, tm.POWER_W: 100.0 + self.reads} for g in (0, 1)]

    def watch_xids(self, stop, t0, sink):
        sink.append({"t_s": 0.0, "gpu": 1, "xid": 48})
        return ""

    def close(self):
        self.closed = True


def test_sampler_collects_until_stopped_then_closes_the_source():
    source = StubSource()
    sampler = TelemetrySampler(lambda: source, interval_s=0.01)
    with sampler:
        wait_for(lambda: source.reads >= 3)
    assert source.closed and sampler.unreadable == {"DCGM_FI_DEV_MEMORY_TEMP": "Not Supported"}
    reads = source.reads
    time.sleep(0.05)
    assert source.reads == reads  # the thread has stopped
    samples = sampler.samples
    assert len(samples) == 2 * reads and tm.gpus_in(samples) == [0, 1]
    assert [s["t_s"] for s in samples] == sorted(s["t_s"] for s in samples)
    assert sampler.xids == [{"t_s": 0.0, "gpu": 1, "xid": 48}]


class Exporter(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = EXPORTER_PAGE.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def exporter_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def test_dcgm_exporter_is_scraped_when_configured(exporter_url):
    sampler = GpuTelemetry(dcgm_exporter_url=exporter_url, interval_s=0.01).sampler()
    sampler.start()
    wait_for(lambda: len(sampler.samples) >= 4)
    samples = sampler.stop()
    assert sampler.unavailable == "" and tm.gpus_in(samples) == [0, 1]
    w = tm.summarize(samples)
    assert w[0].power_mean_w == pytest.approx(671.234) and w[1].sm_clock_min_mhz == 1740
    assert w[0].clock_reasons == {"sw_power_cap": 1.0}


def test_an_unreachable_exporter_is_unavailable_with_the_reason():
    sampler = GpuTelemetry(dcgm_exporter_url="http://127.0.0.1:9/metrics").sampler().start()
    assert sampler.stop() == [] and "did not answer" in sampler.unavailable


class DriverOrder:
    """NVML's calls as the XID watch makes them, in the driver's order rules: a handle used
    after `nvmlShutdown` raises NVMLError_Uninitialized (as on the H200 once, where
    the `nvml-xid` thread freed its event set after the sampler had shut NVML down). Stands in
    for the driver this machine lacks; the GPU runs exercise the real one."""

    class NVMLError(Exception):
        pass

    class NVMLError_Timeout(NVMLError):
        pass

    class NVMLError_Uninitialized(NVMLError):
        pass

    nvmlEventTypeXidCriticalError = 8

    def __init__(self):
        self.calls: list[str] = []
        self.up = True

    def _need_init(self, name):
        self.calls.append(name)
        if not self.up:
            raise self.NVMLError_Uninitialized("Uninitialized")

    def nvmlEventSetCreate(self):
        self._need_init("create")
        return object()

    def nvmlDeviceRegisterEvents(self, handle, kind, event_set):
        self._need_init("register")

    def nvmlEventSetWait_v2(self, event_set, wait_ms):
        self._need_init("wait")
        time.sleep(wait_ms / 1e3)
        raise self.NVMLError_Timeout("Timeout")

    def nvmlEventSetFree(self, event_set):
        self._need_init("free")

    def nvmlShutdown(self):
        self.calls.append("shutdown")
        self.up = False


def test_the_xid_watch_frees_its_event_set_before_nvml_shuts_down(monkeypatch):
    from resources import telemetry as rt

    driver = DriverOrder()
    source = object.__new__(rt.NvmlSource)  # no driver here: the source around a stand-in
    source.nvml, source.handles, source.unreadable = driver, {0: object()}, {}
    source._xid_thread = None  # as __init__ leaves it
    raised: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    stop = threading.Event()
    assert source.watch_xids(stop, time.monotonic(), []) == ""
    wait_for(lambda: "wait" in driver.calls)
    stop.set()
    source.close()
    for t in threading.enumerate():  # the watch's thread ends either way; then judge its calls
        if t.name == "nvml-xid":
            t.join(timeout=5)
    assert raised == []
    assert driver.calls.index("free") < driver.calls.index("shutdown")
