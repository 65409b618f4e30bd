"""Simulation-based alpha tuning (the HexGen-Flow paper's fourth component).

Replay a window of recent traffic (the workflows, with their arrival times, deadlines and calls)
against the current cluster once per alpha on a grid, and pick the alpha with the lowest P95 latency;
ties (within 0.1%) go to the higher SLO attainment, then to the alpha closer to the current one
(so the live gateway does not flap between equivalent values).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.core.scheduler import WorkerInfo
from gateway.core.workflow import StagedWorkflow
from gateway.sim.metrics import Summary, summarize
from gateway.sim.simulator import Simulator

ALPHA_GRID: tuple[float, ...] = tuple(round(i / 10, 1) for i in range(11))


@dataclass(frozen=True)
class TunePoint:
    """The replay of the window under one alpha."""

    alpha: float
    summary: Summary


@dataclass(frozen=True)
class TuneResult:
    """The chosen alpha and every grid point."""

    alpha: float
    points: tuple[TunePoint, ...]

    def best(self) -> TunePoint:
        """The grid point of the chosen alpha."""
        return next(p for p in self.points if p.alpha == self.alpha)


def tune_alpha(
    workers: Sequence[WorkerInfo],
    policy: str,
    window: Sequence[StagedWorkflow],
    *,
    grid: Sequence[float] = ALPHA_GRID,
    seed: int = 0,
    current: float | None = None,
) -> TuneResult:
    """Replay ``window`` once per alpha in ``grid``; return the best alpha and the table.

    The window's workflows are copied (``fresh()``) for every replay, so the caller's list is untouched.
    """
    if not grid:
        raise ValueError("the alpha grid is empty")
    if not window:
        raise ValueError("the tuning window holds no workflows")
    t0 = min(w.arrival for w in window)
    points = []
    for a in grid:
        wfs = [w.shifted(w.arrival - t0, w.deadline - t0) for w in window]
        res = Simulator(workers, policy, alpha=a, seed=seed).run(wfs)
        points.append(TunePoint(a, summarize(res, total=len(wfs))))
    ref = current if current is not None else 0.0

    best_p95 = min(p.summary.p95_s for p in points)
    near = [p for p in points if p.summary.p95_s <= best_p95 * 1.001]
    chosen = min(near, key=lambda p: (-p.summary.slo_attainment, abs(p.alpha - ref), p.summary.p95_s))
    return TuneResult(chosen.alpha, tuple(points))
