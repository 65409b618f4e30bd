"""Static check of model-written SQL before it reaches a database: one read-only query, built only from
what the allowlists hold, reading only the database's own tables (the rules: docs/text2sql.md, "SQL
safety"). ``check_sql`` returns the caller's own text minus trailing semicolons and comments, or raises
``SqlRejected``. Pure: no I/O. The first wall; the databases are read-only behind it."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.text2sql.sqlsafe.allowlist import is_dangerous_function
from gateway.text2sql.sqlsafe.errors import SqlRejected
from gateway.text2sql.sqlsafe.postgres import check_postgres
from gateway.text2sql.sqlsafe.sqlite import check_sqlite

__all__ = ["SqlRejected", "check_sql", "is_dangerous_function"]

_DIALECTS = {"sqlite": "sqlite", "postgres": "postgres", "postgresql": "postgres"}  # accepted name -> checked


def check_sql(sql: str, dialect: str, *, schemas: Sequence[str] | None = None) -> str:
    """Accept one read-only query in ``dialect`` reading only ``schemas`` (PostgreSQL; default ``public``; SQLite:
    ``main``); return the text to run, or raise ``SqlRejected`` (``ValueError`` for an unknown dialect)."""
    checked = _DIALECTS.get(dialect.lower())
    if checked is None:
        raise ValueError(f"unsupported SQL dialect {dialect!r}; supported: {', '.join(_DIALECTS)}")
    if not sql.strip():
        raise SqlRejected("empty SQL: expected one read-only query")
    try:
        if checked == "sqlite":
            return check_sqlite(sql)
        return check_postgres(sql, tuple(schemas) if schemas is not None else ("public",))
    except RecursionError:  # the parser's: a query nested too deeply to check is refused, never run
        raise SqlRejected("cannot parse SQL: the query is nested too deeply") from None
