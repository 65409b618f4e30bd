"""Fixtures for the Text-to-SQL tests: a throw-away PostgreSQL database and its least-privilege reader (``pg``).

The server is the local one CI starts (``127.0.0.1:5432``, trust auth, database ``test``, user
``postgres``); ``HEXFLOW_TEST_PG_URL`` overrides the admin URL. Without a reachable server the tests
that use ``pg`` are skipped with the reason.

The admin (superuser) connection only sets up: it creates the database, loads test data and creates
the reader role by running ``deploy/postgres/reader-role.sql`` itself (psql variables substituted).
The gateway's code under test connects as that reader (``PgTestDb.url``), never as the superuser.
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

PG_ADMIN_URL = os.environ.get("HEXFLOW_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
"""A URL the tests may use to create and drop databases and roles."""

READER_RECIPE = Path(__file__).resolve().parents[2] / "deploy" / "postgres" / "reader-role.sql"


def with_database(url: str, dbname: str) -> str:
    """``url`` pointing at database ``dbname``."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


def with_user(url: str, user: str, password: str) -> str:
    """``url`` logging in as ``user`` with ``password``."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


def render_recipe(variables: dict[str, str]) -> str:
    """``reader-role.sql`` as plain SQL: psql's ``:"name"`` (identifier) and ``:'name'`` (literal)
    substituted, its meta-commands (``\\set``) and comments dropped."""

    def sub(m: re.Match[str]) -> str:
        value = variables[m.group(2)]
        if m.group(1) == '"':
            return '"' + value.replace('"', '""') + '"'
        return "'" + value.replace("'", "''") + "'"

    lines = [ln for ln in READER_RECIPE.read_text(encoding="utf-8").splitlines() if not ln.startswith(("\\", "--"))]
    return re.sub(r""":(["'])(\w+)\1""", sub, "\n".join(lines))


async def admin_exec(url: str, sql: str) -> None:
    """Run ``sql`` on ``url`` (an admin URL) and disconnect."""
    conn = await asyncpg.connect(url, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@dataclass
class PgTestDb:
    """A fresh database: ``admin_url`` (superuser, set-up only) and ``url`` (its reader role)."""

    name: str
    admin_url: str
    url: str = ""
    roles: list[str] = field(default_factory=list)

    async def create_reader(self, schema: str = "public") -> str:
        """Create a reader of ``schema`` with the recipe; its URL (dropped with the database)."""
        role = f"hexflow_r_{uuid.uuid4().hex[:12]}"
        password = uuid.uuid4().hex
        recipe = render_recipe(
            {
                "reader": role,
                "password": password,
                "dbname": self.name,
                "schema": schema,
                "owner": str(urlsplit(self.admin_url).username or "postgres"),
                "statement_timeout": "5s",
            }
        )
        self.roles.append(role)
        await admin_exec(self.admin_url, recipe)
        return with_user(self.admin_url, role, password)

    async def create_role(self, options: str, *grants: str) -> str:
        """A login role with ``options`` (``CREATE ROLE ... LOGIN <options>``) and membership of ``grants``."""
        role = f"hexflow_x_{uuid.uuid4().hex[:12]}"
        sql = f'CREATE ROLE "{role}" LOGIN {options}; GRANT CONNECT ON DATABASE "{self.name}" TO "{role}";'
        sql += "".join(f'GRANT {g} TO "{role}";' for g in grants)
        self.roles.append(role)
        await admin_exec(self.admin_url, sql)
        return with_user(self.admin_url, role, "unused")


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    """The admin URL, after checking once that the server answers (else the test is skipped)."""
    try:
        asyncio.run(admin_exec(PG_ADMIN_URL, "SELECT 1"))
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        if os.environ.get("HEXFLOW_REQUIRE_POSTGRES") == "1":  # CI starts the server: a skip would hide a failure
            pytest.fail(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
    return PG_ADMIN_URL


@pytest.fixture
def pg(pg_admin_url: str) -> Iterator[PgTestDb]:
    """A fresh empty database with a reader of its schema public (``.url``); dropped after the test,
    with every role made for it."""
    name = f"hexflow_t_{uuid.uuid4().hex[:12]}"
    asyncio.run(admin_exec(pg_admin_url, f'CREATE DATABASE "{name}"'))
    db = PgTestDb(name, with_database(pg_admin_url, name))
    try:
        db.url = asyncio.run(db.create_reader("public"))
        yield db
    finally:
        asyncio.run(admin_exec(pg_admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        for role in db.roles:
            asyncio.run(admin_exec(pg_admin_url, f'DROP ROLE IF EXISTS "{role}"'))
