"""Policy benchmarks on the simulator: ``Setup`` is the scenario, ``Bench`` the runs (capacity, latency and SLO
attainment over several seeds). The method: docs/benchmarks.md "Method"."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from gateway.bench.bound import FluidBound, fluid_bound, solve_fluid_bound
from gateway.config.workflows import STANDARD_WORKFLOW
from gateway.core.degrade import QualityModel
from gateway.core.predict import SUSTAINABLE_SHARE
from gateway.core.scheduler import WorkerInfo
from gateway.core.workflow import CallSpec, StagedWorkflow, WorkflowTemplate
from gateway.errors import ConfigError
from gateway.sim.metrics import Summary, summarize
from gateway.sim.simulator import SimResult, Simulator
from gateway.sim.tune import ALPHA_GRID, tune_alpha
from gateway.sim.workload import TenantSpec, build_workload, gamma_arrivals, poisson_arrivals, workload_queries
from gateway.sim.workload.arrivals import flash_arrivals, pattern_arrivals

__all__ = [
    "N_SEEDS",
    "REL_TOL",
    "TUNE_SEED_OFFSET",
    "Bench",
    "PointResult",
    "Setup",
    "fluid_bound",
    "run_point",
    "simulate",
    "standard_latency",
    "tuned_alpha",
]

ProgressFn = Callable[[int], object]

N_SEEDS = 3
"""Seeds per point (default)."""
REL_TOL = 0.01
"""Relative precision of a capacity (default)."""
TARGET = 0.95
"""SLO attainment a rate must reach to count as sustained."""
TUNE_SEED_OFFSET = 1000
"""Alpha is tuned on seed ``seed + TUNE_SEED_OFFSET``, never one of the measured seeds."""


def standard_latency(workers: Sequence[WorkerInfo], calls: Sequence[CallSpec] = STANDARD_WORKFLOW) -> float:
    """Cluster-mean single-request latency of the standard workflow (seconds), or of ``calls``."""
    per_worker = (sum(w.profile.single_latency(c.input_tokens, c.output_tokens) for c in calls) for w in workers)
    return sum(per_worker) / len(workers)


@dataclass
class Setup:
    """A benchmark scenario: cluster, queries, load shape, SLO, tenants and seeds (measured: ``seed`` to
    ``seed + n_seeds - 1``; ``tune_seed`` apart from them). ``quality_model``: accuracy per knob setting, for
    tenants whose workflows degrade; ``slo_unit_s``: what the SLO multiplies (default: the standard workflow's
    cluster-mean latency); ``plan_template``: what degrading workflows plan their remaining stages with
    (default: their own); ``deadline_rule``: Text-to-SQL workflows follow the live pipeline's deadline rule
    (replays of the gateway's own pipeline); ``admission_share``, ``admission_miss``: admit each workflow as
    the live gateway does (``Simulator``'s arguments; None: every workflow is admitted); ``flash``: flash-crowd
    arrivals (``flash_arrivals``) instead of ``arrivals_csv``'s or Poisson."""

    workers: list[WorkerInfo]
    queries: list[list[CallSpec]]
    trace: str
    n_workflows: int = 400
    slo_scale: float = 5.0
    seed: int = 0
    cv: float = 1.0
    tenants: list[TenantSpec] | None = None
    arrivals_csv: Path | None = None
    flash: bool = False
    n_seeds: int = N_SEEDS
    prefix_caching: bool = False
    quality_model: QualityModel | None = None
    slo_unit_s: float | None = None
    plan_template: WorkflowTemplate | None = None
    deadline_rule: bool = False
    admission_share: float | None = None
    admission_miss: str = "reject"
    slo_s: float = field(init=False)
    _units: dict[int, list[float]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.n_workflows < 1:
            raise ValueError(f"n_workflows must be at least 1, got {self.n_workflows}")
        if self.n_seeds < 1:
            raise ValueError(f"n_seeds must be at least 1, got {self.n_seeds}")
        unit = self.slo_unit_s
        if unit is None:  # without workers (a plan's workload, put on each mix's): no SLO of its own
            unit = standard_latency(self.workers) if self.workers else math.nan
        self.slo_s = self.slo_scale * unit

    @classmethod
    def of_trace(
        cls,
        trace: str,
        workers: Sequence[WorkerInfo],
        *,
        n_workflows: int,
        seed: int = 0,
        trace_dir: Path | None = None,
        **options: Any,
    ) -> Setup:
        """The setup of workload ``trace`` (``workload_queries``) on ``workers``; ``options``: its other fields."""
        name, queries = workload_queries(trace, n_workflows, seed, trace_dir)
        return cls(list(workers), queries, name, n_workflows=n_workflows, seed=seed, **options)

    @property
    def seeds(self) -> list[int]:
        """The measured seeds."""
        return [self.seed + i for i in range(self.n_seeds)]

    @property
    def tune_seed(self) -> int:
        """The seed of the alpha tuner's traffic window (never measured)."""
        return self.seed + TUNE_SEED_OFFSET

    @cached_property
    def bound(self) -> FluidBound:
        """The fluid bound for the mix of the base seed's workflows (tenants' chat calls included)."""
        mix = [[c for stage in wf.stages for c in stage.calls] for wf in self.workflows(1.0)]
        return solve_fluid_bound(self.workers, mix, prefix_caching=self.prefix_caching)

    def unit_arrivals(self, seed: int) -> list[float]:
        """Arrival times at rate 1/s (scaled by 1/rate for each run): common random numbers."""
        a = self._units.get(seed)
        if a is None:
            rng = random.Random(seed)
            if self.arrivals_csv is not None or self.flash:
                # A recorded (or generated) pattern of a bounded number of rows, rescaled to a mean of 1/s; another
                # window (seed) starts at another offset into it.
                n_rows = max(4 * self.n_workflows, 4000)
                if self.arrivals_csv is None:
                    rows = flash_arrivals(n_rows, random.Random(self.seed))
                else:
                    rows = pattern_arrivals(self.arrivals_csv, n_rows, random.Random(self.seed))
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
        return build_workload(
            queries,
            arrivals,
            tenants=tenants,
            slo_s=self.slo_s,
            rng=rng,
            quality=self.quality_model,
            plan_template=self.plan_template,
            deadline_rule=self.deadline_rule,
        )


def run_point(
    setup: Setup, policy: str, rate: float, *, alpha: float | None = None, seed: int | None = None
) -> Summary:
    """Simulate one policy at one arrival rate on one seed (default: the setup's) and summarise."""
    _, res, n = simulate(setup, policy, rate, alpha=alpha, seed=seed)
    return summarize(res, total=n)


def simulate(
    setup: Setup, policy: str, rate: float, *, alpha: float | None = None, seed: int | None = None
) -> tuple[Simulator, SimResult, int]:
    """One run of ``policy`` at ``rate`` on one seed (default: the setup's): the simulator, its result and
    the workflows that arrived."""
    s = setup.seed if seed is None else seed
    wfs = setup.workflows(rate, s)
    share = setup.admission_share
    sim = Simulator(
        setup.workers,
        policy,
        alpha=alpha,
        seed=s,
        prefix_caching=setup.prefix_caching,
        admission=share is not None,
        admission_share=share if share is not None else SUSTAINABLE_SHARE,
        admission_miss=setup.admission_miss,
    )
    return sim, sim.run(wfs), len(wfs)


def tuned_alpha(setup: Setup, policy: str, rate: float, grid: Sequence[float] = ALPHA_GRID) -> float:
    """Alpha chosen by the tuner on the tuning seed's window of traffic at ``rate``."""
    window = setup.workflows(rate, seed=setup.tune_seed)
    return tune_alpha(
        setup.workers, policy, window, grid=grid, seed=setup.tune_seed, prefix_caching=setup.prefix_caching
    ).alpha


@dataclass
class PointResult:
    """One (policy, rate, seed) measurement."""

    policy: str
    rate_qps: float
    seed: int
    alpha: float | None
    summary: Summary


class Bench:
    """Measures policies on a setup, caching every (policy, alpha, seed, rate) run."""

    def __init__(self, setup: Setup, *, progress: ProgressFn | None = None):
        self.setup = setup
        self.progress = progress
        self._cache: dict[tuple[str, float | None, int, float], PointResult] = {}

    def point(self, policy: str, rate: float, *, seed: int | None = None, alpha: float | None = None) -> PointResult:
        """Measure (cached) one policy at one rate on one seed (default: the setup's) with ``alpha``."""
        s = self.setup.seed if seed is None else seed
        key = (policy, alpha, s, round(rate, 12))
        r = self._cache.get(key)
        if r is None:
            r = PointResult(policy, rate, s, alpha, run_point(self.setup, policy, rate, alpha=alpha, seed=s))
            self._cache[key] = r
            if self.progress is not None:
                self.progress(1)
        return r

    def capacity(
        self,
        policy: str,
        ceiling: float,
        *,
        seed: int | None = None,
        alpha: float | None = None,
        guess: float | None = None,
        target: float = TARGET,
        rel_tol: float = REL_TOL,
    ) -> float:
        """Highest rate with SLO attainment >= ``target``, by geometric bisection to ``rel_tol`` from [0.25, 1] x
        ``ceiling`` or around ``guess`` (x/÷ 1.08); ``ceiling`` when it is sustained, 0.0 below ``ceiling / 256``."""
        if not (ceiling > 0 and math.isfinite(ceiling)):
            raise ValueError(f"capacity search needs a positive finite ceiling, got {ceiling}")
        if not 0 < rel_tol < 1:
            raise ValueError(f"rel_tol must be in (0, 1), got {rel_tol}")

        def ok(rate: float) -> bool:
            return self.point(policy, rate, seed=seed, alpha=alpha).summary.slo_attainment >= target

        if guess is not None and 0 < guess < ceiling:
            lo, hi = guess / 1.08, min(guess * 1.08, ceiling)
        else:
            lo, hi = 0.25 * ceiling, ceiling
        step = hi / lo
        while ok(hi):
            if hi >= ceiling:
                return ceiling
            lo, hi = hi, min(hi * step, ceiling)
        while not ok(lo):
            hi, lo = lo, lo / step
            if lo < ceiling / 256.0:
                return 0.0
        while (hi - lo) / hi > rel_tol:
            mid = math.sqrt(lo * hi)
            if ok(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def capacities(
        self, policy: str, ceiling: float, *, before: ProgressFn | None = None, **search: Any
    ) -> list[float]:
        """``capacity`` (``search``: its alpha, guess, target, rel_tol) on every seed of the setup, each seed's
        search bracketed by the previous seed's capacity (the first seed's by ``guess``); ``before(seed)`` is
        called before each search."""
        caps: list[float] = []
        for s in self.setup.seeds:
            if before is not None:
                before(s)
            caps.append(self.capacity(policy, ceiling, seed=s, **search))
            search["guess"] = caps[-1]
        return caps

    def points(self) -> list[PointResult]:
        """Every measurement so far, sorted by policy, rate, then seed."""
        return sorted(self._cache.values(), key=lambda p: (p.policy, p.rate_qps, p.seed))
