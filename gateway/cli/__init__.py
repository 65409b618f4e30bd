"""``hexflow``: the command line.

    hexflow simulate   one policy, one run on the simulator
    hexflow bench      policies side by side: latency, SLO attainment, capacity, fluid bound
    hexflow tune       the alpha tuner on a window of traffic
    hexflow emulate    an emulated vLLM worker (a test double for a GPU; see workers/emulator.py)
    hexflow emulate-cluster   every worker of a cluster file as emulated workers in one process
    hexflow serve      the live gateway
    hexflow replay     send a trace's workflows to a running gateway in real time and measure
    hexflow bench --live   policies on the live gateway over an emulated cluster, next to the simulator
    hexflow overhead   the gateway's added latency and CPU per call, against calling a worker directly
    hexflow tenants hash-key KEY   the SHA-256 hash that config/tenants.yaml stores for an API key
    hexflow demo       the main job: demo questions through /v1/text2sql on an emulated cluster
    hexflow eval       execution accuracy of a running gateway on a Spider-format dataset (/v1/text2sql)
    hexflow databases  the databases file (for hexflow serve) of a Spider-format dataset or of the demo database
    hexflow answers    scripted answers of a Spider-format dataset or of the demo questions (emulate --answers)

Bad input (a malformed trace, an unknown GPU or policy, an invalid cluster file) stops the command
with one line naming the file and field, and exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.core.policy import POLICIES, get_policy
from gateway.core.scheduler import WorkerInfo
from gateway.core.workflow import CallSpec
from gateway.errors import GatewayError

if TYPE_CHECKING:
    from gateway.bench.simbench import BenchReport, Setup

EXIT_USAGE = 2
BENCH_WORKFLOWS = 1000
"""Workflows per simulated ``bench`` run (default)."""
LIVE_BENCH_WORKFLOWS = 150
"""Workflows per policy of ``bench --live`` (default): each is replayed in real time."""


class UsageError(Exception):
    """Bad command-line input detected after parsing."""


def _fmt(x: float, digits: int = 1) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.{digits}f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def _workers(cluster: str) -> list[WorkerInfo]:
    from gateway.config import load_cluster

    return load_cluster(cluster)


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

    workers = _workers(args.cluster)
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


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise UsageError("--policies: give at least one policy")
    for n in names:
        get_policy(n)
    return names


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
                _fmt(s.p50_s),
                _fmt(s.p95_s),
                _fmt(s.p99_s),
                f"{s.slo_attainment:.3f}",
                _fmt(s.throughput_qps, 4),
            ]
        )
    print(
        f"{setup.trace} on {args.cluster} [{', '.join(w.profile.gpu for w in setup.workers)}], policy {args.policy}"
        f", rate {rate:g} qps (fluid bound {bound:.4f}), SLO {setup.slo_s:.1f} s"
    )
    print(_table(["tenant", "workflows", "p50_s", "p95_s", "p99_s", "slo", "tput_qps"], rows))
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

    policies = _policies(args.policies)
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
        print(_table(["policy", "capacity_qps", "of_bound", "vs_rr-fcfs", "alpha"], rows))
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
                _fmt(s.p50_s),
                _fmt(s.p95_s),
                _fmt(s.p99_s),
                f"{s.slo_attainment:.3f}",
                f"{base.p95_s / s.p95_s:.2f}x" if base and s.p95_s > 0 and math.isfinite(base.p95_s) else "-",
            ]
        )
    print(title)
    print(_table(["policy", "p50_s", "p95_s", "p99_s", "slo", "p95_gain_vs_rr"], rows))


def cmd_bench_live(args: argparse.Namespace) -> int:
    """``bench --live``: each policy on the live gateway over an emulated cluster, and its simulation."""
    from gateway.bench.livebench import format_live_report, plot_live_report, run_live_bench

    policies = _policies(args.policies)
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


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay a workload against a running gateway in real time; print and optionally save the report."""
    import asyncio

    from gateway.bench.replay import format_report, replay, replay_setup, replay_workload

    try:
        rate = float(args.rate)
    except ValueError:
        rate = math.nan
    if not (rate > 0 and math.isfinite(rate)):
        raise UsageError(f"--rate: expected a positive number of workflows per modelled second, got {args.rate!r}")
    if not (args.time_scale > 0 and math.isfinite(args.time_scale)):
        raise UsageError(f"--time-scale: must be a positive number, got {args.time_scale:g}")
    if args.deadline_s is not None and not (args.deadline_s > 0 and math.isfinite(args.deadline_s)):
        raise UsageError(f"--deadline-s: must be a positive number of modelled seconds, got {args.deadline_s:g}")
    if args.concurrency_limit is not None and args.concurrency_limit < 1:
        raise UsageError("--concurrency-limit: must be >= 1")
    if args.timeout_s is not None and not args.timeout_s > 0:
        raise UsageError("--timeout-s: must be positive")
    key = args.api_key or os.environ.get("HEXFLOW_API_KEY", "")
    if not key.strip():
        raise UsageError("--api-key: give the tenant's API key (or set HEXFLOW_API_KEY)")
    if not args.gateway.startswith(("http://", "https://")):
        raise UsageError(f"--gateway: expected a URL like http://127.0.0.1:8080, got {args.gateway!r}")
    setup = replay_setup(
        args.trace,
        _workers(args.cluster),
        workflows=args.workflows,
        seed=args.seed,
        slo_scale=args.slo_scale,
        deadline_s=args.deadline_s,
        arrivals_csv=Path(args.arrivals) if args.arrivals else None,
    )
    workload = replay_workload(setup, rate)
    report = asyncio.run(
        replay(
            workload,
            gateway=args.gateway.rstrip("/"),
            api_key=key.strip(),
            time_scale=args.time_scale,
            trace=setup.trace,
            rate_qps=rate,
            timeout_s=args.timeout_s,
            concurrency_limit=args.concurrency_limit,
            progress=not args.quiet,
        )
    )
    print(format_report(report))
    if args.json:
        report.write_json(Path(args.json))
        print(f"wrote {args.json}")
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
            _fmt(p.summary.p50_s),
            _fmt(p.summary.p95_s),
            f"{p.summary.slo_attainment:.3f}",
            "<-" if p.alpha == res.alpha else "",
        ]
        for p in res.points
    ]
    print(f"window: {len(window)} workflows over {args.window_s:g} s at {rate:g} qps on {args.cluster}")
    print(_table(["alpha", "p50_s", "p95_s", "slo", "chosen"], rows))
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


def _common(p: argparse.ArgumentParser, *, workflows: int) -> None:
    p.add_argument(
        "--trace",
        default="chess-bird",
        help="trace file, trace name under ../shared/data/hexgen-traces, or chess-bird (built in)",
    )
    p.add_argument("--cluster", default="paper-4gpu", help="cluster file or name under config/clusters")
    p.add_argument(
        "--slo-scale",
        type=float,
        default=5.0,
        help="SLO = this x the cluster-mean single-request latency of the standard workflow",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workflows", type=int, default=workflows, help="workflows per run (a trace is cycled)")
    p.add_argument("--cv", type=float, default=1.0, help="coefficient of variation of inter-arrivals (1: Poisson)")
    p.add_argument(
        "--tenants",
        default=None,
        help="tenant mix, e.g. gold:share=0.3:slo_scale=0.6,chat:kind=chat:share=0.2:deadline_s=20",
    )
    p.add_argument(
        "--arrivals",
        default=None,
        help="replay the arrival pattern of a CSV with a timestamp column (Azure LLM trace format), rescaled to --rate",
    )
    p.add_argument("--json", default=None, help="write results as JSON here")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(prog="hexflow", description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    names = ", ".join(POLICIES)

    p = sub.add_parser("simulate", help="one policy, one run on the simulator")
    _common(p, workflows=400)
    p.add_argument("--policy", default="hexgen", help=f"one of: {names}")
    p.add_argument("--rate", type=float, default=None, help="arrival rate, workflows/s (default 0.6 x fluid bound)")
    p.add_argument("--alpha", type=float, default=None, help="WB alpha (default: the policy's)")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("bench", help="policies side by side: P50/P95/P99, SLO attainment, capacity")
    _common(p, workflows=1000)
    p.add_argument(
        "--policies",
        default="hexgen,wb-fcfs,rr-pq,rr-fcfs,p2c-fcfs,lw-fcfs,llf,edf,vtc",
        help=f"comma-separated, from: {names}",
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

    p = sub.add_parser("tune", help="tune alpha on a window of traffic by simulation")
    _common(p, workflows=400)
    p.add_argument("--policy", default="hexgen")
    p.add_argument("--rate", type=float, default=None, help="arrival rate, workflows/s (default 0.6 x fluid bound)")
    p.add_argument("--window-s", type=float, default=300.0, help="length of the traffic window (seconds)")
    p.add_argument("--grid", default=None, help="alphas to try, comma-separated (default 0, 0.1, ..., 1)")
    p.add_argument("--no-smooth", action="store_true", help="pick the raw minimum P95, not the neighbourhood mean")
    p.set_defaults(func=cmd_tune)
    sub.add_parser("emulate", help="run an emulated vLLM worker (see `hexflow emulate --help`)", add_help=False)
    sub.add_parser(
        "emulate-cluster",
        help="run every worker of a cluster as emulated workers (see `hexflow emulate-cluster --help`)",
        add_help=False,
    )

    p = sub.add_parser("serve", help="run the live gateway (FastAPI) in front of vLLM workers")
    p.add_argument("--config", default="config/gateway.yaml", help="gateway.yaml (workers, policy, limits, tenants)")
    p.add_argument("--host", default=None, help="bind address (default: the config's listen.host)")
    p.add_argument("--port", type=int, default=None, help="port (default: the config's listen.port)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="override the config's time_scale (emulated workers' --time-scale)",
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("replay", help="send a workload to a running gateway in real time and measure it")
    p.add_argument(
        "--trace",
        default="chess-bird",
        help="trace file, trace name under ../shared/data/hexgen-traces, or chess-bird (built in)",
    )
    p.add_argument("--rate", required=True, help="arrival rate, workflows per modelled second")
    p.add_argument("--gateway", default="http://127.0.0.1:8080", help="the gateway's base URL")
    p.add_argument("--api-key", default=None, help="the tenant's API key (default: $HEXFLOW_API_KEY)")
    p.add_argument("--workflows", type=int, default=100, help="workflows to send (a trace is cycled)")
    p.add_argument("--seed", type=int, default=0, help="seed of queries and arrivals (as in hexflow bench)")
    p.add_argument("--deadline-s", type=float, default=None, help="deadline of every workflow, modelled seconds")
    p.add_argument(
        "--slo-scale",
        type=float,
        default=5.0,
        help="without --deadline-s: deadline = this x the cluster-mean latency of the standard workflow",
    )
    p.add_argument("--cluster", default="paper-4gpu", help="cluster file or name: sets the SLO with --slo-scale")
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="the gateway's time_scale (emulated workers): wall seconds per modelled second",
    )
    p.add_argument("--arrivals", default=None, help="replay the arrival pattern of a CSV, rescaled to --rate")
    p.add_argument("--concurrency-limit", type=int, default=None, help="most workflows in flight (client side)")
    p.add_argument("--timeout-s", type=float, default=None, help="per-request timeout, wall seconds")
    p.add_argument("--json", default=None, help="write the report (with every workflow) as JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser(
        "overhead",
        help="gateway overhead: the same call to a worker directly and through the gateway, side by side",
    )
    p.add_argument("--rate", type=float, default=200.0, help="calls/s of each stream (gateway and direct)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of measurement")
    p.add_argument("--max-rate-search", action="store_true", help="also find the highest rate the gateway sustains")
    p.add_argument("--p99-limit-ms", type=float, default=20.0, help="P99 bound of a sustained rate")
    p.add_argument("--json", default=None, help="write the report as JSON here")
    p.set_defaults(func=cmd_overhead)

    p = sub.add_parser(
        "demo",
        help="the main job: emulated cluster + gateway, demo questions from two tenants through /v1/text2sql",
    )
    p.add_argument("--questions", type=int, default=24, help="questions to ask (cycled over the demo set)")
    p.add_argument("--cluster", default="paper-4gpu", help="cluster file or name to emulate")
    p.add_argument("--time-scale", type=float, default=0.25, help="emulated GPUs run this much of real time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write every answer and the summary as JSON here")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.set_defaults(func=cmd_demo)

    _add_eval_parsers(sub)

    p = sub.add_parser(
        "discover",
        help="list the worker pods the gateway's Kubernetes discovery selects, and what it makes of each",
    )
    p.add_argument("--config", default="config/gateway.yaml", help="gateway.yaml with a discovery.kubernetes section")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_discover)

    p = sub.add_parser("config-reference", help="print the configuration reference (docs/configuration.md)")
    p.set_defaults(func=cmd_config_reference)

    p = sub.add_parser("tenants", help="tenant helpers (hash an API key for config/tenants.yaml)")
    tsub = p.add_subparsers(dest="tenants_command", required=True)
    q = tsub.add_parser("hash-key", help="print the SHA-256 hash of an API key (what tenants.yaml stores)")
    q.add_argument("key", help="the API key (use '-' to read it from stdin, keeping it out of shell history)")
    q.set_defaults(func=cmd_hash_key)
    return parser


def cmd_overhead(args: argparse.Namespace) -> int:
    """Measure the gateway's added latency and CPU per call against calling a worker directly."""
    from pathlib import Path

    from gateway.bench.overhead import format_report, run_overhead, write_json

    if not args.rate > 0 or not args.duration > 0 or not args.p99_limit_ms > 0:
        raise UsageError("--rate, --duration and --p99-limit-ms must be positive")
    rep = run_overhead(args.rate, args.duration, max_rate_search=args.max_rate_search, p99_limit_ms=args.p99_limit_ms)
    print(format_report(rep))
    if args.json:
        write_json(rep, Path(args.json))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the Text-to-SQL demo end to end on emulated workers."""
    from pathlib import Path

    from gateway.bench.demo import format_summary, run_demo

    if args.questions < 1:
        raise UsageError("--questions must be at least 1")
    if not args.time_scale > 0:
        raise UsageError("--time-scale must be positive")
    rep = run_demo(args.questions, cluster=args.cluster, time_scale=args.time_scale, seed=args.seed, quiet=args.quiet)
    print()
    print(format_summary(rep))
    total = len(rep.answers)
    correct = sum(a.correct for a in rep.answers)
    print(f"{correct}/{total} answers match the gold result; {rep.wall_s:.0f} s wall")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rep.as_dict(), indent=2, default=str))
    return 0


def _add_eval_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``eval``, ``databases`` and ``answers``: a Spider-format dataset end to end (``gateway.bench.text2sql_eval``).

    Numbers are parsed by the commands, not by argparse, so bad values stop with one line (exit 2).
    """
    p = sub.add_parser("eval", help="execution accuracy of a running gateway on a Spider-format dataset")
    p.add_argument("--dataset", default=None, help="folder with dev.json and database/<db_id>/<db_id>.sqlite")
    p.add_argument("--gateway", default="http://127.0.0.1:8080", help="the gateway's base URL")
    p.add_argument("--api-key", default=None, help="the tenant's API key (default: $HEXFLOW_API_KEY)")
    p.add_argument("--limit", default=None, help="only the first N questions of dev.json")
    p.add_argument("--concurrency", default="8", help="questions in flight at once")
    p.add_argument("--deadline-s", default=None, help="deadline of every question (default: the tenant's)")
    p.add_argument("--timeout-s", default="600", help="per-request timeout, wall seconds")
    p.add_argument("--json", default=None, help="write the report (with every question) as JSON here (required)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser(
        "databases",
        help="write the databases file (for hexflow serve) of a Spider-format dataset or of the demo database",
    )
    p.add_argument("--spider", default=None, help="dataset folder with database/<db_id>/<db_id>.sqlite")
    p.add_argument(
        "--demo",
        action="store_true",
        help="instead of --spider: the demo database (demo_retail.sqlite, as hexflow demo writes it) next to --out",
    )
    p.add_argument("--out", default=None, help="the databases YAML to write")
    p.add_argument("--statement-timeout-s", default="5", help="per-query time limit of each database")
    p.add_argument("--max-rows", default=None, help="row cap of each result (default 1000; raise it for evaluation)")
    p.add_argument("--seed", default=None, help="--demo only: seed of the demo data (default 0, as hexflow demo)")
    p.set_defaults(func=cmd_databases)

    p = sub.add_parser(
        "answers",
        help="write scripted answers (hexflow emulate --answers) of a Spider-format dataset or of the demo questions",
    )
    p.add_argument("--spider", default=None, help="dataset folder with dev.json")
    p.add_argument(
        "--demo", action="store_true", help="instead of --spider: the demo questions (those hexflow demo asks)"
    )
    p.add_argument("--out", default=None, help="the answers JSON to write")
    p.add_argument("--wrong-fraction", default="0.25", help="share of questions with a wrong first candidate")
    p.add_argument("--seed", default="0", help="which questions get a wrong candidate (--demo: also the data's seed)")
    p.add_argument("--limit", default=None, help="--spider only: the first N questions of dev.json")
    p.set_defaults(func=cmd_answers)


def _int_arg(name: str, text: str, *, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{name}: expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise UsageError(f"{name}: expected an integer >= {minimum}, got {text!r}")
    return value


def _positive_float_arg(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{name}: expected a positive number, got {text!r}")
    return value


def _dataset_dir(name: str, text: str | None, *, needs_dev_json: bool) -> Path:
    if not text:
        raise UsageError(f"{name}: give the dataset folder")
    path = Path(text)
    if not path.is_dir():
        raise UsageError(f"{name}: {text} is not a folder")
    if needs_dev_json and not (path / "dev.json").is_file():
        raise UsageError(f"{name}: {text} has no dev.json (expected a Spider-format dataset)")
    return path


def cmd_eval(args: argparse.Namespace) -> int:
    """Send a dataset's questions to a running gateway and report execution accuracy and latency."""
    import asyncio

    from gateway.bench.text2sql_eval import evaluate, format_report, spider_items

    dataset = _dataset_dir("--dataset", args.dataset, needs_dev_json=True)
    key = (args.api_key or os.environ.get("HEXFLOW_API_KEY", "")).strip()
    if not key:
        raise UsageError("--api-key: give the tenant's API key (or set HEXFLOW_API_KEY)")
    if not args.gateway.startswith(("http://", "https://")):
        raise UsageError(f"--gateway: expected a URL like http://127.0.0.1:8080, got {args.gateway!r}")
    limit = None if args.limit is None else _int_arg("--limit", args.limit, minimum=1)
    concurrency = _int_arg("--concurrency", args.concurrency, minimum=1)
    deadline = None if args.deadline_s is None else _positive_float_arg("--deadline-s", args.deadline_s)
    timeout = _positive_float_arg("--timeout-s", args.timeout_s)
    if not args.json:
        raise UsageError("--json: give the file to write the report to")
    items = spider_items(dataset, limit)
    if not items:
        raise UsageError(f"--dataset: no runnable question in {dataset} (no database file for any of them)")
    report = asyncio.run(
        evaluate(
            items,
            gateway=args.gateway,
            api_key=key,
            concurrency=concurrency,
            deadline_s=deadline,
            timeout_s=timeout,
            progress=not args.quiet,
        )
    )
    print(format_report(report))
    print(f"wrote {report.write_json(args.json)}")
    return 0


def _demo_or_spider(args: argparse.Namespace, what: str) -> bool:
    """True for ``--demo``, False for ``--spider``; a usage error unless exactly one of them is given."""
    if args.demo and args.spider is not None:
        raise UsageError("--demo and --spider exclude each other: give one of them")
    if not args.demo and args.spider is None:
        raise UsageError(f"give --spider DIR (a Spider-format dataset) or --demo ({what})")
    return bool(args.demo)


def cmd_databases(args: argparse.Namespace) -> int:
    """Write the databases file of a Spider-format dataset, or the demo database and its databases file."""
    import yaml

    from gateway.bench.text2sql_eval import write_databases_file
    from gateway.text2sql.demo import write_demo_databases

    demo = _demo_or_spider(args, "the project's demo database")
    dataset = None if demo else _dataset_dir("--spider", args.spider, needs_dev_json=False)
    timeout = _positive_float_arg("--statement-timeout-s", args.statement_timeout_s)
    if not args.out:
        raise UsageError("--out: give the databases file to write")
    max_rows = None
    if args.max_rows is not None:
        try:
            max_rows = int(args.max_rows)
        except ValueError:
            raise UsageError(f"--max-rows: not an integer: {args.max_rows!r}") from None
        if max_rows < 1:
            raise UsageError("--max-rows must be at least 1")
    if args.seed is not None and not demo:
        raise UsageError("--seed: only with --demo (a Spider dataset's databases are files, not generated)")
    seed = 0 if args.seed is None else _int_arg("--seed", args.seed, minimum=0)
    if dataset is None:
        try:
            out = write_demo_databases(args.out, seed, statement_timeout_s=timeout, max_rows=max_rows)
        except ValueError as exc:
            raise UsageError(f"--out: {exc}") from None
        print(f"wrote {out}: 1 database (demo_retail, {out.parent / 'demo_retail.sqlite'})")
        return 0
    out = write_databases_file(dataset, args.out, statement_timeout_s=timeout, max_rows=max_rows)
    n = len(yaml.safe_load(out.read_text(encoding="utf-8"))["databases"])
    print(f"wrote {out}: {n} databases")
    return 0


def cmd_answers(args: argparse.Namespace) -> int:
    """Write scripted answers (gold SQL, some wrong first candidates) of a Spider-format dataset or of the demo."""
    from gateway.text2sql.answers import answers_from_spider, build_demo_answers, write_answers

    demo = _demo_or_spider(args, "the demo questions")
    dataset = None if demo else _dataset_dir("--spider", args.spider, needs_dev_json=True)
    try:
        fraction = float(args.wrong_fraction)
    except ValueError:
        fraction = math.nan
    if not 0.0 <= fraction <= 1.0:
        raise UsageError(f"--wrong-fraction: expected a number in [0, 1], got {args.wrong_fraction!r}")
    seed = _int_arg("--seed", args.seed, minimum=0)
    if demo and args.limit is not None:
        raise UsageError("--limit: only with --spider (--demo writes every demo question)")
    limit = None if args.limit is None else _int_arg("--limit", args.limit, minimum=1)
    if not args.out:
        raise UsageError("--out: give the answers file to write")
    if dataset is None:
        answers = build_demo_answers(seed=seed, wrong_fraction=fraction)
    else:
        answers = answers_from_spider(dataset, wrong_fraction=fraction, seed=seed, limit=limit)
    out = write_answers(Path(args.out), answers)
    wrong = sum(1 for e in answers.values() if e.get("wrong"))
    print(f"wrote {out}: {len(answers)} questions, {wrong} with a wrong first candidate")
    return 0


def cmd_config_reference(args: argparse.Namespace) -> int:
    """Print the configuration reference generated from the pydantic models."""
    from gateway.config.reference import reference

    sys.stdout.write(reference())
    return 0


def cmd_hash_key(args: argparse.Namespace) -> int:
    """Print the hash of an API key for ``api_key_sha256`` in tenants.yaml."""
    from gateway.config.tenants import hash_key

    key = sys.stdin.readline().strip() if args.key == "-" else args.key
    if not key:
        raise UsageError("the key is empty")
    print(hash_key(key))
    return 0


def cmd_discover(args: argparse.Namespace) -> int:
    """One list of the worker pods, each with the state discovery gives it (exit 1 when the API fails)."""
    import asyncio
    import json

    import aiohttp

    from gateway.config.gateway import load_gateway_config
    from gateway.live.discovery import KubeApiError, api_from_config, pod_state

    loaded = load_gateway_config(args.config)
    kube = loaded.cfg.discovery.kubernetes if loaded.cfg.discovery is not None else None
    if kube is None:
        raise UsageError(f"{args.config}: no discovery.kubernetes section")
    try:
        api = api_from_config(kube)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    async def list_once() -> list[dict[str, object]]:
        try:
            pods, _ = await api.list_pods(kube.label_selector)
        finally:
            await api.close()
        rows: list[dict[str, object]] = []
        for pod in pods:
            state, got, problem = pod_state(pod, kube, loaded.catalog, loaded.default_model, loaded.cfg.time_scale)
            pw = got[0] if got is not None else None
            rows.append(
                {
                    "pod": (pod.get("metadata") or {}).get("name", "?"),
                    "state": state,
                    "url": pw.url if pw else None,
                    "gpu": pw.gpu if pw else None,
                    "model": pw.model if pw else None,
                    "capacity": pw.capacity if pw else None,
                    "problem": problem or None,
                }
            )
        return rows

    try:
        rows = asyncio.run(list_once())
    except (KubeApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
        print(f"hexflow: the Kubernetes API at {api.base_url} failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"namespace": api.namespace, "selector": kube.label_selector, "pods": rows}, indent=2))
        return 0
    print(f"{len(rows)} pods match {kube.label_selector!r} in namespace {api.namespace}")
    for r in rows:
        what = r["problem"] or f"{r['url']}  {r['gpu']}/{r['model']}  capacity {r['capacity']}"
        if r["state"] == "pending":
            what = "no IP yet"
        print(f"  {r['pod']:<32} {r['state']:<8} {what}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the gateway until SIGTERM/SIGINT (config errors are reported before anything starts)."""
    from gateway.live.server import serve

    serve(args.config, host=args.host, port=args.port, log_level=args.log_level, time_scale=args.time_scale)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hexflow`` console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["emulate"]:
        # The emulated vLLM worker has its own argument set; hand over unchanged.
        from workers.emulator import main as emulate

        return emulate(args_list[1:])
    if args_list[:1] == ["emulate-cluster"]:
        from workers.cluster import main as emulate_cluster

        return emulate_cluster(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    for name in ("workflows",):
        if getattr(args, name, 1) is not None and getattr(args, name, 1) < 1:
            parser.error(f"--{name} must be >= 1")
    if getattr(args, "slo_scale", 1.0) <= 0 or getattr(args, "cv", 1.0) <= 0:
        parser.error("--slo-scale and --cv must be positive")
    alpha = getattr(args, "alpha", None)
    if alpha is not None and not 0.0 <= alpha <= 1.0:
        parser.error("--alpha must be in [0, 1]")
    rate = getattr(args, "rate", None)
    if isinstance(rate, float) and not rate > 0:
        parser.error("--rate must be positive")
    try:
        return int(args.func(args))
    except (GatewayError, UsageError) as exc:
        print(f"hexflow: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("hexflow: interrupted", file=sys.stderr)
        return 130
