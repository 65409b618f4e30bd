"""``hexflow``: the command line (``hexflow --help`` lists the commands).

Bad input stops the command with one line naming the command, the file and the field, and exit status 2,
never a traceback; a bad number or list stops at parse time (``gateway.argtypes``). Each command group
declares its commands (``common.Command``) in its own module; this one orders them for the help and turns a
``GatewayError`` or ``UsageError`` into one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gateway import __version__
from gateway.argtypes import HelpFormatter
from gateway.cli import calibrate, live, plan, sim, text2sql
from gateway.cli.common import Command, UsageError
from gateway.errors import DomainError, GatewayError

__all__ = ["DESCRIPTION", "EXIT_USAGE", "UsageError", "build_parser", "main"]

EXIT_USAGE = 2

_COMMANDS: tuple[Command, ...] = (
    sim.SIMULATE,
    sim.BENCH,
    sim.TUNE,
    sim.SIM_SPEED,
    plan.PLAN,
    live.EMULATE,
    live.EMULATE_CLUSTER,
    live.SERVE,
    live.REPLAY,
    live.OVERHEAD,
    calibrate.CALIBRATE,
    text2sql.DEMO,
    text2sql.EVAL,
    text2sql.DATABASES,
    text2sql.ANSWERS,
    live.DISCOVER,
    live.CONFIG_REFERENCE,
    live.TENANTS,
)
"""Every command, in the order ``hexflow --help`` lists them."""


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
    """The argument parser (for tests and docs): every option's default shown, each parser's ``prog`` kept
    so an error found after parsing names the subcommand."""
    parser = argparse.ArgumentParser(prog="hexflow", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"hexflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in _COMMANDS:
        command.add(sub)
    for p in _walk(parser):
        p.formatter_class = HelpFormatter
        p.set_defaults(prog=p.prog)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hexflow`` console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] and args_list[0] in live.HANDED_OVER:
        # The emulated workers have their own argument sets; hand over unchanged.
        return live.HANDED_OVER[args_list[0]](args_list[1:])
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
