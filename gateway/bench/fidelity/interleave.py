"""``hexflow calibrate --check-interleaved N``: ``N`` scenarios of ``REQUESTS`` staggered requests (about two
overlapping, prompts unique) right after a fit, each request's latency against the fitted profile's
simulated engine; live over predicted per scenario and its median (above 1: slower than the profile says).
Bounded as the calibration is (concurrency, back-off, time budget)."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx

from gateway.bench.fidelity.compare import client_or_own, simulate_arrivals
from gateway.bench.stats import positive, table
from gateway.core.profile import PerfProfile
from gateway.profiling.plan import PlanSettings
from gateway.profiling.worker import Arrival, ProbeWorker, send_arrivals

REQUESTS = 10
"""Requests per scenario."""
SEED_BASE = 1_000_000
"""Prompt seeds of the check start here (the calibration's probes use small seeds: no shared prompt)."""


def make_scenarios(
    profile: PerfProfile, settings: PlanSettings, n: int, rng: random.Random, *, concurrency: int
) -> list[list[Arrival]]:
    """``n`` scenarios of ``REQUESTS`` staggered requests, each against the fitted profile."""
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
        times = {k: list(getattr(self, k)) for k in ("live_s", "predicted_s", "lone_s")}
        return {"arrivals": [list(a) for a in self.arrivals], **times, "ratio": self.ratio}


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
    positive("the check's budget (seconds)", budget_s)
    concurrency = max(1, min(settings.max_concurrency, settings.max_num_seqs))
    model_profile = replace(profile, max_num_seqs=concurrency)
    scenarios = make_scenarios(profile, settings, n, random.Random(seed), concurrency=concurrency)
    deadline = clock() + budget_s
    results: list[ScenarioResult] = []
    skipped = 0
    limits, timeout = httpx.Limits(max_connections=concurrency + 2), httpx.Timeout(60.0, connect=10.0)
    async with client_or_own(client, limits=limits, timeout=timeout) as http:
        w = ProbeWorker(http, worker, model)
        for k, arrivals in enumerate(scenarios):
            predicted = simulate_arrivals(model_profile, arrivals)
            makespan = max(a[0] + p for a, p in zip(arrivals, predicted, strict=True))
            load = await w.load_when_quiet(deadline, clock, sleep)
            if (load is not None and load.queued > 0) or clock() + makespan > deadline:
                skipped += 1
                continue
            run = await send_arrivals(
                w,
                arrivals,
                max_inflight=concurrency,
                deadline=deadline,
                clock=clock,
                sleep=sleep,
                seed_base=SEED_BASE + k * 1000,
            )
            if not run.complete:
                skipped += 1
                break  # the budget ended mid-scenario (or a request failed)
            lone = tuple(profile.single_latency(p, o) for _, p, o in arrivals)
            results.append(ScenarioResult(tuple(arrivals), tuple(run.latencies), tuple(predicted), lone))
    return InterleaveReport(concurrency, tuple(results), skipped)


def format_interleave_report(rep: InterleaveReport) -> str:
    """The per-scenario table and the median."""
    rows = []
    for i, s in enumerate(rep.scenarios):
        sums = [f"{sum(x):.3f}" for x in (s.live_s, s.predicted_s, s.lone_s)]
        rr = s.request_ratios
        rows.append([str(i), str(len(s.arrivals)), *sums, f"{s.ratio:.3f}", f"{min(rr):.2f}-{max(rr):.2f}"])
    head = (
        f"interleaved check: {len(rep.scenarios)} scenarios of staggered requests, at most {rep.concurrency} in flight"
    )
    if rep.skipped:
        head += f", {rep.skipped} skipped (budget or others' queued requests)"
    lines = [head]
    if rows:
        lines.append(
            table(["scenario", "requests", "live_s", "predicted_s", "lone_s", "live/predicted", "per request"], rows)
        )
        lines.append(
            f"median live/predicted {rep.median_ratio:.3f} (above 1: slower under interleaving than the profile says)"
        )
    return "\n".join(lines)
