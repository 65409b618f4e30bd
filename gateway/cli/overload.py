"""The overload benchmarks: ``hexflow bench overload`` (the live gateway past its capacity) and ``bench
admission`` (deadline-aware admission's effect on goodput in the simulator)."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from gateway.argtypes import nonneg_float, positive_float, positive_floats, positive_int
from gateway.cli.common import (
    ALPHA,
    BENCH_WORKFLOWS,
    CLUSTER,
    JSON,
    LOG_DIR,
    PLOT,
    POLICY_LIST,
    QUIET,
    REL_TOL,
    SEED,
    SEEDS,
    SLO_SCALE,
    TIME_SCALE,
    Command,
    Opt,
    UsageError,
    flag,
    opt,
    policy_names,
    setup_from_args,
    show,
    usage_errors,
    workload_opts,
    write_with,
)

__all__ = ["ADMISSION", "OVERLOAD"]


def cmd_bench_overload(args: argparse.Namespace) -> int:
    """Run the overload benchmark; print the report; exit 1 when a goal of the issue is not met."""
    from gateway.bench.overload import format_report, plot_report, run_overload

    with usage_errors():
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
    show(format_report(rep), args.json, rep.to_json)
    write_with(args.plot, partial(plot_report, rep))
    return 0 if all(rep.checks().values()) else 1


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
        variants = [parse_variant(v) for v in args.variants.split(",") if v.strip()]
    if not variants:
        raise UsageError("--variants: give at least one (off, reject@SHARE, best_effort@SHARE)")
    setup = setup_from_args(args, n_seeds=args.seeds)
    steps = bench_steps(len(policies), len(variants), len(args.loads), args.seeds)
    with (
        tqdm(total=steps, desc="admission", unit="run", disable=args.quiet or None, leave=False) as bar,
        usage_errors(),  # (a variant listed twice)
    ):
        report = run_admission_bench(
            setup,
            policies=policies,
            variants=variants,
            loads=args.loads,
            alpha=args.alpha,
            rel_tol=args.rel_tol,
            progress=bar.update,
        )
    show(format_admission_report(report), args.json, report.to_json)
    write_with(args.plot, partial(plot_admission_report, report))
    return 0


OVERLOAD = Command(
    "overload",
    cmd_bench_overload,
    "admission under overload: capacity, then bursts at a multiple of it, on emulated workers",
    "Capacity, then overload bursts, against a live gateway over an emulated cluster: accepted, rejected and shed "
    "workflows, the share of accepted that met the deadline, goodput, and the gateway's RSS.",
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
    "Per admission variant (off, reject@SHARE, best_effort@SHARE): the capacity (>= 95% of arrivals in time, "
    "refusals counted as missed) per seed, then a load sweep at multiples of the first policy's capacity without "
    "admission: share met, admitted, admitted that met, goodput.",
    _admission_opts,
)
