"""The live gateway's lifecycle: start, leadership, tenants reload, the overload watch, drain and stop
(``Lifecycle`` owns the background tasks and the gateway's ``ready`` and ``draining`` flags)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from gateway.core.admission import SHED_PERIOD_S
from gateway.live.monitor import cancel_and_wait, stopped_within

if TYPE_CHECKING:
    from gateway.live.service import Gateway

__all__ = ["Lifecycle"]

log = logging.getLogger("hexflow.gateway")


class Lifecycle:
    """Starts, leads, drains and stops one gateway (``gw``)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.leader_stop = asyncio.Event()
        self.leader_tasks: list[asyncio.Task[None]] = []
        self.drain_until: float | None = None

    async def start(self) -> None:
        """Start the pool and the background tasks; probe workers once so readiness is known. With discovery the
        first pod list is awaited (up to its timeout; without an answer it starts without them)."""
        gw = self.gw
        await gw.pool.start()
        if gw.discovery is not None:
            self.tasks.append(asyncio.create_task(gw.discovery.run(self.stopping), name="discovery"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gw.discovery.synced.wait(), gw.discovery.cfg.timeout_s)
        if gw.background:
            await gw.pool.monitor.check_health(initial=True)
            watch = gw.tenants.watch(gw.cfg.tenants_reload_s, self.stopping, self._tenants_reloaded)
            self.tasks.append(asyncio.create_task(watch, name="tenants-watch"))
            self.tasks.append(asyncio.create_task(self._shed_loop(), name="overload-shedding"))
        if gw.elector is not None:
            self.tasks.append(asyncio.create_task(gw.elector.run(self.stopping), name="leader-election"))
        else:
            self.on_leadership(True)
        gw.ready = True

    def on_leadership(self, leading: bool) -> None:
        """Start the leader-only tasks (alpha tuner, profile refit) when leading, stop them when not; every other
        task runs on every replica, so a follower can serve the moment it takes over."""
        gw = self.gw
        if gw.elector is not None:
            gw.metrics.leader.set(1 if leading else 0)
            gw.metrics.leader_changes.labels(event="acquired" if leading else "lost").inc()
        self.leader_stop.set()
        for t in self.leader_tasks:
            t.cancel()
        self.leader_tasks.clear()
        if not leading or self.stopping.is_set():
            return
        self.leader_stop = asyncio.Event()
        if gw.background and gw.tuner is not None and gw.scheduler.policy.uses_alpha:
            self.leader_tasks.append(asyncio.create_task(gw.tuner.run(self.leader_stop), name="alpha-tuner"))
        if gw.background and gw.refit is not None:
            self.leader_tasks.append(asyncio.create_task(gw.refit.run(self.leader_stop), name="profile-refit"))

    def begin_drain(self, grace_s: float) -> None:
        """Stop intake now and start the grace period, counted once from the first call."""
        self.gw.draining = True
        if self.drain_until is None:
            self.drain_until = time.monotonic() + grace_s

    async def drain(self, grace_s: float) -> bool:
        """Stop intake and wait for in-flight workflows until the grace period is over; True when all finished."""
        gw = self.gw
        self.begin_drain(grace_s)
        if gw.elector is not None:  # hand the Lease over now: a follower serves while this one drains
            for t in self.tasks:  # stop the election rounds first, so no round takes the Lease back
                if t.get_name() == "leader-election":
                    t.cancel()
            await gw.elector.release()
        assert self.drain_until is not None
        left = max(self.drain_until - time.monotonic(), 0.0)
        try:
            await asyncio.wait_for(gw.runner.idle.wait(), left)
        except TimeoutError:
            log.error("shutdown grace period over with %d workflows in progress", gw.active_total)
            return False
        return True

    async def stop(self) -> None:
        """Stop background tasks and the pool (calls still in flight fail with 503); close the transport."""
        gw = self.gw
        gw.ready = False
        self.stopping.set()
        self.leader_stop.set()
        await cancel_and_wait(self.tasks + self.leader_tasks)
        self.tasks.clear()
        self.leader_tasks.clear()
        if gw.elector is not None:
            await gw.elector.release()
            await gw.elector.close()
        if gw.idempotency is not None:
            await gw.idempotency.close()
        if gw.tuner is not None:
            gw.tuner.close()
        if gw.discovery is not None:
            await gw.discovery.close()
        await gw.pool.stop()
        await gw.transport.aclose()

    def _tenants_reloaded(self, ok: bool) -> None:
        """A reload of the tenants file swapped a new version in (``ok``) or failed (``TenantStore`` logs it)."""
        gw = self.gw
        gw.metrics.tenant_reloads.labels(result="ok" if ok else "failed").inc()
        if ok:
            tenants = gw.tenants.tenants
            gw.metrics.set_tenants(t.name for t in tenants)
            gw.outcome_window.forget(t.name for t in tenants)
            gw.scheduler.set_tenant_weights({t.name: t.priority_weight for t in tenants})

    async def _shed_loop(self) -> None:
        while not await stopped_within(self.stopping, SHED_PERIOD_S):
            try:
                self.gw.shed_overdue()
            except Exception:  # keep watching: a bug here must not stop the gateway's protection
                log.exception("overload check failed")
