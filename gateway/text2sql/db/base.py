"""``Database``: what the pipeline may ask of a database (check and run a query, read the schema, close)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from gateway.config.databases import DatabaseConfig, Dialect
from gateway.text2sql.db.errors import DatabaseUnavailable, QueryFailed
from gateway.text2sql.db.results import QueryResult
from gateway.text2sql.db.schema import Descriptions, SchemaInfo, TableInfo, describe
from gateway.text2sql.sqlsafe import check_sql


class Database(ABC):
    """A database the pipeline may query: read-only, time- and size-limited, schema cached."""

    dialect: ClassVar[Dialect]

    def __init__(
        self,
        db_id: str,
        config: DatabaseConfig,
        *,
        base_dir: Path | str | None = None,
        descriptions: Descriptions | None = None,
    ) -> None:
        """``base_dir`` resolves a relative SQLite path; ``descriptions``: table -> column -> description."""
        self.db_id = db_id
        self.config = config
        self.base_dir = base_dir
        self.descriptions = descriptions
        self._schema: SchemaInfo | None = None
        self._schema_lock = asyncio.Lock()

    async def execute(self, sql: str) -> QueryResult:
        """Check ``sql`` with ``check_sql`` (``SqlRejected``), then run it.

        Raises ``QueryFailed`` (engine error or timeout) and ``DatabaseUnavailable``.
        """
        return await self._run(
            check_sql(sql, self.dialect, schemas=(self.config.db_schema, *self.config.allow_schemas))
        )

    async def check(self) -> None:
        """Open the database as a query would (for PostgreSQL: connect and check the role) and run
        ``SELECT 1``; ``DatabaseUnavailable`` says why it cannot be used."""
        try:
            await self._run("SELECT 1")
        except QueryFailed as exc:
            raise DatabaseUnavailable(f"database {self.db_id!r}: SELECT 1 failed: {exc}") from None

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

    def _schema_of(self, tables: list[TableInfo]) -> SchemaInfo:
        return SchemaInfo(self.db_id, self.dialect, describe(tables, self.descriptions), self.config.description)

    async def close(self) -> None:  # noqa: B027 - SQLite holds nothing open between queries
        """Release connections (a later query opens new ones)."""

    def _timeout_message(self) -> str:
        return f"statement timed out after {self.config.statement_timeout_s:g} s"
