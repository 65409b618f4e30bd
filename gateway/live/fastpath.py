"""The hot routes without the framework: ``POST /v1/chat/completions`` and ``/v1/completions`` served straight
from ASGI by ``routers.chat.serve``, which answers the routes too (docs/live-gateway.md, "Per-call overhead").
A request it is not sure to accept as it is goes to the full app unchanged, its body replayed: every refusal
is the framework's own."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError
from gateway.live.deps import SURROGATE_ESCAPE, bearer_key
from gateway.live.logs import REQUEST_ID, WORKFLOW_ID, request_id
from gateway.live.routers.chat import PASS_THROUGH, PassThrough, deadline_header_value, serve
from gateway.live.schemas import NUMBER_PATTERN
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant

__all__ = ["FAST_PATHS", "FastPath"]

FAST_PATHS = frozenset(PASS_THROUGH)
"""The paths served by the fast path (``POST`` only)."""

_DEADLINE = re.compile(NUMBER_PATTERN.encode())
_JSON_TYPE = b"application/json"
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
            await serve(gw, tenant, route, req, deadline, scope, receive, send, [(b"x-request-id", rid.encode())])
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
        key = bearer_key(head.get(b"authorization", b"").decode("latin-1"))
        tenant = None if key is None else gw.tenants.authenticate(key)
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
