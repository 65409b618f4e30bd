"""Measurements of a live gateway from outside: ``replay`` (a trace's workflows sent to a running gateway in
real time) and ``overhead`` (the gateway's added latency and CPU per call, against calling a worker directly)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gateway.argtypes import positive_float, positive_floats, positive_int
from gateway.cli.common import (
    API_KEY,
    CLUSTER,
    GATEWAY,
    JSON,
    QUIET,
    SEED,
    SLO_SCALE,
    TIME_SCALE,
    TRACE,
    WORKFLOWS,
    Command,
    flag,
    gateway_key,
    load_workers,
    opt,
    write_with,
)

__all__ = ["OVERHEAD", "REPLAY"]


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay a workload against a running gateway in real time; print and optionally save the report."""
    import asyncio

    from gateway.bench.replay import format_report, replay, replay_setup, replay_workload

    key = gateway_key(args)
    setup = replay_setup(
        args.trace,
        load_workers(args.cluster),
        workflows=args.workflows,
        seed=args.seed,
        slo_scale=args.slo_scale,
        deadline_s=args.deadline_s,
        arrivals_csv=Path(args.arrivals) if args.arrivals else None,
    )
    report = asyncio.run(
        replay(
            replay_workload(setup, args.rate),
            gateway=args.gateway.rstrip("/"),
            api_key=key,
            time_scale=args.time_scale,
            trace=setup.trace,
            rate_qps=args.rate,
            timeout_s=args.timeout_s,
            concurrency_limit=args.concurrency_limit,
            progress=not args.quiet,
        )
    )
    print(format_report(report))
    write_with(args.json, report.write_json)
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


REPLAY = Command(
    "replay",
    cmd_replay,
    "send a workload to a running gateway in real time and measure it",
    "Send a workload's workflows (a trace, or the built-in chess-bird generator) to a running gateway's POST "
    "/v1/workflows at their arrival times, in real time scaled by --time-scale, as a tenant (--api-key), and "
    "report latency, SLO attainment and outcomes; --json keeps every workflow.",
    (
        TRACE,
        opt("--rate", positive_float, None, "arrival rate, workflows per modelled second", required=True),
        GATEWAY,
        API_KEY,
        WORKFLOWS("workflows to send (a trace is cycled)", default=100),
        SEED,
        opt("--deadline-s", positive_float, None, "deadline of every workflow, modelled seconds"),
        SLO_SCALE("without --deadline-s: deadline = this x the cluster-mean latency of the standard workflow"),
        CLUSTER("cluster file or name: sets the SLO with --slo-scale"),
        TIME_SCALE("the gateway's time_scale (emulated workers): wall seconds per modelled second", default=1.0),
        opt("--arrivals", str, None, "replay the arrival pattern of a CSV, rescaled to --rate"),
        opt("--concurrency-limit", positive_int, None, "most workflows in flight (client side)"),
        opt("--timeout-s", positive_float, None, "per-request timeout, wall seconds"),
        JSON("write the report (with every workflow) as JSON here"),
        QUIET,
    ),
)
OVERHEAD = Command(
    "overhead",
    cmd_overhead,
    "gateway overhead: the same call to a worker directly and through the gateway, side by side",
    "Start a worker (a null worker or an emulated A100) and a gateway in front of it, send the same calls to both "
    "at --rate calls/s each for --duration seconds, and report the latency the gateway adds and its CPU time per "
    "call; --max-rate-search also finds the highest rate it sustains.",
    (
        opt("--rate", positive_float, 200.0, "calls/s of each stream (gateway and direct)"),
        opt("--duration", positive_float, 10.0, "seconds of measurement"),
        flag(
            "--max-rate-search",
            "also find the highest rate the gateway sustains (bracket search from --rate, up or down)",
        ),
        opt("--search-steps", positive_int, 10, "most rates the --max-rate-search probes"),
        opt(
            "--p99-limit-ms",
            positive_float,
            20.0,
            "P99 bound of a sustained rate; a direct stream above it marks the added latency unreliable",
        ),
        opt(
            "--rates",
            positive_floats,
            [],
            "more rates to measure side by side after --rate, comma-separated (a table row each), e.g. 500,1000",
        ),
        opt("--endpoint", str, "chat", "the endpoint called", choices=("chat", "completions")),
        opt(
            "--worker",
            str,
            "null",
            "the worker: null (fixed answers, next to no CPU) or emulator (the emulated A100)",
            choices=("null", "emulator"),
        ),
        JSON,
        QUIET("no progress lines"),
    ),
)
