"""``hexflow bench --live``: policies measured on the real gateway over an emulated cluster (``LiveSettings.rig``,
replayed by ``gateway.bench.replay``), beside the simulator's run of the same workflows, policy, alpha and
seed. Method: docs/benchmarks.md "Live beside the simulator"."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gateway.bench.replay import ReplayReport, ReplayWorkflow, replay, replay_setup, replay_workload
from gateway.bench.rig import LiveSettings, bench_tenant, cluster_workers
from gateway.bench.simbench import Setup, fluid_bound, tuned_alpha
from gateway.bench.stats import cells, fmt, json_safe, positive, pyplot, save_figure, save_json, table
from gateway.core.policy import get_policy
from gateway.core.worker import WorkerInfo
from gateway.errors import GatewayError
from gateway.sim.metrics import LatencySummary, Summary, summarize
from gateway.sim.simulator import Simulator

DEFAULT_RATE_FRACTION = 0.55
"""Default arrival rate as a fraction of the fluid bound."""
JITTER_WALL_S = 0.01
"""Arrival jitter of the simulated band: up to this many *wall* seconds (modelled: / time_scale)."""
JITTER_REPLICAS = 10


class LiveBenchError(GatewayError):
    """A live benchmark could not run: a subprocess did not start, or the replay could not begin."""


def simulate_workload(
    workers: Sequence[Any],
    workload: Sequence[ReplayWorkflow],
    policy: str,
    *,
    alpha: float | None,
    seed: int,
    prefix_caching: bool = True,
    jitter: Sequence[float] | None = None,
) -> tuple[Summary, dict[str, int]]:
    """The simulator's prediction for a replay workload: summary and calls dispatched per worker; ``jitter``:
    modelled seconds each arrival (and its deadline) is delayed by."""
    dags = [w.dag() for w in workload]
    if jitter is not None:
        dags = [d.shifted(d.arrival + j, d.deadline + j) for d, j in zip(dags, jitter, strict=True)]
    sim = Simulator(workers, policy, alpha=alpha, seed=seed, prefix_caching=prefix_caching)
    res = sim.run(dags)
    counts = {w.name: sum(c.values()) for w, c in zip(workers, res.dispatch_counts, strict=True)}
    return summarize(res, total=len(workload)), counts


@dataclass(frozen=True)
class Band:
    """Minimum, median and maximum of one figure over jittered simulations."""

    low: float
    median: float
    high: float


def simulate_jittered(
    workers: Sequence[Any],
    workload: Sequence[ReplayWorkflow],
    policy: str,
    *,
    seed: int,
    jitter_s: float,
    replicas: int = JITTER_REPLICAS,
    **options: Any,
) -> tuple[Summary, dict[str, int], dict[str, Band]]:
    """The exact prediction (``simulate_workload``, ``options``: its alpha and prefix caching) and the
    P50/P95/P99/SLO bands over ``replicas`` runs: the exact one, and runs with every arrival (and its deadline)
    delayed by an independent uniform ``[0, jitter_s)`` modelled seconds (a live run's wall-clock noise). A
    live figure inside the band is as good as the simulator can predict it."""
    runs = []
    for k in range(replicas):
        rng = random.Random(seed * 1009 + k)
        jitter = [rng.uniform(0.0, jitter_s) for _ in workload] if k else None
        runs.append(simulate_workload(workers, workload, policy, seed=seed, jitter=jitter, **options))
    figures = {k: [float(getattr(s, k)) for s, _ in runs] for k in ("p50_s", "p95_s", "p99_s", "slo_attainment")}
    return *runs[0], {k: Band(min(v), statistics.median(v), max(v)) for k, v in figures.items()}


@dataclass
class PolicyRun:
    """One policy: the live replay, the simulated prediction and the calls each worker served."""

    policy: str
    alpha: float | None
    live: ReplayReport
    simulated: Summary
    live_calls_per_worker: dict[str, int] = field(default_factory=dict)
    sim_calls_per_worker: dict[str, int] = field(default_factory=dict)
    sim_band: dict[str, Band] = field(default_factory=dict)

    @property
    def p95_ratio(self) -> float:
        """Live P95 / simulated P95."""
        return _ratio(self.live.p95_s, self.simulated.p95_s)

    @property
    def slo_ratio(self) -> float:
        """Live SLO attainment / simulated SLO attainment."""
        return _ratio(self.live.slo_attainment, self.simulated.slo_attainment)


def _ratio(a: float, b: float) -> float:
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan


@dataclass
class LiveBenchReport:
    """Everything ``hexflow bench --live`` reports."""

    cluster: str
    gpus: list[str]
    trace: str
    time_scale: float
    rate_qps: float
    fluid_bound_qps: float
    slo_scale: float
    slo_s: float
    workflows: int
    seed: int
    runs: list[PolicyRun]
    wall_s: float

    def gains_vs_rr_fcfs(self) -> dict[str, dict[str, float]]:
        """For each policy but ``rr-fcfs``: rr-fcfs's P95 / the policy's, live and simulated."""
        ref = next((r for r in self.runs if r.policy == "rr-fcfs"), None)
        if ref is None:
            return {}
        return {
            r.policy: {
                "p95_live": _ratio(ref.live.p95_s, r.live.p95_s),
                "p95_sim": _ratio(ref.simulated.p95_s, r.simulated.p95_s),
            }
            for r in self.runs
            if r.policy != "rr-fcfs"
        }

    def to_json(self) -> dict[str, Any]:
        """The JSON document (non-finite numbers become null)."""
        policies = [
            {
                "policy": r.policy,
                "alpha": r.alpha,
                "live": r.live.to_json(),
                "simulated": r.simulated.as_dict(),
                "ratios": {"p95_live_over_sim": r.p95_ratio, "slo_live_over_sim": r.slo_ratio},
                "simulated_jitter_band": {k: [b.low, b.median, b.high] for k, b in r.sim_band.items()},
                "calls_per_worker": {"live": r.live_calls_per_worker, "simulated": r.sim_calls_per_worker},
            }
            for r in self.runs
        ]
        doc = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "runs"}
        return json_safe({**doc, "policies": policies, "gain_vs_rr_fcfs": self.gains_vs_rr_fcfs()})

    def write_json(self, path: Path) -> None:
        """Write ``to_json()`` (strict JSON)."""
        save_json(path, self.to_json())


@dataclass(frozen=True)
class _Bench:
    """What every policy's run of one live benchmark shares (``rig``: ``LiveSettings.rig``'s other keywords besides the
    policy and alpha)."""

    live: LiveSettings
    workers: list[WorkerInfo]
    setup: Setup
    workload: list[ReplayWorkflow]
    rate: float
    progress: bool
    rig: dict[str, Any]


def run_live_bench(
    live: LiveSettings,
    trace: str,
    policies: Sequence[str],
    *,
    workflows: int,
    rate_qps: float | None = None,
    slo_scale: float = 5.0,
    alpha: float | None = None,
    arrivals_csv: Path | None = None,
    cv: float = 1.0,
    progress: bool = True,
    gpu_catalog: Path | None = None,
    emulator_catalog: Path | None = None,
    profiles_file: Path | None = None,
    worker_urls: Sequence[str] | None = None,
    token_scale: float = 1.0,
    prefix_caching: bool = True,
) -> LiveBenchReport:
    """Measure every policy live (``live``: the emulated cluster, time scale, seed, logs) and predict it by
    simulation.

    ``gpu_catalog``, ``profiles_file``: what the gateway and the simulator read; ``emulator_catalog``: what the
    emulated workers run (default: ``gpu_catalog``; ``hexflow bench fidelity`` differs). ``worker_urls``:
    workers already running (in cluster order) instead of the emulated cluster. ``token_scale`` scales the
    trace's token counts; ``prefix_caching``: whether the workers cache prompt prefixes.
    """
    for p in policies:
        get_policy(p)
    time_scale, seed = positive("time scale", live.time_scale), live.seed
    cluster_cfg, workers = cluster_workers(live.cluster, gpu_catalog, profiles_file)
    if worker_urls is not None and len(worker_urls) != len(workers):
        raise ValueError(f"the cluster has {len(workers)} workers but {len(worker_urls)} worker urls were given")
    setup = replay_setup(
        trace, workers, workflows=workflows, seed=seed, slo_scale=slo_scale, arrivals_csv=arrivals_csv, cv=cv,
        token_scale=token_scale,
    )  # fmt: skip
    bound = fluid_bound(workers, setup.queries)
    rate = rate_qps if rate_qps is not None else round(DEFAULT_RATE_FRACTION * bound, 6)
    workload = replay_workload(setup, rate)
    worker_catalog = emulator_catalog if emulator_catalog is not None else gpu_catalog
    rig = {
        "gateway_cluster": cluster_cfg,
        "emulator_args": ["--catalog", str(worker_catalog)] if worker_catalog is not None else [],
        "worker_urls": worker_urls,
        "gpu_catalog": gpu_catalog.resolve() if gpu_catalog is not None else None,
        "profiles_file": profiles_file.resolve() if profiles_file is not None else None,
        "prefix_caching": prefix_caching,
    }
    bench = _Bench(live, workers, setup, workload, rate, progress, rig)
    t_start = time.monotonic()
    with live.folder("hexflow-livebench-") as folder:
        key = bench_tenant(folder, max_concurrent_workflows=len(workload) + 1, deadline_s=setup.slo_s * time_scale)
        runs = [_run_policy(bench, policy, alpha, folder, key) for policy in policies]
    return LiveBenchReport(
        cluster_cfg.name, [w.profile.gpu for w in workers], setup.trace, time_scale, rate, bound, slo_scale,
        setup.slo_s, len(workload), seed, runs, time.monotonic() - t_start,
    )  # fmt: skip


def _run_policy(b: _Bench, policy: str, alpha: float | None, folder: Path, key: str) -> PolicyRun:
    """One policy: its alpha (tuned unless given), the simulator's prediction and jitter band, the live run."""
    a = alpha
    if a is None and get_policy(policy).uses_alpha:
        a = tuned_alpha(b.setup, policy, b.rate)
    time_scale = b.live.time_scale
    kw: dict[str, Any] = {"alpha": a, "seed": b.live.seed, "prefix_caching": b.rig["prefix_caching"]}
    sim, sim_counts, band = simulate_jittered(b.workers, b.workload, policy, jitter_s=JITTER_WALL_S / time_scale, **kw)
    what = "the gateway" if b.rig["worker_urls"] is not None else "the emulated cluster and the gateway"
    b.live.say(f"{policy}: alpha {'-' if a is None else f'{a:g}'}; starting {what}")
    with b.live.rig(folder, policy, policy=policy, alpha=a, **b.rig) as rig:
        opts: dict[str, Any] = {"trace": b.setup.trace, "rate_qps": b.rate, "progress": b.progress}
        run = replay(b.workload, gateway=rig.url, api_key=key, time_scale=time_scale, desc=f"{policy} live", **opts)
        try:
            rep = asyncio.run(run)
        except GatewayError as exc:
            raise LiveBenchError(f"{policy}: {exc}") from None
        live_counts = rig.completed_per_worker()
    b.live.say(
        f"{policy}: live P95 {fmt(rep.p95_s)} s, SLO {fmt(rep.slo_attainment, 3)}; "
        f"simulated P95 {fmt(sim.p95_s)} s, SLO {fmt(sim.slo_attainment, 3)} ({rep.wall_s:.0f} s wall)"
    )
    return PolicyRun(policy, a, rep, sim, live_counts, sim_counts, band)


def _band_cell(b: Band, digits: int) -> str:
    return f"{fmt(b.low, digits)}-{fmt(b.high, digits)}"


def _summary_cells(x: LatencySummary) -> list[str]:
    """P50/P95/P99, SLO attainment, throughput and completed/sent of a live or simulated run."""
    figures = cells(x, "p50_s:.1f p95_s:.1f p99_s:.1f slo_attainment:.3f throughput_qps:.4f")
    return [*figures, f"{x.completed}/{x.workflows}"]


def format_live_report(rep: LiveBenchReport) -> str:
    """The tables ``hexflow bench --live`` prints."""
    lines = [
        f"{rep.trace} on {rep.cluster} [{', '.join(rep.gpus)}], {rep.workflows} workflows at {rep.rate_qps:.4g}/s "
        f"({rep.rate_qps / rep.fluid_bound_qps:.2f} x fluid bound {rep.fluid_bound_qps:.4f}), "
        f"SLO {rep.slo_scale:g}x = {rep.slo_s:.1f} s, time scale {rep.time_scale:g}, seed {rep.seed}",
        "latency in modelled seconds; live: measured by the client through the gateway; sim: the simulator's "
        "prediction for the same workflows;",
        f"sim band: min-max over the sim and {JITTER_REPLICAS - 1} simulations with each arrival delayed by up "
        f"to {JITTER_WALL_S * 1000:.0f} ms of wall time ({JITTER_WALL_S / rep.time_scale:.2g} modelled s)",
    ]
    rows = []
    for r in rep.runs:
        a = "-" if r.alpha is None else f"{r.alpha:.2f}"
        lv, sm = r.live, r.simulated
        rows.append([r.policy, a, "live", *_summary_cells(lv), fmt(r.p95_ratio, 2), fmt(r.slo_ratio, 3)])
        rows.append([r.policy, a, "sim", *_summary_cells(sm), "", ""])
        if r.sim_band:
            band = [_band_cell(r.sim_band[k], d) for k, d in (("p50_s", 0), ("p95_s", 0), ("p99_s", 0))]
            band.append(_band_cell(r.sim_band["slo_attainment"], 2))
            rows.append([r.policy, a, "sim band", *band, "", "", "", ""])
    headers = ["policy", "alpha", "run", "p50_s", "p95_s", "p99_s", "slo", "tput_qps", "done"]
    lines.append(table([*headers, "p95_live/sim", "slo_live/sim"], rows))
    gains = rep.gains_vs_rr_fcfs()
    if gains:
        rows = [[p, f"{fmt(g['p95_live'], 2)}x", f"{fmt(g['p95_sim'], 2)}x"] for p, g in gains.items()]
        lines += ["P95 gain over rr-fcfs (rr-fcfs P95 / policy P95):", table(["policy", "live", "sim"], rows)]
    lines.append(f"wall time {rep.wall_s:.0f} s")
    return "\n".join(lines)


def plot_live_report(rep: LiveBenchReport, path: Path) -> None:
    """Bars of P95 latency and SLO attainment per policy, live next to simulated."""
    plt = pyplot()
    names = [r.policy for r in rep.runs]
    xs = list(range(len(names)))
    width = 0.38
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((ax1, "p95_s", "P95 latency (modelled s)"), (ax2, "slo_attainment", "SLO attainment")):
        live = [getattr(r.live, key) for r in rep.runs]
        sim = [getattr(r.simulated, key) for r in rep.runs]
        ax.bar([x - width / 2 for x in xs], [v if math.isfinite(v) else 0.0 for v in live], width, label="live")
        ax.bar([x + width / 2 for x in xs], [v if math.isfinite(v) else 0.0 for v in sim], width, label="simulated")
        ax.set_xticks(xs, names)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    ax1.axhline(rep.slo_s, color="red", ls=":", lw=1, label="SLO")
    ax2.set_ylim(0, 1.05)
    ax1.legend(fontsize=8)
    fig.suptitle(
        f"{rep.trace} on {rep.cluster}, {rep.workflows} workflows at {rep.rate_qps:.4g}/s, "
        f"time scale {rep.time_scale:g}"
    )
    save_figure(fig, path)
