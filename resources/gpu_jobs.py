"""GPU work for node acceptance, run as its own process by resources/node_probe.py:

    python -m resources.gpu_jobs burn|copy|interconnect <args.json> <result.json>

A separate process so the CUDA context, the memory it takes and a hung kernel all end with it
(the probe kills it at its timeout), while the parent samples telemetry through NVML. Results
are raw timings and counts; judging them is onboarding.nodes.acceptance's job. Torch only.

- burn: sustained bf16 matmuls on every listed GPU; every `check_every` rounds each GPU's
  result is compared with the reference it computed first through the same call (itself
  checked against the CPU on a slice). cuBLAS gives bit-identical results for the same call on
  the same GPU, so any difference is counted (`bitwise_mismatches`, reported) and one beyond
  `tolerance` x max(|reference|, 1) is an error (`errors`, judged): a GPU that computes wrong
  is caught, not just a GPU that is slow.
- copy: device-to-device copy of `copy_mib` per GPU, timed with CUDA events; GB/s counts the
  bytes read and written (2 x size), as HBM bandwidth figures do.
- interconnect: P2P copy GB/s for every ordered GPU pair, then all-reduce (NCCL through
  torch.distributed, one process per GPU) for each TP group size and message size.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _log(msg: str) -> None:
    print(f"[gpu_jobs {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def burn(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    gpus, n = args["gpus"], int(args["matmul_size"])
    duration_s, tol = float(args["duration_s"]), float(args.get("tolerance", 2e-2))
    rounds_per_sync, check_every = int(args.get("rounds_per_sync", 10)), int(
        args.get("check_every", 5))
    state = []
    for g in gpus:
        dev = torch.device("cuda", g)
        gen = torch.Generator(device=dev).manual_seed(1234 + g)
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=gen)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=gen)
        ref = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        torch.matmul(a, b, out=ref)  # the same call as the burn's: bit-identical when healthy
        rows = 16
        cpu = a[:rows].float().cpu() @ b.float().cpu()
        rel = float(((ref[:rows].float().cpu() - cpu).abs().max() / cpu.abs().max()).item())
        state.append({"gpu": g, "a": a, "b": b, "ref": ref, "out": torch.empty_like(ref),
                      "iterations": 0, "errors": 0, "bitwise_mismatches": 0, "checks": 0,
                      "reference_max_rel_err": rel, "reference_ok": rel < 2e-2})
    torch.cuda.synchronize()
    _log(f"burn: {len(gpus)} GPU(s), {n}x{n} bf16, {duration_s:.0f} s")
    started_at, t0 = time.time(), time.perf_counter()
    rounds = 0
    while time.perf_counter() - t0 < duration_s:
        for _ in range(rounds_per_sync):
            for s in state:
                torch.matmul(s["a"], s["b"], out=s["out"])
                s["iterations"] += 1
        rounds += 1
        if rounds % check_every == 0:
            for s in state:
                _compare(s, tol)
        for g in gpus:
            torch.cuda.synchronize(g)
    elapsed, ended_at = time.perf_counter() - t0, time.time()
    for s in state:  # one final comparison, so a short burn is still checked
        _compare(s, tol)
    per_gpu = [{"gpu": s["gpu"], "name": torch.cuda.get_device_name(s["gpu"]),
                "iterations": s["iterations"], "errors": s["errors"], "checks": s["checks"],
                "bitwise_mismatches": s["bitwise_mismatches"],
                "tflops": 2 * n ** 3 * s["iterations"] / elapsed / 1e12,
                "reference_ok": s["reference_ok"],
                "reference_max_rel_err": s["reference_max_rel_err"]} for s in state]
    return {"duration_s": elapsed, "matmul_size": n, "dtype": "bfloat16", "per_gpu": per_gpu,
            "started_at": started_at, "ended_at": ended_at}


def _compare(s: dict[str, Any], tol: float) -> None:
    out, ref = s["out"].float(), s["ref"].float()
    diff = (out - ref).abs()
    s["bitwise_mismatches"] += int((diff > 0).sum().item())
    s["errors"] += int((diff > tol * ref.abs().clamp(min=1.0)).sum().item())
    s["checks"] += 1


def copy(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    nbytes, iters = int(args["copy_mib"]) << 20, int(args["copy_iters"])
    out = []
    for g in args["gpus"]:
        torch.cuda.set_device(g)
        src = torch.empty(nbytes, dtype=torch.uint8, device=g).random_()
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / iters
        ok = bool(torch.equal(src, dst))
        out.append({"gpu": g, "bytes": nbytes, "seconds": seconds,
                    "copy_gbps": 2 * nbytes / seconds / 1e9, "verified": ok})
        _log(f"copy GPU{g}: {out[-1]['copy_gbps']:.0f} GB/s (read + write)")
        del src, dst
        torch.cuda.empty_cache()
    return {"per_gpu": out}


def _p2p(gpus: list[int], nbytes: int, iters: int) -> list[dict[str, Any]]:
    import torch

    rows = []
    for i in gpus:
        for j in gpus:
            if i == j:
                continue
            src = torch.empty(nbytes, dtype=torch.uint8, device=i).random_()
            dst = torch.empty(nbytes, dtype=torch.uint8, device=j)
            dst.copy_(src)
            torch.cuda.synchronize(i)
            torch.cuda.synchronize(j)
            t0 = time.perf_counter()
            for _ in range(iters):
                dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(i)
            torch.cuda.synchronize(j)
            seconds = (time.perf_counter() - t0) / iters
            rows.append({"src": i, "dst": j, "bytes": nbytes, "seconds": seconds,
                         "gbps": nbytes / seconds / 1e9,
                         "peer_access": bool(torch.cuda.can_device_access_peer(i, j))})
            del src, dst
    return rows


def _allreduce_rank(rank: int, gpus: list[int], port: int, sizes: list[int], iters: int,
                    groups: list[int], result_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(gpus[rank])
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=len(gpus), device_id=torch.device("cuda", gpus[rank]))
    rows = []
    try:
        for ranks in groups:
            group = dist.new_group(list(range(ranks)))
            if rank < ranks:
                for nbytes in sizes:
                    n = nbytes // 4
                    ones = torch.ones(n, dtype=torch.float32, device="cuda")
                    dist.all_reduce(ones, group=group)
                    correct = bool(torch.all(ones == ranks).item())
                    buf = torch.zeros(n, dtype=torch.float32, device="cuda")  # stays finite
                    for _ in range(5):
                        dist.all_reduce(buf, group=group)
                    torch.cuda.synchronize()
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(iters):
                        dist.all_reduce(buf, group=group)
                    end.record()
                    end.synchronize()
                    rows.append({"ranks": ranks, "bytes": n * 4, "correct": correct,
                                 "time_s": start.elapsed_time(end) / 1e3 / iters})
                    del ones, buf
            dist.barrier()
    finally:
        if rank == 0:
            Path(result_path).write_text(json.dumps(rows))
        dist.destroy_process_group()


def interconnect(args: dict[str, Any]) -> dict[str, Any]:
    import importlib

    import torch.multiprocessing as mp

    rank_fn = importlib.import_module("resources.gpu_jobs")._allreduce_rank  # picklable by name

    gpus = args["gpus"]
    p2p = _p2p(gpus, int(args["p2p_mib"]) << 20, int(args.get("p2p_iters", 10)))
    _log(f"p2p: {len(p2p)} pairs, min {min(r['gbps'] for r in p2p):.1f} GB/s")
    part = Path(args["work_dir"]) / "allreduce-rank0.json"
    sizes = [int(m) << 20 for m in args["allreduce_sizes_mib"]]
    mp.spawn(rank_fn, nprocs=len(gpus), join=True,
             args=(gpus, int(args["port"]), sizes, int(args["allreduce_iters"]),
                   list(args["groups"]), str(part)))
    allreduce = json.loads(part.read_text())
    _log(f"all-reduce: {len(allreduce)} measurements over groups {args['groups']}")
    return {"p2p": p2p, "allreduce": allreduce}


JOBS = {"burn": burn, "copy": copy, "interconnect": interconnect}


def main(argv: list[str]) -> int:
    job, args_path, out_path = argv
    args = json.loads(Path(args_path).read_text())
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    result = JOBS[job](args)
    Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
