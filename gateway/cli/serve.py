"""Serving: ``serve`` (the live gateway), ``emulate`` and ``emulate-cluster`` (emulated vLLM workers, test
doubles for GPUs; their arguments are the workers package's own and are handed over unparsed), and
``discover`` (what the gateway's Kubernetes discovery makes of the worker pods)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gateway.argtypes import port
from gateway.cli.common import TIME_SCALE, Command, UsageError, flag, opt

__all__ = ["DISCOVER", "EMULATE", "EMULATE_CLUSTER", "HANDED_OVER", "SERVE"]


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
