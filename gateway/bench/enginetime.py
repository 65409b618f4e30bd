"""Where the engines' time goes, per workflow, in a run and at the fluid bound: busy time split into the
per-iteration base, the per-token cost and the rest (``PerfProfile.busy_split``), so a run's excess over the
bound reads as more iterations, more tokens or more context."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gateway.bench.bound import FluidBound
from gateway.bench.stats import fmt, table
from gateway.core.profile import PerfProfile
from gateway.core.worker import WorkerInfo
from gateway.sim.engine import EngineStats
from gateway.sim.simulator import SimResult, Simulator


@dataclass(frozen=True)
class EngineTime:
    """One engine per completed workflow: calls served, and seconds of ``iter_base_s`` x iterations, of
    ``token_s`` x batched tokens and of the rest (context, prefill attention, ``seq_s``); the share of the run
    (or of each second at the bound) it was busy, calls per iteration, and the share of prompt tokens served
    from its prefix cache (None at the bound)."""

    name: str
    calls: float
    base_s: float
    token_s: float
    other_s: float
    busy: float
    batch: float
    prefix_hit: float | None = None

    @property
    def total_s(self) -> float:
        """Busy seconds per workflow."""
        return self.base_s + self.token_s + self.other_s

    def to_json(self) -> dict[str, Any]:
        """The fields and the total."""
        return {**asdict(self), "total_s": self.total_s}


def run_engine_time(
    names: Sequence[str],
    profiles: Sequence[PerfProfile],
    stats: Sequence[EngineStats],
    dispatch_counts: Sequence[Mapping[str, int]],
    workflows: int,
    end_time: float,
) -> list[EngineTime]:
    """Per engine of a simulated run (``SimResult.engine_stats``, ``dispatch_counts``, ``end_time``; the
    engines' own profiles, ``Simulator.engine_profiles``), per one of its ``workflows`` completed workflows."""
    if not len(names) == len(profiles) == len(stats) == len(dispatch_counts):
        raise ValueError("names, profiles, stats and dispatch_counts must have one entry per engine")
    if workflows < 1:
        raise ValueError(f"workflows must be at least 1, got {workflows}")
    out = []
    for name, p, st, counts in zip(names, profiles, stats, dispatch_counts, strict=True):
        split = p.busy_split(st.iterations, st.batched_tokens, st.busy_s)
        calls, base, tok, other = (x / workflows for x in (sum(counts.values()), *split))
        busy = st.busy_s / end_time if end_time > 0 else 0.0
        batch = st.seq_iterations / st.iterations if st.iterations else 0.0
        hit = st.prefix_hit_tokens / st.prompt_tokens if st.prompt_tokens else 0.0
        out.append(EngineTime(name, calls, base, tok, other, busy, batch, hit))
    return out


def engine_time_of(sim: Simulator, res: SimResult) -> list[EngineTime]:
    """``run_engine_time`` of a finished run: ``sim``'s workers and engine profiles, ``res``'s counters;
    empty when no workflow completed."""
    if not res.workflows:
        return []
    names = [w.name for w in sim.workers]
    return run_engine_time(
        names, sim.engine_profiles, res.engine_stats, res.dispatch_counts, len(res.workflows), res.end_time
    )


def bound_engine_time(workers: Sequence[WorkerInfo], bound: FluidBound) -> list[EngineTime]:
    """Per worker at the fluid bound's solution (one engine per entry), per workflow at its rate."""
    rate = bound.rate_qps
    if not 0.0 < rate < float("inf"):
        raise ValueError(f"the bound's rate must be positive and finite, got {rate}")
    if len(bound.time_split) != len(workers):
        raise ValueError("the bound has no time split for these workers")
    return [
        EngineTime(w.name, calls / rate, base / rate, tok / rate, other / rate, busy, seqs)
        for w, calls, (base, tok, other), busy, seqs in zip(
            workers, bound.calls_per_s, bound.time_split, bound.gpu_busy, bound.seqs_per_iteration, strict=True
        )
    ]


def _summed(name: str, xs: Sequence[EngineTime]) -> EngineTime:
    """All of ``xs`` as one: calls and seconds per workflow added up (busy and batch are per engine: NaN)."""
    calls, base, tok, other = (sum(getattr(x, k) for x in xs) for k in ("calls", "base_s", "token_s", "other_s"))
    return EngineTime(name, calls, base, tok, other, math.nan, math.nan)


def _pair(run: float, bound: float, digits: int = 2) -> str:
    return f"{fmt(run, digits)} / {fmt(bound, digits)}"


def format_engine_time(run: Sequence[EngineTime], bound: Sequence[EngineTime]) -> str:
    """The run against the bound, engine by engine, and in total (engine seconds per workflow)."""
    if len(run) != len(bound):
        raise ValueError(f"{len(run)} engines in the run, {len(bound)} at the bound")

    def seconds(r: EngineTime, b: EngineTime) -> list[str]:
        return [_pair(getattr(r, k), getattr(b, k)) for k in ("calls", "base_s", "token_s", "other_s", "total_s")]

    def row(r: EngineTime, b: EngineTime) -> list[str]:
        hit = f"{r.prefix_hit:.1%}" if r.prefix_hit is not None else "-"
        return [r.name, *seconds(r, b), f"{r.busy:.1%} / {b.busy:.1%}", _pair(r.batch, b.batch, 1), hit]

    rows = [row(r, b) for r, b in zip(run, bound, strict=True)]
    run_all, bound_all = _summed("all", run), _summed("all", bound)
    rows.append(["all", *seconds(run_all, bound_all), "", "", ""])
    head = ["engine", "calls/wf", "base s/wf", "tokens s/wf", "other s/wf", "busy s/wf", "busy", "batch", "prefix hit"]
    ratio = run_all.total_s / bound_all.total_s if bound_all.total_s > 0 else float("nan")
    return (
        "engine time per completed workflow, this run / the fluid bound's solution (base: iter_base_s per "
        "iteration; tokens: token_s per batched token; other: context reads, prefill attention, per-call host "
        "work; batch: calls per iteration):\n"
        + table(head, rows)
        + f"\nthe engines spent {ratio:.2f}x the bound's engine time per workflow"
    )


def format_engine_time_summary(runs: Mapping[str, Sequence[EngineTime]], bound: Sequence[EngineTime]) -> str:
    """One row per run and one for the bound: the engines' seconds per workflow summed over the engines
    (base, tokens, the rest, total), the total over the bound's, and the range of the engines' mean batches."""

    def row(name: str, xs: Sequence[EngineTime], ref: float) -> list[str]:
        s = _summed(name, xs)
        batch = f"{min(x.batch for x in xs):.1f}-{max(x.batch for x in xs):.1f}" if xs else "-"
        secs = [fmt(v, 2) for v in (s.base_s, s.token_s, s.other_s, s.total_s)]
        return [name, *secs, f"{s.total_s / ref:.2f}x" if ref > 0 else "-", batch]

    ref = _summed("bound", bound).total_s
    rows = [row("fluid bound", bound, ref), *(row(p, xs, ref) for p, xs in runs.items())]
    return table(["run", "base s/wf", "tokens s/wf", "other s/wf", "busy s/wf", "of bound", "batch"], rows)
