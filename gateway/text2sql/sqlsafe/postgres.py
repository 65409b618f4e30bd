"""The PostgreSQL check, on PostgreSQL's own parser (``pglast``): every parse-tree node must be of a kind on
``_ALLOWED_NODES``; functions, casts, operators, keywords and relations are judged against the allowlists
as docs/text2sql.md ("SQL safety") describes (calls the parser makes of SQL syntax included)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence

import pglast
from pglast import ast
from pglast.parser import ParseError, scan

from gateway.text2sql.sqlsafe.allowlist import POSTGRES_FUNCTIONS, POSTGRES_OPERATORS, POSTGRES_TYPES
from gateway.text2sql.sqlsafe.errors import NOT_A_QUERY, SqlRejected, function_refused, one_statement, unparseable

# fmt: off
_ALLOWED_NODES = frozenset({
    "SelectStmt", "ResTarget", "ColumnRef", "A_Star", "A_Const", "String", "Integer", "Float", "Boolean",
    "BitString", "A_Expr", "BoolExpr", "NullTest", "BooleanTest", "SubLink", "CaseExpr", "CaseWhen",
    "CoalesceExpr", "MinMaxExpr", "TypeCast", "TypeName", "FuncCall", "SortBy", "WindowDef", "RangeVar",
    "RangeSubselect", "RangeFunction", "JoinExpr", "Alias", "WithClause", "CommonTableExpr", "CTESearchClause",
    "CTECycleClause", "A_ArrayExpr", "A_Indirection", "A_Indices", "RowExpr", "GroupingSet", "GroupingFunc",
    "CollateClause", "SQLValueFunction", "NamedArgExpr", "ColumnDef",
})
_DATE_KEYWORDS = frozenset({
    "SVFOP_CURRENT_DATE", "SVFOP_CURRENT_TIME", "SVFOP_CURRENT_TIME_N", "SVFOP_CURRENT_TIMESTAMP",
    "SVFOP_CURRENT_TIMESTAMP_N", "SVFOP_LOCALTIME", "SVFOP_LOCALTIME_N", "SVFOP_LOCALTIMESTAMP",
    "SVFOP_LOCALTIMESTAMP_N",
})
_WRITES = {"InsertStmt": "INSERT", "UpdateStmt": "UPDATE", "DeleteStmt": "DELETE", "MergeStmt": "MERGE"}
_CONSTRUCTS = {
    "RangeTableSample": "TABLESAMPLE", "RangeTableFunc": "XMLTABLE", "JsonTable": "JSON_TABLE",
    "XmlExpr": "an XML function", "XmlSerialize": "XMLSERIALIZE", "ParamRef": "a query parameter ($n)",
    "IntoClause": "SELECT ... INTO",
}
_LOCKS = {
    "LCS_FORKEYSHARE": "FOR KEY SHARE", "LCS_FORSHARE": "FOR SHARE", "LCS_FORNOKEYUPDATE": "FOR NO KEY UPDATE",
    "LCS_FORUPDATE": "FOR UPDATE",
}
# fmt: on
_SKIPPED_TOKENS = frozenset({"ASCII_59", "SQL_COMMENT", "C_COMMENT"})


def _enum_name(value: object) -> str:
    return str(getattr(value, "name", value))


def _strings(names: Sequence[object] | None) -> list[str]:
    return [str(getattr(n, "sval", "")) for n in names or ()]


def _children(node: ast.Node) -> Iterator[ast.Node]:
    """The nodes directly under ``node`` (lists flattened)."""
    slots: Iterable[str] = getattr(type(node), "__slots__", ())
    stack: list[object] = [getattr(node, attr, None) for attr in slots]
    while stack:
        value = stack.pop()
        if isinstance(value, ast.Node):
            yield value
        elif isinstance(value, (tuple, list)):
            stack.extend(value)


class _Checker:
    """One walk over one statement's tree; raises ``SqlRejected`` at the first thing not allowed."""

    def __init__(self, schemas: Sequence[str]) -> None:
        self.schemas = tuple(schemas)
        self.catalog_allowed = "pg_catalog" in self.schemas

    def walk(self, root: ast.Node) -> None:
        stack = [root]
        while stack:
            node = stack.pop()
            self.visit(node)
            stack.extend(_children(node))

    def visit(self, node: ast.Node) -> None:
        kind = type(node).__name__
        if kind in _WRITES:
            raise SqlRejected(NOT_A_QUERY.format(f"{_WRITES[kind]} (nested inside the query)"))
        if kind not in _ALLOWED_NODES:  # (INTO and locking clauses are refused by _SelectStmt, their parent)
            what = _CONSTRUCTS.get(kind) or (
                f"a SQL/JSON construct ({kind})" if kind.startswith("Json") else f"the {kind} construct"
            )
            raise SqlRejected(f"{what} is not allowed in a query")
        method = getattr(self, f"_{kind}", None)
        if method is not None:
            method(node)

    def _SelectStmt(self, node: ast.SelectStmt) -> None:  # noqa: N802 - named after the node
        if node.intoClause is not None:
            raise SqlRejected("SELECT ... INTO is not allowed: it creates a table")
        if node.lockingClause:
            lock = node.lockingClause[0]
            raise SqlRejected(f"locking reads are not allowed; found {_LOCKS.get(_enum_name(lock.strength))}")

    def _FuncCall(self, node: ast.FuncCall) -> None:  # noqa: N802
        names = _strings(node.funcname)
        if _foreign(names):
            raise function_refused(".".join(names), "postgres", "a function may be qualified only with pg_catalog")
        if names[-1] not in POSTGRES_FUNCTIONS:
            raise function_refused(".".join(names), "postgres")

    def _TypeName(self, node: ast.TypeName) -> None:  # noqa: N802
        names = _strings(node.names)
        shown = ".".join(names)
        if node.pct_type:
            raise SqlRejected(f"type reference {shown}%TYPE is not allowed in a query")
        if _foreign(names) or names[-1] not in POSTGRES_TYPES:
            raise SqlRejected(
                f"type {shown} is not allowed in a query; casts may name: {', '.join(sorted(POSTGRES_TYPES))}"
            )

    def _A_Expr(self, node: ast.A_Expr) -> None:  # noqa: N802
        if "BETWEEN" not in _enum_name(node.kind):
            _check_operator(node.name)

    def _SubLink(self, node: ast.SubLink) -> None:  # noqa: N802 - x op ANY/ALL (subquery)
        if node.operName:
            _check_operator(node.operName)

    def _SortBy(self, node: ast.SortBy) -> None:  # noqa: N802 - ORDER BY x USING op
        if node.useOp:
            _check_operator(node.useOp)

    def _SQLValueFunction(self, node: ast.SQLValueFunction) -> None:  # noqa: N802
        op = _enum_name(node.op)
        if op not in _DATE_KEYWORDS:
            keyword = op.removeprefix("SVFOP_").removesuffix("_N")
            raise SqlRejected(f"{keyword} is not allowed in a query; only date/time keywords such as CURRENT_DATE")

    def _RangeVar(self, node: ast.RangeVar) -> None:  # noqa: N802
        schema, name = node.schemaname, str(node.relname)
        shown = ".".join(p for p in (node.catalogname, schema, name) if p)
        allowed = ", ".join(self.schemas)
        if node.catalogname:
            raise SqlRejected(f"relation {shown} names another database; read tables of schema(s) {allowed}")
        if schema and schema not in self.schemas:
            raise SqlRejected(
                f"relation {shown} is outside the database's schema(s) {allowed}: system catalogs and other "
                "schemas are not readable unless the database config allows them (allow_schemas)"
            )
        if not schema and name.startswith("pg_") and not self.catalog_allowed:
            raise SqlRejected(
                f"system catalog {shown} is not allowed in a query; read tables of schema(s) {allowed} "
                "(pg_catalog only if the database config allows it)"
            )


def _foreign(names: list[str]) -> bool:
    """Whether a qualified name's qualifier is anything but ``pg_catalog``."""
    return len(names) > 2 or (len(names) == 2 and names[0] != "pg_catalog")


def _check_operator(name: Sequence[object] | None) -> None:
    names = _strings(name)
    if _foreign(names) or names[-1] not in POSTGRES_OPERATORS:
        raise SqlRejected(f"operator {'.'.join(names)} is not allowed in a query")


def _first_word(sql: str, start: int = 0, end: int | None = None) -> str:
    for t in scan(sql):  # offsets in characters, end inclusive
        if t.start >= start and (end is None or t.start < end) and t.name not in _SKIPPED_TOKENS:
            return sql[t.start : t.end + 1][:30].upper()
    return ""


def _unparseable(exc: ParseError, sql: str) -> SqlRejected:
    message = str(exc.args[0]) if exc.args else str(exc)
    location = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], int) else None
    if location is None or not 0 <= location <= len(sql):
        return unparseable("postgres", exc, message, None, None, None)
    near = sql[location:].split()
    line = sql.count("\n", 0, location) + 1
    col = location - (sql.rfind("\n", 0, location) + 1) + 1
    return unparseable("postgres", exc, message, near[0] if near else None, line, col)


def _statement_kind(sql: str, raw: ast.RawStmt) -> str:
    stmt = raw.stmt
    kind = type(stmt).__name__
    if isinstance(stmt, ast.SelectStmt):
        return "VALUES" if stmt.valuesLists else "SELECT"
    if kind in _WRITES:
        return _WRITES[kind]
    start = raw.stmt_location or 0
    return _first_word(sql, start, start + raw.stmt_len if raw.stmt_len else None) or kind.upper()


def check_postgres(sql: str, schemas: Sequence[str]) -> str:
    """Check one PostgreSQL query reading only ``schemas``; return the text to run (trailing ``;``/comments cut)."""
    try:
        statements = pglast.parse_sql(sql)
    except ParseError as exc:
        raise _unparseable(exc, sql) from None
    root = one_statement(statements, functools.partial(_statement_kind, sql)).stmt
    if not isinstance(root, ast.SelectStmt):
        kind = type(root).__name__
        raise SqlRejected(NOT_A_QUERY.format(_WRITES.get(kind) or _first_word(sql) or kind.upper()))
    _Checker(schemas).walk(root)
    ends = [t.end for t in scan(sql) if t.name not in _SKIPPED_TOKENS]
    return sql[: ends[-1] + 1].strip() if ends else sql.strip()
