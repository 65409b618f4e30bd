r"""Read-only access to the databases the Text-to-SQL pipeline queries: SQLite files and PostgreSQL.

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

Every query passes ``check_sql`` (one read-only statement) and then runs behind engine-side walls that
hold on their own (tested with the check switched off): SQLite files are opened with ``mode=ro`` (plus
``query_only`` and an authorizer that allows only reads and function calls); PostgreSQL queries run as
a least-privilege role (checked when the pool is created: ``pgrole``; the recipe is
``deploy/postgres/reader-role.sql``) in ``READ ONLY`` transactions that are always rolled back. Each
query has a statement timeout (SQLite: also a watchdog thread that interrupts one long VM step), a row
cap and a byte cap that holds before memory is spent (SQLite: ``SQLITE_LIMIT_LENGTH``; PostgreSQL: the
server blanks rows past the cap), and rows are converted to JSON-safe values off the event loop.

Models and results:
    DatabaseConfig, DatabasesFile, load_databases(path)        the YAML file
    QueryResult                                                 rows as JSON-safe values
    ColumnInfo, ForeignKey, TableInfo, SchemaInfo               introspected schema
    serialize_schema(schema, max_chars=None)                    the schema as prompt text

Databases:
    Database (abstract), SqliteDatabase, PostgresDatabase, open_database(db_id, config, ...)
    DatabaseRegistry                                            db_id -> Database, created lazily;
                                                                check(): each one usable, or why not

Errors:
    QueryFailed(kind="error"|"timeout"|"too_large"), DatabaseUnavailable, UnknownDatabase, SqlRejected
    (``GatewayError``\ s with their HTTP status: 422/504/422, 503, 404, 400)

Modules: ``schema`` (schema models and prompt text), ``results`` (rows and caps), ``base`` (``Database``),
``sqlite``, ``postgres``, ``pgrole`` (the PostgreSQL role check), ``registry``, ``errors``; this package
re-exports their public names.
"""

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
