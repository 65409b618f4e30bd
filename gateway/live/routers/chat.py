"""The OpenAI-compatible surface: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming too),
``GET /v1/models``; each completion is a one-call workflow under the tenant's SLO, the worker's answer
passed through as the bytes it sent (docs/live-gateway.md, "API"). Shared with ``gateway.live.fastpath``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncGenerator, Coroutine, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response
from pydantic import BaseModel, StringConstraints
from pydantic.json_schema import SkipJsonSchema
from starlette.types import Receive, Scope, Send

from gateway.core.dag import DagNode
from gateway.core.predict import calls_plan
from gateway.core.records import WorkflowOutcome
from gateway.core.tokens import message_tokens, text_tokens
from gateway.core.workflow import CHAT, CallSpec
from gateway.errors import DomainError, GatewayError, NotFound, Unprocessable, UpstreamError, error_body
from gateway.live.deps import TenantDep, gw_of, until_disconnect
from gateway.live.openai_schemas import ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest, ModelList
from gateway.live.responses import dumps, error_response, internal_error
from gateway.live.runner import CallRequest
from gateway.live.schemas import NUMBER_PATTERN, route_responses, sse_content
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant, check_deadline
from gateway.live.transport import CallResult

DEADLINE_HEADER = "x-hexflow-deadline-s"
DEFAULT_CHAT_OUTPUT_TOKENS = 256
DEFAULT_COMPLETION_OUTPUT_TOKENS = 16
"""OpenAI's default ``max_tokens`` of a text completion (vLLM's too), per prompt."""
STREAM_QUEUE_CHUNKS = 4096
"""Most chunks of a worker's stream held for a client that reads slowly (the relay then waits)."""
EVENT_STREAM = "text/event-stream"
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", f"{EVENT_STREAM}; charset=utf-8".encode())]

router = APIRouter()

ROUTE = "chat"
"""The status page's label of this module's routes (chat and text completions, one call each)."""


def input_tokens(body: dict[str, Any], field: str) -> int:
    """Estimated prompt tokens of a request body's ``field``: chat messages, or a text, token ids, or a list
    holding one text."""
    prompt = body[field]
    if field == "messages":
        return message_tokens(prompt)
    if isinstance(prompt, str):
        return text_tokens(prompt)
    if isinstance(prompt[0], str):
        return sum(text_tokens(p) for p in prompt)
    return len(prompt)


@dataclass(frozen=True, slots=True)
class PassThrough:
    """An OpenAI-compatible endpoint served as a one-call workflow (its path is the worker's too)."""

    path: str
    schema: type[BaseModel]
    prompt_field: str
    default_output_tokens: int


CHAT_COMPLETIONS = PassThrough("/v1/chat/completions", ChatCompletionRequest, "messages", DEFAULT_CHAT_OUTPUT_TOKENS)
COMPLETIONS = PassThrough("/v1/completions", CompletionRequest, "prompt", DEFAULT_COMPLETION_OUTPUT_TOKENS)
PASS_THROUGH: dict[str, PassThrough] = {r.path: r for r in (CHAT_COMPLETIONS, COMPLETIONS)}
"""The pass-through endpoints by path."""


def deadline_header_value(header: str | None) -> float | None:
    """The deadline of an ``x-hexflow-deadline-s`` value that matched ``NUMBER_PATTERN`` (None: absent or empty);
    422 when it is not finite."""
    if not header:
        return None
    deadline = float(header)  # the pattern admits only JSON numbers
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


@dataclass(slots=True)
class OpenCall:
    """A pass-through call admitted and ready to run (``work``) and, for a stream, its events' queue."""

    work: Coroutine[Any, Any, WorkflowOutcome[CallResult]]
    stream: asyncio.Queue[bytes | None] | None


def open_call(gw: Gateway, tenant: Tenant, route: PassThrough, req: BaseModel, deadline_s: float | None) -> OpenCall:
    """Check a validated request against the cluster and the limits, admit it, and make its one-call workflow
    (the client's body sent on, a null known field left out; ``model`` and ``priority`` the gateway's)."""
    known = type(req).model_fields
    body = {k: v for k, v in req.model_dump(exclude_unset=True).items() if v is not None or k not in known}
    model = body.get("model")
    served = gw.pool.served_models()
    if model is not None and served and model not in served:
        raise NotFound(f"the model {model!r} does not exist; served: {', '.join(served)}", param="model")
    limit = gw.cfg.limits.max_tokens
    for name in ("max_tokens", "max_completion_tokens"):  # as for a workflow call
        value = body.get(name)
        if value is not None and value > limit:
            raise Unprocessable(f"{name}: {value} exceeds the limit of {limit}", param=name)
    mt = body.get("max_completion_tokens") or body.get("max_tokens")
    deadline = check_deadline(tenant, deadline_s)
    what = route.prompt_field
    n_in = input_tokens(body, what)
    if n_in > limit:
        raise Unprocessable(f"{what}: about {n_in} tokens exceed the limit of {limit}", param=what)
    fwd = {k: v for k, v in body.items() if k not in ("model", "priority")}
    queue: asyncio.Queue[bytes | None] | None = (
        asyncio.Queue(maxsize=STREAM_QUEUE_CHUNKS) if body.get("stream") else None
    )
    node = DagNode("chat", CHAT, n_in, mt or route.default_output_tokens)
    plan = calls_plan([[CallSpec(CHAT, node.input_tokens, node.output_tokens)]])
    admission = gw.admit(tenant, 1, plan, deadline)
    work = gw.run_workflow(
        tenant, deadline, [node], [CallRequest(route.path, fwd, queue)], route=ROUTE, admission=admission
    )
    return OpenCall(work, queue)


def answer_bytes(out: WorkflowOutcome[CallResult]) -> bytes:
    """The worker's answer to a finished pass-through call as the bytes it sent (``UpstreamError`` if failed)."""
    if out.error is not None:
        raise UpstreamError.answer(out.error)
    result = out.calls[0].answer
    if result is None or result.body is None:
        raise UpstreamError("the worker's answer has no body", 502)
    return result.raw if result.raw is not None else dumps(result.body)


async def first_event(
    run: asyncio.Task[WorkflowOutcome[CallResult]], queue: asyncio.Queue[bytes | None]
) -> bytes | None:
    """The stream's first chunk, or None when the call ended without one (``UpstreamError`` when it failed);
    cancelled, the call is cancelled too and waited for."""
    first = asyncio.ensure_future(queue.get())
    try:
        done, _ = await asyncio.wait({first, run}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        first.cancel()
        run.cancel()
        await asyncio.wait({run})
        raise
    if first in done:
        return first.result()
    first.cancel()
    out = run.result()
    if out.error is not None:
        raise UpstreamError.answer(out.error)
    return None


async def events(
    run: asyncio.Task[WorkflowOutcome[CallResult]], queue: asyncio.Queue[bytes | None], head: bytes | None
) -> AsyncGenerator[bytes]:
    """The worker's stream as it comes (``head`` first), then an ``{"error": ...}`` event when the call failed
    after it started; leaving early (client gone) cancels the call."""
    try:
        if head is not None:
            yield head
        while True:
            if queue.empty():
                if run.done():
                    break
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, run}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    continue
                item = getter.result()
            else:
                item = queue.get_nowait()
            if item is None:
                break
            yield item
        out = run.result() if run.done() else None
        if out is not None and out.error is not None:
            err = error_body(out.error.status, str(out.error), "upstream_error")
            yield f"data: {json.dumps(err)}\n\n".encode()
    finally:
        if not run.done():
            run.cancel()


async def serve(
    gw: Gateway,
    tenant: Tenant,
    route: PassThrough,
    req: BaseModel,
    deadline_s: float | None,
    scope: Scope,
    receive: Receive,
    send: Send,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Answer a validated pass-through request over ASGI, for the fast path and the routes alike: the worker's
    bytes or its stream (a client that leaves cancels the call), or the answer of an error raised before the
    status line was sent (``headers``: more headers of every answer)."""
    started = False

    async def start(status: int, head: list[tuple[bytes, bytes]]) -> None:
        nonlocal started
        started = True
        await send({"type": "http.response.start", "status": status, "headers": [*head, *headers]})

    try:
        call = open_call(gw, tenant, route, req, deadline_s)
        if call.stream is None:
            answer = answer_bytes(await until_disconnect(receive, call.work))
            await start(200, [(b"content-length", str(len(answer)).encode()), *_JSON_HEADERS])
            await send({"type": "http.response.body", "body": answer})
            return
        queue = call.stream
        run = asyncio.create_task(call.work)

        async def relay() -> None:
            head = await first_event(run, queue)
            await start(200, _SSE_HEADERS)
            async with contextlib.aclosing(events(run, queue, head)) as chunks:
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        await until_disconnect(receive, relay())
        return
    except (GatewayError, DomainError) as exc:
        resp = error_response(exc)
    except Exception as exc:
        resp = internal_error(exc)
    if not started:  # once the status line is sent nothing more can be said (a stream's errors are events)
        resp.raw_headers.extend(headers)
        await resp(scope, receive, send)


class Served(Response):
    """What a pass-through route returns: ``serve`` answers when the framework sends it."""

    def __init__(
        self, gw: Gateway, tenant: Tenant, route: PassThrough, req: BaseModel, deadline_s: float | None
    ) -> None:
        super().__init__()
        self.call = (gw, tenant, route, req, deadline_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the call."""
        await serve(*self.call, scope, receive, send)


def _pass_through_route(route: PassThrough, name: str, model: type[BaseModel], what: str, chunk: str, doc: str) -> None:
    """Register ``route``'s ``POST`` (``name`` and ``doc``: its operation's): the worker's ``what`` (``model``) or
    its stream of ``chunk`` events."""

    async def endpoint(
        req: BaseModel, request: Request, tenant: TenantDep, deadline_header: DeadlineHeader = None
    ) -> Response:
        return Served(gw_of(request), tenant, route, req, deadline_header_value(deadline_header))

    endpoint.__name__, endpoint.__doc__ = name, doc
    endpoint.__annotations__["req"] = route.schema  # the request model the framework validates and documents
    ok = {
        "model": model,
        "description": f"The worker's {what}; with ``stream: true``, its server-sent events.",
        "content": sse_content(
            f'JSON of a {chunk} (the worker\'s), of an ``{{"error": ...}}`` as the last event after a failure, '
            "or ``[DONE]``."
        ),
    }
    responses = route_responses(200, 400, 401, 404, 413, 415, 422, 429, 502, 503, 504, ok=ok)
    router.post(route.path, response_model=None, responses=responses)(endpoint)


_pass_through_route(
    CHAT_COMPLETIONS,
    "chat",
    ChatCompletion,
    "chat completion",
    "``chat.completion.chunk``",
    """OpenAI-compatible chat completions, scheduled as a one-call workflow under the tenant's SLO.

    The deadline: the tenant's default or the ``x-hexflow-deadline-s`` header. A client ``priority`` is
    ignored; unknown fields go to the worker as sent.""",
)
_pass_through_route(
    COMPLETIONS,
    "completions",
    Completion,
    "text completion",
    "``text_completion`` chunk",
    "OpenAI-compatible text completions (one prompt, ``n`` 1), scheduled like a chat completion.",
)


@router.get("/v1/models", response_model=ModelList, responses=route_responses(401, 503))
async def models(request: Request, tenant: TenantDep) -> dict[str, Any]:
    """The models the cluster serves (OpenAI-compatible list)."""
    gw = gw_of(request)
    return {
        "object": "list",
        "data": [{"id": m, "object": "model", "created": 0, "owned_by": "hexflow"} for m in gw.pool.served_models()],
    }
