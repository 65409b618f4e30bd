"""The gateway service: ``Gateway`` owns the scheduler, the worker pool, the tenants store and the metrics,
and hands the work to admission (``gateway.core.admission.Admitter``), the workflow runner and the lifecycle
(docs/live-gateway.md, "Admission that keeps promises")."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway.config.gateway import LoadedConfig
from gateway.core.admission import Admission, AdmissionRefused, Admitter
from gateway.core.degrade import BurstRegime, QuestionPlan
from gateway.core.predict import StagePlan
from gateway.core.scheduler import Scheduler
from gateway.errors import GatewayError, Rejected
from gateway.live.discovery import KubeApi, KubernetesDiscovery
from gateway.live.idempotency import IdempotencyStore
from gateway.live.leader import LeaderElector, default_identity
from gateway.live.leader import lease_api as make_lease_api
from gateway.live.lifecycle import Lifecycle
from gateway.live.metrics import GatewayMetrics
from gateway.live.pool import Clock, WorkerPool
from gateway.live.refit import ProfileRefitTask
from gateway.live.responses import to_http
from gateway.live.runner import WorkflowRunner
from gateway.live.tenants import Tenant, TenantStore
from gateway.live.transport import Transport
from gateway.live.tuning import AlphaTuner, WindowRecorder
from gateway.profiling.refit import profile_status

__all__ = ["Gateway"]


class Gateway:
    """The live gateway's state and operations (one per process); ``transport`` is closed by ``stop``,
    ``background`` off (tests) starts no background task, the Kubernetes API clients default from the config."""

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
        self.cfg = cfg
        self.tenants = tenants
        self.transport = transport
        self.clock = clock
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
        self.discovery = self._make_discovery(loaded, kube_api)
        self.admitter = Admitter(
            self.scheduler,
            headroom=cfg.admission.headroom,
            sustainable_share=cfg.admission.sustainable_share,
            best_effort_max_age=cfg.admission.best_effort_max_age,
            regime=None if cfg.admission.burst_capacity is None else BurstRegime(cfg.admission.burst_capacity),
        )
        """Admission and the work it committed (``gateway.core.admission``)."""
        self._burst_counts = (0, 0)  # the burst regime's counts the metrics have seen
        self.recorder = WindowRecorder(cfg.tuning.window_workflows, cfg.tuning.max_age_s)
        self.admin_keys = frozenset(cfg.admin.api_key_sha256)
        """SHA-256 digests of the operators' keys (``admin.api_key_sha256``); empty: the status page is off."""
        self.tuner = AlphaTuner(self, cfg.tuning) if background and cfg.tuning.enabled else None
        self.refit = ProfileRefitTask(self, cfg.refit) if cfg.refit.enabled else None
        self.runner = WorkflowRunner(self)
        self.lifecycle = Lifecycle(self)
        # The runner's and the lifecycle's operations, as the gateway's own (their docstrings say what they do).
        self.run_workflow = self.runner.run_workflow
        self.open_workflow = self.runner.open_workflow
        self.close_workflow = self.runner.close_workflow
        self.run_stage = self.runner.run_stage
        self.shed_overdue = self.runner.shed_overdue
        self.outcome_window = self.runner.outcome_window
        """Outcomes per tenant over the status page's rolling window."""
        self.history = self.runner.history
        """The last finished workflows with their calls' timings (the status page's)."""
        self.start = self.lifecycle.start
        self.begin_drain = self.lifecycle.begin_drain
        self.drain = self.lifecycle.drain
        self.stop = self.lifecycle.stop
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
        return WorkerPool(
            self.scheduler, self.transport, self.metrics, self.cfg, clock=self.clock, background=background
        )

    def _make_discovery(self, loaded: LoadedConfig, kube_api: KubeApi | None) -> KubernetesDiscovery | None:
        cfg = self.cfg
        kube = cfg.discovery.kubernetes if cfg.discovery is not None else None
        if kube is None:
            return None
        return KubernetesDiscovery(
            kube,
            self.pool,
            loaded.catalog,
            time_scale=cfg.time_scale,
            default_model=loaded.default_model,
            metrics=self.metrics,
            api=kube_api,
        )

    @property
    def leading(self) -> bool:
        """True when this replica serves: leader election is off, or it holds the Lease."""
        return self.elector is None or self.elector.leading

    def unready_reason(self, *, leadership: bool = True) -> str | None:
        """Why this replica is not ready (``/readyz``'s reason), None when it is: ``starting``, ``shutting
        down``, ``not the leader`` (only with ``leadership``: the status page shows a follower as its own
        workers see it, ready or not) or ``no healthy worker``."""
        if not self.ready:
            return "starting"
        if self.draining:
            return "shutting down"
        if leadership and not self.leading:
            return "not the leader"
        return "no healthy worker" if self.pool.healthy == 0 else None

    @property
    def active_total(self) -> int:
        """Workflows in progress."""
        return self.runner.active_total

    def admit(
        self,
        tenant: Tenant,
        n_calls: int,
        plan: Sequence[StagePlan] | None = None,
        deadline_s: float | None = None,
        *,
        question: QuestionPlan | None = None,
    ) -> Admission:
        """Admit a new workflow of ``n_calls`` calls, or raise ``Rejected`` (counted by tenant and reason). ``plan``
        and ``deadline_s`` turn on the predicted-miss check (``question``: the Text-to-SQL prediction it came from);
        the answer owns the work it commits (``Admission.release``): pass it on or release it."""
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
                    self.metrics.for_tenant(self.metrics.demoted, tenant.name, "admission").inc()
                return admission
        if refusal is not None:
            error, reason = refusal
            self.runner.rejected(tenant.name, reason)
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
        active = self.runner.active
        if self.active_total >= lim.max_active_workflows:
            return Rejected(f"too many workflows in progress ({self.active_total})", 429, 2), "concurrency"
        if active.get(tenant.name, 0) >= tenant.max_concurrent_workflows:
            return Rejected(
                f"tenant {tenant.name!r} has {tenant.max_concurrent_workflows} workflows in progress (its maximum)",
                429,
                1,
            ), "concurrency"
        return None

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
        reg = self.admitter.regime
        if reg is not None:
            reg.settle(self.clock())
            m = self.metrics
            m.burst_active.set(1.0 if reg.in_burst else 0.0)
            m.burst_load.set(reg.load)
            bursts, capped = self._burst_counts
            m.bursts.inc(reg.bursts - bursts)
            m.burst_capped.inc(reg.capped - capped)
            self._burst_counts = (reg.bursts, reg.capped)

    def status(self) -> dict[str, Any]:
        """What ``/v1/status`` shows."""
        adm = self.admitter
        return {
            "policy": self.scheduler.policy.name,
            "alpha": self.scheduler.alpha,
            "ready": self.unready_reason() is None,
            "draining": self.draining,
            "active_workflows": self.active_total,
            "active_by_tenant": {k: v for k, v in self.runner.active.items() if v},
            "parked_calls": len(self.pool.parked),
            "overload": {
                "committed_s": round(adm.committed_s, 6),
                "best_effort_workflows": len(adm.best_effort),
                "calibration": {"factor": round(adm.calibration.factor, 6), "samples": adm.calibration.samples},
                "burst": None if adm.regime is None else adm.regime.status(self.clock()),
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
