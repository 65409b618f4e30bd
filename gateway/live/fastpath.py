"""The hot routes without the framework: ``POST /v1/chat/completions`` and ``/v1/completions`` served straight
from ASGI through ``routers.chat``'s functions (docs/live-gateway.md, "Per-call overhead"). A request it is
not sure to accept as it is goes to the full app unchanged, its body replayed: every refusal is the
framework's own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError, error_body
from gateway.live.deps import SURROGATE_ESCAPE, until_disconnect
from gateway.live.logs import REQUEST_ID, WORKFLOW_ID, request_id, with_request_id
from gateway.live.responses import JSONResponse, error_response
from gateway.live.routers.chat import (
    EVENT_STREAM,
    PASS_THROUGH,
    PassThrough,
    answer_bytes,
    deadline_header_value,
    events,
    first_event,
    open_call,
)
from gateway.live.schemas import NUMBER_PATTERN
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant

__all__ = ["FAST_PATHS", "FastPath"]

log = logging.getLogger("hexflow.app")

FAST_PATHS = frozenset(PASS_THROUGH)
"""The paths served by the fast path (``POST`` only)."""

_DEADLINE = re.compile(NUMBER_PATTERN.encode())
_JSON_TYPE = b"application/json"
_JSON_HEADERS = [(b"content-type", _JSON_TYPE)]
_SSE_HEADERS = [(b"content-type", f"{EVENT_STREAM}; charset=utf-8".encode())]
_WATCHED = frozenset({b"content-type", b"content-length", b"authorization", b"x-request-id", b"x-hexflow-deadline-s"})


class _Fallback(Exception):
    """The fast path does not serve this request: the full app does (nothing has been sent)."""


class FastPath:
    """Serves the pass-through routes from ASGI; ``full`` (the framework's app) serves everything else."""

    def __init__(self, full: ASGIApp, state: Any, max_body_bytes: int) -> None:
        self.full = full
        self.state = state
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a hot route's request, or hand it to the full app."""
        route = PASS_THROUGH[scope["path"]]
        head = self._head(scope)
        parts: list[bytes] = []
        more = True
        try:
            if head is None:
                raise _Fallback
            size = 0
            while more:
                msg = await receive()
                if msg["type"] != "http.request":  # the client left while sending: let the framework see it
                    raise _Fallback
                chunk = msg.get("body", b"")
                if chunk:
                    parts.append(chunk)
                    size += len(chunk)
                more = msg.get("more_body", False)
                if size > self.max_body_bytes:
                    raise _Fallback
            body = b"".join(parts) if len(parts) != 1 else parts[0]
            gw, tenant, req, deadline = self._accept(route, head, body)
        except _Fallback:
            await self.full(scope, _replay(parts, more, receive), send)
            return
        rid = request_id(head.get(b"x-request-id"))
        token, wf_token = REQUEST_ID.set(rid), WORKFLOW_ID.set(None)
        try:
            await self._serve(gw, tenant, route, req, deadline, rid.encode(), scope, receive, send)
        finally:
            WORKFLOW_ID.reset(wf_token)
            REQUEST_ID.reset(token)

    def _head(self, scope: Scope) -> dict[bytes, bytes] | None:
        """The headers the fast path reads, or None when it cannot take the request (a header it reads sent
        twice, a declared body over the limit, a content type other than JSON)."""
        head: dict[bytes, bytes] = {}
        for k, v in scope["headers"]:
            if k in _WATCHED:
                if k in head:
                    return None
                head[k] = v
        ctype = head.get(b"content-type")
        if ctype is None or ctype.split(b";", 1)[0].strip().lower() != _JSON_TYPE:
            return None
        length = head.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return None
        return head

    def _accept(
        self, route: PassThrough, head: dict[bytes, bytes], body: bytes
    ) -> tuple[Gateway, Tenant, BaseModel, float | None]:
        """The gateway, tenant, validated request and deadline of a request the fast path takes; ``_Fallback``
        when any of it would be refused (the framework then gives its own answer)."""
        gw = getattr(self.state, "gateway", None)
        if not isinstance(gw, Gateway):
            raise _Fallback
        scheme, _, key = head.get(b"authorization", b"").decode("latin-1").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise _Fallback
        tenant = gw.tenants.authenticate(key)
        if tenant is None:
            raise _Fallback
        raw_deadline = head.get(b"x-hexflow-deadline-s")
        if raw_deadline is not None and not _DEADLINE.fullmatch(raw_deadline):
            raise _Fallback
        if not body or SURROGATE_ESCAPE.search(body):
            raise _Fallback
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            raise _Fallback from None
        if not isinstance(data, dict):
            raise _Fallback
        try:
            req = route.schema.model_validate(data)
        except ValidationError:
            raise _Fallback from None
        try:
            deadline = deadline_header_value(raw_deadline.decode("ascii") if raw_deadline else None)
        except GatewayError:
            raise _Fallback from None
        return gw, tenant, req, deadline

    async def _serve(
        self,
        gw: Gateway,
        tenant: Tenant,
        route: PassThrough,
        req: BaseModel,
        deadline: float | None,
        rid: bytes,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        started = False

        async def start(status: int, headers: list[tuple[bytes, bytes]]) -> None:
            nonlocal started
            started = True
            await send({"type": "http.response.start", "status": status, "headers": [*headers, (b"x-request-id", rid)]})

        try:
            call = open_call(gw, tenant, route, req, deadline)
            if call.stream is None:
                answer = answer_bytes(await until_disconnect(receive, call.work))
                await start(200, [(b"content-length", str(len(answer)).encode()), *_JSON_HEADERS])
                await send({"type": "http.response.body", "body": answer})
                return
            queue = call.stream
            run = asyncio.create_task(call.work)

            async def relay() -> None:
                head = await first_event(run, queue)
                await start(200, _SSE_HEADERS)
                async with contextlib.aclosing(events(run, queue, head)) as chunks:
                    async for chunk in chunks:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})

            await until_disconnect(receive, relay())
        except GatewayError as exc:
            if started:  # the status line is sent; nothing more can be said (a stream's errors are events)
                return
            if exc.status == 500:
                log.error("%s: %s", type(exc).__name__, exc.message)
            await error_response(exc)(scope, receive, with_request_id(send, rid))
        except Exception as exc:
            log.exception("unexpected error: %r", exc)
            if not started:
                body = error_body(500, f"internal error: {type(exc).__name__}", "internal_error")
                await JSONResponse(body, status_code=500)(scope, receive, with_request_id(send, rid))


def _replay(parts: list[bytes], more: bool, receive: Receive) -> Receive:
    """``receive`` for the full app: what the fast path read of the body (one message), then the rest."""
    pending = bool(parts) or not more

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": b"".join(parts), "more_body": more}
        return await receive()

    return replay
