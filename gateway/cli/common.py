"""What several command groups share: the usage error and the simulator commands' workload arguments (the
``type=`` validators are ``gateway.argtypes``'s, so a bad value stops at parse time with exit status 2)."""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from gateway.argtypes import nonneg_int, positive_float, positive_int
from gateway.core.policy import get_policy
from gateway.core.scheduler import WorkerInfo
from gateway.core.workflow import CallSpec

if TYPE_CHECKING:
    from gateway.bench.simbench import Setup
    from gateway.sim.workload import TenantSpec


BENCH_WORKFLOWS = 1000
"""Workflows per simulated ``bench`` run (default)."""

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The ``add_subparsers`` result each command module registers its commands on."""


class UsageError(Exception):
    """Bad command-line input detected after parsing."""


def load_workers(cluster: str) -> list[WorkerInfo]:
    """The workers of a cluster file (name or path)."""
    from gateway.config import load_cluster

    return load_cluster(cluster)


def policy_names(text: str) -> list[str]:
    """The policies of a comma-separated list, each checked (an unknown one raises ``GatewayError``)."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise UsageError("--policies: give at least one policy")
    for n in names:
        get_policy(n)
    return names


def add_cluster_arg(p: argparse.ArgumentParser, help: str = "cluster file or name under config/clusters") -> None:
    """``--cluster`` (default paper-4gpu) with ``help``."""
    p.add_argument("--cluster", default="paper-4gpu", help=help)


def add_emulation_args(p: argparse.ArgumentParser) -> None:
    """``--cluster`` and ``--time-scale`` of the commands that start an emulated cluster for the demo."""
    add_cluster_arg(p, "cluster file or name to emulate")
    p.add_argument("--time-scale", type=positive_float, default=0.25, help="emulated GPUs run this much of real time")


def add_output_args(
    p: argparse.ArgumentParser, json: str | None = None, quiet: str | None = None, *, required: bool = False
) -> None:
    """``--json PATH`` (when ``json``, its help) then ``--quiet`` (when ``quiet``, its help); ``required`` makes
    ``--json`` required."""
    if json is not None:
        p.add_argument("--json", required=required, help=json)
    if quiet is not None:
        p.add_argument("--quiet", action="store_true", help=quiet)


def show(text: str, json_path: str | None, doc: Callable[[], Any]) -> None:
    """Print a report's ``text``; with ``json_path``, write ``doc()`` there (``write_json``)."""
    print(text)
    if json_path:
        write_json(json_path, doc())


def add_prefix_caching_arg(p: argparse.ArgumentParser) -> None:
    """``--no-prefix-caching`` (``args.prefix_caching`` False)."""
    p.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="engines without prefix caching (vLLM caches prompt prefixes by default; so does the simulator)",
    )


def add_workload_args(
    p: argparse.ArgumentParser, *, workflows: int, cluster: bool = True, slo_help: str | None = None
) -> None:
    """The workload arguments of simulate, bench, tune and plan. ``cluster`` False leaves out ``--cluster``;
    ``slo_help`` replaces the help of ``--slo-scale``."""
    p.add_argument(
        "--trace",
        default="chess-bird",
        help="trace file, trace name (looked up in ../shared/data/hexgen-traces next to the repository, or in "
        "$HEXFLOW_TRACE_DIR), or chess-bird (built in)",
    )
    if cluster:
        add_cluster_arg(p)
    p.add_argument(
        "--slo-scale",
        type=positive_float,
        default=5.0,
        help=slo_help or "SLO = this x the cluster-mean single-request latency of the standard workflow",
    )
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the workload and arrivals")
    p.add_argument("--workflows", type=positive_int, default=workflows, help="workflows per run (a trace is cycled)")
    p.add_argument(
        "--cv", type=positive_float, default=1.0, help="coefficient of variation of inter-arrivals (1: Poisson)"
    )
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
    add_prefix_caching_arg(p)
    p.add_argument(
        "--hedge",
        action="store_true",
        help="hedge a straggling critical-path call on a free worker, first answer wins (off by default: it did "
        "not raise capacity; docs/benchmarks.md)",
    )
    add_output_args(p, "write results as JSON here")


def int_arg(name: str, text: str, *, minimum: int) -> int:
    """``text`` as an integer >= ``minimum``, else a ``UsageError`` naming the option ``name``."""
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{name}: expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise UsageError(f"{name}: expected an integer >= {minimum}, got {text!r}")
    return value


def positive_float_arg(name: str, text: str) -> float:
    """``text`` as a finite positive number, else a ``UsageError`` naming the option ``name``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{name}: expected a positive number, got {text!r}")
    return value


def workload_queries(trace: str, n: int, seed: int) -> tuple[str, list[list[CallSpec]]]:
    """(workload name, queries) of ``--trace``: the built-in generator makes exactly ``n`` queries (from
    ``seed``); a trace file is replayed as recorded (runs cycle it to their number of workflows)."""
    from gateway.sim.workload import CHESS_BIRD, load_queries, resolve_trace

    src = resolve_trace(trace)
    name = CHESS_BIRD if src == CHESS_BIRD else Path(src).stem
    queries = load_queries(trace, n if src == CHESS_BIRD else None, random.Random(seed))
    return name, queries


def write_json(path: str, doc: Any) -> None:
    """Write a report's JSON document to ``path`` (parents created; strict JSON: no NaN) and say so."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    print(f"wrote {path}")


def setup_from_args(args: argparse.Namespace, n_seeds: int = 1) -> Setup:
    """The benchmark scenario ``add_workload_args``' options describe (``n_seeds`` seeds from ``--seed``)."""
    from gateway.bench.simbench import Setup
    from gateway.sim.simulator import HedgeSettings

    workers = load_workers(args.cluster)
    name, queries = workload_queries(args.trace, args.workflows, args.seed)
    tenants = tenants_arg(args.tenants)
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
        n_seeds=n_seeds,
        prefix_caching=args.prefix_caching,
        hedge=HedgeSettings() if getattr(args, "hedge", False) else None,
    )


def tenants_arg(text: str | None) -> list[TenantSpec] | None:
    """``--tenants`` (``add_workload_args``) parsed; None when not given."""
    from gateway.sim.workload import parse_tenants

    if not text:
        return None
    try:
        return parse_tenants(text)
    except ValueError as exc:
        raise UsageError(f"--tenants: {exc}") from None
