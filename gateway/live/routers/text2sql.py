"""``POST /v1/text2sql``: a question in, the chosen SQL and its result out, within the tenant's deadline
(docs/text2sql.md). The route admits the question with its plan and owns a ``Text2SqlService``
(``install_text2sql``); calls run through ``GatewayStageRunner``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from gateway.core.admission import Admission
from gateway.core.degrade import QuestionPlan
from gateway.errors import GatewayError, Unprocessable, error_body
from gateway.live.deps import TenantDep, gw_of, idempotent
from gateway.live.idempotency import HEADER, OPENAPI_PARAMETER
from gateway.live.logs import WORKFLOW_ID
from gateway.live.responses import JSONResponse
from gateway.live.schemas import ERROR_SCHEMA, Text2SqlRequest, Text2SqlResponse, route_responses, sse_content
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant, check_deadline
from gateway.live.text2sql_runner import GatewayStageRunner
from gateway.text2sql.db import Database, UnknownDatabase
from gateway.text2sql.result import Text2SqlResult
from gateway.text2sql.service import NO_DATABASES, Text2SqlService

router = APIRouter()

ROUTE = "text2sql"
"""This route's label on the status page (its workflows' ``route`` in ``/v1/status``)."""
log = logging.getLogger("hexflow.text2sql")


def install_text2sql(app: FastAPI, service: Text2SqlService) -> None:
    """Give ``app`` its Text-to-SQL service: on ``app.state.text2sql`` now, closed when the app's lifespan
    ends (after the gateway drained in-flight questions and stopped)."""
    app.state.text2sql = service
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        try:
            async with inner(a) as state:
                gw = getattr(a.state, "gateway", None)
                if isinstance(gw, Gateway):
                    gw.status_sections["text2sql"] = lambda: _status(gw, service)
                yield state
        finally:
            await service.close()

    app.router.lifespan_context = lifespan


def _status(gw: Gateway, service: Text2SqlService) -> dict[str, Any]:
    """``/v1/status``'s ``text2sql``: per configured database, its predicted plan (where its figures
    come from, each stage's tokens, rounds and width) and the seconds a question admitted now would take."""
    ids = [] if service.registry is None else service.registry.ids()
    return {"databases": service.pipeline.status(ids, lambda plan: gw.predicted_s(plan.rest()))}


def _service(request: Request) -> Text2SqlService:
    service = getattr(request.app.state, "text2sql", None)
    if not isinstance(service, Text2SqlService):
        raise UnknownDatabase("", [], message=NO_DATABASES)
    return service


def _responses() -> dict[int | str, dict[str, Any]]:
    """A failed stage answers 502/503/504 with the result's body (``status: failed``, ``failed_stage``);
    the gateway's own refusals with an ``ErrorResponse``."""
    either = {"anyOf": [{"$ref": "#/components/schemas/Text2SqlResponse"}, ERROR_SCHEMA]}
    failed = " A stage that failed answers the result (``status: failed``, ``failed_stage``)."
    ok = route_responses(
        *(200, 400, 401, 404, 413, 415, 422, 429),
        ok={
            "model": Text2SqlResponse,
            "description": "The answer (``status``: ok, no_valid_sql, deadline_exceeded); with ``stream: true``, "
            "server-sent events: each stage, then the result, then ``[DONE]``.",
            "content": sse_content(
                'JSON of a stage event ``{"event": "stage", ...}``, then of the result '
                '``{"event": "result", ...}``, then ``[DONE]``.'
            ),
        },
    )
    return {**ok, **route_responses(502, 503, 504, schema=either, more=failed)}


@dataclass(frozen=True)
class _Admitted:
    """A question checked and admitted: what answering it needs."""

    db: Database
    question: str
    evidence: str
    deadline_s: float
    plan: QuestionPlan
    admission: Admission
    request_id: str

    async def answer(
        self,
        gw: Gateway,
        service: Text2SqlService,
        tenant: Tenant,
        on_event: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    ) -> Text2SqlResult:
        """Run the pipeline for the question on its own runner (its workflow takes the admission over when it
        opens), predicted by the plan admission used; the admission is released after it, whatever happens,
        and each knob it ran with turned down counted (``hexflow_degraded_workflows_total``)."""
        WORKFLOW_ID.set(self.request_id)  # this request's context (its log lines)
        runner = GatewayStageRunner(gw, tenant, route=ROUTE, admission=self.admission, request_id=self.request_id)
        try:
            result = await service.pipeline.answer(
                runner,
                self.db,
                self.question,
                self.evidence,
                self.deadline_s,
                request_id=self.request_id,
                on_event=on_event,
                quality_mode=tenant.quality,
                plan=self.plan,
            )
        finally:
            self.admission.release()
        for d in result.degraded:
            gw.metrics.degraded(tenant.name, d.step)
        return result


async def _admit(gw: Gateway, service: Text2SqlService, req: Text2SqlRequest, tenant: Tenant) -> _Admitted:
    """Check the question and admit it, predicted by its plan (``Text2SqlPipeline.plan``) at the tenant's floor.

    The answer owns the admission's committed work: ``_Admitted.answer`` releases it (a stream that never
    started it, too)."""
    db = service.database(req.db_id, tenant=tenant.name, allows=tenant.allows)
    question, evidence = service.check_question(req.question, req.evidence)
    deadline = check_deadline(tenant, req.deadline_s)
    plan = await service.pipeline.plan(db, tenant.quality)
    admission = gw.admit(tenant, 1, plan.rest(), deadline, question=plan)
    plan = admission.plan or plan  # (with a burst's cap on it, when one capped the question)
    return _Admitted(db, question, evidence, deadline, plan, admission, f"t2s-{uuid.uuid4().hex[:16]}")


async def _answer(gw: Gateway, service: Text2SqlService, req: Text2SqlRequest, tenant: Tenant) -> Response:
    """Admit and answer one question (the route's work without streaming, once per idempotency key)."""
    admitted = await _admit(gw, service, req, tenant)
    result = await admitted.answer(gw, service, tenant)
    return JSONResponse(result.as_dict(), status_code=result.http_status)


def _error_event(exc: BaseException, request_id: str) -> dict[str, Any]:
    """The stream's last event for a question that failed inside the gateway: the error body a request without
    streaming would have got (a ``GatewayError``'s own; anything else a 500 naming the request id)."""
    if isinstance(exc, GatewayError):
        body = exc.response_body()
    else:
        body = error_body(500, f"internal error answering the question (request {request_id})", "server_error")
    return {"event": "error", "id": request_id, **body}


@router.post(
    "/v1/text2sql",
    response_model=None,
    responses=_responses(),
    openapi_extra={"parameters": [OPENAPI_PARAMETER]},
)
async def text2sql(req: Text2SqlRequest, request: Request, tenant: TenantDep) -> Response:
    """Answer a question with SQL executed on the tenant's database (once per ``Idempotency-Key``, not with
    ``stream: true``)."""
    gw = gw_of(request)
    if req.stream and request.headers.get(HEADER) is not None and gw.idempotency is not None:
        raise Unprocessable(
            f"the {HEADER} header is not supported with stream: true (a stream cannot be replayed); "
            "drop the header or ask without streaming",
            param="stream",
        )
    service = _service(request)
    if not req.stream:
        # A client that leaves cancels the question: no later stage, in-flight calls aborted.
        return await idempotent(request, tenant, req, lambda: _answer(gw, service, req, tenant))
    a = await _admit(gw, service, req, tenant)
    WORKFLOW_ID.set(a.request_id)  # this request's context (its log lines)
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=1024)

    async def on_event(ev: dict[str, Any]) -> None:
        await events.put(ev)

    async def produce() -> None:
        try:
            result = await a.answer(gw, service, tenant, on_event)
            await events.put({"event": "result", **result.as_dict()})
        except Exception as exc:  # never a stream that ends in [DONE] with neither a result nor an error
            if not isinstance(exc, GatewayError):
                log.exception("question %s failed", a.request_id)
            await events.put(_error_event(exc, a.request_id))
        finally:
            await events.put(None)

    task = asyncio.create_task(produce())

    async def body() -> AsyncIterator[bytes]:
        try:
            while True:
                ev = await events.get()
                if ev is None:
                    break
                yield f"data: {json.dumps(ev, default=str)}\n\n".encode()
            yield b"data: [DONE]\n\n"
            await task
        finally:
            if not task.done():
                task.cancel()
            a.admission.release()  # (a task cancelled before it ran never reached its own finally)

    return StreamingResponse(body(), media_type="text/event-stream")
