"""``POST /v1/text2sql``: a question in, the chosen SQL and its result out, within the tenant's deadline.

Request ``{question, db_id, evidence?, deadline_s?, stream?}``. Errors: unknown or not-allowed ``db_id``
404 (with the ids the tenant may use), empty or too long question or evidence 422, deadline outside
the tenant's range 422, a database that is down 503 (the body says which stage failed), admission
429/503 as for every workflow. With ``stream: true`` each stage's completion is sent as a server-sent
event ``{"event": "stage", ...}`` and the result last (``{"event": "result", ...}``), then ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import NotFound, Unprocessable
from gateway.live.deps import TenantDep, admit_or_raise, deadline_or_raise, gw_of
from gateway.live.responses import JSONResponse
from gateway.live.service import Gateway
from gateway.text2sql.db import DatabaseRegistry, UnknownDatabase


class Text2SqlRequest(BaseModel):
    """``POST /v1/text2sql``."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(description="The question in natural language.")
    db_id: str = Field(min_length=1, max_length=64, description="Which database (see the databases file).")
    evidence: str | None = Field(None, description="A hint (BIRD-style evidence), optional.")
    deadline_s: float | None = Field(None, description="End-to-end deadline; default: the tenant's.")
    stream: bool = Field(False, description="Send stage completions as server-sent events, the result last.")


router = APIRouter()


def _registry(gw: Gateway) -> DatabaseRegistry:
    reg = gw.databases
    if reg is None:
        raise NotFound("no databases are configured on this gateway (databases_file)", param="db_id")
    return reg


@router.post("/v1/text2sql", response_model=None)
async def text2sql(req: Text2SqlRequest, request: Request, tenant: TenantDep) -> Response:
    """Answer a question with SQL executed on the tenant's database."""
    from gateway.text2sql.pipeline import PipelineConfig, Text2SqlPipeline

    gw = gw_of(request)
    reg = _registry(gw)
    allowed = [d for d in reg.ids() if tenant.allows(d)]
    if req.db_id not in allowed:
        raise NotFound(
            f"unknown database {req.db_id!r}; allowed for tenant {tenant.name}: {', '.join(allowed) or '(none)'}",
            param="db_id",
        )
    lim = gw.cfg.text2sql
    question = req.question.strip()
    if not question:
        raise Unprocessable("question: must not be empty", param="question")
    if len(question) > lim.max_question_chars:
        raise Unprocessable(
            f"question: {len(question)} characters exceed the limit of {lim.max_question_chars}", param="question"
        )
    evidence = (req.evidence or "").strip()
    if len(evidence) > lim.max_evidence_chars:
        raise Unprocessable(
            f"evidence: {len(evidence)} characters exceed the limit of {lim.max_evidence_chars}", param="evidence"
        )
    deadline = deadline_or_raise(gw, tenant, req.deadline_s)
    try:
        db = reg.get(req.db_id)
    except UnknownDatabase as exc:  # removed between the check and now
        raise NotFound(str(exc), param="db_id") from exc
    admit_or_raise(gw, tenant, 1)
    pipe = Text2SqlPipeline(
        gw,
        PipelineConfig(
            candidates=lim.candidates,
            max_revisions=lim.max_revisions,
            unit_tests=lim.unit_tests,
            schema_max_chars=lim.schema_max_chars,
        ),
    )
    rid = f"t2s-{uuid.uuid4().hex[:16]}"
    if not req.stream:
        result = await pipe.answer(tenant, db, question, evidence, deadline, request_id=rid)
        return JSONResponse(result.as_dict(), status_code=result.http_status)

    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=1024)

    async def on_event(ev: dict[str, Any]) -> None:
        await events.put(ev)

    async def produce() -> None:
        try:
            result = await pipe.answer(tenant, db, question, evidence, deadline, request_id=rid, on_event=on_event)
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
