"""``hexflow bench burst``: goodput of correct answers under recorded bursty arrivals (``PATTERNS``) rescaled
to a share of the fluid bound, per policy with and without degradation (``gateway.core.degrade``); SLO
attainment, accuracy-weighted goodput, accuracy and degraded share, and a per-window ``timeline``. Method
and figures: docs/benchmarks.md "Bursts"."""

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

from gateway.bench.simbench import Setup
from gateway.bench.stats import Spread, pyplot, save_figure, spread
from gateway.core.degrade import QUALITY_MODES, QualityMode, QualityModel
from gateway.core.policy import POLICIES, get_policy
from gateway.errors import ConfigError, UnknownNameError
from gateway.sim.degrade import KnobbedWorkflow
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


def resolve_pattern(name: str, data_dir: Path | None = None) -> Path | None:
    """The file of a pattern name (``PATTERNS``) or a path; None for ``poisson``. An unknown name, or a
    known one whose file is absent (no ``../shared/data``), raises ``UnknownNameError`` saying where
    patterns come from."""
    if name == STEADY:
        return None
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
    raise UnknownNameError("arrival pattern (or trace file)", name, [STEADY, *PATTERNS])


def parse_variant(text: str) -> tuple[str, QualityMode]:
    """``policy`` or ``policy+mode`` (``hexgen+adaptive``) -> (policy, quality mode); ``ValueError`` if bad."""
    policy, plus, mode = text.partition("+")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} in {text!r}; known: {', '.join(POLICIES)}")
    if not plus:
        return policy, "full"
    for m in QUALITY_MODES:
        if m == mode:
            return policy, m
    raise ValueError(f"unknown quality mode {mode!r} in {text!r}; known: {', '.join(QUALITY_MODES)}")


def is_baseline(variant: str) -> bool:
    """The variant's policy is a baseline (``Policy.role``: what a user could deploy instead of ours)."""
    return get_policy(parse_variant(variant)[0]).role == "baseline"


@dataclass(frozen=True)
class Outcome:
    """One run's figures (``correct_met``: correct answers within the deadline, weighted by accuracy)."""

    arrived: int
    met: int
    correct_met: float
    accuracy: float
    degraded: int
    span_s: float

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


def outcome(res: SimResult, arrived: int, span_s: float, quality: QualityModel, full_accuracy: float) -> Outcome:
    """Summarise one run: a workflow that never finished counts as arrived and missed."""
    accs = [quality.accuracy(r.knobs) if r.knobs is not None else full_accuracy for r in res.workflows]
    correct = sum((a for a, r in zip(accs, res.workflows, strict=True) if r.met), 0.0)
    met, degraded = sum(r.met for r in res.workflows), sum(r.degraded for r in res.workflows)
    return Outcome(arrived, met, correct, sum(accs) / len(accs) if accs else 0.0, degraded, span_s)


_FIGURES = {
    "slo_attainment": "attainment",
    "goodput_correct_qps": "goodput_qps",
    "goodput_correct_share": "goodput_share",
    "accuracy": "accuracy",
    "degraded_share": "degraded_share",
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
        """The baseline (full quality) with the most goodput of correct answers at this pattern and load."""
        base = [p for p in self.at(pattern, load) if "+" not in p.variant and is_baseline(p.variant)]
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
            "per_seed": [asdict(o) for o in p.outcomes],
        }


def _setup_for(base: Setup, pattern_path: Path | None, mode: QualityMode, quality: QualityModel) -> Setup:
    """``base`` with the pattern's arrivals (Poisson when None), one tenant at ``mode`` and ``quality``."""
    tenants = [TenantSpec("default", quality=mode)]
    return replace(base, arrivals_csv=pattern_path, cv=1.0, tenants=tenants, quality_model=quality)


def simulate_once(
    st: Setup, policy: str, rate: float, seed: int, *, log: bool = False
) -> tuple[list[Any], SimResult, float]:
    """One seed's workflows at ``rate``, their run under ``policy`` and their arrival span. ``log``: each
    degrading workflow records its decisions (``KnobbedWorkflow.log``)."""
    wfs = st.workflows(rate, seed)
    if log:
        for w in wfs:
            if isinstance(w, KnobbedWorkflow):
                w.log = []
    res = Simulator(st.workers, policy, seed=seed, prefix_caching=st.prefix_caching).run(wfs)
    return wfs, res, (wfs[-1].arrival - wfs[0].arrival) if len(wfs) > 1 else 0.0


def run_burst(
    base: Setup,
    patterns: Sequence[tuple[str, Path | None]],
    loads: Sequence[float],
    variants: Sequence[str],
    quality: QualityModel,
    *,
    progress: Callable[[int], object] | None = None,
    cluster: str = "",
) -> BurstReport:
    """Measure every variant at every (pattern, load) on every seed of ``base``.

    ``loads`` are shares of ``base``'s fluid bound; a workflow that did not degrade is as accurate as the model
    at the pipeline's full setting.
    """
    from gateway.core.degrade import Knobs

    acc_full = quality.accuracy(Knobs(2, 10, True))
    bound = base.bound.rate_qps
    parsed = [(v, *parse_variant(v)) for v in variants]
    points: list[BurstPoint] = []
    for name, path in patterns:
        for load in loads:
            rate = load * bound
            for variant, policy, mode in parsed:
                st = _setup_for(base, path, mode, quality)
                pt = BurstPoint(name, load, rate, variant)
                for s in base.seeds:
                    wfs, res, span = simulate_once(st, policy, rate, s)
                    pt.outcomes.append(outcome(res, len(wfs), span, quality, acc_full))
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
    pattern: Path | None,
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
        policy, mode = parse_variant(variant)
        wfs, res, span = simulate_once(_setup_for(base, pattern, mode, quality), policy, rate, base.seed)
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
