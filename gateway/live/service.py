"""The gateway service: the coordinator the HTTP app is a face for.

``Gateway`` owns the scheduler (``gateway.core``), the worker pool, the tenants store, the metrics and the
background tuner, and hands the work to three parts: admission (``gateway.core.admission.Admitter``, the
implementation the simulator runs too), the workflow runner (``gateway.live.runner``: DAG and online workflows,
shedding) and the lifecycle (``gateway.live.lifecycle``: start, leadership, tenants reload, drain, stop). The HTTP
layer (``gateway.live.app`` and its routers) only validates, authenticates and translates.

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

import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway.config.gateway import LoadedConfig
from gateway.core.admission import Admission, AdmissionRefused, Admitter
from gateway.core.dag import DagNode
from gateway.core.degrade import QuestionPlan
from gateway.core.predict import StagePlan
from gateway.core.records import WorkflowOutcome
from gateway.core.scheduler import Scheduler
from gateway.core.workflow import CallSpec, OnlineWorkflow, WorkflowTemplate
from gateway.errors import GatewayError, Rejected
from gateway.live.discovery import KubeApi, KubernetesDiscovery
from gateway.live.history import OutcomeWindow, WorkflowHistory
from gateway.live.httperrors import to_http
from gateway.live.idempotency import IdempotencyStore
from gateway.live.leader import LeaderElector, default_identity
from gateway.live.leader import lease_api as make_lease_api
from gateway.live.lifecycle import Lifecycle
from gateway.live.metrics import GatewayMetrics
from gateway.live.pool import Clock, WorkerPool
from gateway.live.refit import ProfileRefitTask
from gateway.live.runner import CallRequest, LiveOutcome, WorkflowRunner, new_workflow_id
from gateway.live.tenants import Tenant, TenantStore
from gateway.live.transport import CallResult, Transport
from gateway.live.tuning import AlphaTuner, WindowRecorder
from gateway.sim.refit import profile_status

__all__ = ["Gateway"]


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
        self.background = background
        self.draining = False
        self.ready = False
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
        self.pool = self._make_pool(background)
        self.discovery = self._make_discovery(kube_api)
        self.admitter = Admitter(
            self.scheduler,
            headroom=cfg.admission.headroom,
            sustainable_share=cfg.admission.sustainable_share,
            best_effort_max_age=cfg.admission.best_effort_max_age,
        )
        """Admission and the work it committed (``gateway.core.admission``)."""
        self.recorder = WindowRecorder(cfg.tuning.window_workflows, cfg.tuning.max_age_s)
        self.admin_keys = frozenset(cfg.admin.api_key_sha256)
        """SHA-256 digests of the operators' keys (``admin.api_key_sha256``); empty: the status page is off."""
        self.tuner = AlphaTuner(self, cfg.tuning) if background and cfg.tuning.enabled else None
        self.refit = ProfileRefitTask(self, cfg.refit) if cfg.refit.enabled else None
        self.runner = WorkflowRunner(self)
        self.lifecycle = Lifecycle(self)
        # High availability: only the leader serves and runs the leader-only tasks (``Lifecycle.on_leadership``).
        self.elector: LeaderElector | None = None
        le = cfg.leader_election
        if le.enabled:
            api = lease_api if lease_api is not None else make_lease_api(le)
            self.elector = LeaderElector(le, api, le.identity or default_identity(), self.lifecycle.on_leadership)
        self.metrics.leader.set(0 if le.enabled else 1)
        idem = cfg.idempotency
        self.idempotency = (
            IdempotencyStore(idem.ttl_s, idem.max_keys, idem.max_bytes, time.monotonic) if idem.enabled else None
        )
        self.status_sections: dict[str, Callable[[], Any]] = {}
        """More sections of ``/v1/status`` by name (the Text-to-SQL route adds its databases' predictions)."""

    def _make_pool(self, background: bool) -> WorkerPool:
        cfg = self.cfg
        return WorkerPool(
            self.scheduler,
            self.transport,
            self.metrics,
            clock=self.clock,
            max_attempts=cfg.retries.max_attempts,
            failures_to_down=cfg.health.failures_to_down,
            parked_timeout_s=cfg.limits.parked_timeout_s,
            health_period_s=cfg.health.period_s if background else 0.0,
            scrape_period_s=cfg.scrape.period_s if background else 0.0,
            remove_grace_s=cfg.discovery.remove_grace_s if cfg.discovery is not None else 120.0,
            timeouts=cfg.timeouts,
            outlier=cfg.health.outlier,
        )

    def _make_discovery(self, kube_api: KubeApi | None) -> KubernetesDiscovery | None:
        cfg = self.cfg
        kube = cfg.discovery.kubernetes if cfg.discovery is not None else None
        if kube is None:
            return None
        return KubernetesDiscovery(
            kube,
            self.pool,
            self.loaded.catalog,
            time_scale=cfg.time_scale,
            default_model=self.loaded.default_model,
            metrics=self.metrics,
            api=kube_api,
        )

    # ------------------------------------------------------------------ what the parts share

    @property
    def leading(self) -> bool:
        """True when this replica serves: leader election is off, or it holds the Lease."""
        return self.elector is None or self.elector.leading

    @property
    def active_total(self) -> int:
        """Workflows in progress."""
        return self.runner.accounting.active_total

    @property
    def committed_s(self) -> float:
        """Cluster seconds of work admitted workflows have yet to submit (``Admitter.committed_s``)."""
        return self.admitter.committed_s

    @property
    def outcome_window(self) -> OutcomeWindow:
        """Outcomes per tenant over the status page's rolling window."""
        return self.runner.accounting.outcome_window

    @property
    def history(self) -> WorkflowHistory:
        """The last finished workflows with their calls' timings (the status page's)."""
        return self.runner.accounting.history

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the pool and the background tasks (``Lifecycle.start``)."""
        await self.lifecycle.start()

    def begin_drain(self, grace_s: float) -> None:
        """Stop intake now (``/readyz`` and new workflows answer 503) and start the grace period.

        The grace period is counted once, from the first call: a later ``drain`` waits only for what
        is left of it (the signal handler starts the drain, the app's lifespan waits for it again).
        """
        self.lifecycle.begin_drain(grace_s)

    async def drain(self, grace_s: float) -> bool:
        """Stop intake and wait for in-flight workflows until the grace period (``grace_s`` from the
        first ``begin_drain``) is over; True when all finished."""
        return await self.lifecycle.drain(grace_s)

    async def stop(self) -> None:
        """Stop background tasks and the pool (calls still in flight fail with 503); close the transport."""
        await self.lifecycle.stop()

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
        tenant with ``predictive_admission`` (``Admitter.admit``); a best-effort tenant's predicted miss is
        admitted with ``Admission(best_effort=True)``. A deadline shorter than the plan takes on idle workers is
        refused whatever the tenant's ``on_predicted_miss`` (422 with ``min_deadline_s``: no wait can meet it).
        ``question``: the Text-to-SQL question's prediction ``plan`` was made from, handed on to its workflow; one
        that rests on no observation of the model (``QuestionPlan.observed``) is admitted without the deadline check.

        The answer owns the work it commits (``Admission.release``): pass it on or release it.
        """
        refusal: tuple[GatewayError, str] | None = self._refusal(tenant, n_calls)
        if refusal is None and plan is not None:
            try:
                admission = self.admitter.admit(
                    self.clock(),
                    plan,
                    deadline_s,
                    checked=tenant.predictive_admission and (question is None or question.observed),
                    best_effort_on_miss=tenant.on_predicted_miss == "best_effort",
                    question=question,
                )
            except AdmissionRefused as exc:
                refusal = to_http(exc, health_period_s=self.cfg.health.period_s), "deadline"
            else:
                if admission.best_effort:
                    self.metrics.demotion(tenant.name, "admission")
                return admission
        if refusal is not None:
            error, reason = refusal
            self.runner.accounting.rejected(tenant.name, reason)
            error.extra = {**(error.extra or {}), "reason": reason}  # (the body says why: REJECT_REASONS)
            raise error
        return Admission(plan=question)

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
        active = self.runner.accounting.active
        if self.active_total >= lim.max_active_workflows:
            return Rejected(f"too many workflows in progress ({self.active_total})", 429, 2), "concurrency"
        if active.get(tenant.name, 0) >= tenant.max_concurrent_workflows:
            return Rejected(
                f"tenant {tenant.name!r} has {tenant.max_concurrent_workflows} workflows in progress (its maximum)",
                429,
                1,
            ), "concurrency"
        return None

    def shed_overdue(self) -> tuple[int, int]:
        """Check every admitted workflow with a queued call: one predicted to finish after its deadline is
        shed (tenant ``on_predicted_miss: reject``) or demoted to the lowest urgency (``best_effort``).
        A workflow whose calls are all in flight is never touched, except a best-effort one past
        ``admission.best_effort_max_age`` times its deadline, which is shed. Returns (shed, demoted) counts.
        """
        return self.runner.shed_overdue()

    # ------------------------------------------------------------------ workflows

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
        route: str,
        template: WorkflowTemplate | None = None,
        wf_id: str | None = None,
        on_call_done: Callable[[LiveOutcome], None] | None = None,
        admission: Admission | None = None,
    ) -> WorkflowOutcome[CallResult]:
        """Run a validated DAG to completion (or first failure). Admission must have passed (``admission``:
        its answer; best effort runs every call at the lowest urgency, its work is committed until submitted).

        Shed (its predicted completion passed its deadline while calls were queued, and its tenant rejects
        such work): raises ``Rejected`` (503, ``Retry-After``), counted ``shed``.

        Cancelling the awaiting task (client gone) abandons the workflow: queued calls leave their
        queues, in-flight ones are cancelled (their requests are aborted), no further call is
        submitted, and the workflow is counted ``cancelled`` (never met, not recorded for the tuner).
        """
        return await self.runner.run_workflow(
            tenant,
            deadline_s,
            nodes,
            requests,
            route=route,
            template=template,
            wf_id=wf_id,
            on_call_done=on_call_done,
            admission=admission,
        )

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
        """Start a workflow whose stages the caller decides as it goes (the Text-to-SQL pipeline).

        ``plan``: the question's prediction (its template sets the stage budgets; the overload re-check and
        shedding predict with it, at its floor). Admission must have passed (``admission``: its answer, as for
        ``run_workflow``). ``wf_id``: the id its client got (the status page's history shows it). Every workflow
        opened must be closed with ``close_workflow``. Once shed, every call of it fails with the shed error.
        """
        return self.runner.open_workflow(tenant, deadline_s, plan, route=route, admission=admission, wf_id=wf_id)

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
        return self.runner.close_workflow(wf, tenant, failed=failed, valid=valid, cancelled=cancelled)

    async def run_stage(
        self, wf: OnlineWorkflow, kind: str, calls: list[tuple[CallSpec, CallRequest]]
    ) -> list[LiveOutcome]:
        """Run one stage (calls in parallel) of an online workflow; returns each call's outcome.

        The stage is announced to the workflow first, so budgets follow its template. A cancelled caller
        takes its queued and in-flight calls back.
        """
        return await self.runner.run_stage(wf, kind, calls)

    # ------------------------------------------------------------------ status

    def predicted_s(self, plan: Sequence[StagePlan]) -> float:
        """Seconds a workflow of ``plan`` admitted now is predicted to take (as admission predicts it; -1 when
        no worker could run it): the status's load figure per database."""
        d = self.admitter.predictor(self.clock()).duration(plan)
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
        adm = self.admitter
        return {
            "policy": self.scheduler.policy.name,
            "alpha": self.scheduler.alpha,
            "ready": self.ready and not self.draining and self.leading and self.pool.healthy > 0,
            "draining": self.draining,
            "active_workflows": self.active_total,
            "active_by_tenant": {k: v for k, v in self.runner.accounting.active.items() if v},
            "parked_calls": len(self.pool.parked),
            "overload": {
                "committed_s": round(adm.committed_s, 6),
                "best_effort_workflows": len(adm.best_effort),
                "calibration": {"factor": round(adm.calibration.factor, 6), "samples": adm.calibration.samples},
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
