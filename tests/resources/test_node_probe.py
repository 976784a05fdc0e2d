"""NodeProbe on this machine: sysfs read from a crafted tree, the tools absent or replaced by a
fake nvidia-smi that replays a recorded set (a GPU cannot exist here), a real O_DIRECT read, S3
GETs against the real SeaweedFS, and the GPU job runner's failure paths with the real worker.
The live GPU path is marked `gpu` and runs only where there is one."""

import json
import shutil
import stat
import sys
from pathlib import Path

import pytest

from onboarding.nodes import acceptance as acc
from onboarding.nodes import host_tools as ht
from onboarding.nodes.facts import parse_smi_xml
from resources.node_probe import NodeProbe, read_system
from resources.telemetry import GpuTelemetry

DATA = Path(__file__).parents[1] / "data" / "acceptance" / "crafted-h200x2-healthy"
PROBE = acc.ProbeSettings(burn_s=5, direct_read_gib=1 / 16, direct_read_block_mib=4,
                          direct_read_threads=4, copy_mib=64, copy_iters=2,
                          gpu_job_timeout_s=120)


def log(msg: str) -> None:
    print(msg)


def _files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def crafted_sysfs(root: Path) -> Path:
    """The sysfs files read_system reads, laid out as the kernel does."""
    _files(root, {
        "devices/system/cpu/cpu0/topology/physical_package_id": "0\n",
        "devices/system/cpu/cpu1/topology/physical_package_id": "1\n",
        "devices/system/node/node0/cpulist": "0-55,112-167\n",
        "devices/system/node/node1/cpulist": "56-111,168-223\n",
        "devices/pci0000:17/0000:1a:00.0/current_link_speed": "32.0 GT/s PCIe\n",
        "devices/pci0000:17/0000:1a:00.0/max_link_speed": "32.0 GT/s PCIe\n",
        "devices/pci0000:17/0000:1a:00.0/current_link_width": "8\n",
        "devices/pci0000:17/0000:1a:00.0/max_link_width": "16\n",
        "class/net/ib0/mtu": "4092\n", "class/net/ib0/operstate": "up\n",
        "class/net/lo/mtu": "65536\n",
        "devices/system/edac/mc/mc0/ue_count": "0\n", "devices/system/edac/mc/mc0/ce_count": "5\n",
        "devices/system/edac/mc/mc1/ue_count": "1\n", "devices/system/edac/mc/mc1/ce_count": "0\n",
        "bus/pci/devices/0000:19:00.0/aer_dev_fatal":
            "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nTOTAL_ERR_FATAL 0\n",
        "bus/pci/devices/0000:19:00.0/aer_dev_nonfatal": "UnsupReq 2\nTOTAL_ERR_NONFATAL 2\n",
        "bus/pci/devices/0000:19:00.0/aer_dev_correctable": "RxErr 0\nTOTAL_ERR_COR 7\n",
        "class/nvme/nvme0/model": "SAMSUNG MZWLO3T8HCLS-00A07\n",
    })
    (root / "class/net/ib0/device").symlink_to(root / "devices/pci0000:17/0000:1a:00.0")
    return root


def fake_tool(path: Path, body: str) -> str:
    """A stand-in for a tool of hardware this machine does not have (named FAKE in its text)."""
    path.write_text("#!/bin/sh\n# FAKE: replays recorded output; no such device here\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_system_facts_from_sysfs(tmp_path):
    nvme = fake_tool(tmp_path / "nvme", 'echo \'{"critical_warning":0,"media_errors":3,'
                     '"percent_used":2,"avail_spare":97,"spare_thresh":10}\'\n')
    system = read_system(crafted_sysfs(tmp_path / "sys"), nvme)
    assert system["cpu_sockets"] == 2 and system["numa_nodes"]["node1"] == "56-111,168-223"
    [nic] = system["nics"]  # lo has no device
    assert nic == {"name": "ib0", "mtu": 4092, "operstate": "up", "pci": "0000:1a:00.0",
                   "speed": "32.0 GT/s PCIe", "max_speed": "32.0 GT/s PCIe", "width": 8,
                   "max_width": 16}
    assert system["edac"][1] == {"device": "mc1", "uncorrectable": 1, "correctable": 0}
    assert system["aer"] == [{"device": "0000:19:00.0", "uncorrectable": 2, "correctable": 7}]
    assert system["nvme"] == [{"device": "nvme0", "critical_warning": 0, "media_errors": 3,
                               "percent_used": 2, "available_spare": 97,
                               "spare_threshold": 10}]


def test_unreadable_system_parts_say_why(tmp_path):
    system = read_system(tmp_path / "empty-sys", None)
    assert system["nics"] == [] and "no network interface" in system["nics_error"]
    assert system["edac"] is None and "EDAC" in system["edac_error"]
    assert system["aer"] is None and system["nvme"] is None
    assert system["nvme_error"] == "no `nvme` tool (nvme-cli) on PATH"


def test_inventory_without_nvidia_smi_is_no_gpu(tmp_path):
    raw = NodeProbe(nvidia_smi=str(tmp_path / "absent" / "nvidia-smi"),
                    sys_root=str(tmp_path)).inventory(tmp_path / "keep")
    assert raw.smi_xml is None and raw.smi_error.startswith("no GPU: nvidia-smi not found")
    assert json.loads((tmp_path / "keep" / acc.RAW_SYSTEM).read_text())["nics"] == []


def replay_smi(tmp_path: Path, exit_code: int = 0) -> str:
    xml, topo = DATA / acc.RAW_SMI_XML, DATA / acc.RAW_TOPO
    return fake_tool(tmp_path / "nvidia-smi", f"""
[ {exit_code} -ne 0 ] && {{ echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2; exit {exit_code}; }}
case "$1" in
  -q) cat {xml} ;;
  topo) cat {topo} ;;
  --query-gpu=*) echo "580.95.05, NVIDIA H200"; echo "580.95.05, NVIDIA H200" ;;
  *) echo "| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |" ;;
esac
""")


def test_inventory_keeps_every_raw_output(tmp_path):
    keep = tmp_path / "keep"
    raw = NodeProbe(nvidia_smi=replay_smi(tmp_path), sys_root=str(crafted_sysfs(
        tmp_path / "sys"))).inventory(keep)
    assert raw.smi_error == "" and len(parse_smi_xml(raw.smi_xml).gpus) == 2
    assert (keep / acc.RAW_SMI_XML).read_text() == (DATA / acc.RAW_SMI_XML).read_text()
    assert (keep / acc.RAW_TOPO).read_text() == (DATA / acc.RAW_TOPO).read_text()
    assert raw.stack_facts == {"nvidia_driver": "580.95.05", "cuda_driver_api": "13.0",
                               "gpus": ["NVIDIA H200", "NVIDIA H200"]}
    # NVML cannot initialise without a driver: the NVLink check falls back to the topology
    assert raw.nvlinks == {} and raw.nvlink_error
    assert json.loads((keep / acc.RAW_NVML).read_text())["error"] == raw.nvlink_error


def test_a_failing_nvidia_smi_is_reported_with_its_error(tmp_path):
    raw = NodeProbe(nvidia_smi=replay_smi(tmp_path, exit_code=9),
                    sys_root=str(tmp_path)).inventory(None)
    assert raw.smi_xml is None and "exited 9" in raw.smi_error
    assert "couldn't communicate with the NVIDIA driver" in raw.smi_error


def test_dcgm_diag_absent_or_off(tmp_path):
    probe = NodeProbe(dcgmi=str(tmp_path / "no-dcgmi"))
    assert probe.dcgm_diag(0, None, 10)[1] == "dcgm_diag_level is 0 in acceptance.yaml"
    if shutil.which("dcgmi") is None:
        assert "DCGM is not installed" in NodeProbe().dcgm_diag(3, None, 10)[1]
    replay = fake_tool(tmp_path / "dcgmi", f"cat {DATA / acc.RAW_DCGM}\n")
    diag, why = NodeProbe(dcgmi=replay).dcgm_diag(3, tmp_path, 10)
    assert why == "" and diag.version == "4.2.3" and not diag.failed()
    garbage = fake_tool(tmp_path / "dcgmi-broken", "echo 'Error: unable to connect to host "
                        "engine'; exit 1\n")
    diag, why = NodeProbe(dcgmi=garbage).dcgm_diag(3, None, 10)
    assert diag is None and "exited 1 without results" in why and "host engine" in why


def test_direct_io_read_of_the_cache_path(tmp_path):
    result = NodeProbe().direct_read(tmp_path / "cache", PROBE, log)
    assert result["bytes"] == 64 << 20 and result["gbps"] > 0 and result["threads"] == 4
    # written with O_DIRECT first where the file system allows it (the write check's figure)
    assert result.get("write_bytes", 64 << 20) == 64 << 20
    assert "write_seconds" not in result or result["write_seconds"] > 0
    assert not any((tmp_path / "cache").iterdir())  # the scratch file is gone


def test_host_tools_are_kept_as_recordings_and_replayed(tmp_path):
    """Every command of acc.TOOL_COMMANDS runs through the shell here and is kept as a
    recording that reads back the same; a directory of recordings replays instead."""
    runs = NodeProbe().host_tools(tmp_path / "keep", 0, log)
    assert set(runs) == set(acc.TOOL_COMMANDS)  # no stress asked for: none run
    kept = ht.load_recordings(tmp_path / "keep")
    assert kept == runs
    assert runs["uname"].exit_code == 0 and runs["uname"].output.strip()
    replayed = NodeProbe(tool_recordings=str(DATA)).host_tools(tmp_path / "again", 600, log)
    assert replayed["stress-ng"].command.startswith("stress-ng")  # the recording, not a run
    assert ht.load_recordings(tmp_path / "again") == replayed


def test_direct_io_read_refuses_without_room(tmp_path):
    huge = PROBE.model_copy(update={"direct_read_gib": 1e6})
    assert "GiB free" in NodeProbe().direct_read(tmp_path, huge, log)["why_not"]


def test_s3_get_throughput_from_the_real_server(s3_store, unique_prefix):
    key = unique_prefix + "probe.bin"
    s3_store.client().put_object(Bucket="models", Key=key, Body=b"x" * (5 << 20))
    probe = NodeProbe()
    got = probe.s3_get(s3_store, f"s3://models/{key}", 3 << 20)
    assert got["bytes"] == 3 << 20 and got["gbps"] > 0 and got["concurrency"] == 8
    whole = probe.s3_get(s3_store, f"s3://models/{key}", 1 << 40)
    assert whole["bytes"] == 5 << 20
    missing = probe.s3_get(s3_store, f"s3://models/{unique_prefix}absent", 1 << 20)
    assert "error" in missing and "absent" in missing["error"]
    assert "no s3_object" in probe.s3_get(s3_store, "", 1)["why_not"]


def test_a_gpu_job_without_cuda_fails_with_the_workers_own_error(tmp_path):
    """The real worker, in this interpreter (CPU torch): the error says why, from its log."""
    result = NodeProbe().copy_bandwidth([0], PROBE, tmp_path, log)
    assert "copy exited with code 1" in result["error"]
    assert "CUDA" in result["error"] or "cuda" in result["error"]
    assert (tmp_path / "gpu-job-copy.log").is_file()


@pytest.mark.waits
def test_a_hung_gpu_job_is_killed_at_its_timeout(tmp_path):
    hang = tmp_path / "hang.py"
    hang.write_text("import time\ntime.sleep(600)\n")
    slow = fake_tool(tmp_path / "python", f'exec {sys.executable} {hang}\n')
    short = PROBE.model_copy(update={"gpu_job_timeout_s": 1.0})
    result = NodeProbe(python=slow).copy_bandwidth([0], short, tmp_path, log)
    assert result["error"].startswith("copy did not finish within 1 s")


def test_burn_without_telemetry_says_why(tmp_path):
    """No NVML here: the burn's telemetry is unavailable with the reason (the job itself fails
    for want of CUDA), and the raw burn file records both."""
    probe = NodeProbe(telemetry=GpuTelemetry(interval_s=0.1))
    run = probe.burn([0], PROBE.model_copy(update={"matmul_size": 256}), 0.5, 1e-3, tmp_path,
                     log)
    assert run.telemetry_why and run.samples == [] and "error" in run.result
    kept = json.loads((tmp_path / acc.RAW_BURN).read_text())
    assert kept["telemetry_unavailable"] == run.telemetry_why and kept["samples"] == []
    # the PCIe links read again while the job ran (half the burn in: it was still starting),
    # kept as recordings beside it, and when on the samples' clock
    assert set(run.links) == set(acc.LOAD_LINK_COMMANDS)
    assert ht.load_recordings(tmp_path).keys() >= set(acc.LOAD_LINK_COMMANDS)
    assert 0.2 <= kept["result"]["links_read_s"] < 5.0


def test_links_under_load_replay_from_recordings(tmp_path):
    replayed = NodeProbe(tool_recordings=str(DATA)).links_under_load(tmp_path)
    assert set(replayed) == {"lspci-vvv-load"}  # the crafted set holds lspci's read only
    assert "Speed 32GT/s, Width x16" in replayed["lspci-vvv-load"].output


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU (CI is "
                    "CPU-only); scripts/gpu_node_probe.py runs this on an H200")
def test_live_burn_copy_on_the_gpu(tmp_path):
    probe = NodeProbe(telemetry=GpuTelemetry(interval_s=0.5))
    run = probe.burn([0], PROBE.model_copy(update={"matmul_size": 4096}), 5.0, 1e-3, tmp_path,
                     log)
    assert "error" not in run.result, run.result
    [g] = run.result["per_gpu"]
    assert g["iterations"] > 0 and g["errors"] == 0 and g["reference_ok"]
    assert run.samples and "DCGM_FI_DEV_POWER_USAGE" in run.samples[-1]
    start, end = run.result["window_s"]
    assert start <= run.result["links_read_s"] <= end and run.links  # read while it computed
    copy = probe.copy_bandwidth([0], PROBE, tmp_path, log)
    assert copy["per_gpu"][0]["verified"] and copy["per_gpu"][0]["copy_gbps"] > 100
