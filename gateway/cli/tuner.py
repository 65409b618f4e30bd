"""``hexflow bench tuner``: the background alpha tuner against the best fixed alpha in hindsight
(``gateway.bench.tuner``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gateway.cli.common import (
    Subparsers,
    UsageError,
    int_arg,
    load_workers,
    nonneg_int,
    positive_float,
    positive_float_arg,
    positive_int,
    write_json,
)

__all__ = ["add_bench_tuner", "cmd_bench_tuner"]

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
    p.add_argument("--cluster", default="paper-4gpu", help="cluster file or name under config/clusters")
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
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", default=None, help="write the report as JSON here")
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
    print(format_tuner_report(report, args.cluster))
    if args.json:
        write_json(args.json, report.to_json())
    return 0
