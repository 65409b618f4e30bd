"""The gateway's HTTP face (FastAPI): the app factory ``create_app``.

Routes (one router per surface, under ``gateway.live.routers``):
    POST /v1/workflows          a DAG of LLM calls under the tenant's deadline (``routers.workflows``)
    POST /v1/chat/completions   OpenAI-compatible pass-through (streaming too), a one-call workflow
    GET  /v1/models             the models the cluster serves (OpenAI-compatible; ``routers.chat``)
    POST /v1/text2sql           a question in, SQL and its result out (``routers.text2sql``)
    GET  /v1/status             workers, queues, in-flight calls, alpha, estimates, tuning
    GET  /healthz               the process is alive
    GET  /readyz                config loaded, not shutting down, and at least one worker healthy
    GET  /metrics               Prometheus (``hexflow_*``; ``routers.ops``)

Every error body is OpenAI-style ``{"error": {"message", "type", "param", "code"}}``: 401 for a
missing or unknown API key, 413 for a body over ``limits.max_body_bytes``, 422 for malformed JSON,
bad fields, a string that is not Unicode text (a lone surrogate), a deadline outside the tenant's range
or a DAG with a cycle or dangling dependency, 429 (with ``Retry-After``) when a queue or concurrency
bound is reached, 503 (with ``Retry-After``) when no worker is healthy or the gateway is shutting down.
A call the worker rejects (4xx) returns that status and message; a call that failed on every attempt
returns 502.

Routes raise ``GatewayError``s (``gateway.errors``) and one handler renders them all; the framework's
own errors (validation, unknown route) and unexpected exceptions have a handler each. Rendering never
fails: ``gateway.live.responses`` encodes any string, lone surrogates included.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.errors import GatewayError, error_body
from gateway.live.deps import unicode_body
from gateway.live.middleware import BodyLimit
from gateway.live.responses import JSONResponse, error_response, plain
from gateway.live.routers import chat, ops, text2sql, workflows
from gateway.live.schemas import ErrorResponse
from gateway.live.service import Gateway

log = logging.getLogger("hexflow.app")


def create_app(make_gateway: Callable[[], Awaitable[Gateway]], *, max_body_bytes: int = 1 << 20) -> FastAPI:
    """The ASGI app. ``make_gateway`` builds the (unstarted) service inside the lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gw = await make_gateway()
        app.state.gateway = gw
        await gw.start()
        try:
            yield
        finally:
            await gw.drain(gw.cfg.shutdown_grace_s)
            await gw.stop()

    app = FastAPI(
        title="HexGen-Flow gateway",
        version="0.1.0",
        description="Deadline- and heterogeneity-aware scheduling of agentic LLM workflows over vLLM workers.",
        lifespan=lifespan,
        default_response_class=JSONResponse,
        dependencies=[Depends(unicode_body)],
        responses={
            401: {"model": ErrorResponse},
            422: {"model": ErrorResponse},
            429: {"model": ErrorResponse},
            503: {"model": ErrorResponse},
        },
    )
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_exception_handler(GatewayError, _gateway_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected_error)
    app.include_router(workflows.router)
    app.include_router(chat.router)
    app.include_router(ops.router)
    app.include_router(text2sql.router)
    return app


async def _gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
    """Every error a route raises on purpose: its own status, type, param, headers and extra fields."""
    if exc.status == 500:  # not a refusal or a worker's failure (those are counted elsewhere): a fault
        log.error("%s: %s", type(exc).__name__, exc.message)
    return error_response(exc)


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming the first problem (``calls.0.max_tokens: ...``), with every problem under ``detail``."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    where = _loc(tuple(first.get("loc", ())))
    msg = str(first.get("msg", "invalid value"))
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx")
        msg = f"malformed JSON: {ctx.get('error', msg) if isinstance(ctx, dict) else msg}"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    body = error_body(422, f"{where}: {msg}{more}", "invalid_request_error", where)
    body["detail"] = plain(errors)
    return JSONResponse(body, status_code=422)


async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The framework's own errors (404 unknown route, 405 wrong method) in the same shape."""
    return JSONResponse(
        error_body(exc.status_code, str(exc.detail), "invalid_request_error"),
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def _unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    """500 naming only the exception's type (its message may hold a prompt); the traceback is logged."""
    log.exception("unexpected error: %r", exc)
    return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}", "internal_error"), status_code=500)


def _loc(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"
