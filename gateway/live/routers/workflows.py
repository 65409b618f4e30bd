"""``POST /v1/workflows``: a DAG of LLM calls under the tenant's deadline (docs/live-gateway.md, "API"). In
benchmark mode a call may give ``prompt_tokens`` (``BENCHMARK_FIELDS``): a synthetic token-id prompt of its
``shared_prefix`` segments, then filler of its own; off benchmark mode they are refused (422)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.config.workflows import TEMPLATES
from gateway.core.dag import DagNode, validate_nodes
from gateway.core.predict import dag_plan
from gateway.core.prefix import PrefixSeg
from gateway.core.records import WorkflowOutcome
from gateway.core.tokens import message_tokens
from gateway.core.workflow import deadline_met
from gateway.errors import Unprocessable, UpstreamError
from gateway.live.deps import TenantDep, gw_of, idempotent
from gateway.live.idempotency import OPENAPI_PARAMETER
from gateway.live.logs import WORKFLOW_ID
from gateway.live.responses import JSONResponse
from gateway.live.runner import CallRequest, new_workflow_id
from gateway.live.schemas import (
    CallReport,
    SharedPrefixSegment,
    WorkflowCall,
    WorkflowRequest,
    WorkflowResponse,
    route_responses,
)
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant, check_deadline
from gateway.live.transport import CallResult

SYNTHETIC_VOCAB = (100, 1100)
"""Token ids of synthetic prompts: ``[100, 1100)`` exists in every real vocabulary (and the tiny test model's)."""

router = APIRouter()

ROUTE = "workflows"
"""This route's label on the status page (its workflows' ``route`` in ``/v1/status``)."""

_SYNTH_BASE: list[int] = []
_SYNTH_BASE_LEN = 1 << 16
_TAG_DIGITS = 4
"""Leading ids of every synthetic sequence that spell its 64-bit key (base ``SYNTHETIC_VOCAB`` width): two
sequences then start alike only when their keys agree in about 40 bits, not whenever their offsets into
the base sequence happen to match."""


def _key(*parts: str) -> int:
    """A 64-bit key from strings, the same in every process (``hash`` of a str is salted per process)."""
    data = "\0".join(parts).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _sequence(key: int, n: int) -> list[int]:
    """``n`` token ids for ``key``: a tag spelling the key, then a slice of a fixed random sequence from a
    key-dependent offset. A slice, not a Python loop per token: a trace workflow asks for many thousands of tokens and
    this runs on the event loop."""
    if not _SYNTH_BASE:
        rng = random.Random(0x5EED)
        lo, hi = SYNTHETIC_VOCAB
        _SYNTH_BASE.extend(rng.randrange(lo, hi) for _ in range(_SYNTH_BASE_LEN))
    lo, hi = SYNTHETIC_VOCAB
    width = hi - lo
    tag = [lo + (key // width**k) % width for k in range(min(_TAG_DIGITS, n))]
    start = (key >> 44) % _SYNTH_BASE_LEN
    rest = n - len(tag)
    out = tag + _SYNTH_BASE[start : start + rest]
    while len(out) < n:
        out.extend(_SYNTH_BASE[: n - len(out)])
    return out


def segment_key(seg: SharedPrefixSegment, workflow_id: str) -> int:
    """The key of a ``shared_prefix`` segment's token ids: its name, and the workflow's id if its scope is
    ``workflow`` (so only that workflow's calls share it)."""
    if seg.scope == "workflow":
        return _key("workflow", workflow_id, seg.name)
    return _key("global", seg.name)


def synthetic_prompt(n: int, salt: int, prefix: Sequence[tuple[int, int]] = ()) -> list[int]:
    """``n`` token ids from ``SYNTHETIC_VOCAB``: the ``prefix`` segments, in order, as (key, tokens) each
    (equal keys give equal ids: ``segment_key``), then ``n`` less their tokens of filler that depends on
    ``salt`` (so calls share no more than their segments). The segments must fit in ``n`` tokens."""
    out: list[int] = []
    for key, tokens in prefix:
        out += _sequence(key, tokens)
    if len(out) > n:
        raise ValueError(f"shared prefix of {len(out)} tokens exceeds the prompt's {n}")
    out += _sequence(_key("filler", str(salt)), n - len(out))
    return out


def _call_request(c: WorkflowCall, salt: int, workflow_id: str) -> tuple[CallRequest, int, int]:
    """The worker request for a workflow call, with the (input, output) tokens the scheduler assumes (``salt``:
    its synthetic filler's; ``workflow_id``: keys its ``workflow``-scope segments)."""
    body: dict[str, Any] = {"max_tokens": c.max_tokens}
    if c.min_tokens:
        body["min_tokens"] = c.min_tokens
    if c.ignore_eos:
        body["ignore_eos"] = True
    if c.temperature is not None:
        body["temperature"] = c.temperature
    out_tokens = c.expected_output_tokens or c.max_tokens
    if c.prompt_tokens is not None:
        prefix = [(segment_key(s, workflow_id), s.tokens) for s in c.shared_prefix or ()]
        body["prompt"] = synthetic_prompt(c.prompt_tokens, salt, prefix)
        return CallRequest("/v1/completions", body), c.prompt_tokens, out_tokens
    msgs = [m.model_dump(exclude_none=True) for m in c.messages or ()]
    body["messages"] = msgs
    return CallRequest("/v1/chat/completions", body), message_tokens(msgs), out_tokens


def workflow_response(
    req: WorkflowRequest, out: WorkflowOutcome[CallResult], wf_id: str, deadline_s: float
) -> WorkflowResponse:
    """The API view of a finished workflow (``wf_id`` and ``deadline_s``: the route's own; a call that never
    ran, its workflow failed first, is reported with no worker and nothing run)."""
    ran = {o.node: o for o in out.calls}
    calls = []
    for i, c in enumerate(req.calls):
        o = ran.get(i)
        res = None if o is None else o.answer
        calls.append(
            CallReport(
                id=c.id,
                kind=c.kind,
                worker=None if o is None else o.worker_name,
                queued_s=0.0 if o is None else round(o.queued_s, 6),
                run_s=0.0 if o is None else round(o.run_s, 6),
                attempts=0 if o is None else o.attempts,
                prompt_tokens=res.prompt_tokens if res else 0,
                completion_tokens=res.completion_tokens if res else 0,
                output=res.text() if res is not None and req.return_outputs else None,
                error=str(o.error) if o is not None and o.error else None,
            )
        )
    latency = out.latency
    return WorkflowResponse(
        id=wf_id,
        tenant=out.tenant,
        status="ok" if out.status == "ok" else "failed",
        deadline_s=deadline_s,
        latency_s=round(latency, 6),
        deadline_met=deadline_met(latency, deadline_s, valid=out.status == "ok"),
        calls=calls,
        error=str(out.error) if out.error else None,
    )


def _default_max_tokens(i: int, c: WorkflowCall, limit: int) -> None:
    """A call that leaves ``max_tokens`` out gets the default or the limit, whichever is lower (the default
    the document states); ``min_tokens`` must still fit under it."""
    if "max_tokens" in c.model_fields_set or c.max_tokens <= limit:
        return
    c.max_tokens = limit
    if c.min_tokens > c.max_tokens:
        raise Unprocessable(
            f"calls.{i}: min_tokens={c.min_tokens} exceeds max_tokens={c.max_tokens} (the default, capped at "
            "limits.max_tokens)",
            param=f"calls.{i}.min_tokens",
        )


BENCHMARK_FIELDS = ("prompt_tokens", "shared_prefix", "ignore_eos")
"""The call fields a gateway accepts only with ``benchmark: true`` (synthetic prompts, exact output lengths)."""


def _check_benchmark_fields(i: int, c: WorkflowCall) -> None:
    """422 for a call that uses a benchmark-only field on a gateway not in benchmark mode."""
    for name in BENCHMARK_FIELDS:
        if getattr(c, name) not in (None, False):
            raise Unprocessable(
                f"calls.{i}.{name}: a benchmark-only field, accepted only by a gateway in benchmark mode "
                "(benchmark: true in its config); send messages instead",
                param=f"calls.{i}.{name}",
            )


def _check_limit(i: int, name: str, value: int, limit: int, *, estimate: bool = False) -> None:
    """422 when call ``i``'s ``name`` is over ``limit`` (``estimate``: tokens estimated, named as an estimate)."""
    if value > limit:
        over = f"about {value} tokens exceed" if estimate else f"{value} exceeds"
        raise Unprocessable(f"calls.{i}.{name}: {over} the limit of {limit}", param=f"calls.{i}.{name}")


@router.post(
    "/v1/workflows",
    response_model=WorkflowResponse,
    responses=route_responses(400, 401, 413, 415, 422, 429, 502, 503, 504),
    openapi_extra={"parameters": [OPENAPI_PARAMETER]},
)
async def workflows(req: WorkflowRequest, request: Request, tenant: TenantDep) -> Response:
    """Run a DAG of LLM calls; returns every call's result and timings (once per ``Idempotency-Key``)."""
    gw = gw_of(request)
    return await idempotent(request, tenant, req, lambda: _run(gw, req, tenant))


async def _run(gw: Gateway, req: WorkflowRequest, tenant: Tenant) -> Response:
    """Validate, admit and run the workflow (the route's work, once per idempotency key)."""
    lim = gw.cfg.limits
    if len(req.calls) > lim.max_calls_per_workflow:
        raise Unprocessable(
            f"calls: {len(req.calls)} calls exceed the limit of {lim.max_calls_per_workflow}", param="calls"
        )
    deadline = check_deadline(tenant, req.deadline_s)
    wf_id = new_workflow_id()
    WORKFLOW_ID.set(wf_id)  # this request's context (its log lines)
    salt = _key("salt", wf_id)
    nodes: list[DagNode] = []
    requests: list[CallRequest] = []
    for i, c in enumerate(req.calls):
        if not gw.cfg.benchmark:
            _check_benchmark_fields(i, c)
        _default_max_tokens(i, c, lim.max_tokens)
        if c.prompt_tokens is not None:  # checked before a synthetic prompt of that length is built
            _check_limit(i, "prompt_tokens", c.prompt_tokens, lim.max_tokens)
        cr, n_in, n_out = _call_request(c, salt + i, wf_id)
        if c.messages is not None:
            _check_limit(i, "messages", n_in, lim.max_tokens, estimate=True)
        _check_limit(i, "prompt_tokens", n_in, lim.max_tokens)
        _check_limit(i, "max_tokens", c.max_tokens, lim.max_tokens)
        if c.expected_output_tokens is not None:  # unbounded, it would predict a workflow no deadline fits
            _check_limit(i, "expected_output_tokens", c.expected_output_tokens, lim.max_tokens)
        shared = tuple(PrefixSeg(x.name, x.tokens, per_query=x.scope == "workflow") for x in c.shared_prefix or ())
        nodes.append(DagNode(c.id, c.kind, n_in, n_out, tuple(c.depends_on), shared))
        requests.append(cr)
    validate_nodes(nodes)  # DagError: 422 naming the call
    admission = gw.admit(tenant, len(nodes), dag_plan(nodes), deadline)
    template = TEMPLATES[req.template] if req.template else None
    # A client that leaves cancels the workflow (queued calls dropped, worker requests aborted).
    out = await gw.run_workflow(
        tenant, deadline, nodes, requests, route=ROUTE, template=template, wf_id=wf_id, admission=admission
    )
    resp = workflow_response(req, out, wf_id, deadline)
    if out.error is not None:
        raise UpstreamError(str(out.error), out.error.status, extra={"workflow": resp.model_dump()})
    return JSONResponse(resp.model_dump())
