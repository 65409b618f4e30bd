"""What the ``bench fidelity`` modes share: requests simulated on one engine under a profile (beside
``send_arrivals``'s live latencies), and a replay's live-against-simulated gaps and their table cells."""

from __future__ import annotations

import contextlib
import heapq
import math
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, ClassVar

import httpx

from gateway.bench.livebench import LiveBenchReport, PolicyRun
from gateway.bench.stats import fmt, table
from gateway.core.profile import PerfProfile
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from gateway.profiling.worker import Arrival
from gateway.sim.engine import SimEngine


def simulate_arrivals(profile: PerfProfile, arrivals: Sequence[Arrival]) -> list[float]:
    """Each request's latency (arrival to answer, request overhead included) on one ``SimEngine`` with this
    profile, requests arriving at the given offsets."""
    eng = SimEngine(profile)
    calls = []
    for i, (_, n_in, n_out) in enumerate(arrivals):
        spec = CallSpec("check", n_in, n_out)
        calls.append(Call(i, StagedWorkflow(i, "check", 0.0, math.inf, [Stage("check", (spec,))]), spec, 0.0, seq=i))
    events: list[tuple[float, int, int, int]] = [(t, 0, i, 0) for i, (t, _, _) in enumerate(arrivals)]
    heapq.heapify(events)
    done: dict[int, float] = {}
    seq = len(arrivals)
    while events:
        t, kind, i, version = heapq.heappop(events)
        if kind == 0:
            eng.add(calls[i])
            changed = eng.kick(t)
        else:
            if version != eng.version or not eng.busy:
                continue
            for c in eng.on_wake(t):
                done[c.id] = t
            changed = eng.kick(t)
        if changed:
            seq += 1
            heapq.heappush(events, (eng.wake_at, 1, seq, eng.version))
    return [done[i] - arrivals[i][0] + profile.request_overhead_s for i in range(len(arrivals))]


@contextlib.asynccontextmanager
async def client_or_own(client: httpx.AsyncClient | None, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    """``client`` (injected by tests) as it is, or a new ``httpx.AsyncClient(**options)`` closed on exit."""
    if client is not None:
        yield client
        return
    async with httpx.AsyncClient(**options) as own:
        yield own


def p95(xs: Sequence[float]) -> float:
    """The 95th percentile (nearest rank) of ``xs``."""
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(0.95 * len(s)) - 1)]


def within(gaps: Iterable[float], target: float) -> bool:
    """Every gap finite and within ``target`` (true for none)."""
    return all(math.isfinite(g) and abs(g) <= target for g in gaps)


def gap_cells(r: PolicyRun, g: dict[str, float], digits: int) -> list[str]:
    """One policy's live and simulated P95, their gap, live and simulated SLO attainment, their gap."""
    lv, sm = r.live, r.simulated
    p95s = [fmt(lv.p95_s, digits), fmt(sm.p95_s, digits), f"{g['p95']:+.1%}"]
    return [*p95s, fmt(lv.slo_attainment, 3), fmt(sm.slo_attainment, 3), f"{g['slo']:+.1%}"]


class LiveGaps:
    """What a fidelity report shares: its live bench's gaps against the simulator, whether the ``GAP_KEYS``
    gaps are within ``TARGET``, and the table of them."""

    TARGET: ClassVar[float]
    GAP_KEYS: ClassVar[tuple[str, ...]]
    live: LiveBenchReport

    def gaps(self) -> dict[str, dict[str, float]]:
        """Policy -> live/simulated - 1 of P95 (``p95``) and SLO attainment (``slo``)."""
        return {r.policy: {"p95": r.p95_ratio - 1.0, "slo": r.slo_ratio - 1.0} for r in self.live.runs}

    def within_target(self) -> bool:
        """Every policy's ``GAP_KEYS`` gaps within ``TARGET`` of the simulator's."""
        return within((g[k] for g in self.gaps().values() for k in self.GAP_KEYS), self.TARGET)

    def gap_lines(self, title: str, digits: int, extra: Callable[[PolicyRun], list[str]], head: list[str]) -> list[str]:
        """``title``, one row per policy (``gap_cells`` and ``extra``'s cells, headed by ``head``) and the verdict."""
        rows = [[r.policy, *gap_cells(r, self.gaps()[r.policy], digits), *extra(r)] for r in self.live.runs]
        verdict = "within target" if self.within_target() else "NOT within target"
        gap_head = ["policy", "live p95", "sim p95", "gap", "live slo", "sim slo", "gap"]
        return [title, table([*gap_head, *head], rows), verdict]
