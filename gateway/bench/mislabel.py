"""``hexflow bench mislabel``: a worker whose profile is wrong at start, corrected online by the refit.

    hexflow bench mislabel [--cluster paper-4gpu] [--worker L40S-3] [--label A100] [--rate 0.2]
        [--workflows 400] [--window 500] [--interval-s 30] [--min-calls 100] [--window-calls 600] [--json OUT]

One worker of the cluster is *labelled* with another GPU's profile (``--label``: the scheduler plans with
that profile, its capacity derived from it, as a cluster file entry ``profile: A100`` would do) while its
engine runs at its own GPU's speed (the simulator's ``engine_profiles``). The same workload (the
``chess-bird`` trace, Poisson arrivals at ``--rate``, prefix caching on) is simulated four times with the
same seed:

* ``correct``: every worker labelled right (the reference: the shares the scheduler should reach);
* ``correct+refit``: the same with the online refit (it must not hurt);
* ``mislabel``: the wrong label, the ratio EWMA only (what the gateway did before the refit);
* ``mislabel+refit``: the wrong label with the refit (``gateway.sim.refit``).

Per run: the dispatch share of every worker in windows of ``--window`` calls (in dispatch order), the
mislabelled worker's share over the second half of the calls (``late_share``), SLO attainment and P95,
every refit attempt (time, calls dispatched so far, result, median errors before and after) with the
worker's predicted standard-workflow latency over its engine's (1 = its profile is right), and the
worker's ratio EWMAs at each refit check. ``converged_after_calls``: calls dispatched (cluster-wide)
until that latency ratio stays within ``CONVERGED`` of 1 from then on.

The exit status is 0 when the refit moved the mislabelled worker's late share closer to the correct
run's than without it and its profile converged, else 1.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.bench.simbench import Setup
from gateway.bench.stats import fmt, table
from gateway.config import load_cluster, load_gpu_catalog
from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.sim.calibrate import workflow_latency
from gateway.sim.metrics import summarize
from gateway.sim.refit import FitOutcome, RefitSettings, Refitter, constants_of
from gateway.sim.simulator import CallTimeline, Simulator
from gateway.sim.workload.traces import load_queries

__all__ = ["CONVERGED", "MislabelReport", "MislabelRun", "RefitEvent", "format_mislabel_report", "run_mislabel"]

CONVERGED = 1.25
"""A profile has converged when its predicted standard-workflow latency is within this factor of the engine's."""

RUNS = ("correct", "correct+refit", "mislabel", "mislabel+refit")


@dataclass(frozen=True, slots=True)
class RefitEvent:
    """One refit attempt of a run."""

    t: float
    calls: int
    worker: str
    result: str
    current_error: float | None
    fit_error: float | None
    latency_ratio: float
    """The worker's predicted standard-workflow latency after the attempt over its engine's."""


@dataclass
class MislabelRun:
    """One simulated run: shares per window, outcomes, refits, ratios."""

    name: str
    windows: list[list[float]]
    late_share: float
    slo_attainment: float
    p95_s: float
    calls: int
    final_constants: tuple[float, float, float, float]
    final_latency_ratio: float
    refits: list[RefitEvent] = field(default_factory=list)
    ratios: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    """``(time, kind -> ratio)`` of the mislabelled worker at every refit check."""
    converged_after_calls: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The run as plain data."""
        return {
            "name": self.name,
            "windows": self.windows,
            "late_share": self.late_share,
            "slo_attainment": self.slo_attainment,
            "p95_s": self.p95_s if math.isfinite(self.p95_s) else None,
            "calls": self.calls,
            "final_constants": list(self.final_constants),
            "final_latency_ratio": self.final_latency_ratio,
            "converged_after_calls": self.converged_after_calls,
            "refits": [_event_json(e) for e in self.refits],
            "ratios": [{"t": t, "ratios": r} for t, r in self.ratios],
        }


def _event_json(e: RefitEvent) -> dict[str, Any]:
    return {
        "t": e.t,
        "calls": e.calls,
        "worker": e.worker,
        "result": e.result,
        "current_error": e.current_error,
        "fit_error": e.fit_error,
        "latency_ratio": e.latency_ratio,
    }


@dataclass
class MislabelReport:
    """The four runs and the setting."""

    cluster: str
    worker: str
    label: str
    rate_qps: float
    workflows: int
    window: int
    settings: RefitSettings
    worker_names: list[str]
    engine_constants: tuple[float, float, float, float]
    label_constants: tuple[float, float, float, float]
    label_latency_ratio: float
    runs: dict[str, MislabelRun]

    def refit_helped(self) -> bool:
        """The refit moved the late share toward the correct run's and the profile converged."""
        right = self.runs["correct"].late_share
        fixed = self.runs["mislabel+refit"]
        closer = abs(fixed.late_share - right) < abs(self.runs["mislabel"].late_share - right)
        return closer and fixed.converged_after_calls is not None

    def to_json(self) -> dict[str, Any]:
        """The report as plain data."""
        return {
            "cluster": self.cluster,
            "worker": self.worker,
            "label": self.label,
            "rate_qps": self.rate_qps,
            "workflows": self.workflows,
            "window": self.window,
            "settings": _settings_json(self.settings),
            "workers": self.worker_names,
            "engine_constants": list(self.engine_constants),
            "label_constants": list(self.label_constants),
            "label_latency_ratio": self.label_latency_ratio,
            "runs": {k: r.to_json() for k, r in self.runs.items()},
            "refit_helped": self.refit_helped(),
        }


def _settings_json(s: RefitSettings) -> dict[str, float]:
    return {k: getattr(s, k) for k in RefitSettings.__dataclass_fields__}


class _Recording(Refitter):
    """A refitter that also records the watched worker's ratios at every check; ``apply_fits`` False: only that."""

    def __init__(self, settings: RefitSettings, watched: int, apply_fits: bool) -> None:
        super().__init__(settings)
        self.watched = watched
        self.apply_fits = apply_fits
        self.ratios: list[tuple[float, dict[str, float]]] = []

    def step(self, sched: Scheduler, now: float) -> list[tuple[str, FitOutcome]]:
        self.ratios.append((now, {k: round(r, 4) for k, (r, _) in sched.estimator.ratios(self.watched, now).items()}))
        return super().step(sched, now) if self.apply_fits else []


def _converged_after(events: Sequence[RefitEvent], start_ratio: float) -> int | None:
    """Calls until the latency ratio is within ``CONVERGED`` of 1 and stays there (None: never)."""
    lim = math.log(CONVERGED)
    ok_from: int | None = 0 if abs(math.log(start_ratio)) <= lim else None
    for e in events:
        inside = abs(math.log(e.latency_ratio)) <= lim
        if inside and ok_from is None:
            ok_from = e.calls
        elif not inside:
            ok_from = None
    return ok_from


def run_mislabel(
    *,
    cluster: str = "paper-4gpu",
    worker: str = "L40S-3",
    label: str = "A100",
    rate: float = 0.2,
    n_workflows: int = 400,
    window: int = 500,
    seed: int = 0,
    settings: RefitSettings | None = None,
    policy: str = "hexgen",
) -> MislabelReport:
    """Simulate the four runs (module docstring). ``ValueError`` for an unknown worker or label."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a positive number, got {rate}")
    if n_workflows < 10 or window < 10:
        raise ValueError("at least 10 workflows and windows of at least 10 calls are needed")
    s = settings if settings is not None else RefitSettings(interval_s=30.0, min_calls=100, window_calls=600)
    catalog = load_gpu_catalog()
    workers = load_cluster(cluster, catalog)
    names = [w.name for w in workers]
    if worker not in names:
        raise ValueError(f"unknown worker {worker!r} in {cluster}; workers: {', '.join(names)}")
    w = names.index(worker)
    truth = [x.profile for x in workers]
    model = truth[w].model
    labels = sorted(catalog.profiles.get(model, {}))
    if label not in labels:
        raise ValueError(f"no {model} profile labelled {label!r}; known: {', '.join(labels)}")
    lab = catalog.profile(label, model)
    mis = list(workers)
    mis[w] = replace(workers[w], profile=lab, capacity=lab.derived_capacity(), profile_source="catalogue")
    queries = load_queries("chess-bird", n_workflows, random.Random(seed + 1))
    setup = Setup(
        workers=workers,
        queries=queries,
        trace="chess-bird",
        n_workflows=n_workflows,
        slo_scale=3.0,
        seed=seed,
        prefix_caching=True,
    )
    ref = workflow_latency(truth[w])
    runs: dict[str, MislabelRun] = {}
    plans: list[tuple[str, list[WorkerInfo], bool]] = [
        ("correct", workers, False),
        ("correct+refit", workers, True),
        ("mislabel", mis, False),
        ("mislabel+refit", mis, True),
    ]
    for name, ws, refit in plans:
        rec = _Recording(s, w, refit)
        sim = Simulator(ws, policy, seed=seed, record_calls=True, prefix_caching=True, engine_profiles=truth, refit=rec)
        wfs = setup.workflows(rate)
        res = sim.run(wfs)
        summ = summarize(res, total=len(wfs))
        calls = sorted(res.calls, key=lambda c: c.ready)
        shares = [_shares(calls[i : i + window], len(ws)) for i in range(0, len(calls), window)]
        half = calls[len(calls) // 2 :]
        late = sum(1 for c in half if c.worker == w) / len(half) if half else 0.0
        ready = [c.ready for c in calls]
        events = [
            RefitEvent(
                t=t,
                calls=_count_upto(ready, t),
                worker=out.job.info.name,
                result=r,
                current_error=out.current_error,
                fit_error=out.fit_error,
                latency_ratio=workflow_latency(out.profile if r == "applied" and out.profile else out.job.info.profile)
                / ref,
            )
            for t, r, out in sim.refits
            if out.job.worker == w
        ]
        final = sim.scheduler.workers[w].profile
        run = MislabelRun(
            name=name,
            windows=shares,
            late_share=round(late, 4),
            slo_attainment=summ.slo_attainment,
            p95_s=summ.p95_s,
            calls=len(calls),
            final_constants=constants_of(final),
            final_latency_ratio=workflow_latency(final) / ref,
            refits=events,
            ratios=rec.ratios,
        )
        start = workflow_latency(ws[w].profile) / ref
        run.converged_after_calls = _converged_after(events if refit else [], start)
        runs[name] = run
    return MislabelReport(
        cluster=cluster,
        worker=worker,
        label=label,
        rate_qps=rate,
        workflows=n_workflows,
        window=window,
        settings=s,
        worker_names=names,
        engine_constants=constants_of(truth[w]),
        label_constants=constants_of(lab),
        label_latency_ratio=workflow_latency(lab) / ref,
        runs=runs,
    )


def _shares(calls: Sequence[CallTimeline], n_workers: int) -> list[float]:
    """Each worker's share of ``calls``."""
    counts = [0] * n_workers
    for c in calls:
        counts[c.worker] += 1
    return [round(k / len(calls), 4) for k in counts]


def _count_upto(sorted_times: Sequence[float], t: float) -> int:
    return bisect.bisect_right(sorted_times, t)


def format_mislabel_report(rep: MislabelReport) -> str:
    """The text ``hexflow bench mislabel`` prints."""
    w = rep.worker_names.index(rep.worker)
    lines = [
        f"{rep.worker} of {rep.cluster} labelled {rep.label}: its profile predicts {rep.label_latency_ratio:.2f}x "
        f"its engine's standard-workflow latency; {rep.workflows} chess-bird workflows at {rep.rate_qps:g}/s; "
        f"refit every {rep.settings.interval_s:g} s (min {rep.settings.min_calls} calls, window "
        f"{rep.settings.window_calls}, max step x{rep.settings.max_step:g})",
        "",
        f"share of {rep.worker} per window of {rep.window} calls (dispatch order):",
    ]
    n = max(len(r.windows) for r in rep.runs.values())
    rows = []
    for i in range(n):
        row = [f"{i * rep.window}-{(i + 1) * rep.window - 1}"]
        for name in RUNS:
            ws = rep.runs[name].windows
            row.append(f"{ws[i][w]:.3f}" if i < len(ws) else "-")
        rows.append(row)
    lines.append(table(["calls", *RUNS], rows))
    lines.append("")
    rows = [
        [
            name,
            f"{r.late_share:.3f}",
            fmt(r.slo_attainment, 3),
            fmt(r.p95_s),
            f"{r.final_latency_ratio:.2f}",
            "-" if r.converged_after_calls is None else str(r.converged_after_calls),
            str(sum(1 for e in r.refits if e.result == "applied")),
        ]
        for name, r in rep.runs.items()
    ]
    lines.append(
        table(["run", "late share", "SLO", "P95 s", "latency ratio", "converged after calls", "refits applied"], rows)
    )
    fixed = rep.runs["mislabel+refit"]
    lines += ["", f"refits of {rep.worker} (mislabel+refit):"]
    rows = [
        [
            f"{e.t:.0f}",
            str(e.calls),
            e.result,
            "-" if e.current_error is None else f"{e.current_error:.1%}",
            "-" if e.fit_error is None else f"{e.fit_error:.1%}",
            f"{e.latency_ratio:.2f}",
        ]
        for e in fixed.refits
        if e.result != "kept"
    ]
    head = ["t s", "calls", "result", "error before", "fit error", "latency ratio"]
    lines.append(table(head, rows) if rows else "  none")
    kept = [e.current_error for e in fixed.refits if e.result == "kept"]
    errs = [x for x in kept if x is not None]
    if errs:
        lines.append(
            f"  and {len(kept)} attempts that kept the profile (no gain of {rep.settings.min_gain:.0%}); "
            f"median error of the profile in use then {min(errs):.1%}-{max(errs):.1%}"
        )
    mis = rep.runs["mislabel"]
    lines += ["", f"ratio EWMAs of {rep.worker} at the refit checks (mean over kinds), mislabel / mislabel+refit:"]
    pairs = []
    for (t, a), (_, b) in zip(mis.ratios, fixed.ratios, strict=False):
        ma = sum(a.values()) / len(a) if a else 1.0
        mb = sum(b.values()) / len(b) if b else 1.0
        pairs.append(f"{t:.0f}s {ma:.2f}/{mb:.2f}")
    lines.append("  " + ", ".join(pairs[:24]) + (" ..." if len(pairs) > 24 else ""))
    verdict = "refit helped" if rep.refit_helped() else "refit did NOT bring the share back"
    lines += [
        "",
        f"late share: correct {rep.runs['correct'].late_share:.3f}, mislabel {mis.late_share:.3f}, "
        f"mislabel+refit {fixed.late_share:.3f}: {verdict}",
    ]
    return "\n".join(lines)
