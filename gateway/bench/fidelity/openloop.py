"""``hexflow bench open-loop``: a workload's calls (token counts scaled) sent open loop at each rate to one
worker, each against the profile's simulated engine for the same arrivals; mean latency live over simulated
per kind of call and P95. Prompts unique, outputs exact; bounded in flight and in wall time (a rate cut
short is marked incomplete)."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from gateway.bench.fidelity.compare import client_or_own, p95, simulate_arrivals
from gateway.bench.replay import scale_queries
from gateway.bench.stats import json_safe, positive, table
from gateway.core.profile import PerfProfile
from gateway.profiling.worker import ProbeWorker, send_arrivals
from gateway.sim.workload import workload_queries


@dataclass(frozen=True, slots=True)
class OpenLoopCall:
    """One call of the check: when it is sent (seconds from the start), its kind and token counts."""

    at: float
    kind: str
    prompt: int
    output: int


def make_calls(trace: str, n: int, rate: float, token_scale: float, seed: int) -> list[OpenLoopCall]:
    """``n`` calls drawn (with replacement, seeded) from the workload's calls, token counts times
    ``token_scale``, at Poisson arrivals of ``rate`` per second starting at 0."""
    if n < 1:
        raise ValueError("calls must be >= 1")
    positive("rate", rate)
    _, queries = workload_queries(trace, max(8, n // 4), seed)
    pool = [c for q in scale_queries(queries, token_scale) for c in q]
    rng = random.Random(f"open-loop/{seed}/{rate}")
    out: list[OpenLoopCall] = []
    t = 0.0
    for _ in range(n):
        c = rng.choice(pool)
        out.append(OpenLoopCall(round(t, 6), c.kind, c.input_tokens, c.output_tokens))
        t += rng.expovariate(rate)
    return out


@dataclass
class RateResult:
    """One rate's run: per call its live latency (NaN: not completed) and the simulated one."""

    rate: float
    calls: list[OpenLoopCall]
    live_s: list[float]
    sim_s: list[float]
    client_waits: int
    """Calls that waited in the client for a free in-flight slot (their live latency includes the wait)."""
    wall_s: float
    complete: bool

    def _pairs(self, kind: str | None = None) -> list[tuple[float, float]]:
        return [
            (lv, sv)
            for c, lv, sv in zip(self.calls, self.live_s, self.sim_s, strict=True)
            if math.isfinite(lv) and (kind is None or c.kind == kind)
        ]

    def summary(self) -> dict[str, Any]:
        """Mean and P95 of the completed calls, live and simulated, and per kind the means and their ratio."""
        pairs = self._pairs()
        out: dict[str, Any] = {
            "rate": self.rate,
            "calls": len(self.calls),
            "completed": len(pairs),
            "client_waits": self.client_waits,
            "wall_s": self.wall_s,
            "complete": self.complete,
        }
        if pairs:
            live, sim = [p[0] for p in pairs], [p[1] for p in pairs]
            for name, stat in (("mean", statistics.fmean), ("p95", p95)):
                lv, sv = stat(live), stat(sim)
                out |= {f"{name}_live_s": lv, f"{name}_sim_s": sv, f"{name}_ratio": lv / sv}
        kinds: dict[str, Any] = {}
        for kind in sorted({c.kind for c in self.calls}):
            kp = self._pairs(kind)
            if kp:
                lv, sv = statistics.fmean(p[0] for p in kp), statistics.fmean(p[1] for p in kp)
                kinds[kind] = {"calls": len(kp), "mean_live_s": lv, "mean_sim_s": sv, "ratio": lv / sv}
        out["kinds"] = kinds
        return out


@dataclass
class OpenLoopReport:
    """Every rate's result, with what was checked against what."""

    worker: str
    model: str
    profile: PerfProfile
    trace: str
    token_scale: float
    seed: int
    rates: list[RateResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The JSON document (``--json``); non-finite numbers as null."""
        return {
            "worker": self.worker,
            "model": self.model,
            "profile": self.profile.name,
            "admit_s": self.profile.admit_s,
            "trace": self.trace,
            "token_scale": self.token_scale,
            "seed": self.seed,
            "rates": [json_safe(r.summary()) for r in self.rates],
        }


async def run_open_loop(
    worker: str,
    model: str,
    profile: PerfProfile,
    *,
    rates: Sequence[float],
    calls: int = 300,
    trace: str = "chess-bird",
    token_scale: float = 0.125,
    seed: int = 0,
    max_inflight: int = 64,
    budget_s: float = 600.0,
    client: httpx.AsyncClient | None = None,
    progress: bool = True,
) -> OpenLoopReport:
    """Run the check at each rate in turn (each call sent at its time by ``send_arrivals``: NaN when it failed
    or the budget ended first); ``client`` is injected for tests."""
    from tqdm import tqdm

    if max_inflight < 1:
        raise ValueError("max-inflight must be >= 1")
    positive("budget-s", budget_s)
    if not rates:
        raise ValueError("give at least one rate")
    plans = [make_calls(trace, calls, r, token_scale, seed + i) for i, r in enumerate(rates)]
    rep = OpenLoopReport(worker, model, profile, trace, token_scale, seed)
    url = worker.rstrip("/")
    deadline = time.monotonic() + budget_s
    limits = httpx.Limits(max_connections=max_inflight + 2)
    async with client_or_own(client, limits=limits, timeout=120.0) as http:
        for rate, plan in zip(rates, plans, strict=True):
            if time.monotonic() >= deadline:
                break
            start, arrivals = time.monotonic(), [(c.at, c.prompt, c.output) for c in plan]
            with tqdm(total=len(plan), desc="open loop", unit="call", disable=not progress, leave=False) as bar:
                run = await send_arrivals(
                    ProbeWorker(http, url, model),
                    arrivals,
                    max_inflight=max_inflight,
                    deadline=deadline,
                    clock=time.monotonic,
                    on_done=lambda: bar.update(1),
                )
            live, sim = run.latencies, simulate_arrivals(profile, arrivals)
            done = all(math.isfinite(v) for v in live)
            rep.rates.append(RateResult(rate, plan, live, sim, run.client_waits, time.monotonic() - start, done))
    return rep


_FIGURES = ("mean_live_s", "mean_sim_s", "mean_ratio", "p95_live_s", "p95_sim_s", "p95_ratio")


def format_open_loop_report(rep: OpenLoopReport) -> str:
    """Per rate: mean and P95 live against simulated; then per kind the mean ratio at each rate."""
    p = rep.profile
    lines = [
        f"open loop against {rep.worker} ({rep.model}), profile {p.name} (admit_s {p.admit_s:.3g}, "
        f"request_overhead_s {p.request_overhead_s:.3g}); {rep.trace} calls, tokens x {rep.token_scale:g}"
    ]
    sums = [r.summary() for r in rep.rates]
    rows = []
    for s in sums:
        figures = [f"{s.get(k, math.nan):.{3 if k.endswith('ratio') else 4}f}" for k in _FIGURES]
        rows.append([f"{s['rate']:g}", f"{s['completed']}/{s['calls']}", *figures, f"{s['client_waits']}"])
    head = ["rate/s", "done", "mean live", "mean sim", "live/sim", "p95 live", "p95 sim", "live/sim", "waited"]
    lines.append(table(head, rows))
    kinds = sorted({k for s in sums for k in s["kinds"]})
    if kinds:
        krows = [[k, *(f"{s['kinds'][k]['ratio']:.3f}" if k in s["kinds"] else "-" for s in sums)] for k in kinds]
        lines.append("mean latency live/sim per kind of call:")
        lines.append(table(["kind", *(f"{s['rate']:g}/s" for s in sums)], krows, left=1))
    if any(not s["complete"] for s in sums):
        lines.append("the budget ended before every call answered: the incomplete rows count the answered calls only")
    if any(s["client_waits"] for s in sums):
        lines.append(
            "some calls waited in the client for an in-flight slot (--max-inflight): their live latency has it"
        )
    return "\n".join(lines)
