"""What the status page remembers of finished workflows, bounded, fed by ``Gateway`` when one ends:
``goodput_outcome`` (the rule behind ``hexflow_workflow_outcomes_total``), ``OutcomeWindow`` (per tenant, the
outcomes of the last ``window_s`` seconds) and ``WorkflowHistory`` (the last finished workflows, for the
slowest ones' timelines). Times are the gateway's clock, passed in."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import fields
from operator import attrgetter
from typing import Any

from gateway.core.records import CallOutcome, WorkflowOutcome

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

_TIMES = attrgetter(*[f.name for f in fields(CallOutcome)][:-2])
"""A call outcome's fields before its answer and error (its last two), which ``kept_calls`` copies positionally: on
the hot path (every chat call ends a workflow) a fifth of the instructions of ``dataclasses.replace``."""


def goodput_outcome(status: str, *, valid: bool = True) -> str:
    """The goodput outcome of an ended workflow of gateway ``status`` (``hexflow_workflows_total``'s): ``missed``
    is ``late``, or ``no_valid_answer`` whenever the answer is not ``valid``; ``shed`` counts as ``rejected``."""
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
    """Per tenant, how many workflows ended with each outcome in the last ``window_s`` seconds, in ``BUCKETS``
    time buckets (tenants: the configured ones, so as bounded as the tenants file)."""

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


def lost_at(wf: WorkflowOutcome[Any]) -> int | None:
    """Where a workflow lost its deadline: the index of the first kept call that returned after it (None when the
    workflow was in time, or when every call returned before it: the time went after the last call)."""
    deadline_s = wf.deadline - wf.arrival
    if wf.finish - wf.arrival <= deadline_s:
        return None
    for i, c in enumerate(wf.calls):
        if c.result - wf.arrival > deadline_s:
            return i
    return None


def status_entry(wf: WorkflowOutcome[Any], now: float) -> dict[str, Any]:
    """A finished workflow as the status page shows it (``age_s``: seconds since it ended at ``now``): its calls'
    times in seconds from its arrival (``budget_s``: the stage budget the scheduler gave the call when it was
    queued, negative once late; ``over_budget``: it waited plus ran longer than that)."""
    arrival = wf.arrival
    deadline_s = wf.deadline - arrival
    calls = []
    for c in wf.calls:
        ready_s, done_s = c.ready - arrival, c.result - arrival
        sent_s = None if c.start is None else c.start - arrival
        calls.append(
            {
                "kind": c.kind,
                "worker": c.worker_name,
                "ready_s": round(ready_s, 4),
                "sent_s": None if sent_s is None else round(sent_s, 4),
                "done_s": round(done_s, 4),
                "waited_s": round(max((sent_s if sent_s is not None else done_s) - ready_s, 0.0), 4),
                "ran_s": round(0.0 if sent_s is None else max(done_s - sent_s, 0.0), 4),
                "budget_s": round(c.budget_s, 4),
                "over_budget": done_s - ready_s > c.budget_s,
                "attempts": c.attempts,
                "ok": c.ok,
            }
        )
    return {
        "id": wf.id,
        "request_id": wf.request_id,
        "tenant": wf.tenant,
        "route": wf.route,
        "outcome": wf.status,
        "age_s": round(max(now - wf.finish, 0.0), 3),
        "latency_s": round(wf.finish - arrival, 4),
        "deadline_s": round(deadline_s, 4),
        "lost_at": lost_at(wf),
        "more_calls": wf.ncalls - len(wf.calls),
        "calls": calls,
    }


class WorkflowHistory:
    """The last ``size`` finished workflows (a ring buffer: the oldest falls out)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._ring: deque[WorkflowOutcome[Any]] = deque(maxlen=size)
        self.total = 0

    def add(self, wf: WorkflowOutcome[Any]) -> None:
        """Remember one finished workflow."""
        self._ring.append(wf)
        self.total += 1

    def __len__(self) -> int:
        return len(self._ring)

    def slowest(self, n: int, *, since: float | None = None) -> list[WorkflowOutcome[Any]]:
        """The ``n`` kept workflows with the largest latency over deadline, slowest first (ended at or after
        ``since`` when given): the ones that came closest to, or went furthest past, their deadline."""
        pool: Sequence[WorkflowOutcome[Any]] = self._ring
        if since is not None:
            pool = [w for w in self._ring if w.finish >= since]
        return heapq.nlargest(n, pool, key=_lateness)


def _lateness(w: WorkflowOutcome[Any]) -> float:
    latency_s, deadline_s = w.finish - w.arrival, w.deadline - w.arrival
    return latency_s / deadline_s if deadline_s > 0 else latency_s


def kept_calls(calls: Iterable[CallOutcome[Any] | None]) -> tuple[tuple[CallOutcome[Any], ...], int]:
    """The settled ``calls`` (None: not settled) sorted by ready time, at most ``MAX_CALLS`` of them, and how many
    settled in all (a ``WorkflowOutcome``'s ``calls`` and ``ncalls`` for the history). The kept ones hold no
    answer and no error: the history outlives them, and needs only their times."""
    rows = sorted([c for c in calls if c is not None], key=attrgetter("ready"))
    kept = tuple([c if c.answer is None and c.error is None else CallOutcome(*_TIMES(c)) for c in rows[:MAX_CALLS]])
    return kept, len(rows)
