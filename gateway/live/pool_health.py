"""The pool's health transitions: outlier ejection and re-admission, down and up, parked calls' expiry (each
recorded, logged and applied to the scheduler)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from gateway.errors import CallFailed
from gateway.live.metrics import GatewayMetrics
from gateway.live.outliers import OutlierDetector
from gateway.live.transport import CallResult, LiveCall
from gateway.live.worker_state import WorkerState

log = logging.getLogger("hexflow.pool")


class PoolHealth:
    """Health transitions of a ``WorkerPool``'s workers (a base of ``WorkerPool``, which provides the state
    declared here)."""

    clock: Callable[[], float]
    outliers: OutlierDetector
    metrics: GatewayMetrics
    events: deque[tuple[float, str, str]]
    parked: deque[LiveCall]
    parked_timeout_s: float
    max_attempts: int
    failures_to_down: int
    states: dict[int, WorkerState]
    _resubmit: Callable[[LiveCall], None]  # dispatch a failed call again
    _sync: Callable[[WorkerState], None]  # apply a worker's eligibility to the scheduler

    def _worker_failed(self, st: WorkerState, call: LiveCall, reason: str, *, refused: bool) -> None:
        """``call`` failed on ``st``: count it, judge the worker (eject, mark down), then fail or retry the call."""
        st.failures += 1
        st.failed += 1
        call.last_error = f"{st.name}: {reason}"
        call.failed_on.add(st.name)
        self.metrics.for_worker(self.metrics.failures, st.name, "worker_error").inc()
        log.warning("call %s failed on worker %s (attempt %d): %s", call.id, st.name, call.attempts, reason)
        if not refused:  # a refused connection is a worker gone (restarting), not an outlier: health handles it
            self.outliers.record(st, None)
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
