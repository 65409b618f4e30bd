"""``hexflow calibrate --check-interleaved N``: does the fitted profile predict the worker when requests
overlap the way a replay's do?

The calibration's probes are lone requests and batches whose requests start together; in service, prompts
arrive while other requests decode, and each prompt's chunks share iterations with those decodes. This
check sends ``N`` scenarios of ``REQUESTS`` requests each at staggered times (exponential gaps, shapes drawn
within the plan's prompt and output bounds, each prompt its own so nothing hits the prefix cache) and
compares every request's latency with the simulated engine's (``gateway.sim.engine.SimEngine``, the model
the simulator and the scheduler use) for the same arrivals and shapes under the fitted profile. It reports,
per scenario, live over predicted of the summed latencies and of each request, and the median over
scenarios: above 1, the worker is slower under interleaving than the profile says (the fit cannot see it:
no probe of the plan interleaves).

Gaps: their mean is the scenario's mean lone latency (as the profile predicts it) over ``min(2,
concurrency)``, so that about two requests overlap at a time and the engine interleaves prefill with
decoding without queueing for long. Safety as in the calibration: at most ``concurrency`` requests in
flight (a later arrival waits in the client, which the simulated engine sees as its own waiting queue: the
simulation runs with ``max_num_seqs`` = that concurrency), back-off while others' requests queue on the
worker, and a hard time budget (a scenario predicted not to end within what is left is skipped; requests
still running at the budget are cancelled).
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from gateway.bench.calibrate_live import PlanSettings, Probe, ProbeWorker
from gateway.bench.stats import table
from gateway.core.profile import PerfProfile
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from gateway.sim.engine import SimEngine

__all__ = [
    "REQUESTS",
    "InterleaveReport",
    "ScenarioResult",
    "check_interleaved",
    "format_interleave_report",
    "make_scenarios",
    "simulate_arrivals",
]

REQUESTS = 10
"""Requests per scenario."""
SEED_BASE = 1_000_000
"""Prompt seeds of the check start here (the calibration's probes use small seeds: no shared prompt)."""

Arrival = tuple[float, int, int]
"""(offset from the scenario's start in seconds, prompt tokens, output tokens)."""


def make_scenarios(
    profile: PerfProfile, settings: PlanSettings, n: int, rng: random.Random, *, concurrency: int
) -> list[list[Arrival]]:
    """``n`` scenarios of ``REQUESTS`` staggered requests (module docstring)."""
    lo_p, hi_p = max(16, settings.max_prompt // 20), settings.max_prompt
    lo_o, hi_o = max(1, settings.max_output // 12), settings.max_output
    out = []
    for _ in range(n):
        shapes = [(rng.randint(lo_p, hi_p), rng.randint(lo_o, hi_o)) for _ in range(REQUESTS)]
        mean_lone = statistics.fmean(profile.single_latency(p, o) for p, o in shapes)
        mean_gap = mean_lone / min(2, max(1, concurrency))
        t, arrivals = 0.0, []
        for i, (p, o) in enumerate(shapes):
            if i:
                t += rng.expovariate(1.0 / mean_gap)
            arrivals.append((round(t, 4), p, o))
        out.append(arrivals)
    return out


def simulate_arrivals(profile: PerfProfile, arrivals: Sequence[Arrival]) -> list[float]:
    """Each request's latency (its arrival to its answer, the profile's request overhead included) on one
    simulated engine with this profile, requests arriving at the given offsets."""
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


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario: its arrivals, each request's live and predicted latency."""

    arrivals: tuple[Arrival, ...]
    live_s: tuple[float, ...]
    predicted_s: tuple[float, ...]
    lone_s: tuple[float, ...]
    """Each request's lone latency under the profile (what it would take with the worker to itself)."""

    @property
    def ratio(self) -> float:
        """Summed live latency over summed predicted latency."""
        return sum(self.live_s) / sum(self.predicted_s)

    @property
    def request_ratios(self) -> list[float]:
        """Live over predicted, request by request."""
        return [lv / p for lv, p in zip(self.live_s, self.predicted_s, strict=True)]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "arrivals": [list(a) for a in self.arrivals],
            "live_s": list(self.live_s),
            "predicted_s": list(self.predicted_s),
            "lone_s": list(self.lone_s),
            "ratio": self.ratio,
        }


@dataclass(frozen=True)
class InterleaveReport:
    """What ``check_interleaved`` measured."""

    concurrency: int
    scenarios: tuple[ScenarioResult, ...]
    skipped: int
    """Scenarios not run: predicted not to end within the budget, or others' requests queued until it ended."""

    @property
    def median_ratio(self) -> float | None:
        """Median over scenarios of live over predicted (None when none ran)."""
        return statistics.median(s.ratio for s in self.scenarios) if self.scenarios else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "concurrency": self.concurrency,
            "median_ratio": self.median_ratio,
            "skipped": self.skipped,
            "scenarios": [s.to_json() for s in self.scenarios],
        }


async def check_interleaved(
    worker: str,
    model: str,
    profile: PerfProfile,
    settings: PlanSettings,
    *,
    n: int,
    budget_s: float,
    seed: int = 0,
    client: httpx.AsyncClient | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> InterleaveReport:
    """Run ``n`` staggered scenarios against ``worker`` within ``budget_s`` and compare each with the
    simulated engine under ``profile`` (the fitted one, in the worker's wall seconds)."""
    if n < 1:
        raise ValueError("the check needs at least one scenario")
    if not (budget_s > 0 and math.isfinite(budget_s)):
        raise ValueError("the check's budget must be a positive number of seconds")
    concurrency = max(1, min(settings.max_concurrency, settings.max_num_seqs))
    model_profile = replace(profile, max_num_seqs=concurrency)
    scenarios = make_scenarios(profile, settings, n, random.Random(seed), concurrency=concurrency)
    own = client is None
    http = client or httpx.AsyncClient(
        limits=httpx.Limits(max_connections=concurrency + 2), timeout=httpx.Timeout(60.0, connect=10.0)
    )
    w = ProbeWorker(http, worker, model)
    deadline = clock() + budget_s
    results: list[ScenarioResult] = []
    skipped = 0
    try:
        for k, arrivals in enumerate(scenarios):
            predicted = simulate_arrivals(model_profile, arrivals)
            makespan = max(a[0] + p for a, p in zip(arrivals, predicted, strict=True))
            load = await w.load_when_quiet(deadline, clock, sleep)
            if (load is not None and load.queued > 0) or clock() + makespan > deadline:
                skipped += 1
                continue
            live = await _run_scenario(w, arrivals, k, concurrency, deadline, clock, sleep)
            if live is None:
                skipped += 1
                break  # the budget ended mid-scenario
            lone = tuple(profile.single_latency(p, o) for _, p, o in arrivals)
            results.append(ScenarioResult(tuple(arrivals), tuple(live), tuple(predicted), lone))
    finally:
        if own:
            await http.aclose()
    return InterleaveReport(concurrency, tuple(results), skipped)


async def _run_scenario(
    w: ProbeWorker,
    arrivals: Sequence[Arrival],
    k: int,
    concurrency: int,
    deadline: float,
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]],
) -> list[float] | None:
    """Each request's latency from its arrival time (a wait for a free slot in the client included); None
    when the budget ended first (the requests still running are cancelled)."""
    slots = asyncio.Semaphore(concurrency)
    t0 = clock()

    async def one(i: int, at: float, prompt: int, output: int) -> float:
        await sleep(max(0.0, t0 + at - clock()))
        arrived = clock()
        async with slots:
            probe = Probe("lone", prompt, output, 1, seed=SEED_BASE + k * 1000 + i)
            await w.complete(probe, clock, deadline - clock())
        return clock() - arrived

    tasks = [asyncio.ensure_future(one(i, *a)) for i, a in enumerate(arrivals)]
    try:
        async with asyncio.timeout(max(0.0, deadline - clock())):
            return list(await asyncio.gather(*tasks))
    except (TimeoutError, httpx.TimeoutException):
        return None
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def format_interleave_report(rep: InterleaveReport) -> str:
    """The per-scenario table and the median."""
    rows = []
    for i, s in enumerate(rep.scenarios):
        rr = s.request_ratios
        rows.append(
            [
                str(i),
                str(len(s.arrivals)),
                f"{sum(s.live_s):.3f}",
                f"{sum(s.predicted_s):.3f}",
                f"{sum(s.lone_s):.3f}",
                f"{s.ratio:.3f}",
                f"{min(rr):.2f}-{max(rr):.2f}",
            ]
        )
    head = (
        f"interleaved check: {len(rep.scenarios)} scenarios of staggered requests, at most {rep.concurrency} in flight"
    )
    if rep.skipped:
        head += f", {rep.skipped} skipped (budget or others' queued requests)"
    lines = [head]
    if rows:
        lines.append(
            table(
                ["scenario", "requests", "live_s", "predicted_s", "lone_s", "live/predicted", "per request"],
                rows,
            )
        )
        lines.append(
            f"median live/predicted {rep.median_ratio:.3f} (above 1: slower under interleaving than the profile says)"
        )
    return "\n".join(lines)
