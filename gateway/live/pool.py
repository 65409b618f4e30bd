"""The worker pool: per-worker drain loops that feed vLLM workers from the gateway-held queues.

Life of a call in the live gateway (the simulator's ``Simulator.run`` is the same sequence in
virtual time; ``tests/live/test_parity.py`` checks that both take the same decisions):

    runner: call ready  -> ``WorkerPool.submit``: ``Scheduler.submit`` (budget, dispatch) + kick the worker
    drain loop (one per worker, woken by kicks): while in flight < capacity and vLLM's waiting queue is
        not growing: ``Scheduler.pop_next`` -> a task sends the call (``Transport.send``)
    response            -> ``Scheduler.on_finish(observed)`` (slot frees, estimator learns) -> the
                           call's ``on_done`` runs synchronously: the runner submits the calls that
                           became ready -> kick the worker that returned the call
    worker failure      -> ``Scheduler.on_fail``; after ``failures_to_down`` consecutive failures (or a
                           refused connection) the worker is marked down, its queue is drained and
                           every call re-dispatched; the failed call is retried elsewhere up to
                           ``max_attempts``. With no healthy worker calls are *parked* and re-dispatched
                           when one comes back, or fail after ``parked_timeout_s``: nothing is dropped
                           silently.

Membership changes at run time (``gateway/live/discovery.py``): ``add_worker`` starts a drain loop for
a new worker; ``set_ready(False)`` takes a worker out of dispatch (its queue is re-dispatched, its
in-flight calls finish); ``remove_worker`` does the same and frees the worker once its last in-flight
call has returned, or after ``remove_grace_s`` re-dispatches the calls still running there (their
requests are cancelled) so that a pod that vanished without closing its connections loses nothing.

Background tasks: a health prober (``/health`` of every worker), a scraper (``/metrics`` of every
worker, concurrently, parsed by ``promparse``) and the drain loops. All state is touched only on the
event loop, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.core.scheduler import NoEligibleWorker, Scheduler, WorkerInfo
from gateway.core.workflow import Call
from gateway.errors import CallFailed, WorkerError
from gateway.live.metrics import GatewayMetrics
from gateway.live.promparse import MetricsParseError, WorkerMetrics, parse_worker_metrics

log = logging.getLogger("hexflow.pool")

Clock = Callable[[], float]
_PRIO_MAX = float(2**31 - 1)


@dataclass(slots=True)
class CallResult:
    """A worker's answer to one call."""

    body: dict[str, Any] | None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def text(self) -> str | None:
        """The generated text of a chat or completions answer (None when the body holds none)."""
        choices = (self.body or {}).get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        ch = choices[0]
        msg = ch.get("message")
        if isinstance(msg, dict) and isinstance(msg.get("content"), str):
            return str(msg["content"])
        text = ch.get("text")
        return text if isinstance(text, str) else None


@dataclass(slots=True, eq=False)
class LiveCall(Call):
    """A call of the live gateway: the scheduler's ``Call`` plus the request to send and its callback.

    ``endpoint`` is ``/v1/chat/completions`` or ``/v1/completions``; ``body`` the request body without
    ``model`` (the pool fills in the chosen worker's served model). ``on_done`` is called exactly once,
    synchronously, with the result or the final ``CallFailed`` (before the worker is refilled, so the
    successors of a call are queued before its slot is reused, as in the simulator). ``stream`` receives
    the worker's raw server-sent-event lines for a streaming pass-through; ``None`` when not streaming.
    """

    endpoint: str = "/v1/chat/completions"
    body: dict[str, Any] = field(default_factory=dict)
    on_done: Callable[[LiveCall, CallResult | CallFailed], None] | None = None
    stream: asyncio.Queue[bytes | None] | None = None
    streamed: bool = False
    queued_at: float = 0.0
    sent_at: float = 0.0
    parked_at: float | None = None
    last_error: str = ""
    priority: int = 0
    task: asyncio.Task[None] | None = None
    worker_name: str = ""
    requeue: bool = False


@dataclass(slots=True)
class WorkerEndpoint:
    """Where a worker is and what it serves."""

    index: int
    name: str
    url: str
    served_model: str
    capacity: int


class Transport(Protocol):
    """How the pool talks to workers (HTTP in production; a fake in tests)."""

    async def send(self, worker: WorkerEndpoint, call: LiveCall) -> CallResult:
        """Run one call on the worker; raise ``WorkerError`` (retryable) or ``CallFailed`` (final)."""
        ...

    async def probe(self, worker: WorkerEndpoint) -> bool:
        """True when the worker's health endpoint answers OK."""
        ...

    async def scrape(self, worker: WorkerEndpoint) -> str:
        """The worker's ``/metrics`` text (raise on failure)."""
        ...


@dataclass(slots=True)
class WorkerState:
    """The pool's view of one worker."""

    ep: WorkerEndpoint
    up: bool = True
    ready: bool = True
    removing: bool = False
    loop_task: asyncio.Task[None] | None = None
    removal_task: asyncio.Task[None] | None = None
    failures: int = 0
    kick: asyncio.Event = field(default_factory=asyncio.Event)
    metrics: WorkerMetrics | None = None
    scraped_at: float | None = None
    prev_waiting: float | None = None
    held: bool = False
    inflight: set[LiveCall] = field(default_factory=set)
    sent: int = 0
    failed: int = 0

    @property
    def eligible(self) -> bool:
        """Takes new dispatches: healthy, ready (discovery) and not being removed."""
        return self.up and self.ready and not self.removing


class WorkerPool:
    """Drain loops, health, scraping and failure handling around one ``Scheduler``.

    Args:
        endpoints: the workers, in the scheduler's order.
        scheduler: the policy engine (owned by the caller; touched only on the event loop).
        transport: how calls, probes and scrapes reach workers.
        metrics: the gateway's Prometheus metrics.
        clock: the scheduler's clock (``time.monotonic`` live; a fake in parity tests).
        max_attempts, failures_to_down, parked_timeout_s: failure handling (see the module doc).
        health_period_s, scrape_period_s: background task periods (0 disables the task, for tests).
        remove_grace_s: how long a removed worker's in-flight calls may run before they are re-dispatched.
    """

    def __init__(
        self,
        endpoints: Sequence[WorkerEndpoint],
        scheduler: Scheduler,
        transport: Transport,
        metrics: GatewayMetrics,
        *,
        clock: Clock = time.monotonic,
        max_attempts: int = 3,
        failures_to_down: int = 2,
        parked_timeout_s: float = 60.0,
        health_period_s: float = 2.0,
        scrape_period_s: float = 1.0,
        remove_grace_s: float = 120.0,
    ) -> None:
        if len(endpoints) != len(scheduler.workers):
            raise ValueError("one endpoint per scheduler worker is needed")
        self.states: dict[int, WorkerState] = {ep.index: WorkerState(ep) for ep in endpoints}
        self.scheduler = scheduler
        self.transport = transport
        self.metrics = metrics
        self.clock = clock
        self.max_attempts = max_attempts
        self.failures_to_down = failures_to_down
        self.parked_timeout_s = parked_timeout_s
        self.health_period_s = health_period_s
        self.scrape_period_s = scrape_period_s
        self.remove_grace_s = remove_grace_s
        self.epoch = clock()
        self.parked: deque[LiveCall] = deque()
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False
        self.queued_total = 0
        self.dispatch_log: list[tuple[int, int]] | None = None  # (call id, worker) when recording
        self.sent_log: list[tuple[float, str]] | None = None  # (time sent, worker name) when recording
        self.on_removed: Callable[[str], None] | None = None  # called with a removed worker's name

    @property
    def workers(self) -> list[WorkerState]:
        """The current workers, by scheduler index."""
        return [self.states[i] for i in sorted(self.states)]

    def by_name(self, name: str) -> WorkerState | None:
        """The worker called ``name`` (None when it is not, or no longer, in the pool)."""
        return next((st for st in self.states.values() if st.ep.name == name), None)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the drain loops and the background tasks."""
        self._running = True
        for st in self.workers:
            self._start_loop(st)
        if self.health_period_s > 0:
            self._tasks.append(asyncio.create_task(self._health_loop(), name="health"))
        if self.scrape_period_s > 0:
            self._tasks.append(asyncio.create_task(self._scrape_loop(), name="scrape"))

    async def stop(self) -> None:
        """Stop every background task and cancel calls still in flight (their callbacks get a 503)."""
        self._running = False
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        loops = [t for st in self.workers for t in (st.loop_task, st.removal_task) if t is not None]
        for t in loops:
            t.cancel()
        for t in loops:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        parked, self.parked = list(self.parked), deque()
        for c in parked:
            self._resolve_error(c, CallFailed("the gateway is shutting down", status=503))
        pending = [c.task for st in self.workers for c in st.inflight if c.task is not None]
        for t in pending:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    @property
    def healthy(self) -> int:
        """Workers currently taking calls (up, ready, not being removed)."""
        return sum(1 for st in self.states.values() if st.eligible)

    def _start_loop(self, st: WorkerState) -> None:
        if self._running and st.loop_task is None:
            st.loop_task = asyncio.create_task(self._drain_loop(st), name=f"drain-{st.ep.name}")

    # ------------------------------------------------------------------ membership

    def add_worker(self, ep: WorkerEndpoint, info: WorkerInfo, *, ready: bool = True) -> WorkerState:
        """Add a worker at run time (``ep.index`` is assigned here); it takes calls at once when ready."""
        if self.by_name(ep.name) is not None:
            raise ValueError(f"a worker named {ep.name!r} is already in the pool")
        idx = self.scheduler.add_worker(info, eligible=False)
        ep.index = idx
        st = WorkerState(ep, ready=ready)
        self.states[idx] = st
        self.metrics.add_worker(ep.name)
        log.info(
            "worker %s added (%s, %s, capacity %d, ready %s)", ep.name, ep.url, info.profile.gpu, ep.capacity, ready
        )
        self._start_loop(st)
        self._sync(st)
        return st

    def set_ready(self, st: WorkerState, ready: bool) -> None:
        """Readiness from discovery: an unready worker gets no new calls; its queue is re-dispatched."""
        if st.ready == ready:
            return
        log.info("worker %s %s", st.ep.name, "ready" if ready else "not ready: draining")
        st.ready = ready
        self._sync(st)

    def set_capacity(self, st: WorkerState, capacity: int) -> None:
        """Change a worker's in-flight limit."""
        if capacity == st.ep.capacity:
            return
        st.ep.capacity = capacity
        self.scheduler.set_capacity(st.ep.index, capacity)
        st.kick.set()

    def remove_worker(self, st: WorkerState) -> None:
        """Take a worker out for good: no new calls, queue re-dispatched, freed after its last call."""
        if st.removing:
            return
        log.info("worker %s removed: draining %d calls in flight", st.ep.name, len(st.inflight))
        st.removing = True
        self._sync(st)
        if not st.inflight:
            self._finish_removal(st)
        elif self._running:
            st.removal_task = asyncio.create_task(self._removal_deadline(st), name=f"remove-{st.ep.name}")

    async def _removal_deadline(self, st: WorkerState) -> None:
        await asyncio.sleep(self.remove_grace_s)
        calls = list(st.inflight)
        if calls:
            log.warning(
                "worker %s still has %d calls after %g s: re-dispatching them",
                st.ep.name,
                len(calls),
                self.remove_grace_s,
            )
        for c in calls:
            c.requeue = True
            if c.task is not None:
                c.task.cancel()

    def _finish_removal(self, st: WorkerState) -> None:
        if self.states.get(st.ep.index) is not st:
            return
        if st.loop_task is not None:
            st.loop_task.cancel()
            st.loop_task = None
        t = st.removal_task
        if t is not None and t is not asyncio.current_task():
            t.cancel()
        st.removal_task = None
        del self.states[st.ep.index]
        self.scheduler.remove_worker(st.ep.index)
        self.metrics.remove_worker(st.ep.name)
        log.info("worker %s is gone from the pool", st.ep.name)
        if self.on_removed is not None:
            self.on_removed(st.ep.name)

    def _sync(self, st: WorkerState) -> None:
        """Apply a worker's eligibility to the scheduler: re-dispatch its queue or the parked calls."""
        ok = st.eligible
        was = self.scheduler.eligible[st.ep.index]
        self.scheduler.set_eligible(st.ep.index, ok)
        self.metrics.worker_up(st.ep.name, ok)
        self.metrics.worker_draining(st.ep.name, st.removing or not st.ready)
        if was and not ok:
            for c in self.scheduler.drain_worker(st.ep.index):
                assert isinstance(c, LiveCall)
                self.submit(c)
        elif ok and not was:
            parked = list(self.parked)
            self.parked.clear()
            for c in parked:
                self.submit(c)
            st.kick.set()

    # ------------------------------------------------------------------ dispatch

    def submit(self, call: LiveCall) -> None:
        """Dispatch a ready call to a worker's queue (or park it when no worker is up)."""
        now = self.clock()
        call.queued_at = now
        try:
            w = self.scheduler.submit(call, now)
        except NoEligibleWorker:
            call.parked_at = now
            self.parked.append(call)
            return
        call.parked_at = None
        if self.dispatch_log is not None:
            self.dispatch_log.append((call.id, w))
        st = self.states[w]
        self.metrics.dispatch(st.ep.name, call.kind)
        st.kick.set()

    def cancel(self, call: LiveCall) -> None:
        """Abandon a call: off its queue, or its in-flight request cancelled (slot released)."""
        if call in self.parked:
            self.parked.remove(call)
            return
        if self.scheduler.cancel(call):
            return
        if call.task is not None and not call.task.done():
            call.task.cancel()

    def can_send(self, st: WorkerState) -> bool:
        """In flight below capacity, and vLLM's own waiting queue not growing (unless idle)."""
        n = self.scheduler.inflight(st.ep.index)
        if n >= st.ep.capacity:
            return False
        return not (st.held and n > 0)

    def fill(self, st: WorkerState) -> list[LiveCall]:
        """Pop calls for a worker while it can take them; mark them in flight."""
        out: list[LiveCall] = []
        if not st.eligible:
            return out
        w = st.ep.index
        while self.can_send(st):
            now = self.clock()
            c = self.scheduler.pop_next(w, now)
            if c is None:
                break
            assert isinstance(c, LiveCall)
            c.sent_at = now
            c.worker_name = st.ep.name
            if self.sent_log is not None:
                self.sent_log.append((now, st.ep.name))
            if c.key:
                # vLLM's priority (lower runs sooner): the queue key in ms since the pool started, so a
                # worker run with --scheduling-policy priority orders its own waiting queue the same way.
                c.priority = int(max(min((c.key - self.epoch) * 1000.0, _PRIO_MAX), -_PRIO_MAX))
            self.metrics.queue_wait(st.ep.name, now - c.queued_at)
            st.inflight.add(c)
            out.append(c)
        return out

    async def _drain_loop(self, st: WorkerState) -> None:
        while self._running:
            await st.kick.wait()
            st.kick.clear()
            for c in self.fill(st):
                c.task = asyncio.create_task(self._execute(st, c), name=f"call-{c.id}")

    # ------------------------------------------------------------------ execution

    async def _execute(self, st: WorkerState, call: LiveCall) -> None:
        try:
            result = await self.transport.send(st.ep, call)
        except asyncio.CancelledError:
            st.inflight.discard(call)
            self.scheduler.on_fail(call, self.clock())
            if call.requeue and self._running:
                # The worker was removed with this call still running: run it elsewhere, lose nothing.
                call.requeue = False
                call.attempts -= 1
                self.metrics.retry(st.ep.name)
                self._after_call(st)
                self.submit(call)
                return
            self._resolve_error(call, CallFailed("the call was cancelled", status=503))
            self._after_call(st)
            raise
        except WorkerError as exc:
            st.inflight.discard(call)
            self.scheduler.on_fail(call, self.clock())
            self._worker_failed(st, call, str(exc), refused=exc.refused)
            self._after_call(st)
            return
        except CallFailed as exc:
            st.inflight.discard(call)
            self.scheduler.on_fail(call, self.clock())
            self.metrics.call_failure(st.ep.name, "rejected")
            self._resolve_error(call, exc)
            self._after_call(st)
            return
        except Exception as exc:  # a bug or an unexpected transport error: never lose the call
            log.exception("call %s on %s failed unexpectedly", call.id, st.ep.name)
            st.inflight.discard(call)
            self.scheduler.on_fail(call, self.clock())
            self._worker_failed(st, call, f"unexpected error: {exc!r}", refused=False)
            self._after_call(st)
            return
        now = self.clock()
        st.inflight.discard(call)
        observed = now - call.sent_at
        predicted = call.t_comp
        self.scheduler.on_finish(call, now, observed_s=observed)
        st.failures = 0
        st.sent += 1
        self.metrics.call_done(st.ep.name, call.kind, now - call.ready_at, observed, predicted)
        self._deliver(call, result)
        self._after_call(st)

    def _after_call(self, st: WorkerState) -> None:
        """A call left the worker: refill it, or finish its removal once nothing is in flight."""
        if st.removing:
            if not st.inflight:
                self._finish_removal(st)
        else:
            st.kick.set()

    def _resolve_error(self, call: LiveCall, exc: CallFailed) -> None:
        self._deliver(call, exc)

    def _deliver(self, call: LiveCall, outcome: CallResult | CallFailed) -> None:
        cb, call.on_done = call.on_done, None
        if cb is None:
            return
        try:
            cb(call, outcome)
        except Exception:
            log.exception("completion handler of call %s failed", call.id)

    def _worker_failed(self, st: WorkerState, call: LiveCall, reason: str, *, refused: bool) -> None:
        st.failures += 1
        st.failed += 1
        call.last_error = f"{st.ep.name}: {reason}"
        self.metrics.call_failure(st.ep.name, "worker_error")
        log.warning("call %s failed on worker %s (attempt %d): %s", call.id, st.ep.name, call.attempts, reason)
        if refused or st.failures >= self.failures_to_down:
            self.mark_down(st, reason)
        if call.streamed:
            self._resolve_error(call, CallFailed(f"worker {st.ep.name} failed mid-stream: {reason}", 502))
        elif call.attempts >= self.max_attempts:
            self._resolve_error(
                call, CallFailed(f"call failed after {call.attempts} attempts; last: {call.last_error}", 502)
            )
        else:
            self.metrics.retry(st.ep.name)
            self.submit(call)

    def mark_down(self, st: WorkerState, reason: str) -> None:
        """Take a worker out of dispatch and re-dispatch its queue (in-flight calls finish or fail)."""
        if not st.up:
            return
        if not st.removing:
            log.error("worker %s marked down: %s", st.ep.name, reason)
        st.up = False
        self._sync(st)

    def mark_up(self, st: WorkerState) -> None:
        """Put a worker back into dispatch and re-dispatch parked calls."""
        st.failures = 0
        if st.up:
            return
        log.warning("worker %s is up again", st.ep.name)
        st.up = True
        self._sync(st)

    def expire_parked(self) -> None:
        """Fail parked calls that waited longer than ``parked_timeout_s`` for a healthy worker."""
        now = self.clock()
        keep: deque[LiveCall] = deque()
        for c in self.parked:
            if c.parked_at is not None and now - c.parked_at > self.parked_timeout_s:
                self._resolve_error(
                    c,
                    CallFailed(
                        f"no healthy worker for {self.parked_timeout_s:g} s"
                        + (f"; last error: {c.last_error}" if c.last_error else ""),
                        status=503,
                    ),
                )
            else:
                keep.append(c)
        self.parked = keep

    # ------------------------------------------------------------------ background

    async def _health_loop(self) -> None:
        while self._running:
            await self.check_health()
            await asyncio.sleep(self.health_period_s)

    async def check_health(self, *, initial: bool = False) -> None:
        """Probe every worker once, concurrently; update up/down; expire parked calls.

        ``initial``: the probe at start; a worker that does not answer it starts down (it joins when a
        later probe succeeds), so readiness means a worker really answered.
        """

        async def one(st: WorkerState) -> None:
            try:
                ok = await self.transport.probe(st.ep)
            except Exception:
                ok = False
            if ok:
                self.mark_up(st)
            elif st.up:
                st.failures += 1
                if initial or st.failures >= self.failures_to_down:
                    self.mark_down(st, "health probe failed")

        await asyncio.gather(*(one(st) for st in self.workers if not st.removing))
        self.expire_parked()

    async def _scrape_loop(self) -> None:
        while self._running:
            await self.scrape_all()
            await asyncio.sleep(self.scrape_period_s)

    async def scrape_all(self) -> None:
        """Scrape every worker's ``/metrics`` concurrently; update the waiting-queue hold."""

        async def one(st: WorkerState) -> None:
            try:
                text = await self.transport.scrape(st.ep)
                m = parse_worker_metrics(text, st.ep.served_model)
            except (MetricsParseError, Exception) as exc:
                self.metrics.scrape_failure(st.ep.name)
                log.debug("scrape of %s failed: %s", st.ep.name, exc)
                return
            self.apply_scrape(st, m)

        await asyncio.gather(*(one(st) for st in self.workers))

    def apply_scrape(self, st: WorkerState, m: WorkerMetrics) -> None:
        """Record a scrape; hold dispatch to a worker whose vLLM waiting queue is growing."""
        prev = st.metrics.waiting if st.metrics is not None else None
        st.prev_waiting = prev
        st.metrics = m
        st.scraped_at = self.clock()
        waiting = m.waiting or 0.0
        was_held = st.held
        st.held = waiting > 0 and prev is not None and waiting > prev
        self.metrics.scraped(st.ep.name, m)
        if was_held and not st.held:
            st.kick.set()

    # ------------------------------------------------------------------ status

    def status(self) -> list[dict[str, Any]]:
        """Per-worker state for ``/v1/status``."""
        now = self.clock()
        out = []
        for st in self.workers:
            w = st.ep.index
            m = st.metrics
            ratios = self.scheduler.estimator.ratios(w, now)
            out.append(
                {
                    "name": st.ep.name,
                    "url": st.ep.url,
                    "model": st.ep.served_model,
                    "up": st.up,
                    "ready": st.ready,
                    "removing": st.removing,
                    "capacity": st.ep.capacity,
                    "queued": self.scheduler.queue_len(w),
                    "inflight": self.scheduler.inflight(w),
                    "held": st.held,
                    "t_queue_s": round(self.scheduler.estimator.t_queue(w, now), 6),
                    "estimate_ratios": {
                        k: {"ratio": round(r, 4), "age_s": round(a, 3)} for k, (r, a) in ratios.items()
                    },
                    "completed": st.sent,
                    "failed": st.failed,
                    "vllm": None
                    if m is None
                    else {
                        "running": m.running,
                        "waiting": m.waiting,
                        "kv_cache_usage": m.kv_cache_usage,
                        "age_s": None if st.scraped_at is None else round(now - st.scraped_at, 3),
                    },
                }
            )
        return out
