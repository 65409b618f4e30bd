"""The OpenAI-compatible surface: ``POST /v1/chat/completions`` (streaming too) and ``GET /v1/models``.

A chat completion is scheduled as a one-call workflow under the tenant's SLO. Errors: 422 for a body
that is not a JSON object with a non-empty ``messages`` list, a bad ``max_tokens``, a bad deadline header,
or a prompt or ``max_tokens`` over ``limits.max_tokens``; 404 for a model the cluster does not serve; 429/503 from
admission. A worker's error answer is passed through with its status, message, type and param; once a
stream has started, a failure is sent as a last server-sent event ``{"error": {...}}``. A client that
disconnects, streaming or not, cancels its call (the worker's request is aborted): counted ``cancelled``.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import StringConstraints
from pydantic.json_schema import SkipJsonSchema

from gateway.core.dag import DagNode
from gateway.core.predict import calls_plan
from gateway.core.tokens import message_tokens
from gateway.core.workflow import CHAT, CallSpec
from gateway.errors import NotFound, Unprocessable, UpstreamError, error_body
from gateway.live.deps import TenantDep, admit_or_raise, deadline_or_raise, gw_of, until_disconnect
from gateway.live.responses import JSONResponse
from gateway.live.schemas import (
    NUMBER_PATTERN,
    ChatCompletion,
    ChatCompletionRequest,
    ModelList,
    route_responses,
    sse_content,
)
from gateway.live.service import CallRequest, Gateway, WorkflowOutcome

DEADLINE_HEADER = "x-hexflow-deadline-s"
DEFAULT_CHAT_OUTPUT_TOKENS = 256

router = APIRouter()


def served_models(gw: Gateway) -> tuple[str, ...]:
    """The models the cluster's workers serve (workers being removed excluded), sorted."""
    return gw.pool.served_models()


def _deadline_header(header: str | None) -> float | None:
    if not header:  # absent, or empty (as if absent)
        return None
    deadline = float(header)  # the header's pattern (NUMBER_PATTERN) admits only JSON numbers
    if not math.isfinite(deadline):  # 1e999
        raise Unprocessable(f"{DEADLINE_HEADER}: must be finite", param=DEADLINE_HEADER)
    return deadline


DeadlineHeader = Annotated[
    Annotated[str, StringConstraints(pattern=NUMBER_PATTERN)] | SkipJsonSchema[None],
    Header(
        alias=DEADLINE_HEADER,
        description="End-to-end deadline in seconds, within the tenant's range (default: the tenant's).",
    ),
]


@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses=route_responses(
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
            "model": ChatCompletion,
            "description": "The worker's chat completion; with ``stream: true``, its server-sent events.",
            "content": sse_content(
                'JSON of a ``chat.completion.chunk`` (the worker\'s), of an ``{"error": ...}`` as the last event '
                "after a failure, or ``[DONE]``."
            ),
        },
    ),
)
async def chat(
    req: ChatCompletionRequest, request: Request, tenant: TenantDep, deadline_header: DeadlineHeader = None
) -> Response:
    """OpenAI-compatible chat completions, scheduled as a one-call workflow under the tenant's SLO.

    The deadline is the tenant's default, or the ``x-hexflow-deadline-s`` header (within the
    tenant's range). A client ``priority`` is ignored: the gateway sets it from its own queue. Fields the
    gateway does not know are passed to the worker as sent.
    """
    gw = gw_of(request)
    # What the client sent, type-checked; unknown fields as they are. A null in a field the gateway knows
    # means "the default" (OpenAI's semantics): left out, so a worker need not accept null there.
    known = ChatCompletionRequest.model_fields
    body = {k: v for k, v in req.model_dump(exclude_unset=True).items() if v is not None or k not in known}
    messages = body["messages"]
    model = req.model
    served = served_models(gw)
    if model is not None and served and model not in served:
        raise NotFound(f"the model {model!r} does not exist; served: {', '.join(served)}", param="model")
    limit = gw.cfg.limits.max_tokens
    for name in ("max_tokens", "max_completion_tokens"):  # as for a workflow call
        value = body.get(name)
        if value is not None and value > limit:
            raise Unprocessable(f"{name}: {value} exceeds the limit of {limit}", param=name)
    mt = req.max_completion_tokens or req.max_tokens
    deadline = deadline_or_raise(gw, tenant, _deadline_header(deadline_header))
    n_in = message_tokens(messages)
    if n_in > gw.cfg.limits.max_tokens:
        raise Unprocessable(f"messages: about {n_in} tokens exceed the limit of {gw.cfg.limits.max_tokens}")
    fwd = {k: v for k, v in body.items() if k not in ("model", "priority")}
    stream = bool(req.stream)
    queue: asyncio.Queue[bytes | None] | None = asyncio.Queue(maxsize=4096) if stream else None
    node = DagNode("chat", CHAT, n_in, mt or DEFAULT_CHAT_OUTPUT_TOKENS)
    plan = calls_plan([[CallSpec(CHAT, node.input_tokens, node.output_tokens)]])
    admission = admit_or_raise(gw, tenant, 1, plan, deadline)
    work = gw.run_workflow(
        tenant, deadline, [node], [CallRequest("/v1/chat/completions", fwd, queue)], admission=admission
    )
    if queue is None:
        out = await until_disconnect(request, work)  # a client that leaves cancels the call
        if out.error is not None:
            raise UpstreamError.answer(out.error)
        result = out.calls[0].result
        if result is None or result.body is None:
            raise UpstreamError("the worker's answer has no body", 502)
        return JSONResponse(result.body)
    return await _stream_response(request, asyncio.create_task(work), queue)


async def _stream_response(
    request: Request, run: asyncio.Task[WorkflowOutcome], queue: asyncio.Queue[bytes | None]
) -> Response:
    """The worker's server-sent events as they come; an error before the first one is a proper status.

    Until the first event the client's connection is watched here (the call may wait in a queue), after
    it by the streaming response: a client that leaves at any point cancels the call."""
    first = asyncio.ensure_future(queue.get())
    try:
        done, _ = await until_disconnect(request, asyncio.wait({first, run}, return_when=asyncio.FIRST_COMPLETED))
    except BaseException:
        first.cancel()
        run.cancel()
        await asyncio.wait({run})
        raise
    if first not in done:
        first.cancel()
        out = run.result()
        if out.error is not None:
            raise UpstreamError.answer(out.error)
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
                # The status line is sent: the error can only be the stream's last event.
                err = error_body(out2.error.status, str(out2.error), "upstream_error")
                yield f"data: {json.dumps(err)}\n\n".encode()
        finally:
            if not run.done():
                run.cancel()

    return StreamingResponse(body(), media_type="text/event-stream")


@router.get("/v1/models", response_model=ModelList, responses=route_responses(401, 503))
async def models(request: Request, tenant: TenantDep) -> dict[str, Any]:
    """The models the cluster serves (OpenAI-compatible list)."""
    gw = gw_of(request)
    return {
        "object": "list",
        "data": [{"id": m, "object": "model", "created": 0, "owned_by": "hexflow"} for m in served_models(gw)],
    }
