"""The database layer: config loading, SQLite and PostgreSQL execution, limits, schema, registry."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import hashlib
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.errors import ConfigError, GatewayError, UnknownNameError
from gateway.text2sql.db import (
    ColumnInfo,
    DatabaseConfig,
    DatabaseRegistry,
    DatabasesFile,
    DatabaseUnavailable,
    ForeignKey,
    PostgresDatabase,
    QueryFailed,
    QueryResult,
    SchemaInfo,
    SqliteDatabase,
    TableInfo,
    UnknownDatabase,
    json_value,
    load_databases,
    open_database,
    serialize_schema,
)
from gateway.text2sql.sqlsafe import SqlRejected
from tests.text2sql.conftest import PgTestDb

SPIDER_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "spider-dev"
LONG_TEXT = "x" * 100
RUNAWAY_SQLITE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"

# ---------------------------------------------------------------------------------------------- config


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_load_databases_resolves_relative_sqlite_paths_against_the_file(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    path = write(
        tmp_path / "conf" / "dbs.yaml",
        "databases:\n"
        "  shop:\n    url: sqlite:///data/shop.sqlite\n    max_rows: 5\n"
        "  pg.main:\n    url: postgresql://reader@127.0.0.1:5432/sales\n    schema: sales\n",
    )
    loaded = load_databases(path)
    shop = loaded.databases["shop"]
    assert shop.dialect == "sqlite"
    assert shop.sqlite_path() == (tmp_path / "conf" / "data" / "shop.sqlite").resolve()
    assert shop.max_rows == 5
    assert shop.statement_timeout_s == 5.0
    pg = loaded.databases["pg.main"]
    assert pg.dialect == "postgres"
    assert pg.db_schema == "sales"
    assert pg.url == "postgresql://reader@127.0.0.1:5432/sales"


def test_absolute_sqlite_url_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "abs.sqlite"
    path = write(tmp_path / "dbs.yaml", f"databases:\n  a:\n    url: sqlite:///{target}\n")
    assert load_databases(path).databases["a"].sqlite_path() == target


@pytest.mark.parametrize(
    ("body", "field", "problem"),
    [
        ("databases: {}", "databases", "at least 1"),
        ("databases:\n  a:\n    url: mysql://h/db\n", "databases.a.url", "unsupported URL"),
        ("databases:\n  a:\n    url: 'sqlite:///'\n", "databases.a.url", "without a path"),
        ("databases:\n  a:\n    url: sqlite://x.sqlite\n", "databases.a.url", "sqlite:///"),
        ("databases:\n  a:\n    url: postgresql://h\n", "databases.a.url", "database name"),
        ("databases:\n  a:\n    url: postgresql://u:secret@h:99999/d\n", "databases.a.url", "invalid port"),
        ("databases:\n  'bad id!':\n    url: sqlite:///x\n", "databases.bad id!.[key]", "pattern"),
        ("databases:\n  a:\n    url: sqlite:///x\n    max_rows: 0\n", "databases.a.max_rows", "greater than"),
        ("databases:\n  a:\n    url: sqlite:///x\n    statement_timeout_s: 0\n", "databases.a.statement_timeout_s", ""),
        ("databases:\n  a:\n    url: sqlite:///x\n    max_result_bytes: 10\n", "databases.a.max_result_bytes", ""),
        ("databases:\n  a:\n    url: sqlite:///x\n    sample_values: 21\n", "databases.a.sample_values", ""),
        ("databases:\n  a:\n    url: sqlite:///x\n    pool_size: 65\n", "databases.a.pool_size", ""),
        ("databases:\n  a:\n    url: sqlite:///x\n    colour: red\n", "databases.a.colour", "unknown key"),
        ("databases:\n  a:\n    description: no url\n", "databases.a.url", "required key is missing"),
    ],
)
def test_invalid_databases_files_give_one_line_config_errors(
    tmp_path: Path, body: str, field: str, problem: str
) -> None:
    path = write(tmp_path / "dbs.yaml", body)
    with pytest.raises(ConfigError) as info:
        load_databases(path)
    assert info.value.field == field
    assert problem in info.value.problem
    assert "\n" not in str(info.value)
    assert "secret" not in str(info.value)


def test_missing_databases_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_databases(tmp_path / "nope.yaml")


def test_password_is_redacted_in_safe_url() -> None:
    cfg = DatabaseConfig(url="postgresql://u:secret@h:5432/d")
    assert cfg.safe_url == "postgresql://u:***@h:5432/d"


# ---------------------------------------------------------------------------------------------- values


def test_json_value_conversions() -> None:
    assert json_value(None) is None
    assert json_value(3) == 3
    assert json_value(True) is True
    assert json_value(2.5) == 2.5
    assert json_value(float("inf")) == "inf"
    assert json_value(b"\x00\xff") == "00ff"
    assert json_value(memoryview(b"ab")) == "6162"
    assert json_value(decimal.Decimal("1.25")) == 1.25
    assert json_value(dt.date(2024, 2, 29)) == "2024-02-29"
    assert json_value(dt.datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02T03:04:05"
    assert json_value(dt.time(1, 2)) == "01:02:00"
    assert json_value([1, decimal.Decimal("2"), [b"\x01"]]) == [1, 2.0, ["01"]]
    assert json_value(dt.timedelta(days=1)) == "1 day, 0:00:00"


# ---------------------------------------------------------------------------------------------- SQLite


def make_sqlite(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE dept (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
        CREATE TABLE emp (
            id INTEGER PRIMARY KEY,
            name TEXT,
            dept_id INTEGER REFERENCES dept(id),
            salary REAL,
            photo BLOB,
            note TEXT
        );
        CREATE TABLE "order items" (order_id INT, line INT, "weird ""col"" x" TEXT, PRIMARY KEY (order_id, line));
        CREATE TABLE big (n INTEGER, padding TEXT);
        CREATE VIEW rich AS SELECT name, salary FROM emp WHERE salary > 1000;
        """
    )
    conn.executemany("INSERT INTO dept VALUES (?, ?)", [(1, "Sales"), (2, "R&D"), (3, "O'Brien's")])
    conn.executemany(
        "INSERT INTO emp VALUES (?, ?, ?, ?, ?, ?)",
        [
            (1, "Ann", 1, 1500.0, b"\x89PNG", LONG_TEXT),
            (2, "Bob", 2, None, None, None),
            (3, None, None, 900.5, None, "short"),
            (4, "Dee", 1, 2000.0, None, None),
        ],
    )
    conn.execute("INSERT INTO \"order items\" VALUES (1, 1, 'a')")
    conn.executemany("INSERT INTO big VALUES (?, ?)", [(i, "p" * 200) for i in range(3000)])
    conn.commit()
    conn.close()
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Path:
    return make_sqlite(tmp_path / "shop.sqlite")


def sqlite_db(path: Path, **limits: object) -> SqliteDatabase:
    return SqliteDatabase("shop", DatabaseConfig.model_validate({"url": f"sqlite:///{path}", **limits}))


async def test_sqlite_execute_returns_columns_and_json_safe_rows(sqlite_file: Path) -> None:
    db = sqlite_db(sqlite_file)
    r = await db.execute("SELECT id, name, salary, photo FROM emp ORDER BY id;")
    assert r.columns == ["id", "name", "salary", "photo"]
    assert r.rows == [
        [1, "Ann", 1500.0, "89504e47"],
        [2, "Bob", None, None],
        [3, None, 900.5, None],
        [4, "Dee", 2000.0, None],
    ]
    assert r.row_count == 4
    assert not r.truncated
    assert r.elapsed_s >= 0
    json.dumps(r.rows)


async def test_sqlite_join_and_empty_result_keep_columns(sqlite_file: Path) -> None:
    db = sqlite_db(sqlite_file)
    r = await db.execute(
        "SELECT d.name, count(*) AS n FROM emp e JOIN dept d ON d.id = e.dept_id GROUP BY d.name ORDER BY d.name"
    )
    assert r.rows == [["R&D", 1], ["Sales", 2]]
    empty = await db.execute("SELECT id, name FROM emp WHERE id < 0")
    assert empty.columns == ["id", "name"]
    assert empty.rows == []
    assert empty.row_count == 0


async def test_sqlite_max_rows_truncates(sqlite_file: Path) -> None:
    db = sqlite_db(sqlite_file, max_rows=10)
    r = await db.execute("SELECT n FROM big ORDER BY n")
    assert r.row_count == 10
    assert r.rows == [[i] for i in range(10)]
    assert r.truncated
    exact = await db.execute("SELECT n FROM big ORDER BY n LIMIT 10")
    assert exact.row_count == 10
    assert not exact.truncated


async def test_sqlite_byte_cap_truncates(sqlite_file: Path) -> None:
    db = sqlite_db(sqlite_file, max_result_bytes=2048)
    r = await db.execute("SELECT n, padding FROM big ORDER BY n")
    assert r.truncated
    assert 0 < r.row_count < 20
    assert len(json.dumps([r.columns, *r.rows])) <= 2048


async def test_sqlite_runaway_query_is_cut_off_at_the_timeout(sqlite_file: Path) -> None:
    db = sqlite_db(sqlite_file, statement_timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(QueryFailed) as info:
        await db.execute(RUNAWAY_SQLITE)
    assert time.monotonic() - start < 1.5
    assert info.value.kind == "timeout"
    assert str(info.value) == "statement timed out after 0.5 s"
    assert (await db.execute("SELECT count(*) FROM emp")).rows == [[4]]  # the next query is unaffected


WRITES = [
    "INSERT INTO emp (id, name) VALUES (99, 'Eve')",
    "UPDATE emp SET salary = 0",
    "DELETE FROM emp",
    "DROP TABLE emp",
    "CREATE TABLE x (a int)",
    "ALTER TABLE emp ADD COLUMN z int",
    "CREATE INDEX i ON emp(name)",
    "VACUUM",
    "REINDEX",
    "PRAGMA user_version = 7",
    "ATTACH DATABASE ':memory:' AS m",
]


async def test_sqlite_writes_are_refused_twice_and_the_file_is_unchanged(sqlite_file: Path) -> None:
    db = sqlite_db(sqlite_file)
    before = digest(sqlite_file)
    for sql in WRITES:
        with pytest.raises(SqlRejected):
            await db.execute(sql)
        with pytest.raises(QueryFailed) as info:  # the engine refuses too, without the static check
            await db._run(sql)
        assert info.value.kind == "error", sql
    assert digest(sqlite_file) == before
    assert (await db.execute("SELECT count(*) FROM emp")).rows == [[4]]


async def test_sqlite_dangerous_function_refused_by_the_engine_too(sqlite_file: Path) -> None:
    db = sqlite_db(sqlite_file)
    with pytest.raises(QueryFailed, match="not authorized"):
        await db._run("SELECT load_extension('x')")


async def test_sqlite_path_with_uri_special_characters(tmp_path: Path) -> None:
    folder = tmp_path / "a b?c#d%20"
    folder.mkdir()
    path = make_sqlite(folder / "shop.sqlite")
    assert (await sqlite_db(path).execute("SELECT count(*) FROM dept")).rows == [[3]]


async def test_sqlite_missing_file_is_unavailable(tmp_path: Path) -> None:
    db = sqlite_db(tmp_path / "missing.sqlite")
    with pytest.raises(DatabaseUnavailable, match=r"'shop'.*does not exist"):
        await db.execute("SELECT 1")
    with pytest.raises(DatabaseUnavailable):
        await db.schema()
    assert not (tmp_path / "missing.sqlite").exists()


async def test_sqlite_file_that_is_not_a_database_is_unavailable(tmp_path: Path) -> None:
    path = write(tmp_path / "junk.sqlite", "this is not a database " * 100)
    with pytest.raises(DatabaseUnavailable, match="cannot open SQLite file"):
        await sqlite_db(path).execute("SELECT 1")


async def test_sqlite_engine_errors_are_query_failed(sqlite_file: Path) -> None:
    db = sqlite_db(sqlite_file)
    with pytest.raises(QueryFailed) as info:
        await db.execute("SELECT no_such_column FROM emp")
    assert info.value.kind == "error"
    assert "no such column: no_such_column" in str(info.value)
    with pytest.raises(QueryFailed, match="no such table"):
        await db.execute("SELECT * FROM nowhere")


async def test_sqlite_concurrent_queries(sqlite_file: Path) -> None:
    db = sqlite_db(sqlite_file)
    results = await asyncio.gather(*(db.execute(f"SELECT {i} + count(*) FROM emp") for i in range(20)))
    assert [r.rows[0][0] for r in results] == [i + 4 for i in range(20)]


async def test_sqlite_schema(sqlite_file: Path) -> None:
    db = SqliteDatabase(
        "shop",
        DatabaseConfig(url=f"sqlite:///{sqlite_file}", description="a shop", sample_values=2),
        descriptions={"EMP": {"Salary": "yearly pay in euro"}},
    )
    s = await db.schema()
    assert s.db_id == "shop"
    assert s.dialect == "sqlite"
    assert s.description == "a shop"
    assert [t.name for t in s.tables] == ["big", "dept", "emp", "order items", "rich"]
    emp = s.table("EMP")
    assert emp is not None
    assert [c.name for c in emp.columns] == ["id", "name", "dept_id", "salary", "photo", "note"]
    assert emp.primary_key == ("id",)
    assert emp.foreign_keys == (ForeignKey(("dept_id",), "dept", ("id",)),)
    salary = emp.column("salary")
    assert salary == ColumnInfo("salary", "REAL", False, True, (1500.0, 900.5), "yearly pay in euro")
    note = emp.column("note")
    assert note is not None
    assert note.samples == ("x" * 40, "short")
    photo = emp.column("photo")
    assert photo is not None
    assert photo.samples == ("89504e47",)
    dept = s.table("dept")
    assert dept is not None
    assert dept.column("name") == ColumnInfo("name", "TEXT", False, False, ("Sales", "R&D"))
    items = s.table("order items")
    assert items is not None
    assert items.primary_key == ("order_id", "line")
    rich = s.table("rich")
    assert rich is not None
    assert rich.kind == "view"
    assert await db.schema() is s


async def test_sqlite_schema_is_cached(sqlite_file: Path) -> None:
    db = sqlite_db(sqlite_file)
    first = await db.schema()
    conn = sqlite3.connect(sqlite_file)
    conn.execute("CREATE TABLE added (a INT)")
    conn.commit()
    conn.close()
    assert await db.schema() is first


async def test_serialize_schema_is_deterministic_and_has_examples(sqlite_file: Path) -> None:
    text = serialize_schema(await sqlite_db(sqlite_file).schema())
    again = serialize_schema(await sqlite_db(sqlite_file).schema())
    assert text == again
    assert "CREATE TABLE emp (\n  id INTEGER PRIMARY KEY, -- examples: 1, 2, 3\n" in text
    assert "  dept_id INTEGER, -- examples: 1, 2\n" in text
    assert "  name TEXT NOT NULL -- examples: 'Sales', 'R&D', 'O''Brien''s'\n);" in text
    assert "  FOREIGN KEY (dept_id) REFERENCES dept(id)\n);" in text
    assert 'CREATE TABLE "order items" (' in text
    assert '"weird ""col"" x" TEXT' in text
    assert "  PRIMARY KEY (order_id, line)\n" in text
    assert "CREATE VIEW rich (" in text
    assert text.index("CREATE TABLE big") < text.index("CREATE TABLE dept") < text.index("CREATE TABLE emp")


def small_schema() -> SchemaInfo:
    t = TableInfo(
        "Person",
        (
            ColumnInfo("id", "integer", True, False, (1, 2)),
            ColumnInfo("Full Name", "text", samples=("Ann\nLee",), description="given and family\nname"),
        ),
        ("id",),
    )
    u = TableInfo(
        "pet", (ColumnInfo("owner", "integer", samples=(1,)),), (), (ForeignKey(("owner",), "Person", ("id",)),)
    )
    return SchemaInfo("zoo", "postgres", (t, u))


def test_serialize_schema_quotes_postgres_names_and_keeps_comments_on_one_line() -> None:
    text = serialize_schema(small_schema())
    assert text == (
        'CREATE TABLE "Person" (\n'
        "  id integer PRIMARY KEY, -- examples: 1, 2\n"
        "  \"Full Name\" text -- given and family name; examples: 'Ann Lee'\n"
        ");\n\n"
        "CREATE TABLE pet (\n"
        "  owner integer, -- examples: 1\n"
        '  FOREIGN KEY (owner) REFERENCES "Person"(id)\n'
        ");"
    )


def test_serialize_schema_shrinks_to_max_chars() -> None:
    schema = small_schema()
    full = serialize_schema(schema)
    no_examples = serialize_schema(schema, max_chars=len(full) - 1)
    assert "examples" not in no_examples
    assert "given and family" in no_examples
    bare = serialize_schema(schema, max_chars=len(no_examples) - 1)
    assert "--" not in bare
    one_table = serialize_schema(schema, max_chars=len(bare) - 1)
    assert one_table.startswith('CREATE TABLE "Person"')
    assert "pet" not in one_table.split("\n\n")[0]
    assert one_table.endswith("-- 1 more table omitted")
    for limit in (1, 10, 50, len(bare) - 1):
        assert len(serialize_schema(schema, max_chars=limit)) <= limit
    with pytest.raises(ValueError, match="max_chars"):
        serialize_schema(schema, max_chars=0)
    assert serialize_schema(SchemaInfo("empty", "sqlite", ())) == ""


# ---------------------------------------------------------------------------------------------- registry


async def test_registry_creates_databases_lazily_and_caches_them(sqlite_file: Path, tmp_path: Path) -> None:
    path = write(
        tmp_path / "dbs.yaml",
        f"databases:\n  shop:\n    url: sqlite:///{sqlite_file.name}\n"
        "  remote:\n    url: postgresql://postgres@127.0.0.1:1/none\n",
    )
    reg = DatabaseRegistry.from_file(path, descriptions={"shop": {"emp": {"name": "full name"}}})
    assert reg.ids() == ["remote", "shop"]
    assert "shop" in reg.ids()
    shop = reg.get("shop")
    assert isinstance(shop, SqliteDatabase)
    assert reg.get("shop") is shop
    assert isinstance(reg.get("remote"), PostgresDatabase)
    assert (await shop.execute("SELECT count(*) FROM dept")).rows == [[3]]
    emp = (await shop.schema()).table("emp")
    assert emp is not None
    name = emp.column("name")
    assert name is not None
    assert name.description == "full name"
    with pytest.raises(UnknownDatabase) as info:
        reg.get("nope")
    assert isinstance(info.value, KeyError)
    assert isinstance(info.value, UnknownNameError)
    assert info.value.known == ["remote", "shop"]
    assert str(info.value) == "unknown database 'nope'; known: remote, shop"
    await reg.close()


async def test_registry_base_dir_resolves_relative_paths(sqlite_file: Path) -> None:
    cfg = DatabasesFile.model_validate({"databases": {"shop": {"url": f"sqlite:///{sqlite_file.name}"}}})
    reg = DatabaseRegistry(cfg, base_dir=sqlite_file.parent)
    assert (await reg.get("shop").execute("SELECT 1")).rows == [[1]]


@pytest.mark.parametrize(
    ("error", "status", "error_type"),
    [
        (QueryFailed("error", "no such table: x"), 422, "invalid_request_error"),
        (QueryFailed("timeout", "statement timed out after 1 s"), 504, "timeout_error"),
        (DatabaseUnavailable("database 'shop': cannot open SQLite file"), 503, "service_unavailable"),
        (UnknownDatabase("nope", ["shop"]), 404, "not_found_error"),
        (
            SqlRejected("only read-only queries (SELECT, WITH, VALUES) may run; found DROP"),
            400,
            "invalid_request_error",
        ),
    ],
)
def test_database_errors_are_gateway_errors_with_their_http_status(
    error: GatewayError, status: int, error_type: str
) -> None:
    assert isinstance(error, GatewayError)
    assert (error.status, error.error_type) == (status, error_type)


def test_unknown_database_may_name_only_the_databases_a_tenant_may_use() -> None:
    err = UnknownDatabase("shop", [], message="unknown database 'shop'; allowed for tenant batch: (none)")
    assert str(err) == "unknown database 'shop'; allowed for tenant batch: (none)"
    assert err.param == "db_id" and err.known == []


# ---------------------------------------------------------------------------------------------- Spider


@pytest.mark.shared
async def test_every_spider_dev_gold_query_runs_on_its_database() -> None:
    dev = SPIDER_DIR / "dev.json"
    if not dev.is_file():
        pytest.skip(f"Spider dev set {dev} is absent")
    present = {p.name for p in (SPIDER_DIR / "database").iterdir() if (p / f"{p.name}.sqlite").is_file()}
    reg = DatabaseRegistry(
        DatabasesFile.model_validate(
            {"databases": {n: {"url": f"sqlite:///database/{n}/{n}.sqlite"} for n in sorted(present)}}
        ),
        base_dir=SPIDER_DIR,
    )
    items = [it for it in json.loads(dev.read_text(encoding="utf-8")) if it["db_id"] in present]
    assert len(items) == 972
    for it in items:
        r = await reg.get(it["db_id"]).execute(it["query"])
        assert r.columns
    for db_id in reg.ids():
        text = serialize_schema(await reg.get(db_id).schema())
        assert text.startswith("CREATE TABLE")
    await reg.close()


# ---------------------------------------------------------------------------------------------- PostgreSQL

PG_SETUP = """
CREATE TABLE dept (id integer PRIMARY KEY, name text NOT NULL);
CREATE TABLE emp (
    id integer PRIMARY KEY,
    name text,
    dept_id integer REFERENCES dept(id),
    salary numeric(10, 2),
    hired date,
    photo bytea,
    meta json
);
CREATE TABLE "Order Items" (order_id int, line int, qty int, PRIMARY KEY (order_id, line));
INSERT INTO dept VALUES (1, 'Sales'), (2, 'R&D');
INSERT INTO emp VALUES
    (1, 'Ann', 1, 1500.50, '2020-01-02', '\\x0102', '{"a": 1}'),
    (2, 'Bob', 2, NULL, NULL, NULL, NULL),
    (3, NULL, NULL, 900, '2021-03-04', NULL, NULL);
CREATE SEQUENCE seq;
CREATE SCHEMA other;
CREATE TABLE other.thing (k text PRIMARY KEY, emp_id int REFERENCES public.emp(id));
INSERT INTO other.thing VALUES ('x', 1);
"""


async def pg_exec(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def pg_count(url: str, table: str) -> int:
    conn = await asyncpg.connect(url, timeout=5)
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {table}"))
    finally:
        await conn.close()


@pytest.fixture
def pg_ready(pg: PgTestDb) -> Iterator[PgTestDb]:
    """The test database with ``PG_SETUP`` loaded by the admin; the code under test uses ``.url`` (the reader)."""
    asyncio.run(pg_exec(pg.admin_url, PG_SETUP))
    yield pg


@pytest.fixture
async def pg_db(pg_ready: PgTestDb) -> AsyncIterator[PostgresDatabase]:
    db = PostgresDatabase("pg", DatabaseConfig(url=pg_ready.url, statement_timeout_s=0.5, max_rows=10, sample_values=2))
    yield db
    await db.close()


async def test_pg_execute_returns_json_safe_rows(pg_db: PostgresDatabase) -> None:
    r = await pg_db.execute("SELECT id, name, salary, hired, photo, meta FROM emp ORDER BY id;")
    assert r.columns == ["id", "name", "salary", "hired", "photo", "meta"]
    assert r.rows == [
        [1, "Ann", 1500.5, "2020-01-02", "0102", '{"a": 1}'],
        [2, "Bob", None, None, None, None],
        [3, None, 900.0, "2021-03-04", None, None],
    ]
    assert r.row_count == 3
    assert not r.truncated
    json.dumps(r.rows)
    empty = await pg_db.execute("SELECT id FROM emp WHERE false")
    assert (empty.columns, empty.rows) == (["id"], [])


async def test_pg_row_and_byte_caps(pg_db: PostgresDatabase, pg_ready: PgTestDb) -> None:
    r = await pg_db._run("SELECT g FROM generate_series(1, 1000000) AS g")  # caps hold behind the check
    assert r.rows == [[i] for i in range(1, 11)]
    assert r.truncated
    exact = await pg_db._run("SELECT g FROM generate_series(1, 10) AS g")
    assert not exact.truncated
    small = PostgresDatabase("pg", DatabaseConfig(url=pg_ready.url, max_result_bytes=1024))
    try:
        wide = await small._run("SELECT repeat('x', 200) FROM generate_series(1, 100)")
        assert wide.truncated
        assert 0 < wide.row_count < 6
    finally:
        await small.close()


@pytest.mark.parametrize(
    "sql",
    [
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100) "
        "SELECT count(*) FROM c a, c b, c d, c e, c f, c g",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
    ],
)
async def test_pg_runaway_query_is_cut_off_by_statement_timeout(pg_db: PostgresDatabase, sql: str) -> None:
    start = time.monotonic()
    with pytest.raises(QueryFailed) as info:
        await pg_db.execute(sql)
    assert time.monotonic() - start < 1.5
    assert info.value.kind == "timeout"
    assert str(info.value) == "statement timed out after 0.5 s"
    assert (await pg_db.execute("SELECT 1")).rows == [[1]]


class _NoServerTimeout(PostgresDatabase):
    """Runs queries with the server-side timeout switched off, to exercise the client-side backstop."""

    async def _run(self, sql: str) -> QueryResult:
        async def query(conn: Any) -> QueryResult:
            await conn.execute("SET LOCAL statement_timeout = 0")
            rows = await conn.fetch(sql)
            return QueryResult([], [list(r.values()) for r in rows], len(rows), False, 0.0)

        result: QueryResult = await self._in_readonly_transaction(query)
        return result


async def test_pg_client_side_backstop_fires_at_timeout_plus_two_seconds(pg_ready: PgTestDb) -> None:
    db = _NoServerTimeout("pg", DatabaseConfig(url=pg_ready.url, statement_timeout_s=0.2, pool_size=1))
    try:
        start = time.monotonic()
        with pytest.raises(QueryFailed) as info:
            await db._run("SELECT pg_sleep(30)")
        assert 2.1 < time.monotonic() - start < 4.0
        assert info.value.kind == "timeout"
        assert (await db._run("SELECT 7")).rows == [[7]]  # the single pooled connection is usable again
    finally:
        await db.close()


async def test_pg_sleep_is_rejected_before_reaching_the_server(pg_db: PostgresDatabase) -> None:
    start = time.monotonic()
    with pytest.raises(SqlRejected, match=r"pg_sleep\(\)"):
        await pg_db.execute("select pg_sleep(10)")
    assert time.monotonic() - start < 0.5


async def test_pg_engine_errors_are_query_failed(pg_db: PostgresDatabase) -> None:
    with pytest.raises(QueryFailed) as info:
        await pg_db.execute("SELECT no_such_column FROM emp")
    assert info.value.kind == "error"
    assert 'column "no_such_column" does not exist' in str(info.value)
    with pytest.raises(QueryFailed, match="division by zero"):
        await pg_db.execute("SELECT 1 / 0")


async def test_pg_schema(pg_db: PostgresDatabase) -> None:
    s = await pg_db.schema()
    assert s.dialect == "postgres"
    assert [t.name for t in s.tables] == ["dept", "emp", "Order Items"]
    emp = s.table("emp")
    assert emp is not None
    assert emp.primary_key == ("id",)
    assert emp.foreign_keys == (ForeignKey(("dept_id",), "dept", ("id",)),)
    assert emp.column("salary") == ColumnInfo("salary", "numeric(10,2)", False, True, (900.0, 1500.5))
    assert emp.column("id") == ColumnInfo("id", "integer", True, False, (1, 2))
    meta = emp.column("meta")
    assert meta is not None
    assert meta.samples == ()  # json has no equality: DISTINCT fails in its savepoint, the rest goes on
    items = s.table("order items")
    assert items is not None
    assert items.primary_key == ("order_id", "line")
    text = serialize_schema(s)
    assert "  FOREIGN KEY (dept_id) REFERENCES dept(id)\n" in text
    assert 'CREATE TABLE "Order Items" (' in text
    assert "  name text NOT NULL -- examples: 'R&D', 'Sales'\n);" in text
    assert await pg_db.schema() is s


async def test_pg_schema_of_a_configured_schema(pg_ready: PgTestDb) -> None:
    url = await pg_ready.create_reader("other")
    db = PostgresDatabase("pg", DatabaseConfig.model_validate({"url": url, "schema": "other"}))
    try:
        s = await db.schema()
        assert [t.name for t in s.tables] == ["thing"]
        thing = s.table("thing")
        assert thing is not None
        assert thing.foreign_keys == (ForeignKey(("emp_id",), "public.emp", ("id",)),)
        assert (await db.execute("SELECT k FROM other.thing")).rows == [["x"]]
    finally:
        await db.close()


async def test_pg_server_down_is_unavailable() -> None:
    db = open_database("down", DatabaseConfig(url="postgresql://postgres:pw@127.0.0.1:1/none", connect_timeout_s=2))
    assert isinstance(db, PostgresDatabase)
    try:
        with pytest.raises(DatabaseUnavailable) as info:
            await db.execute("SELECT 1")
        message = str(info.value)
        assert message.startswith("database 'down': cannot connect to postgresql://postgres:***@127.0.0.1:1/none: ")
        assert "pw" not in message.split("***")[1]
        with pytest.raises(DatabaseUnavailable):
            await db.schema()
    finally:
        await db.close()


async def test_pg_unknown_database_is_unavailable(pg_admin_url: str) -> None:
    url = pg_admin_url.rsplit("/", 1)[0] + "/hexflow_no_such_db"
    db = PostgresDatabase("ghost", DatabaseConfig(url=url))
    try:
        with pytest.raises(DatabaseUnavailable, match='database "hexflow_no_such_db" does not exist'):
            await db.execute("SELECT 1")
    finally:
        await db.close()
