"""The load generator: asyncio + aiohttp against an OpenAI-compatible `/v1/completions`.

Why our own client: at concurrency 256 on two cores, heavier clients (httpx-based, or ones that
tokenize every chunk) spend enough CPU per chunk to delay reading the stream, and the delay shows
up as TTFT and ITL the server never caused. This client pre-serializes every request body, reads
the stream in whatever pieces the socket delivers (`iter_any`), splits SSE events itself and
stamps each event once, parses it with orjson (a quarter of `json`'s cost, and JSON parsing is
most of a client's CPU on fast streams); `/metrics` scrapes are stored raw during a point and parsed after it.
The statistics are pure functions in `onboarding/serving_stats.py`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
import dagster as dg
import orjson

from onboarding.serving_stats import RequestRecord

_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


@dataclass
class PointRun:
    """Raw outcome of one load point: per-request records and the /metrics texts scraped."""

    records: list[RequestRecord]
    duration_s: float
    metrics_before: str | None = None
    metrics_after: str | None = None
    metrics_during: list[str] = field(default_factory=list)


def completion_bodies(model: str, prompts: Sequence[str], max_tokens: int,
                      ignore_eos: bool = True) -> list[bytes]:
    """Request bodies, serialized once before the run so the hot loop does no JSON encoding."""
    return [
        json.dumps({
            "model": model, "prompt": p, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": ignore_eos, "temperature": 0.0,
            "stream_options": {"include_usage": True},
        }).encode()
        for p in prompts
    ]


class _Sent:
    """When the request body actually left for the socket (set by a trace hook)."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at: float | None = None


async def _on_chunk_sent(_session, ctx, _params) -> None:
    sent = ctx.trace_request_ctx
    if sent is not None and sent.at is None:
        sent.at = time.perf_counter()


def _trace_config() -> aiohttp.TraceConfig:
    tc = aiohttp.TraceConfig()
    tc.on_request_chunk_sent.append(_on_chunk_sent)
    return tc


async def send_one(session: aiohttp.ClientSession, url: str, body: bytes,
                   point_start: float) -> RequestRecord:
    """One streamed request. Transport and protocol failures become a record with a cause."""
    rec = RequestRecord()
    issued = time.perf_counter()
    rec.start_s = issued - point_start
    wire = _Sent()
    last = None
    done = False
    try:
        async with session.post(url, data=body, headers=_JSON_HEADERS,
                                trace_request_ctx=wire) as resp:
            sent = wire.at or issued
            rec.client_queue_s = sent - issued
            if resp.status != 200:
                await resp.read()
                rec.error = f"http_{resp.status}"
                return rec
            buf = b""
            async for piece in resp.content.iter_any():
                now = time.perf_counter()
                buf += piece
                *events, buf = buf.split(b"\n\n")
                for ev in events:
                    if not ev.startswith(b"data:"):
                        continue
                    data = ev[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    try:
                        obj = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        rec.error = "malformed_sse"
                        return rec
                    if type(obj) is not dict:
                        rec.error = "malformed_sse"
                        return rec
                    if "error" in obj:
                        rec.error = "server_error_event"
                        return rec
                    choices = obj.get("choices")
                    if choices:
                        c0 = choices[0]
                        text = c0.get("text")
                        if text is None and (delta := c0.get("delta")):
                            text = delta.get("content")
                        if text:
                            if last is None:
                                rec.ttft_s = now - sent
                            else:
                                rec.itl_s.append(now - last)
                            last = now
                            rec.content_chunks += 1
                    if usage := obj.get("usage"):
                        rec.prompt_tokens = usage.get("prompt_tokens")
                        rec.output_tokens = usage.get("completion_tokens")
            end = time.perf_counter()
            rec.e2e_s = end - sent
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
        rec.error = "stream_dropped"
        return rec
    except TimeoutError:
        rec.error = "timeout"
        return rec
    except aiohttp.ClientConnectorError:
        rec.error = "connect_failed"
        return rec
    except aiohttp.ClientError as exc:
        rec.error = f"client_{type(exc).__name__}"
        return rec
    if not done:
        rec.error = "stream_dropped"
    elif rec.ttft_s is None:
        rec.error = "no_content"
    else:
        rec.ok = True
    return rec


async def _scrape(session: aiohttp.ClientSession, url: str | None) -> str | None:
    if url is None:
        return None
    async with session.get(url) as resp:
        resp.raise_for_status()
        return await resp.text()


async def run_point_async(
    base_url: str, bodies: Sequence[bytes], *, concurrency: int | None = None,
    rate_rps: float | None = None, max_seconds: float, request_timeout_s: float,
    warmup_bodies: Sequence[bytes] = (), metrics_path: str | None = "/metrics",
    scrape_interval_s: float = 1.0, seed: int = 0,
) -> PointRun:
    """Send `bodies` at a fixed concurrency or as Poisson arrivals at `rate_rps`.

    Bounded twice: no request starts after `max_seconds`, and each request is cut at
    `request_timeout_s`. Warm-up requests run first and are not recorded.
    """
    if (concurrency is None) == (rate_rps is None):
        raise ValueError("give exactly one of concurrency and rate_rps")
    url = base_url.rstrip("/") + "/v1/completions"
    metrics_url = base_url.rstrip("/") + metrics_path if metrics_path else None
    width = concurrency or 1024
    connector = aiohttp.TCPConnector(limit=width + 4, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     trace_configs=[_trace_config()]) as session:
        if warmup_bodies:
            w = min(len(warmup_bodies), concurrency or 4)
            await _fixed_concurrency(session, url, warmup_bodies, w, time.perf_counter(),
                                     float("inf"))
        run = PointRun(records=[], duration_s=0.0)
        run.metrics_before = await _scrape(session, metrics_url)
        stop = asyncio.Event()
        scraper = asyncio.create_task(
            _scrape_loop(session, metrics_url, scrape_interval_s, stop, run.metrics_during))
        start = time.perf_counter()
        try:
            if concurrency is not None:
                run.records = await _fixed_concurrency(session, url, bodies, concurrency, start,
                                                       start + max_seconds)
            else:
                run.records = await _poisson(session, url, bodies, rate_rps, start,
                                             start + max_seconds, seed)
            run.duration_s = time.perf_counter() - start
        finally:
            stop.set()
            await scraper
        run.metrics_after = await _scrape(session, metrics_url)
    return run


async def _fixed_concurrency(session, url, bodies, concurrency, start, deadline):
    records: list[RequestRecord] = []
    it = iter(bodies)

    async def worker() -> None:
        for body in it:
            if time.perf_counter() >= deadline:
                return
            records.append(await send_one(session, url, body, start))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


async def _poisson(session, url, bodies, rate_rps, start, deadline, seed):
    rng = random.Random(seed)
    tasks = []
    next_at = start
    for body in bodies:
        next_at += rng.expovariate(rate_rps)
        if next_at >= deadline:
            break
        if (delay := next_at - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send_one(session, url, body, start)))
    return list(await asyncio.gather(*tasks))


async def _scrape_loop(session, url, interval_s, stop: asyncio.Event, out: list[str]) -> None:
    if url is None:
        return
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            out.append(await _scrape(session, url))


def _run(coro):
    """uvloop where installed: it halves the client's per-event CPU, which is what keeps
    TTFT/ITL honest at high concurrency on few cores."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


class LoadGenerator(dg.ConfigurableResource):
    """Runs load points against an OpenAI-compatible endpoint; one event loop per point."""

    metrics_path: str = "/metrics"

    def run_point(self, base_url: str, bodies: Sequence[bytes], *, concurrency: int | None = None,
                  rate_rps: float | None = None, max_seconds: float, request_timeout_s: float,
                  warmup_bodies: Sequence[bytes] = (), scrape_interval_s: float = 1.0,
                  seed: int = 0) -> PointRun:
        return _run(run_point_async(
            base_url, bodies, concurrency=concurrency, rate_rps=rate_rps,
            max_seconds=max_seconds, request_timeout_s=request_timeout_s,
            warmup_bodies=warmup_bodies, metrics_path=self.metrics_path,
            scrape_interval_s=scrape_interval_s, seed=seed))
