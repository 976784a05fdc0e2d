"""Telemetry windows, energy and tokens per joule, clock reasons, dcgm-exporter pages."""

import pytest

from onboarding.nodes import telemetry as tm


def trace(gpus=(0, 1), seconds=10, interval=1.0, energy=True) -> list[dict]:
    out = []
    for i in range(int(seconds / interval) + 1):
        t = i * interval
        for g in gpus:
            s = {"t_s": t, "gpu": g, tm.POWER_W: 500.0 + 100 * g, tm.GPU_TEMP_C: 40 + t,
                 tm.SM_CLOCK_MHZ: 1900.0 - 10 * t, tm.GPU_UTIL_PCT: 100.0,
                 tm.CLOCK_REASONS: 0x4 if t >= 5 else 0}
            if energy:
                s[tm.ENERGY_MJ] = 1e6 + (500.0 + 100 * g) * t * 1e3
            out.append(s)
    return out


def test_window_summary_per_gpu():
    w = tm.summarize(trace(), start_s=2, end_s=8)
    assert sorted(w) == [0, 1]
    g0 = w[0]
    assert g0.samples == 7 and g0.duration_s == 6
    assert g0.power_mean_w == 500 and w[1].power_mean_w == 600
    assert (g0.temp_max_c, g0.sm_clock_min_mhz, g0.sm_clock_median_mhz) == (48, 1820, 1850)
    assert g0.clock_reasons == {"sw_power_cap": pytest.approx(4 / 7)}
    assert g0.memory_temp_max_c is None  # never read: unknown, not zero
    assert g0.energy_j == pytest.approx(500 * 6)


def test_energy_from_the_counter_or_the_power_trace():
    with_counter = trace(energy=True)
    without = trace(energy=False)
    assert tm.energy_j(with_counter, 1) == pytest.approx(600 * 10)
    assert tm.energy_j(without, 1) == pytest.approx(600 * 10)  # trapezoids of a flat trace
    assert tm.energy_j([{"t_s": 0.0, "gpu": 0}], 0) is None
    total = tm.total_energy_j(with_counter, 0, 10)
    assert total == pytest.approx(11000)
    assert tm.tokens_per_joule(22000, total) == pytest.approx(2.0)
    assert tm.tokens_per_joule(100, None) is None and tm.tokens_per_joule(100, 0.0) is None


def test_clock_reasons_decode_known_and_unknown_bits():
    assert tm.decode_clock_reasons(0x44) == ("sw_power_cap", "hw_thermal_slowdown")
    assert tm.decode_clock_reasons(0) == () and tm.decode_clock_reasons(None) == ()
    assert tm.decode_clock_reasons(0x1001)[-1] == "bits_0x1000"


def test_temperature_slope_near_zero_on_a_plateau():
    rising = trace(gpus=(0,), seconds=120)
    assert tm.rise_c_per_min(rising, 0, 60) == pytest.approx(60.0)
    flat = [{**s, tm.GPU_TEMP_C: 70.0} for s in rising]
    assert tm.rise_c_per_min(flat, 0, 60) == pytest.approx(0.0)
    assert tm.rise_c_per_min(flat, 3, 60) is None


EXPORTER_PAGE = """# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-5f3c2a10",pci_bus_id="00000000:19:00.0",device="nvidia0",modelName="NVIDIA H200",Hostname="gpu-node-01",DCGM_FI_DRIVER_VERSION="580.95.05"} 1755
DCGM_FI_DEV_SM_CLOCK{gpu="1",UUID="GPU-5f3c2a11",pci_bus_id="00000000:3B:00.0",device="nvidia1",modelName="NVIDIA H200",Hostname="gpu-node-01",DCGM_FI_DRIVER_VERSION="580.95.05"} 1740
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-5f3c2a10",device="nvidia0",modelName="NVIDIA H200",Hostname="gpu-node-01"} 671.234
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-5f3c2a11",device="nvidia1",modelName="NVIDIA H200",Hostname="gpu-node-01"} 668.5
# HELP DCGM_FI_DEV_CLOCKS_EVENT_REASONS Current clock event reasons (bitmask).
# TYPE DCGM_FI_DEV_CLOCKS_EVENT_REASONS gauge
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="0",UUID="GPU-5f3c2a10",device="nvidia0",modelName="NVIDIA H200",Hostname="gpu-node-01"} 4
# HELP DCGM_FI_DEV_PCIE_REPLAY_COUNTER Total number of PCIe retries.
# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0",UUID="GPU-5f3c2a10",device="nvidia0",modelName="NVIDIA H200",Hostname="gpu-node-01"} 0
"""


def test_dcgm_exporter_page_to_samples_per_gpu():
    s0, s1 = tm.parse_dcgm_exporter(EXPORTER_PAGE, 3.5)
    assert s0 == {"t_s": 3.5, "gpu": 0, tm.SM_CLOCK_MHZ: 1755.0, tm.POWER_W: 671.234,
                  tm.CLOCK_REASONS: 4.0}  # the 4.x name maps onto the field; others dropped
    assert s1["gpu"] == 1 and s1[tm.POWER_W] == 668.5 and tm.CLOCK_REASONS not in s1


def test_benchmark_point_columns_over_its_window():
    cols = tm.point_columns(trace(), start_s=2, end_s=8, output_tokens=3300)
    assert cols["gpu_power_w"] == 1100  # 500 W + 600 W, summed over the engine's GPUs
    assert cols["gpu_energy_j"] == pytest.approx(1100 * 6)
    assert cols["tokens_per_joule"] == pytest.approx(3300 / 6600, abs=1e-3)
    assert cols["gpu_temp_max_c"] == 48 and cols["sm_clock_median_mhz"] == 1850
    assert cols["clock_events"] == "sw_power_cap"
    assert cols["gpu_telemetry"].startswith("2 GPU(s)")


def test_benchmark_point_columns_say_why_when_nothing_was_read():
    assert tm.point_columns([], 0, 1, 10, unavailable="NVML did not initialise") == {
        "gpu_telemetry": "not checked: NVML did not initialise"}
    outside = tm.point_columns(trace(seconds=2), start_s=5, end_s=6, output_tokens=10)
    assert outside == {"gpu_telemetry": "not checked: no GPU sample fell inside this point's "
                       "window"}
