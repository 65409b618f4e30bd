"""The command line's help formatter and the ``type=`` validators of numeric and list options, shared by
``hexflow`` (``gateway.cli``) and the emulated workers' parsers (``workers.emulator``, ``workers.cluster``).

Standard library only, so that an emulated worker does not load the whole command line to parse its arguments.
Each validator raises ``argparse.ArgumentTypeError``: argparse prints it after "argument --name:" and exits 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Generic, TypeVar

_T = TypeVar("_T")
_N = TypeVar("_N", int, float)


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


@dataclass(frozen=True)
class _Range(Generic[_N]):
    """A finite ``kind`` number within ``[lo, hi]`` (``open_lo``, ``open_hi``: that bound excluded)."""

    kind: type[_N]
    what: str
    lo: float
    hi: float = math.inf
    _: KW_ONLY
    open_lo: bool = False
    open_hi: bool = False

    def __call__(self, text: str) -> _N:
        try:
            value = self.kind(text.strip())
        except ValueError:
            number = "an integer" if self.kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {number}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        above = value > self.lo if self.open_lo else value >= self.lo
        below = value < self.hi if self.open_hi else value <= self.hi
        if not (above and below):
            raise argparse.ArgumentTypeError(f"expected {self.what}, got {text!r}")
        return value


positive_int = _Range(int, "an integer >= 1", 1)
"""An integer >= 1."""
nonneg_int = _Range(int, "an integer >= 0", 0)
"""An integer >= 0."""
port = _Range(int, "a TCP port in 1-65535", 1, 65535)
"""A TCP port, 1-65535."""
port_or_zero = _Range(int, "a TCP port in 1-65535 (or 0: any free port)", 0, 65535)
"""A TCP port, 1-65535, or 0 (any free port)."""
positive_float = _Range(float, "a positive number", 0.0, open_lo=True)
"""A finite number > 0."""
nonneg_float = _Range(float, "a number >= 0", 0.0)
"""A finite number >= 0."""
fraction = _Range(float, "a number in [0, 1]", 0.0, 1.0)
"""A number in [0, 1]."""
unit_open_fraction = _Range(float, "a number in (0, 1)", 0.0, 1.0, open_lo=True, open_hi=True)
"""A number in (0, 1) (a relative tolerance)."""


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
