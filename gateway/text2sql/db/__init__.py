"""Read-only access to the databases the Text-to-SQL pipeline queries: SQLite files and PostgreSQL.

The databases file (``databases: {db_id: {url, schema, statement_timeout_s, ...}}``; SQLite URLs as
SQLAlchemy's, relative to the file's folder) and the engine-side walls: docs/text2sql.md ("Databases").
Modules: ``schema``, ``results``, ``base`` (``Database``), ``sqlite``, ``postgres``, ``pgrole``,
``registry``, ``errors``; this package re-exports their public names."""

from gateway.config.databases import DatabaseConfig, DatabasesFile, Dialect, load_databases
from gateway.text2sql.db.base import Database
from gateway.text2sql.db.errors import DatabaseUnavailable, QueryFailed, UnknownDatabase
from gateway.text2sql.db.postgres import PostgresDatabase
from gateway.text2sql.db.registry import DatabaseRegistry, open_database
from gateway.text2sql.db.results import QueryResult, json_value
from gateway.text2sql.db.schema import ColumnInfo, Descriptions, ForeignKey, SchemaInfo, TableInfo, serialize_schema
from gateway.text2sql.db.sqlite import SqliteDatabase
from gateway.text2sql.sqlsafe import SqlRejected

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
