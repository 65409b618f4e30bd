"""The core the ``bench fidelity`` modes share: a timed stream of requests simulated on one engine under a
profile (to set beside ``gateway.profiling.worker.send_arrivals``'s live latencies), the live-against-
simulated gaps of a replay, and the run's folder of logs and catalogues."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any

from gateway.bench.livebench import LiveBenchReport
from gateway.core.profile import PerfProfile
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow, Workflow
from gateway.profiling.worker import Arrival
from gateway.sim.engine import SimEngine
from gateway.sim.metrics import Summary, summarize
from gateway.sim.simulator import Simulator

__all__ = ["live_gaps", "p95", "simulate_arrivals", "simulate_runs"]


def simulate_arrivals(profile: PerfProfile, arrivals: Sequence[Arrival]) -> list[float]:
    """Each request's latency (its arrival to its answer, the profile's request overhead included) on one
    simulated engine (``gateway.sim.engine.SimEngine``, the model the simulator and the scheduler use) with
    this profile, requests arriving at the given offsets."""
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


def p95(xs: Sequence[float]) -> float:
    """The 95th percentile (nearest rank) of ``xs``."""
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(0.95 * len(s)) - 1)]


def live_gaps(live: LiveBenchReport) -> dict[str, dict[str, float]]:
    """Policy -> live/simulated - 1 of P95 (``p95``) and SLO attainment (``slo``) of a live bench."""
    return {r.policy: {"p95": r.p95_ratio - 1.0, "slo": r.slo_ratio - 1.0} for r in live.runs}


def simulate_runs(
    live: LiveBenchReport,
    workers: Sequence[Any],
    workload: Callable[[], Sequence[Workflow]],
    *,
    seed: int,
    engine_profiles: Sequence[PerfProfile] | None = None,
) -> dict[str, Summary]:
    """Policy -> the simulator's summary of ``workload()`` (built afresh for each policy) with each live
    run's policy and alpha; ``engine_profiles``: what the engines run, if not the workers' profiles."""
    out = {}
    for r in live.runs:
        dags = workload()
        sim = Simulator(
            workers, r.policy, alpha=r.alpha, seed=seed, prefix_caching=True, engine_profiles=engine_profiles
        )
        out[r.policy] = summarize(sim.run(dags), total=len(dags))
    return out
