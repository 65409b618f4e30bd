"""PostgreSQL databases: an asyncpg pool of a role ``role_problems`` accepts (the gateway refuses to query as a
role that can do more than read: docs/text2sql.md, "PostgreSQL: the reader role, enforced";
``deploy/postgres/reader-role.sql``), every query in a rolled-back ``READ ONLY`` transaction with a statement
timeout, capped by the server (``capped_query``) (docs/text2sql.md, "Databases")."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Literal

import asyncpg

from gateway.config.databases import Dialect
from gateway.text2sql.db.base import CappedRows, Database, DatabaseUnavailable, QueryFailed, QueryResult, too_large
from gateway.text2sql.db.schema import ColumnInfo, ForeignKey, Scalar, SchemaInfo, TableInfo, quote_ident, sample_value

_CONNECT_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)
_SAMPLE_SCAN_ROWS = 10_000  # samples come from at most this many rows of a table


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

DANGEROUS_ROLES: dict[str, str] = {
    "pg_read_server_files": "reads files on the database server",
    "pg_write_server_files": "writes files on the database server",
    "pg_execute_server_program": "runs programs on the database server",
    "pg_signal_backend": "cancels and terminates other sessions",
    "pg_read_all_data": "reads every table, whatever its grants",
    "pg_write_all_data": "writes every table, whatever its grants",
    "pg_read_all_settings": "reads every server setting (data_directory, ...)",
    "pg_read_all_stats": "reads every session's query text and server statistics",
    "pg_monitor": "reads every setting and every session's query text",
}
"""Predefined roles a Text-to-SQL reader may not be a member of -> what each would let a query do."""

_ATTRIBUTES: dict[str, str] = {
    "rolsuper": "is a superuser",
    "rolbypassrls": "has BYPASSRLS (row-level security would not apply)",
    "rolcreaterole": "has CREATEROLE (it could grant itself server-file and server-program roles)",
    "rolreplication": "has REPLICATION (it could create replication slots that hold WAL forever)",
}

ROLE_QUERY = """
SELECT r.rolname, r.rolname = session_user AS is_self,
       r.rolsuper, r.rolbypassrls, r.rolcreaterole, r.rolreplication
FROM pg_roles r
WHERE pg_has_role(session_user, r.oid, 'MEMBER')
ORDER BY r.rolname = session_user DESC, r.rolname
"""
"""The login role and every role it is a member of, with the attributes ``role_problems`` judges."""


def role_problems(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """What disqualifies the login role, from the rows of ``ROLE_QUERY`` (empty: it may be used); an attribute
    of a role it is a member of (NOINHERIT included) counts as its own, ``SET ROLE`` reaches it."""
    problems: list[str] = []
    for row in rows:
        name = str(row["rolname"])
        if row["is_self"] and row["rolsuper"]:
            return [_ATTRIBUTES["rolsuper"]]  # a superuser is a member of every role: the rest is noise
        via = "" if row["is_self"] else f" through membership of {name!r}"
        problems.extend(f"{text}{via}" for attr, text in _ATTRIBUTES.items() if row[attr])
        if name in DANGEROUS_ROLES:
            problems.append(f"is a member of {name} ({DANGEROUS_ROLES[name]})")
    return list(dict.fromkeys(problems))


_SIZE_COLUMN = "_hexflow_running_size"


def capped_query(sql: str, columns: int, max_bytes: int) -> str:
    """``sql`` wrapped so that the server sends no row data past ``max_bytes`` of text in all: the first column
    is the running total of ``octet_length(row::text)``, the others (renamed ``c1..cn``) NULL once it is
    past ``max_bytes``. The newline before the closing parenthesis ends a trailing ``--`` comment."""
    names = [f"c{i}" for i in range(1, columns + 1)]
    alias = f"q({', '.join(names)})" if names else "q"
    values = "".join(f", CASE WHEN w.{_SIZE_COLUMN} <= {max_bytes} THEN w.{n} END" for n in names)
    return (
        f"SELECT w.{_SIZE_COLUMN}{values} FROM ("
        f"SELECT q.*, sum(octet_length(q::text)) OVER (ROWS UNBOUNDED PRECEDING) AS {_SIZE_COLUMN} "
        f"FROM (\n{sql}\n) AS {alias}) AS w"
    )


def _convert(rows: CappedRows, batch: list[Any], max_bytes: int) -> bool:
    """Add ``batch`` (rows of ``capped_query``) to ``rows``; False once the server blanked a row (run in a worker
    thread: conversion never holds the event loop)."""
    kept: list[tuple[Any, ...]] = []
    over = False
    for r in batch:
        if r[0] is not None and r[0] > max_bytes:
            over = True
            break
        kept.append(tuple(r)[1:])
    rows.add(kept)
    if over and not rows.truncated:
        if not rows.rows:
            raise too_large(max_bytes)
        rows.truncated = True
    return not rows.truncated


class _RollBack(Exception):
    """Leaves the transaction block by rolling it back, carrying the result out."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self.result = result


class PostgresDatabase(Database):
    """A PostgreSQL database behind an asyncpg pool (created on first use, at most ``pool_size``)."""

    dialect: ClassVar[Dialect] = "postgres"
    _pool: Any = None

    @functools.cached_property
    def _pool_lock(self) -> asyncio.Lock:
        return asyncio.Lock()

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
                            # Unqualified names resolve in the configured schema(s) only, as the static
                            # check assumes (pg_catalog is always searched first by the server).
                            "search_path": ", ".join(
                                quote_ident(s) for s in (self.config.db_schema, *self.config.allow_schemas)
                            ),
                        },
                    )
                except (*_CONNECT_ERRORS, ValueError) as exc:
                    raise self._unavailable(exc) from None
                try:
                    await self._check_role(self._pool)
                except BaseException:
                    pool, self._pool = self._pool, None
                    await pool.close()
                    raise
            return self._pool

    async def _check_role(self, pool: Any) -> None:
        """``DatabaseUnavailable`` unless the login role is a least-privilege reader (``role_problems``)."""
        try:
            async with pool.acquire() as conn:
                role = str(await conn.fetchval("SELECT session_user"))
                problems = role_problems(await conn.fetch(ROLE_QUERY))
        except _CONNECT_ERRORS as exc:
            raise self._unavailable(exc) from None
        if problems:
            raise DatabaseUnavailable(
                f"database {self.db_id!r}: refusing to query as role {role!r}: it {'; it '.join(problems)}. "
                "Connect as a least-privilege reader (deploy/postgres/reader-role.sql)"
            )

    async def _in_readonly_transaction(self, fn: Callable[[Any], Any]) -> Any:
        """``await fn(conn)`` in a READ ONLY transaction with the statement timeout, always rolled back (what a
        read-only transaction may still do, ``lo_from_bytea``, ``pg_notify``, leaves no trace). Errors become
        ``QueryFailed``/``DatabaseUnavailable``; a client timeout 2 s later backs the server's up."""
        timeout = self.config.statement_timeout_s
        ms = max(1, round(timeout * 1000))

        async def body(conn: Any) -> Any:
            try:
                async with conn.transaction(readonly=True):
                    await conn.execute(f"SET LOCAL statement_timeout = {ms}")
                    raise _RollBack(await fn(conn))
            except _RollBack as done:
                return done.result

        pool = await self._get_pool()
        try:
            conn = await pool.acquire()
        except _CONNECT_ERRORS as exc:
            raise self._unavailable(exc) from None
        try:
            return await asyncio.wait_for(body(conn), timeout + 2.0)
        except (TimeoutError, asyncpg.QueryCanceledError):
            raise QueryFailed("timeout", self._timeout_message()) from None
        except (asyncpg.PostgresConnectionError, OSError) as exc:
            raise self._unavailable(exc) from None
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise QueryFailed("error", str(exc) or type(exc).__name__) from None
        finally:
            await pool.release(conn)

    async def _run(self, sql: str) -> QueryResult:
        start = time.perf_counter()
        cfg = self.config

        async def query(conn: Any) -> QueryResult:
            names = [str(a.name) for a in (await conn.prepare(sql)).get_attributes()]
            stmt = await conn.prepare(capped_query(sql, len(names), cfg.max_result_bytes))
            rows = CappedRows(names, cfg.max_rows, cfg.max_result_bytes)
            cursor = await stmt.cursor()
            while (n := rows.want()) and (batch := await cursor.fetch(n)):
                if not await asyncio.to_thread(_convert, rows, batch, cfg.max_result_bytes):
                    break
            return rows.result(start)

        result: QueryResult = await self._in_readonly_transaction(query)
        return result

    async def _introspect(self) -> SchemaInfo:
        schema = self.config.db_schema

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
                in_pk, samples = attname in pks.get(relname, ()), await self._samples(conn, relname, attname)
                columns.setdefault(relname, []).append(ColumnInfo(attname, typ, in_pk, not notnull, samples))
                kinds[relname] = "view" if relkind in ("v", "m") else "table"
            return [
                TableInfo(name, tuple(cols), pks.get(name, ()), tuple(fks.get(name, ())), kind=kinds[name])
                for name, cols in columns.items()
            ]

        return self._schema_of(await self._in_readonly_transaction(read))

    async def _samples(self, conn: Any, table: str, column: str) -> tuple[Scalar, ...]:
        """Up to ``sample_values`` distinct values, the smallest among the first rows of the table; in a savepoint,
        so a column without equality or order (json, ...) or a scan past the timeout costs only its samples."""
        if not self.config.sample_values:
            return ()
        c = quote_ident(column)
        t = f"{quote_ident(self.config.db_schema)}.{quote_ident(table)}"
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
        return tuple(sample_value(r[0]) for r in rows)

    async def close(self) -> None:
        """Close the pool (a later query creates a new one)."""
        async with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
