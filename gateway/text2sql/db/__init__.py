"""Read-only access to the databases the Text-to-SQL pipeline queries: SQLite files and PostgreSQL.

A databases file (YAML) names each database and its limits::

    databases:
      concert_singer:
        url: sqlite:///spider/concert_singer.sqlite     # relative to this file's folder
        description: Spider dev database
      sales:
        url: postgresql://reader@127.0.0.1:5432/sales
        schema: public
        statement_timeout_s: 5

SQLite URLs follow SQLAlchemy: ``sqlite:///rel/path.sqlite`` is relative (to the YAML file's
folder), ``sqlite:////abs/path.sqlite`` is absolute.

Every query passes ``check_sql`` (one read-only statement) and then runs behind a second, engine-side
barrier: SQLite files are opened with ``mode=ro`` (plus ``query_only`` and an authorizer that refuses
``ATTACH``/``PRAGMA``/dangerous functions); PostgreSQL queries run in ``READ ONLY`` transactions on
sessions whose default is read-only. Each query has a statement timeout, a row cap and a byte cap.

Models and results:
    DatabaseConfig, DatabasesFile, load_databases(path)        the YAML file
    QueryResult                                                 rows as JSON-safe values
    ColumnInfo, ForeignKey, TableInfo, SchemaInfo               introspected schema
    serialize_schema(schema, max_chars=None)                    the schema as prompt text

Databases:
    Database (abstract), SqliteDatabase, PostgresDatabase, open_database(db_id, config, ...)
    DatabaseRegistry                                            db_id -> Database, created lazily

Errors:
    QueryFailed(kind="error"|"timeout"), DatabaseUnavailable, UnknownDatabase, SqlRejected
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import decimal
import json
import math
import re
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import quote

import asyncpg

from gateway.config.databases import DatabaseConfig, DatabasesFile, Dialect, load_databases
from gateway.errors import UnknownNameError
from gateway.text2sql.sqlsafe import SqlRejected, check_sql, is_dangerous_function

__all__ = [
    "ColumnInfo",
    "Database",
    "DatabaseConfig",
    "DatabaseRegistry",
    "DatabaseUnavailable",
    "DatabasesFile",
    "Descriptions",
    "Dialect",
    "ForeignKey",
    "PostgresDatabase",
    "QueryFailed",
    "QueryResult",
    "SchemaInfo",
    "SqlRejected",
    "SqliteDatabase",
    "TableInfo",
    "UnknownDatabase",
    "json_value",
    "load_databases",
    "open_database",
    "serialize_schema",
]

Descriptions = Mapping[str, Mapping[str, str]]
"""Column descriptions of one database: table -> column -> text (names matched case-insensitively)."""
Scalar = int | float | str | bool | None

SAMPLE_TEXT_CHARS = 40
"""Text sample values longer than this are cut to this many characters."""
_SAMPLE_SCAN_ROWS = 10_000  # PostgreSQL samples come from at most this many rows of a table
_FETCH_CHUNK = 256

# --------------------------------------------------------------------------------------------------
# Configuration

# --------------------------------------------------------------------------------------------------
# Results and errors


@dataclass(frozen=True, slots=True)
class QueryResult:
    """Rows of one query, as JSON-safe values (see ``json_value``)."""

    columns: list[str]
    rows: list[list[Any]]
    row_count: int
    """Rows returned (``len(rows)``, at most ``max_rows``)."""
    truncated: bool
    """More rows existed than returned (the row cap or the byte cap cut the result)."""
    elapsed_s: float


class QueryFailed(Exception):
    """The engine refused or aborted a query that passed the static check.

    ``kind`` is ``"timeout"`` (the statement timeout fired) or ``"error"`` (the engine's message).
    """

    def __init__(self, kind: Literal["error", "timeout"], message: str) -> None:
        self.kind = kind
        self.message = message
        super().__init__(message)


class DatabaseUnavailable(Exception):
    """A database cannot be opened or reached; the message names the database and the cause."""


class UnknownDatabase(UnknownNameError, KeyError):
    """``DatabaseRegistry.get`` was asked for a db_id it does not have; ``.known`` lists those it has."""

    def __init__(self, db_id: str, known: Iterable[str]) -> None:
        super().__init__("database", db_id, list(known))

    def __str__(self) -> str:
        return str(self.args[0])


def json_value(v: object) -> Any:
    """A value as JSON can carry it: int, float, str, bool, None, or a list of those.

    bytes -> hex string; Decimal -> float; date/time -> ISO 8601; non-finite floats -> ``"inf"``,
    ``"-inf"``, ``"nan"``; arrays -> lists; anything else -> ``str(v)``.
    """
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).hex()
    if isinstance(v, decimal.Decimal):
        f = float(v)
        return f if math.isfinite(f) else str(f)
    if isinstance(v, dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, list | tuple):
        return [json_value(x) for x in v]
    return str(v)


class _Rows:
    """Collects converted rows up to the row cap and the byte cap."""

    def __init__(self, columns: list[str], max_rows: int, max_bytes: int) -> None:
        self.columns = columns
        self.rows: list[list[Any]] = []
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.size = len(json.dumps(columns, ensure_ascii=False).encode())
        self.truncated = False

    def want(self) -> int:
        """How many more rows to fetch: up to one past the cap, to learn whether more exist."""
        return 0 if self.truncated else min(_FETCH_CHUNK, self.max_rows + 1 - len(self.rows))

    def add(self, batch: Iterable[Iterable[object]]) -> None:
        """Take rows until a cap is hit (then ``truncated`` is set and ``want()`` is 0)."""
        for raw in batch:
            if len(self.rows) >= self.max_rows:
                self.truncated = True
                return
            row = [json_value(v) for v in raw]
            n = len(json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode()) + 1
            if self.size + n > self.max_bytes:
                self.truncated = True
                return
            self.rows.append(row)
            self.size += n

    def result(self, start: float) -> QueryResult:
        return QueryResult(self.columns, self.rows, len(self.rows), self.truncated, time.perf_counter() - start)


# --------------------------------------------------------------------------------------------------
# Schema


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One column: declared type, key and null flags, example values, optional description."""

    name: str
    type: str
    primary_key: bool = False
    nullable: bool = True
    samples: tuple[Scalar, ...] = ()
    description: str = ""


@dataclass(frozen=True, slots=True)
class ForeignKey:
    """``FOREIGN KEY (columns) REFERENCES ref_table(ref_columns)``."""

    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TableInfo:
    """One table (or view) and its columns in declaration order."""

    name: str
    columns: tuple[ColumnInfo, ...]
    primary_key: tuple[str, ...] = ()
    foreign_keys: tuple[ForeignKey, ...] = ()
    kind: Literal["table", "view"] = "table"

    def column(self, name: str) -> ColumnInfo | None:
        """The column called ``name`` (case-insensitive), if any."""
        low = name.lower()
        return next((c for c in self.columns if c.name.lower() == low), None)


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    """The tables of one database, sorted by name."""

    db_id: str
    dialect: Dialect
    tables: tuple[TableInfo, ...]
    description: str = ""

    def table(self, name: str) -> TableInfo | None:
        """The table called ``name`` (case-insensitive), if any."""
        low = name.lower()
        return next((t for t in self.tables if t.name.lower() == low), None)

    def table_names(self) -> list[str]:
        """Names of the tables, in order."""
        return [t.name for t in self.tables]


def _sample(v: object) -> Scalar:
    """A sample value: JSON-safe, text cut to ``SAMPLE_TEXT_CHARS``."""
    j = json_value(v)
    if isinstance(j, list):
        j = json.dumps(j, ensure_ascii=False)
    if isinstance(j, str):
        return j[:SAMPLE_TEXT_CHARS]
    return j  # type: ignore[no-any-return]


def _describe(tables: list[TableInfo], descriptions: Descriptions | None) -> tuple[TableInfo, ...]:
    """Tables sorted by name, column descriptions filled in from ``descriptions``."""
    lowered = {t.lower(): {c.lower(): d for c, d in cols.items()} for t, cols in (descriptions or {}).items()}
    out: list[TableInfo] = []
    for t in sorted(tables, key=lambda t: (t.name.lower(), t.name)):
        per_col = lowered.get(t.name.lower(), {})
        cols = tuple(replace(c, description=per_col.get(c.name.lower(), c.description)) for c in t.columns)
        out.append(replace(t, columns=cols))
    return tuple(out)


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_SIMPLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# fmt: off
_RESERVED = frozenset({
    "all", "and", "as", "asc", "between", "by", "case", "cast", "check", "column", "constraint", "create",
    "default", "delete", "desc", "distinct", "drop", "else", "end", "except", "exists", "foreign", "from", "group",
    "having", "in", "index", "insert", "intersect", "into", "is", "join", "key", "like", "limit", "not", "null",
    "offset", "on", "or", "order", "primary", "references", "select", "set", "table", "then", "to", "union",
    "unique", "update", "user", "using", "values", "when", "where", "with",
})
# fmt: on


def _name(name: str, dialect: Dialect) -> str:
    """``name`` as it must be written in SQL: quoted unless a plain identifier."""
    plain = _SIMPLE_NAME.match(name) and name.lower() not in _RESERVED
    if plain and (dialect != "postgres" or name == name.lower()):
        return name
    return _quote_ident(name)


def _literal(v: Scalar) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return "'" + v.replace("'", "''").replace("\r", " ").replace("\n", " ") + "'"
    return "NULL" if v is None else str(v)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _table_block(t: TableInfo, dialect: Dialect, examples: bool, descriptions: bool) -> str:
    items: list[tuple[str, str]] = []  # (definition, comment)
    single_pk = len(t.primary_key) == 1
    for c in t.columns:
        parts = [_name(c.name, dialect)]
        if c.type:
            parts.append(c.type)
        if c.primary_key and single_pk:
            parts.append("PRIMARY KEY")
        elif not c.nullable and not c.primary_key:
            parts.append("NOT NULL")
        notes: list[str] = []
        if descriptions and c.description:
            notes.append(_one_line(c.description))
        if examples and c.samples:
            notes.append("examples: " + ", ".join(_literal(v) for v in c.samples))
        items.append((" ".join(parts), "; ".join(notes)))
    if len(t.primary_key) > 1:
        items.append((f"PRIMARY KEY ({', '.join(_name(c, dialect) for c in t.primary_key)})", ""))
    for fk in t.foreign_keys:
        ref = _name(fk.ref_table, dialect)
        if fk.ref_columns:
            ref += f"({', '.join(_name(c, dialect) for c in fk.ref_columns)})"
        items.append((f"FOREIGN KEY ({', '.join(_name(c, dialect) for c in fk.columns)}) REFERENCES {ref}", ""))
    lines = [f"CREATE {'VIEW' if t.kind == 'view' else 'TABLE'} {_name(t.name, dialect)} ("]
    for i, (definition, comment) in enumerate(items):
        line = "  " + definition + ("," if i < len(items) - 1 else "")
        lines.append(f"{line} -- {comment}" if comment else line)
    lines.append(");")
    return "\n".join(lines)


def serialize_schema(schema: SchemaInfo, *, max_chars: int | None = None) -> str:
    """The schema as compact ``CREATE TABLE`` text, one block per table, for LLM prompts.

    Columns carry their type, ``PRIMARY KEY``/``NOT NULL`` and a ``-- description; examples: 'a', 'b'``
    comment; foreign keys are ``FOREIGN KEY (x) REFERENCES t(y)`` lines. Tables come in name order,
    columns in declaration order, so equal schemas give equal text. Names that need it are quoted.

    With ``max_chars`` the text is shrunk until it fits: first the examples go, then the descriptions,
    then whole tables from the end (a ``-- N more tables omitted`` line says so when it fits); a first
    table longer than the budget on its own is cut at ``max_chars``.
    """
    if max_chars is not None and max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    blocks: list[str] = []
    for examples, descriptions in ((True, True), (False, True), (False, False)):
        blocks = [_table_block(t, schema.dialect, examples, descriptions) for t in schema.tables]
        text = "\n\n".join(blocks)
        if max_chars is None or len(text) <= max_chars:
            return text
    assert max_chars is not None
    kept: list[str] = []
    used = 0
    for b in blocks:
        extra = len(b) + (2 if kept else 0)
        if used + extra > max_chars:
            break
        kept.append(b)
        used += extra
    if not kept:
        return blocks[0][:max_chars]
    text = "\n\n".join(kept)
    omitted = len(blocks) - len(kept)
    note = f"-- {omitted} more table{'s' if omitted > 1 else ''} omitted"
    return f"{text}\n\n{note}" if len(text) + 2 + len(note) <= max_chars else text


# --------------------------------------------------------------------------------------------------
# Databases


class Database(ABC):
    """A database the pipeline may query: read-only, time- and size-limited, schema cached."""

    dialect: ClassVar[Dialect]

    def __init__(self, db_id: str, config: DatabaseConfig, *, descriptions: Descriptions | None = None) -> None:
        self.db_id = db_id
        self.config = config
        self.descriptions = descriptions
        self._schema: SchemaInfo | None = None
        self._schema_lock = asyncio.Lock()

    async def execute(self, sql: str) -> QueryResult:
        """Check ``sql`` with ``check_sql`` (``SqlRejected``), then run it.

        Raises ``QueryFailed`` (engine error or timeout) and ``DatabaseUnavailable``.
        """
        return await self._run(check_sql(sql, self.dialect))

    @abstractmethod
    async def _run(self, sql: str) -> QueryResult:
        """Run ``sql`` without the static check (the engine-side read-only barrier still holds)."""

    async def schema(self) -> SchemaInfo:
        """The database's schema, introspected on the first call and cached until ``invalidate()``."""
        async with self._schema_lock:
            if self._schema is None:
                self._schema = await self._introspect()
            return self._schema

    def invalidate(self) -> None:
        """Forget the cached schema; the next ``schema()`` introspects again."""
        self._schema = None

    @abstractmethod
    async def _introspect(self) -> SchemaInfo:
        """Read the schema from the database."""

    async def close(self) -> None:  # noqa: B027 - SQLite holds nothing open between queries
        """Release connections (a later query opens new ones)."""

    def _timeout_message(self) -> str:
        return f"statement timed out after {self.config.statement_timeout_s:g} s"


def _sqlite_authorizer(action: int, arg1: str | None, arg2: str | None, _db: str | None, _src: str | None) -> int:
    """Refuse ATTACH, DETACH, PRAGMA and dangerous functions in user SQL."""
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH, sqlite3.SQLITE_PRAGMA):
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and arg2 and is_dangerous_function(arg2):
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


class _Deadline:
    """A SQLite progress handler that aborts the running statement once the deadline has passed."""

    def __init__(self) -> None:
        self.deadline = math.inf
        self.fired = False

    def start(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.fired = False

    def __call__(self) -> int:
        if time.monotonic() > self.deadline:
            self.fired = True
            return 1
        return 0


class SqliteDatabase(Database):
    """A SQLite file opened read-only; each query uses its own connection in a worker thread."""

    dialect: ClassVar[Dialect] = "sqlite"

    def __init__(
        self,
        db_id: str,
        config: DatabaseConfig,
        *,
        base_dir: Path | str | None = None,
        descriptions: Descriptions | None = None,
    ) -> None:
        super().__init__(db_id, config, descriptions=descriptions)
        self.path = config.sqlite_path(base_dir)

    def _connect(self) -> sqlite3.Connection:
        """A read-only connection (call in the thread that will use it)."""
        if not self.path.is_file():
            raise DatabaseUnavailable(f"database {self.db_id!r}: SQLite file {self.path} does not exist")
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(f"file:{quote(str(self.path))}?mode=ro", uri=True, isolation_level=None)
            conn.text_factory = _decode_text
            conn.execute("PRAGMA query_only = ON")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            raise DatabaseUnavailable(f"database {self.db_id!r}: cannot open SQLite file {self.path}: {exc}") from None
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        return conn

    async def _run(self, sql: str) -> QueryResult:
        return await asyncio.to_thread(self._run_sync, sql)

    def _run_sync(self, sql: str) -> QueryResult:
        start = time.perf_counter()
        cfg = self.config
        conn = self._connect()
        try:
            deadline = _Deadline()
            conn.set_progress_handler(deadline, 1000)
            conn.set_authorizer(_sqlite_authorizer)
            deadline.start(cfg.statement_timeout_s)
            try:
                cur = conn.execute(sql)
                rows = _Rows([d[0] for d in cur.description or ()], cfg.max_rows, cfg.max_result_bytes)
                while n := rows.want():
                    batch = cur.fetchmany(n)
                    if not batch:
                        break
                    rows.add(batch)
                return rows.result(start)
            except (sqlite3.Error, sqlite3.Warning) as exc:
                if deadline.fired:
                    raise QueryFailed("timeout", self._timeout_message()) from None
                raise QueryFailed("error", str(exc) or type(exc).__name__) from None
        finally:
            conn.close()

    async def _introspect(self) -> SchemaInfo:
        return await asyncio.to_thread(self._introspect_sync)

    def _introspect_sync(self) -> SchemaInfo:
        cfg = self.config
        conn = self._connect()
        try:
            deadline = _Deadline()
            conn.set_progress_handler(deadline, 1000)
            try:
                objects = conn.execute(
                    "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
                    "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
                ).fetchall()
                raw: list[tuple[str, Literal["table", "view"], list[tuple[Any, ...]], list[tuple[Any, ...]]]] = []
                for name, type_ in objects:
                    kind: Literal["table", "view"] = "view" if type_ == "view" else "table"
                    cols = conn.execute("SELECT * FROM pragma_table_info(?) ORDER BY cid", (name,)).fetchall()
                    fks = conn.execute("SELECT * FROM pragma_foreign_key_list(?) ORDER BY id, seq", (name,)).fetchall()
                    raw.append((name, kind, cols, fks))
            except sqlite3.Error as exc:
                raise QueryFailed("error", f"cannot read the schema of {self.db_id!r}: {exc}") from None
            pks = {
                name.lower(): tuple(c[1] for c in sorted((c for c in cols if c[5]), key=lambda c: c[5]))
                for name, _, cols, _ in raw
            }
            tables: list[TableInfo] = []
            for name, kind, cols, fk_rows in raw:
                pk = pks[name.lower()]
                columns = []
                for _cid, col, ctype, notnull, _default, pk_pos in cols:
                    samples = self._samples(conn, deadline, name, col) if cfg.sample_values else ()
                    columns.append(ColumnInfo(col, ctype or "", bool(pk_pos), not notnull and not pk_pos, samples))
                tables.append(TableInfo(name, tuple(columns), pk, _sqlite_foreign_keys(fk_rows, pks), kind=kind))
        finally:
            conn.close()
        return SchemaInfo(self.db_id, "sqlite", _describe(tables, self.descriptions), cfg.description)

    def _samples(self, conn: sqlite3.Connection, deadline: _Deadline, table: str, column: str) -> tuple[Scalar, ...]:
        c, t = _quote_ident(column), _quote_ident(table)
        deadline.start(self.config.statement_timeout_s)
        try:
            rows = conn.execute(
                f"SELECT DISTINCT {c} FROM {t} WHERE {c} IS NOT NULL LIMIT {self.config.sample_values}"
            ).fetchall()
        except sqlite3.Error:
            return ()
        return tuple(_sample(r[0]) for r in rows)


def _decode_text(data: bytes) -> str:
    """SQLite TEXT as str; invalid UTF-8 (present in some public datasets) is replaced, not fatal."""
    return data.decode("utf-8", errors="replace")


def _sqlite_foreign_keys(rows: Sequence[Sequence[Any]], pks: Mapping[str, tuple[str, ...]]) -> tuple[ForeignKey, ...]:
    """``PRAGMA foreign_key_list`` rows (id, seq, table, from, to, ...) grouped into keys."""
    grouped: dict[int, list[Sequence[Any]]] = {}
    for r in rows:
        grouped.setdefault(int(r[0]), []).append(r)
    out = []
    for _, parts in sorted(grouped.items()):
        parts.sort(key=lambda r: int(r[1]))
        ref_table = str(parts[0][2])
        ref_cols: tuple[str, ...] = tuple(str(r[4]) for r in parts if r[4] is not None)
        if len(ref_cols) != len(parts):  # "REFERENCES t" without columns: the parent's primary key
            ref_cols = pks.get(ref_table.lower(), ())
        out.append(ForeignKey(tuple(str(r[3]) for r in parts), ref_table, ref_cols))
    return tuple(out)


_PG_COLUMNS = """
SELECT c.relname, c.relkind::text, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY c.relname, a.attnum
"""

_PG_KEYS = """
SELECT con.contype::text AS contype, cl.relname, con.conname,
  ARRAY(SELECT a.attname FROM unnest(con.conkey) WITH ORDINALITY AS k(num, ord)
        JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.num ORDER BY k.ord) AS cols,
  rcl.relname AS ref_table, rns.nspname AS ref_schema,
  ARRAY(SELECT a.attname FROM unnest(con.confkey) WITH ORDINALITY AS k(num, ord)
        JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.num ORDER BY k.ord) AS ref_cols
FROM pg_constraint con
JOIN pg_class cl ON cl.oid = con.conrelid
JOIN pg_namespace n ON n.oid = cl.relnamespace
LEFT JOIN pg_class rcl ON rcl.oid = con.confrelid
LEFT JOIN pg_namespace rns ON rns.oid = rcl.relnamespace
WHERE n.nspname = $1 AND con.contype IN ('p', 'f')
ORDER BY cl.relname, con.conname
"""


class PostgresDatabase(Database):
    """A PostgreSQL database behind an asyncpg pool (created on first use, at most ``pool_size``)."""

    dialect: ClassVar[Dialect] = "postgres"

    def __init__(self, db_id: str, config: DatabaseConfig, *, descriptions: Descriptions | None = None) -> None:
        super().__init__(db_id, config, descriptions=descriptions)
        self._pool: Any = None
        self._pool_lock = asyncio.Lock()

    def _unavailable(self, exc: BaseException) -> DatabaseUnavailable:
        why = str(exc) or type(exc).__name__
        return DatabaseUnavailable(f"database {self.db_id!r}: cannot connect to {self.config.safe_url}: {why}")

    async def _get_pool(self) -> Any:
        async with self._pool_lock:
            if self._pool is None:
                try:
                    self._pool = await asyncpg.create_pool(
                        self.config.url,
                        min_size=0,
                        max_size=self.config.pool_size,
                        timeout=self.config.connect_timeout_s,
                        server_settings={
                            "application_name": "hexflow-text2sql",
                            "default_transaction_read_only": "on",
                        },
                    )
                except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as exc:
                    raise self._unavailable(exc) from None
            return self._pool

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        pool = await self._get_pool()
        try:
            conn = await pool.acquire()
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise self._unavailable(exc) from None
        try:
            yield conn
        finally:
            await pool.release(conn)

    async def _in_readonly_transaction(self, fn: Callable[[Any], Any]) -> Any:
        """``await fn(conn)`` inside a READ ONLY transaction with the statement timeout set.

        Errors become ``QueryFailed``/``DatabaseUnavailable``; ``asyncio.wait_for`` of the timeout
        plus 2 s backs the server-side timeout up.
        """
        timeout = self.config.statement_timeout_s
        ms = max(1, round(timeout * 1000))

        async def body(conn: Any) -> Any:
            async with conn.transaction(readonly=True):
                await conn.execute(f"SET LOCAL statement_timeout = {ms}")
                return await fn(conn)

        async with self._connection() as conn:
            try:
                return await asyncio.wait_for(body(conn), timeout + 2.0)
            except (TimeoutError, asyncpg.QueryCanceledError):
                raise QueryFailed("timeout", self._timeout_message()) from None
            except (asyncpg.PostgresConnectionError, OSError) as exc:
                raise self._unavailable(exc) from None
            except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                raise QueryFailed("error", str(exc) or type(exc).__name__) from None

    async def _run(self, sql: str) -> QueryResult:
        start = time.perf_counter()
        cfg = self.config

        async def query(conn: Any) -> QueryResult:
            stmt = await conn.prepare(sql)
            rows = _Rows([str(a.name) for a in stmt.get_attributes()], cfg.max_rows, cfg.max_result_bytes)
            cursor = await stmt.cursor()
            while n := rows.want():
                batch = await cursor.fetch(n)
                if not batch:
                    break
                rows.add(tuple(r.values()) for r in batch)
            return rows.result(start)

        result: QueryResult = await self._in_readonly_transaction(query)
        return result

    async def _introspect(self) -> SchemaInfo:
        cfg = self.config
        schema = cfg.db_schema

        async def read(conn: Any) -> list[TableInfo]:
            col_rows = await conn.fetch(_PG_COLUMNS, schema)
            key_rows = await conn.fetch(_PG_KEYS, schema)
            pks: dict[str, tuple[str, ...]] = {}
            fks: dict[str, list[ForeignKey]] = {}
            for r in key_rows:
                if r["contype"] == "p":
                    pks[r["relname"]] = tuple(r["cols"])
                elif r["ref_table"] is not None:
                    ref = r["ref_table"] if r["ref_schema"] == schema else f"{r['ref_schema']}.{r['ref_table']}"
                    fks.setdefault(r["relname"], []).append(ForeignKey(tuple(r["cols"]), ref, tuple(r["ref_cols"])))
            columns: dict[str, list[ColumnInfo]] = {}
            kinds: dict[str, Literal["table", "view"]] = {}
            for relname, relkind, attname, typ, notnull in col_rows:
                pk = pks.get(relname, ())
                samples = await self._samples(conn, relname, attname) if cfg.sample_values else ()
                columns.setdefault(relname, []).append(ColumnInfo(attname, typ, attname in pk, not notnull, samples))
                kinds[relname] = "view" if relkind in ("v", "m") else "table"
            return [
                TableInfo(name, tuple(cols), pks.get(name, ()), tuple(fks.get(name, ())), kind=kinds[name])
                for name, cols in columns.items()
            ]

        tables: list[TableInfo] = await self._in_readonly_transaction(read)
        return SchemaInfo(self.db_id, "postgres", _describe(tables, self.descriptions), cfg.description)

    async def _samples(self, conn: Any, table: str, column: str) -> tuple[Scalar, ...]:
        """Up to ``sample_values`` distinct values, the smallest among the first rows of the table.

        Runs in a savepoint: a column whose type has no equality or order (json, xml, ...) or a scan
        that hits the statement timeout costs its samples, nothing more."""
        c = _quote_ident(column)
        t = f"{_quote_ident(self.config.db_schema)}.{_quote_ident(table)}"
        sql = (
            f"SELECT DISTINCT {c} FROM (SELECT {c} FROM {t} WHERE {c} IS NOT NULL LIMIT {_SAMPLE_SCAN_ROWS}) AS _s "
            f"ORDER BY 1 LIMIT {self.config.sample_values}"
        )
        try:
            async with conn.transaction():
                rows = await conn.fetch(sql)
        except asyncpg.PostgresError as exc:
            if isinstance(exc, asyncpg.PostgresConnectionError):
                raise
            return ()
        return tuple(_sample(r[0]) for r in rows)

    async def close(self) -> None:
        """Close the pool (a later query creates a new one)."""
        async with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()


def open_database(
    db_id: str,
    config: DatabaseConfig,
    *,
    base_dir: Path | str | None = None,
    descriptions: Descriptions | None = None,
) -> Database:
    """The ``Database`` for ``config``'s dialect (no I/O: files and servers are opened on first use)."""
    if config.dialect == "sqlite":
        return SqliteDatabase(db_id, config, base_dir=base_dir, descriptions=descriptions)
    return PostgresDatabase(db_id, config, descriptions=descriptions)


class DatabaseRegistry:
    """The databases of a databases file by db_id; each ``Database`` is created on first ``get``."""

    def __init__(
        self,
        config: DatabasesFile,
        *,
        base_dir: Path | str | None = None,
        descriptions: Mapping[str, Descriptions] | None = None,
    ) -> None:
        """``base_dir`` resolves relative SQLite paths (``load_databases`` already made them absolute);
        ``descriptions`` maps db_id -> table -> column -> description."""
        self._configs = dict(config.databases)
        self._base_dir = base_dir
        self._descriptions = dict(descriptions or {})
        self._open: dict[str, Database] = {}

    @classmethod
    def from_file(cls, path: Path | str, *, descriptions: Mapping[str, Descriptions] | None = None) -> DatabaseRegistry:
        """A registry of the databases file at ``path`` (``ConfigError`` when it is invalid)."""
        return cls(load_databases(path), base_dir=Path(path).resolve().parent, descriptions=descriptions)

    def ids(self) -> list[str]:
        """The db_ids, sorted."""
        return sorted(self._configs)

    def __contains__(self, db_id: object) -> bool:
        return db_id in self._configs

    def config(self, db_id: str) -> DatabaseConfig:
        """The configuration of ``db_id`` (``UnknownDatabase`` when there is none)."""
        try:
            return self._configs[db_id]
        except KeyError:
            raise UnknownDatabase(db_id, self._configs) from None

    def get(self, db_id: str) -> Database:
        """The database ``db_id``, created on the first call and cached; ``UnknownDatabase`` if unknown."""
        db = self._open.get(db_id)
        if db is None:
            db = open_database(
                db_id, self.config(db_id), base_dir=self._base_dir, descriptions=self._descriptions.get(db_id)
            )
            self._open[db_id] = db
        return db

    async def close(self) -> None:
        """Close every database created so far."""
        opened, self._open = list(self._open.values()), {}
        for db in opened:
            await db.close()
