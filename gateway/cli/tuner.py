"""The alpha tuner's commands: ``hexflow tune`` (tune alpha on a window of traffic by simulation) and ``hexflow
bench tuner`` (the background tuner against the best fixed alpha in hindsight, ``gateway.bench.tuner``)."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from gateway.argtypes import fractions, nonneg_int, positive_float, positive_int
from gateway.bench.stats import fmt, table
from gateway.cli.common import (
    Subparsers,
    UsageError,
    add_cluster_arg,
    add_output_args,
    add_workload_args,
    int_arg,
    load_workers,
    positive_float_arg,
    setup_from_args,
    show,
)
from gateway.core.policy import get_policy

__all__ = ["add_bench_tuner", "add_tune", "cmd_bench_tuner", "cmd_tune"]

WARMUP = 500
"""Workflows before the measured ones (default): the largest default window fills first."""
MEASURED = 1500
"""Workflows measured per run (default)."""


def add_bench_tuner(sub: Subparsers) -> None:
    """``hexflow bench tuner``."""
    from gateway.bench.tuner import LOAD, TRACES, WINDOWS

    p = sub.add_parser(
        "tuner",
        help="the alpha tuner as the live gateway runs it, against the best fixed alpha in hindsight",
        description="Per trace: the best fixed alpha in hindsight over a long run near capacity, the tuner run "
        "as live (trailing window of N workflows, re-tuned every K) for several window sizes, and the wall "
        "time of one re-tune. Missing traces fall back to the built-in chess-bird workload.",
    )
    p.add_argument("--traces", default=",".join(TRACES), help="comma-separated trace names or files")
    p.add_argument("--trace-dir", default=None, help="where trace names are looked up (default ../shared/data/...)")
    add_cluster_arg(p)
    p.add_argument("--policy", default="hexgen", help="the policy whose alpha is tuned")
    p.add_argument("--slo-scale", type=positive_float, default=3.0, help="SLO = this x the standard workflow's latency")
    p.add_argument("--load", default=str(LOAD), help="rate as a fraction of the policy's capacity (default alpha)")
    p.add_argument("--windows", default=",".join(map(str, WINDOWS)), help="window sizes (workflows), comma-separated")
    p.add_argument("--every", default=None, help="re-tune every this many finished workflows (default: the gateway's)")
    p.add_argument("--warmup", default=str(WARMUP), help="workflows before the measured ones")
    p.add_argument("--measured", default=str(MEASURED), help="workflows measured per run")
    p.add_argument("--seeds", default="1", help="arrival sequences per trace (seeds 0..n-1 from --seed)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="first seed of the arrival sequences")
    p.add_argument("--jobs", type=positive_int, default=min(2, os.cpu_count() or 1), help="runs in parallel processes")
    add_output_args(p, quiet="no progress bar")
    add_output_args(p, "write the report as JSON here")
    p.set_defaults(func=cmd_bench_tuner)


def cmd_bench_tuner(args: argparse.Namespace) -> int:
    """Run the tuner benchmark, print its tables, write its JSON."""
    from tqdm import tqdm

    from gateway.bench.tuner import bench_steps, format_tuner_report, load_setup, run_tuner_bench
    from gateway.config.operations import TuningConfig
    from gateway.sim.tune import ALPHA_GRID
    from gateway.sim.workload import CHESS_BIRD
    from gateway.sim.workload.traces import SHARED_TRACE_DIR

    load = positive_float_arg("--load", args.load)
    warmup = int_arg("--warmup", args.warmup, minimum=0)
    measured = int_arg("--measured", args.measured, minimum=1)
    n_seeds = int_arg("--seeds", args.seeds, minimum=1)
    windows = [int_arg("--windows", w.strip(), minimum=10) for w in args.windows.split(",") if w.strip()]
    if not windows:
        raise UsageError("--windows: give at least one window size")
    tuning = TuningConfig()
    if args.every is not None:
        tuning = TuningConfig(every_workflows=int_arg("--every", args.every, minimum=1))
    traces = [t.strip() for t in args.traces.split(",") if t.strip()]
    if not traces:
        raise UsageError("--traces: give at least one trace")
    trace_dir = Path(args.trace_dir) if args.trace_dir else None
    folder = trace_dir if trace_dir is not None else SHARED_TRACE_DIR
    notes = []
    if not folder.is_dir() and all(t == CHESS_BIRD or Path(t).name == t for t in traces):
        # The shared traces are not in every checkout: measure the built-in workload instead, and say so.
        # (With the folder present, an unknown name is an error, not a silent fallback.)
        notes.append(f"note: no trace folder {folder.name}/; measured the built-in chess-bird workload instead")
        traces = [CHESS_BIRD]
    workers = load_workers(args.cluster)
    setups = [
        load_setup(
            t,
            cluster=workers,
            n_workflows=warmup + measured,
            slo_scale=args.slo_scale,
            seed=args.seed,
            trace_dir=trace_dir,
        )
        for t in traces
    ]
    seeds = [args.seed + i for i in range(n_seeds)]
    steps = bench_steps(len(setups), n_seeds, len(tuning.grid or ALPHA_GRID), len(windows))
    with tqdm(total=steps, desc="bench tuner", unit="run", disable=args.quiet or None, leave=False) as bar:
        try:
            report = run_tuner_bench(
                setups,
                policy=args.policy,
                warmup=warmup,
                windows=windows,
                seeds=seeds,
                tuning=tuning,
                load=load,
                jobs=args.jobs,
                progress=bar.update,
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    report.notes += notes
    show(format_tuner_report(report, args.cluster), args.json, report.to_json)
    return 0


def add_tune(sub: Subparsers) -> None:
    """``hexflow tune``."""
    p = sub.add_parser(
        "tune",
        help="tune alpha on a window of traffic by simulation",
        description="Replay a window of workflows in the simulator once per alpha of a grid (what the gateway's "
        "background tuner does with its recent traffic) and print each alpha's P50, P95 and SLO attainment, and "
        "the alpha chosen.",
    )
    add_workload_args(p, workflows=400)
    p.add_argument("--policy", default="hexgen", help="the policy whose alpha is tuned")
    p.add_argument(
        "--rate", type=positive_float, default=None, help="arrival rate, workflows/s (default 0.6 x fluid bound)"
    )
    p.add_argument(
        "--window",
        type=positive_int,
        default=None,
        help="workflows in the window: the first N of the run (default: the gateway's tuning.window_workflows)",
    )
    p.add_argument(
        "--grid", type=fractions, default=None, help="alphas in [0, 1] to try, comma-separated (default 0, 0.1, ..., 1)"
    )
    p.add_argument("--no-smooth", action="store_true", help="pick the raw minimum P95, not the neighbourhood mean")
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    """Tune alpha on a window of traffic; print the table of all grid points."""
    from gateway.bench.simbench import fluid_bound
    from gateway.sim.tune import ALPHA_GRID, tune_alpha

    policy = get_policy(args.policy)
    if not policy.uses_alpha:
        raise UsageError(f"--policy: {policy.name} does not use alpha")
    setup = setup_from_args(args)
    rate = (
        args.rate
        if args.rate is not None
        else round(0.6 * fluid_bound(setup.workers, setup.queries, prefix_caching=setup.prefix_caching), 4)
    )
    wfs = setup.workflows(rate)
    from gateway.config.operations import TuningConfig

    n = TuningConfig().window_workflows if args.window is None else args.window
    window = wfs[:n]
    grid = ALPHA_GRID if not args.grid else tuple(args.grid)
    t0 = time.perf_counter()
    res = tune_alpha(
        setup.workers,
        policy.name,
        window,
        grid=grid,
        seed=args.seed,
        smooth=not args.no_smooth,
        prefix_caching=setup.prefix_caching,
    )
    wall = time.perf_counter() - t0
    rows = [
        [
            f"{p.alpha:.2f}",
            fmt(p.summary.p50_s),
            fmt(p.summary.p95_s),
            f"{p.summary.slo_attainment:.3f}",
            "<-" if p.alpha == res.alpha else "",
        ]
        for p in res.points
    ]
    span = window[-1].arrival - window[0].arrival
    print(f"window: {len(window)} workflows over {span:.0f} s at {rate:g} qps on {args.cluster}")
    print(table(["alpha", "p50_s", "p95_s", "slo", "chosen"], rows))
    print(f"alpha = {res.alpha:.2f}  (tuned in {wall:.2f} s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {
                    "alpha": res.alpha,
                    "rate_qps": rate,
                    "window_workflows": len(window),
                    "seconds": wall,
                    "points": [{"alpha": p.alpha, **p.summary.as_dict()} for p in res.points],
                },
                indent=2,
                default=lambda x: None,
            )
            + "\n"
        )
    return 0
