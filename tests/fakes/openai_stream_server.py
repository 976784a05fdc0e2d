"""TEST FIXTURE: a fake OpenAI-compatible streaming server that records its own ground truth.

Not an engine. It exists because no real engine can show what a load generator must get right:
a known TTFT and inter-token gap (`--ttft-ms`, `--itl-ms`), and faults on demand. Every
request's real send times are recorded server-side and served at `GET /truth`, so a client's
numbers are compared with what actually happened.

Faults on every `--fault-every`-th request (`--fault`), after `--fault-after-tokens` tokens
where that applies: `5xx` (HTTP 503), `drop` (connection closed mid-stream), `malformed` (an event
that is not JSON), `crlf` / `cr` (events separated by CRLF or CR, as the SSE spec allows: not a
fault, a client must read them), `reset` (TCP RST before any response), `reset_mid` (RST
mid-stream), `stall` (the stream stops, the connection stays open), `exit` (the whole server
process exits mid-stream with `--exit-code`, as a crashing engine would). `/metrics` faults
(`--metrics-fault`): `404`, `stall` (never answers), `garbage` (200 with text that is not
Prometheus' format).

Two modes:
- server:  `python openai_stream_server.py --port 8000 --ttft-ms 100 --itl-ms 20`
- engine:  `python openai_stream_server.py serve <model_dir> --host 127.0.0.1 --port N ...`
  (vLLM's CLI shape, unknown flags ignored) for the engine launcher's tests. It reads the model
  dir's *.safetensors like a loader, prints vLLM's "Loading weights took" line (neither with
  `--load-format dummy`, as vLLM on random weights), and obeys
  FAKE_ENGINE_* env vars: STARTUP_S (delay before listening), EXIT_CODE (die during start),
  NEVER_READY (/health answers 503), HANG_COMPLETIONS (/health answers 200, completions never
  answer), IGNORE_SIGTERM (as a busy vLLM may), CHILD (spawn a child like vLLM's EngineCore),
  RECORD (write argv, env and pid as JSON to that path), STARTS (append one JSON line per start:
  its VLLM_CACHE_ROOT and whether that cache already held what a start compiles into it, which
  the fake leaves behind like an engine's compile cache); and FAKE_FAULT, FAKE_FAULT_EVERY,
  FAKE_FAULT_AFTER_TOKENS, FAKE_METRICS_FAULT, FAKE_EXIT_CODE as the server mode's flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

THIS_FILE = Path(__file__).resolve()


@dataclass
class FakeConfig:
    ttft_s: float = 0.0
    itl_s: float = 0.0
    model: str = "fake"
    fault: str = "none"  # one of FAULTS
    fault_every: int = 0  # every Nth request (1-based) is faulty; 0 = never
    fault_after_tokens: int = 2
    metrics_fault: str = "none"  # one of METRICS_FAULTS
    exit_code: int = 7  # of the `exit` fault
    never_ready: bool = False
    hang_completions: bool = False


FAULTS = ("none", "5xx", "drop", "malformed", "crlf", "cr", "reset", "reset_mid", "stall",
          "exit")
METRICS_FAULTS = ("none", "404", "stall", "garbage")
SEPARATORS = {"crlf": b"\r\n\r\n", "cr": b"\r\r"}


@dataclass
class Truth:
    requests: int = 0
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    completed: int = 0
    running: int = 0
    ttft_sum_s: float = 0.0


def _chunk(model: str, text: str, finish: str | None = None, sep: bytes = b"\n\n") -> bytes:
    body = {"id": "cmpl-fake", "object": "text_completion", "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + sep


def _usage(model: str, prompt_tokens: int, n: int, sep: bytes = b"\n\n") -> bytes:
    body = {"id": "cmpl-fake", "object": "text_completion", "model": model, "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                      "total_tokens": prompt_tokens + n}}
    return (b"data: " + json.dumps(body, separators=(",", ":")).encode() + sep
            + b"data: [DONE]" + sep)


def _reset(request: web.Request) -> None:
    """Close the connection with a TCP RST (SO_LINGER 0), as a crashed peer or a proxy does."""
    sock = request.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    request.transport.abort()


def _die(cfg: FakeConfig) -> None:
    print(f"ERROR fake engine: injected crash mid-stream, exiting with code {cfg.exit_code}",
          flush=True)
    os._exit(cfg.exit_code)


def build_app(cfg: FakeConfig) -> web.Application:
    truth = Truth()
    chunks = {sep: (_chunk(cfg.model, " tok", sep=sep),
                    _chunk(cfg.model, " tok", "length", sep=sep))
              for sep in (b"\n\n", *SEPARATORS.values())}

    async def completions(request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        body = await request.json()
        truth.requests += 1
        idx = truth.requests
        if cfg.hang_completions:
            await asyncio.Event().wait()
        faulty = cfg.fault != "none" and cfg.fault_every > 0 and idx % cfg.fault_every == 0
        if faulty and cfg.fault == "5xx":
            return web.json_response({"error": "injected overload"}, status=503)
        if faulty and cfg.fault == "reset":
            _reset(request)
            return web.Response()
        sep = SEPARATORS.get(cfg.fault, b"\n\n") if faulty else b"\n\n"
        token_chunk, last_chunk = chunks[sep]
        n = int(body.get("max_tokens") or 16)
        prompt = body.get("prompt", "")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        if not body.get("stream"):
            await asyncio.sleep(cfg.ttft_s + cfg.itl_s * max(n - 1, 0))
            return web.json_response({
                "id": "cmpl-fake", "object": "text_completion", "model": cfg.model,
                "choices": [{"index": 0, "text": " tok" * n, "finish_reason": "length"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                          "total_tokens": prompt_tokens + n}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        truth.running += 1
        try:
            if cfg.itl_s == 0 and not faulty:
                if cfg.ttft_s:
                    await asyncio.sleep(cfg.ttft_s)
                truth.ttft_s.append(time.perf_counter() - t0)
                await resp.write(token_chunk * (n - 1) + last_chunk + _usage(
                    cfg.model, prompt_tokens, n, sep))
                truth.itl_s.extend([0.0] * (n - 1))
            else:
                sent = None
                for k in range(n):
                    target = t0 + cfg.ttft_s + k * cfg.itl_s
                    if (delay := target - time.perf_counter()) > 0:
                        await asyncio.sleep(delay)
                    if faulty and k == cfg.fault_after_tokens and cfg.fault not in SEPARATORS:
                        if cfg.fault == "drop":
                            request.transport.close()
                            return resp
                        if cfg.fault == "reset_mid":
                            _reset(request)
                            return resp
                        if cfg.fault == "stall":
                            await asyncio.Event().wait()
                        if cfg.fault == "exit":
                            _die(cfg)
                        await resp.write(b"data: {\"choices\": [{\"text\": \"tok\"\n\n")
                    await resp.write(last_chunk if k == n - 1 else token_chunk)
                    now = time.perf_counter()
                    if sent is None:
                        truth.ttft_s.append(now - t0)
                    else:
                        truth.itl_s.append(now - sent)
                    sent = now
                await resp.write(_usage(cfg.model, prompt_tokens, n, sep))
            truth.ttft_sum_s += truth.ttft_s[-1]
            truth.completed += 1
            await resp.write_eof()
            return resp
        finally:
            truth.running -= 1

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=503 if cfg.never_ready else 200)

    async def metrics(_: web.Request) -> web.Response:
        if cfg.metrics_fault == "404":
            return web.Response(status=404, text="404: Not Found")
        if cfg.metrics_fault == "stall":
            await asyncio.Event().wait()
        if cfg.metrics_fault == "garbage":
            return web.Response(text="<html><body>a login page</body></html>",
                                content_type="text/html")
        lbl = f'model_name="{cfg.model}"'
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{lbl}}} {truth.running}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{lbl}}} 0\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{lbl}}} {min(truth.running / 100, 1.0)}\n"
            "# TYPE vllm:time_to_first_token_seconds histogram\n"
            f'vllm:time_to_first_token_seconds_bucket{{{lbl},le="+Inf"}} {truth.completed}\n'
            f"vllm:time_to_first_token_seconds_count{{{lbl}}} {truth.completed}\n"
            f"vllm:time_to_first_token_seconds_sum{{{lbl}}} {truth.ttft_sum_s}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def get_truth(_: web.Request) -> web.Response:
        return web.json_response({"requests": truth.requests, "completed": truth.completed,
                                  "ttft_s": truth.ttft_s, "itl_s": truth.itl_s})

    async def reset_truth(_: web.Request) -> web.Response:
        truth.__init__()
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/truth", get_truth)
    app.router.add_post("/truth/reset", reset_truth)
    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_fake_server(port: int | None = None, **cfg: object) -> Iterator[str]:
    """Start the fake server in its own process (so it never shares the client's GIL)."""
    port = port or free_port()
    argv = [sys.executable, str(THIS_FILE), "--port", str(port)]
    for key, value in cfg.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    # stderr to a file: a pipe nobody reads would block a chatty server once it is full
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 20
            while True:
                if proc.poll() is not None:
                    stderr.seek(0)
                    raise RuntimeError(f"fake server exited: {stderr.read().decode()[-2000:]}")
                try:  # /health: a faulty /metrics must not look like a server that never started
                    with urllib.request.urlopen(url + "/health", timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _engine_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", default="fake")
    p.add_argument("--load-format", default="auto")
    args, _unknown = p.parse_known_args(argv)
    env = os.environ
    if record := env.get("FAKE_ENGINE_RECORD"):
        Path(record).write_text(json.dumps({"argv": sys.argv, "env": dict(env),
                                            "pid": os.getpid()}))
    if starts := env.get("FAKE_ENGINE_STARTS"):
        root = env.get("VLLM_CACHE_ROOT")
        compiled = Path(root) / "compiled" if root else None
        with open(starts, "a") as f:
            f.write(json.dumps({"cache_root": root, "cache_was_warm": bool(
                compiled and compiled.exists())}) + "\n")
        if compiled:
            compiled.parent.mkdir(parents=True, exist_ok=True)
            compiled.write_text("kernels")
    print("INFO fake engine starting", flush=True)
    if env.get("FAKE_ENGINE_IGNORE_SIGTERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if env.get("FAKE_ENGINE_CHILD"):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    time.sleep(float(env.get("FAKE_ENGINE_STARTUP_S", "0")))
    if code := int(env.get("FAKE_ENGINE_EXIT_CODE", "0")):
        print("ERROR fake engine: injected failure while loading weights", flush=True)
        sys.exit(code)
    if args.load_format == "dummy":  # as vLLM: random weights, no "Loading weights" line
        print("INFO Initializing model took 0.01 seconds (random weights)", flush=True)
    else:
        t = time.perf_counter()
        for f in sorted(Path(args.model).glob("*.safetensors")):
            f.read_bytes()
        print(f"INFO Loading weights took {time.perf_counter() - t:.2f} seconds", flush=True)
    cfg = FakeConfig(ttft_s=float(env.get("FAKE_TTFT_MS", "0")) / 1e3,
                     itl_s=float(env.get("FAKE_ITL_MS", "0")) / 1e3,
                     model=args.served_model_name,
                     fault=env.get("FAKE_FAULT", "none"),
                     fault_every=int(env.get("FAKE_FAULT_EVERY", "0")),
                     fault_after_tokens=int(env.get("FAKE_FAULT_AFTER_TOKENS", "2")),
                     metrics_fault=env.get("FAKE_METRICS_FAULT", "none"),
                     exit_code=int(env.get("FAKE_EXIT_CODE", "7")),
                     never_ready=bool(env.get("FAKE_ENGINE_NEVER_READY")),
                     hang_completions=bool(env.get("FAKE_ENGINE_HANG_COMPLETIONS")))
    web.run_app(build_app(cfg), host=args.host, port=args.port, print=None,
                access_log=None, handle_signals=not env.get("FAKE_ENGINE_IGNORE_SIGTERM"))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        _engine_main(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--itl-ms", type=float, default=0.0)
    p.add_argument("--fault", default="none", choices=FAULTS)
    p.add_argument("--fault-every", type=int, default=0)
    p.add_argument("--fault-after-tokens", type=int, default=2)
    p.add_argument("--metrics-fault", default="none", choices=METRICS_FAULTS)
    p.add_argument("--exit-code", type=int, default=7)
    a = p.parse_args()
    cfg = FakeConfig(ttft_s=a.ttft_ms / 1e3, itl_s=a.itl_ms / 1e3, fault=a.fault,
                     fault_every=a.fault_every, fault_after_tokens=a.fault_after_tokens,
                     metrics_fault=a.metrics_fault, exit_code=a.exit_code)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    web.run_app(build_app(cfg), host="127.0.0.1", port=a.port, print=None, access_log=None,
                backlog=4096)


if __name__ == "__main__":
    main()
