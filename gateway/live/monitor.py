"""Health probes and ``/metrics`` scrapes of the pool's workers: two background tasks the pool owns, on the
event loop. Health marks workers up or down, expires parked calls and probes ejected workers; a scrape is
kept on ``WorkerState``, exported, and holds dispatch while the engine is full and vLLM's queue grows."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from gateway.live.outliers import probe_call
from gateway.live.worker_state import WorkerState
from gateway.profiling.promparse import WorkerMetrics, parse_worker_metrics

if TYPE_CHECKING:  # the pool owns the monitor; the monitor acts on the pool
    from gateway.live.pool import WorkerPool

log = logging.getLogger("hexflow.pool")

HOLD_KV_USAGE = 0.9
"""KV-cache usage (0..1) from which an engine with a growing waiting queue counts as full (see ``apply_scrape``)."""


async def cancel_and_wait(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel every task of ``tasks``, then wait for each to end (its ``CancelledError`` swallowed)."""
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t


async def stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    """Wait at most ``seconds`` for ``stop`` to be set; True when it is."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


class WorkerMonitor:
    """The health prober and the metrics scraper of one ``WorkerPool`` (a period of 0 disables a task)."""

    def __init__(self, pool: WorkerPool, *, health_period_s: float, scrape_period_s: float) -> None:
        self.pool = pool
        self.health_period_s = health_period_s
        self.scrape_period_s = scrape_period_s
        self._tasks: list[asyncio.Task[None]] = []
        self._probes: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Start the enabled background tasks."""
        if self.health_period_s > 0:
            self._tasks.append(asyncio.create_task(self._every(self.health_period_s, self.check_health), name="health"))
        if self.scrape_period_s > 0:
            self._tasks.append(asyncio.create_task(self._every(self.scrape_period_s, self.scrape_all), name="scrape"))

    async def stop(self) -> None:
        """Cancel the background tasks and wait for them."""
        await cancel_and_wait([*self._tasks, *self._probes])
        self._tasks.clear()
        self._probes.clear()

    @staticmethod
    async def _every(period_s: float, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            await step()
            await asyncio.sleep(period_s)

    async def check_health(self, *, initial: bool = False) -> None:
        """Probe every worker once, concurrently; update up/down; expire parked calls. ``initial``: a worker that
        does not answer the first probe starts down."""
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
        self.probe_ejected()

    def probe_ejected(self) -> list[asyncio.Task[None]]:
        """Start a probe call to every ejected worker whose back-off is over (one at a time per worker)."""
        pool = self.pool
        now = pool.clock()
        started: list[asyncio.Task[None]] = []
        for st in pool.workers:
            if st.ejected_until is None or st.probing or st.removing or now < st.ejected_until:
                continue
            st.probing = True
            t = asyncio.create_task(self._probe(st), name=f"probe-{st.name}")
            self._probes.add(t)
            t.add_done_callback(self._probes.discard)
            started.append(t)
        return started

    async def _probe(self, st: WorkerState) -> None:
        pool = self.pool
        timeout = pool.outliers.cfg.probe_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await pool.transport.send(st.info, probe_call(pool.clock()))
        except Exception as exc:  # WorkerError, CallFailed, a timeout: the worker is not back
            reason = f"no answer within {timeout:g} s" if isinstance(exc, TimeoutError) else str(exc) or repr(exc)
            if pool.is_member(st):
                pool.probe_failed(st, reason)
        else:
            if pool.is_member(st):
                pool.readmit(st)
        finally:
            st.probing = False

    async def scrape_all(self) -> None:
        """Scrape every worker's ``/metrics`` concurrently; update the waiting-queue hold."""
        pool = self.pool

        async def one(st: WorkerState) -> None:
            try:
                text = await pool.transport.scrape(st.info)
                m = parse_worker_metrics(text, st.info.served_model)
            except Exception as exc:  # unreachable, an error status, or a text that does not parse
                if pool.is_member(st):
                    pool.metrics.for_worker(pool.metrics.scrape_failures, st.name).inc()
                log.debug("scrape of %s failed: %s", st.name, exc)
                return
            if pool.is_member(st):  # removed while the scrape was in flight: its series are gone for good
                self.apply_scrape(st, m)

        await asyncio.gather(*(one(st) for st in pool.workers))

    def apply_scrape(self, st: WorkerState, m: WorkerMetrics) -> None:
        """Record a scrape; hold dispatch to a worker whose engine is full (KV cache at ``HOLD_KV_USAGE`` or the
        batch at ``max_num_seqs``; without either gauge, a queue waiting twice) while its waiting queue grows."""
        prev = st.metrics.waiting if st.metrics is not None else None
        st.metrics = m
        st.scraped_at = self.pool.clock()
        waiting = m.waiting or 0.0
        was_held = st.held
        growing = waiting > 0 and prev is not None and waiting > prev
        if m.kv_cache_usage is None and m.running is None:
            full = prev is not None and prev > 0
        else:
            full = (m.kv_cache_usage or 0.0) >= HOLD_KV_USAGE or (m.running or 0.0) >= st.info.profile.max_num_seqs
        st.held = growing and full
        self.pool.metrics.scraped(st.name, m)
        if was_held and not st.held:
            self.pool.kick(st)
