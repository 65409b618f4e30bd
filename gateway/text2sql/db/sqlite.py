"""SQLite databases: a file opened read-only behind an authorizer, one connection per query in a worker thread,
strings capped, the statement timeout held twice (docs/text2sql.md, "Databases")."""

from __future__ import annotations

import asyncio
import itertools
import math
import re
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import quote

from gateway.config.databases import Dialect
from gateway.text2sql.db.base import CappedRows, Database, DatabaseUnavailable, QueryFailed, QueryResult, too_large
from gateway.text2sql.db.schema import ColumnInfo, ForeignKey, Scalar, SchemaInfo, TableInfo, quote_ident, sample_value
from gateway.text2sql.sqlsafe import is_dangerous_function

_ALLOWED_ACTIONS: frozenset[int] = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
"""Authorizer actions a query may take; every other one (writes, DDL, ATTACH, PRAGMA, BEGIN...) is denied."""

_SQLITE_TOOBIG = 18


def _sqlite_authorizer(action: int, arg1: str | None, arg2: str | None, _db: str | None, _src: str | None) -> int:
    """Allow reads, recursion and function calls (not those ``is_dangerous_function`` names); deny the rest."""
    if action not in _ALLOWED_ACTIONS:
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


class _Watchdog:
    """Calls ``conn.interrupt()`` from a timer thread at the deadline (it stops even one long VM step, which
    the progress handler cannot); ``stop()`` before closing, under a lock."""

    def __init__(self, conn: sqlite3.Connection, seconds: float) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._active = True
        self.fired = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._active:
                self.fired = True
                self._conn.interrupt()

    def stop(self) -> None:
        with self._lock:
            self._active = False
        self._timer.cancel()


_PRINTF_SPEC = re.compile(r"%[-+ 0#,!]*(\*|\d*)(?:\.(\*|\d*))?l{0,2}([a-zA-Z%])")
_helper = threading.local()


class _BoundedPrintf:
    """``printf``/``format`` refusing widths and precisions over the length limit (SQLite 3.40 spends seconds
    in ``printf('%.*c', 2000000000, 'x')``, one step ``interrupt()`` cannot stop); other calls go to the
    built-in of a private in-memory connection of the thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.tripped = False

    def __call__(self, fmt: object = None, *args: object) -> str | None:
        if isinstance(fmt, str):
            self._check(fmt, args)
        conn: sqlite3.Connection | None = getattr(_helper, "conn", None)
        if conn is None:
            conn = sqlite3.connect(":memory:", check_same_thread=True)
            _helper.conn = conn
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.limit)
        marks = ", ".join("?" * (1 + len(args)))
        value = conn.execute(f"SELECT printf({marks})", (fmt, *args)).fetchone()[0]
        return None if value is None else str(value)

    def _check(self, fmt: str, args: Sequence[object]) -> None:
        pos = 0
        for m in _PRINTF_SPEC.finditer(fmt):
            for part in m.group(1), m.group(2):
                if part == "*":
                    value = args[pos] if pos < len(args) else 0
                    pos += 1
                    n = abs(int(value)) if isinstance(value, int | float) and math.isfinite(value) else 0
                else:
                    n = int(part) if part else 0
                if n > self.limit:
                    self.tripped = True
                    raise ValueError("printf width or precision over the length limit")
            if m.group(3) != "%":
                pos += 1


class SqliteDatabase(Database):
    """A SQLite file opened read-only; each query uses its own connection in a worker thread."""

    dialect: ClassVar[Dialect] = "sqlite"

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self.config.sqlite_path(self.base_dir)

    def _connect(self) -> tuple[sqlite3.Connection, _Deadline]:
        """A read-only connection and its deadline (call in the thread that will use it)."""
        if not self.path.is_file():
            raise DatabaseUnavailable(f"database {self.db_id!r}: SQLite file {self.path} does not exist")
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(f"file:{quote(str(self.path))}?mode=ro", uri=True, isolation_level=None)
            conn.text_factory = decode_text
            conn.execute("PRAGMA query_only = ON")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            raise DatabaseUnavailable(f"database {self.db_id!r}: cannot open SQLite file {self.path}: {exc}") from None
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.config.max_result_bytes)
        deadline = _Deadline()
        conn.set_progress_handler(deadline, 1000)
        return conn, deadline

    async def _run(self, sql: str) -> QueryResult:
        return await asyncio.to_thread(self._run_sync, sql)

    def _run_sync(self, sql: str) -> QueryResult:
        start = time.perf_counter()
        cfg = self.config
        conn, deadline = self._connect()
        try:
            conn.set_authorizer(_sqlite_authorizer)
            deadline.start(cfg.statement_timeout_s)
            printf = _BoundedPrintf(cfg.max_result_bytes)
            conn.create_function("printf", -1, printf)
            conn.create_function("format", -1, printf)
            watchdog = _Watchdog(conn, cfg.statement_timeout_s)
            try:
                cur = conn.execute(sql)
                rows = CappedRows([d[0] for d in cur.description or ()], cfg.max_rows, cfg.max_result_bytes)
                while (n := rows.want()) and (batch := cur.fetchmany(n)):
                    rows.add(batch)
                return rows.result(start)
            except sqlite3.DataError:  # SQLITE_TOOBIG: a string or blob over SQLITE_LIMIT_LENGTH
                raise too_large(cfg.max_result_bytes) from None
            except (sqlite3.Error, sqlite3.Warning) as exc:
                if deadline.fired or watchdog.fired:
                    raise QueryFailed("timeout", self._timeout_message()) from None
                if printf.tripped or getattr(exc, "sqlite_errorcode", None) == _SQLITE_TOOBIG:
                    raise too_large(cfg.max_result_bytes) from None
                raise QueryFailed("error", str(exc) or type(exc).__name__) from None
            finally:
                watchdog.stop()
        finally:
            conn.close()

    async def _introspect(self) -> SchemaInfo:
        return await asyncio.to_thread(self._introspect_sync)

    def _introspect_sync(self) -> SchemaInfo:
        conn, deadline = self._connect()
        try:
            try:
                objects = conn.execute(
                    "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
                    "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
                ).fetchall()
                raw: list[tuple[str, list[Any], list[Any], Literal["table", "view"]]] = [
                    (
                        name,
                        conn.execute("SELECT * FROM pragma_table_info(?) ORDER BY cid", (name,)).fetchall(),
                        conn.execute("SELECT * FROM pragma_foreign_key_list(?) ORDER BY id, seq", (name,)).fetchall(),
                        "view" if type_ == "view" else "table",
                    )
                    for name, type_ in objects
                ]
            except sqlite3.Error as exc:
                raise QueryFailed("error", f"cannot read the schema of {self.db_id!r}: {exc}") from None
            pks = {
                name.lower(): tuple(c[1] for c in sorted((c for c in cols if c[5]), key=lambda c: c[5]))
                for name, cols, _, _ in raw
            }
            tables: list[TableInfo] = []
            for name, cols, fk_rows, kind in raw:
                columns = []
                for _cid, col, ctype, notnull, _default, pk_pos in cols:
                    samples = self._samples(conn, deadline, name, col)
                    columns.append(ColumnInfo(col, ctype or "", bool(pk_pos), not notnull and not pk_pos, samples))
                tables.append(
                    TableInfo(name, tuple(columns), pks[name.lower()], _foreign_keys(fk_rows, pks), kind=kind)
                )
            return self._schema_of(tables)
        finally:
            conn.close()

    def _samples(self, conn: sqlite3.Connection, deadline: _Deadline, table: str, column: str) -> tuple[Scalar, ...]:
        if not self.config.sample_values:
            return ()
        c, t = quote_ident(column), quote_ident(table)
        deadline.start(self.config.statement_timeout_s)
        try:
            rows = conn.execute(
                f"SELECT DISTINCT {c} FROM {t} WHERE {c} IS NOT NULL LIMIT {self.config.sample_values}"
            ).fetchall()
        except sqlite3.Error:
            return ()
        return tuple(sample_value(r[0]) for r in rows)


def decode_text(data: bytes) -> str:
    """SQLite TEXT as str; invalid UTF-8 (present in some public datasets) is replaced, not fatal."""
    return data.decode("utf-8", errors="replace")


def _foreign_keys(rows: Sequence[Sequence[Any]], pks: Mapping[str, tuple[str, ...]]) -> tuple[ForeignKey, ...]:
    """``PRAGMA foreign_key_list`` rows (id, seq, table, from, to, ...; ordered by id, seq) grouped into keys."""
    out = []
    for _, group in itertools.groupby(rows, key=lambda r: int(r[0])):
        parts = list(group)
        ref_table = str(parts[0][2])
        ref_cols: tuple[str, ...] = tuple(str(r[4]) for r in parts if r[4] is not None)
        if len(ref_cols) != len(parts):  # "REFERENCES t" without columns: the parent's primary key
            ref_cols = pks.get(ref_table.lower(), ())
        out.append(ForeignKey(tuple(str(r[3]) for r in parts), ref_table, ref_cols))
    return tuple(out)
