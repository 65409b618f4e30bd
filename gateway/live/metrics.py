"""The gateway's Prometheus metrics (prefix ``hexflow_``), in a registry of its own.

Label values are bounded: ``tenant`` comes from the tenants file, ``worker`` from the config or from
discovery (a removed worker's series are deleted, so pod churn does not grow the registry),
``outcome`` and ``reason`` from fixed sets, and ``kind`` (stage kinds are client-given on
``/v1/workflows``) through ``BoundedLabel``, which admits the first ``MAX_KINDS`` distinct values and
maps the rest to ``other``.

| metric | type | labels | meaning |
|---|---|---|---|
| hexflow_workflow_latency_seconds | histogram | tenant | end-to-end latency of finished workflows |
| hexflow_workflows_total | counter | tenant, outcome | outcome: met, missed, rejected, failed, cancelled, shed |
| hexflow_admission_rejections_total | counter | tenant, reason | why admission refused (``REJECT_REASONS``) |
| hexflow_workflows_demoted_total | counter | tenant, when | run at the lowest urgency: admission, queued |
| hexflow_slo_attainment | gauge | tenant | share of the tenant's last 1000 finished workflows that met the deadline |
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
| hexflow_scrape_failures_total | counter | worker | failed scrapes of a worker's /metrics |
| hexflow_worker_vllm_waiting | gauge | worker | the worker's scraped vllm:num_requests_waiting |
| hexflow_worker_vllm_running | gauge | worker | the worker's scraped vllm:num_requests_running |
| hexflow_worker_kv_cache_usage | gauge | worker | the worker's scraped vllm:kv_cache_usage_perc |
| hexflow_alpha | gauge | | the WB balance parameter in use |
| hexflow_tuning_runs_total | counter | result | applied, kept, skipped, failed |
| hexflow_tenant_reloads_total | counter | result | ok, failed |
| hexflow_parked_calls | gauge | | calls waiting for any healthy worker |
| hexflow_active_workflows | gauge | | workflows in progress |
| hexflow_discovery_pods | gauge | state | selected pods by state: ready, unready, pending (no IP yet), invalid |
| hexflow_discovery_errors_total | counter | | failed lists or watches of the Kubernetes API |
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.live.promparse import WorkerMetrics

MAX_KINDS = 32
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200, 3600)
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 900)
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 5, 10)
OUTCOMES = ("met", "missed", "rejected", "failed", "cancelled", "shed")
"""How a workflow can end. ``cancelled``: abandoned before it finished because its client went away (or
the gateway's shutdown grace ran out); ``shed``: admitted, then dropped because its queued calls could no
longer make its deadline (its tenant rejects rather than runs late). Neither is met nor missed, and neither
is in the SLO attainment."""
REJECT_REASONS = ("draining", "no_worker", "queue_full", "concurrency", "deadline")
"""Why admission refused a workflow (``hexflow_admission_rejections_total``): shutting down, no healthy
worker, the gateway's queues full, a concurrency bound (the gateway's or the tenant's), or its predicted
completion misses its deadline."""
DEMOTED_WHEN = ("admission", "queued")
"""When a workflow of a best-effort tenant was demoted to the lowest urgency."""


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


class GatewayMetrics:
    """Every metric the gateway exports, with small methods the pool and the app call."""

    def __init__(self, workers: list[str], tenants: list[str]) -> None:
        r = self.registry = CollectorRegistry()
        self.kind = BoundedLabel()
        self.workflow_latency = Histogram(
            "hexflow_workflow_latency_seconds",
            "End-to-end latency of finished workflows.",
            ["tenant"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.workflows = Counter(
            "hexflow_workflows",
            "Workflows by outcome (met, missed, rejected, failed, cancelled, shed).",
            ["tenant", "outcome"],
            registry=r,
        )
        self.rejections = Counter(
            "hexflow_admission_rejections",
            "Workflows refused at admission, by reason (draining, no_worker, queue_full, concurrency, deadline).",
            ["tenant", "reason"],
            registry=r,
        )
        self.demoted = Counter(
            "hexflow_workflows_demoted",
            "Workflows predicted to miss their deadline run at the lowest urgency (when: admission, queued).",
            ["tenant", "when"],
            registry=r,
        )
        self.slo = Gauge(
            "hexflow_slo_attainment",
            "Share of the tenant's last 1000 finished workflows that met their deadline.",
            ["tenant"],
            registry=r,
        )
        self.stage_latency = Histogram(
            "hexflow_stage_latency_seconds",
            "One LLM call from ready to result (gateway queue wait + run).",
            ["kind"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.call_run = Histogram(
            "hexflow_call_run_seconds",
            "One LLM call from sent to result, per worker.",
            ["kind", "worker"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.queue_wait_h = Histogram(
            "hexflow_queue_wait_seconds",
            "Time a call waited in the worker's gateway queue.",
            ["worker"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "hexflow_queue_depth", "Calls waiting in the worker's gateway queue.", ["worker"], registry=r
        )
        self.inflight = Gauge("hexflow_inflight", "Calls sent to the worker and not returned.", ["worker"], registry=r)
        self.dispatches = Counter("hexflow_dispatch", "Dispatch decisions.", ["worker", "kind"], registry=r)
        self.estimate_ratio = Histogram(
            "hexflow_estimate_ratio",
            "Observed over predicted call latency (1 = perfect estimate).",
            ["worker"],
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.up = Gauge("hexflow_worker_up", "1 when the worker takes calls.", ["worker"], registry=r)
        self.draining = Gauge(
            "hexflow_worker_draining",
            "1 while discovery drains the worker (pod unready, terminating or deleted).",
            ["worker"],
            registry=r,
        )
        self.failures = Counter("hexflow_call_failures", "Failed calls.", ["worker", "reason"], registry=r)
        self.retries = Counter(
            "hexflow_call_retries", "Calls re-dispatched after a worker failed them.", ["worker"], registry=r
        )
        self.ejections = Counter(
            "hexflow_worker_ejections", "Outlier ejections of a worker (and failed re-admission probes).", ["worker"],
            registry=r,
        )  # fmt: skip
        self.scrape_failures = Counter(
            "hexflow_scrape_failures", "Failed scrapes of a worker's /metrics.", ["worker"], registry=r
        )
        self.vllm_waiting = Gauge(
            "hexflow_worker_vllm_waiting", "The worker's scraped vllm:num_requests_waiting.", ["worker"], registry=r
        )
        self.vllm_running = Gauge(
            "hexflow_worker_vllm_running", "The worker's scraped vllm:num_requests_running.", ["worker"], registry=r
        )
        self.kv_usage = Gauge(
            "hexflow_worker_kv_cache_usage", "The worker's scraped vllm:kv_cache_usage_perc.", ["worker"], registry=r
        )
        self.alpha = Gauge("hexflow_alpha", "The WB balance parameter in use.", registry=r)
        self.tuning_runs = Counter("hexflow_tuning_runs", "Background alpha tuning runs.", ["result"], registry=r)
        self.tenant_reloads = Counter("hexflow_tenant_reloads", "Reloads of the tenants file.", ["result"], registry=r)
        self.parked = Gauge("hexflow_parked_calls", "Calls waiting for any healthy worker.", registry=r)
        self.active = Gauge("hexflow_active_workflows", "Workflows in progress.", registry=r)
        self.discovery_pods = Gauge(
            "hexflow_discovery_pods", "Selected worker pods by state (ready, unready, pending, invalid).", ["state"],
            registry=r,
        )  # fmt: skip
        self.discovery_errors = Counter(
            "hexflow_discovery_errors", "Failed lists or watches of the Kubernetes API.", registry=r
        )
        self._recent: dict[str, deque[bool]] = {}
        for w in workers:
            self.up.labels(worker=w).set(1)
            self.draining.labels(worker=w).set(0)
            self.queue_depth.labels(worker=w)
            self.inflight.labels(worker=w)
        for t in tenants:
            self.add_tenant(t)

    def _worker_metrics(self) -> list[Counter | Gauge | Histogram]:
        return [
            self.call_run, self.queue_wait_h, self.queue_depth, self.inflight, self.dispatches, self.estimate_ratio,
            self.up, self.draining, self.failures, self.retries, self.scrape_failures, self.vllm_waiting,
            self.vllm_running, self.kv_usage, self.ejections,
        ]  # fmt: skip

    def add_worker(self, worker: str) -> None:
        """Create a new worker's gauges (discovery; it starts down until it takes calls)."""
        self.up.labels(worker=worker).set(0)
        self.draining.labels(worker=worker).set(0)
        self.queue_depth.labels(worker=worker)
        self.inflight.labels(worker=worker)

    def remove_worker(self, worker: str) -> None:
        """Delete every series of a worker that left the pool."""
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
        self._recent.setdefault(tenant, deque(maxlen=1000))

    def dispatch(self, worker: str, kind: str) -> None:
        """One dispatch decision."""
        self.dispatches.labels(worker=worker, kind=self.kind(kind)).inc()

    def queue_wait(self, worker: str, seconds: float) -> None:
        """A call left the worker's gateway queue."""
        self.queue_wait_h.labels(worker=worker).observe(max(seconds, 0.0))

    def call_done(self, worker: str, kind: str, total_s: float, run_s: float, predicted_s: float) -> None:
        """A call returned."""
        k = self.kind(kind)
        self.stage_latency.labels(kind=k).observe(max(total_s, 0.0))
        self.call_run.labels(kind=k, worker=worker).observe(max(run_s, 0.0))
        if predicted_s > 0:
            self.estimate_ratio.labels(worker=worker).observe(run_s / predicted_s)

    def call_failure(self, worker: str, reason: str) -> None:
        """A call failed on a worker."""
        self.failures.labels(worker=worker, reason=reason).inc()

    def retry(self, worker: str) -> None:
        """A call failed by ``worker`` is re-dispatched."""
        self.retries.labels(worker=worker).inc()

    def ejection(self, worker: str) -> None:
        """A worker was ejected as an outlier, or stays ejected after a failed probe call."""
        self.ejections.labels(worker=worker).inc()

    def worker_up(self, worker: str, up: bool) -> None:
        """A worker went up or down."""
        self.up.labels(worker=worker).set(1 if up else 0)

    def worker_draining(self, worker: str, draining: bool) -> None:
        """Discovery started or stopped draining a worker."""
        self.draining.labels(worker=worker).set(1 if draining else 0)

    def scrape_failure(self, worker: str) -> None:
        """A scrape of the worker's /metrics failed."""
        self.scrape_failures.labels(worker=worker).inc()

    def scraped(self, worker: str, m: WorkerMetrics) -> None:
        """Export the vLLM gauges of a fresh scrape."""
        if m.waiting is not None:
            self.vllm_waiting.labels(worker=worker).set(m.waiting)
        if m.running is not None:
            self.vllm_running.labels(worker=worker).set(m.running)
        if m.kv_cache_usage is not None:
            self.kv_usage.labels(worker=worker).set(m.kv_cache_usage)

    def workflow_done(self, tenant: str, latency_s: float | None, outcome: str) -> None:
        """A workflow ended with ``outcome`` (one of ``OUTCOMES``); only met and missed count towards attainment."""
        self.workflows.labels(tenant=tenant, outcome=outcome).inc()
        if latency_s is not None:
            self.workflow_latency.labels(tenant=tenant).observe(latency_s)
        if outcome in ("met", "missed"):
            recent = self._recent.setdefault(tenant, deque(maxlen=1000))
            recent.append(outcome == "met")
            self.slo.labels(tenant=tenant).set(sum(recent) / len(recent))

    def render(self, refresh: Callable[[], None] | None = None) -> bytes:
        """The exposition text (``refresh`` updates point-in-time gauges first)."""
        if refresh is not None:
            refresh()
        return generate_latest(self.registry)
