"""The worker pool: membership, dispatch, and the draining of worker queues into vLLM workers
(docs/live-gateway.md, "The worker pool"), and its workers' health transitions: outlier ejection and
re-admission, down and up, parked calls' expiry. Every way a sent call can end goes through
``WorkerPool._settle``. State is touched only on the event loop (no locks)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gateway.config.gateway import GatewayConfig
from gateway.core.latency import decode_steps
from gateway.core.scheduler import NoEligibleWorker, Scheduler
from gateway.core.worker import WorkerInfo
from gateway.errors import CallFailed, WorkerError
from gateway.live.metrics import GatewayMetrics
from gateway.live.monitor import WorkerMonitor, cancel_and_wait
from gateway.live.outliers import OutlierDetector
from gateway.live.transport import CallResult, LiveCall, PriorityRefused, Transport
from gateway.live.worker_state import WorkerState

log = logging.getLogger("hexflow.pool")

Clock = Callable[[], float]
_PRIO_MAX = float(2**31 - 1)


class WorkerPool:
    """Membership, dispatch, draining and failure handling around one ``Scheduler``, with gateway.yaml's settings
    (``clock``: the scheduler's; ``background``: run the health and scrape tasks; ``remove_grace_s``: how long a
    removed worker's in-flight calls may run before they are re-dispatched)."""

    def __init__(
        self,
        scheduler: Scheduler,
        transport: Transport,
        metrics: GatewayMetrics,
        cfg: GatewayConfig,
        *,
        clock: Clock = time.monotonic,
        background: bool = True,
    ) -> None:
        self.timeouts = cfg.timeouts
        self.outliers = OutlierDetector(cfg.health.outlier)
        self.states: dict[int, WorkerState] = {i: self._new_state(i, scheduler) for i in scheduler.members()}
        self.scheduler = scheduler
        self.transport = transport
        self.metrics = metrics
        self.clock = clock
        self.max_attempts = cfg.retries.max_attempts
        self.failures_to_down = cfg.health.failures_to_down
        self.parked_timeout_s = cfg.limits.parked_timeout_s
        self.remove_grace_s = cfg.discovery.remove_grace_s if cfg.discovery is not None else 120.0
        periods = (cfg.health.period_s, cfg.scrape.period_s) if background else (0.0, 0.0)
        self.monitor = WorkerMonitor(self, health_period_s=periods[0], scrape_period_s=periods[1])
        self.epoch = clock()
        self.parked: deque[LiveCall] = deque()
        self._running = False
        # The context calls are sent in (a copy per task): the pool's own, never that of the request whose
        # submission happened to drain the worker (its log ids).
        self._context = contextvars.copy_context()
        self._kicked: dict[WorkerState, None] = {}  # the workers with a drain pending, in the order kicked
        # The latest health changes, (time, worker name, what): down, up, ejected, readmitted, probe_failed.
        self.events: deque[tuple[float, str, str]] = deque(maxlen=256)
        self.on_removed: Callable[[str], None] | None = None  # called with a removed worker's name
        self._served: tuple[str, ...] | None = None  # served_models(), until the membership changes

    def _new_state(self, index: int, scheduler: Scheduler, *, ready: bool = True) -> WorkerState:
        return WorkerState(index, scheduler, ready=ready, recent=deque(maxlen=self.outliers.cfg.window))

    @property
    def workers(self) -> list[WorkerState]:
        """The current workers, by scheduler index."""
        return [self.states[i] for i in sorted(self.states)]

    def served_models(self) -> tuple[str, ...]:
        """The models the workers serve (workers being removed excluded), sorted; cached per membership."""
        served = self._served
        if served is None:
            served = self._served = tuple(
                sorted({st.info.served_model for st in self.states.values() if not st.removing})
            )
        return served

    def by_name(self, name: str) -> WorkerState | None:
        """The worker called ``name`` (None when it is not, or no longer, in the pool)."""
        return next((st for st in self.states.values() if st.name == name), None)

    async def start(self) -> None:
        """Start draining the workers (calls submitted before are sent now) and the monitor's tasks."""
        self._running = True
        self._context = contextvars.copy_context()
        for st in self.workers:
            self.kick(st)
        self.monitor.start()

    async def stop(self) -> None:
        """Stop every background task and cancel calls still in flight (their callbacks get a 503)."""
        self._running = False
        await self.monitor.stop()
        for st in self.workers:
            self._cancel_drain(st)
        loops = [st.removal_task for st in self.workers if st.removal_task is not None]
        await cancel_and_wait(loops)
        parked, self.parked = list(self.parked), deque()
        for c in parked:
            self._deliver(c, CallFailed("the gateway is shutting down", status=503))
        pending = [c.task for st in self.workers for c in st.inflight if c.task is not None]
        await cancel_and_wait(pending)

    @property
    def healthy(self) -> int:
        """Workers currently taking calls (up, ready, not being removed)."""
        return sum(1 for st in self.states.values() if st.eligible)

    def add_worker(self, info: WorkerInfo, *, ready: bool = True) -> WorkerState:
        """Add a worker at run time; it takes calls at once when ready."""
        if self.by_name(info.name) is not None:
            raise ValueError(f"a worker named {info.name!r} is already in the pool")
        idx = self.scheduler.add_worker(info, eligible=False)
        st = self._new_state(idx, self.scheduler, ready=ready)
        self.states[idx] = st
        self._served = None
        self.metrics.add_worker(info.name)
        log.info(
            "worker %s added (%s, %s, capacity %d, ready %s)",
            info.name,
            info.url,
            info.profile.gpu,
            info.capacity,
            ready,
        )
        self._sync(st)
        return st

    def set_ready(self, st: WorkerState, ready: bool) -> None:
        """Readiness from discovery: an unready worker gets no new calls; its queue is re-dispatched."""
        if st.ready == ready:
            return
        log.info("worker %s %s", st.name, "ready" if ready else "not ready: draining")
        st.ready = ready
        self._sync(st)

    def set_capacity(self, st: WorkerState, capacity: int) -> None:
        """Change a worker's in-flight limit (the one way it changes at run time)."""
        if capacity == st.info.capacity:
            return
        self.scheduler.set_capacity(st.index, capacity)
        self.kick(st)

    def remove_worker(self, st: WorkerState) -> None:
        """Take a worker out for good: no new calls, queue re-dispatched, freed after its last call."""
        if st.removing:
            return
        log.info("worker %s removed: draining %d calls in flight", st.name, len(st.inflight))
        st.removing = True
        self._served = None
        self._sync(st)
        if not st.inflight:
            self._finish_removal(st)
        elif self._running:
            st.removal_task = asyncio.create_task(self._removal_deadline(st), name=f"remove-{st.name}")

    async def _removal_deadline(self, st: WorkerState) -> None:
        await asyncio.sleep(self.remove_grace_s)
        calls = list(st.inflight)
        if calls:
            log.warning(
                "worker %s still has %d calls after %g s: re-dispatching them", st.name, len(calls), self.remove_grace_s
            )
        for c in calls:
            c.requeue = True
            if c.task is not None:
                c.task.cancel()

    def _finish_removal(self, st: WorkerState) -> None:
        if not self.is_member(st):
            return
        name = st.name
        self._cancel_drain(st)
        t = st.removal_task
        if t is not None and t is not asyncio.current_task():
            t.cancel()
        st.removal_task = None
        del self.states[st.index]
        self._served = None
        self.scheduler.remove_worker(st.index)
        self.metrics.remove_worker(name)
        log.info("worker %s is gone from the pool", name)
        if self.on_removed is not None:
            self.on_removed(name)

    def _sync(self, st: WorkerState) -> None:
        """Apply a worker's eligibility to the scheduler: re-dispatch its queue or the parked calls."""
        ok = st.eligible
        was = self.scheduler.eligible[st.index]
        self.scheduler.set_eligible(st.index, ok)
        m = self.metrics
        m.for_worker(m.up, st.name).set(1 if ok else 0)
        m.for_worker(m.draining, st.name).set(1 if st.removing or not st.ready else 0)
        if was and not ok:
            for c in self.scheduler.drain_worker(st.index):
                assert isinstance(c, LiveCall)
                self.submit(c)
        elif ok and not was:
            parked = list(self.parked)
            self.parked.clear()
            for c in parked:
                self.submit(c)
            self.kick(st)

    def submit(self, call: LiveCall) -> None:
        """Dispatch a ready call to a worker's queue (or park it when no worker is up)."""
        now = self.clock()
        try:
            w = self.scheduler.submit(call, now)
        except NoEligibleWorker:
            call.parked_at = now
            self.parked.append(call)
            return
        call.parked_at = None
        st = self.states[w]
        m = self.metrics
        m.for_worker(m.dispatches, st.name, m.kind(call.kind)).inc()
        self.kick(st)

    def cancel(self, call: LiveCall) -> None:
        """Abandon a call: off its queue (its callback released at once, never run), or its in-flight request
        cancelled (answered ``CallFailed`` 503 when it unwinds)."""
        if call in self.parked:
            self.parked.remove(call)
            call.on_done = None
            return
        if self.scheduler.cancel(call):
            call.on_done = None
            return
        task = call.task
        if task is not None and not task.done():
            task.cancel()
            st = self.states.get(call.worker)
            if st is not None and call in st.inflight:
                # A task cancelled before its first step never enters ``_execute``: settled when it ends instead.
                task.add_done_callback(functools.partial(self._settle_unstarted, st, call), context=self._context)

    def _settle_unstarted(self, st: WorkerState, call: LiveCall, task: asyncio.Task[None]) -> None:
        if call.task is task and call in st.inflight:
            call.task = None
            self._settle(st, call, asyncio.CancelledError())

    def fill(self, st: WorkerState) -> list[LiveCall]:
        """Pop calls for a worker while it can take them; mark them in flight."""
        out: list[LiveCall] = []
        if not st.eligible:
            return out
        w = st.index
        name = st.name
        # In flight below capacity, and vLLM's own waiting queue not growing (unless idle); the capacity and the
        # hold cannot change while filling.
        load = self.scheduler.estimator.loads[w]
        cap = st.info.capacity
        held = st.held
        while load.inflight < cap and not (held and load.inflight > 0):
            now = self.clock()
            c = self.scheduler.pop_next(w, now)
            if c is None:
                break
            assert isinstance(c, LiveCall)
            c.sent_at = now
            c.worker_name = name
            if not st.priority_scheduling:  # the worker refused the field (``refuse_priority``)
                c.priority = None
            elif c.best_effort:  # behind every urgent call in vLLM's own waiting queue too
                c.priority = int(_PRIO_MAX)
            elif c.key:
                # vLLM's priority (lower runs sooner): the queue key in ms since the pool started, so a
                # worker run with --scheduling-policy priority orders its own waiting queue the same way.
                c.priority = int(max(min((c.key - self.epoch) * 1000.0, _PRIO_MAX), -_PRIO_MAX))
            self.metrics.for_worker(self.metrics.queue_wait_h, name).observe(max(now - c.ready_at, 0.0))
            st.advance_load(now)
            st.inflight.add(c)
            st.prefill_sent += c.prefill_s
            c.load_marks = (st.load_area, st.prefill_sent, len(st.inflight))
            out.append(c)
        return out

    def kick(self, st: WorkerState) -> None:
        """Drain ``st`` once the code running now is done (a burst is ordered by the queue discipline, not by
        arrival); one drain pending per worker, none before ``start``."""
        if self._running and st.drain is None:
            st.drain = asyncio.get_running_loop().call_soon(self._drain_due, st, context=self._context)
            self._kicked[st] = None

    def drain_kicked(self) -> None:
        """Drain now the workers kicked and not drained yet (for code that has queued its whole burst)."""
        kicked = self._kicked
        while kicked:
            st = next(iter(kicked))
            self._drain(st)

    def _cancel_drain(self, st: WorkerState) -> None:
        self._kicked.pop(st, None)
        if st.drain is not None:
            st.drain.cancel()
            st.drain = None

    def _drain_due(self, st: WorkerState) -> None:
        """A kicked worker's drain, on its turn of the event loop."""
        st.drain = None
        del self._kicked[st]
        self._send(st)

    def _drain(self, st: WorkerState) -> None:
        """Drain ``st`` now (its pending drain, if any, is not needed any more)."""
        self._cancel_drain(st)
        self._send(st)

    def _send(self, st: WorkerState) -> None:
        """Fill ``st`` and send what it took, each call in a task of its own (``_execute``)."""
        context = self._context
        for c in self.fill(st):
            c.task = asyncio.create_task(self._execute(st, c), name=f"call-{c.id}", context=context.copy())

    def predicted_s(self, st: WorkerState, call: LiveCall, tokens: tuple[int, int] | None = None) -> float:
        """The call's time on the worker as predicted when sent (at least the lone-request latency); ``tokens``:
        the (prompt, completion) tokens it processed, when they differ from the expected ones."""
        spec = call.spec
        est = self.scheduler.estimator
        n_in, n_out = (spec.input_tokens, spec.output_tokens) if tokens is None else tokens
        base = est.base_latency(st.index, n_in, n_out)
        model = est.model_for_tokens(call, tokens)
        return model if model > base else base

    def under_load_s(self, st: WorkerState, call: LiveCall, now: float, tokens: tuple[int, int] | None = None) -> float:
        """The call's time as predicted knowing the load it ran under (``LatencyModel.under_load_s``): what
        outlier ejection judges a worker's speed by."""
        base = self.predicted_s(st, call, tokens)
        area0, prefill0, n0 = call.load_marks
        life = now - call.sent_at
        extra_n = (st.load_area - area0) / life - n0 if life > 0 else 0.0
        produced = call.spec.output_tokens if tokens is None else tokens[1]
        model = self.scheduler.estimator.model(st.index)
        return model.under_load_s(base, st.prefill_sent - prefill0, extra_n, decode_steps(produced))

    async def _execute(self, st: WorkerState, call: LiveCall) -> None:
        """Send one call within its whole-call bound; every way out is settled by ``_settle``."""
        predicted = self.predicted_s(st, call)
        limit = self.timeouts.call_timeout(predicted)
        bound = asyncio.timeout(limit)
        try:
            async with bound:
                try:
                    result = await self.transport.send(st.info, call)
                except PriorityRefused:
                    if call.priority is None:
                        raise
                    # Sent again at once without the field (neither a failure nor an attempt).
                    self.refuse_priority(st)
                    call.priority = None
                    result = await self.transport.send(st.info, call)
        except asyncio.CancelledError as exc:
            if not self._settle(st, call, exc):
                # The task keeps the error it ends with: its traceback would hold frames referring to the task
                # (cycles only the collector frees). The call is settled: nothing of that is needed.
                call.task = None
                del bound
                raise exc.with_traceback(None) from None
            return
        except Exception as exc:  # WorkerError, CallFailed, or a bug: never lose the call
            if isinstance(exc, TimeoutError) and bound.expired():
                exc = WorkerError(
                    f"timed out: no answer within the call's bound of {limit:.3g} s (predicted {predicted:.3g} s)"
                )
            self._settle(st, call, exc)
            return
        self._settle(st, call, result)

    def refuse_priority(self, st: WorkerState) -> None:
        """``st`` refused vLLM's ``priority`` field: its calls go without it from now on (said once)."""
        if not st.priority_scheduling:
            return
        st.priority_scheduling = False
        self.metrics.for_worker(self.metrics.priority, st.name).set(0)
        log.warning(
            "worker %s refuses vLLM's priority field (started without --scheduling-policy priority): its calls "
            "are sent without it from now on, and its own waiting queue runs first come, first served",
            st.name,
        )

    def _settle(self, st: WorkerState, call: LiveCall, outcome: CallResult | BaseException) -> bool:
        """A sent call came back, failed or was cancelled: free its slot, deliver or retry, refill. A cancellation
        is re-dispatched when its worker was removed (returns True), else failed with ``CallFailed`` 503."""
        now = self.clock()
        st.advance_load(now)
        st.inflight.discard(call)
        if isinstance(outcome, CallResult):
            observed = now - call.sent_at
            # Judged for what it processed (its answer's ``usage``, else the expected tokens): a long answer the
            # model chose to write is not a slow worker.
            spec = call.spec
            tokens = (outcome.prompt_tokens or spec.input_tokens, outcome.completion_tokens or spec.output_tokens)
            self.scheduler.on_finish(call, now, observed_s=observed, tokens=tokens)
            st.failures = 0
            st.sent += 1
            self.metrics.call_done(st.name, call.kind, now - call.ready_at, observed, call.t_comp)
            predicted = self.under_load_s(st, call, now, tokens)
            st.add_recent(observed / predicted if predicted > 0 else 1.0)
            self._deliver(call, outcome)
            self._judge(st)
        else:
            self.scheduler.on_fail(call, now)
            if isinstance(outcome, asyncio.CancelledError):
                if call.requeue and self._running:
                    # The worker was removed with this call still running: run it elsewhere, lose nothing.
                    call.requeue = False
                    call.attempts -= 1
                    self.metrics.for_worker(self.metrics.retries, st.name).inc()
                    self._after_call(st)
                    self.submit(call)
                    return True
                self._deliver(call, CallFailed("the call was cancelled", status=503))
            elif isinstance(outcome, WorkerError):
                self._worker_failed(st, call, str(outcome), refused=outcome.refused)
            elif isinstance(outcome, CallFailed):
                self.metrics.for_worker(self.metrics.failures, st.name, "rejected").inc()
                self._deliver(call, outcome)
            else:
                log.error("call %s on %s failed unexpectedly", call.id, st.name, exc_info=outcome)
                self._worker_failed(st, call, f"unexpected error: {outcome!r}", refused=False)
        self._after_call(st)
        return False

    def _after_call(self, st: WorkerState) -> None:
        """A call left the worker: refill it at once, or finish its removal once nothing is in flight."""
        if st.removing:
            if not st.inflight:
                self._finish_removal(st)
        elif self._running:
            self._drain(st)

    def _resubmit(self, call: LiveCall) -> None:
        """Dispatch a failed call again, to a worker that has not failed it while any such takes calls."""
        avoid = [w for w in self.states.values() if w.name in call.failed_on and w.eligible]
        if not avoid or self.healthy <= len(avoid):
            self.submit(call)
            return
        for w in avoid:
            self.scheduler.set_eligible(w.index, False)
        try:
            self.submit(call)
        finally:
            for w in avoid:
                self.scheduler.set_eligible(w.index, True)

    def status(self) -> list[dict[str, Any]]:
        """Per-worker state for ``/v1/status``."""
        now = self.clock()
        return [st.status(now) for st in self.workers]

    def _worker_failed(self, st: WorkerState, call: LiveCall, reason: str, *, refused: bool) -> None:
        """``call`` failed on ``st``: count it, judge the worker (eject, mark down), then fail or retry the call."""
        st.failures += 1
        st.failed += 1
        call.last_error = f"{st.name}: {reason}"
        call.failed_on.add(st.name)
        self.metrics.for_worker(self.metrics.failures, st.name, "worker_error").inc()
        log.warning("call %s failed on worker %s (attempt %d): %s", call.id, st.name, call.attempts, reason)
        if not refused:  # a refused connection is a worker gone (restarting), not an outlier: health handles it
            st.add_recent(None)
            self._judge(st)
        if refused or st.failures >= self.failures_to_down:
            self.mark_down(st, reason)
        if call.streamed:
            self._deliver(call, CallFailed(f"worker {st.name} failed mid-stream: {reason}", 502))
        elif call.attempts >= self.max_attempts:
            self._deliver(call, CallFailed(f"call failed after {call.attempts} attempts; last: {call.last_error}", 502))
        else:
            self.metrics.for_worker(self.metrics.retries, st.name).inc()
            self._resubmit(call)

    def is_member(self, st: WorkerState) -> bool:
        """Whether ``st`` is still in the pool (not finished removing; not replaced under its name)."""
        return self.states.get(st.index) is st

    def _deliver(self, call: LiveCall, outcome: CallResult | CallFailed) -> None:
        """Run the call's callback once (a failing callback is logged, never lost in the pool)."""
        cb, call.on_done = call.on_done, None
        if cb is None:
            return
        try:
            cb(call, outcome)
        except Exception:
            log.exception("completion handler of call %s failed", call.id)

    def _judge(self, st: WorkerState) -> None:
        """Eject ``st`` when its recent calls make it an outlier among the workers taking calls (a worker
        marked down is judged too: the health probe that brings it back may pass while its calls fail)."""
        if st.ejected or st.removing or not self.is_member(st):
            return
        reason = self.outliers.judge(st, list(self.states.values()))
        if reason is not None:
            self.eject(st, reason)

    def eject(self, st: WorkerState, reason: str) -> None:
        """Take an outlier out of dispatch for its back-off (queue re-dispatched; in-flight calls finish)."""
        st.ejected_reason = reason
        log.error("worker %s ejected for %g s: %s", st.name, self._back_off(st, "ejected"), reason)
        self._sync(st)

    def readmit(self, st: WorkerState) -> None:
        """A probe call answered: the ejected worker takes calls again, with a clean window."""
        if not st.ejected:
            return
        st.ejected_until = None
        st.clear_recent()
        st.failures = 0
        st.readmitted_at = self.clock()
        log.info("worker %s re-admitted: its probe call answered", st.name)
        self.events.append((st.readmitted_at, st.name, "readmitted"))
        self._sync(st)

    def probe_failed(self, st: WorkerState, reason: str) -> None:
        """A probe call failed: the worker stays ejected for another, longer back-off."""
        if not st.ejected:
            return
        length = self._back_off(st, "probe_failed")
        log.warning("worker %s stays ejected for %g s: its probe call failed: %s", st.name, length, reason)

    def _back_off(self, st: WorkerState, event: str) -> float:
        """Start ``st``'s next ejection back-off now (recorded as ``event``); returns its length."""
        now = self.clock()
        length = self.outliers.backoff(st, now)
        st.ejections += 1
        st.ejected_until = now + length
        self.events.append((now, st.name, event))
        self.metrics.for_worker(self.metrics.ejections, st.name).inc()
        return length

    def mark_down(self, st: WorkerState, reason: str) -> None:
        """Take a worker out of dispatch and re-dispatch its queue (in-flight calls finish or fail)."""
        if not st.up:
            return
        if not st.removing:
            log.error("worker %s marked down: %s", st.name, reason)
        st.up = False
        self.events.append((self.clock(), st.name, "down"))
        self._sync(st)

    def mark_up(self, st: WorkerState) -> None:
        """Put a worker back into dispatch and re-dispatch parked calls."""
        st.failures = 0
        if st.up:
            return
        log.info("worker %s is up again", st.name)
        st.up = True
        self.events.append((self.clock(), st.name, "up"))
        self._sync(st)

    def expire_parked(self) -> None:
        """Fail parked calls that waited longer than ``parked_timeout_s`` for a healthy worker."""
        now = self.clock()
        keep: deque[LiveCall] = deque()
        for c in self.parked:
            if c.parked_at is not None and now - c.parked_at > self.parked_timeout_s:
                self._deliver(
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
