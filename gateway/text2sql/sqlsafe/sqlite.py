"""The SQLite check (sqlglot): one query, no write, functions from the allowlist, tables of ``main`` only. A call
is judged by its name as written (sqlglot records where it stands); the few call forms built without a recorded
name (``CAST``, ``CASE``, ``->``, ...) are mapped by class below, any other refused."""

from __future__ import annotations

import re

import sqlglot
from sqlglot import TokenType, exp
from sqlglot.errors import ParseError, TokenError

from gateway.text2sql.sqlsafe.allowlist import SQLITE_FUNCTIONS
from gateway.text2sql.sqlsafe.errors import NOT_A_QUERY, SqlRejected, function_refused, one_statement, unparseable


def _names(*names: str) -> tuple[type[exp.Expr], ...]:
    """The sqlglot expression classes among ``names`` (some exist only in some sqlglot versions)."""
    return tuple(cls for n in names if isinstance(cls := getattr(exp, n, None), type))


# A statement or clause that changes data, schema, session or server state, by sqlglot class name.
# fmt: off
_FORBIDDEN: dict[str, str] = {
    "Insert": "INSERT", "Update": "UPDATE", "Delete": "DELETE", "Merge": "MERGE", "Create": "CREATE",
    "Drop": "DROP", "Alter": "ALTER", "AlterTable": "ALTER", "TruncateTable": "TRUNCATE", "Grant": "GRANT",
    "Revoke": "REVOKE", "Attach": "ATTACH", "Detach": "DETACH", "Pragma": "PRAGMA", "Copy": "COPY", "Set": "SET",
    "Analyze": "ANALYZE", "Transaction": "BEGIN", "Commit": "COMMIT", "Rollback": "ROLLBACK",
    "Comment": "COMMENT", "Use": "USE", "LoadData": "LOAD DATA", "Cache": "CACHE", "Uncache": "UNCACHE",
    "Refresh": "REFRESH", "Describe": "DESCRIBE",
    "Command": "",  # sqlglot's fallback for statements it does not model: VACUUM, CALL, DO, LOCK, ...
}
# fmt: on
_FORBIDDEN_CLASSES: tuple[type[exp.Expr], ...] = _names(*_FORBIDDEN)
QUERY_CLASSES: tuple[type[exp.Expr], ...] = (exp.Query, *_names("Values"))
_EMPTY_CLASSES: tuple[type[exp.Expr], ...] = _names("Semicolon")

# Call forms sqlglot builds without recording a name: the SQLite function (or syntax, "") each stands for.
# A class absent here and without a recorded name is refused.
# fmt: off
_UNNAMED: dict[str, str] = {
    "And": "", "Or": "", "Xor": "", "Not": "", "Case": "", "Cast": "", "Exists": "", "Collate": "",
    "If": "",  # the WHEN branches of CASE
    "CurrentDate": "", "CurrentTime": "", "CurrentTimestamp": "",
    "JSONExtract": "", "JSONExtractScalar": "",  # -> and ->>
    "TsOrDsToTimestamp": "",  # sqlglot's wrapper around strftime()'s argument, not written
    "Substring": "substring", "Trim": "trim", "GroupConcat": "group_concat", "Chr": "char", "Ceil": "ceil",
    "Floor": "floor", "RegexpLike": "regexp",
}
# fmt: on
_UNNAMED_CLASSES: dict[type[exp.Expr], str] = {cls: _UNNAMED[cls.__name__] for cls in _names(*_UNNAMED)}

_VIRTUAL_TABLES = frozenset(
    {"json_each", "json_tree", "dbstat", "fts3tokenize", "generate_series", "carray", "zipfile", "completion"}
)


def _keyword(node: exp.Expr) -> str:
    """The SQL keyword of a forbidden node, for messages."""
    if isinstance(node, exp.Command):
        return str(node.this).upper()
    return _FORBIDDEN.get(type(node).__name__) or type(node).__name__.upper()


_LOCKS = {(True, True): "FOR NO KEY UPDATE", (True, False): "FOR UPDATE", (False, True): "FOR KEY SHARE"}


def _lock_text(lock: exp.Expr) -> str:
    return _LOCKS.get((bool(lock.args.get("update")), bool(lock.args.get("key"))), "FOR SHARE")


def _first_word(sql: str) -> str:
    """The statement's first token (comments skipped), upper case, for messages."""
    tokens = sqlglot.tokenize(sql, read="sqlite")
    return tokens[0].text[:30].upper() if tokens else ""


def _unparseable(exc: ParseError | TokenError) -> SqlRejected:
    details = exc.errors[0] if isinstance(exc, ParseError) and exc.errors else {}
    description = details.get("description")
    detail = re.sub(_TOKEN, r"'\1'", str(description)) if description else str(exc)
    return unparseable("sqlite", exc, detail, details.get("highlight"), details.get("line"), details.get("col"))


_TOKEN = r"<Token token_type: TokenType\.\w+, text: (.*?), line: .*?>"


def _written_name(node: exp.Func, sql: str) -> str | None:
    """The function name as the text writes it (lower case, unquoted), "" for syntax; None if unknown."""
    meta = node.meta or {}
    start, end = meta.get("start"), meta.get("end")
    if isinstance(start, int) and isinstance(end, int) and 0 <= start <= end < len(sql):
        written = sql[start : end + 1]
        if len(written) >= 2 and written[0] + written[-1] in ('""', "[]", "``"):
            written = written[1:-1]
        return written.lower()
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    return _UNNAMED_CLASSES.get(type(node))


def _check_function(node: exp.Func, sql: str) -> None:
    name = _written_name(node, sql)
    if name is None:
        names = node.sql_names()
        shown = names[0].lower() if names else type(node).__name__.lower()
        raise function_refused(shown, "sqlite")
    if name and name not in SQLITE_FUNCTIONS:
        raise function_refused(name, "sqlite")


def _check_table(node: exp.Table, sql: str) -> None:
    if isinstance(node.this, exp.Func):
        name = _written_name(node.this, sql) or node.this.sql_names()[0].lower()
        raise SqlRejected(f"table-valued function {name}() is not allowed in a query; read the database's tables")
    name = node.name
    shown = ".".join(p for p in (node.catalog, node.db, name) if p)
    if node.catalog or (node.db and node.db.lower() != "main"):
        raise SqlRejected(
            f"relation {shown} is outside the database: only its main schema may be read (no temp or attached database)"
        )
    low = name.lower()
    if low.startswith("sqlite_"):
        raise SqlRejected(f"system table {shown} is not allowed in a query; read the database's own tables")
    if low.startswith("pragma_") or low in _VIRTUAL_TABLES:
        raise SqlRejected(f"virtual table {shown} is not allowed in a query; read the database's own tables")


def _check_tree(root: exp.Expr, sql: str) -> None:
    for node in root.walk():
        if isinstance(node, _FORBIDDEN_CLASSES):
            if node is root:
                keyword = (_first_word(sql) or _keyword(node)) if isinstance(node, exp.Command) else _keyword(node)
                raise SqlRejected(NOT_A_QUERY.format(keyword))
            raise SqlRejected(NOT_A_QUERY.format(f"{_keyword(node)} (nested inside the query)"))
        if isinstance(node, exp.Select):
            if node.args.get("into") is not None:
                raise SqlRejected("SELECT ... INTO is not allowed: it creates a table")
            locks = node.args.get("locks") or []
            if locks:
                raise SqlRejected(f"locking reads are not allowed; found {_lock_text(locks[0])}")
        if isinstance(node, exp.Lock):
            raise SqlRejected(f"locking reads are not allowed; found {_lock_text(node)}")
        if isinstance(node, exp.Table):
            _check_table(node, sql)
        if isinstance(node, exp.Func):
            _check_function(node, sql)


def _statement_kind(node: exp.Expr) -> str:
    if isinstance(node, _FORBIDDEN_CLASSES):
        return _keyword(node)
    if isinstance(node, QUERY_CLASSES):
        return "SELECT" if not isinstance(node, exp.Values) else "VALUES"
    return type(node).__name__.upper()


def check_sqlite(sql: str) -> str:
    """Check one SQLite query; return the text to run (trailing semicolons and comments cut)."""
    try:
        parsed = sqlglot.parse(sql, read="sqlite")
    except (ParseError, TokenError) as exc:
        raise _unparseable(exc) from None
    root = one_statement([s for s in parsed if s is not None and not isinstance(s, _EMPTY_CLASSES)], _statement_kind)
    _check_tree(root, sql)
    if not isinstance(root, QUERY_CLASSES):
        raise SqlRejected(NOT_A_QUERY.format(_first_word(sql) or "no statement"))
    tokens = [t for t in sqlglot.tokenize(sql, read="sqlite") if t.token_type != TokenType.SEMICOLON]
    return sql[: tokens[-1].end + 1].strip() if tokens else sql.strip()
