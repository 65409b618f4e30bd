"""``hexflow bench admission``: what deadline-aware admission does to goodput, per variant (off; reject at each
share; best effort), at capacity and over a load sweep. Method and figures: docs/benchmarks.md "Admission"."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from operator import attrgetter
from pathlib import Path
from typing import Any

from gateway.bench.simbench import Bench, Setup, simulate, tuned_alpha
from gateway.bench.stats import RunHeader, Spread, fmt, json_safe, pyplot, save_figure, spread, table
from gateway.core.policy import get_policy

ProgressFn = Callable[[int], object]

DEFAULT_LOADS = (0.8, 0.9, 1.0, 1.5, 2.0, 5.0)
"""Rates of the sweep, as multiples of the reference rate (default)."""
DEFAULT_VARIANTS = ("off", "reject@0.25", "reject@0.5", "reject@1", "best_effort@0.25")
"""Admission variants measured (default): ``off``, or ``MODE@SHARE``."""
TUNE_LOAD = 0.6
"""Alpha is tuned at this share of the fluid bound when no policy without alpha gives a capacity to tune at."""


@dataclass(frozen=True)
class Variant:
    """One way of admitting: off (``share`` None), or a share and what a predicted miss gets."""

    name: str
    share: float | None
    miss: str = "reject"


def parse_variant(text: str) -> Variant:
    """``off``, ``reject@SHARE`` or ``best_effort@SHARE`` (``SHARE`` in (0, 1]); ``ValueError`` otherwise."""
    t = text.strip()
    if t == "off":
        return Variant("off", None)
    mode, sep, num = t.partition("@")
    if not sep or mode not in ("reject", "best_effort"):
        raise ValueError(f"admission variant {t!r}: expected off, reject@SHARE or best_effort@SHARE")
    try:
        share = float(num)
    except ValueError:
        raise ValueError(f"admission variant {t!r}: the share {num!r} is not a number") from None
    if not 0.0 < share <= 1.0:
        raise ValueError(f"admission variant {t!r}: the share must be in (0, 1]")
    return Variant(f"{mode}@{share:g}", share, mode)


@dataclass(frozen=True)
class AdmissionPoint:
    """One run: a policy and a variant at one rate (``load`` x the reference rate) on one seed.
    ``met_admitted``: met among the admitted (neither refused nor demoted); ``shed``: admitted, then shed by
    the overload re-check (predicted past the deadline, or best effort past its age limit), counted as missed."""

    policy: str
    variant: str
    load: float
    rate_qps: float
    seed: int
    arrived: int
    refused: int
    demoted: int
    met: int
    met_admitted: int
    shed: int = 0

    @property
    def attainment(self) -> float:
        """Share of arrivals answered within their deadline."""
        return self.met / self.arrived if self.arrived else math.nan

    @property
    def admitted_share(self) -> float:
        """Share of arrivals admitted at their urgency (neither refused nor demoted)."""
        return (self.arrived - self.refused - self.demoted) / self.arrived if self.arrived else math.nan

    @property
    def kept(self) -> float:
        """Share of the admitted that met their deadline (NaN when none was admitted)."""
        n = self.arrived - self.refused - self.demoted
        return self.met_admitted / n if n else math.nan

    @property
    def shed_share(self) -> float:
        """Share of arrivals shed after admission."""
        return self.shed / self.arrived if self.arrived else math.nan

    @property
    def goodput_qps(self) -> float:
        """Workflows answered within their deadline per second of arrivals."""
        return self.attainment * self.rate_qps


@dataclass
class AdmissionReport(RunHeader):
    """Capacities and the load sweep of every (policy, variant)."""

    policies: list[str]
    variants: list[Variant]
    alphas: dict[str, float | None]
    bound_qps: float
    reference_qps: float
    loads: list[float]
    capacity: dict[tuple[str, str], Spread] = field(default_factory=dict)
    points: list[AdmissionPoint] = field(default_factory=list)

    def at(self, policy: str, variant: str, load: float) -> list[AdmissionPoint]:
        """The seeds' runs of one (policy, variant) at one load."""
        return [p for p in self.points if p.policy == policy and p.variant == variant and p.load == load]

    def mean(self, policy: str, variant: str, load: float, fn: Callable[[AdmissionPoint], float]) -> float:
        """Mean over the seeds of ``fn`` (NaN values left out; NaN when none is left)."""
        vals = [v for v in (fn(p) for p in self.at(policy, variant, load)) if not math.isnan(v)]
        return sum(vals) / len(vals) if vals else math.nan

    def to_json(self) -> dict[str, Any]:
        """Everything, per seed, for ``--json``."""
        return {
            **self.header(),
            "policies": self.policies,
            "variants": [asdict(v) for v in self.variants],
            "alphas": self.alphas,
            "fluid_bound_qps": self.bound_qps,
            "reference_qps": self.reference_qps,
            "loads": self.loads,
            "capacity_qps": [{"policy": p, "variant": v, **s.as_dict()} for (p, v), s in sorted(self.capacity.items())],
            "points": [
                json_safe(
                    {**asdict(p), **{k: getattr(p, k) for k in ("attainment", "admitted_share", "kept", "goodput_qps")}}
                )
                for p in self.points
            ],
        }


def bench_steps(n_policies: int, n_variants: int, n_loads: int, n_seeds: int) -> int:
    """Progress steps of a run: one per capacity search and one per load run."""
    return n_policies * n_variants * n_seeds * (1 + n_loads)


def _point(
    setup: Setup, policy: str, variant: str, load: float, rate: float, alpha: float | None, seed: int
) -> AdmissionPoint:
    _, res, n = simulate(setup, policy, rate, alpha=alpha, seed=seed)
    low = set(res.demoted)
    met = [r.wid for r in res.workflows if r.met]
    counts = (n, len(res.rejected), len(low), len(met), sum(1 for w in met if w not in low), len(res.shed))
    return AdmissionPoint(policy, variant, load, rate, seed, *counts)


def _check_arguments(policies: Sequence[str], variants: Sequence[Variant], loads: Sequence[float]) -> list[str]:
    """Fail before any run on an empty or unknown policy list, no or repeated variants, or a bad load; the
    variants' names."""
    if not policies:
        raise ValueError("no policy to measure")
    if not variants:
        raise ValueError("no admission variant to measure")
    if not loads or any(not (x > 0 and math.isfinite(x)) for x in loads):
        raise ValueError(f"loads must be positive numbers, got {list(loads)}")
    for p in policies:
        get_policy(p)  # an unknown name fails here, before any run
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"admission variants repeat: {names}")
    return names


def run_admission_bench(
    setup: Setup,
    *,
    policies: Sequence[str] = ("hexgen", "llmd"),
    variants: Sequence[Variant] | None = None,
    loads: Sequence[float] = DEFAULT_LOADS,
    alpha: float | None = None,
    rel_tol: float = 0.01,
    progress: ProgressFn | None = None,
) -> AdmissionReport:
    """Measure every (policy, variant): capacity per seed, then the load sweep.

    ``variants``: default ``DEFAULT_VARIANTS``. ``setup``'s own admission fields are ignored (each variant
    sets them). ``alpha`` fixes every policy's; None tunes it per policy once.
    """
    if variants is None:
        variants = [parse_variant(v) for v in DEFAULT_VARIANTS]
    names = _check_arguments(policies, variants, loads)
    base = replace(setup, admission_share=None)
    bound = base.bound.rate_qps
    alphas: dict[str, float | None] = {p: None for p in policies}
    setups = {v.name: replace(base, admission_share=v.share, admission_miss=v.miss) for v in variants}
    report = AdmissionReport(
        trace=setup.trace,
        cluster=[w.name for w in setup.workers],
        slo_scale=setup.slo_scale,
        slo_s=base.slo_s,
        n_workflows=setup.n_workflows,
        seeds=base.seeds,
        policies=list(policies),
        variants=list(variants),
        alphas=alphas,
        bound_qps=bound,
        reference_qps=math.nan,
        loads=list(loads),
    )

    ref_variant = "off" if "off" in names else names[0]

    tick = None if progress is None else lambda _seed: progress(1)

    def capacities(p: str) -> None:
        for v in variants:
            caps = Bench(setups[v.name]).capacities(p, bound, alpha=alphas[p], rel_tol=rel_tol, before=tick)
            report.capacity[(p, v.name)] = spread(caps)

    # Capacities first, the policies that read no alpha before those that do: alpha is tuned once per policy,
    # as ``hexflow bench`` tunes it, at the best of the others' capacities (without admission), else at
    # ``TUNE_LOAD`` x the fluid bound.
    plain = [p for p in policies if not get_policy(p).uses_alpha]
    for p in plain:
        capacities(p)
    tune_at = max((report.capacity[(p, ref_variant)].mean for p in plain), default=0.0)
    if not tune_at > 0:
        tune_at = TUNE_LOAD * bound
    for p in policies:
        if p in plain:
            continue
        alphas[p] = alpha if alpha is not None else tuned_alpha(base, p, tune_at)
        capacities(p)
    report.reference_qps = report.capacity[(policies[0], ref_variant)].mean
    ref = report.reference_qps if report.reference_qps > 0 else 0.5 * bound
    for p in policies:
        for v in variants:
            for load in loads:
                for s in base.seeds:
                    report.points.append(_point(setups[v.name], p, v.name, load, load * ref, alphas[p], s))
                    if progress is not None:
                        progress(1)
    return report


def format_admission_report(r: AdmissionReport) -> str:
    """The capacity table and, per policy, the load sweep (means over the seeds)."""
    lines = [
        f"admission on {r.trace}, {'/'.join(r.cluster)}, SLO {r.slo_scale:g}x = {r.slo_s:.1f} s, "
        f"{r.n_workflows} workflows per run, seeds {', '.join(map(str, r.seeds))}; fluid bound {r.bound_qps:.4f}/s",
        "alpha: " + ", ".join(f"{p} {'-' if a is None else f'{a:g}'}" for p, a in r.alphas.items()),
        "",
        "capacity (>= 95% of arrivals within their deadline; a refused workflow counts as missed), workflows/s:",
    ]
    rows = []
    for p in r.policies:
        off = r.capacity.get((p, "off"))
        for v in r.variants:
            c = r.capacity[(p, v.name)]
            rel = f"{c.mean / off.mean:.3f}x" if off is not None and off.mean > 0 else "-"
            per_seed = " ".join(f"{x:.4f}" for x in c.values)
            rows.append([p, v.name, f"{c.mean:.4f}", f"{c.min:.4f}-{c.max:.4f}", per_seed, rel])
    lines.append(table(["policy", "admission", "capacity", "min-max", "per_seed", "vs off"], rows, left=2))
    lines.append("")
    lines.append(
        f"load sweep: rate = load x {r.reference_qps:.4f}/s ({r.policies[0]}'s capacity without admission); "
        "met = share of arrivals in time, admitted = neither refused nor demoted, kept = admitted that met, "
        "shed = admitted then shed by the overload re-check, goodput = met per second"
    )
    figures = (("attainment", 3), ("admitted_share", 3), ("kept", 3), ("shed_share", 3), ("goodput_qps", 4))
    for p in r.policies:
        rows = [
            [f"{load:g}", v.name, *(fmt(r.mean(p, v.name, load, attrgetter(k)), d) for k, d in figures)]
            for load in r.loads
            for v in r.variants
        ]
        lines.append(f"{p}:")
        lines.append(table(["load", "admission", "met", "admitted", "kept", "shed", "goodput/s"], rows, left=2))
    return "\n".join(lines)


def plot_admission_report(r: AdmissionReport, path: Path) -> None:
    """Goodput and kept promises against load, a line per (policy, variant)."""
    plt = pyplot()

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = ["-", "--", ":", "-."]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    xs = list(r.loads)
    for i, p in enumerate(r.policies):
        for j, v in enumerate(r.variants):
            good = [r.mean(p, v.name, x, lambda q: q.goodput_qps) for x in xs]
            kept = [r.mean(p, v.name, x, lambda q: q.kept) for x in xs]
            style = {"ls": styles[i % len(styles)], "color": colors[j % len(colors)], "marker": "o", "ms": 4}
            ax1.plot(xs, good, label=f"{p} {v.name}", **style)
            ax2.plot(xs, kept, **style)
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs])
        ax.minorticks_off()
        ax.set_xlabel(f"arrival rate / {r.reference_qps:.3f} per s ({r.policies[0]}'s capacity without admission)")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("goodput (workflows in time per s)")
    ax2.set_ylabel("admitted workflows in time (share)")
    ax2.axhline(0.95, color="grey", lw=0.8)
    ax1.set_title(f"{r.trace}, SLO {r.slo_scale:g}x: goodput")
    ax2.set_title("promises kept")
    ax1.legend(fontsize=7)
    save_figure(fig, path)
