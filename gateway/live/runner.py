"""The live gateway's workflow runner: DAG workflows, online (stage by stage) workflows, and shedding.

A DAG's calls are released by each call's completion callback (run by the pool before the worker is
refilled), as the simulator's result event does; an online workflow's stages are decided by its caller
(Text-to-SQL). ``shed_overdue`` applies core's ``Admitter.overdue`` to the calls not yet settled
(``pending``). ``begin`` counts a workflow in (admission bounds and the drain read the counts), ``_finish``
counts it out once, whatever ended it, into the metrics, the rolling outcome window and the history
(``gateway.live.history``)."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gateway.core.admission import Admission, ShedVerdict
from gateway.core.dag import DagCallSpec, DagNode, DagWorkflow
from gateway.core.degrade import QuestionPlan
from gateway.core.prefix import prompt_prefix
from gateway.core.records import CallOutcome, WorkflowOutcome
from gateway.core.workflow import CallSpec, OnlineWorkflow, Workflow, WorkflowTemplate, deadline_met
from gateway.errors import CallFailed, Rejected
from gateway.live.history import MAX_CALLS, OutcomeWindow, WorkflowHistory, goodput_outcome, kept_calls
from gateway.live.logs import REQUEST_ID
from gateway.live.tenants import Tenant
from gateway.live.transport import CallResult, LiveCall

if TYPE_CHECKING:
    from gateway.live.service import Gateway

__all__ = ["CallRequest", "LiveOutcome", "Running", "WorkflowRunner", "new_workflow_id", "request_prompt"]

log = logging.getLogger("hexflow.gateway")


def new_workflow_id() -> str:
    """A unique workflow id for responses: ``wf-`` and 16 random hex digits."""
    return f"wf-{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True, slots=True)
class CallRequest:
    """What to send for one node: the endpoint and the body (``model`` is filled per worker)."""

    endpoint: str
    body: dict[str, Any]
    stream: asyncio.Queue[bytes | None] | None = None


MAX_PROMPT_CHARS = 1 << 20
"""Of a request's prompt, as the prefix index hashes it (``gateway.core.prefix.prompt_prefix``): text beyond
this many characters is not looked at (a shared prefix sits at the start)."""


def request_prompt(body: Mapping[str, Any]) -> str | list[int] | None:
    """The prompt of an OpenAI-style request body: a completion's ``prompt`` (text or token ids), or a chat's
    messages rendered in order; None when it holds neither in a form worth hashing."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt[:MAX_PROMPT_CHARS]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    parts: list[str] = []
    size = 0
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        text = _content_text(m.get("content"))
        parts.append(f"<|{m.get('role', '')}|>{text}")
        size += len(text)
        if size >= MAX_PROMPT_CHARS:
            break
    return "".join(parts)[:MAX_PROMPT_CHARS] or None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones, in order
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


LiveOutcome = CallOutcome[CallResult]
"""A live call's outcome: the worker's response is its ``answer``, a ``CallFailed`` its ``error``."""


@dataclass(eq=False, slots=True)
class Running:
    """A workflow while it runs, as the runner counts it: its tenant, client id (``wf_id``), status page label
    (``route``) and its calls' outcomes (None: not settled)."""

    wf: Workflow
    tenant: Tenant
    route: str
    wf_id: str | None
    outcomes: list[LiveOutcome | None]


@dataclass(eq=False)
class _Execution(Running):
    """One DAG workflow being run: its calls in flight, and the callback that releases the successors of each
    call that returns (a bound method, not closures of ``run_workflow`` that would reference each other: no
    reference cycle, so a finished workflow is freed by reference counting alone)."""

    wf: DagWorkflow
    runner: WorkflowRunner
    requests: list[CallRequest]
    done: asyncio.Future[None]
    live: dict[int, LiveCall] = field(default_factory=dict)
    error: CallFailed | None = None
    abandoned: bool = False

    def launch(self, specs: list[Any]) -> None:
        """Submit the calls that became ready."""
        for spec in specs:
            assert isinstance(spec, DagCallSpec)
            self.live[spec.node] = self.runner.submit(self.wf, spec, self.requests[spec.node], self.on_done)

    def on_done(self, call: LiveCall, outcome: CallResult | CallFailed) -> None:
        """A call returned or failed for good: record it, then release its successors (or fail the workflow)."""
        spec = call.spec
        assert isinstance(spec, DagCallSpec)
        self.outcomes[spec.node] = self.runner.outcome(call, spec.node, outcome)
        self.live.pop(spec.node, None)
        if self.abandoned:  # a call that settled after its workflow was given up releases nothing
            return
        if isinstance(outcome, CallFailed):
            if self.error is None:
                self.error = outcome
                self.cancel_live()
                if not self.done.done():
                    self.done.set_result(None)
            return
        if self.error is not None:
            return
        self.launch(self.wf.complete(spec))
        if self.wf.done and not self.done.done():
            self.done.set_result(None)

    def cancel_live(self) -> None:
        """Take back every call still queued or in flight."""
        for other in list(self.live.values()):
            self.runner.gw.pool.cancel(other)
        self.live.clear()


class WorkflowRunner:
    """Runs the admitted workflows of one gateway (``gw``: its scheduler, pool, admitter and clock): the workflows
    in progress and the memory of those that ended."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        admin = gw.cfg.admin
        self.outcome_window = OutcomeWindow(admin.window_s)
        self.history = WorkflowHistory(admin.recent_workflows)
        self.active: dict[str, int] = {}
        self.active_total = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self._running: set[Running] = set()
        self._ids = itertools.count(1)
        self._wids = itertools.count(1)
        # Overload: every admitted workflow's unsettled calls, and the shed ones with their clients' error.
        self.pending: dict[Workflow, set[LiveCall]] = {}
        self.shed: dict[Workflow, Rejected] = {}
        self.plans: dict[Workflow, QuestionPlan] = {}
        self.online: dict[OnlineWorkflow, Running] = {}  # (its outcomes: the first ``MAX_CALLS`` calls')

    async def run_workflow(
        self,
        tenant: Tenant,
        deadline_s: float,
        nodes: list[DagNode],
        requests: list[CallRequest],
        *,
        route: str,
        template: WorkflowTemplate | None = None,
        wf_id: str | None = None,
        admission: Admission | None = None,
    ) -> WorkflowOutcome[CallResult]:
        """Run a validated, admitted DAG to completion or first failure; its settled calls' outcomes in node order.
        ``Rejected`` (503) when shed; a cancelled caller abandons it (counted ``cancelled``)."""
        gw = self.gw
        now = gw.clock()
        wf = DagWorkflow.build(next(self._wids), tenant.name, now, now + deadline_s, nodes, template)
        done = asyncio.get_running_loop().create_future()
        ex = _Execution(wf, tenant, route, wf_id, [None] * len(nodes), self, requests, done)
        self.begin(ex)
        gw.admitter.take(wf, admission)
        try:
            ex.launch(wf.start())
            gw.pool.drain_kicked()  # its first calls are queued: sent now, not a turn of the event loop later
            await ex.done
        except BaseException as exc:  # cancelled (client gone), or a bug: abandon the workflow either way
            ex.abandoned = True
            ex.cancel_live()
            self._finish(ex, "cancelled" if isinstance(exc, asyncio.CancelledError) else "failed")
            raise
        shed = self.shed.get(wf)
        if shed is not None:
            self._finish(ex, "shed")
            raise shed
        now = gw.clock()
        latency = now - wf.arrival
        calls = tuple([o for o in ex.outcomes if o is not None])
        status = "failed" if ex.error is not None else "ok"
        outcome = WorkflowOutcome(
            wf.wid, tenant.name, wf.arrival, wf.deadline, now, status, calls, len(nodes), ex.error, wf_id
        )
        if ex.error is None:
            self._finish(ex, "met" if deadline_met(latency, deadline_s) else "missed", latency)
            gw.recorder.record(wf)
        else:
            self._finish(ex, "failed")
        return outcome

    def open_workflow(
        self,
        tenant: Tenant,
        deadline_s: float,
        plan: QuestionPlan | None,
        *,
        route: str,
        admission: Admission | None = None,
        wf_id: str | None = None,
    ) -> OnlineWorkflow:
        """Start an admitted workflow whose stages the caller decides as it goes (``plan``: the question's
        prediction; ``wf_id``: its client's id). Close it with ``close_workflow``; once shed, its calls fail."""
        now = self.gw.clock()
        template = None if plan is None else plan.template
        wf = OnlineWorkflow(next(self._wids), tenant.name, now, now + deadline_s, template)
        run = self.online[wf] = Running(wf, tenant, route, wf_id, [])
        self.begin(run)
        self.gw.admitter.take(wf, admission)
        if plan is not None:
            self.plans[wf] = plan
        return wf

    def close_workflow(
        self, wf: OnlineWorkflow, *, failed: bool = False, valid: bool = True, cancelled: bool = False
    ) -> float:
        """Account an online workflow's end (met when in time with a ``valid`` answer); returns its latency."""
        now = self.gw.clock()
        latency = now - wf.arrival
        outcome = "shed" if wf in self.shed else "cancelled" if cancelled else "failed" if failed else ""
        ended = not outcome
        if ended:
            outcome = "met" if wf.met(now, valid=valid) else "missed"
        run = self.online.pop(wf, None)
        if run is not None:  # (None: counted out already)
            self._finish(run, outcome, latency if ended else None, valid=valid)
        if ended:
            self.gw.recorder.record(wf)
        return latency

    async def run_stage(
        self, wf: OnlineWorkflow, kind: str, calls: list[tuple[CallSpec, CallRequest]]
    ) -> list[LiveOutcome]:
        """Run one stage (calls in parallel) of an online workflow: one outcome per call, in order (a failed call's
        carries its ``CallFailed``); a cancelled caller takes its calls back."""
        wf.begin_stage(kind, [spec for spec, _ in calls])
        online = self.online.get(wf)
        kept = online.outcomes if online is not None else []
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[LiveOutcome]] = []
        live: list[LiveCall] = []
        try:
            for i, (spec, req) in enumerate(calls):
                fut: asyncio.Future[LiveOutcome] = loop.create_future()
                futures.append(fut)
                slot = len(kept)
                if slot < MAX_CALLS:  # the status page's timeline keeps the first calls only
                    kept.append(None)
                else:
                    slot = -1
                done = functools.partial(self._stage_call_done, wf=wf, fut=fut, node=i, kept=kept, slot=slot)
                live.append(self.submit(wf, spec, req, done))
            self.gw.pool.drain_kicked()  # the stage's calls are queued: sent now
            outcomes = await asyncio.gather(*futures)
        except BaseException:
            # Cancelled, or a submission failed part-way: take back every call already submitted.
            for c in live:
                self.gw.pool.cancel(c)
            raise
        return outcomes

    def _stage_call_done(
        self,
        call: LiveCall,
        outcome: CallResult | CallFailed,
        *,
        wf: OnlineWorkflow,
        fut: asyncio.Future[LiveOutcome],
        node: int,
        kept: list[LiveOutcome | None],
        slot: int,
    ) -> None:
        out = self.outcome(call, node, outcome)
        if slot >= 0:
            kept[slot] = out
        wf.stage_call_done()
        if not fut.done():
            fut.set_result(out)

    def submit(
        self,
        wf: Workflow,
        spec: CallSpec,
        req: CallRequest,
        on_done: Callable[[LiveCall, CallResult | CallFailed], None],
    ) -> LiveCall:
        """Make the call of one node or stage call and hand it to the pool (pending until it settles); a shed
        workflow's new call fails soon (not inside this call: the caller may still be registering it)."""
        gw = self.gw
        pending = self.pending.setdefault(wf, set())
        if gw.scheduler.prefix_aware and not spec.prefix:
            prompt = request_prompt(req.body)
            if prompt:
                prefix = prompt_prefix(prompt)
                if type(spec) is DagCallSpec:  # (what ``replace`` makes, without its generic machinery)
                    spec = DagCallSpec(spec.kind, spec.input_tokens, spec.output_tokens, prefix, spec.node)
                else:
                    spec = replace(spec, prefix=prefix)

        def settled(c: LiveCall, outcome: CallResult | CallFailed) -> None:
            pending.discard(c)
            if isinstance(outcome, CallResult):
                gw.admitter.completed(gw.clock(), c)
            on_done(c, outcome)

        call = LiveCall(
            id=next(self._ids),
            workflow=wf,
            spec=spec,
            ready_at=gw.clock(),
            endpoint=req.endpoint,
            body=req.body,
            on_done=settled,
            stream=req.stream,
            best_effort=wf in gw.admitter.best_effort,
        )
        shed = self.shed.get(wf)
        if shed is not None:
            failure = CallFailed(str(shed), status=shed.status)
            asyncio.get_running_loop().call_soon(settled, call, failure)
            call.on_done = None
            return call
        pending.add(call)
        gw.admitter.submitted(wf, spec, call.ready_at)  # in the queues now (t_queue): no longer committed
        gw.pool.submit(call)
        return call

    def outcome(self, call: LiveCall, node: int, outcome: CallResult | CallFailed) -> LiveOutcome:
        """A call's outcome when it returns or fails for good (its last attempt's queue and run time)."""
        now = self.gw.clock()
        sent = call.sent_at
        ok = isinstance(outcome, CallResult)
        return CallOutcome(
            call.workflow.wid,
            node,
            call.spec.kind,
            call.ready_at,
            now,
            call.worker,
            call.worker_name or None,
            sent or None,
            max((sent or now) - call.ready_at, 0.0),
            max(now - sent, 0.0) if sent else 0.0,
            call.attempts + 1 if ok else call.attempts,
            call.budget,
            ok=ok,
            answer=outcome if isinstance(outcome, CallResult) else None,
            error=outcome if isinstance(outcome, CallFailed) else None,
        )

    def begin(self, run: Running) -> None:
        """A workflow starts for its tenant."""
        tenant = run.tenant.name
        self.active[tenant] = self.active.get(tenant, 0) + 1
        self.active_total += 1
        self.idle.clear()
        self.gw.metrics.active.set(self.active_total)
        self._running.add(run)

    def _finish(self, run: Running, outcome: str, latency: float | None = None, *, valid: bool = True) -> None:
        """``run`` ended with ``outcome``: counted out once (nothing when it was already), its overload state
        dropped. Its goodput outcome goes to the metrics and the window, its timeline to the history under its
        client's id (``wf_id``, else its request's ``X-Request-Id``)."""
        if run not in self._running:
            return
        self._running.discard(run)
        gw, tenant, wf = self.gw, run.tenant.name, run.wf
        if log.isEnabledFor(logging.DEBUG):  # (not formatting the latency for a line nobody reads)
            # (the request's context carries its request and workflow ids into this line: gateway.live.logs)
            tail = "" if latency is None else f" in {latency:.3f} s"
            log.debug("workflow of tenant %s ended: %s%s", tenant, outcome, tail)
        now = gw.clock()
        metrics = gw.metrics
        goodput = goodput_outcome(outcome, valid=valid)
        metrics.workflow_outcome(tenant, goodput)
        self.outcome_window.add(tenant, goodput, now)
        rid = REQUEST_ID.get()  # the X-Request-Id the client got (its request's context)
        kept, n = kept_calls(run.outcomes)
        wf_id = run.wf_id or rid or f"{run.route}-{wf.wid}"
        ended = WorkflowOutcome(
            wf.wid, tenant, wf.arrival, wf.deadline, now, goodput, kept, n, id=wf_id, route=run.route, request_id=rid
        )
        self.history.add(ended)
        self.active[tenant] = max(self.active.get(tenant, 1) - 1, 0)
        self.active_total -= 1
        metrics.active.set(self.active_total)
        metrics.workflow_done(tenant, latency, outcome)
        if self.active_total == 0:
            self.idle.set()
        self.pending.pop(wf, None)
        self.shed.pop(wf, None)
        self.plans.pop(wf, None)
        counted = valid and latency is not None and outcome in ("met", "missed")
        gw.admitter.ended(wf, latency if counted else None)

    def rejected(self, tenant: str, reason: str) -> None:
        """Count a workflow refused at admission, and why (one of ``metrics.REJECT_REASONS``)."""
        metrics = self.gw.metrics
        metrics.workflow_done(tenant, None, "rejected")
        metrics.for_tenant(metrics.rejections, tenant, reason).inc()
        metrics.workflow_outcome(tenant, "rejected")
        self.outcome_window.add(tenant, "rejected", self.gw.clock())

    def shed_overdue(self) -> tuple[int, int]:
        """Shed or demote every admitted workflow with pending calls that ``Admitter.overdue`` names; returns
        (shed, demoted) counts."""
        gw = self.gw

        def rule(wf: Workflow) -> str | None:
            tenant = gw.tenants.get(wf.tenant)
            return tenant.on_predicted_miss if tenant is not None and tenant.predictive_admission else None

        shed = demoted = 0
        for v in gw.admitter.overdue(gw.clock(), self.pending, rule, plans=self.plans, skip=self.shed):
            if v.action == "demote":
                self._demote(v)
                gw.metrics.for_tenant(gw.metrics.demoted, v.wf.tenant, "queued").inc()
                demoted += 1
            else:
                self.fail_workflow(v.wf, Rejected(v.message, 503, v.retry_after_s))
                shed += 1
        return shed, demoted

    def _demote(self, v: ShedVerdict) -> None:
        """Move a workflow's queued calls to the best-effort lane (the admitter counts it best effort)."""
        for c in v.queued:
            # Off its queue first: the estimator counts a call by the lane it was queued in.
            if self.gw.scheduler.cancel(c):
                c.best_effort = True
                assert isinstance(c, LiveCall)
                self.gw.pool.submit(c)

    def fail_workflow(self, wf: Workflow, err: Rejected) -> None:
        """Fail a workflow early: every pending call is taken back and answered with ``err`` (its client's 503);
        its later calls fail with it at once."""
        self.shed[wf] = err
        calls = list(self.pending.get(wf, ()))
        callbacks = []
        for c in calls:
            callbacks.append((c, c.on_done))
            c.on_done = None  # the pool's own answer to an aborted request is not delivered
            self.gw.pool.cancel(c)
        failure = CallFailed(str(err), status=503)
        for c, cb in callbacks:
            if cb is not None:
                cb(c, failure)
