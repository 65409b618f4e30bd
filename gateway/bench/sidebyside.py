"""``hexflow bench``: policies side by side on the simulator (``run_bench``), its report (``BenchReport``)
and plot; the method is docs/benchmarks.md ("Method"), the scenario and runs ``simbench``'s."""

from __future__ import annotations

import math
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from gateway.bench.enginetime import EngineTime, bound_engine_time, engine_time_of
from gateway.bench.simbench import (
    REL_TOL,
    TARGET,
    Bench,
    PointResult,
    ProgressFn,
    Setup,
    simulate,
    tuned_alpha,
)
from gateway.bench.stats import RunHeader, Spread, json_safe, pyplot, save_figure, save_json, spread
from gateway.core.policy import get_policy
from gateway.sim.metrics import Summary

T = TypeVar("T")


@dataclass
class PolicyResult:
    """What one policy achieved: its alpha, per-seed capacities (empty when no capacity search ran), and every
    run it made."""

    policy: str
    alpha: float | None
    capacity_per_seed: list[float]
    points: list[PointResult]

    @property
    def role(self) -> str:
        """``ours``, ``baseline`` or ``ablation`` (``Policy.role``)."""
        return get_policy(self.policy).role

    @property
    def capacity(self) -> Spread | None:
        """Mean and spread of the per-seed capacities (None without a capacity search)."""
        return spread(self.capacity_per_seed) if self.capacity_per_seed else None

    def at(self, rate: float) -> list[PointResult]:
        """The runs at ``rate`` (one per seed measured there), in seed order."""
        return sorted((p for p in self.points if abs(p.rate_qps - rate) <= 1e-12 * rate), key=lambda p: p.seed)


@dataclass
class BenchReport(RunHeader):
    """Everything ``hexflow bench`` reports (``to_json`` documents the fields). ``engine_time``: ours and the best
    baseline at the reference rate, on the first seed, each engine's time per workflow; ``bound_time``: the same
    at the fluid bound's solution."""

    fluid_bound_qps: float
    policies: dict[str, PolicyResult]
    tune_seed: int
    tune_rate_qps: float | None
    rel_tol: float
    rates: list[float]
    seconds: float = 0.0
    engine_time: dict[str, list[EngineTime]] = field(default_factory=dict)
    bound_time: list[EngineTime] = field(default_factory=list)

    @property
    def capacity_qps(self) -> dict[str, float]:
        """Mean capacity of every policy whose capacity was searched."""
        return {p: r.capacity.mean for p, r in self.policies.items() if r.capacity is not None}

    @property
    def best_baseline(self) -> str | None:
        """The baseline with the highest mean capacity (None without baselines or capacity search)."""
        base = {p: c for p, c in self.capacity_qps.items() if get_policy(p).role == "baseline"}
        return max(base, key=lambda p: base[p]) if base else None

    @property
    def reference_rate_qps(self) -> float | None:
        """The best baseline's mean capacity: where every policy's P95 is compared."""
        best = self.best_baseline
        return self.capacity_qps[best] if best is not None else None

    @property
    def alphas(self) -> dict[str, float | None]:
        """The alpha each policy ran with (None for policies that do not read alpha)."""
        return {p: r.alpha for p, r in self.policies.items()}

    @property
    def results(self) -> list[PointResult]:
        """Every run, sorted by policy, rate, then seed."""
        return sorted(
            (x for r in self.policies.values() for x in r.points), key=lambda p: (p.policy, p.rate_qps, p.seed)
        )

    def ratio_vs_best_baseline(self, policy: str) -> tuple[float, list[float]] | None:
        """``policy``'s mean capacity over the best baseline's, and the per-seed (paired) ratios."""
        best = self.best_baseline
        r = self.policies[policy]
        if best is None or r.capacity is None:
            return None
        b = self.policies[best]
        mean = r.capacity.mean / b.capacity.mean if b.capacity and b.capacity.mean > 0 else math.nan
        paired = [x / y if y > 0 else math.nan for x, y in zip(r.capacity_per_seed, b.capacity_per_seed, strict=True)]
        return mean, paired

    def p95_at(self, policy: str, rate: float) -> Spread | None:
        """Mean and spread over seeds of ``policy``'s P95 at ``rate`` (None if not measured there)."""
        runs = self.policies[policy].at(rate)
        return spread([p.summary.p95_s for p in runs]) if runs else None

    def p95_gain_vs_best(self, policy: str, rate: float) -> float | None:
        """The lowest mean P95 of any baseline at ``rate`` over ``policy``'s: >1 means ``policy`` is faster."""
        mine = self.p95_at(policy, rate)
        base = [s.mean for p in self.policies if get_policy(p).role == "baseline" and (s := self.p95_at(p, rate))]
        if mine is None or not base or not mine.mean > 0 or not math.isfinite(min(base)):
            return None
        return min(base) / mine.mean

    def to_json(self) -> dict[str, Any]:
        """The JSON document: the fluid bound, the best baseline and its capacity (the reference rate), ours and
        its ratio to it, per policy its role, alpha, capacity per seed, share of the bound, P95 at the
        reference rate and gain there, and every run in ``results``. Non-finite numbers are null."""
        ref = self.reference_rate_qps
        best = self.best_baseline
        ours = next((p for p in self.policies if get_policy(p).role == "ours"), None)
        ours_ratio = self.ratio_vs_best_baseline(ours) if ours else None
        engine = {
            "seed": self.seeds[0],
            "bound": [e.to_json() for e in self.bound_time],
            "policies": {p: [e.to_json() for e in rows] for p, rows in self.engine_time.items()},
        }
        doc = {
            **self.header(),
            "tune_seed": self.tune_seed,
            "tune_rate_qps": self.tune_rate_qps,
            "rel_tol": self.rel_tol,
            "target_slo_attainment": TARGET,
            "fluid_bound_qps": self.fluid_bound_qps,
            "best_baseline": best,
            "best_baseline_capacity_qps": ref,
            "ours": ours,
            "ratio_vs_best_baseline": ours_ratio[0] if ours_ratio else None,
            "reference_rate_qps": ref,
            "capacity_qps": self.capacity_qps,
            "engine_time_at_reference": engine if self.engine_time else None,
            "policies": {name: self._policy_json(name, ref) for name in self.policies},
            "rates": self.rates,
            "seconds": self.seconds,
            "results": [self._run_json(p) for p in self.results],
        }
        return json_safe(doc)

    def _policy_json(self, name: str, ref: float | None) -> dict[str, Any]:
        """One policy's entry of ``policies`` (``to_json``)."""
        r = self.policies[name]
        cap = r.capacity
        ratio = self.ratio_vs_best_baseline(name)
        p95 = self.p95_at(name, ref) if ref is not None else None
        gain = self.p95_gain_vs_best(name, ref) if ref is not None else None
        return {
            "role": r.role,
            "alpha": r.alpha,
            "capacity_qps": cap.as_dict() if cap else None,
            "share_of_fluid_bound": cap.mean / self.fluid_bound_qps if cap else None,
            "ratio_vs_best_baseline": {"mean": ratio[0], "per_seed": ratio[1]} if ratio else None,
            "p95_at_reference_s": p95.as_dict() if p95 else None,
            "p95_gain_vs_best_baseline": gain,
        }

    def _run_json(self, p: PointResult) -> dict[str, Any]:
        """One run's entry of ``results`` (``to_json``)."""
        s = p.summary
        figures = ("p50_s", "p95_s", "p99_s", "mean_s", "slo_attainment", "throughput_qps")
        return {
            **{"policy": p.policy, "trace": self.trace, "seed": p.seed, "rate_qps": p.rate_qps, "alpha": p.alpha},
            **{k: getattr(s, k) for k in figures},
            **{"workflows": s.workflows, "completed": s.completed, "calls": s.calls},
        }

    def write_json(self, path: Path) -> None:
        """Write the JSON document (no NaN/Infinity: non-finite numbers become null)."""
        save_json(path, self.to_json())


GRID_FRACTIONS: tuple[float, ...] = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
"""Rates (fractions of the fluid bound) measured when neither a capacity search nor rates are asked for."""


@dataclass(frozen=True)
class _Task:
    """One policy's work in one phase (a worker process's job): ``alpha`` None runs the policy's default (or
    none); ``tune_rate`` tunes alpha there first; ``coarse_tune``: no tuning rate is known yet, tune at a coarse
    capacity estimate of the policy itself."""

    policy: str
    alpha: float | None
    tune_rate: float | None
    coarse_tune: bool
    find_capacity: bool
    rates: tuple[float, ...]
    rel_tol: float
    ceiling: float


@dataclass
class _Outcome:
    alpha: float | None
    tune_rate: float | None
    capacities: list[float]
    points: list[PointResult]


def _policy_task(setup: Setup, task: _Task) -> _Outcome:
    """Tune (if asked), search the capacity on every seed (each seed's search bracketed by the previous
    seed's capacity), then measure the given rates on every seed."""
    bench = Bench(setup)
    alpha, tune_rate = task.alpha, task.tune_rate
    if task.coarse_tune:
        tune_rate = bench.capacity(task.policy, task.ceiling, seed=setup.tune_seed, alpha=alpha, rel_tol=0.05)
        tune_rate = tune_rate or task.ceiling / 256.0
    if tune_rate is not None:
        alpha = tuned_alpha(setup, task.policy, tune_rate)
    caps: list[float] = []
    if task.find_capacity:
        caps = bench.capacities(task.policy, task.ceiling, alpha=alpha, rel_tol=task.rel_tol)
    for r in task.rates:
        for s in setup.seeds:
            bench.point(task.policy, r, seed=s, alpha=alpha)
    points = [p for p in bench.points() if p.seed in setup.seeds]  # the coarse estimate's runs are not reported
    return _Outcome(alpha, tune_rate, caps, points)


def run_parallel(
    jobs: int, calls: Sequence[tuple[Callable[..., T], tuple[Any, ...]]], progress: ProgressFn | None = None
) -> list[T]:
    """``fn(*args)`` for each call, in ``jobs`` worker processes when > 1; results in call order either way,
    ``progress(1)`` after each call."""
    results: dict[int, T] = {}
    if jobs <= 1 or len(calls) <= 1:
        for i, (fn, args) in enumerate(calls):
            results[i] = fn(*args)
            if progress is not None:
                progress(1)
        return list(results.values())
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(calls)), mp_context=ctx) as pool:
        futures = {pool.submit(fn, *args): i for i, (fn, args) in enumerate(calls)}
        for f in as_completed(futures):
            results[futures[f]] = f.result()
            if progress is not None:
                progress(1)
    return [results[i] for i in range(len(calls))]


def _run_tasks(setup: Setup, tasks: Sequence[_Task], jobs: int, progress: ProgressFn | None) -> list[_Outcome]:
    return run_parallel(jobs, [(_policy_task, (setup, t)) for t in tasks], progress)


def _split(policies: Sequence[str], fixed_alpha: float | None) -> tuple[list[str], list[str]]:
    """(policies that need no tuning, policies whose alpha is tuned)."""
    tuned = [p for p in policies if get_policy(p).uses_alpha and fixed_alpha is None]
    return [p for p in policies if p not in tuned], tuned


def bench_steps(policies: Sequence[str], *, find_capacity: bool, fixed_alpha: float | None = None) -> int:
    """How many progress steps ``run_bench`` reports: one per policy per phase it takes part in."""
    plain, tuned = _split(policies, fixed_alpha)
    return len(plain) * (2 if find_capacity else 1) + len(tuned)


def run_bench(
    setup: Setup,
    policies: Sequence[str],
    *,
    rates: Sequence[float] | None = None,
    fixed_alpha: float | None = None,
    find_capacity: bool = True,
    rel_tol: float = REL_TOL,
    jobs: int = 1,
    progress: ProgressFn | None = None,
) -> BenchReport:
    """Capacities on every seed, the best baseline, alpha tuned once, and P95 at the best baseline's capacity.

    Phases: the policies without tuning (capacity and ``rates``); the alpha-reading ones, alpha tuned once
    at the best baseline's mean capacity; the first ones again at that reference rate. Without a capacity
    search every policy runs ``rates`` (default: fractions of the fluid bound). ``jobs`` > 1 runs policies
    in worker processes (identical results). ``progress`` gets 1 per policy phase (``bench_steps``)."""
    t0 = time.perf_counter()
    for p in policies:
        get_policy(p)  # unknown names fail before any work
    if len(set(policies)) != len(policies):
        raise ValueError("a policy is listed twice")
    bound = setup.bound.rate_qps
    grid = list(rates) if rates else ([] if find_capacity else [round(bound * f, 6) for f in GRID_FRACTIONS])
    plain, tuned = _split(policies, fixed_alpha)

    def alpha_of(p: str) -> float | None:
        return fixed_alpha if get_policy(p).uses_alpha else None

    outcomes: dict[str, _Outcome] = {}
    first = [_Task(p, alpha_of(p), None, False, find_capacity, tuple(grid), rel_tol, bound) for p in plain]
    outcomes.update(zip(plain, _run_tasks(setup, first, jobs, progress), strict=True))
    # The best baseline's mean capacity: the reference rate, and the rate alpha is tuned at.
    base = {
        p: statistics.fmean(o.capacities)
        for p, o in outcomes.items()
        if o.capacities and get_policy(p).role == "baseline"
    }
    ref = max(base.values()) if base else None
    tune_rate = ref if find_capacity else (statistics.median(grid) if grid else None)
    second = [
        _Task(p, None, tune_rate, find_capacity and tune_rate is None, find_capacity, tuple(grid), rel_tol, bound)
        for p in tuned
    ]
    if ref is not None:
        second = [replace(t, rates=(*t.rates, ref)) for t in second]
    outcomes.update(zip(tuned, _run_tasks(setup, second, jobs, progress), strict=True))
    if ref is not None and plain:
        third = [
            _Task(p, o.alpha, None, False, False, (ref,), rel_tol, bound) for p, o in outcomes.items() if p in plain
        ]
        for p, o in zip(plain, _run_tasks(setup, third, jobs, progress), strict=True):
            outcomes[p].points += o.points
    elif find_capacity and progress is not None:
        progress(len(plain))  # no reference rate: phase 3 has nothing to do
    report_tune = next((o.tune_rate for p, o in outcomes.items() if p in tuned), None)
    results = {p: PolicyResult(p, outcomes[p].alpha, outcomes[p].capacities, outcomes[p].points) for p in policies}
    report = BenchReport(
        trace=setup.trace,
        cluster=[w.profile.gpu for w in setup.workers],
        slo_scale=setup.slo_scale,
        slo_s=setup.slo_s,
        fluid_bound_qps=bound,
        policies=results,
        seeds=setup.seeds,
        tune_seed=setup.tune_seed,
        tune_rate_qps=report_tune,
        n_workflows=setup.n_workflows,
        rel_tol=rel_tol,
        rates=grid,
    )
    _add_engine_time(report, setup, policies)
    report.seconds = time.perf_counter() - t0
    return report


def _add_engine_time(report: BenchReport, setup: Setup, policies: Sequence[str]) -> None:
    """Where the engines' time went at the reference rate, ours against the best baseline (one run each, the
    first seed): what separates both from the bound (docs/benchmarks.md, "Where the time goes at capacity")."""
    ref = report.reference_rate_qps
    ours = next((p for p in policies if get_policy(p).role == "ours"), None)
    best = report.best_baseline
    if ref is None or not math.isfinite(setup.bound.rate_qps):
        return
    for p in dict.fromkeys(x for x in (ours, best) if x is not None):
        rows = engine_time_of(*simulate(setup, p, ref, alpha=report.policies[p].alpha)[:2])
        if rows:
            report.engine_time[p] = rows
    if report.engine_time:
        report.bound_time = bound_engine_time(setup.workers, setup.bound)


def plot_report(report: BenchReport, path: Path) -> None:
    """P95 latency and SLO attainment against arrival rate, one line per policy (mean over the seeds run
    at each rate), with the fluid bound and the reference rate marked."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    cmap = plt.get_cmap("tab20")
    colors = [cmap(i) for i in range(20)]  # distinct colours (dark shades first): no two policies share one
    for k, (name, r) in enumerate(report.policies.items()):
        by_rate: dict[float, list[Summary]] = {}
        for p in r.points:
            by_rate.setdefault(p.rate_qps, []).append(p.summary)
        xs = sorted(by_rate)
        p95 = [statistics.fmean(s.p95_s for s in by_rate[x]) for x in xs]
        p95 = [v if math.isfinite(v) else math.nan for v in p95]
        slo = [statistics.fmean(s.slo_attainment for s in by_rate[x]) for x in xs]
        color = colors[(2 * k) % 20 + (k // 10) % 2]
        width = 2.0 if r.role == "ours" else 0.8
        ax1.plot(xs, p95, marker="o", ms=3, lw=width, color=color, label=name)
        ax2.plot(xs, slo, marker="o", ms=3, lw=width, color=color, label=name)
    ref = report.reference_rate_qps
    for ax in (ax1, ax2):
        ax.axvline(report.fluid_bound_qps, color="grey", ls="--", lw=1, label="fluid bound")
        if ref is not None:
            ax.axvline(ref, color="black", ls=":", lw=1, label=f"best baseline ({report.best_baseline})")
        ax.set_xlabel("arrival rate (workflows/s)")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("P95 end-to-end latency (s)")
    ax1.axhline(report.slo_s, color="red", ls=":", lw=1, label="SLO")
    ax1.set_yscale("log")
    ax2.set_ylabel("SLO attainment")
    ax2.axhline(TARGET, color="red", ls=":", lw=1)
    ax2.set_ylim(0, 1.02)
    ax2.legend(fontsize=8, loc="lower left")
    fig.suptitle(
        f"{report.trace} on [{', '.join(report.cluster)}], SLO {report.slo_scale:g}x ({report.slo_s:.0f} s), "
        f"{report.n_workflows} workflows x {len(report.seeds)} seeds"
    )
    save_figure(fig, path)
