"""Defence in depth: with the static SQL check switched off, the engines still refuse every write.

``check_sql`` is monkeypatched to accept any text, and a table of attacks (writes, DDL, transaction
control, file access, settings, other schemas) goes through ``Database.execute``: SQLite (``mode=ro``,
``query_only``, the authorizer's allowlist) and PostgreSQL (the least-privilege reader role of
``deploy/postgres/reader-role.sql``, a READ ONLY transaction, the size-capping wrapper) each refuse it,
and the data and the file system are unchanged afterwards. For PostgreSQL the same table also runs
*without* the wrapper, straight in the READ ONLY transaction, so the role and the transaction are shown
to hold on their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import gateway.text2sql.db.base as db_base
from gateway.text2sql.db import DatabaseConfig, PostgresDatabase, QueryFailed, SqliteDatabase
from tests.text2sql.conftest import PgTestDb
from tests.text2sql.test_db import PG_SETUP, digest, make_sqlite, pg_exec


@pytest.fixture
def no_static_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """``check_sql`` accepts everything: only the engine-side walls remain."""
    monkeypatch.setattr(db_base, "check_sql", lambda sql, *_args, **_kwargs: sql)


# ---------------------------------------------------------------------------------------------- SQLite

SQLITE_ATTACKS = [
    "INSERT INTO emp (id, name) VALUES (99, 'Eve')",
    "REPLACE INTO dept VALUES (1, 'X')",
    "UPDATE emp SET salary = 0",
    "DELETE FROM emp",
    "WITH x AS (SELECT 1) DELETE FROM emp",
    "DROP TABLE emp",
    "DROP VIEW rich",
    "CREATE TABLE x (a int)",
    "CREATE TEMP TABLE x (a int)",
    "CREATE TEMP VIEW v AS SELECT 1",
    "CREATE TEMP TRIGGER t AFTER INSERT ON emp BEGIN SELECT 1; END",
    "CREATE VIRTUAL TABLE temp.f USING fts5(a)",
    "ALTER TABLE emp ADD COLUMN z int",
    "ALTER TABLE emp RENAME TO emp2",
    "CREATE INDEX i ON emp(name)",
    "VACUUM",
    "VACUUM INTO '{dir}/vacuumed.sqlite'",
    "REINDEX",
    "ANALYZE",
    "PRAGMA user_version = 7",
    "PRAGMA writable_schema = ON",
    "PRAGMA query_only = OFF",
    "SELECT * FROM pragma_query_only",
    "ATTACH DATABASE '{dir}/attached.sqlite' AS m",
    "DETACH DATABASE main",
    "BEGIN IMMEDIATE",
    "SAVEPOINT s",
    "SELECT load_extension('{dir}/evil')",
    "SELECT fts3_tokenizer('simple')",
]


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    return make_sqlite(tmp_path / "shop.sqlite")


@pytest.mark.usefixtures("no_static_check")
@pytest.mark.parametrize("attack", SQLITE_ATTACKS)
async def test_sqlite_refuses_writes_without_the_static_check(shop: Path, attack: str) -> None:
    db = SqliteDatabase("shop", DatabaseConfig(url=f"sqlite:///{shop}"))
    before = digest(shop)
    files = sorted(p.name for p in shop.parent.iterdir())
    with pytest.raises(QueryFailed) as info:
        await db.execute(attack.format(dir=shop.parent))
    assert info.value.kind == "error"
    assert digest(shop) == before
    assert sorted(p.name for p in shop.parent.iterdir()) == files  # no file written (VACUUM INTO, ATTACH)
    assert (await db.execute("SELECT count(*) FROM emp")).rows == [[4]]


@pytest.mark.usefixtures("no_static_check")
async def test_sqlite_reads_still_work_without_the_static_check(shop: Path) -> None:
    db = SqliteDatabase("shop", DatabaseConfig(url=f"sqlite:///{shop}"))
    r = await db.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3) "
        "SELECT i, upper(printf('%s-%d', 'x', i)), (SELECT count(*) FROM rich) FROM n"
    )
    assert r.rows == [[1, "X-1", 2], [2, "X-2", 2], [3, "X-3", 2]]


# ---------------------------------------------------------------------------------------------- PostgreSQL

PG_ATTACKS = [
    "INSERT INTO dept VALUES (9, 'X')",
    "UPDATE dept SET name = 'Y'",
    "DELETE FROM dept",
    "TRUNCATE dept CASCADE",
    "WITH d AS (DELETE FROM dept RETURNING *) SELECT * FROM d",
    "CREATE TABLE evil (a int)",
    "CREATE TEMP TABLE evil (a int)",
    "DROP TABLE emp CASCADE",
    "ALTER TABLE dept ADD COLUMN z int",
    "GRANT SELECT ON dept TO PUBLIC",
    "SELECT nextval('seq')",
    "SELECT setval('seq', 100)",
    "SELECT * INTO evil FROM dept",
    "SELECT * FROM dept FOR UPDATE",
    "SELECT query_to_xml('INSERT INTO dept VALUES (9, ''X'') RETURNING 1', true, true, '')",
    "SELECT query_to_xml('DELETE FROM dept RETURNING 1', true, true, '')",
    "DO $$ BEGIN INSERT INTO dept VALUES (9, 'X'); END $$",
    "COPY (SELECT 1) TO '/tmp/hexflow_pwned'",
    "COPY (SELECT 1) TO PROGRAM 'touch /tmp/hexflow_pwned'",
    "SELECT pg_read_file('/etc/passwd')",
    "SELECT pg_ls_dir('.')",
    "SELECT lo_import('/etc/passwd')",
    "SELECT lo_export(lo_from_bytea(0, 'x'), '/tmp/hexflow_pwned')",
    "SELECT pg_create_physical_replication_slot('hexflow_pwned')",
    "SELECT pg_reload_conf()",
    "SELECT pg_stat_reset()",
    "SELECT current_setting('data_directory')",
    "SELECT k FROM other.thing",
    "SET ROLE postgres",
    "SET SESSION AUTHORIZATION postgres",
    "SELECT set_config('role', 'postgres', true), (SELECT count(*) FROM other.thing)",
]


@pytest.fixture
def pg_loaded(pg: PgTestDb) -> Iterator[PgTestDb]:
    asyncio.run(pg_exec(pg.admin_url, PG_SETUP))
    yield pg


@pytest.fixture
async def pg_reader(pg_loaded: PgTestDb) -> AsyncIterator[PostgresDatabase]:
    db = PostgresDatabase("pg", DatabaseConfig(url=pg_loaded.url, statement_timeout_s=2.0))
    yield db
    await db.close()


async def _state(url: str) -> tuple[Any, ...]:
    """What an attack could change: the rows, the tables, large objects, replication slots, the sequence."""
    conn = await asyncpg.connect(url, timeout=5)
    try:
        return (
            [tuple(r) for r in await conn.fetch("SELECT * FROM dept ORDER BY id")],
            await conn.fetchval("SELECT count(*) FROM emp"),
            sorted(
                r[0]
                for r in await conn.fetch("SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace")
            ),
            await conn.fetchval("SELECT count(*) FROM pg_largeobject_metadata"),
            await conn.fetchval("SELECT count(*) FROM pg_replication_slots"),
            await conn.fetchval("SELECT last_value FROM seq"),
        )
    finally:
        await conn.close()


@pytest.mark.usefixtures("no_static_check")
@pytest.mark.parametrize("attack", PG_ATTACKS)
async def test_pg_refuses_writes_without_the_static_check(
    pg_loaded: PgTestDb, pg_reader: PostgresDatabase, attack: str
) -> None:
    before = await _state(pg_loaded.admin_url)
    with pytest.raises(QueryFailed) as info:
        await pg_reader.execute(attack)
    assert info.value.kind == "error"
    with pytest.raises(QueryFailed):  # and without the wrapper: the role and the READ ONLY transaction alone
        await pg_reader._in_readonly_transaction(lambda conn: conn.fetch(attack))
    assert await _state(pg_loaded.admin_url) == before
    assert not Path("/tmp/hexflow_pwned").exists()
    assert (await pg_reader.execute("SELECT count(*) FROM dept")).rows == [[2]]


@pytest.mark.usefixtures("no_static_check")
async def test_pg_what_a_read_only_transaction_allows_is_rolled_back(
    pg_loaded: PgTestDb, pg_reader: PostgresDatabase
) -> None:
    """PostgreSQL lets a READ ONLY transaction create a large object and queue a notification; the
    gateway never commits, so neither survives the query."""
    listener = await asyncpg.connect(pg_loaded.admin_url, timeout=5)
    heard: list[str] = []
    try:
        await listener.add_listener("chan", lambda *args: heard.append(str(args[-1])))
        before = await _state(pg_loaded.admin_url)
        await pg_reader.execute("SELECT lo_from_bytea(0, 'x'::bytea)")
        await pg_reader.execute("SELECT pg_notify('chan', 'x')")
        await pg_reader._in_readonly_transaction(lambda conn: conn.fetch("SELECT lo_from_bytea(0, 'y'::bytea)"))
        await listener.execute("SELECT 1")  # a round trip: a delivered notification would have arrived
        assert await _state(pg_loaded.admin_url) == before
        assert heard == []
    finally:
        await listener.close()
