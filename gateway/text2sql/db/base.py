"""``Database`` (what the pipeline may ask of a database), what a query returns (``QueryResult``, the capped
row collector) and the database layer's errors. ``SqlRejected`` (400) is in ``sqlsafe``."""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from gateway.config.databases import DatabaseConfig, Dialect
from gateway.errors import GatewayError, UnknownNameError
from gateway.text2sql.db.schema import Descriptions, SchemaInfo, TableInfo, describe, json_value
from gateway.text2sql.sqlsafe import check_sql

_FETCH_CHUNK = 256  # rows fetched from a cursor at a time


class QueryFailed(GatewayError):
    """The engine refused or aborted a query that passed the static check: ``kind`` ``"timeout"`` (504),
    ``"too_large"`` (a value or row over ``max_result_bytes``, 422) or ``"error"`` (422)."""

    status = 422
    error_type = "invalid_request_error"

    def __init__(self, kind: Literal["error", "timeout", "too_large"], message: str) -> None:
        self.kind = kind
        if kind == "timeout":
            self.status = 504
            self.error_type = "timeout_error"
        super().__init__(message)


class DatabaseUnavailable(GatewayError):
    """A database cannot be opened or reached (503); the message names the database and the cause."""

    status = 503
    error_type = "service_unavailable"


class UnknownDatabase(UnknownNameError, KeyError):
    """A db_id not configured or not allowed to the tenant (404); ``message`` replaces the default text."""

    status = 404
    error_type = "not_found_error"
    param = "db_id"

    def __init__(self, db_id: str, known: Iterable[str], *, message: str | None = None) -> None:
        super().__init__("database", db_id, list(known))
        if message is not None:
            self.args = (message,)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class QueryResult:
    """Rows of one query as JSON-safe values; ``truncated``: a cap cut the result (more rows existed)."""

    columns: list[str]
    rows: list[list[Any]]
    row_count: int
    truncated: bool
    elapsed_s: float


def too_large(max_bytes: int) -> QueryFailed:
    """The error for a value or one row over the byte cap."""
    return QueryFailed(
        "too_large", f"a value or a single row of the result is larger than the limit of {max_bytes} bytes"
    )


class CappedRows:
    """Collects converted rows up to the row and byte caps: a row that does not fit truncates the result; a
    first row alone over the byte cap raises ``too_large``."""

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
                if not self.rows:
                    raise too_large(self.max_bytes)
                self.truncated = True
                return
            self.rows.append(row)
            self.size += n

    def result(self, start: float) -> QueryResult:
        """The rows collected so far, ``elapsed_s`` counted from ``start`` (``time.perf_counter``)."""
        return QueryResult(self.columns, self.rows, len(self.rows), self.truncated, time.perf_counter() - start)


@dataclass(eq=False, repr=False)  # the default repr: a repr of the config would show its URL's password
class Database(ABC):
    """A database the pipeline may query: read-only, time- and size-limited, schema cached. ``base_dir``
    resolves a relative SQLite path; ``descriptions``: table -> column -> description."""

    dialect: ClassVar[Dialect]
    db_id: str
    config: DatabaseConfig
    _: KW_ONLY
    base_dir: Path | str | None = None
    descriptions: Descriptions | None = None
    _schema: SchemaInfo | None = field(default=None, init=False)
    _schema_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    async def execute(self, sql: str) -> QueryResult:
        """Check ``sql`` (``SqlRejected``), then run it; ``QueryFailed``, ``DatabaseUnavailable``."""
        return await self._run(
            check_sql(sql, self.dialect, schemas=(self.config.db_schema, *self.config.allow_schemas))
        )

    async def check(self) -> None:
        """Open the database as a query would (PostgreSQL: connect, check the role) and run ``SELECT 1``;
        ``DatabaseUnavailable`` says why it cannot be used."""
        try:
            await self._run("SELECT 1")
        except QueryFailed as exc:
            raise DatabaseUnavailable(f"database {self.db_id!r}: SELECT 1 failed: {exc}") from None

    @abstractmethod
    async def _run(self, sql: str) -> QueryResult:
        """Run ``sql`` without the static check (the engine-side read-only barrier still holds)."""

    async def schema(self) -> SchemaInfo:
        """The database's schema, introspected on the first call and cached."""
        async with self._schema_lock:
            if self._schema is None:
                self._schema = await self._introspect()
            return self._schema

    @abstractmethod
    async def _introspect(self) -> SchemaInfo:
        """Read the schema from the database."""

    def _schema_of(self, tables: list[TableInfo]) -> SchemaInfo:
        return SchemaInfo(self.db_id, self.dialect, describe(tables, self.descriptions), self.config.description)

    async def close(self) -> None:  # noqa: B027 - SQLite holds nothing open between queries
        """Release connections (a later query opens new ones)."""

    def _timeout_message(self) -> str:
        return f"statement timed out after {self.config.statement_timeout_s:g} s"
