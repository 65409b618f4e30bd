"""The command line's help formatter and the ``type=`` validators of numeric and list options, shared by
``hexflow`` (``gateway.cli``) and the emulated workers' own parsers (``workers.emulator``, ``workers.cluster``).

A module of its own, importing nothing but the standard library, so that an emulated worker does not load
the whole command line (``gateway.cli`` imports every command group) to parse its arguments. Each
validator raises ``argparse.ArgumentTypeError``: argparse prints its message after "argument --name:",
below the subcommand's usage, and exits with status 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

__all__ = [
    "HelpFormatter",
    "fraction",
    "fractions",
    "nonneg_float",
    "nonneg_int",
    "port",
    "port_or_zero",
    "positive_float",
    "positive_floats",
    "positive_int",
    "positive_ints",
    "unit_open_fraction",
]

_T = TypeVar("_T")


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
