"""TEST FIXTURE: an HTTP proxy in front of the real SeaweedFS that misbehaves on demand.

Not an S3 server: every request is forwarded byte for byte to the real one (the Host header
too, so SigV4 signatures made for the proxy's address still verify upstream), except the GETs
of an object a test chose to break:

- `fail(key, status=503, code="SlowDown")`: answer an S3 error instead (optionally only `times`
  times, only for ranges starting at or after `from_byte`, after waiting `delay_s`); with
  `method="PUT"` the uploads of the object fail instead of its GETs;
- `stall(key)`: accept the request and never answer (until `clear()`);
- `drop(key, after_bytes)`: forward, send the headers and the first bytes, then cut the
  connection;
- `hold(key)`: keep the request waiting until `release()`, then forward it normally;
- `corrupt(key, at_byte)`: forward, with the object's byte `at_byte` flipped in transit (the
  status and length stay right: only a checksum can tell).

`hide_identity()` makes it an S3-compatible server that gives no ETag and no checksums (headers
and listings alike); `hide_identity(last_modified=True)` hides Last-Modified too, leaving the
size as the only thing known of an object.

Every request is recorded (`requests`, `count`), so a test asserts the true number of attempts a
client made, not the number it claims. `Blackhole` is the other hang: a port that completes the
TCP handshake and never says a word.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
               "trailer", "transfer-encoding", "upgrade"}
_BLOCK = 64 << 10


@dataclass
class Seen:
    """One request as the proxy saw it."""

    method: str
    key: str  # object key without the bucket; "" for bucket-level requests (listings)
    range: str | None
    fault: str  # "" when forwarded untouched


@dataclass
class _Fault:
    key: str
    kind: str  # fail | stall | drop | hold | corrupt
    method: str = "GET"  # the requests it breaks: GETs, or PUTs (uploads, parts) for `fail`
    status: int = 503
    code: str = "SlowDown"
    times: int | None = None  # None: every matching GET
    from_byte: int = 0
    delay_s: float = 0.0
    after_bytes: int = 0
    at_byte: int = 0
    released: threading.Event = field(default_factory=threading.Event)

    def matches(self, method: str, key: str, range_start: int, range_end: int) -> bool:
        if method != self.method or key != self.key or self.times == 0 or \
                range_start < self.from_byte:
            return False
        return self.kind != "corrupt" or range_start <= self.at_byte <= range_end


class FaultyS3Proxy:
    """`with FaultyS3Proxy(upstream_url) as proxy:` then point the S3 client at `proxy.endpoint_url`."""

    def __init__(self, upstream_url: str):
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.requests: list[Seen] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._hidden: tuple[str, ...] = ()  # response headers (lowercase prefixes) held back

    # -- faults ---------------------------------------------------------------------------------
    def fail(self, key: str, status: int = 503, code: str = "SlowDown", times: int | None = None,
             from_byte: int = 0, delay_s: float = 0.0, method: str = "GET") -> None:
        self._add(_Fault(key, "fail", method=method, status=status, code=code, times=times,
                         from_byte=from_byte, delay_s=delay_s))

    def stall(self, key: str, times: int | None = None) -> None:
        self._add(_Fault(key, "stall", times=times))

    def drop(self, key: str, after_bytes: int, times: int | None = None) -> None:
        self._add(_Fault(key, "drop", after_bytes=after_bytes, times=times))

    def corrupt(self, key: str, at_byte: int) -> None:
        self._add(_Fault(key, "corrupt", at_byte=at_byte))

    def hold(self, key: str) -> None:
        self._add(_Fault(key, "hold"))

    def release(self) -> None:
        """Let every held request through (and stop holding new ones)."""
        with self._lock:
            for f in [f for f in self._faults if f.kind == "hold"]:
                f.released.set()
                self._faults.remove(f)

    def hide_identity(self, last_modified: bool = False) -> None:
        """Answer as a server that records no ETag and no checksum (and, with `last_modified`,
        no modification time) for any object."""
        self._hidden = ("etag", "x-amz-checksum-", "x-amz-meta-") + (
            ("last-modified",) if last_modified else ())

    def _strip_listing(self, payload: bytes) -> bytes:
        tags = ["ETag", "ChecksumAlgorithm", "ChecksumType"] + (
            ["LastModified"] if "last-modified" in self._hidden else [])
        for tag in tags:
            payload = re.sub(rf"<{tag}>.*?</{tag}>".encode(), b"", payload)
        return payload

    def clear(self) -> None:
        """Back to a healthy endpoint: every fault removed, stalled requests let go."""
        with self._lock:
            for f in self._faults:
                f.released.set()
            self._faults.clear()

    def count(self, method: str = "GET", key: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.requests
                       if r.method == method and (key is None or r.key == key))

    def _add(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def endpoint_url(self) -> str:
        assert self._server is not None, "start() the proxy first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultyS3Proxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy._handle(self)

            do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True,
                         name="faulty-s3-proxy").start()
        return self

    def stop(self) -> None:
        self._closing.set()
        self.clear()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FaultyS3Proxy:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- one request ----------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        path = urlsplit(h.path).path
        bucket_and_key = unquote(path).lstrip("/").split("/", 1)
        key = bucket_and_key[1] if len(bucket_and_key) == 2 else ""
        rng = h.headers.get("Range")
        start, end = 0, 1 << 62
        if rng and rng.startswith("bytes="):
            first, _, last = rng.removeprefix("bytes=").partition("-")
            start, end = int(first or 0), int(last) if last else end
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        if "chunked" in (h.headers.get("Transfer-Encoding") or ""):
            h.send_error(501, "the test proxy forwards Content-Length bodies only")
            return
        fault = None
        with self._lock:
            if key:
                fault = next((f for f in self._faults if f.matches(h.command, key, start, end)),
                             None)
                if fault is not None and fault.times is not None:
                    fault.times -= 1
            self.requests.append(Seen(h.command, key, rng, fault.kind if fault else ""))
        if fault is None:
            self._forward(h, body)
        elif fault.kind == "fail":
            if fault.delay_s:
                fault.released.wait(fault.delay_s)
            self._error(h, fault.status, fault.code, key)
        elif fault.kind == "stall":
            fault.released.wait()  # until clear() or stop(): then hang up without a word
            h.close_connection = True
        elif fault.kind == "hold":
            fault.released.wait()
            self._forward(h, body)
        elif fault.kind == "drop":
            self._forward(h, body, cut_after=fault.after_bytes)
        elif fault.kind == "corrupt":
            self._forward(h, body, flip_at=fault.at_byte - start)

    @staticmethod
    def _error(h: BaseHTTPRequestHandler, status: int, code: str, key: str) -> None:
        xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
               f"<Message>injected by the test proxy</Message><Key>{key}</Key></Error>").encode()
        h.send_response_only(status)
        h.send_header("Content-Type", "application/xml")
        h.send_header("Content-Length", str(len(xml)))
        h.end_headers()
        h.wfile.write(xml)

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes, cut_after: int | None = None,
                 flip_at: int | None = None):
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            conn.putrequest(h.command, h.path, skip_host=True, skip_accept_encoding=True)
            for name, value in h.headers.items():
                if name.lower() not in _HOP_BY_HOP:
                    conn.putheader(name, value)
            conn.endheaders(body or None)
            resp = conn.getresponse()
            length = resp.getheader("Content-Length")
            listing = bool(self._hidden) and h.command == "GET" and \
                len(urlsplit(h.path).path.strip("/").split("/")) == 1
            payload = None if (length is not None and not listing) or h.command == "HEAD" \
                else resp.read()
            if listing and payload is not None:
                payload = self._strip_listing(payload)
            h.send_response_only(resp.status, resp.reason)
            for name, value in resp.getheaders():
                lower = name.lower()
                if lower not in _HOP_BY_HOP and lower != "content-length" and \
                        not lower.startswith(self._hidden or ("\0",)):
                    h.send_header(name, value)
            h.send_header("Content-Length", length if payload is None else str(len(payload)))
            h.end_headers()
            if h.command == "HEAD":
                return
            if payload is not None:
                h.wfile.write(payload)
                return
            sent = 0
            while block := resp.read(_BLOCK):
                if flip_at is not None and sent <= flip_at < sent + len(block):
                    flipped = bytearray(block)
                    flipped[flip_at - sent] ^= 0xFF
                    block = bytes(flipped)
                if cut_after is not None and sent + len(block) > cut_after:
                    h.wfile.write(block[: cut_after - sent])
                    h.wfile.flush()
                    h.connection.shutdown(socket.SHUT_RDWR)  # the connection dies mid-body
                    h.close_connection = True
                    return
                h.wfile.write(block)
                sent += len(block)
        finally:
            conn.close()


class Blackhole:
    """A port that accepts TCP connections and never answers: the hung endpoint.

    `connections` counts the accepted ones, i.e. the true number of attempts a client made.
    """

    def __init__(self):
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="blackhole")

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._held)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._held.append(conn)

    def __enter__(self) -> Blackhole:  # noqa: PYI034
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
        self._sock.close()
        self._thread.join(5)
        with self._lock:
            for conn in self._held:
                conn.close()
