"""Queue disciplines (``fcfs``, ``urgency``, ``edf``, ``llf``, ``vtc``), each with a best-effort lane behind it;
ties go to submission order (docs/architecture.md, "Queue disciplines")."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from gateway.core.workflow import Call


def _discard(q: deque[Call], call: Call) -> bool:
    """Remove ``call`` from ``q``; False when it is not there."""
    try:
        q.remove(call)
    except ValueError:
        return False
    return True


class WorkerQueue(Protocol):
    """One worker's gateway-held queue."""

    def push(self, call: Call) -> None:
        """Add a call whose scheduling fields are filled."""
        ...

    def pop(self, now: float) -> Call | None:
        """Remove and return the next call, or None when empty."""
        ...

    def remove(self, call: Call) -> bool:
        """Remove a specific call (cancellation, worker removal); True if it was queued."""
        ...

    def set_tenant_weights(self, weights: dict[str, float]) -> None:
        """Tenants' share weights, for a discipline that uses them (``vtc``); others ignore them."""
        ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Call]: ...


class FcfsQueue:
    """First come, first served."""

    def __init__(self) -> None:
        self._q: deque[Call] = deque()

    def push(self, call: Call) -> None:
        """Append at the tail."""
        self._q.append(call)

    def pop(self, now: float) -> Call | None:
        """The oldest call."""
        return self._q.popleft() if self._q else None

    def remove(self, call: Call) -> bool:
        """Remove a specific call."""
        return _discard(self._q, call)

    def set_tenant_weights(self, weights: dict[str, float]) -> None:
        """First come, first served: no weights."""

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Call]:
        return iter(list(self._q))


class KeyedQueue:
    """A min-heap on a static key computed at push; removal is lazy."""

    def __init__(self, key: Callable[[Call], float]) -> None:
        self._key = key
        self._heap: list[tuple[float, int, Call]] = []
        self._removed: set[int] = set()
        self._n = 0

    def push(self, call: Call) -> None:
        """Insert with the discipline's key; ``call.key`` records it for status pages and tests."""
        call.key = self._key(call)
        heapq.heappush(self._heap, (call.key, call.seq, call))
        self._n += 1

    def pop(self, now: float) -> Call | None:
        """The call with the smallest key."""
        while self._heap:
            _, entry, call = heapq.heappop(self._heap)
            if entry in self._removed:
                self._removed.discard(entry)
                continue
            self._n -= 1
            return call
        return None

    def remove(self, call: Call) -> bool:
        """Mark a call's live entry removed (by the ``seq`` it was pushed with: a resubmitted call gets a new one)."""
        for _, entry, c in self._heap:
            if c is call and entry not in self._removed:
                self._removed.add(entry)
                self._n -= 1
                return True
        return False

    def set_tenant_weights(self, weights: dict[str, float]) -> None:
        """A static key per call: no weights."""

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Call]:
        return iter([c for _, e, c in sorted(self._heap, key=lambda e: (e[0], e[1])) if e not in self._removed])


def urgency_key(call: Call) -> float:
    """Ascending order of this key is descending urgency ``t_comp - (budget - waited)``."""
    return call.ready_at + call.budget - call.t_comp


def edf_key(call: Call) -> float:
    """The workflow's absolute deadline."""
    return call.deadline


def llf_key(call: Call) -> float:
    """Laxity plus ``now``: deadline minus this call's and the workflow's expected remaining work."""
    return call.deadline - call.t_comp - call.remaining_cost


class VtcCounters:
    """Per-tenant virtual token counters shared by every worker queue of one scheduler."""

    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0) -> None:
        self.input_weight = input_weight
        self.output_weight = output_weight
        self.counter: dict[str, float] = {}
        self.backlog: dict[str, int] = {}
        self.weights: dict[str, float] = {}
        """Tenant share weights (weighted VTC): service is charged divided by the weight, so a tenant
        of weight 2 gets twice the tokens of a weight-1 tenant while both are backlogged. Default 1."""

    def on_enqueue(self, tenant: str) -> None:
        """A call of ``tenant`` was queued; lift the counter if the tenant just became backlogged."""
        if self.backlog.get(tenant, 0) == 0:
            active = [self.counter.get(t, 0.0) for t, n in self.backlog.items() if n > 0]
            floor = min(active) if active else max(self.counter.values(), default=0.0)
            self.counter[tenant] = max(self.counter.get(tenant, 0.0), floor)
        self.backlog[tenant] = self.backlog.get(tenant, 0) + 1

    def on_dequeue(self, call: Call) -> None:
        """Charge the tenant for the call's service."""
        t = call.tenant
        self.backlog[t] -= 1
        cost = self.input_weight * call.spec.input_tokens + self.output_weight * call.spec.output_tokens
        self.counter[t] = self.counter.get(t, 0.0) + cost / self.weights.get(t, 1.0)


class VtcQueue:
    """Per-tenant FIFOs; serves the backlogged tenant with the smallest shared counter."""

    def __init__(self, counters: VtcCounters) -> None:
        self._c = counters
        self._by_tenant: dict[str, deque[Call]] = {}
        self._n = 0

    def push(self, call: Call) -> None:
        """Append to the tenant's FIFO."""
        self._c.on_enqueue(call.tenant)
        self._by_tenant.setdefault(call.tenant, deque()).append(call)
        self._n += 1

    def pop(self, now: float) -> Call | None:
        """Oldest call of the tenant with the smallest counter (ties: oldest call)."""
        best: tuple[float, int] | None = None
        best_q: deque[Call] | None = None
        for tenant, q in self._by_tenant.items():
            if not q:
                continue
            rank = (self._c.counter.get(tenant, 0.0), q[0].seq)
            if best is None or rank < best:
                best, best_q = rank, q
        if best_q is None:
            return None
        call = best_q.popleft()
        self._n -= 1
        self._c.on_dequeue(call)
        return call

    def remove(self, call: Call) -> bool:
        """Remove a specific call without charging its tenant."""
        q = self._by_tenant.get(call.tenant)
        if q is None or call not in q:
            return False
        q.remove(call)
        self._n -= 1
        self._c.backlog[call.tenant] -= 1
        return True

    def set_tenant_weights(self, weights: dict[str, float]) -> None:
        """Weighted VTC: the shared counters charge each tenant's service divided by its weight (positive weights
        only; a tenant without one weighs 1)."""
        self._c.weights = {t: w for t, w in weights.items() if w > 0}

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Call]:
        return iter(sorted((c for q in self._by_tenant.values() for c in q), key=lambda c: c.seq))


class LanedQueue:
    """A discipline's queue with a best-effort lane behind it (see the module docstring)."""

    def __init__(self, primary: WorkerQueue) -> None:
        self._primary = primary
        self._low: deque[Call] = deque()

    def push(self, call: Call) -> None:
        """Queue by the discipline, or at the tail of the best-effort lane."""
        if call.best_effort:
            self._low.append(call)
        else:
            self._primary.push(call)

    def pop(self, now: float, best_effort: bool = True) -> Call | None:
        """The discipline's next call; a best-effort call only when the discipline has none and ``best_effort``
        (the scheduler passes False while the worker is too busy to start one)."""
        c = self._primary.pop(now)
        if c is None and best_effort and self._low:
            c = self._low.popleft()
        return c

    def remove(self, call: Call) -> bool:
        """Remove a specific call from whichever lane holds it."""
        return self._primary.remove(call) or _discard(self._low, call)

    def set_tenant_weights(self, weights: dict[str, float]) -> None:
        """Pass the tenants' share weights to the discipline (the best-effort lane is first come, first served)."""
        self._primary.set_tenant_weights(weights)

    def __len__(self) -> int:
        return len(self._primary) + len(self._low)

    def __iter__(self) -> Iterator[Call]:
        return iter([*self._primary, *self._low])


QueueFactory = Callable[[], WorkerQueue]
"""Makes one worker's queue. Built per scheduler by a ``QueueFamily``, so shared state stays local."""

QueueFamily = Callable[[], QueueFactory]
"""Makes the per-scheduler factory (a fresh VTC counter set per scheduler, for example)."""

LanedFactory = Callable[[], LanedQueue]
"""Makes one worker's queue with its best-effort lane (what a discipline's ``family`` builds, per scheduler)."""


@dataclass(frozen=True)
class QueueDiscipline:
    """A registered discipline: ``family()`` builds one scheduler's factory of laned worker queues;
    ``deadline_ordered``: earlier deadlines first (admission then counts only the work due no later)."""

    name: str
    family: Callable[[], LanedFactory]
    deadline_ordered: bool = False


QUEUES: dict[str, QueueDiscipline] = {}


def register_queue(name: str, family: QueueFamily, *, deadline_ordered: bool = False) -> None:
    """Register a queue discipline; a duplicate name raises. Its queues get a best-effort lane."""
    if name in QUEUES:
        raise ValueError(f"queue discipline {name!r} already registered")

    def laned() -> LanedFactory:
        make = family()
        return lambda: LanedQueue(make())

    QUEUES[name] = QueueDiscipline(name, laned, deadline_ordered)


register_queue("fcfs", lambda: FcfsQueue)
register_queue("urgency", lambda: partial(KeyedQueue, urgency_key), deadline_ordered=True)
register_queue("edf", lambda: partial(KeyedQueue, edf_key), deadline_ordered=True)
register_queue("llf", lambda: partial(KeyedQueue, llf_key), deadline_ordered=True)
register_queue("vtc", lambda: partial(VtcQueue, VtcCounters()))  # one counter set per scheduler
