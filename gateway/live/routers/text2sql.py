"""``POST /v1/text2sql``: a question in, the chosen SQL and its result out, within the tenant's deadline.

Request ``{question, db_id, evidence?, deadline_s?, stream?}``. Errors: unknown or not-allowed ``db_id``
404 (with the ids the tenant may use), empty or too long question or evidence 422, deadline outside
the tenant's range 422, a database that is down 503 (the body says which stage failed), admission
429/503 as for every workflow (a tenant whose ``quality`` is ``adaptive`` or ``fast`` is admitted when its
floor, the least work that still answers, is predicted to fit). The pipeline runs at the tenant's
quality mode; ``degraded`` in the result lists what it skipped and why, each counted in
``hexflow_degraded_workflows_total{tenant,step}``. With ``stream: true`` each stage's completion is sent as a
server-sent event ``{"event": "stage", ...}`` and the result last (``{"event": "result", ...}``), then ``[DONE]``.
A client that disconnects (streaming or not) cancels the question: no later stage is sent, the calls in
flight are aborted, and the workflow is counted ``cancelled``. With an ``Idempotency-Key`` (not with
``stream: true``: 422) a retry gets the first run's answer (``deps.idempotent``).

The route owns its state: a ``Text2SqlService`` (databases, pipeline, prompt templates, limits) that
``install_text2sql`` puts on ``app.state.text2sql`` and closes once the gateway has drained and stopped.
The pipeline runs its calls through ``GatewayStageRunner`` (``gateway.live.text2sql_runner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.degrade import QualityMode, knob_plan
from gateway.core.predict import StagePlan, template_plan
from gateway.errors import Unprocessable
from gateway.live.deps import TenantDep, admit_or_raise, deadline_or_raise, gw_of, idempotent
from gateway.live.idempotency import HEADER, OPENAPI_PARAMETER
from gateway.live.logs import WORKFLOW_ID
from gateway.live.responses import JSONResponse
from gateway.live.schemas import Text2SqlRequest, Text2SqlResponse, route_responses, sse_content
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant
from gateway.live.text2sql_runner import GatewayStageRunner
from gateway.text2sql.db import Database, UnknownDatabase
from gateway.text2sql.result import Text2SqlResult
from gateway.text2sql.service import NO_DATABASES, InvalidQuestion, Text2SqlService

router = APIRouter()


def install_text2sql(app: FastAPI, service: Text2SqlService) -> None:
    """Give ``app`` its Text-to-SQL service: on ``app.state.text2sql`` now, closed when the app's lifespan
    ends (after the gateway drained in-flight questions and stopped)."""
    app.state.text2sql = service
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        try:
            async with inner(a) as state:
                yield state
        finally:
            await service.close()

    app.router.lifespan_context = lifespan


def _service(request: Request) -> Text2SqlService:
    service = getattr(request.app.state, "text2sql", None)
    if not isinstance(service, Text2SqlService):
        raise UnknownDatabase("", [], message=NO_DATABASES)
    return service


def _check_lengths(service: Text2SqlService, req: Text2SqlRequest) -> None:
    """The question and evidence as sent within their limits (the ``maxLength`` the document states):
    ``check_question`` measures them stripped."""
    for name, text, limit in (
        ("question", req.question, service.settings.max_question_chars),
        ("evidence", req.evidence or "", service.settings.max_evidence_chars),
    ):
        if len(text) > limit:
            raise InvalidQuestion(name, f"{len(text)} characters exceed the limit of {limit}")


def _responses() -> dict[int | str, dict[str, Any]]:
    """A failed stage answers 502/503/504 with the result's body (``status: failed``, ``failed_stage``);
    the gateway's own refusals with an ``ErrorResponse``."""
    out = route_responses(
        200,
        400,
        401,
        404,
        413,
        415,
        422,
        429,
        502,
        503,
        504,
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
    either = {
        "anyOf": [{"$ref": "#/components/schemas/Text2SqlResponse"}, {"$ref": "#/components/schemas/ErrorResponse"}]
    }
    for status in (502, 503, 504):
        entry = {k: v for k, v in out[status].items() if k != "model"}
        entry["description"] += " A stage that failed answers the result (``status: failed``, ``failed_stage``)."
        entry["content"] = {"application/json": {"schema": either}}
        out[status] = entry
    return out


def _admission_plan(service: Text2SqlService, mode: QualityMode) -> tuple[StagePlan, ...]:
    """The stages admission predicts: the full pipeline's, or (``adaptive``, ``fast``) its floor's."""
    if mode == "full":
        return template_plan(CHESS_TEMPLATE)
    return knob_plan(CHESS_TEMPLATE, service.pipeline.degraders[mode].grid[-1])


def _count_degraded(gw: Gateway, tenant: str, result: Text2SqlResult) -> None:
    """One ``hexflow_degraded_workflows_total`` per knob the question ran with turned down."""
    for d in result.degraded:
        gw.metrics.degraded(tenant, d.step)


def _admit(
    gw: Gateway, service: Text2SqlService, req: Text2SqlRequest, tenant: Tenant
) -> tuple[Database, str, str, float, GatewayStageRunner]:
    """Check the question and admit its workflow: the database, question, evidence, deadline and runner."""
    db = service.database(req.db_id, tenant=tenant.name, allows=tenant.allows)
    _check_lengths(service, req)
    question, evidence = service.check_question(req.question, req.evidence)
    deadline = deadline_or_raise(gw, tenant, req.deadline_s)
    # Predicted as the CHESS template's expected stages (the pipeline decides its real stages as it goes);
    # a tenant that accepts degraded answers is admitted when the least work that still answers would fit.
    admission = admit_or_raise(gw, tenant, 1, _admission_plan(service, tenant.quality), deadline)
    return db, question, evidence, deadline, GatewayStageRunner(gw, tenant, admission=admission)


async def _answer(gw: Gateway, service: Text2SqlService, req: Text2SqlRequest, tenant: Tenant) -> Response:
    """Admit and answer one question (the route's work without streaming, once per idempotency key)."""
    db, question, evidence, deadline, runner = _admit(gw, service, req, tenant)
    rid = f"t2s-{uuid.uuid4().hex[:16]}"
    WORKFLOW_ID.set(rid)  # this request's context (its log lines)
    result = await service.answer(runner, db, question, evidence, deadline, request_id=rid, quality_mode=tenant.quality)
    _count_degraded(gw, tenant.name, result)
    return JSONResponse(result.as_dict(), status_code=result.http_status)


@router.post(
    "/v1/text2sql",
    response_model=None,
    responses=_responses(),
    openapi_extra={"parameters": [OPENAPI_PARAMETER]},
)
async def text2sql(req: Text2SqlRequest, request: Request, tenant: TenantDep) -> Response:
    """Answer a question with SQL executed on the tenant's database.

    With an ``Idempotency-Key`` header (not with ``stream: true``), a retry of the same question gets the
    first run's answer instead of running the pipeline again (``gateway.live.idempotency``).
    """
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
    db, question, evidence, deadline, runner = _admit(gw, service, req, tenant)
    rid = f"t2s-{uuid.uuid4().hex[:16]}"
    WORKFLOW_ID.set(rid)  # this request's context (its log lines)
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=1024)

    async def on_event(ev: dict[str, Any]) -> None:
        await events.put(ev)

    async def produce() -> None:
        try:
            result = await service.answer(
                runner,
                db,
                question,
                evidence,
                deadline,
                request_id=rid,
                on_event=on_event,
                quality_mode=tenant.quality,
            )
            _count_degraded(gw, tenant.name, result)
            await events.put({"event": "result", **result.as_dict()})
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

    return StreamingResponse(body(), media_type="text/event-stream")
