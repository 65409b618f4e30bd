"""What several command groups share: the usage error, the help formatter, the workload arguments of the
simulator's commands, and the ``type=`` validators of numeric and list options.

Every numeric or list option is parsed by one of the validators below (``positive_int``, ``port``,
``fraction``, ``positive_floats``, ...), so a bad value (``--rate 0.1,abc``, ``--port 99999``) stops at
parse time with the subcommand's usage, one line naming the option and what was expected, and exit
status 2; never a traceback, and never a value silently taken in another sense.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias, TypeVar

from gateway.core.policy import get_policy
from gateway.core.scheduler import WorkerInfo
from gateway.core.workflow import CallSpec

__all__ = [
    "HelpFormatter",
    "Subparsers",
    "UsageError",
    "add_workload_args",
    "fraction",
    "fractions",
    "int_arg",
    "load_workers",
    "nonneg_float",
    "nonneg_int",
    "policy_names",
    "port",
    "port_or_zero",
    "positive_float",
    "positive_float_arg",
    "positive_floats",
    "positive_int",
    "positive_ints",
    "unit_open_fraction",
    "workload_queries",
]

_T = TypeVar("_T")

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The ``add_subparsers`` result each command module registers its commands on."""


class UsageError(Exception):
    """Bad command-line input detected after parsing."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help starts with "(required)" for a required option and ends with its default, unless
    the default is None or False (a flag, or "not set") or the help already names it; descriptions keep
    their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.required and action.option_strings:
            return f"(required) {text}"
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


# ------------------------------------------------------------------------------------- ``type=`` validators
# argparse prints an ``ArgumentTypeError``'s message after "argument --name:", with the subcommand's usage.


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text.strip())
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def nonneg_int(text: str) -> int:
    """An integer >= 0."""
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port, 1-65535."""
    value = int(_number(text, int))
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port in 1-65535, got {text!r}")
    return value


def port_or_zero(text: str) -> int:
    """A TCP port, 1-65535, or 0 (any free port)."""
    value = int(_number(text, int))
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port in 1-65535 (or 0: any free port), got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def nonneg_float(text: str) -> float:
    """A finite number >= 0."""
    value = _number(text, float)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A number in [0, 1]."""
    value = _number(text, float)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def unit_open_fraction(text: str) -> float:
    """A number in (0, 1) (a relative tolerance)."""
    value = _number(text, float)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


def _list(text: str, item: Callable[[str], _T], what: str) -> list[_T]:
    parts = [x for x in (p.strip() for p in text.split(",")) if x]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected {what}, comma-separated, got {text!r}")
    out = []
    for x in parts:
        try:
            out.append(item(x))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected {what}, comma-separated; {x!r} is not one") from None
    return out


def positive_floats(text: str) -> list[float]:
    """Comma-separated positive numbers (``0.1,0.2``)."""
    return _list(text, positive_float, "positive numbers")


def fractions(text: str) -> list[float]:
    """Comma-separated numbers in [0, 1] (``0,0.5,1``)."""
    return _list(text, fraction, "numbers in [0, 1]")


def positive_ints(text: str) -> list[int]:
    """Comma-separated integers >= 1 (``100,300``)."""
    return _list(text, positive_int, "integers >= 1")


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


def add_workload_args(
    p: argparse.ArgumentParser, *, workflows: int, cluster: bool = True, slo_help: str | None = None
) -> None:
    """The workload arguments of simulate, bench, tune and plan: trace, cluster, SLO, seed, arrivals, tenants.

    ``cluster`` False leaves out ``--cluster`` (``plan`` chooses the workers); ``slo_help`` replaces the help
    of ``--slo-scale`` (what the SLO is a multiple of).
    """
    p.add_argument(
        "--trace",
        default="chess-bird",
        help="trace file, trace name (looked up in ../shared/data/hexgen-traces next to the repository, or in "
        "$HEXFLOW_TRACE_DIR), or chess-bird (built in)",
    )
    if cluster:
        p.add_argument("--cluster", default="paper-4gpu", help="cluster file or name under config/clusters")
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
    p.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="engines without prefix caching (vLLM caches prompt prefixes by default; so does the simulator)",
    )
    p.add_argument("--json", default=None, help="write results as JSON here")


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
