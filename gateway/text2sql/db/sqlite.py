"""SQLite databases: a file opened read-only, one connection per query in a worker thread.

The second wall behind ``check_sql``: ``mode=ro``, ``PRAGMA query_only``, no attached databases, and an
authorizer that refuses ``ATTACH``/``DETACH``/``PRAGMA`` and dangerous functions; a progress handler
enforces the statement timeout.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import quote

from gateway.config.databases import DatabaseConfig, Dialect
from gateway.text2sql.db.base import Database
from gateway.text2sql.db.errors import DatabaseUnavailable, QueryFailed
from gateway.text2sql.db.results import CappedRows, QueryResult
from gateway.text2sql.db.schema import (
    ColumnInfo,
    Descriptions,
    ForeignKey,
    Scalar,
    SchemaInfo,
    TableInfo,
    describe,
    quote_ident,
    sample_value,
)
from gateway.text2sql.sqlsafe import is_dangerous_function


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
                rows = CappedRows([d[0] for d in cur.description or ()], cfg.max_rows, cfg.max_result_bytes)
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
        return SchemaInfo(self.db_id, "sqlite", describe(tables, self.descriptions), cfg.description)

    def _samples(self, conn: sqlite3.Connection, deadline: _Deadline, table: str, column: str) -> tuple[Scalar, ...]:
        c, t = quote_ident(column), quote_ident(table)
        deadline.start(self.config.statement_timeout_s)
        try:
            rows = conn.execute(
                f"SELECT DISTINCT {c} FROM {t} WHERE {c} IS NOT NULL LIMIT {self.config.sample_values}"
            ).fetchall()
        except sqlite3.Error:
            return ()
        return tuple(sample_value(r[0]) for r in rows)


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
