"""Read-only access to the databases the Text-to-SQL pipeline queries, SQLite files and PostgreSQL (the
databases file and the engine-side walls: docs/text2sql.md, "Databases"): ``open_database`` (a config -> the
``Database`` of its dialect), ``DatabaseRegistry`` (db_id -> Database) and the names of the submodules."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.config.databases import DatabaseConfig, DatabasesFile, load_databases
from gateway.text2sql.db.base import Database, DatabaseUnavailable, QueryFailed, QueryResult, UnknownDatabase
from gateway.text2sql.db.postgres import PostgresDatabase
from gateway.text2sql.db.schema import (
    ColumnInfo,
    Descriptions,
    ForeignKey,
    SchemaInfo,
    TableInfo,
    json_value,
    serialize_schema,
)
from gateway.text2sql.db.sqlite import SqliteDatabase

__all__ = [
    "ColumnInfo",
    "Database",
    "DatabaseConfig",
    "DatabaseRegistry",
    "DatabaseUnavailable",
    "DatabasesFile",
    "ForeignKey",
    "PostgresDatabase",
    "QueryFailed",
    "QueryResult",
    "SchemaInfo",
    "SqliteDatabase",
    "TableInfo",
    "UnknownDatabase",
    "json_value",
    "load_databases",
    "open_database",
    "serialize_schema",
]


def open_database(db_id: str, config: DatabaseConfig, **options: Any) -> Database:
    """The ``Database`` for ``config``'s dialect (no I/O: files and servers are opened on first use); ``options``:
    ``Database``'s ``base_dir`` and ``descriptions``."""
    kind = SqliteDatabase if config.dialect == "sqlite" else PostgresDatabase
    return kind(db_id, config, **options)


class DatabaseRegistry:
    """The databases of a databases file by db_id; each ``Database`` is created on first ``get``."""

    def __init__(
        self,
        config: DatabasesFile,
        *,
        base_dir: Path | str | None = None,
        descriptions: Mapping[str, Descriptions] | None = None,
    ) -> None:
        """``base_dir`` resolves relative SQLite paths; ``descriptions``: db_id -> table -> column -> text."""
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

    def config(self, db_id: str) -> DatabaseConfig:
        """The configuration of ``db_id`` (``UnknownDatabase`` when there is none)."""
        try:
            return self._configs[db_id]
        except KeyError:
            raise UnknownDatabase(db_id, self._configs) from None

    def get(self, db_id: str) -> Database:
        """The database ``db_id``, created on the first call and cached; ``UnknownDatabase`` if unknown."""
        if db_id not in self._open:
            config, descriptions = self.config(db_id), self._descriptions.get(db_id)
            self._open[db_id] = open_database(db_id, config, base_dir=self._base_dir, descriptions=descriptions)
        return self._open[db_id]

    async def check(self) -> dict[str, str | None]:
        """Open every database as a query would (``Database.check``), all at once: db_id -> None when it
        can be used, else the reason it is unavailable (for PostgreSQL: down, or a role refused)."""

        async def one(db_id: str) -> str | None:
            try:
                await self.get(db_id).check()
            except DatabaseUnavailable as exc:
                return str(exc)
            return None

        results = await asyncio.gather(*(one(db_id) for db_id in self.ids()))
        return dict(zip(self.ids(), results, strict=True))

    async def close(self) -> None:
        """Close every database created so far."""
        opened, self._open = list(self._open.values()), {}
        for db in opened:
            await db.close()
