"""The benchmarks of ``hexflow bench`` about load: ``overload`` (the live gateway past its capacity),
``admission`` (deadline-aware admission's effect on goodput, simulated), ``tuner`` (the background alpha tuner
against the best fixed alpha in hindsight) and ``burst`` (goodput of correct answers under recorded bursty
arrivals)."""

from __future__ import annotations

import argparse
import math
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.argtypes import nonneg_float, nonneg_int, positive_float, positive_floats, positive_int
from gateway.bench.stats import table
from gateway.cli.common import (
    ALPHA,
    BENCH_WORKFLOWS,
    CLUSTER,
    JOBS,
    JSON,
    LOG_DIR,
    NO_PREFIX_CACHING,
    PLOT,
    POLICY,
    POLICY_LIST,
    QUIET,
    REL_TOL,
    SEED,
    SEEDS,
    SLO_SCALE,
    TIME_SCALE,
    TRACE,
    WORKFLOWS,
    Command,
    Opt,
    UsageError,
    flag,
    int_arg,
    listed,
    live_settings,
    load_workers,
    opt,
    pick,
    policy_names,
    setup_from_args,
    show,
    usage_errors,
    workload_opts,
    write_json,
    write_with,
)

if TYPE_CHECKING:
    from gateway.bench.burst import BurstReport, Pattern
    from gateway.core.worker import WorkerInfo

__all__ = ["ADMISSION", "BURST", "OVERLOAD", "TUNER", "format_burst"]

WARMUP = 500
"""``bench tuner``: workflows before the measured ones (default): the largest default window fills first."""
MEASURED = 1500
"""``bench tuner``: workflows measured per run (default)."""
DEFAULT_PATTERNS = "azure-code,azure-conv,mooncake,burstgpt,servegen"
DEFAULT_LOADS = "0.3,0.45,0.6"


def cmd_bench_overload(args: argparse.Namespace) -> int:
    """Run the overload benchmark; print the report; exit 1 when a goal of the issue is not met."""
    from gateway.bench.overload import format_report, plot_report, run_overload

    names = ("capacity_fraction", "factor", "capacity_s", "burst_s", "quiet_s", "bursts", "slo_scale")
    with usage_errors():
        rep = run_overload(
            live_settings(args), **pick(args, *names, "admission_share"), predictive=not args.no_predictive
        )
    return show(args, format_report(rep), rep.to_json, plot=partial(plot_report, rep), ok=all(rep.checks().values()))


def cmd_bench_admission(args: argparse.Namespace) -> int:
    """Run the admission benchmark, print its tables, write its JSON and plot."""
    from tqdm import tqdm

    from gateway.bench.admission import (
        bench_steps,
        format_admission_report,
        parse_variant,
        plot_admission_report,
        run_admission_bench,
    )

    policies = policy_names(args.policies)
    with usage_errors("--variants: "):
        variants = [
            parse_variant(v) for v in listed("--variants", args.variants, "(off, reject@SHARE, best_effort@SHARE)")
        ]
    setup = setup_from_args(args, n_seeds=args.seeds)
    steps = bench_steps(len(policies), len(variants), len(args.loads), args.seeds)
    with (
        tqdm(total=steps, desc="admission", unit="run", disable=args.quiet or None, leave=False) as bar,
        usage_errors(),  # (a variant listed twice)
    ):
        report = run_admission_bench(
            setup, policies=policies, variants=variants, **pick(args, "loads", "alpha", "rel_tol"), progress=bar.update
        )
    return show(args, format_admission_report(report), report.to_json, plot=partial(plot_admission_report, report))


OVERLOAD = Command(
    "overload",
    cmd_bench_overload,
    "admission under overload: capacity, then bursts at a multiple of it, on emulated workers",
    "Capacity, then overload bursts, against a live gateway over an emulated cluster: accepted, rejected and shed "
    "workflows, the share of accepted that met the deadline, goodput, the gateway's RSS.",
    (
        CLUSTER,
        TIME_SCALE,
        opt("--capacity-fraction", positive_float, 0.75, "the sustainable rate, as a fraction of the fluid bound"),
        opt("--factor", positive_float, 5.0, "overload rate = this x the sustainable rate"),
        opt("--capacity-s", positive_float, 40.0, "wall seconds of arrivals at the sustainable rate"),
        opt("--burst-s", positive_float, 30.0, "wall seconds of each overload burst"),
        opt("--quiet-s", nonneg_float, 15.0, "wall seconds without arrivals between phases"),
        opt("--bursts", positive_int, 3, "overload bursts"),
        SLO_SCALE,
        flag("--no-predictive", "turn predictive admission off (concurrency limits only)"),
        opt(
            "--share",
            positive_float,
            None,
            "the gateway's admission.sustainable_share, in (0, 1] (default: the gateway's default, 0.25)",
            dest="admission_share",
        ),
        SEED,
        LOG_DIR,
        JSON,
        PLOT("write a PNG of the gateway's RSS over time"),
    ),
)


def _admission_opts() -> tuple[Opt, ...]:
    from gateway.bench.admission import DEFAULT_LOADS, DEFAULT_VARIANTS

    variants = ",".join(DEFAULT_VARIANTS)
    return (
        *workload_opts(BENCH_WORKFLOWS),
        POLICY_LIST(default="hexgen,llmd"),
        opt("--variants", str, variants, "comma-separated: off, reject@SHARE, best_effort@SHARE"),
        opt(
            "--loads",
            positive_floats,
            list(DEFAULT_LOADS),
            "rates of the sweep as multiples of the reference capacity, comma-separated (default "
            f"{','.join(f'{x:g}' for x in DEFAULT_LOADS)})",
        ),
        SEEDS,
        REL_TOL,
        ALPHA,
        PLOT("write a PNG of goodput and kept promises against load"),
        QUIET,
    )


ADMISSION = Command(
    "admission",
    cmd_bench_admission,
    "deadline-aware admission in the simulator: capacity and goodput below and above it, per share",
    "Per admission variant: the capacity (>= 95% of arrivals in time, refusals missed) per seed, then a load sweep "
    "at multiples of the first policy's capacity without admission: share met, admitted, admitted that met, goodput.",
    _admission_opts,
)


def cmd_bench_tuner(args: argparse.Namespace) -> int:
    """Run the tuner benchmark, print its tables, write its JSON."""
    from tqdm import tqdm

    from gateway.bench.simbench import Setup
    from gateway.bench.tuner import bench_steps, format_tuner_report, run_tuner_bench
    from gateway.config.operations import TuningConfig
    from gateway.sim.tune import ALPHA_GRID
    from gateway.sim.workload import CHESS_BIRD
    from gateway.sim.workload.traces import SHARED_TRACE_DIR

    windows = [int_arg("--windows", w, minimum=10) for w in listed("--windows", args.windows, "window size")]
    tuning = TuningConfig() if args.every is None else TuningConfig(every_workflows=args.every)
    traces = listed("--traces", args.traces, "trace")
    trace_dir = Path(args.trace_dir) if args.trace_dir else None
    folder = trace_dir if trace_dir is not None else SHARED_TRACE_DIR
    notes = []
    if not folder.is_dir() and all(t == CHESS_BIRD or Path(t).name == t for t in traces):
        # The shared traces are not in every checkout: measure the built-in workload instead, and say so.
        # (With the folder present, an unknown name is an error, not a silent fallback.)
        notes.append(f"note: no trace folder {folder.name}/; measured the built-in chess-bird workload instead")
        traces = [CHESS_BIRD]
    workers = load_workers(args.cluster)
    n = args.warmup + args.measured
    setups = [
        Setup.of_trace(
            t, workers, n_workflows=n, slo_scale=args.slo_scale, seed=args.seed, n_seeds=1, trace_dir=trace_dir
        )
        for t in traces
    ]
    seeds = [args.seed + i for i in range(args.seeds)]
    tuner_options = ("policy", "warmup", "load", "jobs")
    steps = bench_steps(len(setups), args.seeds, len(tuning.grid or ALPHA_GRID), len(windows))
    with (
        tqdm(total=steps, desc="bench tuner", unit="run", disable=args.quiet or None, leave=False) as bar,
        usage_errors(),
    ):
        report = run_tuner_bench(
            setups, windows=windows, seeds=seeds, tuning=tuning, progress=bar.update, **pick(args, *tuner_options)
        )
    report.notes += notes
    return show(args, format_tuner_report(report, args.cluster), report.to_json)


def _bench_tuner_opts() -> tuple[Opt, ...]:
    from gateway.bench.tuner import LOAD, TRACES, WINDOWS

    return (
        opt("--traces", str, ",".join(TRACES), "comma-separated trace names or files"),
        opt("--trace-dir", str, None, "where trace names are looked up (default ../shared/data/...)"),
        CLUSTER,
        POLICY("the policy whose alpha is tuned"),
        SLO_SCALE(default=3.0),
        opt("--load", positive_float, LOAD, "rate as a fraction of the policy's capacity (default alpha)"),
        opt("--windows", str, ",".join(map(str, WINDOWS)), "window sizes (workflows), comma-separated"),
        opt("--every", positive_int, None, "re-tune every this many finished workflows (default: the gateway's)"),
        opt("--warmup", nonneg_int, WARMUP, "workflows before the measured ones"),
        opt("--measured", positive_int, MEASURED, "workflows measured per run"),
        opt("--seeds", positive_int, 1, "arrival sequences per trace (seeds 0..n-1 from --seed)"),
        SEED("first seed of the arrival sequences"),
        JOBS,
        QUIET,
        JSON,
    )


TUNER = Command(
    "tuner",
    cmd_bench_tuner,
    "the alpha tuner as the live gateway runs it, against the best fixed alpha in hindsight",
    "Per trace: the best fixed alpha in hindsight over a long run near capacity, the tuner run as live (trailing "
    "window of N workflows, re-tuned every K) for several window sizes, and the wall time of one re-tune. Missing "
    "traces fall back to the built-in chess-bird workload.",
    _bench_tuner_opts,
)


def _floats(name: str, text: str) -> list[float]:
    """``--loads``: comma-separated shares of the fluid bound in (0, 2], else a ``UsageError`` naming ``name``."""
    with usage_errors(f"{name}: ", argparse.ArgumentTypeError):
        loads = positive_floats(text)
    if max(loads) > 2:
        raise UsageError(f"{name}: each load must be a share of the fluid bound in (0, 2], got {max(loads)}")
    return loads


def cmd_bench_burst(args: argparse.Namespace) -> int:
    """Run the burst benchmark and print one table per pattern and load."""
    from tqdm import tqdm

    from gateway.bench.burst import parse_variant, plot_burst, resolve_pattern, run_burst, timeline
    from gateway.bench.simbench import Setup
    from gateway.config.quality import load_quality
    from gateway.errors import GatewayError

    seeds = int_arg("--seeds", str(args.seeds), minimum=1)
    workflows = int_arg("--workflows", str(args.workflows), minimum=2)
    loads = _floats("--loads", args.loads)
    variants = listed("--policies", args.policies)
    with usage_errors("--policies: "):
        for v in variants:
            parse_variant(v)
    if args.live:
        if args.policies == ",".join(_burst_policies()):
            variants = _burst_policies(admit=False)
        elif any(parse_variant(v).admission == "saturation" for v in variants):
            raise UsageError("--policies: llm-d's flow control (llmd+admit) runs in the simulator only, not --live")
    names = listed("--patterns", args.patterns)
    if args.steady and "poisson" not in names:
        names.append("poisson")
    try:
        patterns = [(n, resolve_pattern(n)) for n in names]
        quality = load_quality(Path(args.quality) if args.quality else None)
    except GatewayError as exc:
        raise UsageError(str(exc)) from None
    workers = load_workers(args.cluster)
    if args.live:
        return _live(args, workers, patterns[0], loads[0], variants, workflows, seeds)
    base = Setup.of_trace(
        args.trace,
        workers,
        n_workflows=workflows,
        n_seeds=seeds,
        **pick(args, "slo_scale", "seed", "prefix_caching"),
    )
    steps = len(patterns) * len(loads) * len(variants) * seeds
    with tqdm(total=steps, desc="bench burst", unit="run", disable=args.quiet or None, leave=False) as bar:
        report = run_burst(base, patterns, loads, variants, quality, progress=bar.update, cluster=args.cluster)
    print(format_burst(report))
    if args.json:
        write_json(args.json, report.to_json(), indent=1, end="", allow_nan=True)
    if args.plot:
        tl_name, tl_load = names[0], loads[len(loads) // 2]
        if args.timeline:
            tl_name, _, load_text = args.timeline.partition(":")
            tl_load = _floats("--timeline", load_text)[0] if load_text else tl_load
        try:
            tl_path = resolve_pattern(tl_name)
        except GatewayError as exc:
            raise UsageError(f"--timeline: {exc}") from None
        # The timeline shows the best baseline at that point, and every hexgen variant.
        best = report.best_baseline(tl_name, tl_load)
        shown = [v for v in variants if v.startswith("hexgen") or (best is not None and v == best.variant)]
        tl = timeline(base, tl_path, tl_load * report.bound_qps, shown or variants, quality, windows=30)
        title = (
            f"{base.trace} on {args.cluster}, SLO {args.slo_scale:g}x, {workflows} workflows x {seeds} seeds; "
            f"timeline: {tl_name} at {tl_load:g} x the fluid bound, seed {args.seed}"
        )
        write_with(args.plot, partial(plot_burst, report, tl, title=title))
    return 0


def _live(
    args: argparse.Namespace,
    workers: list[WorkerInfo],
    pattern: tuple[str, Pattern],
    load: float,
    variants: list[str],
    workflows: int,
    seeds: int,
) -> int:
    """``--live``: the demo questions live beside the simulator (``gateway.bench.burst_live``)."""
    from gateway.bench.burst_live import demo_quality, format_live_report, live_setup, run_live_burst

    def say(msg: str) -> None:
        if not args.quiet:
            print(f"... {msg}", flush=True)

    say("measuring the accuracy model on the demo questions")
    quality = demo_quality()
    base = live_setup(workers, workflows=workflows, slo_scale=args.slo_scale, seed=args.seed, n_seeds=seeds)
    dump: list[dict[str, Any]] | None = [] if args.dump else None
    names = ("cluster", "time_scale", "log_dir", "simulate_only")
    report = run_live_burst(base, pattern, load, variants, quality, progress=say, dump=dump, **pick(args, *names))
    print(format_live_report(report))
    if args.dump:
        write_json(args.dump, dump, indent=None, end="", allow_nan=True)
    if args.json:
        write_json(args.json, report.to_json(), indent=1, end="", allow_nan=True)
    return 0


_BURST_FIGURES = (
    ("attainment", 3),
    ("goodput_share", 3),
    ("goodput_qps", 4),
    ("accuracy", 3),
    ("degraded_share", 3),
    ("refused_share", 3),
    ("bound_share", 3),
)
"""``bench burst``'s columns after the policy: ``Outcome`` figures (means over the seeds) and their decimals."""


def format_burst(report: BurstReport) -> str:
    """One table per (pattern, load): the variants' figures and their ratio to the best baseline."""
    lines = [
        f"{report.trace} on {report.cluster or 'the cluster'}, SLO {report.slo_s:.1f} s, {report.workflows} workflows "
        f"per run, seeds {', '.join(map(str, report.seeds))}; fluid bound {report.bound_qps:.4f} workflows/s",
        f"quality model: {report.quality_source or '(unnamed)'}",
    ]
    keys = list(dict.fromkeys((p.pattern, p.load) for p in report.points))
    for pattern, load in keys:
        best = report.best_baseline(pattern, load)
        rows = []
        for p in report.at(pattern, load):
            r = report.ratio(pattern, load, p.variant)
            figures = (f"{p.mean(attrgetter(k)):.{digits}f}" for k, digits in _BURST_FIGURES)
            rows.append(
                [p.variant, *figures, "-" if r is None else f"{r[0]:.2f}x ({', '.join(f'{x:.2f}' for x in r[1])})"]
            )
        lines.append("")
        points = report.at(pattern, load)
        bound = points[0].mean(lambda o: o.bound / o.arrived if o.arrived else math.nan) if points else math.nan
        lines.append(
            f"{pattern} at {load:g} x the fluid bound ({load * report.bound_qps:.4f}/s); goodput bound under bursts: "
            f"{bound:.3f} of arrivals; best baseline: {best.variant if best else '-'}"
        )
        head = ["policy", "slo_attain", "good_share", "good_qps", "accuracy", "degraded", "refused", "of_bound"]
        lines.append(table([*head, "vs best baseline"], rows))
    return "\n".join(lines)


def _burst_policies(*, admit: bool = True) -> list[str]:
    """``bench burst``'s default variants: every baseline, hexgen and hexgen+adaptive, each with and without its
    admission (``admit``; ``--live`` runs without: llm-d's flow control is simulated only)."""
    from gateway.core.policy import policies_with_role

    ours = [f"{p}{v}" for p in policies_with_role("ours") for v in ("", "+adaptive")]
    variants = [*policies_with_role("baseline"), *ours]
    return [*variants, *(f"{v}+admit" for v in variants)] if admit else variants


def _burst_opts() -> tuple[Opt, ...]:
    from gateway.bench.burst import PATTERNS

    return (
        TRACE(
            "the CHESS workflows: trace name under ../shared/data/hexgen-traces, trace file, or chess-bird",
            default="trace1",
        ),
        CLUSTER,
        SLO_SCALE("SLO = this x the cluster-mean single-request latency of the standard workflow", default=3.0),
        SEED("first seed", type=int),
        WORKFLOWS("workflows per run", type=int, default=1000),
        NO_PREFIX_CACHING,
        opt(
            "--patterns",
            str,
            DEFAULT_PATTERNS,
            f"comma-separated arrival patterns: {', '.join(PATTERNS)}, flash, poisson, or trace file paths (default: "
            f"{DEFAULT_PATTERNS})",
        ),
        opt("--loads", str, DEFAULT_LOADS, "shares of the fluid bound"),
        POLICY_LIST(
            "comma-separated policies, each optionally +adaptive or +fast, then optionally +admit (its system's "
            "admission: ours predictive, llm-d's saturation shedding, the others a queue-length 429) (default: every "
            "baseline with and without its admission, hexgen and hexgen+adaptive with and without)",
            default=",".join(_burst_policies()),
        ),
        opt("--seeds", str, "3", "seeds per point"),
        opt("--quality", str, None, "quality model file (default: the packaged quality.yaml)"),
        flag("--steady", "also run each load with Poisson arrivals"),
        JSON("write every point as JSON here"),
        PLOT("write a PNG: goodput per pattern against load, and a timeline"),
        opt(
            "--timeline",
            str,
            None,
            "PATTERN:LOAD for the plot's timeline (default: the first pattern at the middle load)",
        ),
        flag(
            "--live",
            "run the demo questions live (the gateway's Text-to-SQL pipeline on an emulated cluster answering from "
            "the demo script) beside the simulator's prediction of the same run; the first of --patterns and of "
            "--loads; --slo-scale is then in units of a demo question's latency",
        ),
        TIME_SCALE("with --live: wall seconds per modelled second of the emulated GPUs", default=0.5),
        opt(
            "--dump",
            str,
            None,
            "with --live: write every question side by side (simulated and live: latency, knobs, each degradation "
            "decision, each call's times) as JSON here",
        ),
        LOG_DIR("with --live: keep each run's configs and subprocess logs here"),
        flag(
            "--simulate-only",
            "with --live: only the simulator's prediction of the live run (seconds instead of the arrival span)",
        ),
        QUIET,
    )


BURST = Command(
    "burst",
    cmd_bench_burst,
    "goodput of correct answers under recorded bursty arrivals, with and without degradation",
    "Replays recorded arrival patterns (from ../shared/data) rescaled to shares of the fluid bound, with the "
    "trace's CHESS workflows; per policy: SLO attainment, goodput of correct answers within the deadline, accuracy "
    "and the share of degraded workflows. hexgen+adaptive degrades (tenant quality: adaptive); ratios are against "
    "the best baseline without degradation.",
    _burst_opts,
)
