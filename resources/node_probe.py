"""The node probe: runs what node acceptance reads and measures, on the node itself.

Tools where they exist (`nvidia-smi -q -x`, `nvidia-smi topo -m`, `dcgmi diag -j`, `nvme
smart-log`), NVML through nvidia-ml-py, sysfs, GPU work in its own process
(resources/gpu_jobs.py: a matmul burn, device-to-device copies, P2P and NCCL all-reduce) while
the shared telemetry sampler (resources/telemetry.py) records power, temperature, clocks, XIDs
and ECC counters, a direct-I/O read of the cache path, and S3 GETs through `S3ObjectStore`.

Every raw output is written to the `keep` directory a method is given (the node assets keep
them beside the report; scripts/gpu_node_probe.py copies them out as test data). Absence is
reported with its reason (`no GPU: nvidia-smi not found`), a tool that is present and fails
with its error; judging either is onboarding.nodes.acceptance's job.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from onboarding.common.errors import FetchError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.processes import free_port, log_tail, reap_group
from onboarding.nodes import acceptance as acc
from onboarding.nodes import telemetry as tm
from onboarding.nodes.acceptance import NO_GPU
from onboarding.nodes.facts import FormatError, parse_dcgm_diag
from onboarding.nodes.host_tools import ToolRun, load_recordings, render_recording
from resources.s3 import S3ObjectStore
from resources.stack_facts import nvidia_facts
from resources.telemetry import GpuTelemetry

TOOL_TIMEOUT_S = 120.0

Log = Callable[[str], Any]


@dataclass(kw_only=True)
class RawInventory:
    smi_xml: str | None
    smi_error: str  # "no GPU: ..." when the node has none, the tool's error when it failed
    topo_text: str | None
    topo_error: str
    nvlinks: dict[int, int]
    nvlink_error: str
    system: dict[str, Any]
    stack_facts: dict[str, Any]
    tools: dict[str, ToolRun] = field(default_factory=dict)


@dataclass
class BurnRun:
    result: dict[str, Any]
    samples: list[dict] = field(default_factory=list)
    xids: list[dict] = field(default_factory=list)
    telemetry_why: str = ""  # why nothing was sampled
    xid_why: str = ""  # why XIDs were not watched
    links: dict[str, ToolRun] = field(default_factory=dict)  # PCIe links read under load


# When the burn reads the PCIe links again: once the sampler sees every GPU busy (an idle link
# trained down is back at speed by then), and at the latest this many seconds after the job
# starts, or half the burn if that is shorter (no telemetry; the verdict checks the time
# against the burn's compute window).
LINK_READ_AFTER_S = 120.0
BUSY_UTIL_PCT = 50.0


def _write(keep: Path | None, name: str, data: str | dict | list, compact: bool = False) -> None:
    if keep is None:
        return
    keep.mkdir(parents=True, exist_ok=True)
    (keep / name).write_text(data if isinstance(data, str) else json.dumps(
        data, indent=None if compact else 1, separators=(",", ":") if compact else None))


def _run(argv: list[str], timeout_s: float = TOOL_TIMEOUT_S) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return -1, "", f"timed out after {timeout_s:.0f} s"
    return p.returncode, p.stdout, p.stderr


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int_file(path: Path) -> int | None:
    value = _read(path)
    return int(value) if value and value.lstrip("-").isdigit() else None


def _aer_total(path: Path, key: str) -> int:
    for line in (_read(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


def read_system(sys_root: Path, nvme: str | None) -> dict[str, Any]:
    """CPU sockets and NUMA nodes, NIC links and MTUs, EDAC and AER counters from sysfs, NVMe
    SMART through nvme-cli; each part None with `<part>_error` when it cannot be read."""
    out: dict[str, Any] = {}
    cpus = sys_root / "devices/system/cpu"
    packages = {_read(p) for p in cpus.glob("cpu[0-9]*/topology/physical_package_id")}
    out["cpu_sockets"] = len(packages - {None}) or None
    out["numa_nodes"] = {p.name: _read(p / "cpulist")
                         for p in sorted((sys_root / "devices/system/node").glob("node[0-9]*"))}
    nics = []
    for iface in sorted((sys_root / "class/net").glob("*")):
        dev = iface / "device"
        if not dev.exists():
            continue  # virtual interfaces (lo, bridges, veth) have no device
        nics.append({"name": iface.name, "mtu": _int_file(iface / "mtu"),
                     "operstate": _read(iface / "operstate"),
                     "pci": os.path.basename(os.path.realpath(dev)),
                     "speed": _read(dev / "current_link_speed"),
                     "max_speed": _read(dev / "max_link_speed"),
                     "width": _int_file(dev / "current_link_width"),
                     "max_width": _int_file(dev / "max_link_width")})
    out["nics"] = nics
    if not nics:
        out["nics_error"] = f"no network interface with a device under {sys_root}/class/net"
    mcs = sorted((sys_root / "devices/system/edac/mc").glob("mc[0-9]*"))
    out["edac"] = [{"device": mc.name, "uncorrectable": _int_file(mc / "ue_count") or 0,
                    "correctable": _int_file(mc / "ce_count") or 0} for mc in mcs] or None
    if not mcs:
        out["edac_error"] = "no EDAC memory controller (no EDAC driver, or a VM)"
    aer = []
    for dev in sorted((sys_root / "bus/pci/devices").glob("*")):
        if not (dev / "aer_dev_fatal").exists():
            continue
        aer.append({"device": dev.name,
                    "uncorrectable": _aer_total(dev / "aer_dev_fatal", "TOTAL_ERR_FATAL")
                    + _aer_total(dev / "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
                    "correctable": _aer_total(dev / "aer_dev_correctable", "TOTAL_ERR_COR")})
    out["aer"] = aer or None
    if not aer:
        out["aer_error"] = "no PCIe AER counters exposed in sysfs"
    drives = sorted(p.name for p in (sys_root / "class/nvme").glob("nvme[0-9]*"))
    if nvme is None:
        out["nvme"], out["nvme_error"] = None, "no `nvme` tool (nvme-cli) on PATH"
    elif not drives:
        out["nvme"], out["nvme_error"] = None, "no NVMe controller in sysfs"
    else:
        out["nvme"] = []
        for d in drives:
            code, stdout, stderr = _run([nvme, "smart-log", f"/dev/{d}", "-o", "json"])
            if code != 0:
                out["nvme"], out["nvme_error"] = None, f"nvme smart-log /dev/{d}: {stderr[-300:]}"
                break
            smart = json.loads(stdout)
            # nvme-cli's JSON keys (nvme-print-json.c): avail_spare, spare_thresh
            out["nvme"].append({"device": d, "critical_warning": smart.get("critical_warning"),
                                "media_errors": smart.get("media_errors"),
                                "percent_used": smart.get("percent_used"),
                                "available_spare": smart.get("avail_spare"),
                                "spare_threshold": smart.get("spare_thresh")})
    return out


def _nvlinks() -> tuple[dict[int, int], str]:
    """Active NVLinks per GPU through NVML; ({}, why) when NVML or NVLink is unavailable."""
    try:
        import pynvml as n
    except ImportError as exc:
        return {}, f"nvidia-ml-py not importable ({exc})"
    try:
        n.nvmlInit()
    except n.NVMLError as exc:
        return {}, f"NVML did not initialise ({exc})"
    try:
        out: dict[int, int] = {}
        for g in range(n.nvmlDeviceGetCount()):
            h, active = n.nvmlDeviceGetHandleByIndex(g), 0
            for link in range(n.NVML_NVLINK_MAX_LINKS):
                try:
                    active += n.nvmlDeviceGetNvLinkState(h, link) == n.NVML_FEATURE_ENABLED
                except n.NVMLError:
                    break
            out[g] = active
        if not any(out.values()):
            return {}, "no active NVLink reported by NVML"
        return out, ""
    finally:
        n.nvmlShutdown()


class NodeProbe(dg.ConfigurableResource):
    """Reads and measures the node this step runs on. Local and production differ in config."""

    nvidia_smi: str = Field(default="", description="nvidia-smi path; empty = from PATH")
    dcgmi: str = Field(default="", description="dcgmi path; empty = from PATH")
    nvme: str = Field(default="", description="nvme-cli path; empty = from PATH")
    sys_root: str = Field(default="/sys", description="sysfs root (tests use a crafted tree)")
    tool_recordings: str = Field(default="", description="a directory of `<name>.txt` "
                                 "recordings read instead of running the host tools (tests "
                                 "replay a recorded node); empty = run them")
    python: str = Field(default="", description="interpreter for the GPU jobs (needs torch with "
                        "CUDA); empty = this process's")
    telemetry: GpuTelemetry = Field(default_factory=GpuTelemetry)

    def _tool(self, configured: str, name: str) -> str | None:
        return configured or shutil.which(name)

    # ---- node_inventory ----

    def host_tools(self, keep: Path | None, stress_s: float, log: Log) -> dict[str, ToolRun]:
        """Every command of acc.TOOL_COMMANDS through the shell, then the stress between two
        EDAC reads; each kept as `<name>.txt` in the recording format (a tool that is absent
        exits 127, which the checks read as "not checked")."""
        if self.tool_recordings:
            runs = load_recordings(Path(self.tool_recordings))
            for run in runs.values():
                _write(keep, f"{run.name}.txt", render_recording(run.command, run.output,
                                                                 run.exit_code))
            return runs
        runs = {name: self._shell(name, cmd, keep) for name, cmd in acc.TOOL_COMMANDS.items()}
        if stress_s > 0:
            log(f"stress-ng for {stress_s:.0f} s (CPU and memory)")
            cmd = acc.STRESS_COMMAND.format(stress_s=f"{stress_s:.0f}")
            runs["stress-ng"] = self._shell("stress-ng", cmd, keep, stress_s + TOOL_TIMEOUT_S)
            runs["edac-after"] = self._shell("edac-after", acc.TOOL_COMMANDS["edac-before"],
                                             keep)
        return runs

    def _shell(self, name: str, command: str, keep: Path | None,
               timeout_s: float = TOOL_TIMEOUT_S) -> ToolRun:
        code, out, err = _run(["bash", "-c", command + " 2>&1"], timeout_s)
        text = out + err
        _write(keep, f"{name}.txt", render_recording(command, text, code))
        return ToolRun(name, command, text.rstrip("\n"), code)

    def inventory(self, keep: Path | None, stress_s: float = 0.0, log: Log = print
                  ) -> RawInventory:
        smi = self._tool(self.nvidia_smi, "nvidia-smi")
        system = read_system(Path(self.sys_root), self._tool(self.nvme, "nvme"))
        _write(keep, acc.RAW_SYSTEM, system)
        tools = self.host_tools(keep, stress_s, log)
        if smi is None or not Path(smi).exists():
            why = f"{NO_GPU}: nvidia-smi not found ({smi or 'not on PATH'})"
            return RawInventory(smi_xml=None, smi_error=why, topo_text=None, topo_error=why,
                                nvlinks={}, nvlink_error=why, system=system,
                                stack_facts=nvidia_facts(None), tools=tools)
        code, xml, err = _run([smi, "-q", "-x"])
        if code != 0:
            return RawInventory(
                smi_xml=None, smi_error=f"`nvidia-smi -q -x` exited {code}: {(err or xml)[-500:]}",
                topo_text=None, topo_error="", nvlinks={}, nvlink_error="", system=system,
                stack_facts={}, tools=tools)
        _write(keep, acc.RAW_SMI_XML, xml)
        code, topo, err = _run([smi, "topo", "-m"])
        topo_error = "" if code == 0 else f"`nvidia-smi topo -m` exited {code}: {err[-300:]}"
        if code == 0:
            _write(keep, acc.RAW_TOPO, topo)
        nvlinks, nvlink_error = _nvlinks()
        _write(keep, acc.RAW_NVML, {"nvlinks_active": nvlinks, "error": nvlink_error})
        return RawInventory(smi_xml=xml, smi_error="", topo_text=topo if code == 0 else None,
                            topo_error=topo_error, nvlinks=nvlinks, nvlink_error=nvlink_error,
                            system=system, stack_facts=nvidia_facts(smi), tools=tools)

    # ---- gpu_health ----

    def dcgm_diag(self, level: int, keep: Path | None, timeout_s: float) -> tuple[Any, str]:
        """(parsed DcgmDiag, "") or (None, why it was not run or could not be read)."""
        dcgmi = self._tool(self.dcgmi, "dcgmi")
        if level == 0:
            return None, "dcgm_diag_level is 0 in acceptance.yaml"
        if dcgmi is None:
            return None, "DCGM is not installed (no dcgmi on PATH); the burn stands in"
        code, out, err = _run([dcgmi, "diag", "-r", str(level), "-j"], timeout_s)
        _write(keep, acc.RAW_DCGM, out or err)
        try:
            return parse_dcgm_diag(out), ""
        except FormatError as exc:
            return None, (f"dcgmi diag -r {level} exited {code} without results ({exc}): "
                          f"{(err or out)[-300:]}")

    def links_under_load(self, keep: Path | None) -> dict[str, ToolRun]:
        """`lspci -vvv` and the sysfs link registers again (acc.LOAD_LINK_COMMANDS), called while
        the GPUs compute; replayed from `tool_recordings` where set."""
        if self.tool_recordings:
            return {k: v for k, v in load_recordings(Path(self.tool_recordings)).items()
                    if k in acc.LOAD_LINK_COMMANDS}
        return {name: self._shell(name, cmd, keep)
                for name, cmd in acc.LOAD_LINK_COMMANDS.items()}

    def burn(self, gpus: list[int], probe: acc.ProbeSettings, duration_s: float,
             tolerance: float, keep: Path | None, log: Log) -> BurnRun:
        sampler = self.telemetry.sampler(gpus, probe.sample_interval_s).start()
        links: dict[str, ToolRun] = {}
        read_at: list[float] = []
        done = threading.Event()

        def read_links() -> None:
            latest = min(duration_s / 2, LINK_READ_AFTER_S)
            while not done.wait(0.5):
                busy = {int(x["gpu"]) for x in sampler.samples[-4 * len(gpus):]
                        if (x.get(tm.GPU_UTIL_PCT) or 0) >= BUSY_UTIL_PCT}
                if busy >= set(gpus) or sampler.elapsed_s() >= latest:
                    read_at.append(sampler.elapsed_s())
                    links.update(self.links_under_load(keep))
                    return

        reader = threading.Thread(target=read_links, name="pcie-under-load", daemon=True)
        reader.start()
        try:
            result = self._gpu_job("burn", {
                "gpus": gpus, "matmul_size": probe.matmul_size, "duration_s": duration_s,
                "tolerance": tolerance}, duration_s + probe.gpu_job_timeout_s, keep, log)
        finally:
            done.set()
            reader.join()
            samples = sampler.stop()
        if "started_at" in result:  # where the burn computed, on the samples' clock
            result["window_s"] = [sampler.at(result["started_at"]), sampler.at(result["ended_at"])]
        if read_at:  # when the links were read, on the same clock
            result["links_read_s"] = round(read_at[0], 3)
        run = BurnRun(result, samples, sampler.xids, sampler.unavailable or (
            "" if samples else "the sampler read nothing"), sampler.xid_watch or
            sampler.unavailable, links)
        _write(keep, acc.RAW_BURN, {"result": result, "xids": run.xids,
                                    "telemetry_unavailable": run.telemetry_why,
                                    "xid_watch": run.xid_why,
                                    "unreadable_fields": sampler.unreadable,
                                    "samples": samples}, compact=True)
        return run

    # ---- interconnect, memory_bandwidth ----

    def interconnect(self, gpus: list[int], groups: list[int], probe: acc.ProbeSettings,
                     keep: Path | None, log: Log) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="acceptance-nccl-") as work:
            result = self._gpu_job("interconnect", {
                "gpus": gpus, "groups": groups, "p2p_mib": probe.p2p_mib,
                "allreduce_sizes_mib": probe.allreduce_sizes_mib,
                "allreduce_iters": probe.allreduce_iters, "port": free_port(),
                "work_dir": work}, probe.gpu_job_timeout_s, keep, log)
        _write(keep, acc.RAW_INTERCONNECT, result)
        return result

    def copy_bandwidth(self, gpus: list[int], probe: acc.ProbeSettings, keep: Path | None,
                       log: Log) -> dict[str, Any]:
        result = self._gpu_job("copy", {"gpus": gpus, "copy_mib": probe.copy_mib,
                                        "copy_iters": probe.copy_iters},
                               probe.gpu_job_timeout_s, keep, log)
        _write(keep, acc.RAW_MEMORY, result)
        return result

    def _gpu_job(self, job: str, args: dict[str, Any], timeout_s: float, keep: Path | None,
                 log: Log) -> dict[str, Any]:
        """Run resources/gpu_jobs.py in its own process group: its result, or `{"error": ...}`
        with the exit status and the log tail (a GPU that faults is a finding, not a crash)."""
        with tempfile.TemporaryDirectory(prefix=f"acceptance-{job}-") as tmp:
            args_path, out_path = Path(tmp) / "args.json", Path(tmp) / "result.json"
            args_path.write_text(json.dumps(args))
            log_path = (keep or Path(tmp)) / f"gpu-job-{job}.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            # GPU indices are nvidia-smi's (PCI bus order, every GPU the node shows): CUDA must
            # number them the same way and see them all.
            env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
            env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONPATH=os.pathsep.join(
                [str(PROJECT_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
            log(f"{job}: starting on GPU(s) {args['gpus']} (log {log_path})")
            with open(log_path, "wb") as out:
                proc = subprocess.Popen(
                    [self.python or sys.executable, "-m", "resources.gpu_jobs", job,
                     str(args_path), str(out_path)], cwd=PROJECT_ROOT, env=env, stdout=out,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                code = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                reap_group(proc, grace_s=5.0)
            if code is None:
                return {"error": f"{job} did not finish within {timeout_s:.0f} s; log "
                        f"{log_path}:\n{log_tail(log_path, 20)}"}
            if code != 0 or not out_path.exists():
                return {"error": f"{job} exited with code {code}; log {log_path}:\n"
                        f"{log_tail(log_path, 20)}"}
            return json.loads(out_path.read_text())

    # ---- storage_read ----

    def direct_read(self, directory: Path, probe: acc.ProbeSettings, log: Log
                    ) -> dict[str, Any]:
        """Sequential O_DIRECT write of a scratch file in `directory`, then its O_DIRECT read
        (removed after), `direct_read_threads` workers on consecutive regions each way: the
        page cache is bypassed, so the numbers are the drive's and the filesystem's."""
        block = probe.direct_read_block_mib << 20
        size = max(block, int(probe.direct_read_gib * 2**30) // block * block)
        directory.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(directory).free
        if free < size + (1 << 30):
            return {"why_not": f"{directory} has {free / 2**30:.1f} GiB free, the read test "
                    f"needs {size / 2**30:.1f} GiB + 1 GiB"}
        path = directory / ".acceptance-read-test"
        try:
            log(f"direct-I/O write of {size / 2**30:.1f} GiB to {path}")
            try:
                write_s = _direct_write(path, size, block, probe.direct_read_threads)
            except OSError as exc:  # no O_DIRECT here: the read below says so
                log(f"direct-I/O write not possible ({exc}); writing through the page cache")
                _fill(path, size, block)
                write_s = None
            log(f"direct-I/O read of {size / 2**30:.1f} GiB from {path}")
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            except OSError as exc:
                return {"why_not": f"O_DIRECT is not supported on {directory} ({exc.strerror})"}
            try:
                seconds = _parallel_read(fd, size, block, probe.direct_read_threads)
            finally:
                os.close(fd)
        finally:
            path.unlink(missing_ok=True)
        return {"path": str(directory), "bytes": size, "seconds": seconds,
                "gbps": size / seconds / 1e9, "threads": probe.direct_read_threads,
                "block_bytes": block, **({"write_bytes": size, "write_seconds": write_s,
                                          "write_gbps": size / write_s / 1e9}
                                         if write_s else {})}

    def s3_get(self, store: S3ObjectStore | None, uri: str, max_bytes: int) -> dict[str, Any]:
        if not uri:
            return {"why_not": "no s3_object configured in acceptance.yaml probe"}
        if store is None:
            return {"why_not": "no S3 resource"}
        bucket, key = uri[5:].split("/", 1)
        try:
            nbytes, seconds = store.read_throughput(bucket, key, max_bytes)
        except FetchError as exc:  # the endpoint's answer is the finding: a failed check
            return {"uri": uri, "error": str(exc)}
        return {"uri": uri, "bytes": nbytes, "seconds": seconds, "gbps": nbytes / seconds / 1e9,
                "endpoint": store.endpoint_url or "AWS S3",
                "concurrency": store.max_concurrency}


def _fill(path: Path, size: int, block: int) -> None:
    """Incompressible bytes (a drive or filesystem that compresses would flatter zeros)."""
    chunk = os.urandom(block)
    with open(path, "wb") as f:
        f.writelines(chunk for _ in range(size // block))
        f.flush()
        os.fsync(f.fileno())


def _direct_write(path: Path, size: int, block: int, threads: int) -> float:
    """Seconds to write `size` incompressible bytes with O_DIRECT, `threads` writers on
    consecutive regions, fsync included."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    try:
        os.ftruncate(fd, size)
        blocks, per = size // block, -(-(size // block) // threads)
        errors: list[OSError] = []

        def writer(first: int) -> None:
            buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
            try:
                buf.write(os.urandom(block))
                for i in range(first, min(first + per, blocks)):
                    if os.pwritev(fd, [buf], i * block) != block:
                        raise OSError(f"short write at block {i}")
            except OSError as exc:  # re-raised below in the caller's thread
                errors.append(exc)
            finally:
                buf.close()

        t0 = time.perf_counter()
        _run_threads(writer, [t * per for t in range(threads)])
        os.fsync(fd)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
    if errors:
        raise errors[0]
    return seconds


def _run_threads(target, firsts: list[int]) -> None:
    """One thread per starting block, all started before any is joined."""
    workers = [threading.Thread(target=target, args=(first,)) for first in firsts]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def _parallel_read(fd: int, size: int, block: int, threads: int) -> float:
    blocks = size // block
    per = -(-blocks // threads)
    errors: list[OSError] = []
    done: list[int] = []

    def reader(first: int) -> None:
        buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
        try:
            for i in range(first, min(first + per, blocks)):
                if os.preadv(fd, [buf], i * block) != block:
                    raise OSError(f"short read at block {i}")
                done.append(block)
        except OSError as exc:  # re-raised below in the caller's thread
            errors.append(exc)
        finally:
            buf.close()

    t0 = time.perf_counter()
    _run_threads(reader, [t * per for t in range(threads)])
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    if sum(done) != size:
        raise OSError(f"read {sum(done)} of {size} bytes")
    return seconds
