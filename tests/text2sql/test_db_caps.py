"""Caps that hold before memory is spent, and result conversion off the event loop.

Hostile expressions (huge blobs and strings, ``printf`` widths, doubling recursive CTEs, runaway
recursion) are refused as ``too_large`` (the engine stops them at the length limit, before allocating)
or ``timeout`` (the watchdog interrupts them): the tests assert the status, not wall-clock figures
(``python -m gateway.bench.sql_hostile`` prints those, with the RSS).

The static check is switched off here (``check_sql`` accepts everything): the caps are the engines' job,
and must hold whatever functions that check lets through.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import gateway.text2sql.db.base as db_base
import gateway.text2sql.db.sqlite as sqlite_module
from gateway.text2sql.db import DatabaseConfig, PostgresDatabase, QueryFailed, SqliteDatabase, json_value
from tests.text2sql.conftest import PgTestDb


@pytest.fixture(autouse=True)
def no_static_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db_base, "check_sql", lambda sql, *_args, **_kwargs: sql)


SQLITE_HOSTILE = {
    "zeroblob": "SELECT length(zeroblob(50000000))",
    "randomblob": "SELECT length(randomblob(50000000))",
    "printf width": "SELECT length(printf('%.*c', 300000000, 'x'))",
    "printf literal width": "SELECT length(printf('%300000000d', 1))",
    "format": "SELECT length(format('%.*c', 300000000, 'x'))",
    "replace(hex(zeroblob))": "SELECT length(replace(hex(zeroblob(10000000)), '0', 'ab'))",
    "doubling CTE": (
        "WITH RECURSIVE c(x, s) AS (SELECT 1, 'a' UNION ALL SELECT x + 1, s || s FROM c WHERE x < 40) "
        "SELECT max(length(s)) FROM c"
    ),
    "group_concat": (
        "SELECT length(group_concat(hex(randomblob(1000)))) FROM "
        "(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000) SELECT x FROM c)"
    ),
    "value over the byte cap": "SELECT zeroblob(600000)",  # 1.2 MB of hex in JSON
    "count to 1e9": (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000000) SELECT count(*) FROM c"
    ),
}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (a int)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize("sql", list(SQLITE_HOSTILE.values()), ids=list(SQLITE_HOSTILE))
async def test_sqlite_hostile_expressions_are_stopped(tiny: Path, sql: str) -> None:
    db = SqliteDatabase("tiny", DatabaseConfig(url=f"sqlite:///{tiny}", statement_timeout_s=1.0))
    with pytest.raises(QueryFailed) as info:
        await db.execute(sql)
    assert info.value.kind in ("too_large", "timeout")
    assert info.value.status in (422, 504)
    assert (await db.execute("SELECT count(*) FROM t")).rows == [[1]]


async def test_sqlite_values_over_the_length_limit_are_too_large(tiny: Path) -> None:
    db = SqliteDatabase("tiny", DatabaseConfig(url=f"sqlite:///{tiny}", max_result_bytes=4096))
    with pytest.raises(QueryFailed) as info:
        await db.execute("SELECT length(zeroblob(5000))")
    assert info.value.kind == "too_large"
    assert "4096 bytes" in str(info.value)
    assert (await db.execute("SELECT length(zeroblob(4000)), printf('%5d|%-3s|%.2f', 42, 'a', 3.14159)")).rows == [
        [4000, "   42|a  |3.14"]
    ]


async def test_sqlite_watchdog_stops_a_query_the_progress_handler_does_not(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the progress handler made blind, ``Connection.interrupt()`` from the timer still stops it."""
    monkeypatch.setattr(sqlite_module._Deadline, "__call__", lambda self: 0)
    db = SqliteDatabase("tiny", DatabaseConfig(url=f"sqlite:///{tiny}", statement_timeout_s=0.3))
    with pytest.raises(QueryFailed) as info:
        await db.execute(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000000) SELECT count(*) FROM c"
        )
    assert info.value.kind == "timeout"
    assert (await db.execute("SELECT 1")).rows == [[1]]


# ---------------------------------------------------------------------------------------------- PostgreSQL

PG_HOSTILE = {
    "repeat 100 MB": "SELECT repeat('x', 100000000)",
    "bytea 50 MB": "SELECT decode(repeat('ab', 25000000), 'hex')",
    "array_agg": "SELECT array_agg(g) FROM generate_series(1, 3000000) AS g",
    "string_agg": "SELECT string_agg(md5(g::text), ',') FROM generate_series(1, 200000) AS g",
    "wide row": "SELECT repeat('x', 600000) AS a, repeat('y', 600000) AS b",
}


@pytest.fixture
async def pg_capped(pg: PgTestDb) -> AsyncIterator[PostgresDatabase]:
    db = PostgresDatabase("pg", DatabaseConfig(url=pg.url, statement_timeout_s=10.0))
    yield db
    await db.close()


@pytest.mark.parametrize("sql", list(PG_HOSTILE.values()), ids=list(PG_HOSTILE))
async def test_pg_values_over_the_byte_cap_never_reach_the_gateway(pg_capped: PostgresDatabase, sql: str) -> None:
    with pytest.raises(QueryFailed) as info:
        await pg_capped.execute(sql)
    assert info.value.kind == "too_large"
    assert info.value.status == 422
    assert (await pg_capped.execute("SELECT 1")).rows == [[1]]


async def test_pg_rows_stop_at_the_byte_cap_server_side(pg_capped: PostgresDatabase) -> None:
    """Rows of 0.9 MB each: the first fits, the server blanks the rest (never 1000 x 0.9 MB on the wire)."""
    r = await pg_capped.execute("SELECT g, repeat('x', 900000) AS pad FROM generate_series(1, 1000) AS g")
    assert r.truncated
    assert [row[0] for row in r.rows] == [1]
    assert len(r.rows[0][1]) == 900000


async def test_pg_capped_query_keeps_order_names_and_types(pg_capped: PostgresDatabase) -> None:
    r = await pg_capped.execute(
        "SELECT g AS n, g AS n, 'x' AS s, NULL AS z, ARRAY[g, -g] AS arr FROM generate_series(5, 1, -1) AS g -- note"
    )
    assert r.columns == ["n", "n", "s", "z", "arr"]
    assert r.rows == [[g, g, "x", None, [g, -g]] for g in (5, 4, 3, 2, 1)]
    empty = await pg_capped.execute("SELECT FROM generate_series(1, 3)")
    assert (empty.columns, empty.rows) == ([], [[], [], []])


# ---------------------------------------------------------------------------------------------- the event loop


@dataclass
class _Handshake:
    started: threading.Event
    released: threading.Event


@pytest.fixture
def conversion_waits_for_the_loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Handshake]:
    """Converting the first value signals ``started`` and then waits until a coroutine on the event loop
    has seen that and set ``released``.

    Were the conversion on the loop, that coroutine could not run while it waits: the wait would give up
    and the query fail. In a worker thread, the loop stays free and the coroutine completes meanwhile.
    """
    handshake = _Handshake(threading.Event(), threading.Event())
    real = json_value

    def waiting(v: object) -> object:
        if not handshake.started.is_set():
            handshake.started.set()
            assert handshake.released.wait(timeout=10.0), "the event loop was blocked while rows were converted"
        return real(v)

    monkeypatch.setattr(db_base, "json_value", waiting)
    yield handshake


async def _loop_stays_free(db: SqliteDatabase | PostgresDatabase, sql: str, handshake: _Handshake) -> None:
    query = asyncio.create_task(db.execute(sql))

    async def trivial() -> None:  # runs on the loop while the conversion is under way
        assert await asyncio.to_thread(handshake.started.wait, 10.0)
        handshake.released.set()

    await asyncio.wait_for(trivial(), timeout=30.0)
    result = await query
    assert result.row_count > 0


async def test_pg_conversion_leaves_the_event_loop_free(
    pg_capped: PostgresDatabase, conversion_waits_for_the_loop: _Handshake
) -> None:
    await _loop_stays_free(
        pg_capped, "SELECT g, repeat('x', 1000) FROM generate_series(1, 500) AS g", conversion_waits_for_the_loop
    )


async def test_sqlite_conversion_leaves_the_event_loop_free(
    tiny: Path, conversion_waits_for_the_loop: _Handshake
) -> None:
    db = SqliteDatabase("tiny", DatabaseConfig(url=f"sqlite:///{tiny}"))
    await _loop_stays_free(db, "SELECT a, hex(zeroblob(1000)) FROM t", conversion_waits_for_the_loop)
