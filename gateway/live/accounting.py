"""How the live gateway's workflows began and ended: ``Accounting.begin`` counts a workflow in (admission bounds
and the drain read the counts), ``Accounting.end`` counts it out once, whatever ended it, into the metrics,
the rolling outcome window and the history (``gateway.live.history``)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.core.records import WorkflowOutcome
from gateway.core.workflow import Workflow
from gateway.live.history import OutcomeWindow, WorkflowHistory, goodput_outcome, kept_calls
from gateway.live.logs import REQUEST_ID
from gateway.live.tenants import Tenant

if TYPE_CHECKING:
    from gateway.live.runner import LiveOutcome
    from gateway.live.service import Gateway

__all__ = ["Accounting", "Running"]

log = logging.getLogger("hexflow.gateway")


@dataclass(eq=False, slots=True)
class Running:
    """A workflow while it runs, as ``Accounting`` counts it: its tenant, client id (``wf_id``), status page
    label (``route``) and its calls' outcomes (None: not settled)."""

    wf: Workflow
    tenant: Tenant
    route: str
    wf_id: str | None
    outcomes: list[LiveOutcome | None]


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
        self._running: set[Running] = set()

    def begin(self, run: Running) -> None:
        """A workflow starts for its tenant."""
        tenant = run.tenant.name
        self.active[tenant] = self.active.get(tenant, 0) + 1
        self.active_total += 1
        self.idle.clear()
        self.gw.metrics.active.set(self.active_total)
        self._running.add(run)

    def end(self, run: Running, outcome: str, latency: float | None, *, valid: bool = True) -> bool:
        """``run`` ended with ``outcome``; False when it was counted out already. Its goodput outcome goes to the
        metrics and the window, its timeline to the history under its client's id (``wf_id``, else its request's
        ``X-Request-Id``)."""
        if run not in self._running:
            return False
        self._running.discard(run)
        tenant, wf = run.tenant.name, run.wf
        if log.isEnabledFor(logging.DEBUG):  # (not formatting the latency for a line nobody reads)
            # (the request's context carries its request and workflow ids into this line: gateway.live.logs)
            tail = "" if latency is None else f" in {latency:.3f} s"
            log.debug("workflow of tenant %s ended: %s%s", tenant, outcome, tail)
        now = self.gw.clock()
        metrics = self.gw.metrics
        goodput = goodput_outcome(outcome, valid=valid)
        metrics.workflow_outcome(tenant, goodput)
        self.outcome_window.add(tenant, goodput, now)
        rid = REQUEST_ID.get()  # the X-Request-Id the client got (its request's context)
        kept, n = kept_calls(run.outcomes)
        wf_id = run.wf_id or rid or f"{run.route}-{wf.wid}"
        ended = WorkflowOutcome(
            wf.wid, tenant, wf.arrival, wf.deadline, now, goodput, kept, n, id=wf_id, route=run.route, request_id=rid
        )
        self.history.add(ended)
        self.active[tenant] = max(self.active.get(tenant, 1) - 1, 0)
        self.active_total -= 1
        metrics.active.set(self.active_total)
        metrics.workflow_done(tenant, latency, outcome)
        if self.active_total == 0:
            self.idle.set()
        return True

    def rejected(self, tenant: str, reason: str) -> None:
        """Count a workflow refused at admission, and why (one of ``metrics.REJECT_REASONS``)."""
        metrics = self.gw.metrics
        metrics.workflow_done(tenant, None, "rejected")
        metrics.for_tenant(metrics.rejections, tenant, reason).inc()
        metrics.workflow_outcome(tenant, "rejected")
        self.outcome_window.add(tenant, "rejected", self.gw.clock())
