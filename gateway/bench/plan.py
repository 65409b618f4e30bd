"""Capacity planning on the simulator: the cheapest mix of workers that meets an SLO at a rate (``hexflow plan``).
Method: docs/deploy-gpu-hosts.md ("Size a cluster: ``hexflow plan``"). The pruning bound counts identical
workers once (``engines``) and buckets call types (``BOUND_BUCKET_RATIO``); every simulation is seeded."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from gateway.bench.bound import solve_fluid_bound
from gateway.bench.simbench import REL_TOL, TARGET, Bench, Setup, standard_latency
from gateway.bench.stats import finite_or_none
from gateway.config.cluster import make_worker
from gateway.config.gpus import GpuCatalog
from gateway.core.policy import get_policy
from gateway.core.worker import WorkerInfo
from gateway.errors import UnknownNameError

Objective = Literal["cost", "workers"]
Verdict = Literal["pruned", "failed", "met"]

MAX_MIXES = 200_000
"""Most candidate mixes a plan enumerates (fewer GPU types or a lower ``max_workers`` when above)."""
BOUND_BUCKET_RATIO = 1.1
"""Width of the call-type buckets of the pruning bound (``solve_fluid_bound``'s ``bucket_ratio``)."""
BOUND_MAX_GROUPS = 200
"""Call types the pruning bound solves exactly; more are bucketed (``solve_fluid_bound``'s ``max_groups``)."""


@dataclass(frozen=True)
class GpuOption:
    """One GPU type a plan may use: ``tp`` GPUs per worker (from the profile) and the price of one worker for
    an hour (the GPU's price times ``tp``; None when unpriced)."""

    gpu: str
    tp: int
    usd_per_hour: float | None


def gpu_options(catalog: GpuCatalog, model: str, gpus: Sequence[str]) -> list[GpuOption]:
    """The options for ``gpus`` serving ``model``, in the order given. ``ValueError`` for an empty or repeated
    list or an unprofiled GPU, ``UnknownNameError`` for an unknown name (listing the known ones)."""
    if not gpus:
        raise ValueError("give at least one GPU type")
    if model not in catalog.models:
        raise UnknownNameError("model", model, list(catalog.models))
    seen: set[str] = set()
    out = []
    for g in gpus:
        if g in seen:
            raise ValueError(f"GPU {g!r} is listed twice")
        seen.add(g)
        if g not in catalog.gpus:
            raise UnknownNameError("GPU", g, list(catalog.gpus))
        profiled = catalog.profiles.get(model, {})
        if g not in profiled:
            raise ValueError(f"no profile for {model} on {g}; profiled GPUs: {', '.join(sorted(profiled))}")
        out.append(GpuOption(g, catalog.profile_spec(g, model).tp, catalog.worker_usd_per_hour(g, model)))
    return out


def reference_slo(catalog: GpuCatalog, model: str, gpus: Sequence[str], slo_scale: float) -> tuple[float, str]:
    """(SLO seconds, reference GPU): ``slo_scale`` x the standard workflow's lone latency on one engine of the
    catalogue's reference GPU, or of ``gpus[0]`` when the model has no profile there."""
    ref = catalog.calibration.reference_gpu
    if ref not in catalog.profiles.get(model, {}):
        ref = gpus[0]
    worker = make_worker(catalog, name=f"{ref}-ref", gpu=ref, model=model, capacity=None)
    return slo_scale * standard_latency([worker]), ref


@dataclass(frozen=True)
class PlanSpec:
    """What a plan is asked: the model, the GPU types, the rate and SLO (``slo_reference``: how it was set, for
    the report), and how to search (``objective`` None: ``cost`` when every type has a price, else ``workers``)."""

    model: str
    gpus: tuple[str, ...]
    rate_qps: float
    slo_s: float
    slo_reference: str = ""
    policy: str = "hexgen"
    alpha: float | None = None
    max_workers: int = 16
    objective: Objective | None = None
    budget_usd_per_hour: float | None = None
    target: float = TARGET
    find_margin: bool = True
    rel_tol: float = REL_TOL

    def __post_init__(self) -> None:
        budget = self.budget_usd_per_hour
        checks = (
            (_positive(self.rate_qps), f"rate must be a positive number, got {self.rate_qps}"),
            (_positive(self.slo_s), f"SLO must be a positive number of seconds, got {self.slo_s}"),
            (self.max_workers >= 1, f"max workers must be at least 1, got {self.max_workers}"),
            (0 < self.target <= 1, f"target SLO attainment must be in (0, 1], got {self.target}"),
            (budget is None or _positive(budget), f"budget must be a positive number of USD per hour, got {budget}"),
            (0 < self.rel_tol < 1, f"rel_tol must be in (0, 1), got {self.rel_tol}"),
            (self.objective in (None, "cost", "workers"), f"objective must be cost or workers, got {self.objective!r}"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        get_policy(self.policy)


def _positive(x: float) -> bool:
    return x > 0 and math.isfinite(x)


def enumerate_mixes(k: int, max_workers: int) -> Iterator[tuple[int, ...]]:
    """Every count vector of ``k`` types with a total of 1 to ``max_workers`` workers."""
    for total in range(1, max_workers + 1):
        # Stars and bars: the k - 1 cut points among total + k - 1 slots.
        for cuts in itertools.combinations(range(total + k - 1), k - 1):
            prev, counts = -1, []
            for c in (*cuts, total + k - 1):
                counts.append(c - prev - 1)
                prev = c
            yield tuple(counts)


def _n_mixes(k: int, max_workers: int) -> int:
    return math.comb(max_workers + k, k) - 1


@dataclass
class Candidate:
    """One mix the plan considered and what became of it: its fluid bound (``BOUND_BUCKET_RATIO`` buckets),
    its verdict (``pruned``: fluid bound below the rate, not simulated; ``failed``; ``met``), and SLO attainment
    and P95 per seed simulated (which stop at the first seed below the target)."""

    counts: tuple[int, ...]
    gpus: tuple[str, ...]
    usd_per_hour: float | None
    bound_qps: float
    verdict: Verdict
    attainment: list[float] = field(default_factory=list)
    p95_s: list[float] = field(default_factory=list)

    @property
    def workers(self) -> int:
        """Workers in the mix."""
        return sum(self.counts)

    @property
    def label(self) -> str:
        """``2xA100 + 1xL40S``."""
        return " + ".join(f"{n}x{g}" for n, g in zip(self.counts, self.gpus, strict=True) if n)

    @property
    def min_attainment(self) -> float | None:
        """The lowest attainment over the seeds simulated (None when not simulated)."""
        return min(self.attainment) if self.attainment else None

    def to_json(self) -> dict[str, Any]:
        """The candidate as JSON: mix (GPU -> count), label, workers, usd_per_hour, fluid bound, verdict,
        attainment and P95 per seed simulated."""
        return {
            "mix": {g: n for g, n in zip(self.gpus, self.counts, strict=True) if n},
            "label": self.label,
            "workers": self.workers,
            "usd_per_hour": self.usd_per_hour,
            "fluid_bound_qps": finite_or_none(self.bound_qps),
            "verdict": self.verdict,
            "slo_attainment_per_seed": [finite_or_none(a) for a in self.attainment],
            "p95_s_per_seed": [finite_or_none(p) for p in self.p95_s],
        }


@dataclass
class PlanReport:
    """What ``run_plan`` found (``to_json`` documents the fields). ``considered``: every mix in order, the last
    the answer when there is one; ``capacity_per_seed``: empty without an answer or a margin search;
    ``over_budget``: mixes not tried for costing more than the budget."""

    spec: PlanSpec
    objective: Objective
    options: list[GpuOption]
    trace: str
    n_workflows: int
    seeds: list[int]
    prefix_caching: bool
    considered: list[Candidate]
    answer: Candidate | None
    capacity_per_seed: list[float]
    total_mixes: int
    over_budget: int
    programs_solved: int
    simulations: int
    seconds: float = 0.0

    @property
    def alpha(self) -> float | None:
        """The alpha the policy ran with: the one given, else the policy's default (None when it reads none)."""
        pol = get_policy(self.spec.policy)
        if not pol.uses_alpha:
            return None
        return pol.default_alpha if self.spec.alpha is None else self.spec.alpha

    @property
    def capacity_qps(self) -> float | None:
        """The answer's capacity: the lowest over the seeds."""
        return min(self.capacity_per_seed) if self.capacity_per_seed else None

    @property
    def margin(self) -> float | None:
        """The answer's capacity over the planned rate (None without one)."""
        cap = self.capacity_qps
        return None if cap is None else cap / self.spec.rate_qps

    @property
    def best_failed(self) -> Candidate | None:
        """The simulated mix with the highest attainment that missed (None when none was simulated)."""
        failed = [c for c in self.considered if c.verdict == "failed"]
        return max(failed, key=lambda c: c.min_attainment or 0.0) if failed else None

    def next_cheaper(self, n: int) -> list[Candidate]:
        """The ``n`` mixes just before the answer in the order (or the last ``n`` considered without one),
        cheapest first."""
        before = self.considered[:-1] if self.answer is not None else self.considered
        return before[-n:] if n > 0 else []

    def to_json(self) -> dict[str, Any]:
        """The JSON document: ``met``, ``answer``, ``capacity_qps``, ``capacity_per_seed``, ``margin``; the question,
        the workload and the search as run; ``best_failed`` and every mix ``considered`` with its verdict.
        Non-finite numbers are null."""
        s, best = self.spec, self.best_failed
        search = ("total_mixes", "over_budget", "programs_solved", "simulations", "seconds")
        return {
            "met": self.answer is not None,
            "answer": self.answer.to_json() if self.answer else None,
            **{k: getattr(self, k) for k in ("capacity_qps", "capacity_per_seed", "margin")},
            "model": s.model,
            "gpus": [asdict(o) for o in self.options],
            **{k: getattr(s, k) for k in ("rate_qps", "slo_s", "slo_reference")},
            "target_slo_attainment": s.target,
            **{"policy": s.policy, "alpha": self.alpha, "objective": self.objective},
            **{k: getattr(s, k) for k in ("budget_usd_per_hour", "max_workers")},
            **{k: getattr(self, k) for k in ("trace", "n_workflows", "seeds", "prefix_caching", *search)},
            "best_failed": best.to_json() if best else None,
            "considered": [c.to_json() for c in self.considered],
        }


def _objective(spec: PlanSpec, options: Sequence[GpuOption]) -> Objective:
    priced = all(o.usd_per_hour is not None for o in options)
    unpriced = ", ".join(o.gpu for o in options if o.usd_per_hour is None)
    if spec.objective == "cost" and not priced:
        raise ValueError(f"the cost objective needs a usd_per_hour on every GPU; none on: {unpriced}")
    if spec.budget_usd_per_hour is not None and not priced:
        raise ValueError(f"a budget needs a usd_per_hour on every GPU; none on: {unpriced}")
    return spec.objective or ("cost" if priced else "workers")


def on_mix(workload: Setup, workers: list[WorkerInfo], slo_s: float) -> Setup:
    """``workload`` on ``workers``, its SLO ``slo_s`` (not derived from the workers: one for every mix)."""
    return replace(workload, workers=workers, slo_scale=1.0, slo_unit_s=slo_s)


def run_plan(
    catalog: GpuCatalog,
    workload: Setup,
    spec: PlanSpec,
    *,
    progress: Callable[[int], object] | None = None,
    describe: Callable[[str], object] | None = None,
) -> PlanReport:
    """Search the mixes of ``spec.gpus`` for ``workload`` (each mix replaces its workers, ``spec`` its SLO) and
    return what was found; ``progress`` gets 1 after each simulated
    run, ``describe`` what is simulated. ``ValueError``/``UnknownNameError`` for a question that cannot be
    planned (unprofiled GPUs, a cost objective or budget without prices, too many mixes)."""
    t0 = time.perf_counter()
    options = gpu_options(catalog, spec.model, spec.gpus)
    objective = _objective(spec, options)
    k = len(options)
    total = _n_mixes(k, spec.max_workers)
    if total > MAX_MIXES:
        raise ValueError(
            f"{total:,} mixes of {k} GPU types up to {spec.max_workers} workers; at most {MAX_MIXES:,}: "
            "lower the maximum number of workers or give fewer GPU types"
        )
    search = _Search(catalog, workload, spec, options, progress, describe)
    mixes = sorted(enumerate_mixes(k, spec.max_workers), key=lambda m: search.key(m, objective))
    over_budget = 0
    if spec.budget_usd_per_hour is not None:
        within = [m for m in mixes if (search.cost(m) or 0.0) <= spec.budget_usd_per_hour + 1e-9]
        over_budget = len(mixes) - len(within)
        mixes = within
    considered: list[Candidate] = []
    answer: Candidate | None = None
    for counts in mixes:
        cand = search.judge(counts)
        considered.append(cand)
        if cand.verdict == "met":
            answer = cand
            break
    caps = search.margin(answer) if answer is not None and spec.find_margin else []
    w = workload
    found = (considered, answer, caps, total, over_budget, search.programs, search.sims, time.perf_counter() - t0)
    return PlanReport(spec, objective, options, w.trace, w.n_workflows, search.base.seeds, w.prefix_caching, *found)


class _Search:
    """One plan's search state: the GPU options, the fluid bounds and simulations it ran (counted), and the
    bench of the last mix simulated (for the margin)."""

    def __init__(
        self,
        catalog: GpuCatalog,
        workload: Setup,
        spec: PlanSpec,
        options: Sequence[GpuOption],
        progress: Callable[[int], object] | None,
        describe: Callable[[str], object] | None,
    ) -> None:
        self.catalog, self.workload, self.spec = catalog, workload, spec
        self.prices = [o.usd_per_hour for o in options]
        self.gpus = tuple(o.gpu for o in options)
        self.progress, self.describe = progress, describe
        # One template worker per type; each mix gets fresh, uniquely named copies.
        self.templates = [make_worker(catalog, name=g, gpu=g, model=spec.model, capacity=None) for g in self.gpus]
        self.base = on_mix(workload, [self.templates[0]], spec.slo_s)
        self.bound_mix = [[c for stage in wf.stages for c in stage.calls] for wf in self.base.workflows(1.0)]
        self.programs = 0
        self.sims = 0
        self.bench: Bench | None = None

    def cost(self, counts: tuple[int, ...]) -> float | None:
        """The mix's price per hour (None: a GPU without a price)."""
        if any(p is None for p in self.prices):
            return None
        return sum(n * p for n, p in zip(counts, self.prices, strict=True) if p is not None)

    def key(self, counts: tuple[int, ...], objective: str) -> tuple[float, float, tuple[int, ...]]:
        """The order mixes are tried in: by the objective, then the other measure, then earlier GPU types."""
        c, w = self.cost(counts), float(sum(counts))
        prefer_first = tuple(-n for n in counts)
        if objective == "cost" and c is not None:
            return (round(c, 9), w, prefer_first)
        return (w, round(c, 9) if c is not None else 0.0, prefer_first)

    def bound(self, counts: tuple[int, ...]) -> float:
        """The mix's fluid bound, workflows/s."""
        idx = [i for i, n in enumerate(counts) if n]
        self.programs += 1
        return solve_fluid_bound(
            [self.templates[i] for i in idx],
            self.bound_mix,
            prefix_caching=self.workload.prefix_caching,
            engines=[counts[i] for i in idx],
            max_groups=BOUND_MAX_GROUPS,
            bucket_ratio=BOUND_BUCKET_RATIO,
        ).rate_qps

    def workers_of(self, counts: tuple[int, ...]) -> list[WorkerInfo]:
        """The mix's workers, uniquely named."""
        gpus = [g for g, n in zip(self.gpus, counts, strict=True) for _ in range(n)]
        return [
            make_worker(self.catalog, name=f"{g}-{i}", gpu=g, model=self.spec.model, capacity=None)
            for i, g in enumerate(gpus)
        ]

    def count(self, n: int) -> None:
        """``n`` more simulations ran."""
        self.sims += n
        if self.progress is not None:
            self.progress(n)

    def judge(self, counts: tuple[int, ...]) -> Candidate:
        """A mix judged: pruned by its fluid bound, else simulated seed by seed until one misses the target."""
        spec = self.spec
        fb = self.bound(counts)
        cand = Candidate(counts, self.gpus, self.cost(counts), fb, "pruned")
        if fb < spec.rate_qps:
            return cand
        setup = on_mix(self.workload, self.workers_of(counts), spec.slo_s)
        self.bench = Bench(setup, progress=self.count)
        verdict: Verdict = "met"
        for s in setup.seeds:
            if self.describe is not None:
                self.describe(f"{cand.label}, seed {s}")
            summary = self.bench.point(spec.policy, spec.rate_qps, seed=s, alpha=spec.alpha).summary
            cand.attainment.append(summary.slo_attainment)
            cand.p95_s.append(summary.p95_s)
            if not summary.slo_attainment >= spec.target:
                verdict = "failed"  # the other seeds cannot make up for it
                break
        cand.verdict = verdict
        return cand

    def margin(self, answer: Candidate) -> list[float]:
        """The answer's capacity per seed, on the bench of the mix it was judged on."""
        spec, bench = self.spec, self.bench
        if bench is None:
            return []
        describe = self.describe
        return bench.capacities(
            spec.policy,
            answer.bound_qps,
            alpha=spec.alpha,
            guess=spec.rate_qps,
            target=spec.target,
            rel_tol=spec.rel_tol,
            before=None if describe is None else lambda s: describe(f"margin of {answer.label}, seed {s}"),
        )
