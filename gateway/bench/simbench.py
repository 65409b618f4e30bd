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

import itertools
import json
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config.workflows import STANDARD_WORKFLOW
from gateway.core.policy import get_policy
from gateway.core.scheduler import WorkerInfo
from gateway.core.workflow import CallSpec, StagedWorkflow
from gateway.errors import ConfigError
from gateway.sim.metrics import Summary, summarize
from gateway.sim.simulator import Simulator
from gateway.sim.tune import ALPHA_GRID, tune_alpha
from gateway.sim.workload import TenantSpec, build_workload, gamma_arrivals, poisson_arrivals, replay_arrivals

ProgressFn = Callable[[int], object]


def standard_latency(workers: Sequence[WorkerInfo]) -> float:
    """Cluster-mean single-request latency of the standard workflow (seconds)."""
    total = 0.0
    for w in workers:
        total += sum(w.profile.single_latency(c.input_tokens, c.output_tokens) for c in STANDARD_WORKFLOW)
    return total / len(workers)


def fluid_bound(workers: Sequence[WorkerInfo], queries: Sequence[Sequence[CallSpec]]) -> float:
    """The cluster's aggregate batched throughput for the workload mix (workflows/s).

    Per worker, a lower bound on the GPU time one average workflow needs, from the iteration model
    ``t = iter_base_s + token_s * tokens + ctx_s * context``: every prompt and output token costs
    ``token_s``; every context token read costs ``ctx_s`` (a decode step at position j reads j tokens,
    a prefill chunk reads the prompt before it); and every iteration costs ``iter_base_s``, with at
    least ``decode tokens / B`` iterations (B: the largest batch the worker's slots, ``max_num_seqs``
    and KV cache allow for the mix) and at least ``all tokens / max_batched_tokens``. The bound is the
    sum over workers of 1 / that time: every worker busy all the time on the mix, at its best batch.
    Request overheads (off the GPU) are excluded. A scheduler that specialises workers by call type
    could beat it only by the difference in the workers' relative speeds per call type.
    """
    calls = [c for q in queries for c in q]
    if not calls:
        return 0.0
    n_q = len(queries)
    tot_in = sum(c.input_tokens for c in calls) / n_q
    tot_out = sum(c.output_tokens for c in calls) / n_q
    mean_kv = (tot_in + tot_out) * n_q / len(calls)
    rate = 0.0
    for w in workers:
        p = w.profile
        chunk = p.max_batched_tokens
        ctx_reads = 0.0
        for c in calls:
            n = max(c.output_tokens - 1, 0)
            full, rest = divmod(max(c.input_tokens, 1), chunk)
            ctx_reads += chunk * (full * (full - 1) / 2 + (full if rest else 0))
            ctx_reads += n * c.input_tokens + n * (n - 1) / 2
        ctx_reads /= n_q
        batch = max(1.0, min(float(w.capacity), float(p.max_num_seqs), p.kv_capacity_tokens / mean_kv))
        iterations = max(tot_out / batch, (tot_in + tot_out) / chunk)
        t = p.token_s * (tot_in + tot_out) + p.ctx_s * ctx_reads + p.iter_base_s * iterations
        rate += 1.0 / t
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
    arrivals_csv: Path | None = None
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
            if self.arrivals_csv is not None:
                # A recorded arrival pattern (Azure LLM trace format), rescaled to a mean of 1/s. Another
                # window (seed) starts at another offset into the recording.
                rows = replay_arrivals(self.arrivals_csv)
                if len(rows) < 2:
                    raise ConfigError(str(self.arrivals_csv), "", "needs at least two arrival rows")
                start = 0 if seed == self.seed else (seed * 7919) % len(rows)
                gaps = [b - a for a, b in itertools.pairwise(rows)]
                gaps = (gaps[start:] + gaps[:start]) * (self.n_workflows // len(gaps) + 1)
                mean = sum(gaps) / len(gaps)
                t, a = 0.0, [0.0]
                for g in gaps[: self.n_workflows - 1]:
                    t += g / mean if mean > 0 else 1.0
                    a.append(t)
            elif self.cv == 1.0:
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

    def capacity(self, policy: str, bound: float, *, target: float = 0.95, rel_tol: float = 0.015) -> float:
        """Highest rate with SLO attainment >= target, by geometric bisection below ``1.05 * bound``.

        The bracket starts at [0.3, 1.05] x the fluid bound and widens downwards while even its low
        end misses the target (a policy far from the bound, such as round-robin on a mixed cluster).
        """
        hi = 1.05 * bound
        if self.point(policy, hi).summary.slo_attainment >= target:
            return hi
        lo = 0.3 * bound
        while self.point(policy, lo).summary.slo_attainment < target:
            hi, lo = lo, lo / 2.0
            if lo < bound / 256.0:
                return 0.0
        while (hi - lo) / hi > rel_tol:
            mid = math.sqrt(lo * hi)
            if self.point(policy, mid).summary.slo_attainment >= target:
                lo = mid
            else:
                hi = mid
        return lo

    def tuned_alphas(self) -> dict[float, float]:
        """The alpha tuned at each rate so far (rates rounded as cache keys)."""
        return {r: a for (_, r), a in self._alpha_cache.items()}

    def points(self) -> list[PointResult]:
        """Every measurement so far, sorted by policy then rate."""
        return sorted(self._cache.values(), key=lambda p: (p.policy, p.rate_qps))


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


GRID_FRACTIONS: tuple[float, ...] = (0.2, 0.4, 0.6, 0.7, 0.8, 0.9)


@dataclass
class _PolicyOutcome:
    capacity: float | None
    points: list[PointResult]
    alphas: dict[float, float]


def _policy_task(
    setup: Setup, policy: str, rates: Sequence[float], find_capacity: bool, fixed_alpha: float | None, bound: float
) -> _PolicyOutcome:
    """Everything one policy needs: capacity by bisection, then the given rates (a worker process's job)."""
    bench = Bench(setup, fixed_alpha=fixed_alpha)
    cap = bench.capacity(policy, bound) if find_capacity else None
    for r in rates:
        bench.point(policy, r)
    return _PolicyOutcome(cap, bench.points(), bench.tuned_alphas())


def _run_tasks(
    setup: Setup,
    tasks: Sequence[tuple[str, Sequence[float], bool]],
    fixed_alpha: float | None,
    bound: float,
    jobs: int,
    progress: ProgressFn | None,
) -> list[_PolicyOutcome]:
    if jobs <= 1 or len(tasks) <= 1:
        out = []
        for policy, rates, cap in tasks:
            out.append(_policy_task(setup, policy, rates, cap, fixed_alpha, bound))
            if progress is not None:
                progress(1)
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = [pool.submit(_policy_task, setup, p, r, c, fixed_alpha, bound) for p, r, c in tasks]
        results = []
        for f in futures:
            results.append(f.result())
            if progress is not None:
                progress(1)
        return results


def run_bench(
    setup: Setup,
    policies: Sequence[str],
    *,
    rates: Sequence[float] | None = None,
    fixed_alpha: float | None = None,
    find_capacity: bool = True,
    jobs: int = 1,
    progress: ProgressFn | None = None,
) -> BenchReport:
    """Capacity of every policy, then every policy at the given rates and at rr-fcfs's capacity.

    Without ``rates``, a grid of fractions of the fluid bound is used. ``jobs`` > 1 runs policies in
    parallel worker processes (results are identical: every run is seeded). ``progress`` is called
    with 1 after each policy's phase.
    """
    for p in policies:
        get_policy(p)  # unknown names fail before any work
    bound = fluid_bound(setup.workers, setup.queries)
    grid = list(rates) if rates else [round(bound * f, 6) for f in GRID_FRACTIONS]
    # rr-fcfs first: its capacity is the reference rate every policy is also measured at.
    order = sorted(policies, key=lambda p: p != "rr-fcfs")
    outcomes = dict(
        zip(
            order,
            _run_tasks(setup, [(p, grid, find_capacity) for p in order], fixed_alpha, bound, jobs, progress),
            strict=True,
        )
    )
    capacity = {p: o.capacity for p, o in outcomes.items() if o.capacity is not None}
    ref = capacity.get("rr-fcfs")
    if ref is not None and ref > 0:
        extra = _run_tasks(setup, [(p, [ref], False) for p in order], fixed_alpha, bound, jobs, progress)
        for p, o in zip(order, extra, strict=True):
            outcomes[p].points += [x for x in o.points if x.rate_qps == ref]
            outcomes[p].alphas.update(o.alphas)
    results = sorted((x for o in outcomes.values() for x in o.points), key=lambda x: (x.policy, x.rate_qps))
    alphas: dict[str, float | None] = {}
    for p in policies:
        if not get_policy(p).uses_alpha:
            alphas[p] = None
        elif fixed_alpha is not None:
            alphas[p] = fixed_alpha
        else:
            alphas[p] = outcomes[p].alphas.get(round(ref if ref else grid[0], 9))
    return BenchReport(
        trace=setup.trace,
        cluster=[w.profile.gpu for w in setup.workers],
        slo_scale=setup.slo_scale,
        slo_s=setup.slo_s,
        fluid_bound_qps=bound,
        capacity_qps={p: capacity[p] for p in policies if p in capacity},
        results=results,
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
