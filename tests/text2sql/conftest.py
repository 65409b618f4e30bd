"""Fixtures for the Text-to-SQL tests: a throw-away PostgreSQL database (``pg_url``).

The server is the local one CI starts (``127.0.0.1:5432``, trust auth, database ``test``, user
``postgres``); ``HEXFLOW_TEST_PG_URL`` overrides the admin URL. Without a reachable server the tests
that use ``pg_url`` are skipped with the reason.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

PG_ADMIN_URL = os.environ.get("HEXFLOW_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
"""A URL the tests may use to create and drop databases."""


def _with_database(url: str, dbname: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN_URL, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    """The admin URL, after checking once that the server answers (else the test is skipped)."""
    try:
        asyncio.run(_admin("SELECT 1"))
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        if os.environ.get("HEXFLOW_REQUIRE_POSTGRES") == "1":  # CI starts the server: a skip would hide a failure
            pytest.fail(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
    return PG_ADMIN_URL


@pytest.fixture
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """``postgresql://.../<fresh database>``: created empty for the test, dropped after it."""
    name = f"hexflow_t_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield _with_database(pg_admin_url, name)
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
