"""TEST FIXTURE: a fake OpenAI-compatible streaming server that records its own ground truth.

Not an engine. It exists because no real engine can show what a load generator must get right:
a known TTFT and inter-token gap (`--ttft-ms`, `--itl-ms`), and faults on demand. Every
request's real send times are recorded server-side and served at `GET /truth`, so a client's
numbers are compared with what actually happened; so are the first request bodies, so two
clients' requests can be compared field by field.

Streaming as vLLM's API server does it: `--tokens-per-chunk K` sends every chunk after the first
with K tokens (vLLM merges a request's outputs when its consumer lags; the first goes out alone),
`--empty-every N` gives every Nth token empty text (a partial UTF-8 sequence, an id beyond a small
tokenizer's vocabulary; 1 = every token), and `stream_options.continuous_usage_stats` puts the
cumulative `usage` in every chunk unless `--continuous-usage false` (a server that sends usage only
at the end). The truth is per token: a token held back for a later chunk was produced at its own
time, and the engine's `vllm:inter_token_latency_seconds` at /metrics is that truth.

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
  its VLLM_CACHE_ROOT, whether that cache already held what a start compiles into it, which
  the fake leaves behind like an engine's compile cache, and its pid), LOG_FROM (print a real
  engine's recorded log, its argv line left out, before loading: the kernel lines a start's
  log names are that engine's); and FAKE_FAULT, FAKE_FAULT_EVERY,
  FAKE_FAULT_AFTER_TOKENS, FAKE_METRICS_FAULT, FAKE_EXIT_CODE as the server mode's flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import stat
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


@dataclass(kw_only=True)
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
    tokens_per_chunk: int = 1  # of every chunk after the first
    empty_every: int = 0  # every Nth token has empty text; 0 = none
    continuous_usage: bool = True  # honour stream_options.continuous_usage_stats


FAULTS = ("none", "5xx", "drop", "malformed", "crlf", "cr", "reset", "reset_mid", "stall",
          "exit")
# stall_busy: /metrics hangs while a request streams (an API server saturated by the load it
# serves), and answers once none does
METRICS_FAULTS = ("none", "404", "stall", "garbage", "stall_busy")
SEPARATORS = {"crlf": b"\r\n\r\n", "cr": b"\r\r"}
BODIES_KEPT = 16  # what a client sends, for a test comparing two clients' requests


@dataclass(kw_only=True)
class Truth:
    requests: int = 0
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    completed: int = 0
    running: int = 0
    most_running: int = 0  # the most requests streaming at once since the server started
    ttft_sum_s: float = 0.0
    itl_sum_s: float = 0.0
    itl_count: int = 0
    chunks: int = 0
    tokens: int = 0
    metrics_scrapes: int = 0  # GET /metrics, answered or not
    bodies: list[dict] = field(default_factory=list)  # the first BODIES_KEPT request bodies

    def finished(self, token_times: list[float], t0: float, chunks: int) -> None:
        """One request's token times (seconds, perf_counter) become its TTFT and ITLs."""
        self.ttft_s.append(token_times[0] - t0)
        gaps = [b - a for a, b in itertools.pairwise(token_times)]
        self.itl_s.extend(gaps)
        self.itl_sum_s += sum(gaps)
        self.itl_count += len(gaps)
        self.ttft_sum_s += self.ttft_s[-1]
        self.chunks += chunks
        self.tokens += len(token_times)
        self.completed += 1


def _chunk(model: str, text: str, finish: str | None = None, sep: bytes = b"\n\n",
           usage: tuple[int, int] | None = None, token_ids: list[int] | None = None) -> bytes:
    """One SSE event; `usage` (prompt, cumulative completion tokens) as vLLM's continuous
    usage stats put it in every chunk; `token_ids` as vLLM's `return_token_ids` puts this
    chunk's own ids in its choice (vllm/entrypoints/openai/completion/serving.py)."""
    choice: dict = {"index": 0, "text": text, "finish_reason": finish}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    body: dict = {"id": "cmpl-fake", "object": "text_completion", "model": model,
                  "choices": [choice]}
    if usage is not None:
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                         "total_tokens": usage[0] + usage[1]}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + sep


def _usage(model: str, prompt_tokens: int, n: int, sep: bytes = b"\n\n") -> bytes:
    body = {"id": "cmpl-fake", "object": "text_completion", "model": model, "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                      "total_tokens": prompt_tokens + n}}
    return (b"data: " + json.dumps(body, separators=(",", ":")).encode() + sep
            + b"data: [DONE]" + sep)


def chunk_sizes(n: int, tokens_per_chunk: int) -> list[int]:
    """Tokens per chunk for `n` tokens: the first alone, then `tokens_per_chunk` each."""
    if n <= 0:
        return []
    rest = n - 1
    k = max(tokens_per_chunk, 1)
    return [1] + [k] * (rest // k) + ([rest % k] if rest % k else [])


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
    streams: dict[tuple, tuple[list[int], list[bytes], bytes]] = {}

    def stream(n: int, prompt_tokens: int, per_chunk_usage: bool, sep: bytes,
               ids: bool = False) -> tuple[list[int], list[bytes], bytes]:
        """Chunk sizes, chunk events and the whole stream of one request shape (cached: the
        fake must stay faster than any client it measures)."""
        key = (n, prompt_tokens, per_chunk_usage, sep, ids)
        if (hit := streams.get(key)) is None:
            sizes, events, k = chunk_sizes(n, cfg.tokens_per_chunk), [], 0
            for size in sizes:
                text = "".join("" if cfg.empty_every and (i + 1) % cfg.empty_every == 0
                               else " tok" for i in range(k, k + size))
                k += size
                events.append(_chunk(cfg.model, text, "length" if k == n else None, sep,
                                     (prompt_tokens, k) if per_chunk_usage else None,
                                     list(range(k - size, k)) if ids else None))
            tail = _usage(cfg.model, prompt_tokens, n, sep)
            hit = streams[key] = (sizes, events + [tail], b"".join(events) + tail)
        return hit

    async def completions(request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        body = await request.json()
        truth.requests += 1
        idx = truth.requests
        if len(truth.bodies) < BODIES_KEPT:
            truth.bodies.append(body)
        if cfg.hang_completions:
            await asyncio.Event().wait()
        faulty = cfg.fault != "none" and cfg.fault_every > 0 and idx % cfg.fault_every == 0
        if faulty and cfg.fault == "5xx":
            return web.json_response({"error": "injected overload"}, status=503)
        if faulty and cfg.fault == "reset":
            _reset(request)
            return web.Response()
        sep = SEPARATORS.get(cfg.fault, b"\n\n") if faulty else b"\n\n"
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
        opts = body.get("stream_options") or {}
        per_chunk_usage = bool(cfg.continuous_usage and opts.get("include_usage")
                               and opts.get("continuous_usage_stats"))
        sizes, events, whole = stream(n, prompt_tokens, per_chunk_usage, sep,
                                      bool(body.get("return_token_ids")))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        truth.running += 1
        truth.most_running = max(truth.most_running, truth.running)
        try:
            if cfg.itl_s == 0 and not faulty:
                if cfg.ttft_s:
                    await asyncio.sleep(cfg.ttft_s)
                now = time.perf_counter()
                await resp.write(whole)
                truth.finished([now] * n, t0, len(sizes))
            else:
                times: list[float] = []
                k = 0
                for size, event in zip(sizes, events, strict=False):
                    last_k = k + size - 1  # the chunk leaves when its last token is made
                    target = t0 + cfg.ttft_s + last_k * cfg.itl_s
                    if (delay := target - time.perf_counter()) > 0:
                        await asyncio.sleep(delay)
                    if faulty and k <= cfg.fault_after_tokens < k + size \
                            and cfg.fault not in SEPARATORS:
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
                    now = time.perf_counter()  # before the write: a client reads it after
                    await resp.write(event)
                    for i in range(k, last_k):  # held back: made at its own time, sent now
                        made = t0 + cfg.ttft_s + i * cfg.itl_s
                        times.append(min(max(made, times[-1] if times else t0), now))
                    times.append(now)
                    k += size
                await resp.write(events[-1])
                truth.finished(times, t0, len(sizes))
            await resp.write_eof()
            return resp
        finally:
            truth.running -= 1

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=503 if cfg.never_ready else 200)

    async def metrics(_: web.Request) -> web.Response:
        truth.metrics_scrapes += 1
        if cfg.metrics_fault == "404":
            return web.Response(status=404, text="404: Not Found")
        if cfg.metrics_fault == "stall" or (cfg.metrics_fault == "stall_busy" and truth.running):
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
            "# TYPE vllm:inter_token_latency_seconds histogram\n"
            f'vllm:inter_token_latency_seconds_bucket{{{lbl},le="+Inf"}} {truth.itl_count}\n'
            f"vllm:inter_token_latency_seconds_count{{{lbl}}} {truth.itl_count}\n"
            f"vllm:inter_token_latency_seconds_sum{{{lbl}}} {truth.itl_sum_s}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def get_truth(_: web.Request) -> web.Response:
        return web.json_response({"requests": truth.requests, "completed": truth.completed,
                                  "ttft_s": truth.ttft_s, "itl_s": truth.itl_s,
                                  "chunks": truth.chunks, "tokens": truth.tokens,
                                  "metrics_scrapes": truth.metrics_scrapes,
                                  "most_running": truth.most_running,
                                  "bodies": truth.bodies})

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


def install_as_vllm(bin_dir: Path) -> Path:
    """Put this fake in `bin_dir` as a `vllm` executable, for an Engine(bin_dir=...)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "vllm"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {THIS_FILE} "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return bin_dir


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
                compiled and compiled.exists()), "pid": os.getpid()}) + "\n")
        if compiled:
            compiled.parent.mkdir(parents=True, exist_ok=True)
            compiled.write_text("kernels")
    print("INFO fake engine starting", flush=True)
    if recorded := env.get("FAKE_ENGINE_LOG_FROM"):
        print("\n".join(Path(recorded).read_text(errors="replace").splitlines()[1:]), flush=True)
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
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--empty-every", type=int, default=0)
    p.add_argument("--continuous-usage", type=lambda v: v.lower() in ("1", "true", "yes"),
                   default=True)
    a = p.parse_args()
    cfg = FakeConfig(ttft_s=a.ttft_ms / 1e3, itl_s=a.itl_ms / 1e3, fault=a.fault,
                     fault_every=a.fault_every, fault_after_tokens=a.fault_after_tokens,
                     metrics_fault=a.metrics_fault, exit_code=a.exit_code,
                     tokens_per_chunk=a.tokens_per_chunk, empty_every=a.empty_every,
                     continuous_usage=a.continuous_usage)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    web.run_app(build_app(cfg), host="127.0.0.1", port=a.port, print=None, access_log=None,
                backlog=4096)


if __name__ == "__main__":
    main()
