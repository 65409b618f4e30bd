"""A small pooled HTTP/1.1 keep-alive client (``httptools`` parsing): the per-call path to the workers.

Pooling, timeouts and reuse rules: docs/live-gateway.md ("The worker pool"). Every error is an ``HttpError``;
``asyncio.CancelledError`` passes through, the connection closed."""

from __future__ import annotations

import asyncio
import math
import ssl
from collections import deque
from typing import Final, NamedTuple, cast
from urllib.parse import urlsplit

import httptools

# A body's pieces held unread beyond this pause reading from the socket until the reader takes them.
_HIGH_WATER: Final = 256 << 10
_USER_AGENT: Final = b"hexgen-flow"


class HttpError(Exception):
    """A request failed (the subclass says how; the message is what the caller's own error says)."""


class ConnectError(HttpError):
    """No connection was made: refused, unreachable, a TLS failure, or not within the connect timeout."""


class HeadersTimeout(HttpError):
    """The answer's headers did not come within the request's headers timeout."""


class IdleTimeout(HttpError):
    """The answer sent nothing for the read's idle timeout."""


class BodyTooLarge(HttpError):
    """The answer's body is over the cap it was read with."""


class ConnectionBroken(HttpError):
    """The connection broke, or the answer was malformed, before the answer was whole."""


Origin = tuple[str, str, int]
"""(scheme, host, port) of a server: the key of a pool of connections."""


class Prepared(NamedTuple):
    """A request's bytes up to its ``Content-Length`` value, and where to send it (``HttpClient.prepare``)."""

    origin: Origin
    head: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection: an asyncio protocol feeding ``httptools``, with one answer's state. A failure
    is kept as its class and message (an exception would hold frames that hold this connection)."""

    __slots__ = (
        "_buffered",
        "_cap",
        "_chunks",
        "_client",
        "_deadline",
        "_error",
        "_loop",
        "_parser",
        "_paused",
        "_received",
        "_timer",
        "_transport",
        "_waiter",
        "busy",
        "chunked",
        "closed",
        "content_length",
        "content_type",
        "done",
        "drained",
        "headers_done",
        "idle_since",
        "keep_alive",
        "origin",
        "status",
    )

    def __init__(self, client: HttpClient, origin: Origin) -> None:
        self._client = client
        self._loop = client.loop
        self.origin = origin
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.busy = False
        self._waiter: asyncio.Future[bool] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = math.inf
        self._begin()

    def _begin(self) -> None:
        self.status = 0
        self.content_type = b""
        self.content_length: int | None = None
        self.chunked = False
        self.headers_done = False
        self.done = False
        self.drained = False
        self.keep_alive = False
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._received = 0
        self._cap: int | None = None
        self._error: tuple[type[HttpError], str] | None = None
        self._paused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport (asyncio's or uvloop's: a stream transport, whatever its class)."""
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        """Feed the parser; bytes after a whole answer (or on an idle connection) close the connection."""
        if self.busy and not self.done:
            try:
                self._parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                if not self.done:
                    self._fail(ConnectionBroken, f"malformed answer: {exc}")
                    return
                self.keep_alive = False  # a whole answer, then more: keep the answer, drop the connection
                self.abort()
            return
        self.keep_alive = False
        self.abort()

    def eof_received(self) -> bool:
        """The server closed its side: close ours too."""
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection closed: an answer read until a clean close is whole, any other one broken."""
        self.closed = True
        if self.busy and not self.done and self._error is None:
            if exc is None and self.headers_done and self.content_length is None and not self.chunked:
                self.done = True  # a body delimited by the connection's (clean) close: no length, not chunked
                self.keep_alive = False
            else:
                why = f": {exc}" if exc is not None else ""
                self._error = (ConnectionBroken, f"the server closed the connection before the answer was whole{why}")
            self._wake()
        self._client._closed(self)

    # httptools callbacks (the parser calls only the callbacks a protocol has)

    def on_message_begin(self) -> None:
        """A second answer to one request is unsolicited: stop the parser."""
        if self.done:
            raise ConnectionBroken("the server sent more than one answer to one request")

    def on_header(self, name: bytes, value: bytes) -> None:
        """Keep the headers the client reads: the content type, length and transfer encoding."""
        name = name.lower()
        if name == b"content-type":
            self.content_type = value
        elif name == b"content-length":
            try:
                self.content_length = int(value)
            except ValueError:
                self._fail(ConnectionBroken, f"malformed answer: Content-Length {value[:40]!r}")
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            self.chunked = True

    def on_headers_complete(self) -> None:
        """The status line and headers are in."""
        if self._error is not None:
            return
        self.status = self._parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        """Hold a piece of the body for the reader (within its cap; pausing the socket past the high water)."""
        if self._error is not None:
            return
        self._received += len(body)
        if self._cap is not None and self._received > self._cap:
            self._fail(BodyTooLarge, f"answer is over the limit of {self._cap} bytes")
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        """The answer is whole."""
        if self._error is not None:
            return
        self.done = True
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()

    # the reader's side

    def _fail(self, kind: type[HttpError], message: str) -> None:
        if self._error is None:
            self._error = (kind, message)
        self._wake()
        self.abort()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(True)

    async def wait(self, timeout: float | None) -> bool:
        """Until a callback wakes the reader (True) or ``timeout`` seconds pass (False; one re-arming timer)."""
        fut: asyncio.Future[bool] = self._loop.create_future()
        self._waiter = fut
        if timeout is None:
            self._deadline = math.inf
        else:
            self._deadline = deadline = self._loop.time() + timeout
            timer = self._timer
            if timer is None or timer.when() > deadline:
                if timer is not None:
                    timer.cancel()
                self._timer = self._loop.call_at(deadline, self._on_timer)
        try:
            return await fut
        finally:
            self._waiter = None

    def _on_timer(self) -> None:
        self._timer = None
        w = self._waiter
        if w is None or w.done() or self._deadline == math.inf:
            return  # nobody waits with a deadline: the next wait arms a timer
        if self._loop.time() >= self._deadline:
            w.set_result(False)
        else:
            self._timer = self._loop.call_at(self._deadline, self._on_timer)

    def stop_timer(self) -> None:
        """Cancel the timer (a live one would keep the connection referenced)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def raise_error(self) -> None:
        """Raise the recorded failure, if any."""
        if self._error is not None:
            kind, message = self._error
            raise kind(message)

    def take(self) -> bytes:
        """The body's pieces held so far, joined (resuming the socket if it was paused)."""
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    def set_cap(self, cap: int) -> None:
        """Refuse a body of more than ``cap`` bytes (at once, when more came already)."""
        self._cap = cap
        if self._received > cap:
            self._fail(BodyTooLarge, f"answer is over the limit of {cap} bytes")

    def send(self, data: bytes) -> None:
        """Start a request on this (idle, open) connection."""
        assert self._transport is not None and not self.busy
        self._begin()
        self.busy = True
        self._transport.write(data)

    def reusable(self) -> bool:
        """Whether the answer was whole and read, and the server keeps the connection open."""
        return self.done and self.drained and self.keep_alive and self._error is None and not self.closed

    def abort(self) -> None:
        """Close the socket now (idempotent; ``connection_lost`` follows)."""
        if self._transport is not None and not self.closed:
            self.closed = True
            self._transport.abort()


class Response:
    """An answer whose status and headers came; read its body, then ``release`` it once."""

    __slots__ = ("_conn", "_released", "status")

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._released = False
        self.status = conn.status

    @property
    def content_type(self) -> str:
        """The media type, lower case and without parameters (``application/octet-stream`` when not given)."""
        raw = self._conn.content_type.partition(b";")[0].strip().lower()
        return raw.decode("latin-1") if raw else "application/octet-stream"

    async def read_chunk(self, idle_s: float | None) -> bytes:
        """The body's pieces since the last read (b"" at its end), waiting at most ``idle_s`` for one."""
        conn = self._conn
        while True:
            conn.raise_error()
            if conn._chunks:
                return conn.take()
            if conn.done:
                conn.drained = True
                return b""
            if not await conn.wait(idle_s):
                raise IdleTimeout(f"timed out: the answer sent nothing for {idle_s:g} s")

    async def read_all(self, idle_s: float | None, cap: int) -> bytes:
        """The whole body, each piece within ``idle_s`` seconds; ``BodyTooLarge`` over ``cap`` bytes."""
        conn = self._conn
        n = conn.content_length
        if n is not None and n > cap:
            raise BodyTooLarge(f"answer of {n} bytes is over the limit of {cap}")
        conn.set_cap(cap)
        if conn.done:  # the usual case: the body came with the headers
            conn.raise_error()
            conn.drained = True
            return conn.take()
        parts: list[bytes] = []
        while chunk := await self.read_chunk(idle_s):
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Return the connection to the pool when reusable, else close it (idempotent)."""
        if not self._released:
            self._released = True
            conn = self._conn
            conn.stop_timer()
            conn.busy = False
            conn._client._release(conn)


class HttpClient:
    """The pool of keep-alive connections, per origin, newest first; create and use it in one event loop
    (``connect_s``: TCP and TLS; ``keepalive_expiry_s``: how long an idle connection may be reused)."""

    def __init__(
        self,
        *,
        connect_s: float = 2.0,
        keepalive_expiry_s: float = 4.0,
        max_connections: int = 2048,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.connect_s = connect_s
        self.keepalive_expiry_s = keepalive_expiry_s
        self.max_connections = max_connections
        self.loop = asyncio.get_running_loop()
        self._ssl = ssl_context
        self._idle: dict[Origin, list[_Connection]] = {}
        self._open = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._closed_client = False

    @staticmethod
    def prepare(
        url: str, path: str, *, content_type: bytes = b"application/json", method: str = "POST", headers: bytes = b""
    ) -> Prepared:
        """The ``method`` (``POST``) of ``path`` under the base ``url``, up to its ``Content-Length`` value
        (``headers``: more header lines, each ending in CRLF)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host_header = parts.netloc.rpartition("@")[2]
        target = parts.path.rstrip("/") + path
        head = (
            f"{method} {target} HTTP/1.1\r\nHost: {host_header}\r\n".encode("latin-1")
            + b"User-Agent: "
            + _USER_AGENT
            + b"\r\nAccept: */*\r\n"
            + headers
            + b"Content-Type: "
            + content_type
            + b"\r\nContent-Length: "
        )
        return Prepared((parts.scheme, parts.hostname, port), head)

    async def request(self, prepared: Prepared, body: bytes, *, headers_s: float | None) -> Response:
        """Send the request; wait at most ``headers_s`` for the answer's headers. ``release`` the ``Response``."""
        conn = self._pooled(prepared.origin)
        if conn is None:
            conn = await self._connect(prepared.origin)
        try:
            conn.send(b"%s%d\r\n\r\n%s" % (prepared.head, len(body), body))
            if not conn.headers_done:
                deadline = None if headers_s is None else self.loop.time() + headers_s
                while not conn.headers_done:
                    conn.raise_error()
                    left = None if deadline is None else deadline - self.loop.time()
                    if (left is not None and left <= 0) or not await conn.wait(left):
                        raise HeadersTimeout(f"timed out: no response headers within {headers_s:g} s")
            conn.raise_error()
        except BaseException:
            conn.stop_timer()
            conn.busy = False
            conn.abort()
            raise
        return Response(conn)

    async def fetch(
        self, prepared: Prepared, body: bytes, *, headers_s: float | None, idle_s: float | None, cap: int
    ) -> tuple[int, bytes]:
        """``request``, then the status and the whole body (``Response.read_all``), the connection released."""
        r = await self.request(prepared, body, headers_s=headers_s)
        try:
            return r.status, await r.read_all(idle_s, cap)
        finally:
            r.release()

    async def aclose(self) -> None:
        """Close the idle connections; those in use close when released. Idempotent."""
        self._closed_client = True
        idle = [conn for conns in self._idle.values() for conn in conns]
        self._idle.clear()
        for conn in idle:
            conn.abort()
        while self._slot_waiters:
            self._wake_slot_waiter()
        if idle:
            await asyncio.sleep(0)  # the aborted sockets close in the loop's next step: let them

    # the pool

    def _pooled(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        fresh_after = self.loop.time() - self.keepalive_expiry_s
        while idle:
            conn = idle.pop()
            if conn.idle_since > fresh_after and not conn.closed:
                return conn
            conn.abort()  # the newest has expired: so have all older ones
        return None

    def _release(self, conn: _Connection) -> None:
        if not conn.reusable() or self._closed_client or self._slot_waiters:
            conn.abort()
            return
        now = self.loop.time()
        conn.idle_since = now
        idle = self._idle.get(conn.origin)
        if idle is None:
            idle = self._idle[conn.origin] = []
        stale = now - self.keepalive_expiry_s
        while idle and idle[0].idle_since <= stale:
            idle.pop(0).abort()
        idle.append(conn)

    def _closed(self, conn: _Connection) -> None:
        if not conn.busy:
            idle = self._idle.get(conn.origin)
            if idle is not None and conn in idle:
                idle.remove(conn)
        self._give_back_slot()

    def _give_back_slot(self) -> None:
        self._open -= 1
        self._wake_slot_waiter()

    def _wake_slot_waiter(self) -> None:
        while self._slot_waiters:
            w = self._slot_waiters.popleft()
            if not w.done():
                w.set_result(None)
                break

    async def _take_slot(self) -> None:
        # At the limit: close the oldest idle connection, or wait for one to close.
        while self._open >= self.max_connections:
            if self._closed_client:
                raise ConnectError("cannot connect: the client is closed")
            oldest = min((v[0] for v in self._idle.values() if v), key=lambda c: c.idle_since, default=None)
            if oldest is not None:
                self._idle[oldest.origin].pop(0)
                oldest.abort()  # its connection_lost gives the room back (a later loop iteration)
            w: asyncio.Future[None] = self.loop.create_future()
            self._slot_waiters.append(w)
            try:
                await w
            except BaseException:
                if w.done() and not w.cancelled():
                    self._wake_slot_waiter()  # the room it was woken for is still free: pass it on
                raise
        self._open += 1

    async def _connect(self, origin: Origin) -> _Connection:
        if self._closed_client:
            raise ConnectError("cannot connect: the client is closed")
        await self._take_slot()
        scheme, host, port = origin
        conn = _Connection(self, origin)
        ctx: ssl.SSLContext | None = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        bound = asyncio.timeout(self.connect_s)
        try:
            async with bound:
                await self.loop.create_connection(lambda: conn, host, port, ssl=ctx)
        except BaseException as exc:
            if conn._transport is None:  # no connection_lost will come to give the room back
                self._give_back_slot()
            else:
                conn.abort()
            if isinstance(exc, TimeoutError) and bound.expired():
                raise ConnectError(f"cannot connect within {self.connect_s:g} s") from None
            if isinstance(exc, OSError):
                raise ConnectError(f"cannot connect: {str(exc) or type(exc).__name__}") from exc
            raise
        return conn
