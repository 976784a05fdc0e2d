"""configs/acceptance.yaml validation, the verdict rules, and the checks' edge cases: no GPU,
one GPU, a short burn, no telemetry, a node type that does not match the GPUs."""

from pathlib import Path

import pytest
import yaml

from onboarding.common.errors import ConfigError
from onboarding.nodes import acceptance as acc
from onboarding.nodes import telemetry as tm
from resources.config_files import ConfigFiles

DATA = Path(__file__).parents[1] / "data" / "acceptance"
HEALTHY = DATA / "crafted-h200x2-healthy"


def setting(configs: ConfigFiles, node_type: str = "h200", gpus: int | None = 2
            ) -> acc.NodeSetting:
    cfg = configs.acceptance().model_copy(update={"nodes": {"n1": acc.NodeRegistration(
        node_type=node_type, gpus=gpus)}})
    return acc.node_setting(cfg, configs.nodes(), "n1", "test")


def inventory(s: acc.NodeSetting, xml: str | None = None, error: str = "") -> acc.NodeInventory:
    return acc.build_inventory(
        s, smi_xml=xml if xml is not None or error else (HEALTHY / acc.RAW_SMI_XML).read_text(),
        smi_error=error, topo_text=None, topo_error="not read", nvlinks={0: 18, 1: 18},
        nvlink_error="", system={}, stack_facts={})


def by_name(checks) -> dict[str, acc.Check]:
    return {c.name: c for c in checks}


def write_acceptance(config_dir: Path, edit) -> None:
    path = config_dir / "acceptance.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))


def test_shipped_config_covers_every_node_type_and_merges_defaults(configs):
    cfg = configs.acceptance()
    assert set(cfg.node_types) == set(configs.nodes().node_types)
    h200 = cfg.node_types["h200"]
    assert h200.burn.matmul_tflops_min == 600
    assert h200.memory_bandwidth.hbm_gbps == 4800 and h200.pcie.min_width == 16
    assert cfg.node_types["b200"].burn.matmul_tflops_min is None
    assert "burn_tflops" in cfg.node_types["b200"].waivers  # ... and says why it is unjudged
    assert cfg.nodes == {}


def test_shipped_thresholds_are_the_procedures(configs):
    """The acceptance procedure's values, per node type; where the project holds another, the
    config names the procedure's value and why, and the source says both."""
    types = configs.acceptance().node_types
    for name, t in types.items():
        assert t.burn.temperature_max_c <= 83, name  # below the throttle point
        assert t.burn.power_min_fraction >= 0.95, name  # about TDP
        assert t.dcgm_diag_level_min == 3 and t.nic_mtu_min >= 9000, name
        assert t.pcie.aer_correctable_max <= 100 and t.host.edac_correctable_max == 0, name
        assert t.storage.direct_read_min_gbps >= 7.0 and t.storage.direct_write_min_gbps, name
        assert t.storage.s3_get_min_gbps >= 140 / 25, name  # 140 GB in 25 s at 100 Gbps
        assert "s3_get" not in t.waivers and "dcgm_diag" not in t.waivers, name
        for check, d in t.deviations.items():
            assert d.procedure in t.source(check) and d.why in t.source(check)
    for name in ("b200", "b300"):
        assert set(types[name].interconnect.allreduce_busbw_min_gbps.values()) == {720}
    assert types["b300"].driver_min == "580" and "driver" not in types["b300"].waivers
    assert types["h200"].interconnect.p2p_min_gbps < 450
    assert "450 GB/s" in types["h200"].deviations["p2p"].procedure


def test_a_check_not_made_blocks_unless_the_node_type_waives_it(configs):
    s = setting(configs)
    c = acc.Checker(s.thresholds)
    c.skip(2, "dcgm_diag", "DCGM is not installed")
    c.skip(2, "driver", "no driver_min configured")  # h200 waives it, with its reason
    c.skip(2, "nvlink", "1 GPU", required=False)  # nothing of the kind on the node
    dcgm, driver, nvlink = c.checks
    assert dcgm.required and dcgm.source.startswith("procedure: a full DCGM level-3 pass")
    assert not driver.required and "(waived: the procedure names a minimum driver only " \
        "for SM103" in driver.reason
    assert not nvlink.required and "waived" not in nvlink.reason
    qualified, reasons, _ = acc.verdict([acc.Check(phase=2, name="ecc",
                                                   status=acc.PASS), *c.checks])
    assert not qualified and reasons == ["phase 2 dcgm_diag: not checked: DCGM is not installed"]
    c.add(2, "driver", False, "570.1", ">= 580", "too old")  # a waiver does not excuse a fail
    assert c.checks[-1].status == acc.FAIL and c.checks[-1].required


def test_waivers_and_deviations_name_known_checks_and_say_why(config_dir, configs):
    write_acceptance(config_dir, lambda d: d["node_types"]["h200"].update(
        waivers={"dcgm": "typo"}))
    with pytest.raises(ConfigError, match="dcgm"):
        configs.acceptance()
    write_acceptance(config_dir, lambda d: d["node_types"]["h200"].update(
        waivers={"dcgm_diag": " "}))
    with pytest.raises(ConfigError, match="say why"):
        configs.acceptance()


def test_the_production_alarm_is_not_below_the_burn_limit(config_dir, configs):
    """acceptance.yaml holds two temperatures: the burn's limit (83 C, below the throttle
    point) and the procedure's production alarm (85 C), which the in-service alert fires at. An
    alarm below the burn limit would page for a node acceptance passed: refused."""
    h200 = configs.acceptance().node_types["h200"]
    assert (h200.burn.temperature_max_c, h200.gpu_temperature_alarm_c) == (83, 85)
    write_acceptance(config_dir, lambda d: d["node_types"]["h200"].update(
        gpu_temperature_alarm_c=80))
    with pytest.raises(ConfigError, match="gpu_temperature_alarm_c 80 is below "
                       "burn.temperature_max_c 83"):
        configs.acceptance()


def test_verdict_required_unread_and_any_fail_block():
    ok = acc.Check(phase=2, name="ecc", status=acc.PASS)
    waived = acc.Check(phase=1, name="nvme_smart", status=acc.NOT_CHECKED,
                       reason="not checked: no nvme tool (waived: a diskless node)",
                       required=False)
    assert acc.verdict([ok, waived])[0]
    required = acc.Check(phase=2, name="burn_xid", status=acc.NOT_CHECKED,
                         reason="not checked: no NVML events")
    qualified, reasons, _ = acc.verdict([ok, waived, required])
    assert not qualified and reasons == ["phase 2 burn_xid: not checked: no NVML events"]
    failed = acc.Check(phase=1, name="aer", status=acc.FAIL, measured="0000:19:00.0 3",
                       reason="fatal AER")
    assert not acc.verdict([ok, failed])[0]


def test_no_gpu_inventory_is_not_checked_never_passed(configs):
    s = setting(configs)
    inv = inventory(s, error="no GPU: nvidia-smi not found on PATH")
    assert inv.no_gpu.startswith("no GPU") and inv.gpu_count == 0
    names = {n for _, n in acc.INVENTORY_NO_GPU_CHECKS}
    gpu_rows = [c for c in inv.checks if c.name in names]
    assert len(gpu_rows) == len(names) and all(
        c.status == acc.NOT_CHECKED and (c.required or "(waived: " in c.reason) and
        "no GPU: nvidia-smi not found" in c.reason for c in gpu_rows)
    assert not any(c.status == acc.PASS for c in inv.checks)
    health = acc.build_health(s, inv, diag=None, diag_why="", level=3, burn=None, samples=(),
                              xids=(), telemetry_why="", xid_why="")
    assert {c.name for c in health.checks} == {*acc.HEALTH_CHECKS, "pcie_lnksta_load"}
    assert all(c.reason == f"not checked: {inv.no_gpu}" for c in health.checks)
    assert by_name(acc.build_interconnect(s, inv, None, "").checks)["interconnect"].status == \
        acc.NOT_CHECKED
    assert by_name(acc.build_memory(s, inv, None, "").checks)["hbm_copy"].reason.startswith(
        "not checked: no GPU")


def test_a_failing_nvidia_smi_is_a_failed_check(configs):
    inv = inventory(setting(configs), error="`nvidia-smi -q -x` exited 9: NVIDIA-SMI has "
                    "failed because it couldn't communicate with the NVIDIA driver")
    check = by_name(inv.checks)["nvidia_smi"]
    assert check.status == acc.FAIL and "couldn't communicate" in check.reason
    garbled = inventory(setting(configs), xml="<nvidia_smi_log><gpu>")
    assert by_name(garbled.checks)["nvidia_smi"].status == acc.FAIL


def test_an_unreadable_value_is_named_in_the_checks(configs):
    """GPU0's power limit is printed as words; the power check judges GPU1
    alone, so the checks' table must say which field of which GPU could not be read."""
    xml = (HEALTHY / acc.RAW_SMI_XML).read_text().replace(
        "<current_power_limit>700.00 W</current_power_limit>",
        "<current_power_limit>seven hundred W</current_power_limit>", 1)
    checks = by_name(inventory(setting(configs), xml=xml).checks)
    said = "GPU0 gpu_power_readings/current_power_limit: 'seven hundred W'"
    assert said in checks["nvidia_smi_values"].reason
    assert not checks["nvidia_smi_values"].required  # said, not a verdict of its own
    assert "GPU0 not read (gpu_power_readings/current_power_limit: 'seven hundred W')" in \
        checks["power_limit"].measured  # it judged GPU1 alone, and says so
    assert "nvidia_smi_values" not in by_name(inventory(setting(configs)).checks)


def test_gpus_of_another_type_fail_the_model_check(configs):
    inv = inventory(setting(configs, node_type="h100"))
    check = by_name(inv.checks)["gpu_model"]
    assert check.status == acc.FAIL and check.expected == "NVIDIA-H100-80GB-HBM3 81559 MiB"
    assert "GPU0 NVIDIA H200 143771 MiB" in check.reason


def test_one_gpu_node_interconnect_not_checked_and_not_required(configs):
    xml = (HEALTHY / acc.RAW_SMI_XML).read_text()
    one = xml.split("\t<gpu id=")[0] + "\t<gpu id=" + xml.split("\t<gpu id=")[1].split(
        "\t</gpu>")[0] + "\t</gpu>\n</nvidia_smi_log>\n"
    s = setting(configs, gpus=1)
    inv = inventory(s, xml=one)
    checks = by_name(inv.checks)
    assert checks["gpu_count"].status == acc.PASS
    assert checks["nvlink"].status == acc.NOT_CHECKED and not checks["nvlink"].required
    assert checks["fabric_manager"].status == acc.PASS  # reported Completed: still judged
    ic = by_name(acc.build_interconnect(s, inv, None, "").checks)["interconnect"]
    assert ic.reason == "not checked: 1 GPU" and not ic.required


def _burn_samples(seconds: float, temp_end: float, rising: bool) -> list[dict]:
    out = []
    for t in range(0, int(seconds) + 1, 5):
        temp = 30 + (temp_end - 30) * (t / seconds if rising else min(1.0, t / 60))
        out.append({"t_s": float(t), "gpu": 0, tm.POWER_W: 680.0, tm.GPU_TEMP_C: temp,
                    tm.SM_CLOCK_MHZ: 1800.0, tm.CLOCK_REASONS: 4.0, tm.ECC_DBE_VOL: 0.0})
    return out


def _health(s, inv, samples, seconds, telemetry_why="", xid_why=""):
    burn = {"duration_s": seconds, "per_gpu": [{"gpu": g.index, "iterations": 10, "errors": 0,
                                                "checks": 3, "tflops": 700.0}
                                               for g in inv.smi.gpus]}
    return by_name(acc.build_health(s, inv, diag=None, diag_why="no dcgmi", level=3, burn=burn,
                                    samples=samples, xids=(), telemetry_why=telemetry_why,
                                    xid_why=xid_why).checks)


def test_a_short_burn_fails_its_duration_and_has_no_plateau(configs):
    s = setting(configs, gpus=1)
    inv = inventory(s)
    checks = _health(s, inv, _burn_samples(45, 60, rising=True), 45.0)
    assert checks["burn_duration"].status == acc.FAIL
    assert "45 s is shorter than the 3600 s" in checks["burn_duration"].reason
    assert checks["burn_temperature"].status == acc.NOT_CHECKED
    assert "no plateau yet" in checks["burn_temperature"].reason
    assert checks["burn_power"].status == acc.PASS and checks["burn_clocks"].status == acc.PASS
    assert checks["dcgm_diag"].reason == "not checked: no dcgmi"


def test_still_rising_after_the_window_is_no_plateau_and_flat_is_one(configs):
    s = setting(configs, gpus=1)
    inv = inventory(s)
    rising = _health(s, inv, _burn_samples(3600, 80, rising=True), 3600.0)["burn_temperature"]
    assert rising.status == acc.NOT_CHECKED and "C/min" in rising.reason
    flat = _health(s, inv, _burn_samples(3600, 80, rising=False), 3600.0)["burn_temperature"]
    assert flat.status == acc.PASS and flat.measured == "GPU0 80 C"


def test_without_telemetry_or_xid_events_those_checks_are_not_made(configs):
    s = setting(configs, gpus=1)
    checks = _health(s, inventory(s), [], 3600.0, telemetry_why="NVML did not initialise",
                     xid_why="NVML XID events unavailable (Not Supported)")
    for name in ("burn_ecc", "burn_temperature", "burn_clocks", "burn_power"):
        assert checks[name].reason == "not checked: no telemetry: NVML did not initialise"
        assert checks[name].required
    assert checks["burn_xid"].status == acc.NOT_CHECKED
    assert checks["burn_compute"].status == acc.PASS


def test_a_gpu_job_that_died_fails_its_checks(configs):
    s = setting(configs)
    inv = inventory(s)
    burn = {"error": "burn exited with code 1; log ...: CUDA error: an illegal memory access"}
    checks = by_name(acc.build_health(s, inv, diag=None, diag_why="x", level=3, burn=burn,
                                      samples=(), xids=(), telemetry_why="", xid_why="").checks)
    assert checks["burn_compute"].status == acc.FAIL and "illegal memory" in \
        checks["burn_compute"].reason
    ic = acc.build_interconnect(s, inv, {"error": "interconnect exited with code 1: NCCL "
                                         "error"}, "")
    assert by_name(ic.checks)["interconnect"].status == acc.FAIL


def test_storage_checks(configs):
    s = setting(configs)
    slow = by_name(acc.build_storage(s, {"path": "/data", "bytes": 1 << 30, "seconds": 1.0,
                                         "gbps": 1.07}, {"why_not": "no s3_object configured "
                                                         "in acceptance.yaml probe"}).checks)
    assert slow["direct_io_read"].status == acc.FAIL and "1.07 GB/s" in \
        slow["direct_io_read"].reason
    assert slow["s3_get"].status == acc.NOT_CHECKED and slow["s3_get"].required  # blocks
    assert slow["direct_io_write"].status == acc.NOT_CHECKED  # nothing written: not passed
    broken = by_name(acc.build_storage(s, {"why_not": "O_DIRECT is not supported on /tmp"},
                                       {"uri": "s3://m/x", "error": "s3://m/x: the bucket "
                                        "does not exist"}).checks)
    assert broken["direct_io_read"].status == acc.NOT_CHECKED and \
        broken["direct_io_read"].required
    assert broken["s3_get"].status == acc.FAIL


def test_direct_read_is_judged_from_the_bytes_and_seconds_the_probe_measured(configs):
    """The verdict comes from the raw measurement (bytes read, seconds taken), so a recorded
    set can be re-judged from what the probe measured; a rate stored beside them is not read."""
    s = setting(configs)
    nothing = {"why_not": "no s3_object configured in acceptance.yaml probe"}
    fast = by_name(acc.build_storage(s, {"path": "/data", "bytes": 8 << 30, "seconds": 1.0,
                                         "write_bytes": 8 << 30, "write_seconds": 2.0},
                                     nothing).checks)
    assert fast["direct_io_read"].status == acc.PASS
    assert fast["direct_io_read"].measured == "8.59 GB/s (8.0 GiB, O_DIRECT)"
    assert fast["direct_io_write"].status == acc.FAIL  # 4.29 GB/s: under the Gen4 write floor
    assert "is 4.29 GB/s" in fast["direct_io_write"].reason
    typed = by_name(acc.build_storage(s, {"path": "/data", "bytes": 1 << 30, "seconds": 1.0,
                                          "gbps": 9.9}, nothing).checks)["direct_io_read"]
    assert typed.status == acc.FAIL and "1.07 GB/s" in typed.reason


def test_acceptance_without_an_upstream_says_which(configs):
    s = setting(configs)
    result = acc.build_acceptance(s, {"node_inventory": inventory(s)}, 1.0)
    missing = [c for c in result.checks if "never materialized" in c.reason]
    assert {c.name for c in missing} == {"gpu_health", "interconnect", "memory_bandwidth",
                                         "storage_read"}
    assert not result.qualified and result.stack_fingerprint == acc.stack_fingerprint({})


def test_stale_reasons_name_what_changed():
    before = {"nvidia_driver": "580.95.05", "cuda_driver_api": "13.0", "gpus": ["NVIDIA H200"]}
    assert acc.stale_reasons(before, dict(before)) == []
    after = {**before, "nvidia_driver": "590.44.01"}
    assert acc.stale_reasons(before, after) == ["nvidia_driver: 580.95.05 -> 590.44.01"]


def test_only_the_burns_own_span_is_judged(configs):
    """The job starts CUDA before it computes and the sampler outlives it: idle samples before
    `window_s` (345 MHz, 70 W) and after it are not a clock collapse."""
    s = setting(configs, gpus=1)
    inv = inventory(s)
    samples = []
    for t in range(0, 3700, 5):
        busy = 15 <= t <= 3630
        samples += [{"t_s": float(t), "gpu": g, tm.POWER_W: 680.0 if busy else 70.0,
                     tm.GPU_TEMP_C: 70.0 if busy else 35.0,
                     tm.SM_CLOCK_MHZ: 1800.0 if busy else 345.0,
                     tm.CLOCK_REASONS: 4.0 if busy else 1.0} for g in (0, 1)]
    burn = {"duration_s": 3615.0, "window_s": [15.0, 3630.0],
            "per_gpu": [{"gpu": g, "iterations": 10, "errors": 0, "checks": 3,
                         "tflops": 700.0} for g in (0, 1)]}

    def judged(b):
        return by_name(acc.build_health(s, inv, diag=None, diag_why="x", level=3, burn=b,
                                        samples=samples, xids=(), telemetry_why="",
                                        xid_why="").checks)

    within = judged(burn)
    assert within["burn_clocks"].status == acc.PASS and within["burn_power"].status == acc.PASS
    assert within["burn_temperature"].status == acc.PASS
    whole = judged({k: v for k, v in burn.items() if k != "window_s"})
    assert whole["burn_clocks"].status == acc.FAIL  # what the idle lead-in would have said
