"""The load generator: asyncio + aiohttp against an OpenAI-compatible `/v1/completions`.

Why our own client: at concurrency 256 on two cores, heavier clients (httpx-based, or ones that
tokenize every chunk) spend enough CPU per chunk to delay reading the stream, and the delay shows
up as TTFT and ITL the server never caused. This client pre-serializes every request body, reads
the stream in whatever pieces the socket delivers (`iter_any`), splits SSE events itself and
stamps each event once, parses it with orjson (a quarter of `json`'s cost, and JSON parsing is
most of a client's CPU on fast streams); `/metrics` scrapes are stored raw during a point and
parsed after it. The statistics are pure functions in `onboarding/serving/stats.py`.

What can go wrong is counted, never raised: every failed request is a record whose cause is one
of `ERROR_CAUSES` (docs/serving.md), and a failed `/metrics` scrape is counted beside the point
(`scrape_failures`, `scrape_last_error`): /metrics is a cross-check, and a broken one must not
cost the point its requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp
import dagster as dg
import orjson

from onboarding.serving.rate_verdict import UNDECIDED, RateSlo, RateVerdict, judge, max_looks
from onboarding.serving.stack import COUNT_EXTENSION
from onboarding.serving.stats import RequestRecord, Slo, parse_metrics

_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}
_DETAIL_CHARS = 300


@dataclass(kw_only=True)
class PointRun:
    """Raw outcome of one load point: per-request records and the /metrics texts scraped.

    A scrape that failed (refused, HTTP error, timed out, not Prometheus text) is not stored:
    it is counted in `scrape_failures`, the last one's reason in `scrape_last_error`.
    """

    records: list[RequestRecord]
    duration_s: float
    metrics_before: str | None = None
    metrics_after: str | None = None
    metrics_during: list[str] = field(default_factory=list)
    scrape_failures: int = 0
    scrape_last_error: str | None = None
    # Poisson runs: each request's scheduled arrival (s from the point's start), and why the
    # run stopped sending ("decided": its verdict was in before the bodies or the time ran out)
    arrivals_s: list[float] = field(default_factory=list)
    stopped: str = ""

    def scrape_failed(self, why: str) -> None:
        self.scrape_failures += 1
        self.scrape_last_error = why[:_DETAIL_CHARS]

    def scrape_columns(self) -> dict[str, int | str | None]:
        """Columns for the sweep table, beside the point's own numbers."""
        return {"scrape_failures": self.scrape_failures,
                "scrape_last_error": self.scrape_last_error}

    def drop_unparseable(self) -> None:
        """Parse each stored scrape once, after the point: text that is not Prometheus'
        format (a login page, a proxy's error) is a failed scrape, not a crash later."""
        def valid(text: str | None) -> str | None:
            if text is None:
                return None
            try:
                parse_metrics(text)
            except ValueError as exc:
                self.scrape_failed(f"not Prometheus text ({exc})")
                return None
            return text

        self.metrics_before = valid(self.metrics_before)
        self.metrics_after = valid(self.metrics_after)
        self.metrics_during = [t for t in map(valid, self.metrics_during) if t is not None]


# the ways to count a chunk's tokens, each with the body field it sends (an engine template
# names one: configs/stack.yaml load_generator.count_tokens_by)
COUNT_TOKENS_BY = tuple(COUNT_EXTENSION)


def completion_bodies(model: str, prompts: Sequence[str], max_tokens: int,
                      ignore_eos: bool = True, temperature: float | None = None,
                      count_tokens_by: str = "usage") -> list[bytes]:
    """Request bodies, serialized once before the run so the hot loop does no JSON encoding.

    A chunk can carry several tokens, or a token without text, so the client asks the server
    to count them (`count_tokens_by`): "usage" sets `continuous_usage_stats`, and vLLM puts
    the cumulative token count in every chunk; "token_ids" sets vLLM's `return_token_ids`,
    which puts each chunk's own ids in its choice (and the prompt's ids in the first); "text"
    asks for neither, and every chunk with text counts as one token (`vllm bench serve`'s
    basis: a chunk of k tokens reads as one gap k times too long; the point's `itl_basis`
    says so).

    No temperature unless one is given: the server samples as it would for a user who sets
    none (the model's generation_config), as `vllm bench serve` does. Forcing greedy decoding
    loads the engine being measured: on random weights (a performance twin) greedy
    repeats one or two ids, often ones that produce no text (a twin's vocabulary is larger
    than its shared tokenizer's), and while no text comes out vLLM's incremental detokenizer
    re-decodes the whole prompt and output at every step, so its API server spends several
    times the CPU per token and saturates first."""
    if count_tokens_by not in COUNT_TOKENS_BY:
        raise ValueError(f"count_tokens_by={count_tokens_by!r}: one of {COUNT_TOKENS_BY}")
    extra: dict = {} if temperature is None else {"temperature": temperature}
    options: dict = {"include_usage": True}
    if count_tokens_by == "usage":
        options["continuous_usage_stats"] = True
    elif count_tokens_by == "token_ids":
        extra["return_token_ids"] = True
    return [
        json.dumps({
            "model": model, "prompt": p, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": ignore_eos, **extra, "stream_options": options,
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


class SseEvents:
    """Splits a byte stream into server-sent events, whatever the read boundaries.

    The SSE spec ends a line with CRLF, LF or CR, and an event with an empty line. Each read is
    normalized to LF as it arrives; a read that ends in CR remembers it, so an LF that starts
    the next read is taken as that CRLF's second half. The LF-only hot path costs one `in` scan
    per read.
    """

    __slots__ = ("_after_cr", "_buf")

    def __init__(self) -> None:
        self._buf = b""
        self._after_cr = False

    def feed(self, piece: bytes) -> list[bytes]:
        if self._after_cr and piece.startswith(b"\n"):
            piece = piece[1:]
        self._after_cr = False
        if b"\r" in piece:
            self._after_cr = piece.endswith(b"\r")
            piece = piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *events, self._buf = (self._buf + piece).split(b"\n\n")
        return events


def sse_data(event: bytes) -> bytes | None:
    """The event's data (its `data:` lines joined by LF, stripped), or None when it has none
    (a comment such as a keep-alive, or only other fields)."""
    if event.startswith(b"data:") and b"\n" not in event:
        return event[5:].strip()
    lines = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[1:] if line.startswith(b" ") else line for line in lines).strip()


def error_cause(exc: BaseException, response_started: bool) -> str:
    """The documented cause (`ERROR_CAUSES`) of a request that ended in `exc`.

    Order matters: aiohttp's timeouts are also connection errors, and a refused connect is
    also an OSError. Whether the response had begun decides between a connection lost before
    any answer (a reset on a kept-alive connection, a server that closed it) and a stream cut
    while it was being read.
    """
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect_failed"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "stream_dropped"
    if isinstance(exc, aiohttp.ClientConnectionError | OSError):
        return "stream_dropped" if response_started else "connection_lost"
    if isinstance(exc, aiohttp.ClientResponseError):
        return "bad_response"
    return "client_error"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_DETAIL_CHARS]


async def send_one(session: aiohttp.ClientSession, url: str, body: bytes,
                   point_start: float) -> RequestRecord:
    """One streamed request. Transport and protocol failures become a record with a cause."""
    rec = RequestRecord()
    issued = time.perf_counter()
    rec.start_s = issued - point_start
    wire = _Sent()
    last = None  # when the last chunk that carried a token arrived
    tokens = 0  # counted so far
    usage_chunks = 0  # chunks with choices that carried the server's count (usage or ids)
    done = False
    started = False
    try:
        async with session.post(url, data=body, headers=_JSON_HEADERS,
                                trace_request_ctx=wire) as resp:
            started = True
            sent = wire.at or issued
            rec.client_queue_s = sent - issued
            if resp.status != 200:
                rec.error = f"http_{resp.status}"
                rec.detail = (await resp.read())[:_DETAIL_CHARS].decode(errors="replace")
                return rec
            splitter = SseEvents()
            async for piece in resp.content.iter_any():
                now = time.perf_counter()
                for ev in splitter.feed(piece):
                    if ev.startswith(b"data:") and b"\n" not in ev:  # sse_data's common case
                        data = ev[5:].strip()
                    elif (data := sse_data(ev)) is None:
                        continue
                    if data == b"[DONE]":
                        done = True
                        continue
                    try:
                        obj = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        rec.error, rec.detail = "malformed_sse", data[:_DETAIL_CHARS].decode(
                            errors="replace")
                        return rec
                    if type(obj) is not dict:
                        rec.error, rec.detail = "malformed_sse", f"not an object: {data[:80]!r}"
                        return rec
                    if "error" in obj:
                        rec.error, rec.detail = "server_error_event", str(obj["error"])[
                            :_DETAIL_CHARS]
                        return rec
                    choices = obj.get("choices")
                    usage = obj.get("usage")
                    if choices:
                        c0 = choices[0]
                        if (ids := c0.get("token_ids")) is not None:  # this chunk's own ids
                            new = len(ids)
                            usage_chunks += 1
                        elif usage:  # continuous usage: cumulative tokens, text or none
                            new = (usage.get("completion_tokens") or 0) - tokens
                            usage_chunks += 1
                        else:  # usage only at the end: one token per chunk with text
                            text = c0.get("text")
                            if text is None and (delta := c0.get("delta")):
                                text = delta.get("content")
                            new = 1 if text else 0
                        if new > 0:
                            if last is None:
                                rec.ttft_s = now - sent
                                if new > 1:  # held back with the first: times unseen
                                    rec.itl_s.extend([0.0] * (new - 1))
                            elif new == 1:
                                rec.itl_s.append(now - last)
                            else:  # one chunk, several tokens: the gap is theirs to share
                                rec.itl_s.extend([(now - last) / new] * new)
                            last = now
                            tokens += new
                            rec.content_chunks += 1
                    if usage:
                        rec.prompt_tokens = usage.get("prompt_tokens")
                        rec.output_tokens = usage.get("completion_tokens")
            end = time.perf_counter()
            rec.e2e_s = end - sent
            rec.stream_tokens = tokens
            rec.tokens_from_usage = 0 < rec.content_chunks <= usage_chunks
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        rec.error = rec.error or error_cause(exc, started)  # an HTTP status stays the cause
        rec.detail = rec.detail or _describe(exc)
        return rec
    if not done:
        rec.error, rec.detail = "stream_dropped", "the stream ended without data: [DONE]"
    elif rec.ttft_s is None:
        rec.error, rec.detail = "no_content", _no_content(rec, usage_chunks)
    else:
        rec.ok = True
    return rec


def _no_content(rec: RequestRecord, usage_chunks: int) -> str:
    """Why a finished stream counts no token: none made, or tokens without text on a server
    that counts them only at the end."""
    if usage_chunks:
        return "no token arrived (usage in every chunk)"
    if rec.output_tokens:
        return (f"no chunk carried text, and the server sends usage only at the end: its "
                f"{rec.output_tokens} tokens had no text, so they could not be timed")
    return "no chunk carried text"


class _Scraper:
    """The /metrics scrapes of one point, each bounded by `timeout_s`; a failure is counted on
    `run`, never raised. The first scrape that times out ends the scrapes during the point: a
    stalled endpoint would otherwise cost each later one the whole timeout again, and the
    point its bound. The scrape after the point (`idle`, the load over) is still taken once
    unless the one before it, also idle, timed out: an API server busy with the load answers
    again when it ends, and the point's engine-side delta needs that scrape. A stalled
    endpoint costs a point at most two timeouts."""

    def __init__(self, session: aiohttp.ClientSession, url: str | None, timeout_s: float,
                 run: PointRun):
        self.session, self.url, self.timeout_s, self.run = session, url, timeout_s, run
        self.stalled = False  # a scrape of this point timed out
        self.stalled_idle = False  # ... with no load on the endpoint

    async def scrape(self, *, idle: bool = False) -> str | None:
        url, run = self.url, self.run
        if url is None:
            return None
        if self.stalled_idle or (self.stalled and not idle):
            run.scrape_failed(f"{url}: not scraped: an earlier scrape of this point timed out "
                              f"after {self.timeout_s:g} s")
            return None
        try:
            async with self.session.get(
                    url, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                text = await resp.text()
                if resp.status != 200:
                    run.scrape_failed(f"{url}: HTTP {resp.status} {text[:80]!r}")
                    return None
                return text
        except TimeoutError:
            self.stalled = True
            self.stalled_idle = idle
            run.scrape_failed(f"{url}: timed out after {self.timeout_s:g} s")
        except (aiohttp.ClientError, OSError) as exc:
            run.scrape_failed(f"{url}: {_describe(exc)}")
        return None

    async def loop(self, interval_s: float, stop: asyncio.Event) -> None:
        while self.url is not None and not self.stalled and not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except TimeoutError:
                if (text := await self.scrape()) is not None:
                    self.run.metrics_during.append(text)


async def run_point_async(
    base_url: str, bodies: Sequence[bytes], *, concurrency: int | None = None,
    rate_rps: float | None = None, max_seconds: float, request_timeout_s: float,
    warmup_bodies: Sequence[bytes] = (), warmup_concurrency: int | None = None,
    metrics_path: str | None = "/metrics", scrape_interval_s: float = 1.0,
    scrape_timeout_s: float = 5.0, seed: int = 0, min_requests: int = 0,
    min_seconds: float = 0.0, decide: Callable[[list[RequestRecord]], bool] | None = None,
    look_every: int = 10,
) -> PointRun:
    """Send `bodies` at a fixed concurrency or as Poisson arrivals at `rate_rps`.

    Bounded twice: no request starts after `max_seconds`, and each request is cut at
    `request_timeout_s`. Warm-up requests run first, `warmup_concurrency` of them at a time (the
    point's concurrency when not given; 4 for a rate), and are not recorded. Scrapes are bounded
    by `scrape_timeout_s`, one in flight when the requests are done is abandoned, and after
    one timed out the point scrapes no more during its load, only once after it (unless the
    one before the load timed out too): a stalled /metrics costs a point at most two
    `scrape_timeout_s` in all, never one per scrape.

    At a rate, `decide` (given the finished requests, every `look_every` of them) may stop the
    arrivals early once it returns True, but only after `min_requests` were sent and
    `min_seconds` passed; requests already sent are awaited and recorded all the same (a
    verdict on the fast ones alone would favour the engine).
    """
    if (concurrency is None) == (rate_rps is None):
        raise ValueError("give exactly one of concurrency and rate_rps")
    url = base_url.rstrip("/") + "/v1/completions"
    metrics_url = base_url.rstrip("/") + metrics_path if metrics_path else None
    warm_width = min(len(warmup_bodies), warmup_concurrency or concurrency or 4)
    width = max(concurrency or 1024, warm_width)
    connector = aiohttp.TCPConnector(limit=width + 4, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     trace_configs=[_trace_config()]) as session:
        if warmup_bodies:
            await _fixed_concurrency(session, url, warmup_bodies, warm_width,
                                     time.perf_counter(), float("inf"))
        run = PointRun(records=[], duration_s=0.0)
        scrapes = _Scraper(session, metrics_url, scrape_timeout_s, run)
        run.metrics_before = await scrapes.scrape(idle=True)
        stop = asyncio.Event()
        scraper = asyncio.create_task(scrapes.loop(scrape_interval_s, stop))
        start = time.perf_counter()
        try:
            if concurrency is not None:
                run.records = await _fixed_concurrency(session, url, bodies, concurrency, start,
                                                       start + max_seconds)
            else:
                run.records = await _poisson(
                    session, url, bodies, rate_rps, start, start + max_seconds, seed, run,
                    _Stop(min_requests, min_seconds, decide, look_every))
            run.duration_s = time.perf_counter() - start
        finally:
            stop.set()
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraper
        run.metrics_after = await scrapes.scrape(idle=True)
    run.drop_unparseable()
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


@dataclass
class _Stop:
    """When a Poisson run may stop sending before its bodies or its time run out."""

    min_requests: int = 0
    min_seconds: float = 0.0
    decide: Callable[[list[RequestRecord]], bool] | None = None
    look_every: int = 10


async def _poisson(session, url, bodies, rate_rps, start, deadline, seed, run: PointRun,
                   stop: _Stop):
    """Open loop: arrival i at the sum of i exponential gaps (mean 1/rate, from a
    `random.Random(seed)`, so a seed gives the same schedule), whatever the server does."""
    rng = random.Random(seed)
    tasks = []
    done: list[RequestRecord] = []
    looked = 0
    next_at = start
    run.stopped = "bodies"
    for body in bodies:
        next_at += rng.expovariate(rate_rps)
        if next_at >= deadline:
            run.stopped = "max_seconds"
            break
        if stop.decide is not None and len(done) >= looked + stop.look_every \
                and len(tasks) >= stop.min_requests \
                and time.perf_counter() - start >= stop.min_seconds:
            looked = len(done)
            if stop.decide(list(done)):
                run.stopped = "decided"
                break
        if (delay := next_at - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(send_one(session, url, body, start))
        task.add_done_callback(lambda t: done.append(t.result()))
        tasks.append(task)
        run.arrivals_s.append(next_at - start)
    return list(await asyncio.gather(*tasks))


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
    scrape_timeout_s: float = 5.0

    def run_point(self, base_url: str, bodies: Sequence[bytes], *, concurrency: int | None = None,
                  rate_rps: float | None = None, max_seconds: float, request_timeout_s: float,
                  warmup_bodies: Sequence[bytes] = (), warmup_concurrency: int | None = None,
                  scrape_interval_s: float = 1.0, seed: int = 0, min_requests: int = 0,
                  min_seconds: float = 0.0,
                  decide: Callable[[list[RequestRecord]], bool] | None = None,
                  look_every: int = 10) -> PointRun:
        return _run(run_point_async(
            base_url, bodies, concurrency=concurrency, rate_rps=rate_rps,
            max_seconds=max_seconds, request_timeout_s=request_timeout_s,
            warmup_bodies=warmup_bodies, warmup_concurrency=warmup_concurrency,
            metrics_path=self.metrics_path,
            scrape_interval_s=scrape_interval_s, scrape_timeout_s=self.scrape_timeout_s,
            seed=seed, min_requests=min_requests, min_seconds=min_seconds, decide=decide,
            look_every=look_every))


def measure_at_rate(loadgen: LoadGenerator, base_url: str, bodies: Sequence[bytes], slo: Slo,
                    rate: RateSlo, *, seed: int, request_timeout_s: float,
                    warmup_bodies: Sequence[bytes] = ()) -> tuple[PointRun, RateVerdict]:
    """One open-loop run at `rate.target_rate_rps`, stopped early once its verdict is decided
    (after `rate.min_requests` and `rate.min_seconds`); the verdict is judged again on every
    request sent, those still in flight at the stop included."""
    looks = max_looks(len(bodies), rate)

    def decided(done: list[RequestRecord]) -> bool:
        return judge(done, slo, rate, looks).outcome != UNDECIDED

    run = loadgen.run_point(base_url, bodies, rate_rps=rate.target_rate_rps,
                        max_seconds=rate.max_seconds, request_timeout_s=request_timeout_s,
                        warmup_bodies=warmup_bodies, seed=seed,
                        min_requests=rate.min_requests, min_seconds=rate.min_seconds,
                        decide=decided, look_every=rate.look_every)
    return run, judge(run.records, slo, rate, looks)
