"""Serving: ``serve`` (the live gateway), ``emulate`` and ``emulate-cluster`` (emulated vLLM workers, test
doubles for GPUs; their arguments are the workers package's own and are handed over unparsed), and
``discover`` (what the gateway's Kubernetes discovery makes of the worker pods)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gateway.argtypes import port, positive_float
from gateway.cli.common import Subparsers, UsageError

__all__ = ["HANDED_OVER", "add_discover", "add_emulate", "add_emulate_cluster", "add_serve"]


def _emulate(argv: Sequence[str]) -> int:
    from workers.emulator import main as emulate

    return emulate(argv, prog="hexflow emulate")


def _emulate_cluster(argv: Sequence[str]) -> int:
    from workers.cluster import main as emulate_cluster

    return emulate_cluster(argv, prog="hexflow emulate-cluster")


HANDED_OVER: dict[str, Callable[[Sequence[str]], int]] = {"emulate": _emulate, "emulate-cluster": _emulate_cluster}
"""Commands that parse their own arguments: ``hexflow NAME ARGS`` runs ``HANDED_OVER[NAME](ARGS)``."""


def add_emulate(sub: Subparsers) -> None:
    """``hexflow emulate`` (listed in the help only; ``main`` hands it over before parsing)."""
    sub.add_parser("emulate", help="run an emulated vLLM worker (see `hexflow emulate --help`)", add_help=False)


def add_emulate_cluster(sub: Subparsers) -> None:
    """``hexflow emulate-cluster`` (listed in the help only; ``main`` hands it over before parsing)."""
    sub.add_parser(
        "emulate-cluster",
        help="run every worker of a cluster as emulated workers (see `hexflow emulate-cluster --help`)",
        add_help=False,
    )


def add_serve(sub: Subparsers) -> None:
    """``hexflow serve``."""
    p = sub.add_parser(
        "serve",
        help="run the live gateway (FastAPI) in front of vLLM workers",
        description="Run the live gateway in front of the workers of --config (its cluster, or the pods its "
        "Kubernetes discovery selects) on listen.host:listen.port, with the tenants of its tenants_file (re-read on "
        "change). SIGTERM or SIGINT drains in-flight workflows for shutdown_grace_s, then exits 0. A bad config "
        "or a port in use stops it before it serves, with one line and exit status 2.",
    )
    p.add_argument("--config", default="config/gateway.yaml", help="gateway.yaml (workers, policy, limits, tenants)")
    p.add_argument("--host", default=None, help="bind address (default: the config's listen.host)")
    p.add_argument("--port", type=port, default=None, help="port (default: the config's listen.port)")
    p.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="least severe log level"
    )
    p.add_argument(
        "--log-format",
        default=None,
        choices=["text", "json"],
        help="log lines as text or JSON (one object per line, with request_id and workflow_id) "
        "(default: $HEXFLOW_LOG_FORMAT, else the config's log_format, else text)",
    )
    p.add_argument(
        "--time-scale",
        type=positive_float,
        default=None,
        help="override the config's time_scale (emulated workers' --time-scale)",
    )
    p.add_argument(
        "--demo",
        action="store_true",
        help="serve the demo database (demo_retail, written to a temporary folder) on /v1/text2sql, in place of "
        "the config's databases_file; pair with hexflow emulate-cluster --demo",
    )
    p.add_argument(
        "--benchmark",
        action="store_true",
        help="benchmark mode whatever the config says: /v1/workflows takes synthetic prompts of exact sizes "
        "(prompt_tokens, shared_prefix, ignore_eos; what hexflow replay sends) and ablation policies run",
    )
    p.set_defaults(func=cmd_serve)


def add_discover(sub: Subparsers) -> None:
    """``hexflow discover``."""
    p = sub.add_parser(
        "discover",
        help="list the worker pods the gateway's Kubernetes discovery selects, and what it makes of each",
        description="Ask the Kubernetes API for the pods that --config's discovery.kubernetes section selects, and "
        "print each pod's state as the gateway would see it (its URL, GPU, model, profile and capacity, or the "
        "problem that keeps it out); exit 1 when the API fails.",
    )
    p.add_argument("--config", default="config/gateway.yaml", help="gateway.yaml with a discovery.kubernetes section")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_discover)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the gateway until SIGTERM/SIGINT (config errors are reported before anything starts)."""
    from gateway.live.server import serve

    serve(
        args.config,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_format=args.log_format,
        time_scale=args.time_scale,
        demo=args.demo,
        benchmark=args.benchmark,
    )
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
                    "profile": got[1].profile.name if got is not None else None,
                    "capacity": got[1].capacity if got is not None else None,
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
        named = "" if r["profile"] == f"{r['gpu']}/{r['model']}" else f"  profile {r['profile']}"
        what = r["problem"] or f"{r['url']}  {r['gpu']}/{r['model']}  capacity {r['capacity']}{named}"
        if r["state"] == "pending":
            what = "no IP yet"
        print(f"  {r['pod']:<32} {r['state']:<8} {what}")
    return 0
