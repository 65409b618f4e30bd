"""``hexflow bench mislabel``: a worker labelled with another GPU's profile, corrected online by the refit;
four simulated runs (``RUNS``; three live with ``--live``), each worker's dispatch share per window, SLO
and P95, and every refit attempt. Method: docs/benchmarks.md "Mislabelled profile"."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx

from gateway.bench.replay import ReplayReport, ReplayWorkflow, replay, replay_setup, replay_workload
from gateway.bench.rig import LiveSettings, Rig, bench_tenant, sampling, say_stderr
from gateway.bench.simbench import Setup
from gateway.bench.stats import fmt, json_safe, positive, table
from gateway.config import ClusterConfig, GpuCatalog, build_workers, load_cluster, load_cluster_config, load_gpu_catalog
from gateway.core.profile import PerfProfile
from gateway.core.records import CallOutcome
from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.profiling.fit import workflow_latency
from gateway.profiling.refit import FitOutcome, RefitSettings, Refitter, constants_of
from gateway.sim.metrics import summarize
from gateway.sim.simulator import Simulator
from gateway.sim.workload.traces import load_queries

CONVERGED = 1.25
"""A profile has converged when its predicted standard-workflow latency is within this factor of the engine's."""

RUNS = ("correct", "correct+refit", "mislabel", "mislabel+refit")
DEFAULT_SETTINGS = RefitSettings(interval_s=30.0, min_calls=100, window_calls=600)


@dataclass(frozen=True)
class Scenario:
    """What the simulated and the live benchmark share: which worker of which cluster is labelled with which
    GPU's profile, the traffic (chess-bird workflows per second, seed) and the refit's settings."""

    cluster: str = "paper-4gpu"
    worker: str = "L40S-3"
    label: str = "A100"
    rate: float = 0.2
    seed: int = 0
    settings: RefitSettings = DEFAULT_SETTINGS

    def __post_init__(self) -> None:
        positive("rate", self.rate)


@dataclass(frozen=True, slots=True)
class RefitEvent:
    """One refit attempt of a run; ``latency_ratio``: the worker's predicted standard-workflow latency after it
    over its engine's."""

    t: float
    calls: int
    worker: str
    result: str
    current_error: float | None
    fit_error: float | None
    latency_ratio: float


@dataclass
class _Run:
    """What a simulated and a live run both report: the watched worker's share per window, its share of the
    second half of the calls, SLO attainment and P95."""

    name: str
    windows: list[Any]
    late_share: float
    slo_attainment: float
    p95_s: float

    def outcome_cells(self) -> list[str]:
        """Late share, SLO and P95 as printed."""
        return [f"{self.late_share:.3f}", fmt(self.slo_attainment, 3), fmt(self.p95_s)]

    def to_json(self) -> dict[str, Any]:
        """The run as plain data (non-finite numbers null)."""
        return json_safe(asdict(self))


@dataclass
class MislabelRun(_Run):
    """One simulated run: shares per window, outcomes, refits, the watched worker's ``(time, kind -> ratio)``
    at every refit check."""

    calls: int
    final_constants: tuple[float, float, float, float]
    final_latency_ratio: float
    refits: list[RefitEvent] = field(default_factory=list)
    ratios: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    converged_after_calls: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The run as plain data."""
        return {**super().to_json(), "ratios": [{"t": t, "ratios": r} for t, r in self.ratios]}


R = TypeVar("R", bound=_Run)


@dataclass
class _Report(Generic[R]):
    """What a simulated and a live report both hold: the scenario and the runs by name."""

    cluster: str
    worker: str
    label: str
    rate_qps: float
    workflows: int
    settings: RefitSettings
    runs: dict[str, R]

    def _share_closer(self) -> bool:
        """mislabel+refit's late share is nearer the correct run's than mislabel's."""
        right = self.runs["correct"].late_share
        return abs(self.runs["mislabel+refit"].late_share - right) < abs(self.runs["mislabel"].late_share - right)

    def refit_helped(self) -> bool:
        """The refit moved the worker's late share toward the correct run's."""
        return self._share_closer()

    def to_json(self) -> dict[str, Any]:
        """The report as plain data."""
        runs = {k: r.to_json() for k, r in self.runs.items()}
        return {**asdict(self), "runs": runs, "refit_helped": self.refit_helped()}

    def verdict(self) -> str:
        """The closing line's verdict."""
        return "refit helped" if self.refit_helped() else "refit did NOT bring the share back"


@dataclass
class MislabelReport(_Report[MislabelRun]):
    """The four simulated runs and the setting."""

    window: int
    worker_names: list[str]
    engine_constants: tuple[float, float, float, float]
    label_constants: tuple[float, float, float, float]
    label_latency_ratio: float

    def refit_helped(self) -> bool:
        """The refit moved the late share toward the correct run's and the profile converged."""
        return self._share_closer() and self.runs["mislabel+refit"].converged_after_calls is not None

    def to_json(self) -> dict[str, Any]:
        """The report as plain data."""
        doc = super().to_json()
        doc["workers"] = doc.pop("worker_names")
        return doc


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
    scenario: Scenario | None = None, *, n_workflows: int = 400, window: int = 500, policy: str = "hexgen"
) -> MislabelReport:
    """Simulate the four runs (``RUNS``). ``ValueError`` for an unknown worker or label."""
    sc = scenario if scenario is not None else Scenario()
    if n_workflows < 10 or window < 10:
        raise ValueError("at least 10 workflows and windows of at least 10 calls are needed")
    cluster, worker, label, seed = sc.cluster, sc.worker, sc.label, sc.seed
    catalog = load_gpu_catalog()
    workers = load_cluster(cluster, catalog)
    names = [w.name for w in workers]
    w = _check_label(catalog, cluster, [(x.name, x.profile.model) for x in workers], worker, label)
    lab = catalog.profile(label, workers[w].profile.model)
    mis = list(workers)
    mis[w] = replace(workers[w], profile=lab, capacity=lab.derived_capacity(), profile_source="catalogue")
    queries = load_queries("chess-bird", n_workflows, random.Random(seed + 1))
    setup = Setup(
        workers, queries, "chess-bird", n_workflows=n_workflows, slo_scale=3.0, seed=seed, prefix_caching=True
    )
    ref = workflow_latency(workers[w].profile)
    plans = [("correct", workers, False), ("correct+refit", workers, True), ("mislabel", mis, False)]
    plans.append(("mislabel+refit", mis, True))
    runs = {
        name: _simulated_run(name, ws, refit, setup, sc, w, window, policy, [x.profile for x in workers])
        for name, ws, refit in plans
    }
    return MislabelReport(
        cluster, worker, label, sc.rate, n_workflows, sc.settings, runs, window, names,
        constants_of(workers[w].profile)[:4], constants_of(lab)[:4], workflow_latency(lab) / ref,
    )  # fmt: skip


def _check_label(catalog: GpuCatalog, cluster: str, workers: list[tuple[str, str]], worker: str, label: str) -> int:
    """The index of ``worker`` among the cluster's ``(name, model)``; ``ValueError`` for an unknown worker or
    label."""
    names = [n for n, _ in workers]
    if worker not in names:
        raise ValueError(f"unknown worker {worker!r} in {cluster}; workers: {', '.join(names)}")
    model = workers[names.index(worker)][1]
    if label not in catalog.profiles.get(model, {}):
        known = ", ".join(sorted(catalog.profiles.get(model, {})))
        raise ValueError(f"no {model} profile labelled {label!r}; known: {known}")
    return names.index(worker)


def _simulated_run(
    name: str,
    ws: list[WorkerInfo],
    refit: bool,
    setup: Setup,
    sc: Scenario,
    w: int,
    window: int,
    policy: str,
    truth: list[PerfProfile],
) -> MislabelRun:
    """One simulated run on workers ``ws`` whose engines run ``truth``, worker ``w`` watched."""
    ref = workflow_latency(truth[w])
    rec = _Recording(sc.settings, w, refit)
    sim = Simulator(
        ws, policy, seed=setup.seed, record_calls=True, prefix_caching=True, engine_profiles=truth, refit=rec
    )
    wfs = setup.workflows(sc.rate)
    res = sim.run(wfs)
    summ = summarize(res, total=len(wfs))
    calls = sorted(res.calls, key=lambda c: c.ready)
    half = calls[len(calls) // 2 :]
    ready = [c.ready for c in calls]

    def ratio(r: str, out: FitOutcome) -> float:
        return workflow_latency(out.profile if r == "applied" and out.profile else out.job.info.profile) / ref

    events = [
        RefitEvent(
            t, bisect.bisect_right(ready, t), out.job.info.name, r, out.current_error, out.fit_error, ratio(r, out)
        )
        for t, r, out in sim.refits
        if out.job.worker == w
    ]
    final = sim.scheduler.workers[w].profile
    return MislabelRun(
        name=name,
        windows=[_shares(calls[i : i + window], len(ws)) for i in range(0, len(calls), window)],
        late_share=round(sum(1 for c in half if c.worker == w) / len(half), 4) if half else 0.0,
        slo_attainment=summ.slo_attainment,
        p95_s=summ.p95_s,
        calls=len(calls),
        final_constants=constants_of(final)[:4],
        final_latency_ratio=workflow_latency(final) / ref,
        refits=events,
        ratios=rec.ratios,
        converged_after_calls=_converged_after(events if refit else [], workflow_latency(ws[w].profile) / ref),
    )


def _shares(calls: Sequence[CallOutcome[None]], n_workers: int) -> list[float]:
    """Each worker's share of ``calls``."""
    counts = [0] * n_workers
    for c in calls:
        counts[c.worker] += 1
    return [round(k / len(calls), 4) for k in counts]


def _windows_table(head: str, label: Callable[[int], str], cells: dict[str, list[str]]) -> str:
    """One row per window (``label(i)``), one column per run (``-`` past a run's last window)."""
    n = max((len(c) for c in cells.values()), default=0)
    rows = [[label(i), *(c[i] if i < len(c) else "-" for c in cells.values())] for i in range(n)]
    return table([head, *cells], rows)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


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
    cells = {name: [f"{x[w]:.3f}" for x in rep.runs[name].windows] for name in RUNS}
    lines += [_windows_table("calls", lambda i: f"{i * rep.window}-{(i + 1) * rep.window - 1}", cells), ""]
    rows = []
    for name, r in rep.runs.items():
        converged = "-" if r.converged_after_calls is None else str(r.converged_after_calls)
        applied = str(sum(1 for e in r.refits if e.result == "applied"))
        rows.append([name, *r.outcome_cells(), f"{r.final_latency_ratio:.2f}", converged, applied])
    heads = ["run", "late share", "SLO", "P95 s", "latency ratio", "converged after calls", "refits applied"]
    lines.append(table(heads, rows))
    fixed = rep.runs["mislabel+refit"]
    lines += ["", f"refits of {rep.worker} (mislabel+refit):"]
    rows = [
        [f"{e.t:.0f}", str(e.calls), e.result, _pct(e.current_error), _pct(e.fit_error), f"{e.latency_ratio:.2f}"]
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
    lines += [
        "",
        f"late share: correct {rep.runs['correct'].late_share:.3f}, mislabel {mis.late_share:.3f}, "
        f"mislabel+refit {fixed.late_share:.3f}: {rep.verdict()}",
    ]
    return "\n".join(lines)


@dataclass
class LiveMislabelRun(_Run):
    """One live run: the mislabelled worker's share of completed calls per window (``(end of window in modelled
    s, share, calls)``), outcomes, refits, the times the gateway's outlier detection ejected it (a mislabelled
    worker looks slow to it), and what ``/v1/status`` said about it at every poll."""

    refits_applied: int
    refit_attempts: int
    final_profile: dict[str, Any]
    ejections: int = 0
    points: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LiveMislabelReport(_Report[LiveMislabelRun]):
    """The live runs and the setting."""

    time_scale: float
    wall_s: float


async def _replay_and_poll(
    workload: Sequence[ReplayWorkflow], rig: Rig, key: str, time_scale: float, poll_s: float, worker: str, desc: str
) -> tuple[ReplayReport, list[dict[str, Any]]]:
    """Replay ``workload`` while polling ``/v1/status`` every ``poll_s`` wall seconds for ``worker``."""
    points: list[dict[str, Any]] = []
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=5.0) as client:

        async def poll() -> None:
            try:
                ws = {w["name"]: w for w in (await client.get(f"{rig.url}/v1/status")).json()["workers"]}
                me = ws[worker]
                point: dict[str, Any] = {"t_s": round((time.monotonic() - t0) / time_scale, 3)}
                point["completed"] = {n: int(w["completed"]) for n, w in ws.items()}
                point["profile"] = me.get("profile")
                point["ratios"] = {k: v["ratio"] for k, v in me.get("estimate_ratios", {}).items()}
                points.append({**point, "ejections": me.get("ejections"), "ejected": me.get("ejected")})
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                pass  # a missed poll leaves a longer window

        run = replay(workload, gateway=rig.url, api_key=key, time_scale=time_scale, progress=False, desc=desc)
        rep = await sampling(run, poll, poll_s)
    return rep, points


def _live_windows(points: Sequence[dict[str, Any]], worker: str, window_s: float) -> list[tuple[float, float, int]]:
    """The worker's share of the calls completed in each window of ``window_s`` modelled seconds."""
    out: list[tuple[float, float, int]] = []
    last: dict[str, Any] | None = None
    for p in points:
        if last is None:
            last = p
            continue
        if p["t_s"] - last["t_s"] < window_s and p is not points[-1]:
            continue
        total = sum(p["completed"].values()) - sum(last["completed"].values())
        mine = p["completed"].get(worker, 0) - last["completed"].get(worker, 0)
        if total > 0:
            out.append((p["t_s"], round(mine / total, 4), total))
        last = p
    return out


def _late_share(points: Sequence[dict[str, Any]], worker: str) -> float:
    """The worker's share of the second half of all completed calls (from the polls)."""
    if not points:
        return math.nan
    end = points[-1]["completed"]
    total = sum(end.values())
    mid = next((p for p in points if sum(p["completed"].values()) >= total / 2), points[-1])
    rest = total - sum(mid["completed"].values())
    return round((end.get(worker, 0) - mid["completed"].get(worker, 0)) / rest, 4) if rest > 0 else math.nan


def run_mislabel_live(
    scenario: Scenario | None = None,
    *,
    n_workflows: int = 200,
    time_scale: float = 0.05,
    window_s: float = 100.0,
    log_dir: Path | None = None,
    say: Callable[[str], None] = say_stderr,
) -> LiveMislabelReport:
    """The mislabel benchmark through the live gateway over the emulated cluster (``--live``): the simulated
    runs' ``correct``, ``mislabel`` and ``mislabel+refit`` on one replayed workload, the gateway's cluster file
    naming ``profile: LABEL`` for the worker, the share measured on completed calls polled from ``/v1/status``
    every ``window_s / 4`` modelled seconds. Subprocess logs go to ``log_dir``."""
    sc = scenario if scenario is not None else Scenario()
    positive("time scale", time_scale)
    positive("window", window_s)
    worker, label, s = sc.worker, sc.label, sc.settings
    live = LiveSettings(sc.cluster, time_scale, sc.seed, log_dir, say)
    right, wrong = _labelled_cluster(sc.cluster, worker, label)
    setup = replay_setup(
        "chess-bird", build_workers(right, load_gpu_catalog()), workflows=n_workflows, seed=sc.seed, slo_scale=3.0
    )
    workload = replay_workload(setup, sc.rate)
    refit = {
        "interval_s": s.interval_s * time_scale,
        "min_calls": max(s.min_calls, 20),
        "window_calls": max(s.window_calls, 20),
        **{k: getattr(s, k) for k in ("max_step", "max_drift", "max_error", "min_gain")},
    }
    runs: dict[str, LiveMislabelRun] = {}
    t_start = time.monotonic()
    with live.folder("hexflow-mislabel-") as folder:
        key = bench_tenant(folder, max_concurrent_workflows=len(workload) + 1, deadline_s=setup.slo_s * time_scale)
        for name, cfg, on in (("correct", right, False), ("mislabel", wrong, False), ("mislabel+refit", wrong, True)):
            say(f"{name}: starting the emulated cluster and the gateway")
            sections = {"refit": {"enabled": on, **refit}}
            with live.rig(folder, name, gateway_cluster=cfg, sections=sections) as rig:
                poll_s = window_s * time_scale / 4
                rep, points = asyncio.run(_replay_and_poll(workload, rig, key, time_scale, poll_s, worker, name))
            last = points[-1] if points else {}
            prof = last.get("profile") or {}
            ref = prof.get("refit") or {}
            refits = int(ref.get("applied", 0)), int(ref.get("attempts", 0))
            windows, late = _live_windows(points, worker, window_s), _late_share(points, worker)
            outcome = (late, rep.slo_attainment, rep.p95_s, *refits, prof, int(last.get("ejections") or 0), points)
            run = runs[name] = LiveMislabelRun(name, windows, *outcome)
            say(f"{name}: late share {run.late_share:.3f}, SLO {run.slo_attainment:.3f}, refits {run.refits_applied}")
    return LiveMislabelReport(
        right.name, worker, label, sc.rate, len(workload), s, runs, time_scale, time.monotonic() - t_start
    )


def _labelled_cluster(cluster: str, worker: str, label: str) -> tuple[ClusterConfig, ClusterConfig]:
    """The cluster as its file says, and the same with ``worker`` labelled ``profile: label`` (``ValueError`` for
    an unknown worker or label, or a worker that is not alone in its cluster file entry)."""
    catalog = load_gpu_catalog()
    right = load_cluster_config(cluster, catalog)
    expanded = right.expanded()
    idx = _check_label(catalog, cluster, [(rw.name, rw.model) for rw in expanded], worker, label)
    # The cluster file entry the worker was expanded from.
    entry = bisect.bisect_right(list(itertools.accumulate(wc.count for wc in right.workers)), idx)
    if right.workers[entry].count != 1:
        raise ValueError(f"{worker} is one of {right.workers[entry].count} workers of one entry: label a lone one")
    entries = list(right.workers)
    entries[entry] = entries[entry].model_copy(update={"profile": label, "name": worker})
    return right, right.model_copy(update={"workers": entries})


def format_live_mislabel_report(rep: LiveMislabelReport) -> str:
    """The text ``hexflow bench mislabel --live`` prints."""
    lines = [
        f"live: {rep.worker} of {rep.cluster} labelled {rep.label} (profile: {rep.label} in the gateway's cluster), "
        f"emulated workers at their own speed, time scale {rep.time_scale:g}; {rep.workflows} chess-bird workflows "
        f"at {rep.rate_qps:g}/s; {rep.wall_s:.0f} s wall",
        "",
        f"share of {rep.worker} in the calls completed per window (modelled seconds):",
    ]
    cells = {name: [f"{x[1]:.3f} ({x[2]})" for x in r.windows] for name, r in rep.runs.items()}
    lines += [_windows_table("window", lambda i: str(i + 1), cells), ""]
    rows = []
    for name, r in rep.runs.items():
        base = (r.final_profile.get("constants") or {}).get("iter_base_s", math.nan)
        source = str(r.final_profile.get("source", "-"))
        refits = f"{r.refits_applied}/{r.refit_attempts}"
        rows.append([name, *r.outcome_cells(), source, f"{base:.4g}", refits, str(r.ejections)])
    head = ["run", "late share", "SLO", "P95 s", "profile source", "iter_base_s", "refits applied", "ejections"]
    lines.append(table(head, rows))
    lines += ["", f"late share: {', '.join(f'{k} {r.late_share:.3f}' for k, r in rep.runs.items())}: {rep.verdict()}"]
    return "\n".join(lines)
