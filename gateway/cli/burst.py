"""``hexflow bench burst``: goodput of correct answers under recorded bursty arrivals (``gateway.bench.burst``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.bench.stats import table
from gateway.cli.common import (
    UsageError,
    add_cluster_arg,
    add_output_args,
    add_prefix_caching_arg,
    int_arg,
    load_workers,
    workload_queries,
)

if TYPE_CHECKING:
    from gateway.bench.burst import BurstReport
    from gateway.cli.common import Subparsers
    from gateway.core.worker import WorkerInfo

DEFAULT_PATTERNS = "azure-code,azure-conv,mooncake,burstgpt,servegen"
DEFAULT_LOADS = "0.3,0.45,0.6"


def add_bench_burst(sub: Subparsers) -> None:
    """``hexflow bench burst``."""
    from gateway.bench.burst import PATTERNS
    from gateway.core.policy import policies_with_role

    ours = policies_with_role("ours")

    p = sub.add_parser(
        "burst",
        help="goodput of correct answers under recorded bursty arrivals, with and without degradation",
        description="Replays recorded arrival patterns (from ../shared/data) rescaled to shares of the fluid "
        "bound, with the trace's CHESS workflows; per policy: SLO attainment, goodput of correct answers "
        "within the deadline, accuracy and the share of degraded workflows. hexgen+adaptive degrades "
        "(tenant quality: adaptive); ratios are against the best baseline without degradation.",
    )
    p.add_argument(
        "--trace",
        default="trace1",
        help="the CHESS workflows: trace name under ../shared/data/hexgen-traces, trace file, or chess-bird "
        "(default: trace1)",
    )
    add_cluster_arg(p, "cluster file or name under config/clusters (default: paper-4gpu)")
    p.add_argument(
        "--slo-scale",
        type=float,
        default=3.0,
        help="SLO = this x the cluster-mean single-request latency of the standard workflow (default: 3)",
    )
    p.add_argument("--seed", type=int, default=0, help="first seed (default: 0)")
    p.add_argument("--workflows", type=int, default=1000, help="workflows per run (default: 1000)")
    add_prefix_caching_arg(p)
    p.add_argument(
        "--patterns",
        default=DEFAULT_PATTERNS,
        help=f"comma-separated arrival patterns: {', '.join(PATTERNS)}, poisson, or trace file paths "
        f"(default: {DEFAULT_PATTERNS})",
    )
    p.add_argument("--loads", default=DEFAULT_LOADS, help=f"shares of the fluid bound (default: {DEFAULT_LOADS})")
    p.add_argument(
        "--policies",
        default=",".join([*policies_with_role("baseline"), *ours, *(f"{p}+adaptive" for p in ours)]),
        help="comma-separated policies, each optionally +adaptive or +fast (default: every baseline, hexgen, "
        "hexgen+adaptive)",
    )
    p.add_argument("--seeds", default="3", help="seeds per point (default: 3)")
    p.add_argument("--quality", default=None, help="quality model file (default: the packaged quality.yaml)")
    p.add_argument("--steady", action="store_true", help="also run each load with Poisson arrivals")
    add_output_args(p, "write every point as JSON here")
    p.add_argument("--plot", default=None, help="write a PNG: goodput per pattern against load, and a timeline")
    p.add_argument(
        "--timeline",
        default=None,
        help="PATTERN:LOAD for the plot's timeline (default: the first pattern at the middle load)",
    )
    _add_live_options(p)
    add_output_args(p, quiet="no progress bar")
    p.set_defaults(func=cmd_bench_burst)


def _add_live_options(p: argparse.ArgumentParser) -> None:
    """``--live`` and the options that go with it."""
    p.add_argument(
        "--live",
        action="store_true",
        help="run the demo questions live (the gateway's Text-to-SQL pipeline on an emulated cluster answering "
        "from the demo script) beside the simulator's prediction of the same run; the first of --patterns "
        "and of --loads; --slo-scale is then in units of a demo question's latency",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=0.5,
        help="with --live: wall seconds per modelled second of the emulated GPUs (default: 0.5)",
    )
    p.add_argument(
        "--dump",
        default=None,
        help="with --live: write every question side by side (simulated and live: latency, knobs, each "
        "degradation decision, each call's times) as JSON here",
    )
    p.add_argument("--log-dir", default=None, help="with --live: keep each run's configs and subprocess logs here")
    p.add_argument(
        "--simulate-only",
        action="store_true",
        help="with --live: only the simulator's prediction of the live run (seconds instead of the arrival span)",
    )


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
    if not args.slo_scale > 0:
        raise UsageError(f"--slo-scale: must be positive, got {args.slo_scale}")
    loads = _floats("--loads", args.loads)
    variants = [v.strip() for v in args.policies.split(",") if v.strip()]
    for v in variants:
        try:
            parse_variant(v)
        except ValueError as exc:
            raise UsageError(f"--policies: {exc}") from None
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
        _write(args.json, report.to_json())
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
        plot_burst(report, tl, Path(args.plot), title=title)
        print(f"wrote {args.plot}")
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

    if not args.time_scale > 0:
        raise UsageError(f"--time-scale: must be positive, got {args.time_scale}")

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
        _write(args.dump, dump, indent=None)
    if args.json:
        _write(args.json, report.to_json())
    return 0


def _write(path: str, doc: Any, indent: int | None = 1) -> None:
    """Write ``doc`` as JSON to ``path`` (parents created) and say so."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=indent), encoding="utf-8")
    print(f"wrote {path}")


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
