"""What every driver (live gateway, simulator) reports of a call and of a workflow. Times are absolute, on the
driver's clock; what only one driver knows rides in a field the other leaves at its default."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from gateway.core.degrade import Knobs
from gateway.core.workflow import deadline_met
from gateway.errors import CallFailed

A = TypeVar("A")


# Not frozen (nothing changes them): a frozen dataclass's __init__ sets each field through object.__setattr__, about
# six times the instructions of a plain one, and the live gateway builds two of each record per chat call.
@dataclass(slots=True)
class CallOutcome(Generic[A]):
    """One call of a workflow, once it returned or failed for good (its last attempt's times and worker).

    ``node``: its index in the workflow (-1 unknown); ``worker``: -1 never placed; ``start``: None never sent;
    ``engine_done``: simulator only; ``answer``, ``error``: live only.
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


@dataclass(slots=True)
class WorkflowOutcome(Generic[A]):
    """One workflow that ended: ``status`` in the driver's words; ``calls`` its call outcomes (live only);
    ``knobs``/``full_knobs``: what a degradable simulated workflow ran at and its full quality."""

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
