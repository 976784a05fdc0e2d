"""Two H200s of one host: the phases only two GPUs can run, and what the plan
expects of every step, written down before the run.

  interconnect  (device) first what NCCL needs there: torch's CUDA devices and NCCL version
                (the preinstalled torch 2.11.0+cu130 with its nvidia-nccl-cu13; nccl-tests are
                not on the machine), `nvidia-smi topo -m`, NVLink multicast off; then
                scripts/gpu_node_probe.py on both GPUs: the node assets, the `interconnect`
                asset's P2P matrix and NCCL all-reduce (torch.distributed, one process per GPU)
                at configs/acceptance.yaml's message sizes, judged by its thresholds.
  neighbour     (device) scripts/gpu_noisy_neighbour.py on the Llama-3.1-8B twin (its
                config.json and the twins' tokenizer, random weights): two engines from the
                layout's rendered launchers, one per GPU, `vllm bench serve` alone and together,
                the 10 % rule.
  pin           (CPU) a `prepare`d work dir's configs pinned to the H200's recorded versions
                (vLLM 0.22.0, torch 2.11.0, CUDA 13.0, driver 580.159.04), so the CPU dry run of
                `onboard` and `twins --dry-run` plans the configuration hashes the device will.

What the plan expects of these steps, and the docs/gpu.md sections, are bench/gpu_x2_doc.py's.

Device phases write `<out>/x2-<phase>.json` and `<out>/x2-<phase>.tar.gz`; `--dry-run` runs
them as far as a CPU goes (the probe's argv and thresholds; the pair's plan and launchers).
bench/gpu_device.sh holds the exact device calls; docs/gpu.md, "Two H200s", the batch.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}
TWIN_8B, TWIN_70B = "llama-3-1-8b-instruct-twin", "llama-3-1-70b-instruct-twin"
# the versions the x2 plan is pinned to (bench/gpu_recordings.py RECORDINGS["slo_target"])
PINNED_RECORDING = ROOT / "tests" / "data" / "gpu" / "h200-slo-target"
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[x2 {time.monotonic() - T0:6.1f} s] {msg}", flush=True)


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 124, "", f"{type(exc).__name__}: {exc}")


def multicast_off() -> None:
    """Set NVLink multicast off for this process and its children; refuse where someone set it
    on (it can take the host's shared GPUs out of service: ../.library/device/KINDS.md)."""
    for k, v in MULTICAST_OFF.items():
        if os.environ.setdefault(k, v) != v:
            raise SystemExit(f"{k}={os.environ[k]}: NVLink multicast must stay off on these "
                             f"machines; unset it or set {k}={v}")


def write(out: Path, phase: str, body: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"x2-{phase}.json"
    path.write_text(json.dumps(body, indent=1, default=str))
    return path


def pack(out: Path, phase: str, folder: Path) -> None:
    if folder.exists():
        with tarfile.open(out / f"x2-{phase}.tar.gz", "w:gz") as tar:
            tar.add(folder, arcname=folder.name)


# ---- interconnect ----

def probe_settings() -> dict[str, Any]:
    """The message sizes node acceptance ships (configs/acceptance.yaml `probe`), not the
    probe script's shortened ones: the all-reduce peak is judged at the largest."""
    from resources.config_files import ConfigFiles

    p = ConfigFiles().acceptance().probe
    return {"p2p_mib": p.p2p_mib, "allreduce_sizes_mib": list(p.allreduce_sizes_mib)}


def probe_argv(out_dir: Path, burn_s: float) -> list[str]:
    s = probe_settings()
    return [sys.executable, str(ROOT / "scripts" / "gpu_node_probe.py"), str(out_dir),
            "--node-type", "h200", "--gpus", "2", "--burn-s", str(burn_s),
            "--p2p-mib", str(s["p2p_mib"]),
            "--allreduce-sizes-mib", ",".join(map(str, s["allreduce_sizes_mib"]))]


def thresholds() -> dict[str, Any]:
    """What the interconnect checks judge against on a 2-GPU h200 (the shipped config)."""
    from bench.gpu_recordings_x2 import interconnect_setting

    t = interconnect_setting(2).thresholds
    return {"allreduce_busbw_min_gbps": {str(k): v for k, v in
                                         t.interconnect.allreduce_busbw_min_gbps.items()},
            "p2p_min_gbps": t.interconnect.p2p_min_gbps, "nvlinks_per_gpu": t.nvlinks_per_gpu,
            "fabric_manager_required": t.fabric_manager_required,
            "busbw": "nccl-tests' all-reduce bus bandwidth, 2 (n - 1) / n x bytes / time "
                     "(onboarding/nodes/acceptance/ allreduce_busbw_gbps)",
            "source": "configs/acceptance.yaml node_types.h200.interconnect and defaults"}


PREFLIGHT = """import json, torch, torch.distributed as dist
n = torch.cuda.device_count()
v = torch.cuda.nccl.version() if n else None
print(json.dumps({"torch": torch.__version__, "cuda_devices": n,
                  "nccl_available": dist.is_nccl_available(),
                  "nccl": ".".join(map(str, v)) if isinstance(v, tuple) else v,
                  "peer_access_0_1": torch.cuda.can_device_access_peer(0, 1) if n > 1 else None}))
"""


def preflight() -> dict[str, Any]:
    """What the all-reduce rests on, read before the probe runs it."""
    p = run([sys.executable, "-c", PREFLIGHT], 180)
    out: dict[str, Any] = {"env": {k: os.environ.get(k) for k in MULTICAST_OFF}}
    try:
        out.update(json.loads(p.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        out["error"] = (p.stdout + p.stderr)[-2000:]
    smi = shutil.which("nvidia-smi")
    topo = run([smi, "topo", "-m"], 60) if smi else None
    out["topo"] = topo.stdout if topo and topo.returncode == 0 else "nvidia-smi not run"
    return out


def interconnect(args) -> int:
    multicast_off()
    probe_dir = args.work / "x2-probe"
    argv = probe_argv(probe_dir, args.burn_s)
    if args.dry_run:
        print(json.dumps({"probe_argv": argv, "probe": probe_settings(),
                          "thresholds": thresholds(), "env": MULTICAST_OFF}, indent=1))
        return 0
    body: dict[str, Any] = {"phase": "x2-interconnect", "preflight": preflight(),
                            "probe_argv": argv, "thresholds": thresholds()}
    say(f"preflight: {json.dumps({k: v for k, v in body['preflight'].items() if k != 'topo'})}")
    write(args.out, "interconnect", body)
    shutil.rmtree(probe_dir, ignore_errors=True)
    t = time.monotonic()
    p = run(argv, args.timeout_s)
    body["probe"] = {"rc": p.returncode, "seconds": round(time.monotonic() - t, 1),
                     "tail": (p.stdout + p.stderr)[-4000:]}
    say(f"probe rc {p.returncode} in {body['probe']['seconds']} s")
    for key, rel in (("summary", "summary.json"), ("interconnect", "raw/interconnect.json")):
        f = probe_dir / rel
        body[key] = json.loads(f.read_text()) if f.is_file() else None
    checks = probe_dir / "report" / "checks.csv"
    body["checks"] = list(csv.DictReader(checks.open())) if checks.is_file() else []
    write(args.out, "interconnect", body)
    pack(args.out, "interconnect", probe_dir)
    return 0 if p.returncode == 0 else 1


# ---- neighbour ----

def neighbour_argv(twin_dir: Path, out_dir: Path, args) -> list[str]:
    from resources.config_files import ConfigFiles

    params = ConfigFiles().spec(TWIN_8B).architecture.params_billion
    return [sys.executable, str(ROOT / "scripts" / "gpu_noisy_neighbour.py"), "--model-dir",
            str(twin_dir), "--params-billion", str(params), "--out", str(out_dir),
            "--bound", str(args.bound), "--ready-timeout-s", str(args.ready_timeout_s),
            *(["--dry-run"] if args.dry_run else [])]


def launcher_commands(layout_dir: Path) -> dict[str, str]:
    """Each rendered launcher's header and exec line: GPUs, memory, the exact engine argv."""
    out = {}
    for sh in sorted((layout_dir / "launchers").glob("twin-*.sh")):
        lines = sh.read_text().splitlines()
        keep = [ln for ln in lines if ln.startswith(("# GPUs", "# Memory", "export CUDA"))]
        start = next(i for i, ln in enumerate(lines) if ln.startswith("exec "))
        out[sh.stem] = "\n".join(keep + [" ".join(x.strip().rstrip("\\").strip()
                                                   for x in lines[start:])])
    return out


def neighbour(args) -> int:
    multicast_off()
    from onboarding.fetch.twins import twin_source_dir

    twin_dir = twin_source_dir(TWIN_8B, args.work / "twin-8b")
    out_dir = args.work / "x2-neighbour"
    shutil.rmtree(out_dir, ignore_errors=True)
    argv = neighbour_argv(twin_dir, out_dir, args)
    t = time.monotonic()
    p = run(argv, args.timeout_s)
    body: dict[str, Any] = {"phase": "x2-neighbour", "model": TWIN_8B, "argv": argv,
                            "bound": args.bound, "rc": p.returncode,
                            "seconds": round(time.monotonic() - t, 1),
                            "tail": (p.stdout + p.stderr)[-4000:]}
    if (out_dir / "layout").is_dir():
        body["launchers"] = launcher_commands(out_dir / "layout")
    result = out_dir / "noisy_neighbour.json"
    if result.is_file():
        body["result"] = json.loads(result.read_text())
    elif args.dry_run and p.returncode == 0:
        body["result"] = json.loads(p.stdout)
    if args.dry_run:
        print(json.dumps({k: body.get(k) for k in ("argv", "launchers", "result")}, indent=1))
        return p.returncode
    say(f"neighbour rc {p.returncode} in {body['seconds']} s")
    write(args.out, "neighbour", body)
    pack(args.out, "neighbour", out_dir)
    return p.returncode


# ---- pin: the CPU dry run plans the device's configuration hashes ----

def recorded_versions() -> dict[str, str]:
    steps = json.loads((PINNED_RECORDING / "prepare.json").read_text())["steps"]["versions"]
    return {k: v for k, v in steps.items() if k != "at_s"}


def pin(args) -> int:
    import gpu_serving

    cfg, changed = gpu_serving.pinned_configs(args.work, recorded_versions())
    print(json.dumps({"configs": str(cfg), "changed": changed,
                      "versions_from": str(PINNED_RECORDING.relative_to(ROOT) / "prepare.json")},
                     indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", choices=["interconnect", "neighbour", "pin"])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "x2-out")))
    ap.add_argument("--work", type=Path, default=Path("/tmp/onb"))
    ap.add_argument("--dry-run", action="store_true", help="interconnect, neighbour: as far as "
                    "a CPU goes (argv, thresholds, the pair's plan and launchers)")
    ap.add_argument("--burn-s", type=float, default=30.0, help="interconnect: the probe's burn")
    ap.add_argument("--bound", type=float, default=0.10, help="neighbour: allowed rise of TTFT "
                    "p95 and mean ITL under the neighbour (the layouts' 10 %%)")
    ap.add_argument("--ready-timeout-s", type=float, default=420)
    ap.add_argument("--timeout-s", type=float, default=540, help="a device phase's subprocess")
    args = ap.parse_args()
    return {"interconnect": interconnect, "neighbour": neighbour, "pin": pin}[args.phase](args)


if __name__ == "__main__":
    sys.exit(main())
