"""The overload benchmarks: ``hexflow bench overload`` (the live gateway past its capacity) and ``bench
admission`` (deadline-aware admission's effect on goodput in the simulator)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gateway.argtypes import (
    fraction,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_floats,
    positive_int,
    unit_open_fraction,
)
from gateway.cli.common import (
    BENCH_WORKFLOWS,
    Subparsers,
    UsageError,
    add_cluster_arg,
    add_output_args,
    add_workload_args,
    policy_names,
    setup_from_args,
    show,
)


def add_bench_overload(sub: Subparsers) -> None:
    """``hexflow bench overload``: admission under overload on emulated workers (``gateway.bench.overload``)."""
    p = sub.add_parser(
        "overload",
        help="admission under overload: capacity, then bursts at a multiple of it, on emulated workers",
        description="Capacity, then overload bursts, against a live gateway over an emulated cluster: accepted, "
        "rejected and shed workflows, the share of accepted that met the deadline, goodput, and the gateway's RSS.",
    )
    add_cluster_arg(p)
    p.add_argument(
        "--time-scale", type=positive_float, default=0.05, help="wall seconds per modelled second (emulated)"
    )
    p.add_argument(
        "--capacity-fraction",
        type=positive_float,
        default=0.75,
        help="the sustainable rate, as a fraction of the fluid bound",
    )
    p.add_argument("--factor", type=positive_float, default=5.0, help="overload rate = this x the sustainable rate")
    p.add_argument(
        "--capacity-s", type=positive_float, default=40.0, help="wall seconds of arrivals at the sustainable rate"
    )
    p.add_argument("--burst-s", type=positive_float, default=30.0, help="wall seconds of each overload burst")
    p.add_argument("--quiet-s", type=nonneg_float, default=15.0, help="wall seconds without arrivals between phases")
    p.add_argument("--bursts", type=positive_int, default=3, help="overload bursts")
    p.add_argument(
        "--slo-scale", type=positive_float, default=5.0, help="deadline = this x the standard workflow's latency"
    )
    p.add_argument(
        "--no-predictive", action="store_true", help="turn predictive admission off (concurrency limits only)"
    )
    p.add_argument(
        "--share",
        type=positive_float,
        default=None,
        help="the gateway's admission.sustainable_share, in (0, 1] (default: the gateway's default, 0.25)",
    )
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the workflows and arrivals")
    p.add_argument("--log-dir", default=None, help="keep subprocess logs and configs here")
    add_output_args(p, "write the report as JSON here")
    p.add_argument("--plot", default=None, help="write a PNG of the gateway's RSS over time")
    p.set_defaults(func=cmd_bench_overload)


def cmd_bench_overload(args: argparse.Namespace) -> int:
    """Run the overload benchmark; print the report; exit 1 when a goal of the issue is not met."""
    from gateway.bench.overload import format_report, plot_report, run_overload

    try:
        rep = run_overload(
            cluster=args.cluster,
            time_scale=args.time_scale,
            capacity_fraction=args.capacity_fraction,
            factor=args.factor,
            capacity_s=args.capacity_s,
            burst_s=args.burst_s,
            quiet_s=args.quiet_s,
            bursts=args.bursts,
            slo_scale=args.slo_scale,
            predictive=not args.no_predictive,
            admission_share=args.share,
            seed=args.seed,
            log_dir=Path(args.log_dir) if args.log_dir else None,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    show(format_report(rep), args.json, rep.to_json)
    if args.plot:
        plot_report(rep, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0 if all(rep.checks().values()) else 1


def add_bench_admission(sub: Subparsers) -> None:
    """``hexflow bench admission``: deadline-aware admission's effect on goodput (``gateway.bench.admission``)."""
    from gateway.bench.admission import DEFAULT_LOADS, DEFAULT_VARIANTS

    p = sub.add_parser(
        "admission",
        help="deadline-aware admission in the simulator: capacity and goodput below and above it, per share",
        description="Per admission variant (off, reject@SHARE, best_effort@SHARE): the capacity (>= 95% of "
        "arrivals in time, refusals counted as missed) per seed, then a load sweep at multiples of the first "
        "policy's capacity without admission: share met, admitted, admitted that met, goodput.",
    )
    add_workload_args(p, workflows=BENCH_WORKFLOWS)
    p.add_argument("--policies", default="hexgen,llmd", help="comma-separated (default hexgen,llmd)")
    p.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated: off, reject@SHARE, best_effort@SHARE (default {','.join(DEFAULT_VARIANTS)})",
    )
    p.add_argument(
        "--loads",
        type=positive_floats,
        default=list(DEFAULT_LOADS),
        help="rates of the sweep as multiples of the reference capacity, comma-separated (default "
        f"{','.join(f'{x:g}' for x in DEFAULT_LOADS)})",
    )
    p.add_argument("--seeds", type=positive_int, default=3, help="seeds per point (default 3)")
    p.add_argument(
        "--rel-tol", type=unit_open_fraction, default=0.01, help="relative precision of each capacity, in (0, 1)"
    )
    p.add_argument("--alpha", type=fraction, default=None, help="fixed alpha (default: tuned once per policy)")
    p.add_argument("--plot", default=None, help="write a PNG of goodput and kept promises against load")
    add_output_args(p, quiet="no progress bar")
    p.set_defaults(func=cmd_bench_admission)


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
    try:
        variants = [parse_variant(v) for v in args.variants.split(",") if v.strip()]
    except ValueError as exc:
        raise UsageError(f"--variants: {exc}") from None
    if not variants:
        raise UsageError("--variants: give at least one (off, reject@SHARE, best_effort@SHARE)")
    setup = setup_from_args(args, n_seeds=args.seeds)
    steps = bench_steps(len(policies), len(variants), len(args.loads), args.seeds)
    with tqdm(total=steps, desc="admission", unit="run", disable=args.quiet or None, leave=False) as bar:
        try:
            report = run_admission_bench(
                setup,
                policies=policies,
                variants=variants,
                loads=args.loads,
                alpha=args.alpha,
                rel_tol=args.rel_tol,
                progress=bar.update,
            )
        except ValueError as exc:  # (a variant listed twice)
            raise UsageError(str(exc)) from None
    show(format_admission_report(report), args.json, report.to_json)
    if args.plot:
        plot_admission_report(report, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0
