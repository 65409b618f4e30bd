"""``hexflow bench tuner``: the live alpha tuner's own code (``WindowRecorder``, ``Retuner``, ``tune_window``) run
in virtual time per window size, against every fixed alpha of the grid (the best in hindsight: lowest P95).
Method and results: docs/benchmarks.md ("Alpha tuner")."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.bench.sidebyside import run_parallel
from gateway.bench.simbench import Bench, Setup, simulate
from gateway.bench.stats import fmt, json_safe, table
from gateway.config.operations import TuningConfig
from gateway.core.policy import Policy, get_policy
from gateway.core.scheduler import Scheduler, WorkerInfo
from gateway.core.workflow import CallSpec, StagedWorkflow
from gateway.live.tuning import Retuner, WindowRecorder, tune_window
from gateway.sim.metrics import Summary, summarize
from gateway.sim.simulator import SimResult, Simulator

TRACES: tuple[str, ...] = ("trace1", "financial", "trace3")
"""The traces measured by default (``../shared/data/hexgen-traces``; chess-bird when absent)."""
WINDOWS: tuple[int, ...] = (28, 100, 300, 500)
"""Window sizes (workflows) measured by default."""
LOAD = 0.85
"""The run's rate as a fraction of the policy's capacity at its default alpha."""
TARGET_GAP = 0.03
"""Issue 13's target: tuned P95 within 3% of the best fixed alpha's."""

ProgressFn = Callable[[int], object]


def _measured(res: SimResult, warmup: int, total: int) -> Summary:
    """The summary of the workflows with id >= ``warmup`` (ids are in arrival order)."""
    kept = SimResult(workflows=[r for r in res.workflows if r.wid >= warmup], num_calls=res.num_calls)
    return summarize(kept, total=total - warmup)


@dataclass(frozen=True)
class FixedRun:
    """One alpha held for the whole run; ``summary`` over the measured workflows."""

    alpha: float
    summary: Summary


def run_fixed(setup: Setup, policy: str, rate: float, alpha: float, warmup: int) -> FixedRun:
    """The whole sequence at a fixed alpha, summarised over the workflows after the warm-up."""
    return FixedRun(alpha, _measured(simulate(setup, policy, rate, alpha=alpha)[1], warmup, setup.n_workflows))


@dataclass(frozen=True)
class Retune:
    """One tuning run during a tuned run: its virtual time, workflows replayed, the alpha chosen, whether it
    was applied, the alpha in force after it, and the wall time of ``tune_window``."""

    time_s: float
    window: int
    chosen: float
    applied: bool
    alpha: float
    seconds: float


@dataclass(frozen=True)
class TunedRun:
    """The sequence under the live tuner with one window size: ``summary`` over the measured workflows,
    ``initial_alpha`` the policy's default (in force until the first applied re-tune), ``skipped`` the runs
    that were due but found fewer than ``min_workflows`` in the window."""

    window: int
    summary: Summary
    initial_alpha: float
    retunes: tuple[Retune, ...]
    skipped: int

    def full_window_seconds(self) -> list[float]:
        """Wall times of the re-tunes that replayed a full window."""
        return [r.seconds for r in self.retunes if r.window == self.window]

    @property
    def applied(self) -> int:
        """Re-tunes whose alpha was applied."""
        return sum(r.applied for r in self.retunes)


class _LiveTuner:
    """The live ``AlphaTuner``'s loop in virtual time: the same recorder, ``Retuner`` and ``tune_window``."""

    def __init__(self, cfg: TuningConfig, scheduler: Scheduler, workers: Sequence[WorkerInfo], seed: int) -> None:
        self.recorder = WindowRecorder(cfg.window_workflows, cfg.max_age_s)
        self.retuner = Retuner(cfg, self.recorder)
        self.cfg = cfg
        self.scheduler = scheduler
        self.workers = list(workers)
        self.seed = seed
        self.next_check: float | None = None
        self.retunes: list[Retune] = []
        self.skipped = 0

    def tick(self, now: float) -> None:
        """The task's wake-ups up to ``now`` (every ``interval_s``): tune when a run is due."""
        if self.next_check is None:
            self.next_check = now + self.cfg.interval_s
            return
        if now < self.next_check:
            return
        self.next_check += math.ceil((now - self.next_check) / self.cfg.interval_s + 1e-12) * self.cfg.interval_s
        if not self.retuner.due():
            return
        entries = self.retuner.take_window(now)
        if not self.retuner.enough(entries):
            self.skipped += 1
            return
        sched = self.scheduler
        current = sched.alpha
        out = tune_window(self.workers, sched.policy.name, entries, self.retuner.grid(), self.seed, current)
        applied = self.retuner.should_apply(out, current)
        if applied:
            sched.alpha = out.chosen
        self.retunes.append(Retune(now, out.workflows, out.chosen, applied, sched.alpha, out.seconds))


class _Watched(StagedWorkflow):
    """A workflow of the tuned run: its arrival wakes the tuner, its end is recorded in the window."""

    tuner: _LiveTuner

    def start(self) -> list[CallSpec]:
        """The simulator calls this at the arrival time: the tuner's clock."""
        self.tuner.tick(self.arrival)
        return super().start()

    def complete(self, spec: CallSpec) -> list[CallSpec]:
        """Record the workflow in the window once its last call returned (as the live gateway does)."""
        nxt = super().complete(spec)
        if self.done:
            self.tuner.recorder.record(self)
        return nxt


def run_tuned(setup: Setup, policy: str, rate: float, cfg: TuningConfig, warmup: int) -> TunedRun:
    """The sequence from the policy's default alpha, re-tuned as the live gateway re-tunes it."""
    sim = Simulator(setup.workers, policy, seed=setup.seed)
    initial = sim.scheduler.alpha
    tuner = _LiveTuner(cfg, sim.scheduler, setup.workers, setup.seed)
    wfs = []
    for w in setup.workflows(rate):
        watched = _Watched(w.wid, w.tenant, w.arrival, w.deadline, w.stages, w.template)
        watched.tuner = tuner
        wfs.append(watched)
    res = sim.run(wfs)
    summary = _measured(res, warmup, setup.n_workflows)
    return TunedRun(cfg.window_workflows, summary, initial, tuple(tuner.retunes), tuner.skipped)


@dataclass
class TraceResult:
    """One trace: its rate, every fixed alpha, and the tuned runs."""

    trace: str
    seed: int
    fluid_bound_qps: float
    capacity_qps: float
    rate_qps: float
    slo_s: float
    default_alpha: float
    fixed: list[FixedRun]
    tuned: list[TunedRun]

    @property
    def best(self) -> FixedRun:
        """The best fixed alpha in hindsight: the lowest measured P95 (ties: higher SLO attainment)."""
        return min(self.fixed, key=lambda r: (r.summary.p95_s, -r.summary.slo_attainment))

    def fixed_at(self, alpha: float) -> FixedRun | None:
        """The fixed run at ``alpha`` (None when it is not on the grid)."""
        return next((r for r in self.fixed if abs(r.alpha - alpha) < 1e-9), None)

    def gap(self, p95: float) -> float:
        """``p95`` over the best fixed alpha's, minus one (0.02: 2% worse)."""
        best = self.best.summary.p95_s
        return p95 / best - 1.0 if best > 0 and math.isfinite(best) else math.nan

    def to_json(self) -> dict[str, Any]:
        """Fixed runs, the best, and per window: P95, SLO, gap, re-tunes (time, window, chosen, applied, s)."""
        best = self.best
        default = self.fixed_at(self.default_alpha)
        doc = {k: getattr(self, k) for k in ("trace", "seed", "fluid_bound_qps", "capacity_qps", "rate_qps", "slo_s")}
        figures = ("p50_s", "p95_s", "p99_s", "slo_attainment")
        return {
            **doc,
            "default_alpha": self.default_alpha,
            "best_alpha": best.alpha,
            "best_p95_s": best.summary.p95_s,
            "default_gap_vs_best": self.gap(default.summary.p95_s) if default else None,
            "fixed": [{"alpha": r.alpha, **{k: getattr(r.summary, k) for k in figures}} for r in self.fixed],
            "tuned": [self._tuned_json(t) for t in self.tuned],
        }

    def _tuned_json(self, t: TunedRun) -> dict[str, Any]:
        secs = t.full_window_seconds()
        stats: dict[str, Callable[[list[float]], float]] = {"mean": statistics.fmean, "median": statistics.median}
        stats["max"] = max
        return {
            "window_workflows": t.window,
            "p95_s": t.summary.p95_s,
            "slo_attainment": t.summary.slo_attainment,
            "gap_vs_best": self.gap(t.summary.p95_s),
            "within_target": bool(self.gap(t.summary.p95_s) <= TARGET_GAP),
            "retunes": len(t.retunes),
            "applied": t.applied,
            "skipped": t.skipped,
            "retune_seconds": {k: f(secs) if secs else None for k, f in stats.items()} | {"count": len(secs)},
            "alphas": [
                {"time_s": r.time_s, "window": r.window, "chosen": r.chosen, "applied": r.applied} for r in t.retunes
            ],
        }


@dataclass
class TunerReport:
    """Every trace's result and the run's parameters."""

    cluster: list[str]
    policy: str
    slo_scale: float
    load: float
    warmup: int
    measured: int
    seeds: list[int]
    tuning: TuningConfig
    traces: list[TraceResult]
    jobs: int
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def by_window(self) -> dict[int, dict[str, float | bool]]:
        """Per window size, over every trace and seed: the mean and worst gap, and whether all are in target."""
        gaps: dict[int, list[float]] = {}
        for t in self.traces:
            for r in t.tuned:
                gaps.setdefault(r.window, []).append(t.gap(r.summary.p95_s))
        return {
            n: {"mean_gap": statistics.fmean(g), "max_gap": max(g), "all_within_target": max(g) <= TARGET_GAP}
            for n, g in sorted(gaps.items())
        }

    def to_json(self) -> dict[str, Any]:
        """The JSON document (non-finite numbers are null): parameters, ``by_window`` and every trace."""
        return json_safe(
            {
                **{k: getattr(self, k) for k in ("cluster", "policy", "slo_scale")},
                "load_of_capacity": self.load,
                "warmup_workflows": self.warmup,
                "measured_workflows": self.measured,
                "seeds": self.seeds,
                "target_gap": TARGET_GAP,
                "tuning": self.tuning.model_dump(exclude={"window_workflows"}),
                "jobs": self.jobs,
                "seconds": self.seconds,
                "notes": self.notes,
                "by_window": {str(n): d for n, d in self.by_window().items()},
                "traces": [t.to_json() for t in self.traces],
            }
        )


def _capacity(setup: Setup, policy: str, rel_tol: float) -> float:
    return Bench(setup).capacity(policy, setup.bound.rate_qps, rel_tol=rel_tol)


def bench_steps(n_traces: int, n_seeds: int, grid: int, windows: int) -> int:
    """Progress steps of ``run_tuner_bench``: per trace a capacity, and per seed every fixed alpha and window."""
    return n_traces * (1 + n_seeds * (grid + windows))


def _check_question(pol: Policy, setups: Sequence[Setup], windows: Sequence[int], load: float, warmup: int) -> None:
    """``ValueError`` for a tuner bench that cannot run: a policy without alpha, no trace, a window under one
    workflow, a load out of range, or a warm-up that leaves nothing to measure."""
    if not pol.uses_alpha:
        raise ValueError(f"{pol.name} does not use alpha: there is nothing to tune")
    if not setups:
        raise ValueError("no trace to measure")
    if not windows or any(n < 1 for n in windows):
        raise ValueError(f"window sizes must be at least 1 workflow, got {list(windows)}")
    if not 0 < load <= 1.5:
        raise ValueError(f"load must be in (0, 1.5], got {load}")
    for s in setups:
        if not 0 <= warmup < s.n_workflows:
            raise ValueError(f"warmup must leave measured workflows: {warmup} of {s.n_workflows}")


def run_tuner_bench(
    setups: Sequence[Setup],
    *,
    policy: str = "hexgen",
    warmup: int,
    windows: Sequence[int] = WINDOWS,
    seeds: Sequence[int] | None = None,
    tuning: TuningConfig | None = None,
    load: float = LOAD,
    rel_tol: float = 0.02,
    jobs: int = 1,
    progress: ProgressFn | None = None,
) -> TunerReport:
    """Capacity, every fixed alpha and the tuned runs for each setup.

    The capacity is searched on each setup's own seed; the runs repeat on every seed of ``seeds``.
    ``tuning`` gives every setting but the window size (``windows``); each setup's ``n_workflows`` is
    warm-up plus measured workflows."""
    t0 = time.perf_counter()
    pol = get_policy(policy)
    _check_question(pol, setups, windows, load, warmup)
    base = tuning if tuning is not None else TuningConfig()
    # One config per window size, its minimum capped at the window.
    sized = [{"window_workflows": n, "min_workflows": min(base.min_workflows, n)} for n in windows]
    cfgs = [TuningConfig.model_validate(base.model_dump() | w) for w in sized]
    grid = Retuner(base, WindowRecorder(1)).grid()

    caps = run_parallel(jobs, [(_capacity, (s, policy, rel_tol)) for s in setups], progress)
    rates = [c * load for c in caps]
    runs: list[tuple[int, Setup]] = []
    for i, s in enumerate(setups):
        for seed in seeds if seeds is not None else [s.seed]:
            runs.append((i, s if seed == s.seed else replace(s, seed=seed)))
    calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
    by_size = sorted(cfgs, key=lambda c: -c.window_workflows)  # the slowest jobs first, so none starts last
    for i, s in runs:
        calls += [(run_tuned, (s, policy, rates[i], c, warmup)) for c in by_size]
    for i, s in runs:
        calls += [(run_fixed, (s, policy, rates[i], a, warmup)) for a in grid]
    results = run_parallel(jobs, calls, progress)
    nt, nf = len(cfgs), len(grid)
    traces = []
    for j, (i, s) in enumerate(runs):
        tuned = sorted(results[j * nt : (j + 1) * nt], key=lambda t: t.window)
        fixed = sorted(results[len(runs) * nt + j * nf :][:nf], key=lambda f: f.alpha)
        traces.append(
            TraceResult(
                trace=s.trace,
                seed=s.seed,
                fluid_bound_qps=s.bound.rate_qps,
                capacity_qps=caps[i],
                rate_qps=rates[i],
                slo_s=s.slo_s,
                default_alpha=pol.default_alpha,
                fixed=fixed,
                tuned=tuned,
            )
        )
    first = setups[0]
    return TunerReport(
        cluster=[w.profile.gpu for w in first.workers],
        policy=policy,
        slo_scale=first.slo_scale,
        load=load,
        warmup=warmup,
        measured=first.n_workflows - warmup,
        seeds=sorted({s.seed for _, s in runs}),
        tuning=base,
        traces=traces,
        jobs=jobs,
        seconds=time.perf_counter() - t0,
    )


def format_tuner_report(report: TunerReport, cluster: str) -> str:
    """The printed form: per trace the fixed alphas, then per window the tuned P95 against the best."""
    cfg = report.tuning
    lines = [
        f"{report.policy} on {cluster} [{', '.join(report.cluster)}], SLO {report.slo_scale:g}x, "
        f"rate {report.load:g} x "
        f"its capacity at the default alpha; {report.warmup} warm-up + {report.measured} measured workflows, "
        f"seeds {', '.join(map(str, report.seeds))}",
        f"tuner: re-tune every {cfg.every_workflows} finished workflows (checked every {cfg.interval_s:g} s), "
        f"hysteresis {cfg.hysteresis:g}, staleness guard {cfg.max_age_s:g} s",
        *report.notes,
        "best fixed alpha in hindsight (P95 over the measured workflows):",
        _fixed_table(report),
        f"tuned as live (target: P95 within {TARGET_GAP:.0%} of the best fixed alpha's):",
        _tuned_table(report),
    ]
    for n, d in report.by_window().items():
        verdict = "all within target" if d["all_within_target"] else "NOT all within target"
        lines.append(f"window {n}: mean gap {d['mean_gap']:+.1%}, worst {d['max_gap']:+.1%} ({verdict})")
    lines.append(
        f"({report.seconds:.0f} s, {report.jobs} processes; tune_s: wall time of one re-tune on a full window)"
    )
    return "\n".join(lines)


def _fixed_table(report: TunerReport) -> str:
    """The best fixed alpha in hindsight per trace, with the P95 at every alpha."""
    rows = []
    for t in report.traces:
        best, default = t.best, t.fixed_at(t.default_alpha)
        gap = f"{t.gap(default.summary.p95_s):+.1%}" if default else "-"
        head = [t.trace, str(t.seed), f"{t.capacity_qps:.4f}", f"{t.rate_qps:.4f}", f"{best.alpha:.1f}"]
        p95s = " ".join(fmt(f.summary.p95_s, 0) for f in t.fixed)
        rows.append([*head, fmt(best.summary.p95_s), f"{best.summary.slo_attainment:.3f}", gap, p95s])
    grid = " ".join(f"{f.alpha:g}" for f in report.traces[0].fixed) if report.traces else ""
    heads = ["trace", "seed", "cap_qps", "rate_qps", "best_a", "p95_s", "slo", "default_gap"]
    return table([*heads, f"p95_s at alpha {grid}"], rows, left=1)


def _tuned_table(report: TunerReport) -> str:
    """The tuned runs per trace and window against the best fixed alpha."""
    rows = []
    for t in report.traces:
        for r in t.tuned:
            secs = r.full_window_seconds()
            gap = t.gap(r.summary.p95_s)
            head = [t.trace, str(t.seed), str(r.window), fmt(r.summary.p95_s), f"{r.summary.slo_attainment:.3f}"]
            retunes = f"{len(r.retunes)} ({r.applied})"
            tune_s = [f"{statistics.median(secs):.2f}", f"{max(secs):.2f}"] if secs else ["-", "-"]
            alphas = " ".join(f"{a:g}" for a in _alpha_path(r))
            rows.append([*head, f"{gap:+.1%}", "yes" if gap <= TARGET_GAP else "no", retunes, alphas, *tune_s])
    heads = ["trace", "seed", "window", "p95_s", "slo", "gap", "ok"]
    return table([*heads, "retunes (applied)", "alphas", "tune_s_med", "tune_s_max"], rows, left=1)


def _alpha_path(run: TunedRun) -> list[float]:
    """The alphas in force, each change once (the default first)."""
    path = [run.initial_alpha]
    for r in run.retunes:
        if path[-1] != r.alpha:
            path.append(r.alpha)
    return path
