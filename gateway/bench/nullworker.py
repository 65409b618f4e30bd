"""A worker that costs next to nothing, behind the gateway when ``hexflow overhead`` measures it: fixed,
well-formed OpenAI-compatible answers from asyncio's protocol layer (``httptools``), plain or streamed, plus
``/health``, ``/v1/models`` and an empty ``/metrics``; anything else is 404."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
from typing import Any

import httptools

MODEL = "null-model"
_ids = itertools.count()


def _json(obj: str, n: int, choice: dict[str, Any], **extra: Any) -> bytes:
    body = {"id": f"null-{n}", "object": obj, "created": 0, "model": MODEL, "choices": [choice], **extra}
    return json.dumps(body, separators=(",", ":")).encode()


def _completion(path: bytes, n: int) -> bytes:
    usage = {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}
    if path == b"/v1/completions":
        return _json("text_completion", n, {"index": 0, "text": " 1", "finish_reason": "length"}, usage=usage)
    message = {"role": "assistant", "content": "SELECT 1"}
    return _json("chat.completion", n, {"index": 0, "message": message, "finish_reason": "length"}, usage=usage)


def _stream(path: bytes, n: int) -> bytes:
    chat = path != b"/v1/completions"
    obj = "chat.completion.chunk" if chat else "text_completion"
    parts = []
    for i, text in enumerate(("SELECT", " 1")):
        choice: dict[str, Any] = (
            {"index": 0, "delta": {"role": "assistant", "content": text} if i == 0 else {"content": text}}
            if chat
            else {"index": 0, "text": text}
        )
        choice["finish_reason"] = None if i == 0 else "length"
        parts.append(b"data: " + _json(obj, n, choice) + b"\n\n")
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def _response(status: bytes, ctype: bytes, body: bytes, *, chunked: bool = False) -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\ncontent-type: " + ctype + b"\r\n"
    if chunked:
        return head + b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    return head + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body


_MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0}]}).encode()
_NOT_FOUND = _response(b"404 Not Found", b"application/json", b'{"error":{"message":"not found"}}')
_GET = {
    b"/health": _response(b"200 OK", b"application/json", b"{}"),
    b"/v1/models": _response(b"200 OK", b"application/json", _MODELS),
    b"/metrics": _response(b"200 OK", b"text/plain; version=0.0.4", b""),
}


class NullWorker(asyncio.Protocol):
    """One connection: HTTP/1.1 requests in, fixed answers out (keep-alive; requests answered in order)."""

    def __init__(self) -> None:
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        """Parse; a malformed request closes the connection."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        """httptools: the request target."""
        self.url += url

    def on_body(self, body: bytes) -> None:
        """httptools: a piece of the body."""
        self.body.append(body)

    def on_message_complete(self) -> None:
        """httptools: answer the request."""
        path, self.url = self.url.split(b"?", 1)[0], b""
        body, self.body = b"".join(self.body), []
        method = self.parser.get_method()
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            n = next(_ids)
            if b'"stream":true' in body.replace(b" ", b""):
                out = _response(b"200 OK", b"text/event-stream", _stream(path, n), chunked=True)
            else:
                out = _response(b"200 OK", b"application/json", _completion(path, n))
        else:
            out = _GET.get(path, _NOT_FOUND) if method == b"GET" else _NOT_FOUND
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)
            if not self.parser.should_keep_alive():
                self.transport.close()


async def serve(host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(NullWorker, host, port, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    """``python -m gateway.bench.nullworker --port P [--host H]``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(args.host, args.port))
    except ImportError:  # pragma: no cover - uvloop is in the lock
        asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
