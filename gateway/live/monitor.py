"""Health probes and ``/metrics`` scrapes of the pool's workers: two background tasks the pool owns.

* health: every ``health_period_s`` each worker's ``/health`` is probed, concurrently. A success marks
  the worker up (``WorkerPool.mark_up``); ``failures_to_down`` consecutive failures (counted with the
  call failures) mark it down. Parked calls that waited too long are failed afterwards
  (``WorkerPool.expire_parked``).
* scrape: every ``scrape_period_s`` each worker's ``/metrics`` is fetched, concurrently, and parsed by
  ``promparse``. The result is kept on the worker's ``WorkerState`` (``/v1/status`` shows it) and
  exported as gateway metrics; dispatch to a worker is *held* while vLLM's own waiting queue grows
  (``WorkerPool.can_send``), and released (the drain loop kicked) once it stops growing.

Everything runs on the event loop, like the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.live.promparse import WorkerMetrics, parse_worker_metrics
from gateway.live.worker_state import WorkerState

if TYPE_CHECKING:  # the pool owns the monitor; the monitor acts on the pool
    from gateway.live.pool import WorkerPool

log = logging.getLogger("hexflow.pool")


class WorkerMonitor:
    """The health prober and the metrics scraper of one ``WorkerPool``.

    Args:
        pool: the pool whose workers are watched (its transport, metrics, clock and failure threshold).
        health_period_s, scrape_period_s: task periods; 0 disables a task (tests call its method).
    """

    def __init__(self, pool: WorkerPool, *, health_period_s: float, scrape_period_s: float) -> None:
        self.pool = pool
        self.health_period_s = health_period_s
        self.scrape_period_s = scrape_period_s
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the enabled background tasks."""
        if self.health_period_s > 0:
            self._tasks.append(asyncio.create_task(self._every(self.health_period_s, self.check_health), name="health"))
        if self.scrape_period_s > 0:
            self._tasks.append(asyncio.create_task(self._every(self.scrape_period_s, self.scrape_all), name="scrape"))

    async def stop(self) -> None:
        """Cancel the background tasks and wait for them."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()

    @staticmethod
    async def _every(period_s: float, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            await step()
            await asyncio.sleep(period_s)

    # ------------------------------------------------------------------ health

    async def check_health(self, *, initial: bool = False) -> None:
        """Probe every worker once, concurrently; update up/down; expire parked calls.

        ``initial``: the probe at start; a worker that does not answer it starts down (it joins when a
        later probe succeeds), so readiness means a worker really answered.
        """
        pool = self.pool

        async def one(st: WorkerState) -> None:
            try:
                ok = await pool.transport.probe(st.info)
            except Exception:
                ok = False
            if ok:
                pool.mark_up(st)
            elif st.up:
                st.failures += 1
                if initial or st.failures >= pool.failures_to_down:
                    pool.mark_down(st, "health probe failed")

        await asyncio.gather(*(one(st) for st in pool.workers if not st.removing))
        pool.expire_parked()

    # ------------------------------------------------------------------ scrape

    async def scrape_all(self) -> None:
        """Scrape every worker's ``/metrics`` concurrently; update the waiting-queue hold."""
        pool = self.pool

        async def one(st: WorkerState) -> None:
            try:
                text = await pool.transport.scrape(st.info)
                m = parse_worker_metrics(text, st.info.served_model)
            except Exception as exc:  # unreachable, an error status, or a text that does not parse
                if pool.is_member(st):
                    pool.metrics.scrape_failure(st.name)
                log.debug("scrape of %s failed: %s", st.name, exc)
                return
            if pool.is_member(st):  # removed while the scrape was in flight: its series are gone for good
                self.apply_scrape(st, m)

        await asyncio.gather(*(one(st) for st in pool.workers))

    def apply_scrape(self, st: WorkerState, m: WorkerMetrics) -> None:
        """Record a scrape; hold dispatch to a worker whose vLLM waiting queue is growing."""
        prev = st.metrics.waiting if st.metrics is not None else None
        st.metrics = m
        st.scraped_at = self.pool.clock()
        waiting = m.waiting or 0.0
        was_held = st.held
        st.held = waiting > 0 and prev is not None and waiting > prev
        self.pool.metrics.scraped(st.name, m)
        if was_held and not st.held:
            st.kick.set()
