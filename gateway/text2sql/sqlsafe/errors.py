"""``SqlRejected`` and the reasons shared by both dialects' checks, in this package's own words."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from gateway.errors import BadRequest

T = TypeVar("T")
_FUNCTION_KINDS = "aggregate, string, date/time, math, conversion, conditional and window functions"

NOT_A_QUERY = "only read-only queries (SELECT, WITH, VALUES) may run; found {}"
"""The reason for a statement that is not a query (``{}``: its keyword)."""


class SqlRejected(BadRequest):
    """The SQL is not a single read-only query; ``reason``: what was found, in our words; ``detail``: the
    parser's own words when the text did not parse (never part of the message)."""

    def __init__(self, reason: str, *, detail: str | None = None) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(reason)


def function_refused(name: str, dialect: str, why: str = "") -> SqlRejected:
    """The refusal of a call of ``name`` (as written, e.g. ``public.pg_sleep``) in a ``dialect`` query."""
    reason = f"calling function {name}() is not allowed"
    reason += f": {why}" if why else f": not on the {dialect} allowlist ({_FUNCTION_KINDS})"
    return SqlRejected(reason)


def _one_line(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


def unparseable(dialect: str, exc: Exception, detail: str, near: object, line: object, col: object) -> SqlRejected:
    """Our reason for a text that does not parse (where the parser stopped, when known), ``detail`` apart."""
    reason = f"cannot parse SQL: not one valid {dialect} query"
    if isinstance(near, str) and near.strip():
        reason += f"; parsing stopped at {_one_line(near, 40)!r}"
    if isinstance(line, int) and isinstance(col, int):
        reason += f" (line {line}, column {col})"
    return SqlRejected(reason, detail=_one_line(detail, 200) or type(exc).__name__)


def one_statement(statements: Sequence[T], kind: Callable[[T], str]) -> T:
    """The only statement of ``statements``; ``SqlRejected`` for none or several (``kind`` names each)."""
    if not statements:
        raise SqlRejected("empty SQL: expected one read-only query (found only comments or semicolons)")
    if len(statements) > 1:
        kinds = ", ".join(kind(s) for s in statements[:4])
        raise SqlRejected(f"more than one statement ({len(statements)}: {kinds}); send exactly one query")
    return statements[0]
