"""Static check of model-written SQL before it reaches a database: one read-only query, built only from
what the allowlists hold, reading only the database's own tables.

``check_sql(sql, dialect, schemas=...)`` accepts exactly one statement that is a query (``SELECT``,
``WITH ... SELECT``, ``UNION``/``INTERSECT``/``EXCEPT`` of queries, ``VALUES``) and returns the text to
run: the caller's own text minus trailing semicolons and comments, never SQL regenerated from a tree.
It rejects, with ``SqlRejected`` (a 400) naming what it found, in this package's own words:

* empty input, text the parser cannot parse, more than one statement;
* any statement that is not a query, and a write nested anywhere in one (data-modifying CTEs);
* ``SELECT ... INTO`` and locking reads (``FOR UPDATE``, ``FOR SHARE``, ...);
* a call of any function that is not on the dialect's allowlist (``allowlist.py``: aggregate, string,
  date/time, math, conversion, conditional and window functions), however it is written (quoted,
  schema-qualified, as SQL syntax that the parser turns into a call);
* PostgreSQL: casts to types off the list (``::regclass`` and other catalog lookups), operators off the
  list, ``CURRENT_USER``-like keywords, ``TABLESAMPLE``, XML/JSON constructors and any other construct
  that is not plain query syntax;
* relations outside the database: SQLite reads ``main`` only (no ``temp``, attached databases,
  ``sqlite_*`` tables, ``pragma_*`` or other table-valued functions); PostgreSQL reads ``schemas`` only
  (default ``public``: the database config's ``schema`` plus its ``allow_schemas``), so ``pg_catalog``,
  ``information_schema`` and other schemas are refused unless listed.

Parsers: PostgreSQL's own (``pglast``, libpg_query) for PostgreSQL, so what is checked is exactly what the
server parses; sqlglot for SQLite (``sqlite.py``). A text that does not parse is ``cannot parse SQL: not
one valid <dialect> query ...`` (the parser's own description apart, in ``SqlRejected.detail``).

This check is the first wall, not the only one: the databases themselves are opened read-only (SQLite
``mode=ro`` under an authorizer, PostgreSQL ``READ ONLY`` transactions as a least-privilege role). The
package is pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.text2sql.sqlsafe.allowlist import DANGEROUS_FUNCTIONS, function_allowed, is_dangerous_function
from gateway.text2sql.sqlsafe.errors import SqlRejected
from gateway.text2sql.sqlsafe.postgres import check_postgres
from gateway.text2sql.sqlsafe.sqlite import check_sqlite

__all__ = [
    "DANGEROUS_FUNCTIONS",
    "DEFAULT_POSTGRES_SCHEMAS",
    "SUPPORTED_DIALECTS",
    "SqlRejected",
    "check_sql",
    "function_allowed",
    "is_dangerous_function",
]

SUPPORTED_DIALECTS: dict[str, str] = {"sqlite": "sqlite", "postgres": "postgres", "postgresql": "postgres"}
"""Accepted dialect names -> the dialect checked."""

DEFAULT_POSTGRES_SCHEMAS: tuple[str, ...] = ("public",)
"""The schemas a PostgreSQL query may read when the caller names none."""


def check_sql(sql: str, dialect: str, *, schemas: Sequence[str] | None = None) -> str:
    """Accept one read-only query in ``dialect`` ("sqlite" or "postgres"); return the text to run.

    ``schemas``: the PostgreSQL schemas the query may read (default ``public``; list ``pg_catalog`` or
    ``information_schema`` to allow the catalogs); ignored for SQLite, which reads ``main`` only.
    Raises ``SqlRejected`` (a ``BadRequest``) with a one-line reason otherwise, and ``ValueError``
    for an unsupported ``dialect`` (a programming error, not a caller's).
    """
    checked = SUPPORTED_DIALECTS.get(dialect.lower())
    if checked is None:
        raise ValueError(f"unsupported SQL dialect {dialect!r}; supported: {', '.join(SUPPORTED_DIALECTS)}")
    if not sql.strip():
        raise SqlRejected("empty SQL: expected one read-only query")
    if checked == "sqlite":
        return check_sqlite(sql)
    return check_postgres(sql, tuple(schemas) if schemas is not None else DEFAULT_POSTGRES_SCHEMAS)
