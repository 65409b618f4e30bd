"""``hexflow``: the command line.

    hexflow simulate   one policy, one run on the simulator
    hexflow bench      policies side by side: latency, SLO attainment, capacity, fluid bound
    hexflow tune       the alpha tuner on a window of traffic
    hexflow bench tuner   the background alpha tuner, run as live, against the best fixed alpha in hindsight
    hexflow sim-speed  the simulator's own speed: simulated calls/s per cluster and policy
    hexflow plan       the cheapest mix of workers from the GPU catalogue that meets an SLO at a rate (simulated)
    hexflow emulate    an emulated vLLM worker (a test double for a GPU; see workers/emulator.py)
    hexflow emulate-cluster   every worker of a cluster file as emulated workers in one process
    hexflow serve      the live gateway
    hexflow replay     send a trace's workflows to a running gateway in real time and measure
    hexflow bench --live   policies on the live gateway over an emulated cluster, next to the simulator
    hexflow bench overload   admission under 5x overload bursts on an emulated cluster: met, goodput, RSS
    hexflow bench admission  deadline-aware admission in the simulator: capacity and goodput per share, 0.8-5x load
    hexflow overhead   the gateway's added latency and CPU per call, against calling a worker directly
    hexflow calibrate  measure a live worker and fit its gpus.yaml profile (bounded, safe in production)
    hexflow bench fidelity   calibrate emulated workers of unknown speed, then live replay vs the simulator
    hexflow bench quality    accuracy of the Text-to-SQL pipeline per knob setting (gateway/config/quality.yaml)
    hexflow bench burst      goodput of correct answers under recorded bursty arrivals, with and without degradation
    hexflow bench mislabel   a worker labelled with another GPU's profile, corrected by the online refit (simulated)
    hexflow tenants hash-key [KEY]   the SHA-256 hash that config/tenants.yaml stores for an API key (no KEY:
                                     typed without echo, or read from standard input)
    hexflow demo       the main job: demo questions through /v1/text2sql on an emulated cluster
    hexflow eval       execution accuracy of a running gateway on a Spider-format dataset (/v1/text2sql)
    hexflow databases  the databases file (for hexflow serve) of a Spider-format dataset or of the demo database
    hexflow answers    scripted answers of a Spider-format dataset or of the demo questions (emulate --answers)

Bad input (a malformed trace, an unknown GPU or policy, an invalid cluster file) stops the command
with one line naming the command, the file and the field, and exit status 2; never a traceback. A bad
number or list stops at parse time, with the command's usage (the ``type=`` validators of
``gateway.argtypes``).

Each command group registers its own subparsers in its own module (``sim``: simulate, bench, tune, sim-speed;
``tuner``: bench tuner; ``plan``: plan; ``serve``: serve, emulate, emulate-cluster, discover; ``measure``:
replay, overhead; ``calibrate``: calibrate, bench fidelity, bench mislabel; ``text2sql``: demo, eval,
databases, answers, bench quality; ``burst``: bench burst; ``config``: config-reference, tenants); this module
orders them for the help, checks the arguments every command shares, and turns a ``GatewayError`` or
``UsageError`` into one line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gateway import __version__
from gateway.cli import calibrate, config, measure, plan, serve, sim, text2sql, tuner
from gateway.cli.common import HelpFormatter, Subparsers, UsageError
from gateway.errors import DomainError, GatewayError

__all__ = ["DESCRIPTION", "EXIT_USAGE", "UsageError", "build_parser", "main"]

EXIT_USAGE = 2

_COMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    sim.add_simulate,
    sim.add_bench,
    tuner.add_tune,
    sim.add_sim_speed,
    plan.add_plan,
    serve.add_emulate,
    serve.add_emulate_cluster,
    serve.add_serve,
    measure.add_replay,
    measure.add_overhead,
    calibrate.add_calibrate,
    text2sql.add_demo,
    text2sql.add_eval,
    text2sql.add_databases,
    text2sql.add_answers,
    serve.add_discover,
    config.add_config_reference,
    config.add_tenants,
)
"""Every command's registration, in the order ``hexflow --help`` lists them."""


DESCRIPTION = """\
HexGen-Flow: a gateway that schedules agentic Text-to-SQL workflows on vLLM workers
with mixed GPUs so that each meets its tenant's deadline; its simulator, benchmarks
and emulated workers."""
EPILOG = "Run `hexflow COMMAND --help` for a command's options. Documentation: README.md and docs/."


def _walk(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser below it (``bench overload``, ...)."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                out += _walk(child)
    return out


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs).

    Every parser shows each option's default (``HelpFormatter``), and remembers its ``prog``
    (``hexflow bench overload``) so that an error found after parsing names the subcommand.
    """
    parser = argparse.ArgumentParser(prog="hexflow", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"hexflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _COMMANDS:
        add(sub)
    for p in _walk(parser):
        p.formatter_class = HelpFormatter
        p.set_defaults(prog=p.prog)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hexflow`` console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] and args_list[0] in serve.HANDED_OVER:
        # The emulated workers have their own argument sets; hand over unchanged.
        return serve.HANDED_OVER[args_list[0]](args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)  # bad values stop here, with the subcommand's usage (common.py's types)
    prog = getattr(args, "prog", "hexflow")
    try:
        return int(args.func(args))
    except (GatewayError, DomainError, UsageError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
