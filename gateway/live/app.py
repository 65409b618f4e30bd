"""The gateway's HTTP face (FastAPI): validation, authentication, admission, and translation.

Routes:
    POST /v1/workflows          a DAG of LLM calls under the tenant's deadline (``WorkflowRequest``)
    POST /v1/chat/completions   OpenAI-compatible pass-through (streaming too), a one-call workflow
    GET  /v1/models             the models the cluster serves (OpenAI-compatible)
    GET  /v1/status             workers, queues, in-flight calls, alpha, estimates, tuning
    GET  /healthz               the process is alive
    GET  /readyz                config loaded, not shutting down, and at least one worker healthy
    GET  /metrics               Prometheus (``hexflow_*``)

Every error body is OpenAI-style ``{"error": {"message", "type", "param", "code"}}``: 401 for a
missing or unknown API key, 413 for a body over ``limits.max_body_bytes``, 422 for malformed JSON,
bad fields, a deadline outside the tenant's range or a DAG with a cycle or dangling dependency, 429
(with ``Retry-After``) when a queue or concurrency bound is reached, 503 (with ``Retry-After``) when
no worker is healthy or the gateway is shutting down. A call the worker rejects (4xx) returns that
status and message; a call that failed on every attempt returns 502.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config.workflows import TEMPLATES
from gateway.core.dag import DagError, DagNode, validate_nodes
from gateway.core.tokens import message_tokens
from gateway.core.workflow import CHAT
from gateway.errors import CallFailed, Rejected
from gateway.live.schemas import CallReport, ErrorResponse, WorkflowCall, WorkflowRequest, WorkflowResponse
from gateway.live.service import CallRequest, Gateway, WorkflowOutcome
from gateway.live.tenants import DeadlineOutOfRange, Tenant

log = logging.getLogger("hexflow.app")

DEADLINE_HEADER = "x-hexflow-deadline-s"
SYNTHETIC_VOCAB = (100, 1100)
"""Token ids of synthetic prompts: ``[100, 1100)`` exists in every real vocabulary (and the tiny test model's)."""
DEFAULT_CHAT_OUTPUT_TOKENS = 256


class ApiError(Exception):
    """An error answer: status, message, OpenAI error type, optional param and headers."""

    def __init__(
        self,
        status: int,
        message: str,
        err_type: str = "invalid_request_error",
        param: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param
        self.headers = headers
        self.extra = extra


def error_json(status: int, message: str, err_type: str, param: str | None = None) -> dict[str, Any]:
    """The OpenAI-style error body."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


class BodyLimit:
    """ASGI middleware: 413 for a request body over ``max_bytes`` (declared or streamed)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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
                    await self._reject(send, declared)
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

        started = False

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._reject(send, seen)

    async def _reject(self, send: Send, size: int) -> None:
        body = json.dumps(
            error_json(
                413,
                f"request body of {size} bytes exceeds the limit of {self.max_bytes} bytes",
                "invalid_request_error",
            )
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _BodyTooLarge(Exception):
    pass


def _loc(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


_SYNTH_BASE: list[int] = []
_SYNTH_BASE_LEN = 1 << 16


def synthetic_prompt(n: int, salt: int) -> list[int]:
    """``n`` token ids from ``SYNTHETIC_VOCAB``, starting at a ``salt``-dependent offset of a fixed random
    sequence (so calls do not share prefixes by accident). A slice, not a Python loop per token: a trace
    workflow asks for ~50k tokens and this runs on the event loop."""
    if not _SYNTH_BASE:
        rng = random.Random(0x5EED)
        lo, hi = SYNTHETIC_VOCAB
        _SYNTH_BASE.extend(rng.randrange(lo, hi) for _ in range(_SYNTH_BASE_LEN))
    start = (salt * 2654435761) % _SYNTH_BASE_LEN
    out = _SYNTH_BASE[start : start + n]
    while len(out) < n:
        out.extend(_SYNTH_BASE[: n - len(out)])
    return out


def _call_request(c: WorkflowCall, salt: int) -> tuple[CallRequest, int, int]:
    """The worker request for a workflow call, with the (input, output) tokens the scheduler assumes."""
    body: dict[str, Any] = {"max_tokens": c.max_tokens}
    if c.min_tokens:
        body["min_tokens"] = c.min_tokens
    if c.ignore_eos:
        body["ignore_eos"] = True
    if c.temperature is not None:
        body["temperature"] = c.temperature
    out_tokens = c.expected_output_tokens or c.max_tokens
    if c.prompt_tokens is not None:
        body["prompt"] = synthetic_prompt(c.prompt_tokens, salt)
        return CallRequest("/v1/completions", body), c.prompt_tokens, out_tokens
    assert c.messages is not None
    msgs = [m.model_dump(exclude_none=True) for m in c.messages]
    body["messages"] = msgs
    return CallRequest("/v1/chat/completions", body), message_tokens(msgs), out_tokens


def workflow_response(req: WorkflowRequest, out: WorkflowOutcome) -> WorkflowResponse:
    """The API view of a finished workflow."""
    calls = []
    for rec in out.calls:
        c = req.calls[rec.node]
        res = rec.result
        calls.append(
            CallReport(
                id=c.id,
                kind=c.kind,
                worker=rec.worker,
                queued_s=round(rec.queued_s, 6),
                run_s=round(rec.run_s, 6),
                attempts=rec.attempts,
                prompt_tokens=res.prompt_tokens if res else 0,
                completion_tokens=res.completion_tokens if res else 0,
                output=res.text() if res is not None and req.return_outputs else None,
                error=str(rec.error) if rec.error else None,
            )
        )
    return WorkflowResponse(
        id=out.id,
        tenant=out.tenant,
        status="ok" if out.status == "ok" else "failed",
        deadline_s=out.deadline_s,
        latency_s=round(out.latency_s, 6),
        deadline_met=out.deadline_met,
        calls=calls,
        error=str(out.error) if out.error else None,
    )


def gw_of(request: Request) -> Gateway:
    """The running gateway (503 while it starts)."""
    gw = getattr(request.app.state, "gateway", None)
    if gw is None:
        raise ApiError(503, "the gateway is starting", "service_unavailable", headers={"Retry-After": "1"})
    assert isinstance(gw, Gateway)
    return gw


async def auth(request: Request) -> Tenant:
    """Authenticate ``Authorization: Bearer <key>`` against the tenants store.

    ``async`` on purpose: FastAPI runs a plain ``def`` dependency in a worker thread, a thread hop per
    request that cost more CPU than the rest of the gateway's work on a call.
    """
    gw = gw_of(request)
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(
            401,
            "missing API key: send 'Authorization: Bearer <key>'",
            "authentication_error",
            headers={"WWW-Authenticate": "Bearer"},
        )
    tenant = gw.tenants.authenticate(key.strip())
    if tenant is None:
        raise ApiError(401, "unknown API key", "authentication_error", headers={"WWW-Authenticate": "Bearer"})
    return tenant


TenantDep = Annotated[Tenant, Depends(auth)]
"""The authenticated tenant of a request (401 otherwise)."""


def deadline_or_raise(gw: Gateway, tenant: Tenant, deadline_s: float | None) -> float:
    """The effective deadline, or a 422 naming the tenant's range."""
    try:
        return gw.tenants.check_deadline(tenant, deadline_s)
    except DeadlineOutOfRange as exc:
        raise ApiError(422, str(exc), param="deadline_s") from exc


def admit_or_raise(gw: Gateway, tenant: Tenant, n_calls: int) -> None:
    """Admission control: 429 or 503 with Retry-After (counted as a rejected workflow)."""
    try:
        gw.admit(tenant, n_calls)
    except Rejected as exc:
        gw.rejected(tenant.name)
        err_type = "rate_limit_error" if exc.status == 429 else "service_unavailable"
        raise ApiError(exc.status, str(exc), err_type, headers={"Retry-After": str(exc.retry_after_s)}) from exc


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
        responses={
            401: {"model": ErrorResponse},
            422: {"model": ErrorResponse},
            429: {"model": ErrorResponse},
            503: {"model": ErrorResponse},
        },
    )
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        body = error_json(exc.status, exc.message, exc.err_type, exc.param)
        if exc.extra:
            body.update(exc.extra)
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
        where = _loc(tuple(first.get("loc", ())))
        msg = str(first.get("msg", "invalid value"))
        if first.get("type") == "json_invalid":
            ctx = first.get("ctx")
            msg = f"malformed JSON: {ctx.get('error', msg) if isinstance(ctx, dict) else msg}"
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        body = error_json(422, f"{where}: {msg}{more}", "invalid_request_error", where)
        body["detail"] = json.loads(json.dumps(errors, default=str))
        return JSONResponse(body, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_json(exc.status_code, str(exc.detail), "invalid_request_error"),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error: %r", exc)
        return JSONResponse(error_json(500, f"internal error: {type(exc).__name__}", "internal_error"), status_code=500)

    @app.post("/v1/workflows", response_model=WorkflowResponse)
    async def workflows(req: WorkflowRequest, request: Request, tenant: TenantDep) -> JSONResponse:
        """Run a DAG of LLM calls; returns every call's result and timings."""
        gw = gw_of(request)
        lim = gw.cfg.limits
        if len(req.calls) > lim.max_calls_per_workflow:
            raise ApiError(
                422, f"calls: {len(req.calls)} calls exceed the limit of {lim.max_calls_per_workflow}", param="calls"
            )
        deadline = deadline_or_raise(gw, tenant, req.deadline_s)
        wf_id = gw.new_workflow_id()
        salt = hash(wf_id) & 0xFFFFFF
        nodes: list[DagNode] = []
        requests: list[CallRequest] = []
        for i, c in enumerate(req.calls):
            cr, n_in, n_out = _call_request(c, salt * 1000 + i)
            for name, v in (("prompt_tokens", n_in), ("max_tokens", c.max_tokens)):
                if v > lim.max_tokens:
                    raise ApiError(
                        422, f"calls.{i}.{name}: {v} exceeds the limit of {lim.max_tokens}", param=f"calls.{i}.{name}"
                    )
            nodes.append(DagNode(c.id, c.kind, n_in, n_out, tuple(c.depends_on)))
            requests.append(cr)
        try:
            validate_nodes(nodes)
        except DagError as exc:
            raise ApiError(422, str(exc), param=str(exc).split(":")[0]) from exc
        admit_or_raise(gw, tenant, len(nodes))
        template = TEMPLATES[req.template] if req.template else None
        out = await gw.run_workflow(tenant, deadline, nodes, requests, template=template, wf_id=wf_id)
        resp = workflow_response(req, out)
        if out.error is not None:
            status = out.error.status
            return JSONResponse(
                {
                    **error_json(
                        status, str(out.error), "upstream_error" if status >= 500 else "invalid_request_error"
                    ),
                    "workflow": resp.model_dump(),
                },
                status_code=status,
            )
        return JSONResponse(resp.model_dump())

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request, tenant: TenantDep) -> Response:
        """OpenAI-compatible chat completions, scheduled as a one-call workflow under the tenant's SLO.

        The deadline is the tenant's default, or the ``x-hexflow-deadline-s`` header (within the
        tenant's range). A client ``priority`` is ignored: the gateway sets it from its own queue.
        """
        gw = gw_of(request)
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ApiError(422, f"malformed JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError(422, "the body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(422, "messages: a non-empty list of message objects is required", param="messages")
        model = body.get("model")
        served = served_models(gw)
        if model is not None and served and model not in served:
            raise ApiError(
                404, f"the model {model!r} does not exist; served: {', '.join(served)}", "not_found_error", "model"
            )
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
            raise ApiError(422, f"max_tokens must be a positive integer, got {mt!r}", param="max_tokens")
        header = request.headers.get(DEADLINE_HEADER)
        deadline_arg: float | None = None
        if header is not None:
            try:
                deadline_arg = float(header)
            except ValueError as exc:
                raise ApiError(422, f"{DEADLINE_HEADER}: not a number: {header!r}", param=DEADLINE_HEADER) from exc
            if not math.isfinite(deadline_arg):
                raise ApiError(422, f"{DEADLINE_HEADER}: must be finite", param=DEADLINE_HEADER)
        deadline = deadline_or_raise(gw, tenant, deadline_arg)
        n_in = message_tokens(messages)
        if n_in > gw.cfg.limits.max_tokens:
            raise ApiError(422, f"messages: about {n_in} tokens exceed the limit of {gw.cfg.limits.max_tokens}")
        fwd = {k: v for k, v in body.items() if k not in ("model", "priority")}
        stream = bool(body.get("stream"))
        queue: asyncio.Queue[bytes | None] | None = asyncio.Queue(maxsize=4096) if stream else None
        node = DagNode("chat", CHAT, n_in, mt or DEFAULT_CHAT_OUTPUT_TOKENS)
        admit_or_raise(gw, tenant, 1)
        run = asyncio.create_task(
            gw.run_workflow(tenant, deadline, [node], [CallRequest("/v1/chat/completions", fwd, queue)])
        )
        if queue is None:
            try:
                out = await run
            except asyncio.CancelledError:
                run.cancel()
                raise
            rec = out.calls[0]
            if out.error is not None:
                raise _upstream(out.error)
            assert rec.result is not None and rec.result.body is not None
            return JSONResponse(rec.result.body)
        return await _stream_response(run, queue)

    async def _stream_response(run: asyncio.Task[WorkflowOutcome], queue: asyncio.Queue[bytes | None]) -> Response:
        # Wait for the first line or the end, so that an upstream error is still a proper status code.
        first = asyncio.ensure_future(queue.get())
        done, _ = await asyncio.wait({first, run}, return_when=asyncio.FIRST_COMPLETED)
        if first not in done:
            first.cancel()
            out = run.result()
            if out.error is not None:
                raise _upstream(out.error)
            head: bytes | None = None
        else:
            head = first.result()

        async def body() -> AsyncIterator[bytes]:
            try:
                if head is not None:
                    yield head
                while True:
                    if run.done() and queue.empty():
                        break
                    getter = asyncio.ensure_future(queue.get())
                    done2, _ = await asyncio.wait({getter, run}, return_when=asyncio.FIRST_COMPLETED)
                    if getter in done2:
                        item = getter.result()
                        if item is None:
                            break
                        yield item
                    else:
                        getter.cancel()
                out2 = run.result() if run.done() else None
                if out2 is not None and out2.error is not None:
                    err = error_json(out2.error.status, str(out2.error), "upstream_error")
                    yield f"data: {json.dumps(err)}\n\n".encode()
            finally:
                if not run.done():
                    run.cancel()

        return StreamingResponse(body(), media_type="text/event-stream")

    def served_models(gw: Gateway) -> list[str]:
        return sorted({st.info.served_model for st in gw.pool.workers if not st.removing})

    @app.get("/v1/models")
    async def models(request: Request, tenant: TenantDep) -> dict[str, Any]:
        """The models the cluster serves (OpenAI-compatible list)."""
        gw = gw_of(request)
        return {
            "object": "list",
            "data": [{"id": m, "object": "model", "created": 0, "owned_by": "hexflow"} for m in served_models(gw)],
        }

    @app.get("/v1/status")
    async def status(request: Request) -> dict[str, Any]:
        """Workers, queue depths, in-flight calls, current alpha, estimates and tuning state."""
        return gw_of(request).status()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: configuration loaded, not draining, at least one healthy worker."""
        gw = getattr(request.app.state, "gateway", None)
        if not isinstance(gw, Gateway) or not gw.ready:
            return JSONResponse({"ready": False, "reason": "starting"}, status_code=503)
        if gw.draining:
            return JSONResponse({"ready": False, "reason": "shutting down"}, status_code=503)
        if gw.pool.healthy == 0:
            return JSONResponse({"ready": False, "reason": "no healthy worker"}, status_code=503)
        return JSONResponse({"ready": True, "healthy_workers": gw.pool.healthy})

    @app.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        """Prometheus exposition of the ``hexflow_*`` metrics."""
        gw = gw_of(request)
        return PlainTextResponse(gw.metrics.render(gw.refresh_gauges), media_type="text/plain; version=0.0.4")

    from gateway.live.text2sql_route import router

    app.include_router(router)
    return app


def _upstream(err: CallFailed) -> ApiError:
    status = err.status
    if err.body is not None and isinstance(err.body.get("error"), dict):
        e = err.body["error"]
        return ApiError(status, str(e.get("message", err)), str(e.get("type", "upstream_error")), e.get("param"))
    return ApiError(status, str(err), "upstream_error" if status >= 500 else "invalid_request_error")
