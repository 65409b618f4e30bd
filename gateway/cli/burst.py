"""``hexflow bench burst``: goodput of correct answers under recorded bursty arrivals (``gateway.bench.burst``)."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.bench.stats import table
from gateway.cli.common import (
    CLUSTER,
    JSON,
    LOG_DIR,
    NO_PREFIX_CACHING,
    PLOT,
    POLICY_LIST,
    QUIET,
    SEED,
    SLO_SCALE,
    TIME_SCALE,
    TRACE,
    WORKFLOWS,
    Command,
    Opt,
    UsageError,
    flag,
    int_arg,
    load_workers,
    opt,
    usage_errors,
    workload_queries,
    write_json,
    write_with,
)

if TYPE_CHECKING:
    from gateway.bench.burst import BurstReport
    from gateway.core.worker import WorkerInfo

__all__ = ["BURST", "format_burst"]

DEFAULT_PATTERNS = "azure-code,azure-conv,mooncake,burstgpt,servegen"
DEFAULT_LOADS = "0.3,0.45,0.6"


def _floats(name: str, text: str) -> list[float]:
    out: list[float] = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise UsageError(f"{name}: expected comma-separated numbers, got {part!r}") from None
        if not 0 < v <= 2:
            raise UsageError(f"{name}: each load must be a share of the fluid bound in (0, 2], got {v}")
        out.append(v)
    return out


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
    variants = [v.strip() for v in args.policies.split(",") if v.strip()]
    with usage_errors("--policies: "):
        for v in variants:
            parse_variant(v)
    names = [n.strip() for n in args.patterns.split(",") if n.strip()]
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
    trace, queries = workload_queries(args.trace, workflows, args.seed)
    base = Setup(
        workers=workers,
        queries=queries,
        trace=trace,
        n_workflows=workflows,
        slo_scale=args.slo_scale,
        seed=args.seed,
        n_seeds=seeds,
        prefix_caching=args.prefix_caching,
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
            f"{trace} on {args.cluster}, SLO {args.slo_scale:g}x, {workflows} workflows x {seeds} seeds; "
            f"timeline: {tl_name} at {tl_load:g} x the fluid bound, seed {args.seed}"
        )
        write_with(args.plot, partial(plot_burst, report, tl, title=title))
    return 0


def _live(
    args: argparse.Namespace,
    workers: list[WorkerInfo],
    pattern: tuple[str, Path | None],
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
    report = run_live_burst(
        base,
        pattern,
        load,
        variants,
        quality,
        cluster=args.cluster,
        time_scale=args.time_scale,
        progress=say,
        dump=dump,
        log_dir=Path(args.log_dir) if args.log_dir else None,
        simulate_only=args.simulate_only,
    )
    print(format_live_report(report))
    if args.dump:
        write_json(args.dump, dump, indent=None, end="", allow_nan=True)
    if args.json:
        write_json(args.json, report.to_json(), indent=1, end="", allow_nan=True)
    return 0


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
            rows.append(
                [
                    p.variant,
                    f"{p.mean(lambda o: o.attainment):.3f}",
                    f"{p.mean(lambda o: o.goodput_share):.3f}",
                    f"{p.mean(lambda o: o.goodput_qps):.4f}",
                    f"{p.mean(lambda o: o.accuracy):.3f}",
                    f"{p.mean(lambda o: o.degraded_share):.3f}",
                    "-" if r is None else f"{r[0]:.2f}x (" + ", ".join(f"{x:.2f}" for x in r[1]) + ")",
                ]
            )
        lines.append("")
        lines.append(
            f"{pattern} at {load:g} x the fluid bound ({load * report.bound_qps:.4f}/s); best baseline: "
            f"{best.variant if best else '-'}"
        )
        lines.append(
            table(["policy", "slo_attain", "good_share", "good_qps", "accuracy", "degraded", "vs best baseline"], rows)
        )
    return "\n".join(lines)


def _burst_opts() -> tuple[Opt, ...]:
    from gateway.bench.burst import PATTERNS
    from gateway.core.policy import policies_with_role

    ours = policies_with_role("ours")
    policies = [*policies_with_role("baseline"), *ours, *(f"{p}+adaptive" for p in ours)]
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
            f"comma-separated arrival patterns: {', '.join(PATTERNS)}, poisson, or trace file paths (default: "
            f"{DEFAULT_PATTERNS})",
        ),
        opt("--loads", str, DEFAULT_LOADS, "shares of the fluid bound"),
        POLICY_LIST(
            "comma-separated policies, each optionally +adaptive or +fast (default: every baseline, hexgen, "
            "hexgen+adaptive)",
            default=",".join(policies),
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
