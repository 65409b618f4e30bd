"""Summaries of simulated (or live) runs: latency percentiles, SLO attainment, throughput."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from gateway.core.records import WorkflowOutcome
from gateway.sim.simulator import SimResult


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, linear interpolation (NumPy's default)."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    a, b = float(sorted_values[lo]), float(sorted_values[hi])
    if frac == 0.0 or a == b:
        return a
    if math.isinf(b):
        # Unfinished workflows are padded as +inf: a percentile that reaches into them is infinite
        # (interpolating would give inf * 0 = nan at the boundary).
        return b
    return a + (b - a) * frac


@dataclass(frozen=True)
class LatencySummary:
    """Headline figures of a run of ``workflows`` workflows, live or simulated (``latency_summary``)."""

    workflows: int
    completed: int
    p50_s: float
    p95_s: float
    p99_s: float
    mean_s: float
    slo_attainment: float
    throughput_qps: float


def latency_summary(latencies: Sequence[float], total: int, met: int, span: float) -> LatencySummary:
    """The figures of ``total`` workflows of which those with ``latencies`` completed (``met`` of them within
    their deadline) from the first arrival to the last finish (``span``): percentiles with the others infinitely
    late, the mean over the completed ones, throughput of the completed ones over ``span``."""
    lat = sorted(latencies)
    padded = lat + [math.inf] * (total - len(lat))
    return LatencySummary(
        workflows=total,
        completed=len(lat),
        p50_s=percentile(padded, 50),
        p95_s=percentile(padded, 95),
        p99_s=percentile(padded, 99),
        mean_s=sum(lat) / len(lat) if lat else math.nan,
        slo_attainment=met / total if total else math.nan,
        throughput_qps=len(lat) / span if span > 0 else math.nan,
    )


@dataclass(frozen=True)
class Summary(LatencySummary):
    """Headline figures of one simulated run, with its number of calls."""

    calls: int

    def as_dict(self) -> dict[str, float | int]:
        """Plain dict for JSON."""
        return asdict(self)


def summarize(result: SimResult, total: int | None = None, tenant: str | None = None) -> Summary:
    """Summarise a run of ``total`` workflows (default: finished + unfinished); unfinished ones are infinitely late."""
    recs: list[WorkflowOutcome[None]] = [r for r in result.workflows if tenant is None or r.tenant == tenant]
    n_total = total if total is not None else len(recs) + (result.unfinished if tenant is None else 0)
    span = max(r.finish for r in recs) - min(r.arrival for r in recs) if recs else 0.0
    figures = latency_summary([r.latency for r in recs], n_total, sum(1 for r in recs if r.met), span)
    return Summary(**vars(figures), calls=result.num_calls)
