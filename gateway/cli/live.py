"""The live gateway's commands: ``serve``, ``discover`` (what its Kubernetes discovery makes of the worker
pods), ``emulate`` and ``emulate-cluster`` (emulated vLLM workers; their arguments are the workers package's own
and are handed over unparsed), ``replay`` and ``overhead`` (measurements from outside), ``config-reference`` and
``tenants hash-key``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gateway.argtypes import port, positive_float, positive_floats, positive_int
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
    UsageError,
    flag,
    gateway_key,
    load_workers,
    opt,
    optional_path,
    pick,
    show,
    usage_errors,
)

__all__ = [
    "CONFIG_REFERENCE",
    "DISCOVER",
    "EMULATE",
    "EMULATE_CLUSTER",
    "HANDED_OVER",
    "OVERHEAD",
    "REPLAY",
    "SERVE",
    "TENANTS",
]


def _emulate(argv: Sequence[str]) -> int:
    from workers.emulator import main as emulate

    return emulate(argv, prog="hexflow emulate")


def _emulate_cluster(argv: Sequence[str]) -> int:
    from workers.cluster import main as emulate_cluster

    return emulate_cluster(argv, prog="hexflow emulate-cluster")


HANDED_OVER: dict[str, Callable[[Sequence[str]], int]] = {"emulate": _emulate, "emulate-cluster": _emulate_cluster}
"""Commands that parse their own arguments: ``hexflow NAME ARGS`` runs ``HANDED_OVER[NAME](ARGS)``."""
EMULATE = Command("emulate", None, "run an emulated vLLM worker (see `hexflow emulate --help`)", None)
EMULATE_CLUSTER = Command(
    "emulate-cluster",
    None,
    "run every worker of a cluster as emulated workers (see `hexflow emulate-cluster --help`)",
    None,
)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the gateway until SIGTERM/SIGINT (config errors are reported before anything starts)."""
    from gateway.live.server import serve

    names = ("host", "port", "log_level", "log_format", "time_scale", "demo", "benchmark")
    serve(args.config, **pick(args, *names))
    return 0


def cmd_discover(args: argparse.Namespace) -> int:
    """One list of the worker pods, each with the state discovery gives it (exit 1 when the API fails)."""
    import asyncio
    import json

    from gateway.config.gateway import load_gateway_config
    from gateway.live.discovery import KubeApiError, api_from_config, pod_state
    from gateway.live.httpclient import HttpError

    loaded = load_gateway_config(args.config)
    kube = loaded.cfg.discovery.kubernetes if loaded.cfg.discovery is not None else None
    if kube is None:
        raise UsageError(f"{args.config}: no discovery.kubernetes section")
    with usage_errors():
        api = api_from_config(kube)

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
                    "profile": got[1].profile.name if got is not None else None,
                    "capacity": got[1].capacity if got is not None else None,
                    "problem": problem or None,
                }
            )
        return rows

    try:
        rows = asyncio.run(list_once())
    except (KubeApiError, HttpError, OSError, TimeoutError, ValueError) as exc:
        print(f"hexflow: the Kubernetes API at {api.base_url} failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"namespace": api.namespace, "selector": kube.label_selector, "pods": rows}, indent=2))
        return 0
    print(f"{len(rows)} pods match {kube.label_selector!r} in namespace {api.namespace}")
    for r in rows:
        named = "" if r["profile"] == f"{r['gpu']}/{r['model']}" else f"  profile {r['profile']}"
        what = r["problem"] or f"{r['url']}  {r['gpu']}/{r['model']}  capacity {r['capacity']}{named}"
        if r["state"] == "pending":
            what = "no IP yet"
        print(f"  {r['pod']:<32} {r['state']:<8} {what}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay a workload against a running gateway in real time; print and optionally save the report."""
    import asyncio

    from gateway.bench.replay import format_report, replay, replay_setup, replay_workload

    key = gateway_key(args)
    names = ("workflows", "seed", "slo_scale", "deadline_s")
    setup = replay_setup(args.trace, load_workers(args.cluster), **pick(args, *names), arrivals_csv=args.arrivals)
    report = asyncio.run(
        replay(
            replay_workload(setup, args.rate),
            gateway=args.gateway.rstrip("/"),
            api_key=key,
            trace=setup.trace,
            rate_qps=args.rate,
            progress=not args.quiet,
            **pick(args, "time_scale", "timeout_s", "concurrency_limit"),
        )
    )
    return show(args, format_report(report), write=report.write_json)


def cmd_overhead(args: argparse.Namespace) -> int:
    """Measure the gateway's added latency and CPU per call against calling a worker directly."""
    from gateway.bench.overhead import format_report, run_overhead, write_json

    names = ("max_rate_search", "p99_limit_ms", "search_steps", "endpoint", "worker", "rates")
    progress = None if args.quiet else lambda msg: print(f"... {msg}", file=sys.stderr, flush=True)
    rep = run_overhead(args.rate, args.duration, **pick(args, *names), progress=progress)
    print(format_report(rep))
    if args.json:
        write_json(rep, Path(args.json))
    return 0


def cmd_config_reference(args: argparse.Namespace) -> int:
    """Print the configuration reference generated from the pydantic models."""
    from gateway.config.reference import reference

    sys.stdout.write(reference())
    return 0


def cmd_hash_key(args: argparse.Namespace) -> int:
    """Print the hash of an API key for ``api_key_sha256`` in tenants.yaml: the argument, else (none, or ``-``)
    the key typed twice without echo on a terminal, or the first line of standard input."""
    from gateway.config.tenants import hash_key

    key = args.key if args.key not in (None, "-") else _secret_key()
    if not key:
        raise UsageError("the key is empty")
    print(hash_key(key))
    return 0


def _secret_key() -> str:
    """The key, kept out of the shell's history: asked for twice without echo on a terminal (``UsageError`` when
    the two differ), else the first line of standard input. Surrounding whitespace is dropped, as the gateway
    drops it from an ``Authorization`` header."""
    import getpass

    if not sys.stdin.isatty():
        return sys.stdin.readline().strip()
    key = getpass.getpass("API key (not echoed): ").strip()
    if key and getpass.getpass("the same key again: ").strip() != key:
        raise UsageError("the two keys typed differ; nothing printed")
    return key


CONFIG = opt("--config", str, "config/gateway.yaml", "gateway.yaml (workers, policy, limits, tenants)")
SERVE = Command(
    "serve",
    cmd_serve,
    "run the live gateway (FastAPI) in front of vLLM workers",
    "Run the live gateway in front of the workers of --config (its cluster, or the pods its Kubernetes discovery "
    "selects) on listen.host:listen.port, with the tenants of its tenants_file (re-read on change). SIGTERM or "
    "SIGINT drains in-flight workflows for shutdown_grace_s, then exits 0. A bad config or a port in use stops it "
    "before it serves, with one line and exit status 2.",
    (
        CONFIG,
        opt("--host", str, None, "bind address (default: the config's listen.host)"),
        opt("--port", port, None, "port (default: the config's listen.port)"),
        opt("--log-level", str, "info", "least severe log level", choices=["debug", "info", "warning", "error"]),
        opt(
            "--log-format",
            str,
            None,
            "log lines as text or JSON (one object per line, with request_id and workflow_id) (default: "
            "$HEXFLOW_LOG_FORMAT, else the config's log_format, else text)",
            choices=["text", "json"],
        ),
        TIME_SCALE("override the config's time_scale (emulated workers' --time-scale)", default=None),
        flag(
            "--demo",
            "serve the demo database (demo_retail, written to a temporary folder) on /v1/text2sql, in place of the "
            "config's databases_file; pair with hexflow emulate-cluster --demo",
        ),
        flag(
            "--benchmark",
            "benchmark mode whatever the config says: /v1/workflows takes synthetic prompts of exact sizes "
            "(prompt_tokens, shared_prefix, ignore_eos; what hexflow replay sends) and ablation policies run",
        ),
    ),
)
DISCOVER = Command(
    "discover",
    cmd_discover,
    "list the worker pods the gateway's Kubernetes discovery selects, and what it makes of each",
    "Ask the Kubernetes API for the pods that --config's discovery.kubernetes section selects, and print each pod's "
    "state as the gateway would see it (its URL, GPU, model, profile and capacity, or the problem that keeps it "
    "out); exit 1 when the API fails.",
    (
        CONFIG("gateway.yaml with a discovery.kubernetes section"),
        flag("--json", "print JSON instead of a table"),
    ),
)
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
        opt("--arrivals", optional_path, None, "replay the arrival pattern of a CSV, rescaled to --rate"),
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
CONFIG_REFERENCE = Command(
    "config-reference",
    cmd_config_reference,
    "print the configuration reference (docs/configuration.md)",
    "Print the reference of every configuration key (gateway.yaml, tenants.yaml, databases, cluster files, "
    "gpus.yaml), generated from the models that validate them: docs/configuration.md is this output.",
)
HASH_KEY = Command(
    "hash-key",
    cmd_hash_key,
    "print the SHA-256 hash of an API key (what tenants.yaml stores)",
    "Print the SHA-256 digest of an API key: what a tenant's api_key_sha256 (tenants.yaml) and "
    "admin.api_key_sha256 (gateway.yaml) hold. To keep the key out of the shell's history, leave it out (or give "
    "-): it is asked for twice without echo on a terminal, else read from the first line of standard input "
    "(hexflow tenants hash-key < key.txt).",
    (
        opt(
            "key",
            str,
            None,
            "the API key; leave it out, or give -, to type it without echo or pipe it on standard input",
            nargs="?",
        ),
    ),
)
TENANTS = Command(
    "tenants",
    None,
    "tenant helpers (hash an API key for config/tenants.yaml)",
    "Helpers for the tenants file (config/tenants.yaml), which stores API keys only as hashes.",
    subs=(HASH_KEY,),
)
