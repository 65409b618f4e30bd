"""What every route needs from a request: the running gateway, the tenant, a deadline, admission.

All raise ``GatewayError``s: ``gw_of`` 503 while starting, ``auth`` 401, ``deadline_or_raise`` 422,
``admit_or_raise`` 429/503, ``unicode_body`` 422, ``until_disconnect`` ``ClientDisconnected`` (499),
``idempotent`` 400/422."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.requests import HTTPConnection
from starlette.types import Receive

from gateway.config.tenants import hash_key
from gateway.core.admission import Admission
from gateway.core.predict import StagePlan
from gateway.errors import GatewayError, NotFound, ServiceUnavailable, Unauthorized, Unprocessable
from gateway.live.idempotency import HEADER, check_key, fingerprint
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant

_GATEWAY_KEY = "hexflow.gateway"
"""Where ``gw_of`` leaves the gateway in the request's ASGI scope, so the route finds it at once after ``auth``."""


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
    """The bearer security scheme, as the OpenAPI document declares it, without a check of its own: ``auth``
    reads the header itself, so FastAPI's parse of it (and the credentials model it builds) per request is
    skipped. Only the scheme's description (``model``, ``scheme_name``) is used."""

    async def __call__(self, request: HTTPConnection) -> HTTPAuthorizationCredentials | None:
        """Nothing: ``auth`` authenticates."""
        return None


BEARER = _BearerScheme(
    auto_error=False, scheme_name="bearer", description="The tenant's API key: ``Authorization: Bearer <key>``."
)
"""The OpenAPI security scheme of the authenticated routes (``auth`` checks the key itself)."""


async def auth(
    request: Request, _scheme: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)] = None
) -> Tenant:
    """Authenticate ``Authorization: Bearer <key>`` against the tenants store (``async``: a plain ``def``
    dependency would cost a thread hop per request)."""
    gw = gw_of(request)
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    tenant = gw.tenants.authenticate(key.strip())
    if tenant is None:
        if gw.admin_keys and hash_key(key.strip()) in gw.admin_keys:
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
    """``Authorization: Bearer <admin key>`` (``admin.api_key_sha256``): 401 when the key is missing or not an
    admin key (a tenant's key is not one), 404 when no admin key is configured (``UI_DISABLED``)."""
    keys = gw.admin_keys
    if not keys:
        raise NotFound(UI_DISABLED)
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("missing admin key: send 'Authorization: Bearer <admin key>'")
    if hash_key(key.strip()) not in keys:
        raise Unauthorized("not an admin key (admin.api_key_sha256 in the gateway's config file)")


async def admin_auth(request: Request) -> None:
    """The status page's data: an admin key is required (``check_admin``)."""
    check_admin(gw_of(request), request.headers.get("authorization", ""))


async def status_access(request: Request) -> None:
    """``/v1/status``: open, or an admin key when ``admin.protect_status`` is set."""
    gw = gw_of(request)
    if gw.cfg.admin.protect_status:
        check_admin(gw, request.headers.get("authorization", ""))


async def metrics_access(request: Request) -> None:
    """``/metrics``: open, or an admin key when ``admin.protect_metrics`` is set."""
    gw = gw_of(request)
    if gw.cfg.admin.protect_metrics:
        check_admin(gw, request.headers.get("authorization", ""))


def deadline_or_raise(gw: Gateway, tenant: Tenant, deadline_s: float | None) -> float:
    """The effective deadline; ``DeadlineOutOfRange`` (422, naming the tenant's range) otherwise."""
    return gw.tenants.check_deadline(tenant, deadline_s)


def admit_or_raise(
    gw: Gateway, tenant: Tenant, n_calls: int, plan: Sequence[StagePlan], deadline_s: float
) -> Admission:
    """Admission control: ``Rejected`` (429 or 503 with Retry-After), counted as a rejected workflow.

    ``plan`` (the expected stages) and ``deadline_s`` turn on the predicted-miss check; a best-effort
    tenant's predicted miss is admitted at the lowest urgency (``Admission.best_effort``)."""
    return gw.admit(tenant, n_calls, plan, deadline_s)


T = TypeVar("T")


class ClientDisconnected(GatewayError):
    """The client left before the answer was ready; its work was cancelled. Rendered as 499 (nginx's "client
    closed request"), which nobody receives: the route ends through the one error handler."""

    status = 499
    error_type = "client_closed_request"


async def wait_disconnect(request: Request) -> None:
    """Return when the client has gone (``http.disconnect``). Call it only once the body has been read."""
    await wait_disconnect_raw(request.receive)


async def wait_disconnect_raw(receive: Receive) -> None:
    """``wait_disconnect`` on an ASGI ``receive`` (the body read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` (in the route's own task) while watching the client; when the client leaves first,
    cancel the work (its workflow is abandoned, counted ``cancelled``), let it unwind and raise
    ``ClientDisconnected``. The body must have been read already."""
    return await until_disconnect_raw(request.receive, work)


async def until_disconnect_raw(receive: Receive, work: Awaitable[T]) -> T:
    """``until_disconnect`` on an ASGI ``receive`` (the gateway's fast path has no ``Request``)."""
    route = asyncio.current_task()
    if route is None:  # not in a task (never under an ASGI server): nothing to cancel
        return await work
    gone = False

    async def watch() -> None:
        nonlocal gone
        await wait_disconnect_raw(receive)
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
"""A JSON escape of a UTF-16 surrogate; valid pairs (an escaped emoji) match too, so a match is checked."""


async def unicode_body(request: Request) -> None:
    """422 for a JSON request body with a lone surrogate in a string (``"\\ud800"``): not Unicode text, it could
    not be sent on. A regular-expression scan; only a body that escapes a surrogate is parsed."""
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
    """The dotted path (``calls.0.id``; ``body`` for the root) of the first string in ``value``, key or
    value, that holds a lone surrogate; None when there is none. Iterative: JSON may nest deeply."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if not _is_text(v):
                return path or "body"
        elif isinstance(v, dict):
            items = list(v.items())
            for k, child in reversed(items):
                sub = f"{path}.{k}" if path else str(k)
                if not _is_text(str(k)):
                    return path or "body"
                stack.append((sub, child))
        elif isinstance(v, list):
            stack.extend((f"{path}.{i}" if path else str(i), child) for i, child in reversed(list(enumerate(v))))
    return None


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def idempotent(
    request: Request, tenant: Tenant, body: BaseModel, work: Callable[[], Awaitable[Response]]
) -> Response:
    """Run a route's ``work`` once per ``Idempotency-Key`` (``gateway.live.idempotency``), watching the client.

    Without the header (or with ``idempotency.enabled: false``) the work simply runs. With it: 400 for a
    malformed key, 422 for a key the tenant used for another request, else the first run's answer
    (``Idempotent-Replayed: true`` when it was not made for this request)."""
    raw = request.headers.get(HEADER)
    store = gw_of(request).idempotency
    if raw is None or store is None:
        return await until_disconnect(request, work())
    key = check_key(raw)
    fp = fingerprint(request.url.path, body.model_dump(mode="json"))
    stored, replayed = await until_disconnect(request, store.run(tenant.name, key, fp, work))
    return stored.response(replayed=replayed)
