"""A worker of the live pool: its runtime state (written by the pool and its monitor only) and its
``/v1/status`` entry. Its description is the scheduler's ``WorkerInfo``, referred to by index."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.live.transport import LiveCall
from gateway.profiling.promparse import WorkerMetrics

RATIO_CLAMP = 100.0
"""The outlier window's bounds on a ratio (and on its inverse)."""


def typical_ratio(ratios: list[float]) -> float:
    """The mean of ``ratios`` without their largest tenth (at least one of two or more): one stall
    weighs nothing, a worker slow on a fifth of its calls still stands out (1.0 when empty)."""
    if len(ratios) < 2:
        return ratios[0] if ratios else 1.0
    kept = sorted(ratios)[: len(ratios) - max(1, len(ratios) // 10)]
    return sum(kept) / len(kept)


@dataclass(slots=True, eq=False)
class WorkerState:
    """The pool's runtime state of one worker (its description is the scheduler's ``WorkerInfo``): health,
    readiness, removal, the monitor's scrape, the outlier window (``add_recent`` keeps its sums) and ejection."""

    index: int
    scheduler: Scheduler = field(repr=False)
    up: bool = True
    ready: bool = True
    removing: bool = False
    removal_task: asyncio.Task[None] | None = None
    failures: int = 0
    drain: asyncio.Handle | None = None
    metrics: WorkerMetrics | None = None
    scraped_at: float | None = None
    held: bool = False
    inflight: set[LiveCall] = field(default_factory=set)
    sent: int = 0
    failed: int = 0
    recent: deque[float | None] = field(default_factory=deque)
    recent_failed: int = 0
    recent_returned: int = 0
    recent_typical: float | None = None
    load_area: float = 0.0
    """Calls in flight integrated over time (call-seconds) up to ``load_at``: the mean batch a call ran in."""
    load_at: float = 0.0
    prefill_sent: float = 0.0
    """Predicted prefill seconds of every call sent so far: the prompts that joined while a call ran."""
    ejected_until: float | None = None
    ejected_reason: str = ""
    ejections: int = 0
    readmitted_at: float | None = None
    probing: bool = False
    priority_scheduling: bool = True
    """Whether calls carry vLLM's ``priority`` field: False once the worker refused it (``refuse_priority``)."""

    @property
    def info(self) -> WorkerInfo:
        """The worker's description (name, profile, capacity, address), read from the scheduler."""
        return self.scheduler.workers[self.index]

    @property
    def name(self) -> str:
        """The worker's name."""
        return self.info.name

    @property
    def eligible(self) -> bool:
        """Takes new dispatches: healthy, ready (discovery), not ejected and not being removed."""
        return self.up and self.ready and not self.removing and self.ejected_until is None

    @property
    def ejected(self) -> bool:
        """Ejected as an outlier (until a probe call re-admits it)."""
        return self.ejected_until is not None

    def ejected_for_s(self, now: float) -> float | None:
        """Seconds from ``now`` until the ejection's back-off ends (0 once over: a probe call is due or
        running; it stays ejected until one answers); None when not ejected."""
        until = self.ejected_until
        return None if until is None else round(max(until - now, 0.0), 3)

    def ejection(self, now: float) -> dict[str, Any] | None:
        """The ejection's entry of ``/readyz`` (name, reason, ``ejected_for_s``); None when not ejected."""
        if self.ejected_until is None:
            return None
        return {"name": self.name, "reason": self.ejected_reason, "ejected_for_s": self.ejected_for_s(now)}

    def add_recent(self, ratio: float | None) -> None:
        """One call ended: ``None`` when it failed, else its observed/predicted latency (clamped to
        ``RATIO_CLAMP``); appended to the recent window, whose summary is refreshed (failed, returned, typical)."""
        self.recent.append(None if ratio is None else min(max(ratio, 1.0 / RATIO_CLAMP), RATIO_CLAMP))
        ok = [x for x in self.recent if x is not None]
        self.recent_returned = len(ok)
        self.recent_failed = len(self.recent) - len(ok)
        self.recent_typical = typical_ratio(ok) if ok else None

    def advance_load(self, now: float) -> None:
        """Bring ``load_area`` up to ``now`` (call before ``inflight`` changes)."""
        if now > self.load_at:
            self.load_area += len(self.inflight) * (now - self.load_at)
            self.load_at = now

    def clear_recent(self) -> None:
        """Forget the recent window (a re-admitted worker starts clean)."""
        self.recent.clear()
        self.recent_failed = self.recent_returned = 0
        self.recent_typical = None

    def status(self, now: float) -> dict[str, Any]:
        """This worker's entry of ``/v1/status``."""
        info, sched, w = self.info, self.scheduler, self.index
        ratios = sched.estimator.ratios(w, now)
        n, ratio, m = len(self.recent), self.recent_typical, self.metrics
        return {
            "name": info.name,
            "url": info.url,
            "model": info.served_model,
            "up": self.up,
            "ready": self.ready,
            "removing": self.removing,
            "capacity": info.capacity,
            "queued": sched.queue_len(w),
            "inflight": sched.inflight(w),
            "held": self.held,
            "t_queue_s": round(sched.estimator.t_queue(w, now), 6),
            "estimate_ratios": {k: {"ratio": round(r, 4), "age_s": round(a, 3)} for k, (r, a) in ratios.items()},
            "completed": self.sent,
            "failed": self.failed,
            "ejected": self.ejected,
            "ejected_for_s": self.ejected_for_s(now),
            "ejected_reason": self.ejected_reason if self.ejected else None,
            "ejections": self.ejections,
            "priority_scheduling": self.priority_scheduling,
            "recent": {
                "calls": n,
                "error_rate": round(self.recent_failed / n, 4) if n else None,
                "latency_ratio": None if ratio is None else round(ratio, 4),
            },
            "vllm": None
            if m is None
            else {
                "running": m.running,
                "waiting": m.waiting,
                "kv_cache_usage": m.kv_cache_usage,
                "age_s": None if self.scraped_at is None else round(now - self.scraped_at, 3),
            },
        }
