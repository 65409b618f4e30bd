"""PostgreSQL least privilege, enforced: the gateway refuses a role that can do more than read.

The reader of ``deploy/postgres/reader-role.sql`` passes; a superuser, a role with BYPASSRLS,
CREATEROLE or REPLICATION, and a member (directly or through another role) of a server-file,
server-program, signal or read-everything role make the database unavailable (503, the role and the
reason in the message), while the other databases keep working.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gateway.text2sql.db import (
    DatabaseConfig,
    DatabaseRegistry,
    DatabasesFile,
    DatabaseUnavailable,
    PostgresDatabase,
)
from gateway.text2sql.db.postgres import DANGEROUS_ROLES, role_problems
from tests.text2sql.conftest import PgTestDb


def _row(name: str, *, me: bool = True, **attrs: bool) -> dict[str, object]:
    base = {"rolsuper": False, "rolbypassrls": False, "rolcreaterole": False, "rolreplication": False}
    return {"rolname": name, "is_self": me, **base, **attrs}


def test_role_problems_of_the_catalog_rows() -> None:
    assert role_problems([_row("reader")]) == []
    assert role_problems([_row("root", rolsuper=True), _row("pg_signal_backend", me=False)]) == ["is a superuser"]
    assert role_problems([_row("r", rolbypassrls=True, rolreplication=True)]) == [
        "has BYPASSRLS (row-level security would not apply)",
        "has REPLICATION (it could create replication slots that hold WAL forever)",
    ]
    assert role_problems([_row("r"), _row("admin", me=False, rolsuper=True)]) == [
        "is a superuser through membership of 'admin'"
    ]
    assert role_problems([_row("r"), _row("team", me=False), _row("pg_read_server_files", me=False)]) == [
        "is a member of pg_read_server_files (reads files on the database server)"
    ]
    for name in DANGEROUS_ROLES:
        assert len(role_problems([_row("r"), _row(name, me=False)])) == 1


async def _refusal(url: str) -> DatabaseUnavailable:
    db = PostgresDatabase("sales", DatabaseConfig(url=url))
    try:
        with pytest.raises(DatabaseUnavailable) as info:
            await db.execute("SELECT 1")
        with pytest.raises(DatabaseUnavailable):  # every request on it, not only the first
            await db.schema()
        return info.value
    finally:
        await db.close()


async def test_superuser_url_is_refused_with_the_reason(pg: PgTestDb) -> None:
    err = await _refusal(pg.admin_url)
    assert err.status == 503
    assert "database 'sales'" in str(err)
    assert "role 'postgres'" in str(err)
    assert "superuser" in str(err)


async def test_the_recipe_reader_passes(pg: PgTestDb) -> None:
    db = PostgresDatabase("sales", DatabaseConfig(url=pg.url))
    try:
        await db.check()
        assert (await db.execute("SELECT 1 AS one")).rows == [[1]]
    finally:
        await db.close()


@pytest.mark.parametrize(
    ("options", "grants", "reason"),
    [
        ("BYPASSRLS", (), "BYPASSRLS"),
        ("CREATEROLE", (), "CREATEROLE"),
        ("REPLICATION", (), "REPLICATION"),
        ("", ("pg_read_server_files",), "pg_read_server_files"),
        ("", ("pg_write_server_files",), "pg_write_server_files"),
        ("", ("pg_execute_server_program",), "pg_execute_server_program"),
        ("", ("pg_signal_backend",), "pg_signal_backend"),
        ("", ("pg_read_all_data",), "pg_read_all_data"),
        ("", ("pg_monitor",), "pg_read_all_settings"),  # through pg_monitor's own memberships
        ("NOINHERIT", ("pg_signal_backend",), "pg_signal_backend"),  # SET ROLE would still reach it
    ],
)
async def test_privileged_roles_are_refused_with_the_reason(
    pg: PgTestDb, options: str, grants: tuple[str, ...], reason: str
) -> None:
    url = await pg.create_role(options, *grants)
    err = await _refusal(url)
    assert err.status == 503
    assert "refusing to query as role 'hexflow_x_" in str(err)
    assert reason in str(err)


async def test_membership_through_another_role_is_refused(pg: PgTestDb) -> None:
    middle = await pg.create_role("", "pg_execute_server_program")
    middle_name = middle.split("//")[1].split(":")[0]
    url = await pg.create_role("", f'"{middle_name}"')
    err = await _refusal(url)
    assert "pg_execute_server_program" in str(err)


async def test_a_refused_database_leaves_the_others_working(pg: PgTestDb, tmp_path: Path) -> None:
    sqlite_path = tmp_path / "shop.sqlite"
    conn = sqlite3.connect(sqlite_path)
    conn.execute("CREATE TABLE t (a int)")
    conn.commit()
    conn.close()
    reg = DatabaseRegistry(
        DatabasesFile.model_validate(
            {
                "databases": {
                    "root": {"url": pg.admin_url},
                    "reader": {"url": pg.url},
                    "shop": {"url": f"sqlite:///{sqlite_path}"},
                }
            }
        )
    )
    try:
        with pytest.raises(DatabaseUnavailable, match="superuser"):
            await reg.get("root").execute("SELECT 1")
        assert (await reg.get("reader").execute("SELECT 2")).rows == [[2]]
        assert (await reg.get("shop").execute("SELECT count(*) FROM t")).rows == [[0]]
    finally:
        await reg.close()


def test_databases_check_command_says_why(pg: PgTestDb, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    sqlite_path = tmp_path / "shop.sqlite"
    sqlite3.connect(sqlite_path).close()
    path = tmp_path / "databases.yaml"
    path.write_text(
        "databases:\n"
        f"  shop: {{url: 'sqlite:///{sqlite_path.name}'}}\n"
        f"  reader: {{url: '{pg.url}'}}\n"
        f"  root: {{url: '{pg.admin_url}'}}\n"
        f"  gone: {{url: 'sqlite:///missing.sqlite'}}\n",
        encoding="utf-8",
    )
    assert main(["databases", "--check", str(path)]) == 1
    out = capsys.readouterr().out
    password = urlsplit(pg.url).password
    assert password is not None
    assert password not in out  # the reader's password is redacted
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert lines["shop"].split()[1] == "ok"
    assert lines["reader"].split()[1] == "ok"
    assert "unavailable" in lines["root"] and "role 'postgres'" in lines["root"] and "superuser" in lines["root"]
    assert "unavailable" in lines["gone"] and "does not exist" in lines["gone"]
    assert lines["2/4"] == "2/4 databases ok"
    path.write_text(f"databases:\n  shop: {{url: 'sqlite:///{sqlite_path.name}'}}\n", encoding="utf-8")
    assert main(["databases", "--check", str(path)]) == 0
    assert main(["databases", "--check", str(path), "--demo"]) == 2
