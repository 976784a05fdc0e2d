"""Run the project's node-acceptance assets on this GPU machine, with short durations, and keep
every raw output as test data.

    PYTHONPATH=<repo>:/tmp/site python3 scripts/gpu_node_probe.py OUT_DIR \
        [--node NAME] [--node-type h200] [--gpus N] [--burn-s 40] [--dcgm-level 1] \
        [--stress-s 30]

Materializes node_inventory, gpu_health, interconnect, memory_bandwidth, storage_read and
node_acceptance for one node (registered on the fly in a copy of configs/ with this
machine's GPU count and a short probe), in a throwaway Dagster instance. Writes, under OUT_DIR:

    raw/        nvidia-smi-q.xml, nvidia-smi-topo-m.txt, nvml.json, system.json, burn.json
                (samples), memory-bandwidth.json, storage-read.json, interconnect.json
                (2+ GPUs), dcgmi-diag.json (where DCGM is installed), gpu-job-*.log, and
                the host tools' recordings (<name>.txt: dmesg, lspci-vvv, stress-ng, ...)
    report/     acceptance.md, burn.png, checks.csv
    summary.json   the verdict, every check, the gate's answer for this node, timings

`raw/` is what tests/data/acceptance/h200/ takes (docs/acceptance.md, "H200 results"). Budgeted
at under 3 minutes on one H200 with the defaults (40 s burn, two CUDA starts, a 2 GiB direct
read); the verdict will say "not qualified" because a 40 s burn is shorter than the hour the
node type requires, a level-1 DCGM run is not the level-3 pass acceptance needs, and a 30 s
stress is shorter than `host.stress_min_s` (by design: the numbers are the point).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# GPUs passed through to a VM: never use NVLink multicast.
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
               ("NVSHMEM_DISABLE_NVLS", "1"), ("DAGSTER_DISABLE_TELEMETRY", "1")):
    os.environ.setdefault(_k, _v)

T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[probe {time.monotonic() - T0:6.1f} s] {msg}", flush=True)


def gpu_count() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=False)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def config_copy(work: Path, node: str, node_type: str, gpus: int, args) -> Path:
    import yaml

    cfg = work / "configs"
    shutil.copytree(ROOT / "configs", cfg)
    path = cfg / "acceptance.yaml"
    data = yaml.safe_load(path.read_text())
    data["nodes"] = {node: {"node_type": node_type, "gpus": max(gpus, 1)}}
    data["probe"].update({
        "burn_s": args.burn_s, "sample_interval_s": 0.5, "dcgm_diag_level": args.dcgm_level,
        "copy_mib": 2048, "copy_iters": 10, "p2p_mib": args.p2p_mib,
        "allreduce_sizes_mib": args.allreduce_sizes_mib,
        "allreduce_iters": 10, "direct_read_gib": args.direct_read_gib,
        "gpu_job_timeout_s": 300, "stress_s": args.stress_s})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--node", default=os.uname().nodename.lower().replace("_", "-"))
    ap.add_argument("--node-type", default="h200")
    ap.add_argument("--gpus", type=int, default=None, help="default: what nvidia-smi -L lists")
    ap.add_argument("--burn-s", type=float, default=40.0)
    ap.add_argument("--dcgm-level", type=int, default=1, help="dcgmi diag -r level where DCGM "
                    "is installed (1 is about a minute); 0 skips it")
    ap.add_argument("--direct-read-gib", type=float, default=2.0)
    ap.add_argument("--stress-s", type=float, default=30.0, help="stress-ng CPU/memory run "
                    "between two EDAC reads; 0 skips it")
    ap.add_argument("--p2p-mib", type=int, default=512, help="P2P copy per GPU pair")
    ap.add_argument("--allreduce-sizes-mib", default=[16, 256],
                    type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                    help="NCCL all-reduce message sizes, e.g. 16,256,1024 (acceptance.yaml's)")
    args = ap.parse_args()
    import dagster as dg

    from assets.node_gate import node_acceptance_check
    from assets.nodes import (
        gpu_health,
        interconnect,
        memory_bandwidth,
        node_acceptance,
        node_inventory,
        storage_read,
    )
    from resources.config_files import ConfigFiles, OutputDirs
    from resources.node_probe import NodeProbe
    from resources.nvme_cache import NvmeCache
    from resources.s3 import S3ObjectStore
    from resources.telemetry import GpuTelemetry
    from resources.upstream import optional_upstream

    gpus = gpu_count() if args.gpus is None else args.gpus
    say(f"node {args.node!r}, type {args.node_type}, {gpus} GPU(s), burn {args.burn_s:.0f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-node-probe-"))
    reports = work / "reports"
    configs = ConfigFiles(config_dir=str(config_copy(work, args.node, args.node_type, gpus,
                                                     args)))
    resources = {
        "configs": configs, "outputs": OutputDirs(reports_dir=str(reports)),
        "node_probe": NodeProbe(telemetry=GpuTelemetry(interval_s=0.5)),
        "nvme_cache": NvmeCache(root=str(work / "nvme")),
        "s3": S3ObjectStore(endpoint_url="http://127.0.0.1:1"),  # no S3 here: not checked
        "optional_upstream": optional_upstream}
    timings: dict[str, float] = {}
    (work / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(work / "dagster")) as instance:
        instance.add_dynamic_partitions("nodes", [args.node])
        every = [node_inventory, gpu_health, interconnect, memory_bandwidth, storage_read,
                 node_acceptance]
        for asset in every:  # one at a time, in order, so progress and timings show
            name = asset.key.to_user_string()
            say(f"{name} ...")
            t = time.monotonic()
            result = dg.materialize(
                every, instance=instance, partition_key=args.node, resources=resources,
                raise_on_error=False, selection=[asset.key],
                run_config={"ops": {"gpu_health": {"config": {"burn_s": args.burn_s}}}}
                if name == "gpu_health" else None)
            timings[name] = round(time.monotonic() - t, 1)
            if not result.success:
                say(f"{name} FAILED: {_failure(result)}")
                continue
            checks = getattr(result.output_for_node(name), "checks", ())
            for c in checks if name != "node_acceptance" else ():
                say(f"  {c.status:11s} {c.name}: {c.measured or c.reason}")
        verdict = _latest(instance, args.node)
        with dg.build_resources({"io_manager": dg.FilesystemIOManager()},
                                instance=instance) as built:  # where materialize stored it
            gate = node_acceptance_check(built.io_manager, instance, args.node, True, "gpu")
    _collect(reports / "nodes" / args.node, args.out)
    summary = {"node": args.node, "node_type": args.node_type, "gpus": gpus,
               "burn_s": args.burn_s, "timings_s": timings, **verdict,
               "gate": {"passed": gate.passed,
                        "acceptance": gate.metadata["acceptance"].value}}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    say(f"verdict: {'QUALIFIED' if verdict.get('qualified') else 'NOT QUALIFIED'}; gate for "
        f"serving: {gate.metadata['acceptance'].value}")
    say(f"wrote {args.out} (raw/, report/, summary.json)")
    return 0


def _failure(result) -> str:
    for e in result.all_events:
        if e.event_type_value == "STEP_FAILURE":
            return e.event_specific_data.error.to_string()[-2000:]
    return "unknown"


def _latest(instance, node: str) -> dict:
    import dagster as dg

    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("node_acceptance"),
                              asset_partitions=[node]), limit=1).records
    if not records:
        return {"qualified": None, "reasons": ["node_acceptance did not materialize"]}
    md = records[0].asset_materialization.metadata
    return {"qualified": md["qualified"].value, "reasons": md["reasons"].value,
            "phases": md["phases"].value, "node_stack": md["node_stack"].value}


def _collect(node_dir: Path, out: Path) -> None:
    """raw/ and report/ under OUT (at most two folders down, as the device tool returns)."""
    if (node_dir / "raw").is_dir():
        shutil.copytree(node_dir / "raw", out / "raw", dirs_exist_ok=True)
    (out / "report").mkdir(exist_ok=True)
    for name in ("acceptance.md", "burn.png", "checks.csv"):
        if (node_dir / name).is_file():
            shutil.copy2(node_dir / name, out / "report" / name)


if __name__ == "__main__":
    sys.exit(main())
