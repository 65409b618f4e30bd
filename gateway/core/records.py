"""What every driver reports of a call and of a workflow: ``CallOutcome`` and ``WorkflowOutcome``.

One type each, used by the live gateway (its runner, the responses and the status page's history) and the
simulator (``SimResult``); the API's ``CallReport``, which the replay client parses responses into, is built
from a ``CallOutcome``. Times are absolute, on the driver's clock (the gateway's monotonic seconds live,
virtual seconds simulated). What only one driver knows rides in a field the other leaves at its default: the
engine's finish time (``engine_done``, the simulator's), the worker's answer and the error (``answer`` and
``error``, live), the knobs a degradable workflow ran at (the simulator's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from gateway.core.degrade import Knobs
from gateway.core.workflow import deadline_met
from gateway.errors import CallFailed

__all__ = ["CallOutcome", "WorkflowOutcome"]

A = TypeVar("A")


@dataclass(frozen=True, slots=True)
class CallOutcome(Generic[A]):
    """One call of a workflow, once it returned or failed for good.

    ``node``: its index in the workflow (a DAG's node, or its place in its stage; -1 unknown); ``worker`` the
    scheduler's index of the worker of its last attempt (-1: never placed), ``worker_name`` that worker's name;
    ``ready``/``start``/``result``: queued at the gateway (its last attempt), sent to (started on) the worker
    (None: never sent), returned or failed as the gateway sees it; ``queued_s``/``run_s``: the last attempt's
    seconds queued and on the worker; ``budget_s``: its stage budget; ``engine_done``: when the engine finished
    it (simulator only); ``ok``: it did not fail; ``answer``: what the worker answered (live: its response);
    ``error``: why it failed for good (live; a record kept for long, the status page's, keeps neither).
    """

    wid: int
    node: int
    kind: str
    ready: float
    result: float
    worker: int = -1
    worker_name: str | None = None
    start: float | None = None
    queued_s: float = 0.0
    run_s: float = 0.0
    attempts: int = 0
    budget_s: float = 0.0
    engine_done: float | None = None
    ok: bool = True
    answer: A | None = None
    error: CallFailed | None = None


@dataclass(frozen=True, slots=True)
class WorkflowOutcome(Generic[A]):
    """One workflow that ended.

    ``status``: how it ended in the driver's words (live: ``ok``/``failed`` for its caller, the goodput outcome in
    the status page's history; simulated: ``ok``). ``arrival``, ``deadline`` and ``finish`` are absolute.
    ``calls``: the call outcomes it carries (live: its settled calls, in node order for its caller, the first
    ``MAX_CALLS`` by ready time in the history; simulated: none, ``SimResult.calls`` has them), ``ncalls`` how
    many calls it made. ``id``: the id its client got; ``route``: the route it came by (the status page's
    label); ``request_id``: the request's ``X-Request-Id``; ``knobs``/``full_knobs``: the setting a degradable
    simulated workflow ran at and its full quality (None: full quality, or not degradable).
    """

    wid: int
    tenant: str
    arrival: float
    deadline: float
    finish: float
    status: str = "ok"
    calls: tuple[CallOutcome[A], ...] = ()
    ncalls: int = 0
    error: CallFailed | None = None
    id: str | None = None
    route: str | None = None
    request_id: str | None = None
    knobs: Knobs | None = None
    full_knobs: Knobs | None = None

    @property
    def latency(self) -> float:
        """End-to-end latency in seconds."""
        return self.finish - self.arrival

    @property
    def met(self) -> bool:
        """Finished by its deadline (core's ``deadline_met``, the one rule)."""
        return deadline_met(self.finish, self.deadline)

    @property
    def degraded(self) -> bool:
        """Whether degradation removed work of this workflow."""
        return self.knobs is not None and self.knobs != self.full_knobs
