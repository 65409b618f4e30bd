"""How the live gateway's workflows began and ended: ``Accounting.begin`` counts a workflow in (admission bounds
and the drain read the counts), ``Accounting.end`` counts it out once, whatever ended it, into the metrics,
the rolling outcome window and the history (``gateway.live.history``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gateway.core.records import WorkflowOutcome
from gateway.core.workflow import Workflow
from gateway.live.history import OutcomeWindow, WorkflowHistory, goodput_outcome, kept_calls
from gateway.live.logs import REQUEST_ID
from gateway.live.tenants import Tenant

if TYPE_CHECKING:
    from gateway.live.runner import LiveOutcome
    from gateway.live.service import Gateway

__all__ = ["Accounting"]

log = logging.getLogger("hexflow.gateway")


class Accounting:
    """The workflows in progress and the memory of those that ended, for one gateway."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        admin = gw.cfg.admin
        self.outcome_window = OutcomeWindow(admin.window_s)
        self.history = WorkflowHistory(admin.recent_workflows)
        self.active: dict[str, int] = {}
        self.active_total = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self._running: set[object] = set()

    def begin(self, ex: object, tenant: Tenant) -> None:
        """A workflow (``ex``: what stands for it while it runs) starts for ``tenant``."""
        self.active[tenant.name] = self.active.get(tenant.name, 0) + 1
        self.active_total += 1
        self.idle.clear()
        self.gw.metrics.active.set(self.active_total)
        self._running.add(ex)

    def end(
        self,
        ex: object,
        wf: Workflow,
        tenant: Tenant,
        outcome: str,
        latency: float | None,
        *,
        valid: bool,
        calls: Sequence[LiveOutcome | None],
        wf_id: str | None,
        route: str,
    ) -> bool:
        """``ex`` (running ``wf``) ended with ``outcome``; False when it was counted out already (``calls``: its calls'
        outcomes, None: not settled; ``wf_id``: its client's id; ``route``: its status page label)."""
        if ex not in self._running:
            return False
        self._running.discard(ex)
        if log.isEnabledFor(logging.DEBUG):  # (not formatting the latency for a line nobody reads)
            # (the request's context carries its request and workflow ids into this line: gateway.live.logs)
            tail = "" if latency is None else f" in {latency:.3f} s"
            log.debug("workflow of tenant %s ended: %s%s", tenant.name, outcome, tail)
        self._ended(wf, tenant.name, outcome, valid, calls, wf_id, route)
        self.active[tenant.name] = max(self.active.get(tenant.name, 1) - 1, 0)
        self.active_total -= 1
        metrics = self.gw.metrics
        metrics.active.set(self.active_total)
        metrics.workflow_done(tenant.name, latency, outcome)
        if self.active_total == 0:
            self.idle.set()
        return True

    def rejected(self, tenant: str, reason: str) -> None:
        """Count a workflow refused at admission, and why (one of ``metrics.REJECT_REASONS``)."""
        metrics = self.gw.metrics
        metrics.workflow_done(tenant, None, "rejected")
        metrics.rejection(tenant, reason)
        metrics.workflow_outcome(tenant, "rejected")
        self.outcome_window.add(tenant, "rejected", self.gw.clock())

    def _ended(
        self,
        wf: Workflow,
        tenant: str,
        status: str,
        valid: bool,
        calls: Sequence[LiveOutcome | None],
        wf_id: str | None,
        route: str,
    ) -> None:
        """Account a workflow that ran and ended: its goodput outcome and its timeline in the history, under its
        client's id (``wf_id``, else its request's ``X-Request-Id``)."""
        now = self.gw.clock()
        outcome = goodput_outcome(status, valid=valid)
        self.gw.metrics.workflow_outcome(tenant, outcome)
        self.outcome_window.add(tenant, outcome, now)
        rid = REQUEST_ID.get()  # the X-Request-Id the client got (its request's context)
        kept, n = kept_calls(calls)
        self.history.add(
            WorkflowOutcome(
                wf.wid,
                tenant,
                wf.arrival,
                wf.deadline,
                now,
                outcome,
                kept,
                n,
                id=wf_id or rid or f"{route}-{wf.wid}",
                route=route,
                request_id=rid,
            )
        )
