"""The alpha tuner's commands: ``hexflow tune`` (tune alpha on a window of traffic by simulation) and ``hexflow
bench tuner`` (the background tuner against the best fixed alpha in hindsight, ``gateway.bench.tuner``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gateway.argtypes import fractions, positive_int
from gateway.bench.stats import fmt, table
from gateway.cli.common import (
    CLUSTER,
    JOBS,
    JSON,
    POLICY,
    QUIET,
    RATE,
    SEED,
    SLO_SCALE,
    Command,
    Opt,
    UsageError,
    as_null,
    flag,
    int_arg,
    load_workers,
    opt,
    positive_float_arg,
    setup_from_args,
    show,
    usage_errors,
    workload_opts,
    write_json,
)
from gateway.core.policy import get_policy

__all__ = ["BENCH_TUNER", "TUNE", "cmd_bench_tuner", "cmd_tune"]

WARMUP = 500
"""Workflows before the measured ones (default): the largest default window fills first."""
MEASURED = 1500
"""Workflows measured per run (default)."""


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
    n = warmup + measured
    setups = [
        load_setup(t, cluster=workers, n_workflows=n, slo_scale=args.slo_scale, seed=args.seed, trace_dir=trace_dir)
        for t in traces
    ]
    seeds = [args.seed + i for i in range(n_seeds)]
    steps = bench_steps(len(setups), n_seeds, len(tuning.grid or ALPHA_GRID), len(windows))
    with (
        tqdm(total=steps, desc="bench tuner", unit="run", disable=args.quiet or None, leave=False) as bar,
        usage_errors(),
    ):
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
    report.notes += notes
    show(format_tuner_report(report, args.cluster), args.json, report.to_json)
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Tune alpha on a window of traffic; print the table of all grid points."""
    from gateway.bench.simbench import fluid_bound
    from gateway.config.operations import TuningConfig
    from gateway.sim.tune import ALPHA_GRID, tune_alpha

    policy = get_policy(args.policy)
    if not policy.uses_alpha:
        raise UsageError(f"--policy: {policy.name} does not use alpha")
    setup = setup_from_args(args)
    rate = args.rate
    if rate is None:
        rate = round(0.6 * fluid_bound(setup.workers, setup.queries, prefix_caching=setup.prefix_caching), 4)
    window = setup.workflows(rate)[: TuningConfig().window_workflows if args.window is None else args.window]
    t0 = time.perf_counter()
    res = tune_alpha(
        setup.workers,
        policy.name,
        window,
        grid=ALPHA_GRID if not args.grid else tuple(args.grid),
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
        points = [{"alpha": p.alpha, **p.summary.as_dict()} for p in res.points]
        doc = {"alpha": res.alpha, "rate_qps": rate, "window_workflows": len(window), "seconds": wall, "points": points}
        write_json(args.json, doc, say=False, allow_nan=True, default=as_null)
    return 0


def _bench_tuner_opts() -> tuple[Opt, ...]:
    from gateway.bench.tuner import LOAD, TRACES, WINDOWS

    return (
        opt("--traces", str, ",".join(TRACES), "comma-separated trace names or files"),
        opt("--trace-dir", str, None, "where trace names are looked up (default ../shared/data/...)"),
        CLUSTER,
        POLICY("the policy whose alpha is tuned"),
        SLO_SCALE(default=3.0),
        opt("--load", str, str(LOAD), "rate as a fraction of the policy's capacity (default alpha)"),
        opt("--windows", str, ",".join(map(str, WINDOWS)), "window sizes (workflows), comma-separated"),
        opt("--every", str, None, "re-tune every this many finished workflows (default: the gateway's)"),
        opt("--warmup", str, str(WARMUP), "workflows before the measured ones"),
        opt("--measured", str, str(MEASURED), "workflows measured per run"),
        opt("--seeds", str, "1", "arrival sequences per trace (seeds 0..n-1 from --seed)"),
        SEED("first seed of the arrival sequences"),
        JOBS,
        QUIET,
        JSON,
    )


BENCH_TUNER = Command(
    "tuner",
    cmd_bench_tuner,
    "the alpha tuner as the live gateway runs it, against the best fixed alpha in hindsight",
    "Per trace: the best fixed alpha in hindsight over a long run near capacity, the tuner run as live (trailing "
    "window of N workflows, re-tuned every K) for several window sizes, and the wall time of one re-tune. Missing "
    "traces fall back to the built-in chess-bird workload.",
    _bench_tuner_opts,
)
TUNE = Command(
    "tune",
    cmd_tune,
    "tune alpha on a window of traffic by simulation",
    "Replay a window of workflows in the simulator once per alpha of a grid (what the gateway's background tuner "
    "does with its recent traffic) and print each alpha's P50, P95 and SLO attainment, and the alpha chosen.",
    (
        *workload_opts(400),
        POLICY("the policy whose alpha is tuned"),
        RATE,
        opt(
            "--window",
            positive_int,
            None,
            "workflows in the window: the first N of the run (default: the gateway's tuning.window_workflows)",
        ),
        opt("--grid", fractions, None, "alphas in [0, 1] to try, comma-separated (default 0, 0.1, ..., 1)"),
        flag("--no-smooth", "pick the raw minimum P95, not the neighbourhood mean"),
    ),
)
