"""Measurements of a live gateway from outside: ``replay`` (a trace's workflows sent to a running gateway in
real time) and ``overhead`` (the gateway's added latency and CPU per call, against calling a worker directly)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gateway.argtypes import nonneg_int, positive_float, positive_floats, positive_int
from gateway.cli.common import Subparsers, UsageError, add_cluster_arg, add_output_args, load_workers

__all__ = ["add_overhead", "add_replay"]


def add_replay(sub: Subparsers) -> None:
    """``hexflow replay``."""
    p = sub.add_parser(
        "replay",
        help="send a workload to a running gateway in real time and measure it",
        description="Send a workload's workflows (a trace, or the built-in chess-bird generator) to a running "
        "gateway's POST /v1/workflows at their arrival times, in real time scaled by --time-scale, as a tenant "
        "(--api-key), and report latency, SLO attainment and outcomes; --json keeps every workflow.",
    )
    p.add_argument(
        "--trace",
        default="chess-bird",
        help="trace file, trace name (looked up in ../shared/data/hexgen-traces next to the repository, or in "
        "$HEXFLOW_TRACE_DIR), or chess-bird (built in)",
    )
    p.add_argument("--rate", type=positive_float, required=True, help="arrival rate, workflows per modelled second")
    p.add_argument("--gateway", default="http://127.0.0.1:8080", help="the gateway's base URL")
    p.add_argument("--api-key", default=None, help="the tenant's API key (default: $HEXFLOW_API_KEY)")
    p.add_argument("--workflows", type=positive_int, default=100, help="workflows to send (a trace is cycled)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of queries and arrivals (as in hexflow bench)")
    p.add_argument(
        "--deadline-s", type=positive_float, default=None, help="deadline of every workflow, modelled seconds"
    )
    p.add_argument(
        "--slo-scale",
        type=positive_float,
        default=5.0,
        help="without --deadline-s: deadline = this x the cluster-mean latency of the standard workflow",
    )
    add_cluster_arg(p, "cluster file or name: sets the SLO with --slo-scale")
    p.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        help="the gateway's time_scale (emulated workers): wall seconds per modelled second",
    )
    p.add_argument("--arrivals", default=None, help="replay the arrival pattern of a CSV, rescaled to --rate")
    p.add_argument(
        "--concurrency-limit", type=positive_int, default=None, help="most workflows in flight (client side)"
    )
    p.add_argument("--timeout-s", type=positive_float, default=None, help="per-request timeout, wall seconds")
    add_output_args(p, "write the report (with every workflow) as JSON here", "no progress bar")
    p.set_defaults(func=cmd_replay)


def add_overhead(sub: Subparsers) -> None:
    """``hexflow overhead``."""
    p = sub.add_parser(
        "overhead",
        help="gateway overhead: the same call to a worker directly and through the gateway, side by side",
        description="Start a worker (a null worker or an emulated A100) and a gateway in front of it, send the same "
        "calls to both at --rate calls/s each for --duration seconds, and report the latency the gateway adds and "
        "its CPU time per call; --max-rate-search also finds the highest rate it sustains.",
    )
    p.add_argument("--rate", type=positive_float, default=200.0, help="calls/s of each stream (gateway and direct)")
    p.add_argument("--duration", type=positive_float, default=10.0, help="seconds of measurement")
    p.add_argument(
        "--max-rate-search",
        action="store_true",
        help="also find the highest rate the gateway sustains (bracket search from --rate, up or down)",
    )
    p.add_argument(
        "--search-steps", type=positive_int, default=10, help="most rates the --max-rate-search probes (default 10)"
    )
    p.add_argument(
        "--p99-limit-ms",
        type=positive_float,
        default=20.0,
        help="P99 bound of a sustained rate; a direct stream above it marks the added latency unreliable",
    )
    p.add_argument(
        "--rates",
        type=positive_floats,
        default=[],
        help="more rates to measure side by side after --rate, comma-separated (a table row each), e.g. 500,1000",
    )
    p.add_argument(
        "--endpoint", choices=("chat", "completions"), default="chat", help="the endpoint called (default chat)"
    )
    p.add_argument(
        "--worker",
        choices=("null", "emulator"),
        default="null",
        help="the worker: null (fixed answers, next to no CPU; default) or emulator (the emulated A100)",
    )
    add_output_args(p, "write the report as JSON here", "no progress lines")
    p.set_defaults(func=cmd_overhead)


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay a workload against a running gateway in real time; print and optionally save the report."""
    import asyncio

    from gateway.bench.replay import format_report, replay, replay_setup, replay_workload

    rate: float = args.rate
    key = args.api_key or os.environ.get("HEXFLOW_API_KEY", "")
    if not key.strip():
        raise UsageError("--api-key: give the tenant's API key (or set HEXFLOW_API_KEY)")
    if not args.gateway.startswith(("http://", "https://")):
        raise UsageError(f"--gateway: expected a URL like http://127.0.0.1:8080, got {args.gateway!r}")
    setup = replay_setup(
        args.trace,
        load_workers(args.cluster),
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


def cmd_overhead(args: argparse.Namespace) -> int:
    """Measure the gateway's added latency and CPU per call against calling a worker directly."""
    import sys

    from gateway.bench.overhead import format_report, run_overhead, write_json

    rep = run_overhead(
        args.rate,
        args.duration,
        max_rate_search=args.max_rate_search,
        p99_limit_ms=args.p99_limit_ms,
        search_steps=args.search_steps,
        endpoint=args.endpoint,
        worker=args.worker,
        rates=args.rates,
        progress=None if args.quiet else lambda msg: print(f"... {msg}", file=sys.stderr, flush=True),
    )
    print(format_report(rep))
    if args.json:
        write_json(rep, Path(args.json))
    return 0
