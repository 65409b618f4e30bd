"""The calls' HTTP client (``gateway.live.httpclient``) against scripted raw-socket servers: keep-alive
reuse and expiry, every way of framing an answer, every failure sorted, and a connection closed (the
server sees it) whenever its answer was not read whole."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.config.gateway import TimeoutsConfig
from gateway.errors import WorkerError
from gateway.live.httpclient import (
    BodyTooLarge,
    ConnectError,
    ConnectionBroken,
    HeadersTimeout,
    HttpClient,
    IdleTimeout,
)
from gateway.live.transport import HttpTransport, _payload
from tests.emulator_process import free_port
from tests.live.fake_transport import chat_call
from tests.live.harness import worker_at

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]
OK = b'{"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}'


class Server:
    """A loopback server running ``handler`` per connection; it records what it saw."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.requests: list[bytes] = []
        self.disconnects = 0
        self.disconnected = asyncio.Event()
        self.port = 0
        self.tasks: set[asyncio.Task[Any]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.saw_disconnect()  # a write or read failed: the client closed the connection
        except asyncio.CancelledError:
            pass  # stopped by ``serve`` at the test's end (ending cancelled would log an error in 3.11)
        finally:
            self.open -= 1
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def request(self, reader: asyncio.StreamReader) -> bytes | None:
        """The next request (head and body), or None when the client closed the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self.saw_disconnect()
            return None
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        req = head + await reader.readexactly(length)
        self.requests.append(req)
        return req

    async def until_disconnect(self, reader: asyncio.StreamReader) -> None:
        """Wait for the client to close the connection."""
        while await reader.read(65536):
            pass
        self.saw_disconnect()

    def saw_disconnect(self) -> None:
        self.disconnects += 1
        self.disconnected.set()


@contextlib.asynccontextmanager
async def serve(handler: Handler, *, tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    server = Server(handler)
    srv = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=tls)
    server.port = srv.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        srv.close()
        for task in server.tasks:
            task.cancel()
        await asyncio.gather(*server.tasks, return_exceptions=True)
        await srv.wait_closed()


def answer(body: bytes = OK, *, status: int = 200, extra: bytes = b"", ctype: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s" % (
        status,
        ctype,
        len(body),
        extra,
        body,
    )


async def keep_answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
    while await server.request(reader) is not None:
        writer.write(answer())


@contextlib.asynccontextmanager
async def client(**kw: Any) -> AsyncIterator[HttpClient]:
    c = HttpClient(**kw)
    try:
        yield c
    finally:
        await c.aclose()
        await asyncio.sleep(0)  # let the aborted transports finish closing


def _idle(c: HttpClient) -> int:
    """Idle connections in the client's pool."""
    return sum(len(v) for v in c._idle.values())


async def post(c: HttpClient, server: Server, body: bytes = b"{}", *, headers_s: float | None = 5.0) -> bytes:
    r = await c.request(HttpClient.prepare(f"http://127.0.0.1:{server.port}", "/v1/x"), body, headers_s=headers_s)
    try:
        return await r.read_all(5.0, 1 << 20)
    finally:
        r.release()


async def test_a_connection_is_kept_alive_and_reused_for_the_next_request() -> None:
    async with serve(keep_answering) as server, client() as c:
        for _ in range(3):
            assert await post(c, server, b'{"a": 1}') == OK
        assert server.connections == 1 and len(server.requests) == 3
        assert c._open == 1 and _idle(c) == 1
        first = server.requests[0]
        assert first.startswith(b"POST /v1/x HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"Content-Length: 8\r\n" in first and first.endswith(b'\r\n\r\n{"a": 1}')


async def test_an_idle_connection_past_its_expiry_is_closed_not_reused() -> None:
    async with serve(keep_answering) as server, client(keepalive_expiry_s=0.05) as c:
        await post(c, server)
        await asyncio.sleep(0.2)
        await post(c, server)
        assert server.connections == 2
        await asyncio.wait_for(server.disconnected.wait(), 5)  # the expired one was closed
        assert c._open == 1


async def test_a_chunked_answer_in_pieces_is_read_whole_and_its_connection_reused() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        while await server.request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
            for piece in (OK[:10], OK[10:50], OK[50:]):
                await writer.drain()
                await asyncio.sleep(0.01)
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            writer.write(b"0\r\n\r\n")

    async with serve(chunked) as server, client() as c:
        assert await post(c, server) == OK
        assert await post(c, server) == OK
        assert server.connections == 1


async def test_an_answer_read_until_the_close_is_whole_and_its_connection_not_reused() -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + OK)

    async with serve(until_close) as server, client() as c:
        assert await post(c, server) == OK
        assert await post(c, server) == OK
        assert server.connections == 2


async def test_a_server_that_closes_mid_answer_breaks_the_call() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(answer()[:-20])

    async with serve(cut) as server, client() as c:
        with pytest.raises(ConnectionBroken, match="before the answer was whole"):
            await post(c, server)
        assert c._open == 0


async def test_a_malformed_answer_breaks_the_call() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(b"<html>not http</html>\r\n\r\n")
        await server.until_disconnect(reader)

    async with serve(garbage) as server, client() as c:
        with pytest.raises(ConnectionBroken, match="malformed answer"):
            await post(c, server)
        await asyncio.wait_for(server.disconnected.wait(), 5)


async def test_a_refused_connection_is_a_connect_error() -> None:
    async with client() as c:
        with pytest.raises(ConnectError) as info:
            await c.request(HttpClient.prepare(f"http://127.0.0.1:{free_port()}", "/v1/x"), b"{}", headers_s=1)
        assert str(info.value).startswith("cannot connect: ")
        assert c._open == 0


async def test_no_headers_within_the_headers_timeout_closes_the_connection() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        await server.until_disconnect(reader)

    async with serve(silent) as server, client() as c:
        with pytest.raises(HeadersTimeout, match=r"within 0\.1 s"):
            await post(c, server, headers_s=0.1)
        await asyncio.wait_for(server.disconnected.wait(), 5)
        assert c._open == 0


async def test_a_body_that_stalls_past_the_idle_timeout_closes_the_connection() -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(answer()[:-20])
        await server.until_disconnect(reader)

    async with serve(stall) as server, client() as c:
        r = await c.request(HttpClient.prepare(f"http://127.0.0.1:{server.port}", "/"), b"{}", headers_s=1)
        try:
            with pytest.raises(IdleTimeout, match=r"nothing for 0\.1 s"):
                await r.read_all(0.1, 1 << 20)
        finally:
            r.release()
        await asyncio.wait_for(server.disconnected.wait(), 5)


async def test_a_body_that_keeps_coming_is_never_idle_however_long_it_takes_then_stalls() -> None:
    """Gaps shorter than the idle timeout, for several of its lengths in all; then a longer one."""

    async def steady(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(20):
            writer.write(b"1\r\n%d\r\n" % (i % 10))
            await writer.drain()
            await asyncio.sleep(0.02)
        await server.until_disconnect(reader)

    async with serve(steady) as server, client() as c:
        r = await c.request(HttpClient.prepare(f"http://127.0.0.1:{server.port}", "/"), b"{}", headers_s=1)
        got = b""
        try:
            with pytest.raises(IdleTimeout):
                while True:
                    got += await r.read_chunk(0.25)
        finally:
            r.release()
        assert got == b"0123456789" * 2
        await asyncio.wait_for(server.disconnected.wait(), 5)


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_an_answer_over_the_cap_is_refused_and_its_connection_closed(framing: str) -> None:
    big = b"x" * 5000

    async def large(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        if framing == "length":
            writer.write(answer(big))
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(5):
                writer.write(b"3e8\r\n" + big[:1000] + b"\r\n")
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")
        await server.until_disconnect(reader)

    async with serve(large) as server, client() as c:
        r = await c.request(HttpClient.prepare(f"http://127.0.0.1:{server.port}", "/"), b"{}", headers_s=1)
        try:
            with pytest.raises(BodyTooLarge, match="over the limit of 1024"):
                await r.read_all(1.0, 1024)
        finally:
            r.release()
        await asyncio.wait_for(server.disconnected.wait(), 5)


@pytest.mark.parametrize("when", ["headers", "body"])
async def test_a_cancelled_request_closes_its_connection_and_the_server_sees_it(when: str) -> None:
    got = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        if when == "body":
            writer.write(answer()[:-20])
        got.set()
        await server.until_disconnect(reader)

    async with serve(slow) as server, client() as c:
        task = asyncio.create_task(post(c, server))
        await asyncio.wait_for(got.wait(), 5)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.disconnected.wait(), 5)
        assert c._open == 0


async def test_connection_close_from_the_server_is_honoured() -> None:
    async def close_asked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(answer(extra=b"connection: close\r\n"))
        await server.until_disconnect(reader)  # the server leaves it to the client to close

    async with serve(close_asked) as server, client() as c:
        assert await post(c, server) == OK
        await asyncio.wait_for(server.disconnected.wait(), 5)
        assert await post(c, server) == OK
        assert server.connections == 2


async def test_bytes_that_answer_no_request_spoil_the_connection() -> None:
    async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(answer() + answer())  # a second, unsolicited answer
        await server.until_disconnect(reader)

    async with serve(chatty) as server, client() as c:
        assert await post(c, server) == OK  # the answer itself is whole and kept
        await asyncio.wait_for(server.disconnected.wait(), 5)
        assert _idle(c) == 0


async def test_concurrent_requests_each_get_a_connection_never_pipelined() -> None:
    async def one_at_a_time(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        while await server.request(reader) is not None:
            await asyncio.sleep(0.05)
            # Nothing more may have come on this connection while its request was unanswered.
            assert not reader._buffer  # type: ignore[attr-defined]
            writer.write(answer())

    async with serve(one_at_a_time) as server, client() as c:
        for _ in range(2):
            assert await asyncio.gather(*(post(c, server) for _ in range(8))) == [OK] * 8
        assert server.connections == 8 and len(server.requests) == 16


async def test_at_most_max_connections_are_open_and_the_others_wait() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        while await server.request(reader) is not None:
            await asyncio.sleep(0.02)
            writer.write(answer())

    async with serve(slow) as server, client(max_connections=2) as c:
        assert await asyncio.gather(*(post(c, server) for _ in range(6))) == [OK] * 6
        assert server.most_open <= 2 and c._open <= 2


async def test_at_the_limit_an_idle_connection_to_another_origin_is_closed_to_make_room() -> None:
    async with serve(keep_answering) as a, serve(keep_answering) as b, client(max_connections=1) as c:
        assert await post(c, a) == OK
        assert await post(c, b) == OK  # a's idle connection closed for it
        await asyncio.wait_for(a.disconnected.wait(), 5)
        assert c._open == 1 and _idle(c) == 1


async def test_an_https_origin_is_reached_over_tls_and_kept_alive(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    make_cert = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
    subprocess.run(
        [*make_cert, "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    async with serve(keep_answering, tls=server_tls) as server:
        async with client(ssl_context=ssl.create_default_context(cafile=str(cert))) as c:
            url = f"https://127.0.0.1:{server.port}"
            for _ in range(2):
                r = await c.request(HttpClient.prepare(url, "/v1/x"), b"{}", headers_s=5)
                try:
                    assert await r.read_all(5, 1 << 20) == OK
                finally:
                    r.release()
            assert server.connections == 1
        async with client() as c:  # the default context verifies the certificate: this one is not trusted
            with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await c.request(HttpClient.prepare(url, "/v1/x"), b"{}", headers_s=5)


# Through the transport: the errors sorted for the pool, and the body's bytes.


async def test_the_transport_answers_with_the_workers_exact_bytes_and_sends_the_body_once_serialised(
    tmp_path: Path,
) -> None:
    async with serve(keep_answering) as server:
        t = HttpTransport()
        call = chat_call({"messages": [{"role": "user", "content": "hé"}]}, priority=3)
        try:
            worker = worker_at(tmp_path, f"http://127.0.0.1:{server.port}")
            res = await t.send(worker, call)
            assert res.raw == OK and res.body == json.loads(OK) and (res.prompt_tokens, res.completion_tokens) == (3, 1)
            cached = call.body_json
            assert cached is not None
            await t.send(worker, call)  # a retry: the body is not serialised again
            assert call.body_json is cached
            sent = [json.loads(r.split(b"\r\n\r\n", 1)[1]) for r in server.requests]
            want = {"priority": 3, **call.body, "model": worker.served_model}
            assert sent == [want, want]
        finally:
            await t.aclose()


@pytest.mark.parametrize("split", [0, 3, 12, 40])
async def test_a_stream_is_relayed_byte_for_byte_and_its_usage_found_wherever_its_line_is_cut(
    tmp_path: Path, split: int
) -> None:
    """The usage event (``stream_options.include_usage``) comes after more than 64 KiB of events, cut into
    two pieces ``split`` bytes into its line (0: not cut)."""
    events = [b'data: {"choices": [{"delta": {"content": "%s"}}]}\n\n' % (b"x" * 200) for _ in range(400)]
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 400}}\n\n'
    pieces = [*events, usage[:split], usage[split:] + b"data: [DONE]\n\n"]
    pieces = [p for p in pieces if p]

    async def sse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for piece in pieces:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            # The client reads what came so far; the cut usage line must come in two reads.
            await asyncio.sleep(0.05 if piece is pieces[-2] else 0)
        writer.write(b"0\r\n\r\n")
        await server.until_disconnect(reader)

    async with serve(sse) as server:
        t = HttpTransport()
        call = chat_call({"messages": [], "stream": True}, stream=True)
        try:
            res = await t.send(worker_at(tmp_path, f"http://127.0.0.1:{server.port}"), call)
        finally:
            await t.aclose()
        assert (res.body, res.raw, res.prompt_tokens, res.completion_tokens) == (None, None, 7, 400)
        assert call.stream is not None and call.streamed
        relayed = b""
        while not call.stream.empty():
            relayed += call.stream.get_nowait() or b""
        assert relayed == b"".join(pieces)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"max_tokens": 4},
        {"priority": 9, "max_tokens": 4},
        {"model": "theirs", "max_tokens": 4},
        {"model": "theirs"},
        {"priority": 9, "model": "theirs", "text": 'a "quoted" ünïcode \u2028'},
    ],
)
def test_the_payload_means_what_the_dict_display_it_replaces_means(body: dict[str, Any]) -> None:
    call = chat_call(body, priority=2)
    for _ in range(2):  # built, then from the cache
        raw = _payload(call, b'"served"')
        assert json.loads(raw) == {"priority": 2, **body, "model": "served"}
        assert raw.count(b'"model"') == 1 and raw.count(b'"priority"') == 1


async def test_the_transport_sorts_client_failures_as_worker_errors(tmp_path: Path) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(answer()[:-20])

    t = HttpTransport(TimeoutsConfig(connect_s=1.0))
    try:
        with pytest.raises(WorkerError, match="cannot connect") as info:
            await t.send(worker_at(tmp_path, f"http://127.0.0.1:{free_port()}"), chat_call({}))
        assert info.value.refused
        with pytest.raises(WorkerError, match="transport error: not an http"):
            await t.send(dataclasses.replace(worker_at(tmp_path, "http://127.0.0.1:1"), url="unix:/x"), chat_call({}))
        async with serve(cut) as server:
            with pytest.raises(WorkerError, match="transport error: the server closed the connection") as info:
                await t.send(worker_at(tmp_path, f"http://127.0.0.1:{server.port}"), chat_call({}))
            assert not info.value.refused
    finally:
        await t.aclose()


def test_a_url_that_is_not_http_is_refused_when_prepared() -> None:
    with pytest.raises(ValueError, match="not an http"):
        HttpClient.prepare("ftp://host/", "/v1/x")
    p = HttpClient.prepare("https://[::1]:8443/prefix/", "/v1/x")
    assert p.origin == ("https", "::1", 8443)
    assert p.head.startswith(b"POST /prefix/v1/x HTTP/1.1\r\nHost: [::1]:8443\r\n")
    assert socket.AF_INET6  # IPv6 literals keep their brackets in Host only


@pytest.mark.parametrize(
    "scenario",
    [
        test_a_connection_is_kept_alive_and_reused_for_the_next_request,
        test_a_chunked_answer_in_pieces_is_read_whole_and_its_connection_reused,
        test_an_answer_read_until_the_close_is_whole_and_its_connection_not_reused,
        test_no_headers_within_the_headers_timeout_closes_the_connection,
        test_connection_close_from_the_server_is_honoured,
        test_concurrent_requests_each_get_a_connection_never_pipelined,
        functools.partial(test_a_cancelled_request_closes_its_connection_and_the_server_sees_it, "body"),
        functools.partial(test_an_answer_over_the_cap_is_refused_and_its_connection_closed, "chunked"),
    ],
)
def test_the_client_behaves_the_same_on_uvloop(scenario: Callable[[], Awaitable[None]]) -> None:
    """The gateway runs on uvloop (uvicorn's default where installed): its transports are not asyncio's."""
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())  # type: ignore[arg-type]
