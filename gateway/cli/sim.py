"""The simulator's commands: ``simulate`` (one policy, one run), ``bench`` (policies side by side, or with
``--live`` on the live gateway next to the simulator) and ``tune`` (the alpha tuner on a window of traffic)."""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.bench.stats import fmt, table
from gateway.cli.common import Subparsers, UsageError, add_workload_args, load_workers, policy_names
from gateway.core.policy import POLICIES, get_policy
from gateway.core.workflow import CallSpec

if TYPE_CHECKING:
    from gateway.bench.simbench import BenchReport, Setup

__all__ = ["BENCH_WORKFLOWS", "LIVE_BENCH_WORKFLOWS", "add_bench", "add_bench_overload", "add_simulate", "add_tune"]

BENCH_WORKFLOWS = 1000
"""Workflows per simulated ``bench`` run (default)."""
LIVE_BENCH_WORKFLOWS = 150
"""Workflows per policy of ``bench --live`` (default): each is replayed in real time."""


def add_simulate(sub: Subparsers) -> None:
    """``hexflow simulate``."""
    p = sub.add_parser("simulate", help="one policy, one run on the simulator")
    add_workload_args(p, workflows=400)
    p.add_argument("--policy", default="hexgen", help=f"one of: {', '.join(POLICIES)}")
    p.add_argument("--rate", type=float, default=None, help="arrival rate, workflows/s (default 0.6 x fluid bound)")
    p.add_argument("--alpha", type=float, default=None, help="WB alpha (default: the policy's)")
    p.set_defaults(func=cmd_simulate)


def add_bench(sub: Subparsers) -> None:
    """``hexflow bench`` (and ``bench --live``)."""
    p = sub.add_parser("bench", help="policies side by side: P50/P95/P99, SLO attainment, capacity")
    add_workload_args(p, workflows=1000)
    p.add_argument(
        "--policies",
        default="hexgen,wb-fcfs,rr-pq,rr-fcfs,p2c-fcfs,lw-fcfs,llf,edf,vtc",
        help=f"comma-separated, from: {', '.join(POLICIES)}",
    )
    p.add_argument("--rate", default=None, help="arrival rate(s), comma-separated (default: fractions of the bound)")
    p.add_argument("--alpha", type=float, default=None, help="fixed alpha (default: tuned per rate on another window)")
    p.add_argument("--plot", default=None, help="write a PNG of P95 and SLO attainment against rate")
    p.add_argument("--no-capacity", action="store_true", help="skip the capacity bisection")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="policies run in parallel")
    p.add_argument(
        "--live",
        action="store_true",
        help="run each policy on the live gateway over an emulated cluster and compare with the simulator "
        f"(default {LIVE_BENCH_WORKFLOWS} workflows, rate 0.55 x the fluid bound)",
    )
    p.add_argument("--time-scale", type=float, default=0.05, help="--live: real seconds per modelled second")
    p.add_argument(
        "--log-dir", default=None, help="--live: keep subprocess logs and configs here (default: a temporary folder)"
    )
    p.set_defaults(func=cmd_bench, workflows=None)
    add_bench_overload(p.add_subparsers(dest="bench_command", metavar="{overload}", required=False))


def add_bench_overload(sub: Subparsers) -> None:
    """``hexflow bench overload``: admission under overload on emulated workers (``gateway.bench.overload``)."""
    p = sub.add_parser(
        "overload",
        help="admission under overload: capacity, then bursts at a multiple of it, on emulated workers",
        description="Capacity, then overload bursts, against a live gateway over an emulated cluster: accepted, "
        "rejected and shed workflows, the share of accepted that met the deadline, goodput, and the gateway's RSS.",
    )
    p.add_argument("--cluster", default="paper-4gpu", help="cluster file or name under config/clusters")
    p.add_argument("--time-scale", type=float, default=0.05, help="wall seconds per modelled second (emulated)")
    p.add_argument(
        "--capacity-fraction", type=float, default=0.75, help="the sustainable rate, as a fraction of the fluid bound"
    )
    p.add_argument("--factor", type=float, default=5.0, help="overload rate = this x the sustainable rate")
    p.add_argument("--capacity-s", type=float, default=40.0, help="wall seconds of arrivals at the sustainable rate")
    p.add_argument("--burst-s", type=float, default=30.0, help="wall seconds of each overload burst")
    p.add_argument("--quiet-s", type=float, default=15.0, help="wall seconds without arrivals between phases")
    p.add_argument("--bursts", type=int, default=3, help="overload bursts")
    p.add_argument("--slo-scale", type=float, default=5.0, help="deadline = this x the standard workflow's latency")
    p.add_argument(
        "--no-predictive", action="store_true", help="turn predictive admission off (concurrency limits only)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the workflows and arrivals")
    p.add_argument("--log-dir", default=None, help="keep subprocess logs and configs here")
    p.add_argument("--json", default=None, help="write the report as JSON here")
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
            seed=args.seed,
            log_dir=Path(args.log_dir) if args.log_dir else None,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(format_report(rep))
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rep.to_json(), indent=2, allow_nan=False) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        plot_report(rep, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0 if all(rep.checks().values()) else 1


def add_tune(sub: Subparsers) -> None:
    """``hexflow tune``."""
    p = sub.add_parser("tune", help="tune alpha on a window of traffic by simulation")
    add_workload_args(p, workflows=400)
    p.add_argument("--policy", default="hexgen")
    p.add_argument("--rate", type=float, default=None, help="arrival rate, workflows/s (default 0.6 x fluid bound)")
    p.add_argument("--window-s", type=float, default=300.0, help="length of the traffic window (seconds)")
    p.add_argument("--grid", default=None, help="alphas to try, comma-separated (default 0, 0.1, ..., 1)")
    p.add_argument("--no-smooth", action="store_true", help="pick the raw minimum P95, not the neighbourhood mean")
    p.set_defaults(func=cmd_tune)


def _queries(trace: str, n: int, seed: int) -> tuple[str, list[list[CallSpec]]]:
    from gateway.sim.workload import CHESS_BIRD, load_queries, resolve_trace

    src = resolve_trace(trace)
    name = CHESS_BIRD if src == CHESS_BIRD else Path(src).stem
    # The generator makes exactly n queries; a trace is replayed as recorded and cycled to n.
    queries = load_queries(trace, n if src == CHESS_BIRD else None, random.Random(seed))
    return name, queries


def _setup(args: argparse.Namespace) -> Setup:
    from gateway.bench.simbench import Setup
    from gateway.sim.workload import parse_tenants

    workers = load_workers(args.cluster)
    name, queries = _queries(args.trace, args.workflows, args.seed)
    tenants = None
    if args.tenants:
        try:
            tenants = parse_tenants(args.tenants)
        except ValueError as exc:
            raise UsageError(f"--tenants: {exc}") from None
    return Setup(
        workers=workers,
        queries=queries,
        trace=name,
        n_workflows=args.workflows,
        slo_scale=args.slo_scale,
        seed=args.seed,
        cv=args.cv,
        tenants=tenants,
        arrivals_csv=Path(args.arrivals) if args.arrivals else None,
    )


def cmd_simulate(args: argparse.Namespace) -> int:
    """One policy, one run: headline figures, per tenant when there are several."""
    from gateway.bench.simbench import fluid_bound
    from gateway.sim.metrics import summarize
    from gateway.sim.simulator import Simulator

    get_policy(args.policy)
    setup = _setup(args)
    bound = fluid_bound(setup.workers, setup.queries)
    rate = args.rate if args.rate is not None else round(0.6 * bound, 4)
    wfs = setup.workflows(rate)
    t0 = time.perf_counter()
    res = Simulator(setup.workers, args.policy, alpha=args.alpha, seed=args.seed).run(wfs)
    wall = time.perf_counter() - t0
    tenants = sorted({w.tenant for w in wfs})
    rows = []
    summaries = {}
    for t in [None, *tenants] if len(tenants) > 1 else [None]:
        s = summarize(res, total=sum(1 for w in wfs if t is None or w.tenant == t), tenant=t)
        summaries[t or "all"] = s.as_dict()
        rows.append(
            [
                t or "all",
                str(s.workflows),
                fmt(s.p50_s),
                fmt(s.p95_s),
                fmt(s.p99_s),
                f"{s.slo_attainment:.3f}",
                fmt(s.throughput_qps, 4),
            ]
        )
    print(
        f"{setup.trace} on {args.cluster} [{', '.join(w.profile.gpu for w in setup.workers)}], policy {args.policy}"
        f", rate {rate:g} qps (fluid bound {bound:.4f}), SLO {setup.slo_s:.1f} s"
    )
    print(table(["tenant", "workflows", "p50_s", "p95_s", "p99_s", "slo", "tput_qps"], rows))
    print(f"simulated {res.num_calls} calls in {wall:.2f} s wall ({res.num_calls / max(wall, 1e-9):,.0f} calls/s)")
    if args.json:
        out = {
            "policy": args.policy,
            "trace": setup.trace,
            "cluster": args.cluster,
            "rate_qps": rate,
            "alpha": args.alpha,
            "slo_s": setup.slo_s,
            "fluid_bound_qps": bound,
            "summary": summaries,
            "calls_per_s": res.num_calls / max(wall, 1e-9),
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2, default=lambda x: None) + "\n")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Policies side by side; JSON with ``results``, ``capacity_qps`` and ``fluid_bound_qps``."""
    if args.live:
        return cmd_bench_live(args)
    if args.workflows is None:
        args.workflows = BENCH_WORKFLOWS
    from tqdm import tqdm

    from gateway.bench.simbench import plot_report, run_bench

    policies = policy_names(args.policies)
    setup = _setup(args)
    rates = [float(r) for r in args.rate.split(",")] if args.rate else None
    if rates is not None and any(not r > 0 for r in rates):
        raise UsageError("--rate: rates must be positive")
    with tqdm(
        total=2 * len(policies),
        desc="bench",
        unit="phase",
        disable=args.quiet or None,
        leave=False,
    ) as bar:
        report = run_bench(
            setup,
            policies,
            rates=rates,
            fixed_alpha=args.alpha,
            find_capacity=not args.no_capacity,
            jobs=args.jobs,
            progress=bar.update,
        )
    bound = report.fluid_bound_qps
    print(
        f"{report.trace} on {args.cluster} [{', '.join(report.cluster)}], SLO {report.slo_scale:g}x = "
        f"{report.slo_s:.1f} s, {setup.n_workflows} workflows per run, seed {setup.seed}"
    )
    print(f"fluid bound: {bound:.4f} workflows/s")
    if report.capacity_qps:
        ref = report.capacity_qps.get("rr-fcfs")
        best_base = max((v for k, v in report.capacity_qps.items() if k != "hexgen"), default=0.0)
        rows = []
        for p in policies:
            cap = report.capacity_qps[p]
            rows.append(
                [
                    p,
                    f"{cap:.4f}",
                    f"{cap / bound:.1%}" if bound else "-",
                    f"{cap / ref:.2f}x" if ref else "-",
                    "-" if report.alphas.get(p) is None else f"{report.alphas[p]:.1f}",
                ]
            )
        print(table(["policy", "capacity_qps", "of_bound", "vs_rr-fcfs", "alpha"], rows))
        if "hexgen" in report.capacity_qps and best_base > 0:
            print(f"hexgen capacity vs best baseline: {report.capacity_qps['hexgen'] / best_base:.2f}x")
    ref_rate = report.reference_rate_qps
    if ref_rate:
        _print_rate_table(report, policies, ref_rate, f"at rr-fcfs's capacity rate {ref_rate:.4f} qps:")
    for rate in rates or []:  # the rates asked for with --rate, each in a table of its own
        _print_rate_table(report, policies, rate, f"at {rate:.4f} qps:")
    if args.json:
        report.write_json(Path(args.json))
        print(f"wrote {args.json}")
    if args.plot:
        plot_report(report, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


def _print_rate_table(report: BenchReport, policies: Sequence[str], rate: float, title: str) -> None:
    """Latency and SLO attainment of every policy at one rate, with the P95 gain over rr-fcfs when measured."""
    at = {p.policy: p.summary for p in report.results if abs(p.rate_qps - rate) < 1e-12}
    base = at.get("rr-fcfs")
    rows = []
    for p in policies:
        s = at[p]
        rows.append(
            [
                p,
                fmt(s.p50_s),
                fmt(s.p95_s),
                fmt(s.p99_s),
                f"{s.slo_attainment:.3f}",
                f"{base.p95_s / s.p95_s:.2f}x" if base and s.p95_s > 0 and math.isfinite(base.p95_s) else "-",
            ]
        )
    print(title)
    print(table(["policy", "p50_s", "p95_s", "p99_s", "slo", "p95_gain_vs_rr"], rows))


def cmd_bench_live(args: argparse.Namespace) -> int:
    """``bench --live``: each policy on the live gateway over an emulated cluster, and its simulation."""
    from gateway.bench.livebench import format_live_report, plot_live_report, run_live_bench

    policies = policy_names(args.policies)
    if args.tenants:
        raise UsageError("--tenants: not supported with --live (the replay uses one tenant)")
    rate: float | None = None
    if args.rate:
        try:
            rate = float(args.rate)
        except ValueError:
            raise UsageError(f"--rate: with --live give one rate in workflows/s, got {args.rate!r}") from None
        if not (rate > 0 and math.isfinite(rate)):
            raise UsageError("--rate: must be a positive number")
    if not (args.time_scale > 0 and math.isfinite(args.time_scale)):
        raise UsageError("--time-scale: must be a positive number")
    report = run_live_bench(
        args.cluster,
        args.trace,
        policies,
        time_scale=args.time_scale,
        workflows=args.workflows if args.workflows is not None else LIVE_BENCH_WORKFLOWS,
        rate_qps=rate,
        slo_scale=args.slo_scale,
        seed=args.seed,
        alpha=args.alpha,
        arrivals_csv=Path(args.arrivals) if args.arrivals else None,
        cv=args.cv,
        progress=not args.quiet,
        log_dir=Path(args.log_dir) if args.log_dir else None,
    )
    print(format_live_report(report))
    if args.json:
        report.write_json(Path(args.json))
        print(f"wrote {args.json}")
    if args.plot:
        plot_live_report(report, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Tune alpha on a window of traffic; print the table of all grid points."""
    from gateway.bench.simbench import fluid_bound
    from gateway.sim.tune import ALPHA_GRID, tune_alpha

    policy = get_policy(args.policy)
    if not policy.uses_alpha:
        raise UsageError(f"--policy: {policy.name} does not use alpha")
    setup = _setup(args)
    rate = args.rate if args.rate is not None else round(0.6 * fluid_bound(setup.workers, setup.queries), 4)
    wfs = setup.workflows(rate)
    window = [w for w in wfs if w.arrival <= args.window_s] or wfs[:1]
    grid = ALPHA_GRID if not args.grid else tuple(float(x) for x in args.grid.split(","))
    if any(not 0.0 <= a <= 1.0 for a in grid):
        raise UsageError("--grid: alphas must be in [0, 1]")
    t0 = time.perf_counter()
    res = tune_alpha(setup.workers, policy.name, window, grid=grid, seed=args.seed, smooth=not args.no_smooth)
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
    print(f"window: {len(window)} workflows over {args.window_s:g} s at {rate:g} qps on {args.cluster}")
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
