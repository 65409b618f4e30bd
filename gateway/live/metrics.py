"""The gateway's Prometheus metrics (prefix ``hexflow_``), in a registry of its own; docs/metrics.md lists
every family.

Label values are bounded: ``tenant`` from the tenants file, ``worker`` from the config or discovery (a
removed worker's series are deleted), ``outcome`` and ``reason`` from fixed sets, client-given ``kind``
through ``BoundedLabel`` (the first ``MAX_KINDS`` values, then ``other``). The children a call touches are
resolved by ``labels()`` once and cached per worker and per tenant."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

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
from gateway.text2sql.port import DEGRADED_STEPS

MAX_KINDS = 32
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200, 3600)
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 900)
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 5, 10)
OUTCOMES = ("met", "missed", "rejected", "failed", "cancelled", "shed")
"""How a workflow can end (``cancelled``: its client went away; ``shed``: dropped after admission); only
met and missed count towards the SLO attainment."""
REJECT_REASONS = ("draining", "not_leader", "no_worker", "queue_full", "concurrency", "deadline")
"""Why admission refused a workflow (``hexflow_admission_rejections_total``)."""
DEMOTED_WHEN = ("admission", "queued")
"""When a workflow of a best-effort tenant was demoted to the lowest urgency."""
CALL_FAILURE_REASONS = ("worker_error", "rejected")
"""Why a call failed on a worker: it failed it (connection, timeout, 5xx), or refused it (its 4xx)."""
TUNING_RESULTS = ("applied", "kept", "skipped", "failed")
"""How a background alpha tuning run ended (``hexflow_tuning_runs_total``)."""
RELOAD_RESULTS = ("ok", "failed")
"""How a reload of the tenants file ended (``hexflow_tenant_reloads_total``)."""
ATTAINMENT_WINDOW = 1000
"""Finished (met or missed) workflows per tenant that ``hexflow_slo_attainment_ratio`` is the share of."""


_MetricT = TypeVar("_MetricT", Counter, Gauge, Histogram)


@dataclass(frozen=True, slots=True)
class _Family:
    kind: type[Any]
    name: str
    labels: str
    doc: str
    buckets: tuple[float, ...] = ()


def _family(kind: type[_MetricT], name: str, labels: str, doc: str, buckets: tuple[float, ...] = ()) -> _MetricT:
    """A metric family declared on ``GatewayMetrics`` (each instance gets the metric under the same attribute;
    ``labels``: its label names, space-separated)."""
    return cast(_MetricT, _Family(kind, name, labels, doc, buckets))


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


class _Attainment:
    """A tenant's last ``ATTAINMENT_WINDOW`` met/missed outcomes with a running count of the met ones (O(1)
    per workflow)."""

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


_Children = dict[tuple[Any, str], Any]
"""Labelled children by (metric, other label value): ``labels()`` validates and locks on every call."""


class GatewayMetrics:
    """Every metric the gateway exports (its ``_family`` attributes): a worker's or a tenant's series through
    ``for_worker``/``for_tenant``, and the few records that touch several series."""

    # fmt: off
    workflow_latency = _family(Histogram, "hexflow_workflow_latency_seconds", "tenant",
        "End-to-end latency of finished workflows.", LATENCY_BUCKETS)
    workflows = _family(Counter, "hexflow_workflows", "tenant outcome",
        "Workflows by outcome (met, missed, rejected, failed, cancelled, shed).")
    rejections = _family(Counter, "hexflow_admission_rejections", "tenant reason",
        "Workflows refused at admission, by reason (draining, not_leader, no_worker, queue_full, concurrency, "
        "deadline).")
    demoted = _family(Counter, "hexflow_workflows_demoted", "tenant when",
        "Workflows predicted to miss their deadline run at the lowest urgency (when: admission, queued).")
    degraded_workflows = _family(Counter, "hexflow_degraded_workflows", "tenant step",
        "Text-to-SQL questions answered with a knob turned down to meet the deadline, per knob "
        "(step: candidates, revisions, evaluation).")
    slo = _family(Gauge, "hexflow_slo_attainment_ratio", "tenant",
        "Share of the tenant's last 1000 finished workflows that met their deadline.")
    workflow_outcomes = _family(Counter, "hexflow_workflow_outcomes", "tenant outcome",
        "Workflows by goodput outcome (met, late, no_valid_answer, failed, rejected, cancelled).")
    goodput = _family(Counter, "hexflow_goodput_workflows", "tenant",
        "Workflows that met their deadline with a valid answer (goodput is its rate).")
    stage_latency = _family(Histogram, "hexflow_stage_latency_seconds", "kind",
        "One LLM call from ready to result (gateway queue wait + run).", CALL_BUCKETS)
    call_run = _family(Histogram, "hexflow_call_run_seconds", "kind worker",
        "One LLM call from sent to result, per worker.", CALL_BUCKETS)
    queue_wait_h = _family(Histogram, "hexflow_queue_wait_seconds", "worker",
        "Time a call waited in the worker's gateway queue.", CALL_BUCKETS)
    queue_depth = _family(Gauge, "hexflow_queue_depth", "worker", "Calls waiting in the worker's gateway queue.")
    inflight = _family(Gauge, "hexflow_inflight", "worker", "Calls sent to the worker and not returned.")
    dispatches = _family(Counter, "hexflow_dispatch", "worker kind", "Dispatch decisions.")
    estimate_ratio = _family(Histogram, "hexflow_estimate_ratio", "worker",
        "Observed over predicted call latency (1 = perfect estimate).", RATIO_BUCKETS)
    up = _family(Gauge, "hexflow_worker_up", "worker", "1 when the worker takes calls.")
    draining = _family(Gauge, "hexflow_worker_draining", "worker",
        "1 while discovery drains the worker (pod unready, terminating or deleted).")
    failures = _family(Counter, "hexflow_call_failures", "worker reason", "Failed calls.")
    retries = _family(Counter, "hexflow_call_retries", "worker", "Calls re-dispatched after a worker failed them.")
    ejections = _family(Counter, "hexflow_worker_ejections", "worker",
        "Outlier ejections of a worker (and failed re-admission probes).")
    priority = _family(Gauge, "hexflow_worker_priority_scheduling", "worker",
        "1 while calls to the worker carry vLLM's priority field; 0 once it refused the field "
        "(started without --scheduling-policy priority).")
    scrape_failures = _family(Counter, "hexflow_scrape_failures", "worker", "Failed scrapes of a worker's /metrics.")
    vllm_waiting = _family(Gauge, "hexflow_worker_vllm_waiting", "worker",
        "The worker's scraped vllm:num_requests_waiting.")
    vllm_running = _family(Gauge, "hexflow_worker_vllm_running", "worker",
        "The worker's scraped vllm:num_requests_running.")
    kv_usage = _family(Gauge, "hexflow_worker_kv_cache_usage_ratio", "worker",
        "The worker's scraped vllm:kv_cache_usage_perc (0-1).")
    profile_refits = _family(Counter, "hexflow_profile_refits", "worker result",
        "Online refits of a worker's profile constants.")
    profile_constant = _family(Gauge, "hexflow_profile_constant", "worker constant",
        "A time constant of the worker's profile in use, seconds.")
    alpha = _family(Gauge, "hexflow_alpha", "", "The WB balance parameter in use.")
    tuning_runs = _family(Counter, "hexflow_tuning_runs", "result", "Background alpha tuning runs.")
    tenant_reloads = _family(Counter, "hexflow_tenant_reloads", "result", "Reloads of the tenants file.")
    parked = _family(Gauge, "hexflow_parked_calls", "", "Calls waiting for any healthy worker.")
    burst_active = _family(Gauge, "hexflow_burst_active", "",
        "1 while the gateway is in a burst regime (docs/text2sql.md, 'Bursts').")
    burst_load = _family(Gauge, "hexflow_burst_load_ratio", "",
        "Full-quality work arriving per second over admission.burst_capacity, at the last arrival.")
    bursts = _family(Counter, "hexflow_bursts", "", "Burst regimes entered.")
    burst_capped = _family(Counter, "hexflow_burst_capped_questions", "",
        "Questions whose setting a burst capped below full quality at arrival.")
    active = _family(Gauge, "hexflow_active_workflows", "", "Workflows in progress.")
    discovery_pods = _family(Gauge, "hexflow_discovery_pods", "state",
        "Selected worker pods by state (ready, unready, pending, invalid).")
    discovery_errors = _family(Counter, "hexflow_discovery_errors", "",
        "Failed lists or watches of the Kubernetes API.")
    leader = _family(Gauge, "hexflow_leader", "",
        "1 while this replica serves (holds the Lease, or no leader election).")
    leader_changes = _family(Counter, "hexflow_leader_changes", "event",
        "This replica became (acquired) or stopped being (lost) the leader.")
    # fmt: on

    def __init__(self, workers: list[str], tenants: list[str]) -> None:
        # No ``*_created`` series (twice the series for nothing a dashboard reads); the switch is process-wide,
        # set here, where every gateway registry is built, before the first metric.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        r = self.registry = CollectorRegistry()
        # The process's CPU, memory, file descriptors and the interpreter's GC, as a default registry has.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        # A worker's or tenant's family -> (that label, its other label or ""): what ``for_worker`` and
        # ``for_tenant`` fill in.
        self._labels: dict[Any, tuple[str, str]] = {}
        for attr, f in vars(GatewayMetrics).items():
            if isinstance(f, _Family):
                extra = {"buckets": f.buckets} if f.buckets else {}
                labels = f.labels.split()
                metric = f.kind(f.name, f.doc, labels, registry=r, **extra)
                setattr(self, attr, metric)
                for by in {"worker", "tenant"} & set(labels):
                    self._labels[metric] = (by, "".join(x for x in labels if x != by))
        self.kind = BoundedLabel()
        self._workers: dict[str, _Children] = {}
        self._tenants: dict[str, _Children] = {}
        self._stage: dict[str, Histogram] = {}  # by kind label (at most MAX_KINDS + 1)
        self._recent: dict[str, _Attainment] = {}
        # Every result-, reason- and event-labelled counter starts at 0 (rate() sees the first event).
        for event in ("acquired", "lost"):
            self.leader_changes.labels(event=event)
        for result in TUNING_RESULTS:
            self.tuning_runs.labels(result=result)
        for result in RELOAD_RESULTS:
            self.tenant_reloads.labels(result=result)
        for w in workers:
            self.add_worker(w, up=True)
        for t in tenants:
            self.add_tenant(t)

    def add_worker(self, worker: str, *, up: bool = False) -> None:
        """Create a worker's series (``up``: a configured worker's; discovery's start down until they take calls)."""
        self.draining.labels(worker=worker).set(0)
        self.priority.labels(worker=worker).set(1)
        for metric in (self.queue_depth, self.inflight, self.retries, self.ejections, self.scrape_failures):
            metric.labels(worker=worker)
        for reason in CALL_FAILURE_REASONS:
            self.failures.labels(worker=worker, reason=reason)
        self.up.labels(worker=worker).set(1 if up else 0)

    def remove_worker(self, worker: str) -> None:
        """Delete every series of a worker that left the pool (and the children cached for it)."""
        self._workers.pop(worker, None)
        for m, (by, _) in self._labels.items():
            if by == "worker":
                m.remove_by_labels({"worker": worker})

    def add_tenant(self, tenant: str) -> None:
        """Create a tenant's series at zero (so dashboards show it before its first workflow)."""
        for metric, label, values in (
            (self.workflows, "outcome", OUTCOMES),
            (self.rejections, "reason", REJECT_REASONS),
            (self.demoted, "when", DEMOTED_WHEN),
            (self.degraded_workflows, "step", DEGRADED_STEPS),
            (self.workflow_outcomes, "outcome", GOODPUT_OUTCOMES),
        ):
            for value in values:
                metric.labels(tenant=tenant, **{label: value})
        self._recent.setdefault(tenant, _Attainment())
        self.goodput.labels(tenant=tenant)

    def set_tenants(self, tenants: Iterable[str]) -> None:
        """The tenants in force after a reload: each one's series are created (``add_tenant``), and the children
        cached for tenants no longer configured are dropped (their series stay, so totals never go back)."""
        names = set(tenants)
        for t in names:
            self.add_tenant(t)
        for t in [t for t in self._tenants if t not in names]:
            del self._tenants[t]

    def _child(self, owners: dict[str, _Children], metric: _MetricT, owner: str, value: str) -> _MetricT:
        cache = owners.get(owner)
        if cache is None:
            cache = owners[owner] = {}
        key = (metric, value)  # metrics hash by identity
        c = cache.get(key)
        if c is None:
            by, label = self._labels[metric]
            c = cache[key] = metric.labels(**({by: owner, label: value} if label else {by: owner}))
        return c

    def for_worker(self, metric: _MetricT, worker: str, value: str = "") -> _MetricT:
        """``metric``'s series of ``worker`` (``value``: of the family's other label, if it has one), cached per
        worker: ``labels()`` validates and locks on every call."""
        return self._child(self._workers, metric, worker, value)

    def for_tenant(self, metric: _MetricT, tenant: str, value: str = "") -> _MetricT:
        """``metric``'s series of ``tenant`` (as ``for_worker``)."""
        return self._child(self._tenants, metric, tenant, value)

    def call_done(self, worker: str, kind: str, total_s: float, run_s: float, predicted_s: float) -> None:
        """A call returned."""
        k = self.kind(kind)
        stage = self._stage.get(k)
        if stage is None:
            stage = self._stage[k] = self.stage_latency.labels(kind=k)
        stage.observe(max(total_s, 0.0))
        self.for_worker(self.call_run, worker, k).observe(max(run_s, 0.0))
        if predicted_s > 0:
            self.for_worker(self.estimate_ratio, worker).observe(run_s / predicted_s)

    def workflow_done(self, tenant: str, latency_s: float | None, outcome: str) -> None:
        """A workflow ended with ``outcome`` (one of ``OUTCOMES``); only met and missed count towards attainment."""
        self.for_tenant(self.workflows, tenant, outcome).inc()
        if latency_s is not None:
            self.for_tenant(self.workflow_latency, tenant).observe(latency_s)
        if outcome in ("met", "missed"):
            recent = self._recent.get(tenant)
            if recent is None:
                recent = self._recent[tenant] = _Attainment()
            self.for_tenant(self.slo, tenant).set(recent.add(outcome == "met"))

    def workflow_outcome(self, tenant: str, outcome: str) -> None:
        """A workflow ended with goodput ``outcome`` (one of ``history.GOODPUT_OUTCOMES``); ``met`` is goodput."""
        self.for_tenant(self.workflow_outcomes, tenant, outcome).inc()
        if outcome == "met":
            self.for_tenant(self.goodput, tenant).inc()

    def degraded(self, tenant: str, step: str) -> None:
        """A question of ``tenant`` ran with knob ``step`` (``DEGRADED_STEPS``) turned down."""
        if step in DEGRADED_STEPS:
            self.for_tenant(self.degraded_workflows, tenant, step).inc()

    def worker_gauges(self, worker: str, queued: int, inflight: int) -> None:
        """A worker's point-in-time queue depth and calls in flight (before a scrape of ``/metrics``)."""
        self.for_worker(self.queue_depth, worker).set(queued)
        self.for_worker(self.inflight, worker).set(inflight)

    def profile_constants(self, worker: str, constants: dict[str, float]) -> None:
        """The worker's profile constants in use (``constant`` label: the ``PerfProfile`` field)."""
        for name, value in constants.items():
            self.for_worker(self.profile_constant, worker, name).set(value)

    def scraped(self, worker: str, m: WorkerMetrics) -> None:
        """Export the vLLM gauges of a fresh scrape."""
        for gauge, value in (
            (self.vllm_waiting, m.waiting),
            (self.vllm_running, m.running),
            (self.kv_usage, m.kv_cache_usage),
        ):
            if value is not None:
                self.for_worker(gauge, worker).set(value)

    def render(self, refresh: Callable[[], None] | None = None) -> bytes:
        """The exposition text (``refresh`` updates point-in-time gauges first)."""
        if refresh is not None:
            refresh()
        return generate_latest(self.registry)
