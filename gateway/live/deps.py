"""What every route needs from a request: the running gateway, the tenant, a deadline, admission (each
raises ``GatewayError``s)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.requests import HTTPConnection
from starlette.types import Receive

from gateway.config.tenants import hash_key
from gateway.errors import GatewayError, NotFound, ServiceUnavailable, Unauthorized, Unprocessable
from gateway.live.idempotency import HEADER, check_key, fingerprint
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant

_GATEWAY_KEY = "hexflow.gateway"  # where gw_of leaves the gateway in the request's ASGI scope


def gw_of(request: Request) -> Gateway:
    """The running gateway (503 while it starts); the first lookup leaves it in the request's scope."""
    scope = request.scope
    gw = scope.get(_GATEWAY_KEY)
    if isinstance(gw, Gateway):
        return gw
    gw = getattr(request.app.state, "gateway", None)
    if not isinstance(gw, Gateway):
        raise ServiceUnavailable("the gateway is starting", retry_after_s=1)
    scope[_GATEWAY_KEY] = gw
    return gw


class _BearerScheme(HTTPBearer):
    """The bearer scheme as the OpenAPI document declares it, without a check of its own (``auth`` reads the
    header itself: FastAPI's parse of it per request is skipped)."""

    async def __call__(self, request: HTTPConnection) -> HTTPAuthorizationCredentials | None:
        """Nothing: ``auth`` authenticates."""
        return None


BEARER = _BearerScheme(
    auto_error=False, scheme_name="bearer", description="The tenant's API key: ``Authorization: Bearer <key>``."
)
"""The OpenAPI security scheme of the authenticated routes (``auth`` checks the key itself)."""


def bearer_key(header: str) -> str | None:
    """The key of an ``Authorization`` value ``Bearer <key>`` (stripped), or None when it holds none."""
    scheme, _, key = header.partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


async def auth(
    request: Request, _scheme: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)] = None
) -> Tenant:
    """Authenticate ``Authorization: Bearer <key>`` (``async``: a plain ``def`` costs a thread hop per request)."""
    gw = gw_of(request)
    key = bearer_key(request.headers.get("authorization", ""))
    if key is None:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    tenant = gw.tenants.authenticate(key)
    if tenant is None:
        if gw.admin_keys and hash_key(key) in gw.admin_keys:
            raise Unauthorized(ADMIN_KEY_AS_TENANT)
        raise Unauthorized("unknown API key")
    return tenant


ADMIN_KEY_AS_TENANT = (
    "this is the gateway's admin key, not a tenant's API key: it opens the status page (GET /ui, "
    "/ui/api/state), and GET /v1/status and /metrics where admin.protect_status or admin.protect_metrics is "
    "set; send a tenant's key (tenants_file) to run requests"
)
"""The 401 of a request sent with an admin key (``admin.api_key_sha256``) where a tenant's key is needed."""


TenantDep = Annotated[Tenant, Depends(auth)]
"""The authenticated tenant of a request (401 otherwise)."""

UI_DISABLED = (
    "the status page is off: no admin key is configured; add admin.api_key_sha256 (a list of "
    "`hexflow tenants hash-key KEY` digests) to the gateway's config file and restart it"
)


def check_admin(gw: Gateway, header: str) -> None:
    """``Authorization: Bearer <admin key>``: 401 when missing or not an admin key, 404 when none is configured."""
    keys = gw.admin_keys
    if not keys:
        raise NotFound(UI_DISABLED)
    key = bearer_key(header)
    if key is None:
        raise Unauthorized("missing admin key: send 'Authorization: Bearer <admin key>'")
    if hash_key(key) not in keys:
        raise Unauthorized("not an admin key (admin.api_key_sha256 in the gateway's config file)")


def _admin_dependency(switch: str | None) -> Callable[[Request], Awaitable[None]]:
    """A dependency asking for an admin key always (``switch`` None) or when ``admin.<switch>`` is set."""

    async def access(request: Request) -> None:
        gw = gw_of(request)
        if switch is None or getattr(gw.cfg.admin, switch):
            check_admin(gw, request.headers.get("authorization", ""))

    return access


admin_auth = _admin_dependency(None)
"""The status page's data: an admin key is required (``check_admin``)."""
status_access = _admin_dependency("protect_status")
"""``/v1/status``: open, or an admin key when ``admin.protect_status`` is set."""
metrics_access = _admin_dependency("protect_metrics")
"""``/metrics``: open, or an admin key when ``admin.protect_metrics`` is set."""


T = TypeVar("T")


class ClientDisconnected(GatewayError):
    """The client left before the answer was ready; its work was cancelled (499, which nobody receives)."""

    status = 499
    error_type = "client_closed_request"


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await ``work`` (in the route's own task) while watching the client on its ASGI ``receive`` (the body read
    already); when the client leaves first, cancel the work, let it unwind and raise ``ClientDisconnected``."""
    route = asyncio.current_task()
    if route is None:  # not in a task (never under an ASGI server): nothing to cancel
        return await work
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        route.cancel()

    watcher = asyncio.create_task(watch(), name="client-watch")
    try:
        result = await work
    except asyncio.CancelledError:
        if not gone:
            raise
        route.uncancel()
        raise ClientDisconnected("the client closed the connection; its work was cancelled") from None
    finally:
        watcher.cancel()
    if gone:  # the work finished although it was cancelled: keep its result, withdraw the cancellation
        route.uncancel()
    return result


SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate (valid pairs match too: a match is checked)."""
_SURROGATE = re.compile(r"[\ud800-\udfff]")  # in a parsed string: a lone one (a pair decodes to one character)


async def unicode_body(request: Request) -> None:
    """422 for a JSON request body with a lone surrogate in a string (``"\\ud800"``): it could not be sent on."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    raw = await request.body()
    if not SURROGATE_ESCAPE.search(raw):
        return
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        return  # not JSON: the route's parser answers that
    where = lone_surrogate_at(parsed)
    if where is not None:
        raise Unprocessable(f"{where}: not valid Unicode text (a lone surrogate escape)", param=where)


def lone_surrogate_at(value: Any) -> str | None:
    """The dotted path (``calls.0.id``; ``body`` for the root) of the first string in ``value``, key or value,
    that holds a lone surrogate, or None (iterative: JSON may nest deeply)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return path or "body"
        elif isinstance(v, dict):
            for k, child in reversed(list(v.items())):
                if _SURROGATE.search(str(k)):
                    return path or "body"
                stack.append((f"{path}.{k}" if path else str(k), child))
        elif isinstance(v, list):
            stack.extend((f"{path}.{i}" if path else str(i), child) for i, child in reversed(list(enumerate(v))))
    return None


async def idempotent(
    request: Request, tenant: Tenant, body: BaseModel, work: Callable[[], Awaitable[Response]]
) -> Response:
    """Run a route's ``work`` once per ``Idempotency-Key`` (``gateway.live.idempotency``), watching the client:
    400 for a malformed key, 422 for a key reused for another request, else the first run's answer."""
    raw = request.headers.get(HEADER)
    store = gw_of(request).idempotency
    if raw is None or store is None:
        return await until_disconnect(request.receive, work())
    key = check_key(raw)
    fp = fingerprint(request.url.path, body.model_dump(mode="json"))
    stored, replayed = await until_disconnect(request.receive, store.run(tenant.name, key, fp, work))
    return stored.response(replayed=replayed)
