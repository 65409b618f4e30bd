"""The gateway service: admission, workflow execution, and the parts the HTTP app is a face for.

``Gateway`` owns the scheduler (``gateway.core``), the worker pool, the tenants store,
the metrics and the background tuner. ``Gateway.run_workflow`` executes one DAG workflow: it submits
the calls that are ready, and each call's completion callback (run synchronously by the pool, before
the worker is refilled) releases the calls that became ready, exactly as the simulator's result event
does. The HTTP layer (``gateway.live.app`` and its routers) only validates, authenticates and translates.

Admission keeps promises (``admit``): besides the gateway's and the tenant's concurrency bounds, a workflow
is admitted only if its predicted completion (``gateway.core.predict``: the queue ahead of it on the
workers it would use, plus its critical path) meets its deadline. Otherwise, per tenant
(``on_predicted_miss``), it is refused with 429 and a ``Retry-After`` of the seconds until the backlog
would have drained enough for it to fit, or admitted at the lowest urgency (best effort). Admitted
workflows are watched (``shed_overdue``, every ``SHED_PERIOD_S``): one with a queued call whose predicted
completion (a tenant with ``quality`` adaptive or fast: at the floor) is past its deadline is shed (its
calls cancelled, the client answered 503 with ``Retry-After``, counted ``shed``) or demoted to best effort;
a workflow whose calls are all in flight is never shed. A best-effort workflow still unfinished
``admission.best_effort_max_age`` times its deadline after it arrived is shed whether or not it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import math
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.config.gateway import LoadedConfig
from gateway.core.dag import DagCallSpec, DagNode, DagWorkflow
from gateway.core.degrade import QuestionPlan
from gateway.core.predict import (
    CompletionPredictor,
    QueueCalibration,
    StagePlan,
    ThroughputMeter,
    cluster_call_time,
)
from gateway.core.prefix import prompt_prefix
from gateway.core.queues import DEADLINE_ORDERED
from gateway.core.scheduler import Scheduler
from gateway.core.workflow import CallSpec, OnlineWorkflow, Workflow, WorkflowTemplate, deadline_met
from gateway.errors import CallFailed, Rejected, Unprocessable
from gateway.live.discovery import KubeApi, KubernetesDiscovery
from gateway.live.history import (
    MAX_CALLS,
    FinishedWorkflow,
    OutcomeWindow,
    WorkflowHistory,
    call_timings,
    goodput_outcome,
)
from gateway.live.idempotency import IdempotencyStore
from gateway.live.leader import LeaderElector, default_identity
from gateway.live.leader import lease_api as make_lease_api
from gateway.live.logs import REQUEST_ID
from gateway.live.metrics import GatewayMetrics
from gateway.live.pool import Clock, WorkerPool
from gateway.live.prompts import request_prompt
from gateway.live.refit import ProfileRefitTask
from gateway.live.tenants import Tenant, TenantStore
from gateway.live.transport import CallResult, LiveCall, Transport
from gateway.live.tuning import AlphaTuner, WindowRecorder
from gateway.sim.refit import profile_status

log = logging.getLogger("hexflow.gateway")

SHED_PERIOD_S = 0.2
"""How often admitted workflows are checked for a predicted deadline miss (wall seconds)."""
ADMISSION_HEADROOM = 0.9
"""The default of ``admission.headroom``: a workflow is admitted when its predicted completion is within this
share of its deadline; the margin absorbs what the estimates do not see yet (a batch growing slower as admitted
work arrives, the estimator's lag). Measured with ``hexflow bench overload``: without it about 90% of accepted
workflows met their deadline under 5x overload; the goal is 95%."""


def new_workflow_id() -> str:
    """A unique workflow id for responses: ``wf-`` and 16 random hex digits."""
    return f"wf-{uuid.uuid4().hex[:16]}"


class DeadlineTooShort(Unprocessable):
    """A deadline no wait can meet: the workflow takes longer than it even on idle workers (422).

    ``min_deadline_s``: the shortest deadline that could be admitted on idle workers (whole seconds, rounded up);
    the error body carries it, so a client can ask again with it instead of retrying the same request."""

    def __init__(self, message: str, min_deadline_s: float) -> None:
        super().__init__(message, param="deadline_s", extra={"min_deadline_s": min_deadline_s})
        self.min_deadline_s = min_deadline_s


class Admission:
    """A workflow admitted: pass it on to ``run_workflow``/``open_workflow``, which take it over.

    ``best_effort``: it is predicted to miss its deadline and its tenant runs such work at the lowest urgency
    instead of refusing it. ``work_s``: the cluster seconds of work it is expected to submit
    (``CompletionPredictor.plan_work``), committed from admission on: later admissions wait behind it.
    ``plan``: the question's prediction (Text-to-SQL), which its workflow is watched with. ``predicted_s`` and
    ``critical_s``: what admission predicted it would take and its critical path (nan: not predicted); its
    latency against them calibrates later admissions (``QueueCalibration``).

    The admission owns those committed seconds until a workflow takes them over (``take``); a request that
    ends before that (a failure between admission and the workflow's start, a client gone) must hand them
    back: ``release`` does, on every path (after ``take`` it does nothing), so nothing stays committed for
    work that will never come.
    """

    __slots__ = ("_gw", "_state", "best_effort", "critical_s", "plan", "predicted_s", "work_s")

    def __init__(
        self,
        best_effort: bool = False,
        work_s: float = 0.0,
        *,
        plan: QuestionPlan | None = None,
        gateway: Gateway | None = None,
        predicted_s: float = math.nan,
        critical_s: float = math.nan,
    ) -> None:
        self.best_effort = best_effort
        self.work_s = work_s
        self.plan = plan
        self.predicted_s = predicted_s
        self.critical_s = critical_s
        self._gw = gateway
        self._state = "held" if gateway is not None and work_s > 0.0 else "done"

    def take(self) -> float:
        """A workflow takes the committed seconds over (it releases them as it submits its calls and when it
        ends); returns them (0 when released already or never held)."""
        if self._state != "held":
            return 0.0
        self._state = "taken"
        return self.work_s

    def release(self) -> None:
        """Hand the committed seconds back unless a workflow took them over (idempotent)."""
        if self._state != "held":
            return
        self._state = "released"
        if self._gw is not None:
            self._gw.uncommit(self.work_s)


@dataclass(frozen=True, slots=True)
class CallRequest:
    """What to send for one node: the endpoint and the body (``model`` is filled per worker)."""

    endpoint: str
    body: dict[str, Any]
    stream: asyncio.Queue[bytes | None] | None = None


@dataclass(slots=True)
class CallRecord:
    """One call's outcome inside a workflow, as the caller is told it.

    The worker's name, the last attempt's queue and run seconds, the attempts, and the worker's answer
    or the final error. ``ready_at``/``sent_at``/``done_at`` (the gateway's clock; None: not reached) and
    ``budget_s`` (the stage budget the scheduler gave it) are the status page's timeline. The simulator
    keeps a different record, ``gateway.sim.simulator.CallTimeline``
    (absolute virtual times, with the engine's finish time that only it knows), for timelines.
    """

    node: int
    kind: str
    worker: str | None = None
    queued_s: float = 0.0
    run_s: float = 0.0
    attempts: int = 0
    result: CallResult | None = None
    error: CallFailed | None = None
    ready_at: float | None = None
    sent_at: float | None = None
    done_at: float | None = None
    budget_s: float = 0.0


@dataclass(slots=True)
class WorkflowOutcome:
    """A finished (or failed) workflow.

    ``wf_id``: the id the caller gave ``run_workflow``; without one, ``id`` makes one when first read (a
    chat completion, a one-call workflow, never reads it: no random id per call).
    """

    wf_id: str | None
    tenant: str
    status: str  # ok | failed
    deadline_s: float
    latency_s: float
    calls: list[CallRecord]
    error: CallFailed | None = None

    @property
    def id(self) -> str:
        """The workflow's id (``Gateway.new_workflow_id``'s form when the caller gave none)."""
        if self.wf_id is None:
            self.wf_id = new_workflow_id()
        return self.wf_id

    @property
    def deadline_met(self) -> bool:
        """Finished without error within the deadline: core's ``deadline_met`` (the one rule)."""
        return deadline_met(self.latency_s, self.deadline_s, valid=self.status == "ok")


@dataclass(eq=False)
class _Execution:
    """One DAG workflow being run (``Gateway.run_workflow``): its calls in flight, their records, and the
    callback that releases the successors of each call that returns.

    The callback is a bound method, not a closure of ``run_workflow``: two closures that call each other
    (submit the ready calls, and be called when one returns) reference each other through their cells, a
    reference cycle per workflow that only the cyclic garbage collector frees. Here the references run one
    way (a call's callback -> this -> the calls in ``live``) and ``live`` empties as calls settle, so a
    finished workflow is freed by reference counting alone.
    """

    gw: Gateway
    wf: DagWorkflow
    requests: list[CallRequest]
    records: list[CallRecord]
    done: asyncio.Future[None]
    on_call_done: Callable[[CallRecord], None] | None = None
    wf_id: str | None = None
    live: dict[int, LiveCall] = field(default_factory=dict)
    error: CallFailed | None = None
    abandoned: bool = False

    def launch(self, specs: list[Any]) -> None:
        """Submit the calls that became ready."""
        for spec in specs:
            assert isinstance(spec, DagCallSpec)
            self.live[spec.node] = self.gw._submit(self.wf, spec, self.requests[spec.node], self.on_done)

    def on_done(self, call: LiveCall, outcome: CallResult | CallFailed) -> None:
        """A call returned or failed for good: record it, then release its successors (or fail the workflow)."""
        spec = call.spec
        assert isinstance(spec, DagCallSpec)
        rec = self.records[spec.node]
        self.gw._record(rec, call, outcome)
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
        if self.on_call_done is not None:
            self.on_call_done(rec)
        if self.error is not None:
            return
        self.launch(self.wf.complete(spec))
        if self.wf.done and not self.done.done():
            self.done.set_result(None)

    def cancel_live(self) -> None:
        """Take back every call still queued or in flight."""
        for other in list(self.live.values()):
            self.gw.pool.cancel(other)
        self.live.clear()


class Gateway:
    """The live gateway's state and operations (one per process).

    Args:
        loaded: the validated configuration.
        tenants: the tenants store.
        transport: how to reach workers (``stop`` closes it).
        clock: the scheduling clock (``time.monotonic``; a fake one in parity tests).
        background: start health, scrape, tenants and tuning tasks (tests may turn them off).
        kube_api: the Kubernetes API client for discovery (default: from the config; tests pass a fake's).
        lease_api: the Kubernetes API client for leader election (default: from ``leader_election``).
    """

    def __init__(
        self,
        loaded: LoadedConfig,
        tenants: TenantStore,
        transport: Transport,
        *,
        clock: Clock = time.monotonic,
        background: bool = True,
        kube_api: KubeApi | None = None,
        lease_api: KubeApi | None = None,
    ) -> None:
        cfg = loaded.cfg
        self.loaded = loaded
        self.cfg = cfg
        self.tenants = tenants
        self.transport = transport
        self.clock = clock
        self.epoch = clock()
        self.scheduler = Scheduler(
            loaded.workers,
            cfg.policy,
            random.Random(cfg.seed),
            alpha=cfg.alpha,
            prefix_caching=cfg.prefix_caching,
            best_effort_share=cfg.admission.best_effort_share,
        )
        self.metrics = GatewayMetrics([w.name for w in loaded.workers], [t.name for t in tenants.tenants])
        self.metrics.alpha.set(self.scheduler.alpha)
        self.scheduler.set_tenant_weights({t.name: t.priority_weight for t in tenants.tenants})
        self.pool = WorkerPool(
            self.scheduler,
            transport,
            self.metrics,
            clock=clock,
            max_attempts=cfg.retries.max_attempts,
            failures_to_down=cfg.health.failures_to_down,
            parked_timeout_s=cfg.limits.parked_timeout_s,
            health_period_s=cfg.health.period_s if background else 0.0,
            scrape_period_s=cfg.scrape.period_s if background else 0.0,
            remove_grace_s=cfg.discovery.remove_grace_s if cfg.discovery is not None else 120.0,
            timeouts=cfg.timeouts,
            outlier=cfg.health.outlier,
        )
        self.discovery: KubernetesDiscovery | None = None
        kube = cfg.discovery.kubernetes if cfg.discovery is not None else None
        if kube is not None:
            self.discovery = KubernetesDiscovery(
                kube,
                self.pool,
                loaded.catalog,
                time_scale=cfg.time_scale,
                default_model=loaded.default_model,
                metrics=self.metrics,
                api=kube_api,
            )
        self.recorder = WindowRecorder(cfg.tuning.window_workflows, cfg.tuning.max_age_s)
        # The status page's memory (``gateway.live.history``): outcomes per tenant over a rolling window, the
        # last finished workflows with their calls' timings, and the records of online workflows' calls so far.
        self.outcome_window = OutcomeWindow(cfg.admin.window_s)
        self.history = WorkflowHistory(cfg.admin.recent_workflows)
        self._stage_records: dict[OnlineWorkflow, list[CallRecord]] = {}
        self.admin_keys = frozenset(cfg.admin.api_key_sha256)
        """SHA-256 digests of the operators' keys (``admin.api_key_sha256``); empty: the status page is off."""
        self.tuner = AlphaTuner(self, cfg.tuning) if background and cfg.tuning.enabled else None
        self.refit = ProfileRefitTask(self, cfg.refit) if cfg.refit.enabled else None
        # High availability: only the leader serves and runs the leader-only tasks (``_on_leadership``).
        self.elector: LeaderElector | None = None
        le = cfg.leader_election
        if le.enabled:
            api = lease_api if lease_api is not None else make_lease_api(le)
            self.elector = LeaderElector(le, api, le.identity or default_identity(), self._on_leadership)
        self._leader_stop = asyncio.Event()
        self._leader_tasks: list[asyncio.Task[None]] = []
        self.metrics.leader.set(0 if le.enabled else 1)
        idem = cfg.idempotency
        self.idempotency = (
            IdempotencyStore(idem.ttl_s, idem.max_keys, idem.max_bytes, time.monotonic) if idem.enabled else None
        )
        self.background = background
        self.draining = False
        self.ready = False
        self._ids = itertools.count(1)
        self._wids = itertools.count(1)
        self._active: dict[str, int] = {}
        self.active_total = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._executions: set[object] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._drain_until: float | None = None
        # Overload: every admitted workflow's calls not yet settled (shedding cancels them), the workflows run
        # at the lowest urgency, and the shed ones with the error their clients get.
        self._pending: dict[Workflow, set[LiveCall]] = {}
        self._best_effort: set[Workflow] = set()
        self._shed: dict[Workflow, Rejected] = {}
        # Work admitted workflows have yet to submit (cluster seconds): the fluid bound of admission.
        self._work_left: dict[Workflow, float] = {}
        self.committed_s = 0.0
        self._held = 0  # admissions holding committed work no workflow has taken over yet, and their seconds
        self._held_s = 0.0
        # Text-to-SQL workflows: the prediction each is watched with, and the id its client got.
        self._plans: dict[Workflow, QuestionPlan] = {}
        self._wf_ids: dict[Workflow, str] = {}
        # What admission predicted for each admitted workflow (and its critical path): calibrates later ones.
        self._predicted: dict[Workflow, tuple[float, float]] = {}
        self.throughput = ThroughputMeter()
        """The work the cluster completed lately: the rate admission's fluid forecast drains the work ahead at."""
        self.calibration = QueueCalibration()
        """What admitted workflows took against admission's forecast (each forecast counts only the work ahead of
        its workflow, by deadline: one calibration serves every tenant)."""
        self.status_sections: dict[str, Callable[[], Any]] = {}
        """More sections of ``/v1/status`` by name (the Text-to-SQL route adds its databases' predictions)."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the pool and the background tasks; probe workers once so readiness is known.

        With discovery, the first list of the pods is awaited (up to its timeout) so the gateway starts
        with its workers; if the API does not answer, it starts without them and keeps trying.
        """
        await self.pool.start()
        if self.discovery is not None:
            self._tasks.append(asyncio.create_task(self.discovery.run(self._stop), name="discovery"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.discovery.synced.wait(), self.discovery.cfg.timeout_s)
        if self.background:
            await self.pool.monitor.check_health(initial=True)
            self._tasks.append(asyncio.create_task(self._tenants_loop(), name="tenants-watch"))
            self._tasks.append(asyncio.create_task(self._shed_loop(), name="overload-shedding"))
        if self.elector is not None:
            self._tasks.append(asyncio.create_task(self.elector.run(self._stop), name="leader-election"))
        else:
            self._on_leadership(True)
        self.ready = True

    @property
    def leading(self) -> bool:
        """True when this replica serves: leader election is off, or it holds the Lease."""
        return self.elector is None or self.elector.leading

    def _on_leadership(self, leading: bool) -> None:
        """Start the leader-only background tasks (the alpha tuner, the profile refit) when leading; stop
        them when not (a follower serves no calls: it has nothing to tune or refit from).

        Everything else runs on every replica: health probes, scrapes, discovery and tenants reloads keep
        a follower ready to serve the moment it takes over.
        """
        if self.elector is not None:
            self.metrics.leader.set(1 if leading else 0)
            self.metrics.leader_changes.labels(event="acquired" if leading else "lost").inc()
        self._leader_stop.set()
        for t in self._leader_tasks:
            t.cancel()
        self._leader_tasks.clear()
        if not leading or self._stop.is_set():
            return
        self._leader_stop = asyncio.Event()
        if self.background and self.tuner is not None and self.scheduler.policy.uses_alpha:
            self._leader_tasks.append(asyncio.create_task(self.tuner.run(self._leader_stop), name="alpha-tuner"))
        if self.background and self.refit is not None:
            self._leader_tasks.append(asyncio.create_task(self.refit.run(self._leader_stop), name="profile-refit"))

    def begin_drain(self, grace_s: float) -> None:
        """Stop intake now (``/readyz`` and new workflows answer 503) and start the grace period.

        The grace period is counted once, from the first call: a later ``drain`` waits only for what
        is left of it (the signal handler starts the drain, the app's lifespan waits for it again).
        """
        self.draining = True
        if self._drain_until is None:
            self._drain_until = time.monotonic() + grace_s

    async def drain(self, grace_s: float) -> bool:
        """Stop intake and wait for in-flight workflows until the grace period (``grace_s`` from the
        first ``begin_drain``) is over; True when all finished."""
        self.begin_drain(grace_s)
        if self.elector is not None:  # hand the Lease over now: a follower serves while this one drains
            self._stop_election()
            await self.elector.release()
        assert self._drain_until is not None
        left = max(self._drain_until - time.monotonic(), 0.0)
        try:
            await asyncio.wait_for(self._idle.wait(), left)
        except TimeoutError:
            log.error("shutdown grace period over with %d workflows in progress", self.active_total)
            return False
        return True

    async def stop(self) -> None:
        """Stop background tasks and the pool (calls still in flight fail with 503); close the transport."""
        self.ready = False
        self._stop.set()
        self._leader_stop.set()
        tasks = self._tasks + self._leader_tasks
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        self._leader_tasks.clear()
        if self.elector is not None:
            await self.elector.release()
            await self.elector.close()
        if self.idempotency is not None:
            await self.idempotency.close()
        if self.tuner is not None:
            self.tuner.close()
        if self.discovery is not None:
            await self.discovery.close()
        await self.pool.stop()
        await self.transport.aclose()

    def _stop_election(self) -> None:
        """Stop the election rounds (before releasing the Lease, so no round takes it back)."""
        for t in self._tasks:
            if t.get_name() == "leader-election":
                t.cancel()

    async def _tenants_loop(self) -> None:
        before = (self.tenants.generation, self.tenants.reload_failures)
        period = self.cfg.tenants_reload_s
        while not self._stop.is_set():
            await asyncio.sleep(period)
            changed = await asyncio.to_thread(self.tenants.reload_if_changed)
            after = (self.tenants.generation, self.tenants.reload_failures)
            if after != before:
                self.metrics.tenant_reloads.labels(result="ok" if changed else "failed").inc()
                if changed:
                    self.metrics.set_tenants(t.name for t in self.tenants.tenants)
                    self.outcome_window.forget(t.name for t in self.tenants.tenants)
                    self.scheduler.set_tenant_weights({t.name: t.priority_weight for t in self.tenants.tenants})
                    # (TenantStore logs the reload, once)
            before = after

    # ------------------------------------------------------------------ admission

    def admit(
        self,
        tenant: Tenant,
        n_calls: int,
        plan: Sequence[StagePlan] | None = None,
        deadline_s: float | None = None,
        *,
        question: QuestionPlan | None = None,
    ) -> Admission:
        """Admit a new workflow of ``n_calls`` calls, or refuse it with ``Rejected`` (503 when draining or
        no worker is healthy, 429 at a queue or concurrency bound or when it is predicted to miss its
        deadline, with ``Retry-After``), counted as a rejected workflow of the tenant (and by reason).

        ``plan`` (its stages, ``gateway.core.predict``) and ``deadline_s`` turn on the deadline check for a
        tenant with ``predictive_admission``; a best-effort tenant's predicted miss is admitted with
        ``Admission(best_effort=True)``. A deadline shorter than the plan takes on idle workers is refused
        whatever the tenant's ``on_predicted_miss`` (``DeadlineTooShort``, 422: no wait can meet it).
        ``question``: the Text-to-SQL question's prediction ``plan`` was made from, handed on to its workflow; one
        that rests on no observation of the model (``QuestionPlan.observed``) is admitted without the deadline check.

        The answer owns the work it commits (``Admission.release``): pass it on or release it.
        """
        refusal: tuple[Rejected | DeadlineTooShort, str] | None = self._refusal(tenant, n_calls)
        work = 0.0
        predicted = critical = math.nan
        if refusal is None and plan is not None:
            now = self.clock()
            ordered = deadline_s is not None and self.scheduler.policy.queue in DEADLINE_ORDERED
            due = now + (deadline_s or 0.0)
            after = self.scheduler.queued_due_after(due) if ordered else None
            pred = CompletionPredictor(
                self.scheduler,
                now,
                committed_s=self._committed_ahead(due) if ordered else self.committed_s,
                efficiency=self.efficiency(now),
                after=after,
            )
            work = pred.plan_work(plan)
            predicted, critical = pred.duration(plan), pred.critical_path(plan)
            # A question whose plan rests on no observation of the model yet (the gateway's first calls) is not
            # refused on that guess: its work is committed, its deadline is not checked.
            checked = question is None or question.observed
            if deadline_s is not None and tenant.predictive_admission and checked:
                judge, forecast = pred, predicted
                if not self.calibration.verified:
                    # No forecast of its has been checked against what admitted work took yet (a gateway just
                    # started, or its traffic just began): refused only when it cannot make it even at the
                    # cluster's full throughput and with nothing queued after its first stage. A refusal on a
                    # guess would be wrong as often as the guess is.
                    judge = CompletionPredictor(
                        self.scheduler,
                        now,
                        later_queue_weight=0.0,
                        committed_s=pred.committed_s,
                        efficiency=max(pred.efficiency, 1.0),
                        after=after,
                    )
                    forecast = judge.duration(plan)
                miss = self._deadline_refusal(judge, plan, deadline_s, forecast, critical)
                if isinstance(miss, Rejected) and tenant.on_predicted_miss == "best_effort":
                    # Behind every other call: it delays nobody, so it commits no work ahead of others.
                    self.metrics.demotion(tenant.name, "admission")
                    return Admission(best_effort=True, plan=question)
                if miss is not None:  # (a deadline no wait can meet is refused whatever the tenant says)
                    refusal = (miss, "deadline")
        if refusal is not None:
            error, reason = refusal
            self.rejected(tenant.name, reason)
            error.extra = {**(error.extra or {}), "reason": reason}  # (the body says why: REJECT_REASONS)
            raise error
        if not math.isfinite(work) or work <= 0.0:
            return Admission(plan=question, predicted_s=predicted, critical_s=critical)
        self.committed_s += work  # now, so that the next admission (before this one starts) counts it
        self._held += 1
        self._held_s += work
        return Admission(work_s=work, plan=question, gateway=self, predicted_s=predicted, critical_s=critical)

    def _committed_ahead(self, deadline: float) -> float:
        """The committed work ahead of a workflow due at ``deadline`` under a deadline-ordered queue discipline
        (``DEADLINE_ORDERED``): the work of admitted workflows due later (and of best-effort ones) waits behind it;
        admissions not yet taken over by their workflow count as ahead."""
        ahead = self._held_s
        for wf, left in self._work_left.items():
            if wf.deadline <= deadline and wf not in self._best_effort:
                ahead += left
        return min(ahead, self.committed_s)

    def uncommit(self, work_s: float) -> None:
        """An admission released its committed work unused (``Admission.release``)."""
        self._unhold(work_s)
        self.committed_s = max(self.committed_s - work_s, 0.0)
        self._settle_committed()

    def efficiency(self, now: float) -> float:
        """The share of the cluster's full-batch throughput (as the model counts it) that admission forecasts the
        work ahead to drain at: the configured ``admission.sustainable_share``, scaled up by how much more than the
        model's full-batch throughput the cluster was seen to complete lately (``ThroughputMeter``, when above 1:
        the model overcounts what calls cost on this workload, prompts served from the prefix caches, a profile
        slower than the GPU), at most 1.

        The share is what keeps admitted work on time, not the most the cluster does (admitted workflows share
        every engine's batch): a meter at the model's full-batch throughput, as under overload, leaves it as it is."""
        seen = self.throughput.share(now, len(self.scheduler.eligible_workers()))
        return min(self.cfg.admission.sustainable_share * max(seen, 1.0), 1.0)

    def _unhold(self, work_s: float) -> None:
        self._held = max(self._held - 1, 0)
        self._held_s = max(self._held_s - work_s, 0.0) if self._held else 0.0

    def _settle_committed(self) -> None:
        if not self._work_left and self._held == 0:
            self.committed_s = 0.0  # no float drift: nothing is committed

    def _refusal(self, tenant: Tenant, n_calls: int) -> tuple[Rejected, str] | None:
        """Why a new workflow cannot be admitted now (the error and its metric reason), or None."""
        lim = self.cfg.limits
        if self.draining:
            return Rejected("the gateway is shutting down", 503, 5), "draining"
        if not self.leading:
            assert self.elector is not None
            leader = self.elector.holder
            return Rejected(
                "this gateway replica is not the leader"
                + (f" ({leader} is)" if leader else " (none is yet)")
                + "; send requests to the gateway's Service, which routes to the leader",
                503,
                max(1, math.ceil(self.cfg.leader_election.retry_period_s)),
            ), "not_leader"
        if self.pool.healthy == 0:
            return Rejected("no healthy worker", 503, max(1, round(self.cfg.health.period_s))), "no_worker"
        queued = self.scheduler.queued_total()
        if queued + n_calls > lim.max_queued_calls:
            return Rejected(f"the gateway's queues are full ({queued} calls waiting)", 429, 2), "queue_full"
        if self.active_total >= lim.max_active_workflows:
            return Rejected(f"too many workflows in progress ({self.active_total})", 429, 2), "concurrency"
        if self._active.get(tenant.name, 0) >= tenant.max_concurrent_workflows:
            return Rejected(
                f"tenant {tenant.name!r} has {tenant.max_concurrent_workflows} workflows in progress (its maximum)",
                429,
                1,
            ), "concurrency"
        return None

    def _deadline_refusal(
        self,
        pred: CompletionPredictor,
        plan: Sequence[StagePlan],
        deadline_s: float,
        predicted: float,
        path: float,
    ) -> Rejected | DeadlineTooShort | None:
        """A 429 when ``plan`` started now is predicted to finish after ``deadline_s``, else None.

        ``Retry-After``: the seconds until the backlog ahead would have drained enough for the workflow to
        fit (``CompletionPredictor.retry_after_s``), rounded up, at least 1. A deadline shorter than the
        critical path on idle workers cannot be met by waiting: ``DeadlineTooShort`` (422) with the shortest
        deadline that could be admitted, never a 429 a well-behaved client would retry forever.

        ``predicted`` and ``path``: ``pred``'s duration of ``plan`` and its critical path; the queueing part of
        the prediction is calibrated by what admitted workflows took (``QueueCalibration``).
        """
        headroom = self.cfg.admission.headroom
        target = headroom * deadline_s
        cal = self.calibration
        predicted = cal.calibrated(predicted, path)
        if predicted <= target:
            return None
        wait = pred.retry_after_s(plan, cal.target(target, path))
        if wait is None:
            if not math.isfinite(path):  # no worker could run it: not the client's deadline's fault
                return Rejected("no worker can run the workflow now", 503, max(1, round(self.cfg.health.period_s)))
            shortest = _round_up(path / headroom)
            return DeadlineTooShort(
                f"a deadline of {deadline_s:.3g} s cannot be met: the workflow takes about {path:.3g} s even on idle "
                f"workers, and admission keeps {1 - headroom:.0%} of a deadline as margin; ask for at least "
                f"{shortest:g} s",
                shortest,
            )
        return Rejected(
            f"the workflow is predicted to finish in {predicted:.3g} s, too close to or after its deadline of "
            f"{deadline_s:.3g} s (the queue ahead of it); retry after about {wait:.3g} s",
            429,
            _whole_seconds(wait),
        )

    # ------------------------------------------------------------------ execution

    def new_workflow_id(self) -> str:
        """A unique workflow id for responses."""
        return new_workflow_id()

    async def run_workflow(
        self,
        tenant: Tenant,
        deadline_s: float,
        nodes: list[DagNode],
        requests: list[CallRequest],
        *,
        template: WorkflowTemplate | None = None,
        wf_id: str | None = None,
        on_call_done: Callable[[CallRecord], None] | None = None,
        admission: Admission | None = None,
    ) -> WorkflowOutcome:
        """Run a validated DAG to completion (or first failure). Admission must have passed (``admission``:
        its answer; best effort runs every call at the lowest urgency, its work is committed until submitted).

        Shed (its predicted completion passed its deadline while calls were queued, and its tenant rejects
        such work): raises ``Rejected`` (503, ``Retry-After``), counted ``shed``.

        Cancelling the awaiting task (client gone) abandons the workflow: queued calls leave their
        queues, in-flight ones are cancelled (their requests are aborted), no further call is
        submitted, and the workflow is counted ``cancelled`` (never met, not recorded for the tuner).
        """
        now = self.clock()
        wid = next(self._wids)
        wf = DagWorkflow.build(wid, tenant.name, now, now + deadline_s, nodes, template)
        loop = asyncio.get_running_loop()
        records = [CallRecord(i, n.kind) for i, n in enumerate(nodes)]
        ex = _Execution(self, wf, requests, records, loop.create_future(), on_call_done, wf_id)
        self._begin(ex, tenant)
        self._admitted(wf, admission)
        try:
            ex.launch(wf.start())
            self.pool.drain_kicked()  # its first calls are queued: sent now, not a turn of the event loop later
            await ex.done
        except BaseException as exc:  # cancelled (client gone), or a bug: abandon the workflow either way
            ex.abandoned = True
            ex.cancel_live()
            self._finish(ex, tenant, "cancelled" if isinstance(exc, asyncio.CancelledError) else "failed", None)
            raise
        shed = self._shed.get(wf)
        if shed is not None:
            self._finish(ex, tenant, "shed", None)
            raise shed
        latency = self.clock() - wf.arrival
        outcome = WorkflowOutcome(
            wf_id,
            tenant.name,
            "failed" if ex.error is not None else "ok",
            deadline_s,
            latency,
            ex.records,
            ex.error,
        )
        if ex.error is None:
            self._finish(ex, tenant, "met" if outcome.deadline_met else "missed", latency)
            self.recorder.record(wf)
        else:
            self._finish(ex, tenant, "failed", None)
        return outcome

    def _submit(
        self,
        wf: Workflow,
        spec: CallSpec,
        req: CallRequest,
        on_done: Callable[[LiveCall, CallResult | CallFailed], None],
    ) -> LiveCall:
        """Make the call of one node or stage call and hand it to the pool.

        The call is tracked as pending for its workflow until it settles (shedding cancels pending calls);
        a best-effort workflow's call runs at the lowest urgency; a shed workflow's new call fails at once
        (soon, not inside this call: the caller may still be registering it).
        """
        pending = self._pending.setdefault(wf, set())
        if self.scheduler.prefix_aware and not spec.prefix:
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
                self.throughput.add(self.clock(), c.gpu_s)
            on_done(c, outcome)

        call = LiveCall(
            id=next(self._ids),
            workflow=wf,
            spec=spec,
            ready_at=self.clock(),
            endpoint=req.endpoint,
            body=req.body,
            on_done=settled,
            stream=req.stream,
            best_effort=wf in self._best_effort,
        )
        shed = self._shed.get(wf)
        if shed is not None:
            failure = CallFailed(str(shed), status=shed.status)
            asyncio.get_running_loop().call_soon(settled, call, failure)
            call.on_done = None
            return call
        pending.add(call)
        left = self._work_left.get(wf)
        if left is not None:  # submitted work is in the queues now (t_queue): no longer committed
            done = min(cluster_call_time(self.scheduler, spec, call.ready_at), left)
            self._work_left[wf] = left - done
            self.committed_s = max(self.committed_s - done, 0.0)
        self.pool.submit(call)
        return call

    def _record(self, rec: CallRecord, call: LiveCall, outcome: CallResult | CallFailed) -> None:
        """Fill a call's record when it returns or fails for good: worker, the last attempt's queue and
        run time, attempts, and the answer or the error."""
        now = self.clock()
        if call.worker_name:
            rec.worker = call.worker_name
        rec.queued_s = max((call.sent_at or now) - call.ready_at, 0.0)
        rec.run_s = max(now - call.sent_at, 0.0) if call.sent_at else 0.0
        rec.ready_at = call.ready_at
        rec.sent_at = call.sent_at or None
        rec.done_at = now
        rec.budget_s = call.budget
        if isinstance(outcome, CallResult):
            rec.attempts = call.attempts + 1
            rec.result = outcome
        else:
            rec.attempts = call.attempts
            rec.error = outcome

    def _begin(self, ex: object, tenant: Tenant) -> None:
        self._active[tenant.name] = self._active.get(tenant.name, 0) + 1
        self.active_total += 1
        self._idle.clear()
        self.metrics.active.set(self.active_total)
        self._executions.add(ex)

    def _finish(self, ex: object, tenant: Tenant, outcome: str, latency: float | None, *, valid: bool = True) -> None:
        if ex not in self._executions:
            return
        self._executions.discard(ex)
        if log.isEnabledFor(logging.DEBUG):  # (not formatting the latency for a line nobody reads)
            # (the request's context carries its request and workflow ids into this line: gateway.live.logs)
            log.debug(
                "workflow of tenant %s ended: %s%s",
                tenant.name,
                outcome,
                "" if latency is None else f" in {latency:.3f} s",
            )
        wf = ex.wf if isinstance(ex, _Execution) else ex
        if isinstance(ex, _Execution):
            self._ended(ex.wf, tenant.name, outcome, valid, ex.records, ex.wf_id)
        elif isinstance(wf, OnlineWorkflow):
            self._ended(wf, tenant.name, outcome, valid, self._stage_records.pop(wf, []), self._wf_ids.pop(wf, None))
        if isinstance(wf, Workflow):
            self._pending.pop(wf, None)
            self._best_effort.discard(wf)
            self._shed.pop(wf, None)
            self.committed_s = max(self.committed_s - self._work_left.pop(wf, 0.0), 0.0)
            self._plans.pop(wf, None)
            self._settle_committed()
            forecast = self._predicted.pop(wf, None)
            if forecast is not None and valid and latency is not None and outcome in ("met", "missed"):
                self.calibration.add(latency, *forecast)
        self._active[tenant.name] = max(self._active.get(tenant.name, 1) - 1, 0)
        self.active_total -= 1
        self.metrics.active.set(self.active_total)
        self.metrics.workflow_done(tenant.name, latency, outcome)
        if self.active_total == 0:
            self._idle.set()

    def _ended(
        self, wf: Workflow, tenant: str, status: str, valid: bool, records: Sequence[CallRecord], wf_id: str | None
    ) -> None:
        """Account a workflow that ran and ended (``status``: met, missed, failed, cancelled, shed): its goodput
        outcome (metrics and the rolling window) and its timeline in the status page's history, under the id its
        client got (``wf_id``: the response's; a chat call's is its ``X-Request-Id``, which this runs under)."""
        now = self.clock()
        outcome = goodput_outcome(status, valid=valid)
        self.metrics.workflow_outcome(tenant, outcome)
        self.outcome_window.add(tenant, outcome, now)
        route = "text2sql" if isinstance(wf, OnlineWorkflow) else "workflows" if wf_id is not None else "chat"
        rid = REQUEST_ID.get()  # the X-Request-Id the client got (its request's context)
        calls, more = call_timings(
            wf.arrival,
            [
                (r.kind, r.worker, r.ready_at, r.sent_at, r.done_at, r.budget_s, r.attempts, r.error is None)
                for r in records
                if r.ready_at is not None and r.done_at is not None
            ],
        )
        self.history.add(
            FinishedWorkflow(
                id=wf_id or rid or f"{route}-{wf.wid}",
                request_id=rid,
                tenant=tenant,
                route=route,
                outcome=outcome,
                finished=now,
                latency_s=now - wf.arrival,
                deadline_s=wf.deadline - wf.arrival,
                calls=calls,
                more_calls=more,
            )
        )

    # ------------------------------------------------------------------ online workflows (stage by stage)

    def open_workflow(
        self,
        tenant: Tenant,
        deadline_s: float,
        plan: QuestionPlan | None,
        *,
        admission: Admission | None = None,
        wf_id: str | None = None,
    ) -> OnlineWorkflow:
        """Start a workflow whose stages the caller decides as it goes (the Text-to-SQL pipeline).

        ``plan``: the question's prediction (its template sets the stage budgets; the overload re-check and
        shedding predict with it, at its floor). Admission must have passed (``admission``: its answer, as for
        ``run_workflow``). ``wf_id``: the id its client got (the status page's history shows it). Every workflow
        opened must be closed with ``close_workflow``. Once shed, every call of it fails with the shed error.
        """
        now = self.clock()
        wf = OnlineWorkflow(
            next(self._wids), tenant.name, now, now + deadline_s, None if plan is None else plan.template
        )
        self._begin(wf, tenant)
        self._admitted(wf, admission)
        if plan is not None:
            self._plans[wf] = plan
        if wf_id is not None:
            self._wf_ids[wf] = wf_id
        return wf

    def _admitted(self, wf: Workflow, admission: Admission | None) -> None:
        """Take over what admission decided for a workflow that now exists: best effort, committed work."""
        if admission is None:
            return
        if admission.best_effort:
            self._best_effort.add(wf)
        work = admission.take()
        if work > 0.0:
            self._unhold(work)
            self._work_left[wf] = work
        if math.isfinite(admission.predicted_s) and not admission.best_effort:
            self._predicted[wf] = (admission.predicted_s, admission.critical_s)

    def close_workflow(
        self,
        wf: OnlineWorkflow,
        tenant: Tenant,
        *,
        failed: bool = False,
        valid: bool = True,
        cancelled: bool = False,
    ) -> float:
        """Account an online workflow's end; returns its latency in seconds.

        ``cancelled``: abandoned because its client went away (counted as cancelled); ``failed``: it
        ended in an error (counted as failed). Neither is recorded for the tuner. Otherwise it is met
        when it finished by its deadline with a ``valid`` answer (``Workflow.met``: a Text-to-SQL answer
        without valid SQL is missed even in time, as its response's ``deadline_met`` says), else missed.
        """
        now = self.clock()
        latency = now - wf.arrival
        if wf in self._shed:
            self._finish(wf, tenant, "shed", None)
        elif cancelled:
            self._finish(wf, tenant, "cancelled", None)
        elif failed:
            self._finish(wf, tenant, "failed", None)
        else:
            self._finish(wf, tenant, "met" if wf.met(now, valid=valid) else "missed", latency, valid=valid)
            self.recorder.record_online(wf)
        return latency

    async def run_stage(
        self, wf: OnlineWorkflow, kind: str, calls: list[tuple[CallSpec, CallRequest]]
    ) -> list[tuple[CallRecord, CallResult | CallFailed]]:
        """Run one stage (calls in parallel) of an online workflow; returns each call's record and outcome.

        The stage is announced to the workflow first, so budgets follow its template. A cancelled caller
        takes its queued and in-flight calls back.
        """
        wf.begin_stage(kind, [spec for spec, _ in calls])
        kept = self._stage_records.setdefault(wf, [])
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[CallResult | CallFailed]] = []
        live: list[LiveCall] = []
        records: list[CallRecord] = []

        def done_of(
            call: LiveCall,
            outcome: CallResult | CallFailed,
            *,
            fut: asyncio.Future[CallResult | CallFailed],
            rec: CallRecord,
        ) -> None:
            self._record(rec, call, outcome)
            wf.stage_call_done()
            if not fut.done():
                fut.set_result(outcome)

        for i, (spec, _) in enumerate(calls):
            fut: asyncio.Future[CallResult | CallFailed] = loop.create_future()
            rec = CallRecord(i, spec.kind)

            futures.append(fut)
            records.append(rec)
            if len(kept) < MAX_CALLS:  # the status page's timeline keeps the first calls only
                kept.append(rec)
        try:
            for (spec, req), fut, rec in zip(calls, futures, records, strict=True):
                live.append(self._submit(wf, spec, req, functools.partial(done_of, fut=fut, rec=rec)))
            self.pool.drain_kicked()  # the stage's calls are queued: sent now
            outcomes = await asyncio.gather(*futures)
        except BaseException:
            # Cancelled, or a submission failed part-way: take back every call already submitted, so none
            # of the stage's calls keeps running for a caller that is gone.
            for c in live:
                self.pool.cancel(c)
            raise
        return list(zip(records, outcomes, strict=True))

    def rejected(self, tenant: str, reason: str) -> None:
        """Count a workflow refused at admission, and why (one of ``metrics.REJECT_REASONS``)."""
        self.metrics.workflow_done(tenant, None, "rejected")
        self.metrics.rejection(tenant, reason)
        self.metrics.workflow_outcome(tenant, "rejected")
        self.outcome_window.add(tenant, "rejected", self.clock())

    # ------------------------------------------------------------------ overload: shedding

    async def _shed_loop(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(SHED_PERIOD_S)
            try:
                self.shed_overdue()
            except Exception:  # keep watching: a bug here must not stop the gateway's protection
                log.exception("overload check failed")

    def shed_overdue(self) -> tuple[int, int]:
        """Check every admitted workflow with a queued call: one predicted to finish after its deadline is
        shed (tenant ``on_predicted_miss: reject``) or demoted to the lowest urgency (``best_effort``).
        A workflow whose calls are all in flight is never touched, except a best-effort one past
        ``admission.best_effort_max_age`` times its deadline, which is shed. Returns (shed, demoted) counts.
        """
        now = self.clock()
        pred: CompletionPredictor | None = None
        shed = demoted = 0
        max_age = self.cfg.admission.best_effort_max_age
        for wf, calls in list(self._pending.items()):
            if wf in self._shed:
                continue
            if wf in self._best_effort:
                age = now - wf.arrival
                if max_age is not None and age > max_age * (wf.deadline - wf.arrival):
                    self._expire(wf, age, max_age)
                    shed += 1
                continue
            queued = [c for c in calls if c.started_at is None]
            if not queued:
                continue
            tenant = self.tenants.get(wf.tenant)
            if tenant is None or not tenant.predictive_admission:
                continue
            # Optimistic after its queued calls (later stages meet no queue): shedding cannot be undone.
            pred = pred or CompletionPredictor(self.scheduler, now, later_queue_weight=0.0)
            plan = self._plans.get(wf)
            if plan is not None and isinstance(wf, OnlineWorkflow):
                # As admission predicted it: the question's plan at its floor (the least work that still answers,
                # for a tenant that accepts degraded answers; the full pipeline for one that does not).
                phase, rounds = wf.position
                completion = (
                    now + pred.pending_time(calls) + pred.critical_path(plan.rest(phase=phase, rounds_done=rounds))
                )
            else:
                completion = pred.workflow_completion(wf, calls)
            if completion <= wf.deadline:
                continue
            if tenant.on_predicted_miss == "best_effort":
                self._demote(wf, queued)
                self.metrics.demotion(tenant.name, "queued")
                demoted += 1
            else:
                self._shed_workflow(wf, completion - wf.deadline)
                shed += 1
        return shed, demoted

    def _demote(self, wf: Workflow, queued: list[LiveCall]) -> None:
        """Run a workflow at the lowest urgency: its queued calls move to the best-effort lane, its later
        calls start there."""
        self._best_effort.add(wf)
        for c in queued:
            # Off its queue first: the estimator counts a call by the lane it was queued in.
            if self.scheduler.cancel(c):
                c.best_effort = True
                self.pool.submit(c)

    def _shed_workflow(self, wf: Workflow, overshoot_s: float) -> None:
        """Fail a workflow predicted to miss: ``_fail_workflow`` with the shed error. ``Retry-After``: the
        predicted overshoot, at least 1 s."""
        self._fail_workflow(
            wf,
            Rejected(
                f"shed: the workflow was predicted to finish {overshoot_s:.3g} s after its deadline "
                "(the gateway is overloaded); its calls were cancelled",
                503,
                _whole_seconds(overshoot_s),
            ),
        )

    def _expire(self, wf: Workflow, age_s: float, max_age: float) -> None:
        """Fail a best-effort workflow that outlived ``admission.best_effort_max_age`` times its deadline.
        ``Retry-After``: its deadline, at least 1 s (the overload that starved it is not over)."""
        self._fail_workflow(
            wf,
            Rejected(
                f"shed: the best-effort workflow was still unfinished {age_s:.3g} s after it arrived, past "
                f"{max_age:g} x its deadline (admission.best_effort_max_age; the gateway is overloaded); its calls "
                "were cancelled",
                503,
                _whole_seconds(wf.deadline - wf.arrival),
            ),
        )

    def _fail_workflow(self, wf: Workflow, err: Rejected) -> None:
        """Fail a workflow early: every pending call is taken back (queued ones off their queues, in-flight
        requests aborted, as a client's disconnect does) and answered with ``err``, which its runner turns
        into the client's 503; its later calls fail with it at once."""
        self._shed[wf] = err
        calls = list(self._pending.get(wf, ()))
        callbacks = []
        for c in calls:
            callbacks.append((c, c.on_done))
            c.on_done = None  # the pool's own answer to an aborted request is not delivered
            self.pool.cancel(c)
        failure = CallFailed(str(err), status=503)
        for c, cb in callbacks:
            if cb is not None:
                cb(c, failure)

    # ------------------------------------------------------------------ status

    def predicted_s(self, plan: Sequence[StagePlan]) -> float:
        """Seconds a workflow of ``plan`` admitted now is predicted to take (as admission predicts it; -1 when
        no worker could run it): the status's load figure per database."""
        pred = CompletionPredictor(
            self.scheduler, self.clock(), committed_s=self.committed_s, efficiency=self.efficiency(self.clock())
        )
        d = pred.duration(plan)
        return d if math.isfinite(d) else -1.0

    def refresh_gauges(self) -> None:
        """Point-in-time gauges, before a scrape of ``/metrics``."""
        for st in self.pool.workers:
            i = st.index
            self.metrics.worker_gauges(st.name, self.scheduler.queue_len(i), self.scheduler.inflight(i))
            self.metrics.profile_constants(st.name, profile_status(st.info)["constants"])
        self.metrics.parked.set(len(self.pool.parked))

    def status(self) -> dict[str, Any]:
        """What ``/v1/status`` shows."""
        return {
            "policy": self.scheduler.policy.name,
            "alpha": self.scheduler.alpha,
            "ready": self.ready and not self.draining and self.leading and self.pool.healthy > 0,
            "draining": self.draining,
            "active_workflows": self.active_total,
            "active_by_tenant": {k: v for k, v in self._active.items() if v},
            "parked_calls": len(self.pool.parked),
            "overload": {
                "committed_s": round(self.committed_s, 6),
                "best_effort_workflows": len(self._best_effort),
                "calibration": {"factor": round(self.calibration.factor, 6), "samples": self.calibration.samples},
            },
            "tenants": {"generation": self.tenants.generation, "last_error": self.tenants.last_error},
            "tuning": None if self.tuner is None else self.tuner.status(),
            "discovery": None if self.discovery is None else self.discovery.status(),
            "leader_election": None if self.elector is None else self.elector.status(),
            "idempotency": None if self.idempotency is None else self.idempotency.status(),
            "workers": self._workers_status(),
            **{name: section() for name, section in self.status_sections.items()},
        }

    def _workers_status(self) -> list[dict[str, Any]]:
        """Each worker's state, with its profile (name, source, constants) and the refit's last attempt."""
        now = self.clock()
        out = self.pool.status()
        for entry, st in zip(out, self.pool.workers, strict=True):
            entry["profile"] = (
                self.refit.status(st.info, now)
                if self.refit is not None
                else {**profile_status(st.info), "refit": None}
            )
        return out


def _round_up(seconds: float) -> float:
    """A deadline to suggest: ``seconds`` rounded up to two significant figures (at least 0.1 s)."""
    if seconds <= 0.1:
        return 0.1
    step = 10.0 ** (math.floor(math.log10(seconds)) - 1)
    return round(math.ceil(seconds / step - 1e-9) * step, 10)


def _whole_seconds(seconds: float) -> int:
    """A ``Retry-After`` value: whole seconds, rounded up, at least 1 (and finite)."""
    if not math.isfinite(seconds):
        return 60
    return max(1, math.ceil(seconds))
