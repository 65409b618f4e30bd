"""Static check of model-written SQL before it reaches a database: one read-only query, nothing else.

``check_sql(sql, dialect)`` parses the text with sqlglot and accepts exactly one statement that is a
query (``SELECT``, ``WITH ... SELECT``, ``UNION``/``INTERSECT``/``EXCEPT`` of queries, ``VALUES``).
It rejects, with ``SqlRejected`` naming what it found:

* empty input, text sqlglot cannot parse, more than one statement;
* any statement that is not a query (``INSERT``, ``UPDATE``, ``DELETE``, ``MERGE``, DDL, ``GRANT``,
  ``ATTACH``, ``PRAGMA``, ``VACUUM``, ``COPY``, ``SET``, ``CALL``, ``DO``, ``LOCK``, ...);
* a write nested anywhere in the query (a data-modifying CTE such as
  ``WITH x AS (DELETE FROM t RETURNING *) SELECT ...``);
* ``SELECT ... INTO`` and locking reads (``FOR UPDATE``, ``FOR SHARE``, ...);
* calls of functions that sleep, read or write files, load code, signal backends, take advisory
  locks or change settings (``DANGEROUS_FUNCTIONS``; checked for every dialect).

It returns the text to run: the caller's own text minus trailing semicolons and trailing comments,
never SQL regenerated from the syntax tree, so dialect details survive untouched.

Every reason is in this module's own words, whatever sqlglot's version says: a text that does not
parse is ``cannot parse SQL: not one valid <dialect> query ...`` (the parser's own description is kept
apart, in ``SqlRejected.detail``), and a statement that is not a query is ``only read-only queries
(SELECT, WITH, VALUES) may run; found <KEYWORD>``, the keyword read from the text itself when sqlglot
does not model the statement (so a statement sqlglot learns to parse keeps its wording).

This check is the first of two layers: the databases themselves are opened read-only (SQLite
``mode=ro``, PostgreSQL ``READ ONLY`` transactions), so a query the parser misreads still cannot
write. The module is pure: no I/O.
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import TokenType, exp
from sqlglot.errors import ParseError, TokenError

from gateway.errors import BadRequest

__all__ = ["DANGEROUS_FUNCTIONS", "SUPPORTED_DIALECTS", "SqlRejected", "check_sql", "is_dangerous_function"]

SUPPORTED_DIALECTS: dict[str, str] = {"sqlite": "sqlite", "postgres": "postgres", "postgresql": "postgres"}
"""Accepted dialect names -> the sqlglot dialect used to parse."""

_PREFIX_FUNCTIONS: tuple[str, ...] = ("pg_sleep", "dblink", "pg_advisory_", "pg_try_advisory_", "lo_")
_EXACT_FUNCTIONS: frozenset[str] = frozenset(
    {
        # PostgreSQL: files, server control, settings, sequences (writes)
        "pg_read_file",
        "pg_read_binary_file",
        "pg_ls_dir",
        "pg_stat_file",
        "pg_file_write",
        "pg_terminate_backend",
        "pg_cancel_backend",
        "pg_reload_conf",
        "pg_rotate_logfile",
        "pg_notify",
        "set_config",
        "nextval",
        "setval",
        # SQLite: extension loading and the shell's file functions
        "load_extension",
        "readfile",
        "writefile",
        "fts3_tokenizer",
        "edit",
    }
)

DANGEROUS_FUNCTIONS: tuple[str, ...] = tuple(sorted(_EXACT_FUNCTIONS)) + tuple(f"{p}*" for p in _PREFIX_FUNCTIONS)
"""Function names (lower case; ``*`` marks a prefix) that a query may not call."""


class SqlRejected(BadRequest):
    """The SQL is not a single read-only query; the message (``reason``) says what was found, in our words.

    ``detail`` is the parser's own description when the text did not parse (None otherwise): useful to a
    model revising its query, never part of the message (its wording belongs to sqlglot's version).
    """

    def __init__(self, reason: str, *, detail: str | None = None) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(reason)


def _names(*names: str) -> tuple[type[exp.Expr], ...]:
    """The sqlglot expression classes among ``names`` (some exist only in some sqlglot versions)."""
    return tuple(cls for n in names if isinstance(cls := getattr(exp, n, None), type))


# A statement or clause that changes data, schema, session or server state, by sqlglot class name.
_FORBIDDEN: dict[str, str] = {
    "Insert": "INSERT",
    "Update": "UPDATE",
    "Delete": "DELETE",
    "Merge": "MERGE",
    "Create": "CREATE",
    "Drop": "DROP",
    "Alter": "ALTER",
    "AlterTable": "ALTER",
    "TruncateTable": "TRUNCATE",
    "Grant": "GRANT",
    "Revoke": "REVOKE",
    "Attach": "ATTACH",
    "Detach": "DETACH",
    "Pragma": "PRAGMA",
    "Copy": "COPY",
    "Set": "SET",
    "Analyze": "ANALYZE",
    "Transaction": "BEGIN",
    "Commit": "COMMIT",
    "Rollback": "ROLLBACK",
    "Comment": "COMMENT",
    "Use": "USE",
    "LoadData": "LOAD DATA",
    "Cache": "CACHE",
    "Uncache": "UNCACHE",
    "Refresh": "REFRESH",
    "Describe": "DESCRIBE",
    "Command": "",  # sqlglot's fallback for statements it does not model: VACUUM, CALL, DO, LOCK, ...
}
_FORBIDDEN_CLASSES: tuple[type[exp.Expr], ...] = _names(*_FORBIDDEN)
_QUERY_CLASSES: tuple[type[exp.Expr], ...] = (exp.Query, *_names("Values"))
_EMPTY_CLASSES: tuple[type[exp.Expr], ...] = _names("Semicolon")


def _keyword(node: exp.Expr) -> str:
    """The SQL keyword of a forbidden node, for messages."""
    if isinstance(node, exp.Command):
        return str(node.this).upper()
    return _FORBIDDEN.get(type(node).__name__) or type(node).__name__.upper()


def _function_names(node: exp.Func) -> list[str]:
    """The lower-case names a function call may go by."""
    if isinstance(node, exp.Anonymous):
        return [node.name.lower()]
    return [n.lower() for n in node.sql_names()]


def is_dangerous_function(name: str) -> bool:
    """Whether a query may not call the function ``name`` (any case; see ``DANGEROUS_FUNCTIONS``)."""
    low = name.lower()
    return low in _EXACT_FUNCTIONS or low.startswith(_PREFIX_FUNCTIONS)


def _lock_text(lock: exp.Expr) -> str:
    update, key = bool(lock.args.get("update")), bool(lock.args.get("key"))
    if update:
        return "FOR NO KEY UPDATE" if key else "FOR UPDATE"
    return "FOR KEY SHARE" if key else "FOR SHARE"


def _root_keyword(node: exp.Expr, sql: str, dialect: str) -> str:
    """The keyword naming a forbidden statement: ours for a statement sqlglot models (``WITH ... INSERT``
    is an INSERT), else the text's first word (sqlglot's ``Command`` fallback, whatever it covers)."""
    if isinstance(node, exp.Command):
        return _first_word(sql, dialect) or _keyword(node)
    return _keyword(node)


def _first_word(sql: str, dialect: str) -> str:
    """The statement's first token (comments skipped), upper case, for messages."""
    tokens = sqlglot.tokenize(sql, read=dialect)
    return tokens[0].text[:30].upper() if tokens else ""


_NOT_A_QUERY = "only read-only queries (SELECT, WITH, VALUES) may run; found {}"


def _unparseable(exc: ParseError | TokenError, dialect: str) -> SqlRejected:
    """Our reason for a text that does not parse (where the parser stopped, if it says), its words apart."""
    details = exc.errors[0] if isinstance(exc, ParseError) and exc.errors else {}
    reason = f"cannot parse SQL: not one valid {dialect} query"
    line, col, near = details.get("line"), details.get("col"), details.get("highlight")
    if isinstance(near, str) and near.strip():
        reason += f"; parsing stopped at {_one_line(near, 40)!r}"
    if isinstance(line, int) and isinstance(col, int):
        reason += f" (line {line}, column {col})"
    description = details.get("description")
    if description:
        token = r"<Token token_type: TokenType\.\w+, text: (.*?), line: .*?>"
        detail = re.sub(token, r"'\1'", str(description))
    else:
        detail = str(exc)
    return SqlRejected(reason, detail=_one_line(detail, 200) or type(exc).__name__)


def _one_line(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


def _check_tree(root: exp.Expr, sql: str, dialect: str) -> None:
    for node in root.walk():
        if isinstance(node, _FORBIDDEN_CLASSES):
            if node is root:
                raise SqlRejected(_NOT_A_QUERY.format(_root_keyword(node, sql, dialect)))
            raise SqlRejected(_NOT_A_QUERY.format(f"{_keyword(node)} (nested inside the query)"))
        if isinstance(node, exp.Select):
            if node.args.get("into") is not None:
                raise SqlRejected("SELECT ... INTO is not allowed: it creates a table")
            locks = node.args.get("locks") or []
            if locks:
                raise SqlRejected(f"locking reads are not allowed; found {_lock_text(locks[0])}")
        if isinstance(node, exp.Lock):
            raise SqlRejected(f"locking reads are not allowed; found {_lock_text(node)}")
        if isinstance(node, exp.Func):
            for name in _function_names(node):
                if is_dangerous_function(name):
                    raise SqlRejected(f"calling function {name}() is not allowed")


def _text_to_run(sql: str, dialect: str) -> str:
    """``sql`` without leading/trailing blanks, trailing semicolons and trailing comments."""
    tokens = [t for t in sqlglot.tokenize(sql, read=dialect) if t.token_type != TokenType.SEMICOLON]
    if not tokens:
        return sql.strip()
    return sql[: tokens[-1].end + 1].strip()


def check_sql(sql: str, dialect: str) -> str:
    """Accept one read-only query in ``dialect`` ("sqlite" or "postgres"); return the text to run.

    Raises ``SqlRejected`` (a ``BadRequest``) with a one-line reason otherwise, and ``ValueError``
    for an unsupported ``dialect`` (a programming error, not a caller's).
    """
    read = SUPPORTED_DIALECTS.get(dialect.lower())
    if read is None:
        raise ValueError(f"unsupported SQL dialect {dialect!r}; supported: {', '.join(SUPPORTED_DIALECTS)}")
    if not sql.strip():
        raise SqlRejected("empty SQL: expected one read-only query")
    try:
        parsed = sqlglot.parse(sql, read=read)
    except (ParseError, TokenError) as exc:
        raise _unparseable(exc, read) from None
    statements = [s for s in parsed if s is not None and not isinstance(s, _EMPTY_CLASSES)]
    if not statements:
        raise SqlRejected("empty SQL: expected one read-only query (found only comments or semicolons)")
    if len(statements) > 1:
        kinds = ", ".join(_statement_kind(s) for s in statements[:4])
        raise SqlRejected(f"more than one statement ({len(statements)}: {kinds}); send exactly one query")
    root = statements[0]
    _check_tree(root, sql, read)
    if not isinstance(root, _QUERY_CLASSES):
        raise SqlRejected(_NOT_A_QUERY.format(_first_word(sql, read) or "no statement"))
    return _text_to_run(sql, read)


def _statement_kind(node: exp.Expr) -> str:
    if isinstance(node, _FORBIDDEN_CLASSES):
        return _keyword(node)
    if isinstance(node, _QUERY_CLASSES):
        return "SELECT" if not isinstance(node, exp.Values) else "VALUES"
    return type(node).__name__.upper()
