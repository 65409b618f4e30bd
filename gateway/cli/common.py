"""What the command groups share: the usage error, the option table (``Opt``, ``Command``: each option declared
once and picked by name) and the workload helpers. The ``type=`` validators are ``gateway.argtypes``'s, so a bad
value stops at parse time with exit status 2."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from gateway.argtypes import fraction, nonneg_int, positive_float, positive_int, unit_open_fraction
from gateway.bench.stats import save_json
from gateway.core.policy import POLICIES, get_policy
from gateway.core.scheduler import WorkerInfo

if TYPE_CHECKING:
    from gateway.bench.rig import LiveSettings
    from gateway.bench.simbench import Setup
    from gateway.sim.workload import TenantSpec


BENCH_WORKFLOWS = 1000
"""Workflows per simulated ``bench`` run (default)."""

_N = TypeVar("_N", int, float)

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The ``add_subparsers`` result commands are registered on."""

Handler: TypeAlias = Callable[[argparse.Namespace], int]
"""What a command runs with the parsed arguments; its result is the exit status."""


class UsageError(Exception):
    """Bad command-line input detected after parsing."""


@dataclass(frozen=True)
class Opt:
    """One option: its flag and ``add_argument``'s keywords. ``OPT(help, **changes)`` is a copy with another help
    (when given) and other keywords (``default=...``)."""

    flag: str
    kw: dict[str, Any]

    def __call__(self, help: str | None = None, **changes: Any) -> Opt:
        return Opt(self.flag, {**self.kw, **({"help": help} if help else {}), **changes})


def opt(flag: str, type: Callable[[str], Any], default: Any, help: str, **kw: Any) -> Opt:
    """An option taking a value (``type`` ``str``: kept as typed)."""
    return Opt(flag, {"default": default, "help": help, **kw, **({} if type is str else {"type": type})})


def flag(name: str, help: str) -> Opt:
    """A switch (``store_true``)."""
    return Opt(name, {"action": "store_true", "help": help})


def optional_path(text: str) -> Path | None:
    """A path option's ``type``: None for an empty value."""
    return Path(text) if text else None


@dataclass(frozen=True)
class Command:
    """A subcommand: ``hexflow NAME`` (or ``hexflow GROUP NAME``) runs ``func`` with its ``opts`` parsed; ``subs``
    are its own subcommands (required when there is no ``func``). ``opts`` may be a function, called when the
    parser is built (for defaults whose import is slow). No ``func`` and no ``subs``: a command handed over before
    parsing, listed in the help only."""

    name: str
    func: Handler | None
    help: str
    description: str | None
    opts: Sequence[Opt] | Callable[[], Sequence[Opt]] = ()
    subs: Sequence[Command] = ()

    def add(self, sub: Subparsers) -> None:
        """Register the command (and its subcommands) on ``sub``."""
        listed_only = self.func is None and not self.subs
        p = sub.add_parser(self.name, help=self.help, description=self.description, add_help=not listed_only)
        for o in self.opts() if callable(self.opts) else self.opts:
            p.add_argument(o.flag, **o.kw)
        if self.func is not None:
            p.set_defaults(func=self.func)
        if self.subs:
            group = p.add_subparsers(dest=f"{self.name}_command", required=self.func is None)
            for c in self.subs:
                c.add(group)


TRACE = opt(
    "--trace",
    str,
    "chess-bird",
    "trace file, trace name (looked up in ../shared/data/hexgen-traces next to the repository, or in "
    "$HEXFLOW_TRACE_DIR), or chess-bird (built in)",
)
CLUSTER = opt("--cluster", str, "paper-4gpu", "cluster file or name under config/clusters")
SLO_SCALE = opt("--slo-scale", positive_float, 5.0, "deadline = this x the standard workflow's latency")
SEED = opt("--seed", nonneg_int, 0, "seed of the workload and arrivals")
WORKFLOWS = opt("--workflows", positive_int, None, "workflows per run (a trace is cycled)")
POLICY = opt("--policy", str, "hexgen", f"one of: {', '.join(POLICIES)}")
POLICY_LIST = opt("--policies", str, "hexgen", "comma-separated policies")
ALPHA = opt("--alpha", fraction, None, "fixed alpha (default: tuned once per policy)")
SEEDS = opt("--seeds", positive_int, 3, "seeds per point")
REL_TOL = opt("--rel-tol", unit_open_fraction, 0.01, "relative precision of each capacity, in (0, 1)")
JOBS = opt("--jobs", positive_int, min(2, os.cpu_count() or 1), "runs in parallel processes")
TIME_SCALE = opt("--time-scale", positive_float, 0.05, "wall seconds per modelled second (emulated)")
LOG_DIR = opt("--log-dir", optional_path, None, "keep subprocess logs and configs here")
PLOT = opt("--plot", str, None, "write a PNG of the results")
JSON = opt("--json", str, None, "write the report as JSON here")
QUIET = flag("--quiet", "no progress bar")
WORKER = opt("--worker", str, None, "the worker's base URL (e.g. http://10.0.0.5:8000)", required=True)
MODEL = opt("--model", str, None, "the served model name (and the profile's model key)", required=True)
GATEWAY = opt("--gateway", str, "http://127.0.0.1:8080", "the gateway's base URL")
API_KEY = opt("--api-key", str, None, "the tenant's API key (default: $HEXFLOW_API_KEY)")
NO_PREFIX_CACHING = flag(
    "--no-prefix-caching",
    "engines without prefix caching (vLLM caches prompt prefixes by default; so does the simulator)",
)(dest="prefix_caching", action="store_false")


def workload_opts(workflows: int | None, *, slo: Opt | None = None, cluster: bool = True) -> tuple[Opt, ...]:
    """The workload options of simulate, bench, tune, sim-speed, plan and bench admission (``setup_from_args``
    reads them); ``slo`` replaces ``--slo-scale``, ``cluster`` False leaves out ``--cluster``."""
    return (
        TRACE,
        *([CLUSTER] if cluster else []),
        slo or SLO_SCALE("SLO = this x the cluster-mean single-request latency of the standard workflow"),
        SEED,
        WORKFLOWS(default=workflows),
        opt("--cv", positive_float, 1.0, "coefficient of variation of inter-arrivals (1: Poisson)"),
        opt(
            "--tenants",
            str,
            None,
            "tenant mix, e.g. gold:share=0.3:slo_scale=0.6,chat:kind=chat:share=0.2:deadline_s=20",
        ),
        opt(
            "--arrivals",
            optional_path,
            None,
            "replay the arrival pattern of a CSV with a timestamp column (Azure LLM trace format), rescaled to --rate",
        ),
        NO_PREFIX_CACHING,
        JSON("write results as JSON here"),
    )


def pick(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The options ``names`` as keywords, for a function whose parameters have the options' names."""
    return {name: getattr(args, name) for name in names}


def load_workers(cluster: str) -> list[WorkerInfo]:
    """The workers of a cluster file (name or path)."""
    from gateway.config import load_cluster

    return load_cluster(cluster)


def listed(name: str, text: str, what: str | None = None) -> list[str]:
    """The items of the comma-separated option ``name``, stripped; with ``what``, a ``UsageError`` ("NAME: give at
    least one WHAT") when there is none."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if what is not None and not items:
        raise UsageError(f"{name}: give at least one {what}")
    return items


def policy_names(text: str) -> list[str]:
    """The policies of a comma-separated list, each checked (an unknown one raises ``GatewayError``)."""
    names = listed("--policies", text, "policy")
    for n in names:
        get_policy(n)
    return names


def gateway_key(args: argparse.Namespace) -> str:
    """``--api-key`` (else ``$HEXFLOW_API_KEY``), stripped, after checking it and ``--gateway``."""
    key = (args.api_key or os.environ.get("HEXFLOW_API_KEY", "")).strip()
    if not key:
        raise UsageError("--api-key: give the tenant's API key (or set HEXFLOW_API_KEY)")
    if not args.gateway.startswith(("http://", "https://")):
        raise UsageError(f"--gateway: expected a URL like http://127.0.0.1:8080, got {args.gateway!r}")
    return key


@contextmanager
def usage_errors(prefix: str = "", *also: type[Exception]) -> Iterator[None]:
    """Turn a ``ValueError`` (or one of ``also``) raised inside into a ``UsageError`` (its message after ``prefix``)."""
    kinds: tuple[type[Exception], ...] = (ValueError, *also)
    try:
        yield
    except kinds as exc:
        raise UsageError(f"{prefix}{exc}") from None


def show(
    args: argparse.Namespace,
    text: str,
    doc: Callable[[], Any] | None = None,
    *,
    write: Callable[[Path], object] | None = None,
    plot: Callable[[Path], object] | None = None,
    ok: bool = True,
) -> int:
    """How a report ends: print its ``text``; with ``--json``, write ``doc()`` there (``write_json``), or have
    ``write`` write it; with ``--plot``, ``plot`` there. The exit status: 0 when ``ok``, else 1."""
    print(text)
    if write is not None:
        write_with(args.json, write)
    elif args.json and doc is not None:
        write_json(args.json, doc())
    if plot is not None:
        write_with(args.plot, plot)
    return 0 if ok else 1


def write_json(path: str, doc: Any, *, say: bool = True, end: str = "\n", **dumps: Any) -> None:
    """Write ``doc`` as JSON to ``path`` (parents created; by default indented by 2, strict: no NaN) and, with
    ``say``, print that it did."""
    save_json(path, doc, end=end, **dumps)
    if say:
        print(f"wrote {path}")


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` (parents created) and say so."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text, encoding="utf-8")
    print(f"wrote {path}")


def write_with(path: str | None, write: Callable[[Path], object]) -> None:
    """With ``path`` (``--json``, ``--plot``), ``write`` there and say so."""
    if path:
        write(Path(path))
        print(f"wrote {path}")


def number_arg(name: str, text: str, kind: Callable[[str], _N], what: str, ok: Callable[[_N], bool]) -> _N:
    """``text`` as a finite ``kind`` that is ``ok``, else a ``UsageError``: "NAME: expected WHAT, got 'TEXT'"."""
    try:
        value: _N | None = kind(text)
    except ValueError:
        value = None
    if value is None or (isinstance(value, float) and not math.isfinite(value)) or not ok(value):
        raise UsageError(f"{name}: expected {what}, got {text!r}")
    return value


def int_arg(name: str, text: str, *, minimum: int) -> int:
    """``text`` as an integer >= ``minimum``, else a ``UsageError`` naming the option ``name``."""
    return number_arg(name, text, int, f"an integer >= {minimum}", lambda v: v >= minimum)


def positive_float_arg(name: str, text: str) -> float:
    """``text`` as a finite positive number, else a ``UsageError`` naming the option ``name``."""
    return number_arg(name, text, float, "a positive number", lambda v: v > 0)


def live_settings(args: argparse.Namespace) -> LiveSettings:
    """A live benchmark's ``LiveSettings`` from those of its options the command has (``--cluster``,
    ``--time-scale``, ``--seed``, ``--log-dir``)."""
    from gateway.bench.rig import LiveSettings

    return LiveSettings(**pick(args, *(n for n in ("cluster", "time_scale", "seed", "log_dir") if hasattr(args, n))))


def setup_from_args(args: argparse.Namespace, n_seeds: int = 1) -> Setup:
    """The benchmark scenario ``workload_opts``' options describe (``n_seeds`` seeds from ``--seed``); without
    ``--cluster`` (``plan``'s workload, put on each mix), no workers."""
    from gateway.bench.simbench import Setup

    return Setup.of_trace(
        args.trace,
        load_workers(args.cluster) if hasattr(args, "cluster") else [],
        n_workflows=args.workflows,
        tenants=tenants_arg(args.tenants),
        arrivals_csv=args.arrivals,
        n_seeds=n_seeds,
        **pick(args, "slo_scale", "seed", "cv", "prefix_caching"),
    )


def tenants_arg(text: str | None) -> list[TenantSpec] | None:
    """``--tenants`` parsed; None when not given."""
    from gateway.sim.workload import parse_tenants

    if not text:
        return None
    with usage_errors("--tenants: "):
        return parse_tenants(text)
