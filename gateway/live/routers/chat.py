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
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gateway.core.dag import DagNode
from gateway.core.tokens import message_tokens
from gateway.core.workflow import CHAT
from gateway.errors import NotFound, Unprocessable, UpstreamError, error_body
from gateway.live.deps import TenantDep, admit_or_raise, deadline_or_raise, gw_of, until_disconnect
from gateway.live.responses import JSONResponse
from gateway.live.service import CallRequest, Gateway, WorkflowOutcome

DEADLINE_HEADER = "x-hexflow-deadline-s"
DEFAULT_CHAT_OUTPUT_TOKENS = 256

router = APIRouter()


def served_models(gw: Gateway) -> list[str]:
    """The models the cluster's workers serve (workers being removed excluded), sorted."""
    return sorted({st.info.served_model for st in gw.pool.workers if not st.removing})


def _parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except RecursionError as exc:
        raise Unprocessable("malformed JSON: nested too deeply") from exc
    except ValueError as exc:
        raise Unprocessable(f"malformed JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise Unprocessable("the body must be a JSON object")
    return body


def _deadline_header(request: Request) -> float | None:
    header = request.headers.get(DEADLINE_HEADER)
    if header is None:
        return None
    try:
        deadline = float(header)
    except ValueError as exc:
        raise Unprocessable(f"{DEADLINE_HEADER}: not a number: {header!r}", param=DEADLINE_HEADER) from exc
    if not math.isfinite(deadline):
        raise Unprocessable(f"{DEADLINE_HEADER}: must be finite", param=DEADLINE_HEADER)
    return deadline


@router.post("/v1/chat/completions", response_model=None)
async def chat(request: Request, tenant: TenantDep) -> Response:
    """OpenAI-compatible chat completions, scheduled as a one-call workflow under the tenant's SLO.

    The deadline is the tenant's default, or the ``x-hexflow-deadline-s`` header (within the
    tenant's range). A client ``priority`` is ignored: the gateway sets it from its own queue.
    """
    gw = gw_of(request)
    body = _parse_body(await request.body())
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise Unprocessable("messages: a non-empty list of message objects is required", param="messages")
    model = body.get("model")
    served = served_models(gw)
    if model is not None and served and model not in served:
        raise NotFound(f"the model {model!r} does not exist; served: {', '.join(served)}", param="model")
    mt = body.get("max_completion_tokens", body.get("max_tokens"))
    if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
        raise Unprocessable(f"max_tokens must be a positive integer, got {mt!r}", param="max_tokens")
    limit = gw.cfg.limits.max_tokens
    if mt is not None and mt > limit:  # as for a workflow call; a huge int would not even fit a float
        raise Unprocessable(f"max_tokens: {mt} exceeds the limit of {limit}", param="max_tokens")
    deadline = deadline_or_raise(gw, tenant, _deadline_header(request))
    n_in = message_tokens(messages)
    if n_in > gw.cfg.limits.max_tokens:
        raise Unprocessable(f"messages: about {n_in} tokens exceed the limit of {gw.cfg.limits.max_tokens}")
    fwd = {k: v for k, v in body.items() if k not in ("model", "priority")}
    stream = bool(body.get("stream"))
    queue: asyncio.Queue[bytes | None] | None = asyncio.Queue(maxsize=4096) if stream else None
    node = DagNode("chat", CHAT, n_in, mt or DEFAULT_CHAT_OUTPUT_TOKENS)
    admit_or_raise(gw, tenant, 1)
    work = gw.run_workflow(tenant, deadline, [node], [CallRequest("/v1/chat/completions", fwd, queue)])
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


@router.get("/v1/models")
async def models(request: Request, tenant: TenantDep) -> dict[str, Any]:
    """The models the cluster serves (OpenAI-compatible list)."""
    gw = gw_of(request)
    return {
        "object": "list",
        "data": [{"id": m, "object": "model", "created": 0, "owned_by": "hexflow"} for m in served_models(gw)],
    }
