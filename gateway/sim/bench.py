"""Side-by-side policy benchmarks on the simulator: latency, SLO attainment and capacity.

Method (what ``hexflow bench`` runs):

* The SLO of a workflow is ``slo_scale`` x the cluster-mean single-request latency of the standard
  workflow (``STANDARD_WORKFLOW``), as in the HexGen-Flow paper's simulator.
* Arrivals are Poisson (or Gamma with a given CV). Every run of every policy at every rate uses the
  same unit-rate arrival sequence, scaled by 1/rate, and the same query sequence: common random numbers,
  so differences between policies are differences of policy, not of luck.
* Capacity is the highest arrival rate at which SLO attainment stays >= 95%, found by bisection.
* Policies that read alpha (``hexgen``, ``wb-fcfs``) run as the product runs them: alpha is tuned by
  the simulator on a *different* window of traffic at the same rate (another seed), then applied.
* ``fluid_bound_qps`` is the cluster's aggregate batched throughput for the workload's mix: each
  worker at its best batch (capacity, KV and ``max_num_seqs`` limits), the mix's mean contexts; no
  scheduler can sustain more.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.core.policy import get_policy
from gateway.core.scheduler import WorkerInfo
from gateway.core.workflow import STANDARD_WORKFLOW, CallSpec, StagedWorkflow
from gateway.sim.metrics import Summary, summarize
from gateway.sim.simulator import Simulator
from gateway.sim.tune import ALPHA_GRID, tune_alpha
from gateway.sim.workload import TenantSpec, build_workload, gamma_arrivals, poisson_arrivals

ProgressFn = Callable[[int], object]


def standard_latency(workers: Sequence[WorkerInfo]) -> float:
    """Cluster-mean single-request latency of the standard workflow (seconds)."""
    total = 0.0
    for w in workers:
        total += sum(w.profile.single_latency(c.input_tokens, c.output_tokens) for c in STANDARD_WORKFLOW)
    return total / len(workers)


def fluid_bound(workers: Sequence[WorkerInfo], queries: Sequence[Sequence[CallSpec]]) -> float:
    """Upper bound on sustainable workflows/s: every worker at its best batch on the workload mix.

    Per worker: the GPU time one average workflow needs when prompts run as full prefill chunks and
    decodes run in a batch as large as the worker's slots, ``max_num_seqs`` and its KV cache allow;
    the bound is the sum over workers of 1 / that time (the cluster processing the mix in parallel).
    """
    calls = [c for q in queries for c in q]
    if not calls:
        return 0.0
    n_q = len(queries)
    mean_in = sum(c.input_tokens for c in calls) / len(calls)
    mean_out = sum(c.output_tokens for c in calls) / len(calls)
    tot_in = sum(c.input_tokens for c in calls) / n_q
    tot_out = sum(c.output_tokens for c in calls) / n_q
    # Decode-weighted mean context: a call's decode steps read its prompt plus half its output.
    dec_ctx = sum(c.output_tokens * (c.input_tokens + c.output_tokens / 2) for c in calls)
    dec_ctx /= max(sum(c.output_tokens for c in calls), 1)
    rate = 0.0
    for w in workers:
        p = w.profile
        kv_batch = p.kv_capacity_tokens / (mean_in + mean_out)
        batch = max(1, int(min(w.capacity, p.max_num_seqs, kv_batch)))
        prefill_s = tot_in / p.prefill_throughput(mean_in / 2)
        decode_s = tot_out / p.decode_throughput(batch, dec_ctx)
        rate += 1.0 / (prefill_s + decode_s)
    return rate


@dataclass
class Setup:
    """A benchmark scenario: cluster, queries, load shape, SLO, tenants and seed."""

    workers: list[WorkerInfo]
    queries: list[list[CallSpec]]
    trace: str
    n_workflows: int = 400
    slo_scale: float = 5.0
    seed: int = 0
    cv: float = 1.0
    tenants: list[TenantSpec] | None = None
    slo_s: float = field(init=False)
    _units: dict[int, list[float]] = field(default_factory=dict, init=False, repr=False)
    _templates: dict[tuple[int, float], list[StagedWorkflow]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.slo_s = self.slo_scale * standard_latency(self.workers)

    def unit_arrivals(self, seed: int) -> list[float]:
        """Arrival times at rate 1/s (scaled by 1/rate for each run): common random numbers."""
        a = self._units.get(seed)
        if a is None:
            rng = random.Random(seed)
            if self.cv == 1.0:
                a = poisson_arrivals(self.n_workflows, 1.0, rng)
            else:
                a = gamma_arrivals(self.n_workflows, 1.0, self.cv, rng)
            self._units[seed] = a
        return a

    def workflows(self, rate: float, seed: int | None = None) -> list[StagedWorkflow]:
        """Fresh workflows for one run at ``rate`` (seed: the arrival/query sequence; default own)."""
        s = self.seed if seed is None else seed
        arrivals = [t / rate for t in self.unit_arrivals(s)]
        tenants = self.tenants or [TenantSpec("default")]
        rng = random.Random(s + 7919)
        queries = self.queries
        if s != self.seed:
            # Another window: the same query population in another order.
            queries = list(queries)
            random.Random(s).shuffle(queries)
        return build_workload(queries, arrivals, tenants=tenants, slo_s=self.slo_s, rng=rng)


def run_point(
    setup: Setup, policy: str, rate: float, *, alpha: float | None = None, seed: int | None = None
) -> Summary:
    """Simulate one policy at one arrival rate and summarise."""
    wfs = setup.workflows(rate, seed)
    res = Simulator(setup.workers, policy, alpha=alpha, seed=setup.seed).run(wfs)
    return summarize(res, total=len(wfs))


def tuned_alpha(setup: Setup, policy: str, rate: float, grid: Sequence[float] = ALPHA_GRID) -> float:
    """Alpha chosen by the tuner on another window of traffic (seed + 1) at the same rate."""
    window = setup.workflows(rate, seed=setup.seed + 1)
    return tune_alpha(setup.workers, policy, window, grid=grid, seed=setup.seed).alpha


@dataclass
class PointResult:
    """One (policy, rate) measurement."""

    policy: str
    rate_qps: float
    alpha: float | None
    summary: Summary


class Bench:
    """Runs policies on a setup; alpha-reading policies are tuned per rate (cached)."""

    def __init__(self, setup: Setup, *, fixed_alpha: float | None = None, progress: ProgressFn | None = None):
        self.setup = setup
        self.fixed_alpha = fixed_alpha
        self.progress = progress
        self._alpha_cache: dict[tuple[str, float], float] = {}
        self._cache: dict[tuple[str, float], PointResult] = {}

    def alpha_for(self, policy: str, rate: float) -> float | None:
        """The alpha a policy runs with at ``rate`` (None for policies without alpha)."""
        if not get_policy(policy).uses_alpha:
            return None
        if self.fixed_alpha is not None:
            return self.fixed_alpha
        key = (policy, round(rate, 9))
        a = self._alpha_cache.get(key)
        if a is None:
            a = tuned_alpha(self.setup, policy, rate)
            self._alpha_cache[key] = a
        return a

    def point(self, policy: str, rate: float) -> PointResult:
        """Measure (cached) one policy at one rate."""
        key = (policy, round(rate, 9))
        r = self._cache.get(key)
        if r is None:
            alpha = self.alpha_for(policy, rate)
            r = PointResult(policy, rate, alpha, run_point(self.setup, policy, rate, alpha=alpha))
            self._cache[key] = r
            if self.progress is not None:
                self.progress(1)
        return r

    def capacity(self, policy: str, hi: float, *, target: float = 0.95, rel_tol: float = 0.01) -> float:
        """Highest rate with SLO attainment >= target, by bisection on [hi/64, hi]."""
        lo = hi / 64.0
        if self.point(policy, lo).summary.slo_attainment < target:
            return 0.0
        if self.point(policy, hi).summary.slo_attainment >= target:
            return hi
        while (hi - lo) / hi > rel_tol:
            mid = math.sqrt(lo * hi)
            if self.point(policy, mid).summary.slo_attainment >= target:
                lo = mid
            else:
                hi = mid
        return lo

    def points(self) -> list[PointResult]:
        """Every measurement so far, sorted by policy then rate."""
        return sorted(self._cache.values(), key=lambda p: (p.policy, p.rate_qps))


BISECTION_STEPS = 9


def bench_runs_estimate(n_policies: int, n_rates: int) -> int:
    """Upper estimate of simulation runs for a progress bar."""
    return n_policies * (BISECTION_STEPS + n_rates + 2)


@dataclass
class BenchReport:
    """Everything ``hexflow bench`` reports."""

    trace: str
    cluster: list[str]
    slo_scale: float
    slo_s: float
    fluid_bound_qps: float
    capacity_qps: dict[str, float]
    results: list[PointResult]
    reference_rate_qps: float | None
    alphas: dict[str, float | None]
    seed: int
    n_workflows: int

    def to_json(self) -> dict[str, Any]:
        """The JSON document: ``results`` (per policy and rate), ``capacity_qps``, ``fluid_bound_qps``."""

        def num(x: float | None) -> float | None:
            return x if x is not None and math.isfinite(x) else None

        results = []
        for p in self.results:
            s = p.summary
            results.append(
                {
                    "policy": p.policy,
                    "trace": self.trace,
                    "rate_qps": p.rate_qps,
                    "alpha": p.alpha,
                    "p50_s": num(s.p50_s),
                    "p95_s": num(s.p95_s),
                    "p99_s": num(s.p99_s),
                    "mean_s": num(s.mean_s),
                    "slo_attainment": num(s.slo_attainment),
                    "throughput_qps": num(s.throughput_qps),
                    "workflows": s.workflows,
                    "completed": s.completed,
                    "calls": s.calls,
                }
            )
        share = {
            k: (v / self.fluid_bound_qps if self.fluid_bound_qps > 0 else None) for k, v in self.capacity_qps.items()
        }
        return {
            "trace": self.trace,
            "cluster": self.cluster,
            "slo_scale": self.slo_scale,
            "slo_s": self.slo_s,
            "seed": self.seed,
            "n_workflows": self.n_workflows,
            "fluid_bound_qps": self.fluid_bound_qps,
            "capacity_qps": self.capacity_qps,
            "capacity_share_of_fluid_bound": share,
            "reference_rate_qps": self.reference_rate_qps,
            "results": results,
        }

    def write_json(self, path: Path) -> None:
        """Write the JSON document (no NaN/Infinity: non-finite numbers become null)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n")


def run_bench(
    setup: Setup,
    policies: Sequence[str],
    *,
    rates: Sequence[float] | None = None,
    fixed_alpha: float | None = None,
    find_capacity: bool = True,
    progress: ProgressFn | None = None,
) -> BenchReport:
    """Capacity of every policy, then every policy at the given rates and at rr-fcfs's capacity.

    Without ``rates``, a grid of fractions of the fluid bound is used.
    """
    for p in policies:
        get_policy(p)  # unknown names fail before any work
    bound = fluid_bound(setup.workers, setup.queries)
    bench = Bench(setup, fixed_alpha=fixed_alpha, progress=progress)
    capacity: dict[str, float] = {}
    if find_capacity:
        for p in policies:
            capacity[p] = bench.capacity(p, hi=bound * 1.05)
    grid = list(rates) if rates else [round(bound * f, 6) for f in (0.2, 0.4, 0.6, 0.7, 0.8, 0.9)]
    ref = capacity.get("rr-fcfs")
    if ref is not None and ref > 0:
        grid.append(ref)
    for p in policies:
        for r in grid:
            bench.point(p, r)
    alphas = {p: (bench.alpha_for(p, ref) if ref else bench.alpha_for(p, grid[0])) for p in policies}
    return BenchReport(
        trace=setup.trace,
        cluster=[w.profile.gpu for w in setup.workers],
        slo_scale=setup.slo_scale,
        slo_s=setup.slo_s,
        fluid_bound_qps=bound,
        capacity_qps=capacity,
        results=bench.points(),
        reference_rate_qps=ref,
        alphas=alphas,
        seed=setup.seed,
        n_workflows=setup.n_workflows,
    )


def plot_report(report: BenchReport, path: Path) -> None:
    """P95 latency and SLO attainment against arrival rate, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    by_policy: dict[str, list[PointResult]] = {}
    for p in report.results:
        by_policy.setdefault(p.policy, []).append(p)
    for name, pts in sorted(by_policy.items()):
        pts.sort(key=lambda x: x.rate_qps)
        xs = [x.rate_qps for x in pts]
        p95 = [x.summary.p95_s if math.isfinite(x.summary.p95_s) else math.nan for x in pts]
        ax1.plot(xs, p95, marker="o", ms=3, label=name)
        ax2.plot(xs, [x.summary.slo_attainment for x in pts], marker="o", ms=3, label=name)
    for ax in (ax1, ax2):
        ax.axvline(report.fluid_bound_qps, color="grey", ls="--", lw=1, label="fluid bound")
        ax.set_xlabel("arrival rate (workflows/s)")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("P95 end-to-end latency (s)")
    ax1.axhline(report.slo_s, color="red", ls=":", lw=1, label="SLO")
    ax1.set_yscale("log")
    ax2.set_ylabel("SLO attainment")
    ax2.axhline(0.95, color="red", ls=":", lw=1)
    ax2.set_ylim(0, 1.02)
    ax2.legend(fontsize=8, loc="lower left")
    fig.suptitle(f"{report.trace} on [{', '.join(report.cluster)}], SLO {report.slo_scale:g}x ({report.slo_s:.0f} s)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
