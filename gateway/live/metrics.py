"""The gateway's Prometheus metrics (prefix ``hexflow_``), in a registry of its own; docs/metrics.md lists
every family.

Label values are bounded: ``tenant`` from the tenants file, ``worker`` from the config or discovery (a
removed worker's series are deleted), ``outcome`` and ``reason`` from fixed sets, client-given ``kind``
through ``BoundedLabel`` (the first ``MAX_KINDS`` values, then ``other``). The children a call touches are
resolved once and kept (``_WorkerSeries``, ``_TenantSeries``).

The families that ``tests/deploy/test_observability_config.py`` exercises:

| metric | type | labels | meaning |
|---|---|---|---|
| hexflow_workflow_latency_seconds | histogram | tenant | end-to-end latency of finished workflows |
| hexflow_workflows_total | counter | tenant, outcome | outcome: met, missed, rejected, failed, cancelled, shed |
| hexflow_admission_rejections_total | counter | tenant, reason | why admission refused (``REJECT_REASONS``) |
| hexflow_workflows_demoted_total | counter | tenant, when | run at the lowest urgency: admission, queued |
| hexflow_degraded_workflows_total | counter | tenant, step | Text-to-SQL answers with a knob turned down |
| hexflow_slo_attainment_ratio | gauge | tenant | share of the tenant's last 1000 finished workflows that met it |
| hexflow_stage_latency_seconds | histogram | kind | one call: ready -> result (queue wait + run) |
| hexflow_call_run_seconds | histogram | kind, worker | one call: sent -> result |
| hexflow_queue_wait_seconds | histogram | worker | ready -> sent, in the gateway's queue |
| hexflow_queue_depth | gauge | worker | calls waiting in the worker's gateway queue |
| hexflow_inflight | gauge | worker | calls sent to the worker and not returned |
| hexflow_dispatch_total | counter | worker, kind | dispatch decisions |
| hexflow_estimate_ratio | histogram | worker | observed / predicted call latency (1 = perfect) |
| hexflow_worker_up | gauge | worker | 1 when the worker takes calls |
| hexflow_worker_draining | gauge | worker | 1 while discovery drains the worker (pod unready, terminating or deleted) |
| hexflow_call_failures_total | counter | worker, reason | worker_error, rejected |
| hexflow_call_retries_total | counter | worker | calls re-dispatched after their worker failed them |
| hexflow_worker_ejections_total | counter | worker | outlier ejections (and failed probe calls that kept one out) |
| hexflow_worker_priority_scheduling | gauge | worker | 1 while calls carry vLLM's priority; 0 once it refused it |
| hexflow_scrape_failures_total | counter | worker | failed scrapes of a worker's /metrics |
| hexflow_worker_vllm_waiting | gauge | worker | the worker's scraped vllm:num_requests_waiting |
| hexflow_worker_vllm_running | gauge | worker | the worker's scraped vllm:num_requests_running |
| hexflow_worker_kv_cache_usage_ratio | gauge | worker | the worker's scraped vllm:kv_cache_usage_perc (0-1) |
| hexflow_alpha | gauge | | the WB balance parameter in use |
| hexflow_tuning_runs_total | counter | result | applied, kept, skipped, failed |
| hexflow_tenant_reloads_total | counter | result | ok, failed |
| hexflow_parked_calls | gauge | | calls waiting for any healthy worker |
| hexflow_active_workflows | gauge | | workflows in progress |
| hexflow_discovery_pods | gauge | state | selected pods by state: ready, unready, pending (no IP yet), invalid |
| hexflow_discovery_errors_total | counter | | failed lists or watches of the Kubernetes API |
| hexflow_workflow_outcomes_total | counter | tenant, outcome | ``history.GOODPUT_OUTCOMES``: met, late, ... |
| hexflow_goodput_workflows_total | counter | tenant | met their deadline with a valid answer (rate: goodput) |
| hexflow_leader | gauge | | 1 while this replica serves (holds the Lease; always 1 without leader election) |
| hexflow_leader_changes_total | counter | event | acquired, lost: this replica became or stopped being the leader |
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from gateway.live.history import GOODPUT_OUTCOMES
from gateway.profiling.promparse import WorkerMetrics

MAX_KINDS = 32
DEGRADED_STEPS = ("candidates", "revisions", "evaluation")
"""The knobs a degraded Text-to-SQL question can have turned down (``gateway.text2sql.run``'s)."""
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200, 3600)
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 900)
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 5, 10)
OUTCOMES = ("met", "missed", "rejected", "failed", "cancelled", "shed")
"""How a workflow can end. ``cancelled``: abandoned before it finished because its client went away (or
the gateway's shutdown grace ran out); ``shed``: admitted, then dropped because its queued calls could no
longer make its deadline (its tenant rejects rather than runs late). Neither is met nor missed, and neither
is in the SLO attainment."""
REJECT_REASONS = ("draining", "not_leader", "no_worker", "queue_full", "concurrency", "deadline")
"""Why admission refused a workflow (``hexflow_admission_rejections_total``): shutting down, this replica
is not the leader (high availability), no healthy worker, the gateway's queues full, a concurrency bound
(the gateway's or the tenant's), or its predicted completion misses its deadline."""
DEMOTED_WHEN = ("admission", "queued")
"""When a workflow of a best-effort tenant was demoted to the lowest urgency."""
CALL_FAILURE_REASONS = ("worker_error", "rejected")
"""Why a call failed on a worker (``hexflow_call_failures_total``): the worker failed it (connection,
timeout, 5xx), or refused it (its 4xx)."""
TUNING_RESULTS = ("applied", "kept", "skipped", "failed")
"""How a background alpha tuning run ended (``hexflow_tuning_runs_total``)."""
RELOAD_RESULTS = ("ok", "failed")
"""How a reload of the tenants file ended (``hexflow_tenant_reloads_total``)."""


class BoundedLabel:
    """Admits the first ``limit`` distinct values of a label; later ones become ``other``."""

    def __init__(self, limit: int = MAX_KINDS) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        """The label value to use."""
        if value in self._seen:
            return value
        if len(self._seen) < self.limit:
            self._seen.add(value)
            return value
        return "other"


_MetricT = TypeVar("_MetricT", Counter, Gauge, Histogram)

ATTAINMENT_WINDOW = 1000
"""Finished (met or missed) workflows per tenant that ``hexflow_slo_attainment_ratio`` is the share of."""


class _Attainment:
    """A tenant's last ``ATTAINMENT_WINDOW`` met/missed outcomes with a running count of the met ones, so
    the attainment is O(1) per workflow (not a sum over the window)."""

    __slots__ = ("met", "window")

    def __init__(self) -> None:
        self.window: deque[bool] = deque(maxlen=ATTAINMENT_WINDOW)
        self.met = 0

    def add(self, met: bool) -> float:
        """Record one outcome; returns the share of the window that met its deadline."""
        window = self.window
        if len(window) == ATTAINMENT_WINDOW:
            self.met -= window[0]  # about to fall out of the window
        window.append(met)
        self.met += met
        return self.met / len(window)


class _WorkerSeries:
    """One worker's labelled children, each resolved by ``labels()`` once, on first use, and forgotten with the
    worker: ``labels()`` validates and locks on every call, and a call touches about eight children."""

    __slots__ = ("call_run", "dispatch", "estimate_ratio", "other", "queue_wait")

    def __init__(self) -> None:
        self.queue_wait: Histogram | None = None
        self.estimate_ratio: Histogram | None = None
        self.dispatch: dict[str, Counter] = {}  # by kind label (bounded: ``BoundedLabel``)
        self.call_run: dict[str, Histogram] = {}  # by kind label
        self.other: dict[tuple[Any, ...], Any] = {}  # (metric, other label values): the rarer ones


class _TenantSeries:
    """One tenant's labelled children (as ``_WorkerSeries``)."""

    __slots__ = ("demoted", "goodput", "goodput_outcomes", "latency", "outcomes", "rejections", "slo")

    def __init__(self) -> None:
        self.outcomes: dict[str, Counter] = {}
        self.rejections: dict[str, Counter] = {}
        self.demoted: dict[str, Counter] = {}
        self.latency: Histogram | None = None
        self.slo: Gauge | None = None
        self.goodput_outcomes: dict[str, Counter] = {}
        self.goodput: Counter | None = None


class GatewayMetrics:
    """Every metric the gateway exports, with small methods the pool and the app call."""

    def __init__(self, workers: list[str], tenants: list[str]) -> None:
        # No ``*_created`` series (a timestamp per labelled child, twice the series for nothing a dashboard
        # reads). prometheus_client's switch is process-wide; it is set here, where every gateway registry
        # is built (tests' too), before the first metric.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        r = self.registry = CollectorRegistry()
        # The process's CPU, memory, file descriptors and the interpreter's GC, as a default registry has.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.kind = BoundedLabel()
        self._tenant_series_metrics()
        self._call_series_metrics()
        self._worker_series_metrics()
        self._service_metrics()
        for event in ("acquired", "lost"):
            self.leader_changes.labels(event=event)
        # The labelled children the hot path uses, resolved by ``labels()`` once each (see ``_WorkerSeries``).
        self._workers: dict[str, _WorkerSeries] = {}
        self._tenants: dict[str, _TenantSeries] = {}
        self._stage: dict[str, Histogram] = {}  # by kind label (at most MAX_KINDS + 1)
        self._recent: dict[str, _Attainment] = {}
        for result in TUNING_RESULTS:  # every result- and reason-labelled counter starts at 0 (rate() sees a 1st)
            self.tuning_runs.labels(result=result)
        for result in RELOAD_RESULTS:
            self.tenant_reloads.labels(result=result)
        for w in workers:
            self._worker_series_at_zero(w)
            self.up.labels(worker=w).set(1)
        for t in tenants:
            self.add_tenant(t)

    def _counter(self, name: str, doc: str, *labels: str) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str, *labels: str) -> Gauge:
        return Gauge(name, doc, labels, registry=self.registry)

    def _histogram(self, name: str, doc: str, *labels: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    def _tenant_series_metrics(self) -> None:
        """Per tenant: workflows, their outcomes and latency."""
        self.workflow_latency = self._histogram(
            "hexflow_workflow_latency_seconds",
            "End-to-end latency of finished workflows.",
            "tenant",
            buckets=LATENCY_BUCKETS,
        )
        self.workflows = self._counter(
            "hexflow_workflows",
            "Workflows by outcome (met, missed, rejected, failed, cancelled, shed).",
            "tenant",
            "outcome",
        )
        self.rejections = self._counter(
            "hexflow_admission_rejections",
            "Workflows refused at admission, by reason "
            "(draining, not_leader, no_worker, queue_full, concurrency, deadline).",
            "tenant",
            "reason",
        )
        self.demoted = self._counter(
            "hexflow_workflows_demoted",
            "Workflows predicted to miss their deadline run at the lowest urgency (when: admission, queued).",
            "tenant",
            "when",
        )
        self.degraded_workflows = self._counter(
            "hexflow_degraded_workflows",
            "Text-to-SQL questions answered with a knob turned down to meet the deadline, per knob "
            "(step: candidates, revisions, evaluation).",
            "tenant",
            "step",
        )
        self.slo = self._gauge(
            "hexflow_slo_attainment_ratio",
            "Share of the tenant's last 1000 finished workflows that met their deadline.",
            "tenant",
        )
        self.workflow_outcomes = self._counter(
            "hexflow_workflow_outcomes",
            "Workflows by goodput outcome (met, late, no_valid_answer, failed, rejected, cancelled).",
            "tenant",
            "outcome",
        )
        self.goodput = self._counter(
            "hexflow_goodput_workflows",
            "Workflows that met their deadline with a valid answer (goodput is its rate).",
            "tenant",
        )

    def _call_series_metrics(self) -> None:
        """Per call: its stage, queue wait and run, by kind and worker."""
        self.stage_latency = self._histogram(
            "hexflow_stage_latency_seconds",
            "One LLM call from ready to result (gateway queue wait + run).",
            "kind",
            buckets=CALL_BUCKETS,
        )
        self.call_run = self._histogram(
            "hexflow_call_run_seconds",
            "One LLM call from sent to result, per worker.",
            "kind",
            "worker",
            buckets=CALL_BUCKETS,
        )
        self.queue_wait_h = self._histogram(
            "hexflow_queue_wait_seconds",
            "Time a call waited in the worker's gateway queue.",
            "worker",
            buckets=CALL_BUCKETS,
        )
        self.queue_depth = self._gauge("hexflow_queue_depth", "Calls waiting in the worker's gateway queue.", "worker")
        self.inflight = self._gauge("hexflow_inflight", "Calls sent to the worker and not returned.", "worker")
        self.dispatches = self._counter("hexflow_dispatch", "Dispatch decisions.", "worker", "kind")
        self.estimate_ratio = self._histogram(
            "hexflow_estimate_ratio",
            "Observed over predicted call latency (1 = perfect estimate).",
            "worker",
            buckets=RATIO_BUCKETS,
        )

    def _worker_series_metrics(self) -> None:
        """Per worker: health, failures, scraped engine state, its profile."""
        self.up = self._gauge("hexflow_worker_up", "1 when the worker takes calls.", "worker")
        self.draining = self._gauge(
            "hexflow_worker_draining",
            "1 while discovery drains the worker (pod unready, terminating or deleted).",
            "worker",
        )
        self.failures = self._counter("hexflow_call_failures", "Failed calls.", "worker", "reason")
        self.retries = self._counter(
            "hexflow_call_retries", "Calls re-dispatched after a worker failed them.", "worker"
        )
        self.ejections = self._counter(
            "hexflow_worker_ejections", "Outlier ejections of a worker (and failed re-admission probes).", "worker"
        )
        self.priority = self._gauge(
            "hexflow_worker_priority_scheduling",
            "1 while calls to the worker carry vLLM's priority field; 0 once it refused the field "
            "(started without --scheduling-policy priority).",
            "worker",
        )
        self.scrape_failures = self._counter(
            "hexflow_scrape_failures", "Failed scrapes of a worker's /metrics.", "worker"
        )
        self.vllm_waiting = self._gauge(
            "hexflow_worker_vllm_waiting", "The worker's scraped vllm:num_requests_waiting.", "worker"
        )
        self.vllm_running = self._gauge(
            "hexflow_worker_vllm_running", "The worker's scraped vllm:num_requests_running.", "worker"
        )
        self.kv_usage = self._gauge(
            "hexflow_worker_kv_cache_usage_ratio", "The worker's scraped vllm:kv_cache_usage_perc (0-1).", "worker"
        )
        self.profile_refits = self._counter(
            "hexflow_profile_refits", "Online refits of a worker's profile constants.", "worker", "result"
        )
        self.profile_constant = self._gauge(
            "hexflow_profile_constant", "A time constant of the worker's profile in use, seconds.", "worker", "constant"
        )

    def _service_metrics(self) -> None:
        """The gateway as a whole: alpha, tuning, tenants, discovery, leadership."""
        self.alpha = self._gauge("hexflow_alpha", "The WB balance parameter in use.")
        self.tuning_runs = self._counter("hexflow_tuning_runs", "Background alpha tuning runs.", "result")
        self.tenant_reloads = self._counter("hexflow_tenant_reloads", "Reloads of the tenants file.", "result")
        self.parked = self._gauge("hexflow_parked_calls", "Calls waiting for any healthy worker.")
        self.active = self._gauge("hexflow_active_workflows", "Workflows in progress.")
        self.discovery_pods = self._gauge(
            "hexflow_discovery_pods", "Selected worker pods by state (ready, unready, pending, invalid).", "state"
        )
        self.discovery_errors = self._counter(
            "hexflow_discovery_errors", "Failed lists or watches of the Kubernetes API."
        )
        self.leader = self._gauge(
            "hexflow_leader", "1 while this replica serves (holds the Lease, or no leader election)."
        )
        self.leader_changes = self._counter(
            "hexflow_leader_changes", "This replica became (acquired) or stopped being (lost) the leader.", "event"
        )

    def _worker_metrics(self) -> list[Counter | Gauge | Histogram]:
        return [
            self.call_run, self.queue_wait_h, self.queue_depth, self.inflight, self.dispatches, self.estimate_ratio,
            self.up, self.draining, self.failures, self.retries, self.scrape_failures, self.vllm_waiting,
            self.vllm_running, self.kv_usage, self.ejections, self.profile_refits, self.profile_constant,
            self.priority,
        ]  # fmt: skip

    # ---------------------------------------------------------------------------------------------- membership

    def add_worker(self, worker: str) -> None:
        """Create a new worker's series (discovery; it starts down until it takes calls)."""
        self._worker_series_at_zero(worker)
        self.up.labels(worker=worker).set(0)

    def _worker_series_at_zero(self, worker: str) -> None:
        """A worker's gauges and counters at 0, each failure reason included."""
        self.draining.labels(worker=worker).set(0)
        self.queue_depth.labels(worker=worker)
        self.inflight.labels(worker=worker)
        for reason in CALL_FAILURE_REASONS:
            self.failures.labels(worker=worker, reason=reason)
        self.retries.labels(worker=worker)
        self.ejections.labels(worker=worker)
        self.priority.labels(worker=worker).set(1)
        self.scrape_failures.labels(worker=worker)

    def remove_worker(self, worker: str) -> None:
        """Delete every series of a worker that left the pool (and the children cached for it)."""
        self._workers.pop(worker, None)
        for m in self._worker_metrics():
            m.remove_by_labels({"worker": worker})

    def add_tenant(self, tenant: str) -> None:
        """Create a tenant's series at zero (so dashboards show it before its first workflow)."""
        for o in OUTCOMES:
            self.workflows.labels(tenant=tenant, outcome=o)
        for reason in REJECT_REASONS:
            self.rejections.labels(tenant=tenant, reason=reason)
        for when in DEMOTED_WHEN:
            self.demoted.labels(tenant=tenant, when=when)
        for step in DEGRADED_STEPS:
            self.degraded_workflows.labels(tenant=tenant, step=step)
        self._recent.setdefault(tenant, _Attainment())
        for o in GOODPUT_OUTCOMES:
            self.workflow_outcomes.labels(tenant=tenant, outcome=o)
        self.goodput.labels(tenant=tenant)

    def set_tenants(self, tenants: Iterable[str]) -> None:
        """The tenants in force after a reload: each one's series are created (``add_tenant``), and the children
        cached for tenants no longer configured are dropped (their series stay, so totals never go back)."""
        names = set(tenants)
        for t in names:
            self.add_tenant(t)
        for t in [t for t in self._tenants if t not in names]:
            del self._tenants[t]

    def _worker(self, worker: str) -> _WorkerSeries:
        s = self._workers.get(worker)
        if s is None:
            s = self._workers[worker] = _WorkerSeries()
        return s

    def _tenant(self, tenant: str) -> _TenantSeries:
        s = self._tenants.get(tenant)
        if s is None:
            s = self._tenants[tenant] = _TenantSeries()
        return s

    def degraded(self, tenant: str, step: str) -> None:
        """A question of ``tenant`` ran with knob ``step`` (``DEGRADED_STEPS``) turned down."""
        if step in DEGRADED_STEPS:
            self.degraded_workflows.labels(tenant=tenant, step=step).inc()

    # ---------------------------------------------------------------------------------------------- per call

    def dispatch(self, worker: str, kind: str) -> None:
        """One dispatch decision."""
        k = self.kind(kind)
        by_kind = self._worker(worker).dispatch
        c = by_kind.get(k)
        if c is None:
            c = by_kind[k] = self.dispatches.labels(worker=worker, kind=k)
        c.inc()

    def queue_wait(self, worker: str, seconds: float) -> None:
        """A call left the worker's gateway queue."""
        s = self._worker(worker)
        h = s.queue_wait
        if h is None:
            h = s.queue_wait = self.queue_wait_h.labels(worker=worker)
        h.observe(max(seconds, 0.0))

    def call_done(self, worker: str, kind: str, total_s: float, run_s: float, predicted_s: float) -> None:
        """A call returned."""
        k = self.kind(kind)
        stage = self._stage.get(k)
        if stage is None:
            stage = self._stage[k] = self.stage_latency.labels(kind=k)
        stage.observe(max(total_s, 0.0))
        s = self._worker(worker)
        run = s.call_run.get(k)
        if run is None:
            run = s.call_run[k] = self.call_run.labels(kind=k, worker=worker)
        run.observe(max(run_s, 0.0))
        if predicted_s > 0:
            ratio = s.estimate_ratio
            if ratio is None:
                ratio = s.estimate_ratio = self.estimate_ratio.labels(worker=worker)
            ratio.observe(run_s / predicted_s)

    def workflow_done(self, tenant: str, latency_s: float | None, outcome: str) -> None:
        """A workflow ended with ``outcome`` (one of ``OUTCOMES``); only met and missed count towards attainment."""
        s = self._tenant(tenant)
        c = s.outcomes.get(outcome)
        if c is None:
            c = s.outcomes[outcome] = self.workflows.labels(tenant=tenant, outcome=outcome)
        c.inc()
        if latency_s is not None:
            h = s.latency
            if h is None:
                h = s.latency = self.workflow_latency.labels(tenant=tenant)
            h.observe(latency_s)
        if outcome in ("met", "missed"):
            recent = self._recent.get(tenant)
            if recent is None:
                recent = self._recent[tenant] = _Attainment()
            g = s.slo
            if g is None:
                g = s.slo = self.slo.labels(tenant=tenant)
            g.set(recent.add(outcome == "met"))

    def workflow_outcome(self, tenant: str, outcome: str) -> None:
        """A workflow ended with goodput ``outcome`` (one of ``history.GOODPUT_OUTCOMES``); ``met`` is goodput."""
        s = self._tenant(tenant)
        c = s.goodput_outcomes.get(outcome)
        if c is None:
            c = s.goodput_outcomes[outcome] = self.workflow_outcomes.labels(tenant=tenant, outcome=outcome)
        c.inc()
        if outcome == "met":
            g = s.goodput
            if g is None:
                g = s.goodput = self.goodput.labels(tenant=tenant)
            g.inc()

    def rejection(self, tenant: str, reason: str) -> None:
        """A workflow of ``tenant`` refused at admission, and why (one of ``REJECT_REASONS``)."""
        by_reason = self._tenant(tenant).rejections
        c = by_reason.get(reason)
        if c is None:
            c = by_reason[reason] = self.rejections.labels(tenant=tenant, reason=reason)
        c.inc()

    def demotion(self, tenant: str, when: str) -> None:
        """A workflow of ``tenant`` demoted to the lowest urgency (``when``: one of ``DEMOTED_WHEN``)."""
        by_when = self._tenant(tenant).demoted
        c = by_when.get(when)
        if c is None:
            c = by_when[when] = self.demoted.labels(tenant=tenant, when=when)
        c.inc()

    # ---------------------------------------------------------------------------------------------- per event

    def _worker_child(self, metric: _MetricT, worker: str, **labels: str) -> _MetricT:
        """``metric.labels(worker=worker, **labels)``, cached in the worker's series."""
        key = (metric, *labels.values())  # metrics hash by identity
        cache = self._worker(worker).other
        c = cache.get(key)
        if c is None:
            c = cache[key] = metric.labels(worker=worker, **labels)
        return c

    def call_failure(self, worker: str, reason: str) -> None:
        """A call failed on a worker."""
        self._worker_child(self.failures, worker, reason=reason).inc()

    def retry(self, worker: str) -> None:
        """A call failed by ``worker`` is re-dispatched."""
        self._worker_child(self.retries, worker).inc()

    def ejection(self, worker: str) -> None:
        """A worker was ejected as an outlier, or stays ejected after a failed probe call."""
        self._worker_child(self.ejections, worker).inc()

    def priority_scheduling(self, worker: str, on: bool) -> None:
        """Calls to ``worker`` carry vLLM's priority field (``on``) or no longer do (it refused the field)."""
        self._worker_child(self.priority, worker).set(1 if on else 0)

    def worker_up(self, worker: str, up: bool) -> None:
        """A worker went up or down."""
        self._worker_child(self.up, worker).set(1 if up else 0)

    def worker_draining(self, worker: str, draining: bool) -> None:
        """Discovery started or stopped draining a worker."""
        self._worker_child(self.draining, worker).set(1 if draining else 0)

    def worker_gauges(self, worker: str, queued: int, inflight: int) -> None:
        """A worker's point-in-time queue depth and calls in flight (before a scrape of ``/metrics``)."""
        self._worker_child(self.queue_depth, worker).set(queued)
        self._worker_child(self.inflight, worker).set(inflight)

    def profile_refit(self, worker: str, result: str) -> None:
        """Count one refit attempt of a worker's profile (``applied``, ``kept``, ``rejected``, ``skipped``,
        ``failed``)."""
        self.profile_refits.labels(worker=worker, result=result).inc()

    def profile_constants(self, worker: str, constants: dict[str, float]) -> None:
        """The worker's profile constants in use (``constant`` label: the ``PerfProfile`` field)."""
        for name, value in constants.items():
            self.profile_constant.labels(worker=worker, constant=name).set(value)

    def scrape_failure(self, worker: str) -> None:
        """A scrape of the worker's /metrics failed."""
        self._worker_child(self.scrape_failures, worker).inc()

    def scraped(self, worker: str, m: WorkerMetrics) -> None:
        """Export the vLLM gauges of a fresh scrape."""
        if m.waiting is not None:
            self._worker_child(self.vllm_waiting, worker).set(m.waiting)
        if m.running is not None:
            self._worker_child(self.vllm_running, worker).set(m.running)
        if m.kv_cache_usage is not None:
            self._worker_child(self.kv_usage, worker).set(m.kv_cache_usage)

    def render(self, refresh: Callable[[], None] | None = None) -> bytes:
        """The exposition text (``refresh`` updates point-in-time gauges first)."""
        if refresh is not None:
            refresh()
        return generate_latest(self.registry)
