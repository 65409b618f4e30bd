"""``POST /v1/text2sql``: a question in, the chosen SQL and its result out, within the tenant's deadline.

Request ``{question, db_id, evidence?, deadline_s?, stream?}``. Errors: unknown or not-allowed ``db_id``
404 (with the ids the tenant may use), empty or too long question or evidence 422, deadline outside
the tenant's range 422, a database that is down 503 (the body says which stage failed), admission
429/503 as for every workflow. With ``stream: true`` each stage's completion is sent as a server-sent
event ``{"event": "stage", ...}`` and the result last (``{"event": "result", ...}``), then ``[DONE]``.
A client that disconnects (streaming or not) cancels the question: no later stage is sent, the calls in
flight are aborted, and the workflow is counted ``cancelled``.

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
from pydantic import BaseModel, ConfigDict, Field

from gateway.live.deps import TenantDep, admit_or_raise, deadline_or_raise, gw_of, until_disconnect
from gateway.live.responses import JSONResponse
from gateway.live.text2sql_runner import GatewayStageRunner
from gateway.text2sql.db import UnknownDatabase
from gateway.text2sql.service import NO_DATABASES, Text2SqlService


class Text2SqlRequest(BaseModel):
    """``POST /v1/text2sql``."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(description="The question in natural language.")
    db_id: str = Field(min_length=1, max_length=64, description="Which database (see the databases file).")
    evidence: str | None = Field(None, description="A hint (BIRD-style evidence), optional.")
    deadline_s: float | None = Field(None, description="End-to-end deadline; default: the tenant's.")
    stream: bool = Field(False, description="Send stage completions as server-sent events, the result last.")


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


@router.post("/v1/text2sql", response_model=None)
async def text2sql(req: Text2SqlRequest, request: Request, tenant: TenantDep) -> Response:
    """Answer a question with SQL executed on the tenant's database."""
    gw = gw_of(request)
    service = _service(request)
    db = service.database(req.db_id, tenant=tenant.name, allows=tenant.allows)
    question, evidence = service.check_question(req.question, req.evidence)
    deadline = deadline_or_raise(gw, tenant, req.deadline_s)
    admit_or_raise(gw, tenant, 1)
    runner = GatewayStageRunner(gw, tenant)
    rid = f"t2s-{uuid.uuid4().hex[:16]}"
    if not req.stream:
        # A client that leaves cancels the question: no later stage, in-flight calls aborted.
        result = await until_disconnect(
            request, service.answer(runner, db, question, evidence, deadline, request_id=rid)
        )
        return JSONResponse(result.as_dict(), status_code=result.http_status)

    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=1024)

    async def on_event(ev: dict[str, Any]) -> None:
        await events.put(ev)

    async def produce() -> None:
        try:
            result = await service.answer(runner, db, question, evidence, deadline, request_id=rid, on_event=on_event)
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
