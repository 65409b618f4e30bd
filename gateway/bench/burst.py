"""``hexflow bench burst``: goodput of correct answers under recorded bursty arrivals (``PATTERNS``) and flash
crowds rescaled to a share of the fluid bound, per policy with and without degradation (``gateway.core.degrade``)
and admission (each system's own: ``Policy.admission``); SLO attainment, accuracy-weighted goodput, accuracy,
degraded and refused shares, each variant's share of the goodput bound under bursts
(``gateway.bench.bound.burst_goodput_bound``), and a per-window ``timeline``. Method and figures:
docs/benchmarks.md "Bursts"."""

from __future__ import annotations

import math
import os
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from operator import attrgetter
from pathlib import Path
from typing import Any

from gateway.bench.bound import burst_goodput_bound, solve_fluid_bound
from gateway.bench.quality import FULL
from gateway.bench.simbench import Setup
from gateway.bench.stats import Spread, pyplot, save_figure, spread
from gateway.core.admission import QueueGate, SaturationGate
from gateway.core.degrade import QUALITY_MODES, Knobs, QualityMode, QualityModel, knob_grid
from gateway.core.policy import POLICIES, AdmissionStyle, get_policy
from gateway.errors import ConfigError, UnknownNameError
from gateway.sim.degrade import KnobbedWorkflow, knobbed_calls
from gateway.sim.simulator import SimResult, Simulator
from gateway.sim.workload import TenantSpec

DATA_DIR_ENV = "HEXFLOW_DATA_DIR"
"""Names another shared data folder (an installed, non-editable copy: ``make native``)."""
SHARED_DATA = Path(os.environ.get(DATA_DIR_ENV) or Path(__file__).resolve().parents[2].parent / "shared" / "data")
"""Where recorded patterns are looked up by name: ``$HEXFLOW_DATA_DIR``, else ``../shared/data`` by the repository."""

PATTERNS: dict[str, str] = {
    "azure-code": "azure-llm-2023/AzureLLMInferenceTrace_code.csv",
    "azure-conv": "azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
    "mooncake": "mooncake-fast25/conversation_trace.jsonl",
    "burstgpt": "burstgpt-head/BurstGPT_1_head400.csv",
    "servegen": "servegen-mlarge/trace/chunk-100-trace.csv",
}
"""Pattern names and their files under ``../shared/data`` (the ServeGen one is the top client by load)."""

STEADY = "poisson"
"""The pattern name of steady Poisson arrivals (the no-degradation check)."""
FLASH = "flash"
"""The pattern name of generated flash crowds (``gateway.sim.workload.arrivals.flash_arrivals``)."""

Pattern = Path | str | None
"""Where a pattern's arrivals come from: a trace file, ``FLASH`` or None (Poisson)."""

QUEUE_LIMITS = (2, 5, 10, 20, 50)
"""Queue-length 429 limits tried per worker (``QueueGate``): the best on the tuning seed is measured."""


def resolve_pattern(name: str, data_dir: Path | None = None) -> Pattern:
    """The file of a pattern name (``PATTERNS``) or a path; None for ``poisson``, ``FLASH`` for ``flash``. An
    unknown name, or a known one whose file is absent (no ``../shared/data``), raises ``UnknownNameError``
    saying where patterns come from."""
    if name == STEADY:
        return None
    if name == FLASH:
        return FLASH
    base = SHARED_DATA if data_dir is None else data_dir
    rel = PATTERNS.get(name)
    if rel is not None:
        path = base / rel
        if path.is_file():
            return path
        raise ConfigError(
            str(path),
            "",
            f"arrival pattern {name!r} is a recording from the project's shared data folder ({rel} under "
            "../shared/data next to the repository), which is absent here; use poisson or a path to a trace file",
        )
    path = Path(name)
    if path.is_file():
        return path
    raise UnknownNameError("arrival pattern (or trace file)", name, [STEADY, FLASH, *PATTERNS])


@dataclass(frozen=True)
class Variant:
    """A measured variant: a policy, its tenant's quality mode, and whether its system's admission is on."""

    policy: str
    mode: QualityMode = "full"
    admit: bool = False

    @property
    def admission(self) -> AdmissionStyle | None:
        """How the variant admits work (``Policy.admission``), None without admission."""
        return get_policy(self.policy).admission if self.admit else None


def parse_variant(text: str) -> Variant:
    """``policy[+mode][+admit]`` (``hexgen+adaptive+admit``); ``ValueError`` if bad."""
    policy, *parts = text.split("+")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} in {text!r}; known: {', '.join(POLICIES)}")
    mode: QualityMode = "full"
    admit = False
    for part in parts:
        if part == "admit" and not admit:
            admit = True
            continue
        m = next((m for m in QUALITY_MODES if m == part), None)
        if m is None or mode != "full" or admit:
            raise ValueError(f"bad variant {text!r}: expected policy[+mode][+admit], modes: {', '.join(QUALITY_MODES)}")
        mode = m
    return Variant(policy, mode, admit)


def is_baseline(variant: str) -> bool:
    """The variant is a baseline as deployed: a baseline policy (``Policy.role``: what a user could deploy instead
    of ours) at full quality, with or without its system's admission."""
    v = parse_variant(variant)
    return get_policy(v.policy).role == "baseline" and v.mode == "full"


@dataclass(frozen=True)
class Outcome:
    """One run's figures (``correct_met``: correct answers within the deadline, weighted by accuracy)."""

    arrived: int
    met: int
    correct_met: float
    accuracy: float
    degraded: int
    span_s: float
    refused: int = 0
    """Refused at arrival (counted as arrived and not answered)."""
    shed: int = 0
    """Admitted, then shed by the overload re-check."""
    bound: float = math.nan
    """The goodput bound's correct answers in time for these arrivals (``burst_goodput_bound``)."""

    @property
    def attainment(self) -> float:
        """Met / arrived."""
        return self.met / self.arrived if self.arrived else 0.0

    @property
    def goodput_share(self) -> float:
        """Correct answers within the deadline / arrived."""
        return self.correct_met / self.arrived if self.arrived else 0.0

    @property
    def goodput_qps(self) -> float:
        """Correct answers within the deadline per second of the arrival span."""
        return self.correct_met / self.span_s if self.span_s > 0 else 0.0

    @property
    def degraded_share(self) -> float:
        """Degraded / arrived."""
        return self.degraded / self.arrived if self.arrived else 0.0

    @property
    def refused_share(self) -> float:
        """Refused at arrival or shed / arrived."""
        return (self.refused + self.shed) / self.arrived if self.arrived else 0.0

    @property
    def bound_share(self) -> float:
        """Correct answers in time / the goodput bound's (NaN without a bound)."""
        return self.correct_met / self.bound if self.bound > 0 else math.nan


def outcome(
    res: SimResult, arrived: int, span_s: float, quality: QualityModel, full_accuracy: float, bound: float = math.nan
) -> Outcome:
    """Summarise one run: a workflow that never finished, was refused or shed counts as arrived and missed."""
    accs = [quality.accuracy(r.knobs) if r.knobs is not None else full_accuracy for r in res.workflows]
    correct = sum((a for a, r in zip(accs, res.workflows, strict=True) if r.met), 0.0)
    met, degraded = sum(r.met for r in res.workflows), sum(r.degraded for r in res.workflows)
    acc = sum(accs) / len(accs) if accs else 0.0
    return Outcome(arrived, met, correct, acc, degraded, span_s, len(res.rejected), len(res.shed), bound)


_FIGURES = {
    "slo_attainment": "attainment",
    "goodput_correct_qps": "goodput_qps",
    "goodput_correct_share": "goodput_share",
    "accuracy": "accuracy",
    "degraded_share": "degraded_share",
    "refused_share": "refused_share",
    "bound_share": "bound_share",
}
"""JSON name -> ``Outcome`` figure, reported as the mean over the seeds."""


@dataclass
class BurstPoint:
    """One (pattern, load, policy variant) over the seeds."""

    pattern: str
    load: float
    rate_qps: float
    variant: str
    outcomes: list[Outcome] = field(default_factory=list)
    queue_limit: int | None = None
    """The queue-length 429 limit measured (tuned on the tuning seed), for a variant with ``QueueGate``."""

    def mean(self, fn: Callable[[Outcome], float]) -> float:
        """Mean of ``fn`` over the seeds."""
        return statistics.fmean(fn(o) for o in self.outcomes) if self.outcomes else math.nan

    def spread(self, fn: Callable[[Outcome], float]) -> Spread:
        """Mean and range of ``fn`` over the seeds."""
        return spread([fn(o) for o in self.outcomes])


@dataclass
class BurstReport:
    """Every point of a run, and the ratios against the best baseline without degradation."""

    trace: str
    cluster: str
    slo_s: float
    bound_qps: float
    workflows: int
    seeds: list[int]
    quality_source: str
    points: list[BurstPoint]

    def at(self, pattern: str, load: float) -> list[BurstPoint]:
        """The points of one pattern and load, in run order."""
        return [p for p in self.points if p.pattern == pattern and p.load == load]

    def best_baseline(self, pattern: str, load: float) -> BurstPoint | None:
        """The baseline as deployed (``is_baseline``) with the most goodput of correct answers at this pattern and
        load."""
        base = [p for p in self.at(pattern, load) if is_baseline(p.variant)]
        return max(base, key=lambda p: p.mean(lambda o: o.correct_met), default=None)

    def ratio(self, pattern: str, load: float, variant: str) -> tuple[float, list[float]] | None:
        """Goodput of correct answers of ``variant`` over the best baseline's: mean ratio and per seed."""
        best = self.best_baseline(pattern, load)
        mine = next((p for p in self.at(pattern, load) if p.variant == variant), None)
        if best is None or mine is None:
            return None
        per_seed = [
            a.correct_met / b.correct_met if b.correct_met > 0 else math.inf
            for a, b in zip(mine.outcomes, best.outcomes, strict=True)
        ]
        total_b = sum(o.correct_met for o in best.outcomes)
        total_a = sum(o.correct_met for o in mine.outcomes)
        return (total_a / total_b if total_b > 0 else math.inf), per_seed

    def to_json(self) -> dict[str, Any]:
        """Everything, for ``--json``."""
        head = {"trace": self.trace, "cluster": self.cluster, "slo_s": self.slo_s, "fluid_bound_qps": self.bound_qps}
        return {
            **head,
            **{k: getattr(self, k) for k in ("workflows", "seeds", "quality_source")},
            "points": [self._point_json(p) for p in self.points],
        }

    def _point_json(self, p: BurstPoint) -> dict[str, Any]:
        best = self.best_baseline(p.pattern, p.load)
        r = self.ratio(p.pattern, p.load, p.variant)
        return {
            **{k: getattr(p, k) for k in ("pattern", "load", "rate_qps", "variant")},
            **{k: p.mean(attrgetter(a)) for k, a in _FIGURES.items()},
            "best_baseline": best.variant if best is not None else None,
            "ratio_vs_best_baseline": r[0] if r is not None else None,
            "ratio_per_seed": r[1] if r is not None else None,
            "queue_limit": p.queue_limit,
            "per_seed": [asdict(o) for o in p.outcomes],
        }


def _setup_for(base: Setup, pattern: Pattern, mode: QualityMode, quality: QualityModel) -> Setup:
    """``base`` with the pattern's arrivals (Poisson when None), one tenant at ``mode`` and ``quality``."""
    tenants = [TenantSpec("default", quality=mode)]
    path = pattern if isinstance(pattern, Path) else None
    flash = pattern == FLASH
    return replace(base, arrivals_csv=path, flash=flash, cv=1.0, tenants=tenants, quality_model=quality)


def simulate_once(
    st: Setup, variant: Variant, rate: float, seed: int, *, queue_limit: int | None = None, log: bool = False
) -> tuple[list[Any], SimResult, float]:
    """One seed's workflows at ``rate``, their run under ``variant`` and their arrival span (``queue_limit``: a
    ``QueueGate``'s, for a variant that admits by queue length). ``log``: each degrading workflow records its
    decisions (``KnobbedWorkflow.log``)."""
    wfs = st.workflows(rate, seed)
    if log:
        for w in wfs:
            if isinstance(w, KnobbedWorkflow):
                w.log = []
    style = variant.admission
    gate: SaturationGate | QueueGate | None = None
    if style == "saturation":
        gate = SaturationGate()
    elif style == "queue":
        gate = QueueGate(queue_limit if queue_limit is not None else QUEUE_LIMITS[-1] * len(st.workers))
    sim = Simulator(
        st.workers,
        variant.policy,
        seed=seed,
        prefix_caching=st.prefix_caching,
        admission=style == "predictive",
        admission_miss=st.admission_miss,
        gate=gate,
    )
    res = sim.run(wfs)
    return wfs, res, (wfs[-1].arrival - wfs[0].arrival) if len(wfs) > 1 else 0.0


def setting_bounds(base: Setup, quality: QualityModel, full: Knobs = FULL) -> list[tuple[Knobs, float, float]]:
    """Per knob setting of the pipeline's grid: (knobs, accuracy, the fluid bound's rate of the base seed's
    workflows run at it)."""
    wfs = base.workflows(1.0)
    out: list[tuple[Knobs, float, float]] = []
    for k in knob_grid(full):
        mix = [knobbed_calls(wf.stages, k) for wf in wfs]
        rate = solve_fluid_bound(base.workers, mix, prefix_caching=base.prefix_caching).rate_qps
        out.append((k, quality.accuracy(k), rate))
    return out


def tuned_queue_limit(st: Setup, variant: Variant, rate: float, quality: QualityModel, tune_seed: int) -> int | None:
    """For a variant admitting by queue length, the ``QUEUE_LIMITS`` entry (times the workers) with the most
    correct answers in time on the tuning seed; None for any other."""
    if variant.admission != "queue":
        return None
    best, best_correct = 0, -1.0
    acc_full = quality.accuracy(FULL)
    for per_worker in QUEUE_LIMITS:
        limit = per_worker * len(st.workers)
        wfs, res, span = simulate_once(st, variant, rate, tune_seed, queue_limit=limit)
        correct = outcome(res, len(wfs), span, quality, acc_full).correct_met
        if correct > best_correct:
            best, best_correct = limit, correct
    return best


def run_burst(
    base: Setup,
    patterns: Sequence[tuple[str, Pattern]],
    loads: Sequence[float],
    variants: Sequence[str],
    quality: QualityModel,
    *,
    progress: Callable[[int], object] | None = None,
    cluster: str = "",
) -> BurstReport:
    """Measure every variant at every (pattern, load) on every seed of ``base``.

    ``loads`` are shares of ``base``'s fluid bound; a workflow that did not degrade is as accurate as the model
    at the pipeline's full setting. A variant admitting by queue length runs at the ``QUEUE_LIMITS`` entry best
    on the tuning seed at that point. Each seed's arrivals get their goodput bound.
    """
    acc_full = quality.accuracy(FULL)
    bound = base.bound.rate_qps
    settings = [(a, r) for _, a, r in setting_bounds(base, quality)]
    parsed = [(v, parse_variant(v)) for v in variants]
    points: list[BurstPoint] = []
    for name, path in patterns:
        for load in loads:
            rate = load * bound
            full_st = _setup_for(base, path, "full", quality)
            bounds = {}
            for s in base.seeds:
                arrivals = [wf.arrival for wf in full_st.workflows(rate, s)]
                bounds[s] = burst_goodput_bound(arrivals, base.slo_s, settings)
            for variant, v in parsed:
                st = _setup_for(base, path, v.mode, quality)
                limit = tuned_queue_limit(st, v, rate, quality, base.tune_seed)
                pt = BurstPoint(name, load, rate, variant, queue_limit=limit)
                for s in base.seeds:
                    wfs, res, span = simulate_once(st, v, rate, s, queue_limit=limit)
                    pt.outcomes.append(outcome(res, len(wfs), span, quality, acc_full, bounds[s]))
                    if progress is not None:
                        progress(1)
                points.append(pt)
    return BurstReport(base.trace, cluster, base.slo_s, bound, base.n_workflows, base.seeds, quality.source, points)


@dataclass(frozen=True)
class Timeline:
    """Per window of arrival time: arrivals per second, SLO attainment and degraded share of each variant."""

    window_s: float
    starts: list[float]
    arrival_qps: list[float]
    attainment: dict[str, list[float]]
    degraded: dict[str, list[float]]


def timeline(
    base: Setup,
    pattern: Pattern,
    rate: float,
    variants: Sequence[str],
    quality: QualityModel,
    *,
    windows: int = 40,
) -> Timeline:
    """The base seed's run of each variant, cut into ``windows`` windows of arrival time (see ``Timeline``)."""
    starts: list[float] = []
    att: dict[str, list[float]] = {}
    deg: dict[str, list[float]] = {}
    qps: list[float] = []
    width = 0.0
    for variant in variants:
        v = parse_variant(variant)
        st = _setup_for(base, pattern, v.mode, quality)
        limit = tuned_queue_limit(st, v, rate, quality, base.tune_seed)
        wfs, res, span = simulate_once(st, v, rate, base.seed, queue_limit=limit)
        t0 = wfs[0].arrival
        width = max(span / windows, 1e-9)
        by_id = {r.wid: r for r in res.workflows}
        slots = [(min(int((wf.arrival - t0) / width), windows - 1), by_id.get(wf.wid)) for wf in wfs]
        att[variant], deg[variant] = _window_shares(slots, windows, "met"), _window_shares(slots, windows, "degraded")
        if not qps:
            n = Counter(k for k, _ in slots)
            starts = [k * width for k in range(windows)]
            qps = [n[k] / width for k in range(windows)]
    return Timeline(width, starts, qps, att, deg)


def _window_shares(slots: Sequence[tuple[int, Any]], windows: int, flag: str) -> list[float]:
    """Per window, the share of its arrivals (``(window, outcome or None)``) whose outcome has ``flag`` set (NaN
    for a window without arrivals)."""
    n, hits = Counter(k for k, _ in slots), Counter(k for k, r in slots if r is not None and getattr(r, flag))
    return [hits[k] / n[k] if n[k] else math.nan for k in range(windows)]


def plot_burst(report: BurstReport, tl: Timeline | None, path: Path, *, title: str = "") -> None:
    """A PNG: goodput of correct answers against load per pattern (one panel each), and the timeline."""
    plt = pyplot()

    patterns = list(dict.fromkeys(p.pattern for p in report.points))
    panels = len(patterns) + (2 if tl is not None else 0)
    cols = min(3, panels)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, name in zip(flat, patterns, strict=False):
        variants = list(dict.fromkeys(p.variant for p in report.points if p.pattern == name))
        for v in variants:
            pts = sorted((p for p in report.points if p.pattern == name and p.variant == v), key=lambda p: p.load)
            ys = [p.mean(lambda o: o.goodput_share) for p in pts]
            style = "-" if v.startswith("hexgen") else "--"
            ax.plot([p.load for p in pts], ys, style, marker="o", linewidth=2.2 if "+" in v else 1.2, label=v)
        ax.set_title(f"{name}: correct answers in time")
        ax.set_xlabel("load (share of the fluid bound)")
        ax.set_ylabel("share of arrivals")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    if patterns:
        flat[0].legend(fontsize=7, ncol=2)
    if tl is not None:

        def valid(ys: list[float]) -> tuple[list[float], list[float]]:
            # Windows without arrivals have no attainment: skip them, join the others.
            pts = [(x, y) for x, y in zip(tl.starts, ys, strict=True) if not math.isnan(y)]
            return [x + tl.window_s / 2 for x, _ in pts], [y for _, y in pts]

        ax = flat[len(patterns)]
        ax2 = ax.twinx()
        ax2.bar(tl.starts, tl.arrival_qps, width=tl.window_s, align="edge", alpha=0.18, color="grey")
        ax2.set_ylabel("arrivals/s (grey bars)")
        for v, ys in tl.attainment.items():
            ax.plot(*valid(ys), marker="o", markersize=3, label=v, linewidth=2.0 if "+" in v else 1.0, zorder=3)
        ax.set_zorder(ax2.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.legend(fontsize=7, loc="lower left")
        deg = flat[len(patterns) + 1]
        for v, ys in tl.degraded.items():
            if any(y > 0 for y in ys if not math.isnan(y)):
                deg.plot(*valid(ys), marker="o", markersize=3, label=v)
        if deg.lines:
            deg.legend(fontsize=7)
        for a, what in ((ax, "through a burst: SLO attainment"), (deg, "degraded share")):
            a.set_title(f"{what} by arrival time")
            a.set_xlabel("arrival time (s)")
            a.set_ylim(0, 1.02)
    for ax in flat[panels:]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    save_figure(fig, path)
