"""ASGI middleware of the gateway: ``BodyLimit`` (413 for a request body over the limit)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import PayloadTooLarge
from gateway.live.responses import error_response


class _BodyTooLarge(Exception):
    """Raised out of ``receive`` to stop the app reading a body that went over the limit."""


class BodyLimit:
    """ASGI middleware: 413 for a request body over ``max_bytes``: a declared ``Content-Length`` before the app
    runs, a streamed body as the app reads it (the app's answer replaced unless it had started)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass a request through, or answer 413."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._reject(scope, receive, send, declared)
                    return
        seen = 0
        too_big = False

        async def limited() -> Message:
            nonlocal seen, too_big
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    too_big = True
                    raise _BodyTooLarge
            return msg

        started = replaced = False

        async def guarded_send(msg: Message) -> None:
            nonlocal started, replaced
            if msg["type"] == "http.response.start":
                started = True
                if too_big:  # the app turned _BodyTooLarge into an answer of its own (FastAPI: 400)
                    replaced = True
                    await self._reject(scope, receive, send, seen)
                    return
            if not replaced:
                await send(msg)

        try:
            await self.app(scope, limited, guarded_send)
        except _BodyTooLarge:
            if not started:
                await self._reject(scope, receive, send, seen)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, size: int) -> None:
        err = PayloadTooLarge(f"request body of {size} bytes exceeds the limit of {self.max_bytes} bytes")
        await error_response(err)(scope, receive, send)
