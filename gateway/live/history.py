"""What the status page remembers of finished workflows: their outcomes and their calls' timings.

Three small pieces, all bounded and all fed by ``Gateway`` when a workflow ends:

* ``goodput_outcome``: the one rule that sorts an ended workflow into a ``GOODPUT_OUTCOMES`` value
  (``hexflow_workflow_outcomes_total``; goodput is ``met``: by its deadline *with a valid answer*);
* ``OutcomeWindow``: per tenant, the outcomes of the last ``window_s`` seconds in ``BUCKETS`` time
  buckets (attainment, goodput per second, and a goodput series for a sparkline);
* ``WorkflowHistory``: a ring buffer of the last finished workflows with one ``CallTiming`` per call
  (at most ``MAX_CALLS`` each), from which the page shows the slowest with their timelines.

Times are the gateway's clock (``time.monotonic`` live), passed in: nothing here reads a clock.
"""

from __future__ import annotations

import heapq
import operator
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

GOODPUT_OUTCOMES = ("met", "late", "no_valid_answer", "failed", "rejected", "cancelled")
"""How a workflow ended, for goodput: ``met`` (by its deadline with a valid answer: goodput), ``late`` (a
valid answer after the deadline), ``no_valid_answer`` (it finished, but a Text-to-SQL answer holds no valid
SQL; whether in time or not), ``failed`` (an error ended it), ``rejected`` (refused at admission, or shed
after it because it could no longer make its deadline), ``cancelled`` (its client went away first)."""

FINISHED = ("met", "late", "no_valid_answer", "failed")
"""The outcomes of workflows that ran to an end: SLO attainment is ``met`` over these (a rejected or cancelled
workflow is not counted against the SLO, as in the Prometheus rules)."""

BUCKETS = 30
"""Time buckets of an ``OutcomeWindow``: the window moves on in steps of ``window_s / BUCKETS``."""

MAX_CALLS = 64
"""Calls kept per workflow in ``WorkflowHistory`` (the first ones; the rest are only counted)."""


def goodput_outcome(status: str, *, valid: bool = True) -> str:
    """The goodput outcome of an ended workflow.

    ``status`` is the gateway's own (``hexflow_workflows_total``): ``met``, ``missed``, ``failed``,
    ``cancelled``, ``shed`` or ``rejected``. ``missed`` is split by ``valid`` (its answer is usable): an
    answer without valid SQL is ``no_valid_answer`` whenever it came (``met`` already means valid and in
    time: ``deadline_met``), a valid one after the deadline ``late``. ``shed`` (admitted, then dropped before
    it could finish late) counts as ``rejected``: the client was refused, with ``Retry-After``.
    """
    if status == "met":
        return "met" if valid else "no_valid_answer"
    if status == "missed":
        return "late" if valid else "no_valid_answer"
    if status == "shed":
        return "rejected"
    if status in ("failed", "cancelled", "rejected"):
        return status
    raise ValueError(f"unknown workflow status {status!r}")


class OutcomeWindow:
    """Per tenant, how many workflows ended with each outcome in the last ``window_s`` seconds.

    Counts go into the bucket of their time (``window_s / BUCKETS`` wide); a bucket older than the window
    is dropped when it falls out. Memory: ``BUCKETS`` buckets of six counts per tenant seen; tenants
    are the configured ones (names come from authenticated requests), so the map is as bounded as the
    tenants file.
    """

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self.bucket_s = window_s / BUCKETS
        self._tenants: dict[str, deque[tuple[int, list[int]]]] = {}

    def _index(self, now: float) -> int:
        return int(now // self.bucket_s)

    def add(self, tenant: str, outcome: str, now: float) -> None:
        """Count one workflow of ``tenant`` that ended with ``outcome`` (a ``GOODPUT_OUTCOMES`` value) at ``now``."""
        k = GOODPUT_OUTCOMES.index(outcome)
        buckets = self._tenants.get(tenant)
        if buckets is None:
            buckets = self._tenants[tenant] = deque(maxlen=BUCKETS)
        i = self._index(now)
        if buckets and buckets[-1][0] == i:
            buckets[-1][1][k] += 1
            return
        counts = [0] * len(GOODPUT_OUTCOMES)
        counts[k] = 1
        buckets.append((i, counts))

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the tenants not in ``keep`` (after a reload removed them)."""
        names = set(keep)
        for t in [t for t in self._tenants if t not in names]:
            del self._tenants[t]

    def summary(self, now: float, tenants: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
        """Per tenant (every one seen, plus ``tenants``), over the window ending at ``now``: the count of
        each outcome, ``attainment`` (met over finished; None when none finished), ``goodput_per_s`` (met
        per second of the window) and ``goodput_series`` (met per second in each bucket, oldest first)."""
        last = self._index(now)
        first = last - BUCKETS + 1
        out: dict[str, dict[str, Any]] = {}
        for tenant in sorted({*self._tenants, *tenants}):
            totals = [0] * len(GOODPUT_OUTCOMES)
            series = [0.0] * BUCKETS
            for i, counts in self._tenants.get(tenant, ()):
                if first <= i <= last:
                    for k, c in enumerate(counts):
                        totals[k] += c
                    series[i - first] = counts[0] / self.bucket_s
            by_outcome = dict(zip(GOODPUT_OUTCOMES, totals, strict=True))
            finished = sum(by_outcome[o] for o in FINISHED)
            out[tenant] = {
                "outcomes": by_outcome,
                "finished": finished,
                "attainment": None if finished == 0 else by_outcome["met"] / finished,
                "goodput_per_s": by_outcome["met"] / self.window_s,
                "goodput_series": series,
            }
        return out


@dataclass(frozen=True, slots=True)
class CallTiming:
    """One call of a finished workflow, in seconds from the workflow's arrival.

    ``ready_s``: queued at the gateway (its last attempt's queueing); ``sent_s``: sent to ``worker`` (None:
    never sent); ``done_s``: returned or failed for good; ``budget_s``: its stage budget (the share of the
    time left to the deadline the scheduler gave the stage when the call was queued; negative once late).
    """

    kind: str
    worker: str | None
    ready_s: float
    sent_s: float | None
    done_s: float
    budget_s: float
    attempts: int
    ok: bool

    @property
    def waited_s(self) -> float:
        """Seconds in the gateway's queue."""
        return max((self.sent_s if self.sent_s is not None else self.done_s) - self.ready_s, 0.0)

    @property
    def ran_s(self) -> float:
        """Seconds on the worker."""
        return 0.0 if self.sent_s is None else max(self.done_s - self.sent_s, 0.0)

    @property
    def over_budget(self) -> bool:
        """Took longer (waited plus ran) than its stage budget."""
        return self.done_s - self.ready_s > self.budget_s


@dataclass(frozen=True, slots=True)
class FinishedWorkflow:
    """A workflow that ended, as the status page shows it. ``finished``: the gateway clock at its end;
    ``calls``: its first ``MAX_CALLS`` calls in the order they were queued, ``more_calls`` the others.

    ``id`` is the id its client got: the response's ``id`` (``wf-...`` from ``/v1/workflows``, ``t2s-...`` from
    ``/v1/text2sql``); ``request_id`` the request's ``X-Request-Id`` (the client's own when it sent a sane one),
    None where the gateway did not record it.
    """

    id: str
    tenant: str
    route: str
    outcome: str
    finished: float
    latency_s: float
    deadline_s: float
    calls: tuple[CallTiming, ...]
    more_calls: int = 0
    request_id: str | None = None

    def lost_at(self) -> int | None:
        """Where the deadline was lost: the index of the first call that returned after it (None when the
        workflow was in time, or when every call returned before it: the time went after the last call)."""
        if self.latency_s <= self.deadline_s:
            return None
        for i, c in enumerate(self.calls):
            if c.done_s > self.deadline_s:
                return i
        return None

    def as_dict(self, now: float) -> dict[str, Any]:
        """JSON for the status page (``age_s``: seconds since it ended at ``now``)."""
        lost = self.lost_at()
        return {
            "id": self.id,
            "request_id": self.request_id,
            "tenant": self.tenant,
            "route": self.route,
            "outcome": self.outcome,
            "age_s": round(max(now - self.finished, 0.0), 3),
            "latency_s": round(self.latency_s, 4),
            "deadline_s": round(self.deadline_s, 4),
            "lost_at": lost,
            "more_calls": self.more_calls,
            "calls": [
                {
                    "kind": c.kind,
                    "worker": c.worker,
                    "ready_s": round(c.ready_s, 4),
                    "sent_s": None if c.sent_s is None else round(c.sent_s, 4),
                    "done_s": round(c.done_s, 4),
                    "waited_s": round(c.waited_s, 4),
                    "ran_s": round(c.ran_s, 4),
                    "budget_s": round(c.budget_s, 4),
                    "over_budget": c.over_budget,
                    "attempts": c.attempts,
                    "ok": c.ok,
                }
                for c in self.calls
            ],
        }


class WorkflowHistory:
    """The last ``size`` finished workflows (a ring buffer: the oldest falls out)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._ring: deque[FinishedWorkflow] = deque(maxlen=size)
        self.total = 0

    def add(self, wf: FinishedWorkflow) -> None:
        """Remember one finished workflow."""
        self._ring.append(wf)
        self.total += 1

    def __len__(self) -> int:
        return len(self._ring)

    def slowest(self, n: int, *, since: float | None = None) -> list[FinishedWorkflow]:
        """The ``n`` kept workflows with the largest latency over deadline, slowest first (ended at or after
        ``since`` when given): the ones that came closest to, or went furthest past, their deadline."""
        pool: Sequence[FinishedWorkflow] = self._ring
        if since is not None:
            pool = [w for w in self._ring if w.finished >= since]
        return heapq.nlargest(n, pool, key=lambda w: w.latency_s / w.deadline_s if w.deadline_s > 0 else w.latency_s)


_READY = operator.itemgetter(2)


def call_timings(
    arrival: float, calls: Iterable[tuple[str, str | None, float, float | None, float, float, int, bool]]
) -> tuple[tuple[CallTiming, ...], int]:
    """``CallTiming``s relative to ``arrival`` from absolute (kind, worker, ready, sent, done, budget, attempts,
    ok) tuples, sorted by ready time; at most ``MAX_CALLS`` are kept, the count of the others is returned."""
    rows = sorted(calls, key=_READY)
    kept = tuple(
        [  # (a list, then a tuple: cheaper than a generator for the one call of a chat completion)
            CallTiming(
                kind,  # kind, worker, ready_s, sent_s, done_s, budget_s, attempts, ok
                worker,
                ready - arrival,
                None if sent is None else sent - arrival,
                done - arrival,
                budget,
                attempts,
                ok,
            )
            for kind, worker, ready, sent, done, budget, attempts, ok in rows[:MAX_CALLS]
        ]
    )
    return kept, max(len(rows) - MAX_CALLS, 0)
