"""Simulation-based alpha tuning: replay a window of recent traffic once per alpha and pick the lowest P95 (ties
within 0.1%: higher attainment, then the alpha nearer the current one); ``smooth`` averages grid neighbours."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.core.dag import DagWorkflow
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


def _smoothed(points: Sequence[TunePoint]) -> list[float]:
    """Each point's P95 averaged with its neighbours on the (sorted) grid; inf stays inf."""
    order = sorted(range(len(points)), key=lambda i: points[i].alpha)
    vals = [points[i].summary.p95_s for i in order]
    out = [0.0] * len(points)
    for rank, i in enumerate(order):
        window = vals[max(rank - 1, 0) : rank + 2]
        out[i] = sum(window) / len(window)
    return out


def tune_alpha(
    workers: Sequence[WorkerInfo],
    policy: str,
    window: Sequence[StagedWorkflow | DagWorkflow],
    *,
    grid: Sequence[float] = ALPHA_GRID,
    seed: int = 0,
    current: float | None = None,
    smooth: bool = True,
    prefix_caching: bool = False,
) -> TuneResult:
    """Replay (copies of) ``window`` once per alpha in ``grid``; return the best alpha and the table."""
    if not grid:
        raise ValueError("the alpha grid is empty")
    if not window:
        raise ValueError("the tuning window holds no workflows")
    t0 = min(w.arrival for w in window)
    points = []
    for a in grid:
        wfs = [w.shifted(w.arrival - t0, w.deadline - t0) for w in window]
        res = Simulator(workers, policy, alpha=a, seed=seed, prefix_caching=prefix_caching).run(wfs)
        points.append(TunePoint(a, summarize(res, total=len(wfs))))
    ref = current if current is not None else 0.0

    est = _smoothed(points) if smooth else [p.summary.p95_s for p in points]
    best_p95 = min(est)
    near = [p for p, e in zip(points, est, strict=True) if e <= best_p95 * 1.001]
    chosen = min(near, key=lambda p: (-p.summary.slo_attainment, abs(p.alpha - ref), p.summary.p95_s))
    return TuneResult(chosen.alpha, tuple(points))
