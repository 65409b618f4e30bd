"""The allowlists of ``check_sql``: what a Text-to-SQL query needs passes; every payload off the lists is refused
with a reason in our words (functions, casts, operators, constructs, relations), per dialect."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import ClassVar

import asyncpg
import pytest

from gateway.config.databases import DatabaseConfig
from gateway.text2sql.db.base import Database, QueryResult
from gateway.text2sql.db.schema import SchemaInfo
from gateway.text2sql.demo.schema import demo_questions
from gateway.text2sql.sqlsafe import SqlRejected, check_sql
from gateway.text2sql.sqlsafe.allowlist import POSTGRES_FUNCTIONS, SQLITE_FUNCTIONS

SQLITE_ACCEPTED = [
    "SELECT c.name, count(o.id) AS n FROM customers AS c LEFT JOIN orders AS o ON o.customer_id = c.id "
    "GROUP BY c.name HAVING count(o.id) > 2 ORDER BY n DESC LIMIT 10",
    "SELECT name, row_number() OVER (ORDER BY total DESC), rank() OVER (PARTITION BY city ORDER BY total), "
    "lag(total) OVER w, lead(total, 1, 0) OVER w, sum(total) OVER (ORDER BY day ROWS BETWEEN 2 PRECEDING AND "
    "CURRENT ROW) FROM sales WINDOW w AS (ORDER BY day)",
    "WITH big AS (SELECT customer_id, sum(amount) AS s FROM orders GROUP BY customer_id) "
    "SELECT * FROM big WHERE s > (SELECT avg(s) FROM big)",
    "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 12) SELECT x FROM n",
    "SELECT CASE WHEN amount > 100 THEN 'big' WHEN amount > 10 THEN 'mid' ELSE 'small' END, "
    "iif(paid, 1, 0), ifnull(note, ''), coalesce(a, b, 0), nullif(a, 0) FROM orders",
    "SELECT strftime('%Y-%m', created_at), date('now', '-30 days'), julianday(d2) - julianday(d1), "
    "datetime(ts, 'unixepoch'), time(ts) FROM orders WHERE created_at BETWEEN '2020-01-01' AND '2020-12-31'",
    "SELECT CAST(sum(CASE WHEN gender = 'F' THEN 1 ELSE 0 END) AS REAL) * 100 / count(*) FROM patients",
    "SELECT substr(name, 1, 3), substring(name, 2), instr(name, 'a'), length(name), upper(name), lower(name), "
    "trim(name), ltrim(name, 'x'), replace(name, 'a', 'b'), round(price, 2), abs(delta) FROM products",
    "SELECT name FROM products WHERE name LIKE '%tea%' AND category IN ('a', 'b') AND NOT EXISTS "
    "(SELECT 1 FROM returns AS r WHERE r.product_id = products.id)",
    "SELECT name FROM a UNION SELECT name FROM b UNION ALL SELECT name FROM main.c ORDER BY 1 LIMIT 5 OFFSET 5",
    "SELECT group_concat(name, ', '), max(price), min(price), total(qty), avg(qty) FROM products",
    'SELECT "Order ID", [weird col] FROM "order items" WHERE "Order ID" IS NOT NULL',
    "SELECT T1.name FROM singer AS T1 JOIN concert AS T2 ON T1.id = T2.singer_id WHERE T2.year = 2014",
    "SELECT ntile(4) OVER (ORDER BY x), dense_rank() OVER (ORDER BY x), percent_rank() OVER (ORDER BY x) FROM t",
    "SELECT doc -> '$.a', doc ->> '$.b', json_extract(doc, '$.c') FROM docs",
    "SELECT a || ' ' || b, a % 2, -a, a IS NULL, typeof(a) FROM t",
    'SELECT UPPER(name), Count(*), "lower"(name) FROM t GROUP BY 1',
]

POSTGRES_ACCEPTED = [
    "SELECT c.name, count(o.id) AS n FROM customers AS c LEFT JOIN orders AS o ON o.customer_id = c.id "
    "GROUP BY c.name HAVING count(o.id) > 2 ORDER BY n DESC LIMIT 10",
    "SELECT date_trunc('month', created_at) AS m, sum(amount)::numeric(12, 2) FROM orders "
    "WHERE created_at >= CURRENT_DATE - INTERVAL '90 days' GROUP BY 1 ORDER BY 1",
    "SELECT EXTRACT(YEAR FROM created_at), to_char(created_at, 'YYYY-MM'), age(now(), created_at), "
    "created_at AT TIME ZONE 'UTC', date_part('dow', created_at), CAST(created_at AS date) FROM orders",
    "SELECT name, row_number() OVER (PARTITION BY city ORDER BY total DESC), rank() OVER w, "
    "lag(total) OVER w, lead(total, 2) OVER w, first_value(name) OVER w, ntile(4) OVER w, "
    "avg(total) OVER (ORDER BY day ROWS BETWEEN 6 PRECEDING AND CURRENT ROW) FROM sales WINDOW w AS (ORDER BY day)",
    "WITH big AS MATERIALIZED (SELECT customer_id, sum(amount) AS s FROM orders GROUP BY customer_id) "
    "SELECT * FROM big WHERE s > (SELECT avg(s) FROM big)",
    "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 12) SELECT x FROM n",
    "SELECT CASE WHEN amount > 100 THEN 'big' ELSE 'small' END, COALESCE(note, ''), NULLIF(a, 0), "
    "GREATEST(a, b), LEAST(a, b) FROM orders",
    "SELECT DISTINCT ON (customer_id) customer_id, amount FROM orders ORDER BY customer_id, amount DESC",
    "SELECT string_agg(name, ', ' ORDER BY name), array_agg(DISTINCT city), count(*) FILTER (WHERE paid), "
    "percentile_cont(0.5) WITHIN GROUP (ORDER BY amount), stddev(amount), bool_or(paid) FROM customers",
    "SELECT name FROM products WHERE name ILIKE '%tea%' AND name NOT LIKE 'x%' AND name ~* '^gr' "
    "AND name SIMILAR TO '%(a|b)%' AND category = ANY (ARRAY['a', 'b']) AND id IN (SELECT product_id FROM sales)",
    "SELECT name FROM a UNION SELECT name FROM b EXCEPT SELECT name FROM public.c ORDER BY 1 "
    "OFFSET 5 ROWS FETCH FIRST 5 ROWS ONLY",
    "SELECT substring(name FROM 1 FOR 3), position('a' IN name), trim(BOTH ' ' FROM name), upper(name), "
    "left(name, 2), concat(a, b), a || b, split_part(email, '@', 2), length(name), replace(name, 'a', 'b'), "
    "round(price::numeric, 2), ceil(price), floor(price), abs(delta), power(2, 3), sqrt(x), mod(a, 3) FROM t",
    "SELECT x::text, x::int, x::bigint, x::float8, '2024-01-01'::date, DATE '2024-01-01', "
    "TIMESTAMP '2024-01-01 10:00', x::varchar(10), CAST(x AS double precision), x::timestamptz FROM t",
    'SELECT "Order ID", o."Amount" FROM "Order Items" AS o WHERE o."Amount" IS DISTINCT FROM 0',
    "SELECT s.city, s.n FROM customers AS c CROSS JOIN LATERAL (SELECT c.city, count(*) AS n "
    "FROM orders AS o WHERE o.customer_id = c.id GROUP BY 1) AS s",
    "SELECT region, product, sum(qty), GROUPING(region) FROM sales GROUP BY ROLLUP (region, product)",
    "SELECT x, o FROM unnest(ARRAY[3, 1, 2]) WITH ORDINALITY AS u(x, o)",
    "SELECT pg_catalog.upper(name), a OPERATOR(pg_catalog.+) b FROM t",
    "SELECT doc -> 'a', doc ->> 'b', doc @> '{\"a\": 1}'::jsonb FROM docs WHERE doc ? 'a'",
    "SELECT EXISTS (SELECT 1 FROM orders), now(), CURRENT_TIMESTAMP, LOCALTIMESTAMP, make_date(2024, 1, 2)",
    "VALUES (1, 'a'), (2, 'b')",
    "TABLE customers",
    "SELECT * FROM t WHERE (a, b) IN (SELECT 1, 2) AND a = ALL (SELECT 1) ORDER BY a USING <",
]


@pytest.mark.parametrize("sql", SQLITE_ACCEPTED)
def test_realistic_sqlite_queries_pass(sql: str) -> None:
    assert check_sql(sql, "sqlite") == sql


@pytest.mark.parametrize("sql", POSTGRES_ACCEPTED)
def test_realistic_postgres_queries_pass(sql: str) -> None:
    assert check_sql(sql, "postgres") == sql


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_every_demo_gold_query_passes(dialect: str) -> None:
    questions = demo_questions()
    assert len(questions) >= 70
    for q in questions:
        assert check_sql(q.query, dialect) == q.query.strip().rstrip(";").strip()


# Payloads a single SELECT can carry, with the words the refusal must contain. PostgreSQL first: functions that
# run SQL given as text, read or write server files, signal or change the server, read settings, sleep, lock.
PG_FUNCTION_PAYLOADS = [
    "SELECT query_to_xml('select * from pg_authid', true, true, '')",
    "SELECT query_to_xml_and_xmlschema('select 1', true, true, '')",
    "SELECT query_to_xmlschema('select 1', true, true, '')",
    "SELECT cursor_to_xml('c', 10, true, true, '')",
    "SELECT table_to_xml('pg_authid', true, true, '')",
    "SELECT table_to_xml_and_xmlschema('t', true, true, '')",
    "SELECT schema_to_xml('public', true, true, '')",
    "SELECT database_to_xml(true, true, '')",
    "SELECT dblink('dbname=other', 'select secret from t')",
    "SELECT dblink_exec('dbname=test', 'drop table t')",
    "SELECT dblink_connect('c', 'dbname=test')",
    "SELECT pg_read_file('/etc/passwd')",
    "SELECT pg_read_file('base/1/1259', 0, 100000)",
    "SELECT pg_read_binary_file('/etc/passwd')",
    "SELECT pg_ls_dir('.')",
    "SELECT pg_stat_file('postgresql.conf')",
    "SELECT pg_ls_logdir()",
    "SELECT pg_ls_waldir()",
    "SELECT lo_import('/etc/passwd')",
    "SELECT lo_export(16400, '/tmp/evil')",
    "SELECT lo_from_bytea(0, 'x')",
    "SELECT lo_put(16400, 0, 'x')",
    "SELECT lo_get(16400)",
    "SELECT lo_create(0)",
    "SELECT lo_unlink(16400)",
    "SELECT lowrite(0, 'x')",
    "SELECT pg_terminate_backend(pid) FROM t",
    "SELECT pg_cancel_backend(1)",
    "SELECT pg_reload_conf()",
    "SELECT pg_rotate_logfile()",
    "SELECT pg_create_physical_replication_slot('hold', true)",
    "SELECT pg_create_logical_replication_slot('hold', 'test_decoding')",
    "SELECT pg_drop_replication_slot('hold')",
    "SELECT pg_switch_wal()",
    "SELECT pg_promote()",
    "SELECT set_config('statement_timeout', '0', false)",
    "SELECT current_setting('data_directory')",
    "SELECT current_setting('hba_file', true)",
    "SELECT pg_stat_reset()",
    "SELECT pg_stat_reset_shared('bgwriter')",
    "SELECT pg_stat_reset_single_table_counters(1259)",
    "SELECT pg_stat_statements_reset()",
    "SELECT txid_current()",
    "SELECT pg_current_xact_id()",
    "SELECT pg_sleep(10)",
    "SELECT pg_sleep_for('5 minutes')",
    "SELECT pg_sleep_until('tomorrow')",
    "SELECT pg_advisory_lock(1)",
    "SELECT pg_try_advisory_xact_lock(1)",
    "SELECT nextval('s')",
    "SELECT setval('s', 1)",
    "SELECT pg_notify('c', 'x')",
    "SELECT pg_logical_emit_message(true, 'p', 'x')",
    "SELECT pg_log_backend_memory_contexts(1)",
    "SELECT version()",
    "SELECT current_database()",
    "SELECT current_schemas(true)",
    "SELECT inet_server_addr()",
    "SELECT pg_backend_pid()",
    "SELECT repeat('x', 1000000000)",
    "SELECT lpad('x', 1000000000)",
    "SELECT format('%1000000000s', 'x')",
    "SELECT generate_series(1, 1000000000000)",
    "SELECT count(*) FROM generate_series(1, 1e12)",
    "SELECT * FROM ROWS FROM (generate_series(1, 10))",
    "SELECT * FROM pg_ls_dir('.') AS f",
    "SELECT 1 FROM t WHERE x = (SELECT pg_sleep(1))",
    "SELECT upper((SELECT string_agg(x, ',') FROM pg_ls_dir('.') AS x))",
]

PG_FORMS = [
    # (payload, fragment): other ways to write a call, casts, operators, keywords, constructs
    ("SELECT pg_catalog.pg_sleep(1)", "pg_catalog.pg_sleep()"),
    ("SELECT PG_CATALOG.PG_READ_FILE('/etc/passwd')", "pg_catalog.pg_read_file()"),
    ("SELECT public.pg_sleep(1)", "qualified only with pg_catalog"),
    ("SELECT public.upper(name) FROM t", "public.upper()"),
    ("SELECT other.db.upper(name) FROM t", "other.db.upper()"),
    ('SELECT "pg_sleep"(1)', "pg_sleep()"),
    ("SELECT \"query_to_xml\"('select 1', true, true, '')", "query_to_xml()"),
    ('SELECT "UPPER"(name) FROM t', "UPPER()"),
    ("SELECT 'pg_authid'::regclass", "type regclass"),
    ("SELECT CAST('pg_sleep' AS regproc)", "type regproc"),
    ("SELECT 'pg_sleep(float8)'::regprocedure", "type regprocedure"),
    ("SELECT 'public'::regnamespace", "type regnamespace"),
    ("SELECT 'postgres'::regrole", "type regrole"),
    ("SELECT 'int4'::regtype", "type regtype"),
    ("SELECT '+'::regoper", "type regoper"),
    ("SELECT 'pg_authid'::pg_catalog.regclass::oid", "type pg_catalog.regclass"),
    ("SELECT 1259::oid", "type oid"),
    ("SELECT '<a/>'::xml", "type xml"),
    ("SELECT x::public.mood FROM t", "type public.mood"),
    ("SELECT a OPERATOR(public.+) b FROM t", "operator public.+"),
    ("SELECT a @@ b FROM t", "operator @@"),
    ("SELECT a <-> b FROM t", "operator <->"),
    ("SELECT * FROM t WHERE a @@ ANY (SELECT b FROM u)", "operator @@"),
    ("SELECT * FROM t ORDER BY a USING @@", "operator @@"),
    ("SELECT CURRENT_USER", "CURRENT_USER is not allowed"),
    ("SELECT SESSION_USER", "SESSION_USER is not allowed"),
    ("SELECT CURRENT_SCHEMA", "CURRENT_SCHEMA is not allowed"),
    ("SELECT CURRENT_CATALOG", "CURRENT_CATALOG is not allowed"),
    ("SELECT * FROM t TABLESAMPLE SYSTEM (10)", "TABLESAMPLE is not allowed"),
    ("SELECT * FROM t TABLESAMPLE BERNOULLI (1) REPEATABLE (1)", "TABLESAMPLE is not allowed"),
    ("SELECT * FROM t FOR UPDATE", "FOR UPDATE"),
    ("SELECT * FROM t FOR KEY SHARE", "FOR KEY SHARE"),
    ("SELECT * INTO evil FROM t", "SELECT ... INTO"),
    ("SELECT * FROM xmltable('/a' PASSING '<a/>' COLUMNS b int)", "XMLTABLE is not allowed"),
    ("SELECT xmlelement(name a, 'x')", "an XML function is not allowed"),
    ("SELECT xmlserialize(content '<a/>' AS text)", "XMLSERIALIZE is not allowed"),
    ("SELECT json_object('a': 1)", "a SQL/JSON construct (JsonObjectConstructor) is not allowed"),
    ("SELECT $1", "a query parameter ($n) is not allowed"),
    ("WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x", "found DELETE (nested inside the query)"),
    ("WITH x AS (UPDATE t SET a = 1 RETURNING a) SELECT * FROM x", "found UPDATE (nested"),
    ("WITH x AS (INSERT INTO t VALUES (1) RETURNING a) SELECT * FROM x", "found INSERT (nested"),
    ("SELECT 1; SELECT pg_sleep(1)", "more than one statement (2: SELECT, SELECT)"),
    ("EXPLAIN ANALYZE SELECT pg_sleep(1)", "found EXPLAIN"),
    ("COPY (SELECT 1) TO PROGRAM 'id'", "found COPY"),
    ("SET ROLE postgres", "found SET"),
]

PG_RELATIONS = [
    ("SELECT rolname, rolpassword FROM pg_authid", "system catalog pg_authid"),
    ("SELECT * FROM pg_catalog.pg_authid", "relation pg_catalog.pg_authid is outside"),
    ("SELECT * FROM pg_shadow", "system catalog pg_shadow"),
    ("SELECT query FROM pg_stat_activity", "system catalog pg_stat_activity"),
    ("SELECT setting FROM pg_settings WHERE name = 'data_directory'", "system catalog pg_settings"),
    ("SELECT * FROM pg_roles", "system catalog pg_roles"),
    ("SELECT * FROM pg_class c JOIN t ON true", "system catalog pg_class"),
    ("SELECT * FROM pg_largeobject", "system catalog pg_largeobject"),
    ("TABLE pg_authid", "system catalog pg_authid"),
    ("SELECT * FROM information_schema.tables", "relation information_schema.tables is outside"),
    ("SELECT * FROM information_schema.role_table_grants", "relation information_schema.role_table_grants"),
    ("SELECT * FROM other_tenant.customers", "relation other_tenant.customers is outside"),
    ("SELECT * FROM pg_temp.t", "relation pg_temp.t is outside"),
    ("SELECT * FROM test.public.t", "names another database"),
    ("SELECT * FROM t WHERE id IN (SELECT oid FROM pg_catalog.pg_proc)", "pg_catalog.pg_proc"),
    ("WITH x AS (SELECT * FROM pg_authid) SELECT * FROM x", "system catalog pg_authid"),
]

SQLITE_PAYLOADS = [
    ("SELECT load_extension('/tmp/evil.so')", "load_extension()"),
    ("SELECT LOAD_EXTENSION('/tmp/evil.so')", "load_extension()"),
    ("SELECT \"load_extension\"('/tmp/evil.so')", "load_extension()"),
    ("SELECT [readfile]('/etc/passwd')", "readfile()"),
    ("SELECT `writefile`('/tmp/x', 'y')", "writefile()"),
    ("SELECT readfile('/etc/passwd')", "readfile()"),
    ("SELECT writefile('/tmp/x', 'y')", "writefile()"),
    ("SELECT edit('x')", "edit()"),
    ("SELECT fts3_tokenizer('simple')", "fts3_tokenizer()"),
    ("SELECT zeroblob(1000000000)", "zeroblob()"),
    ("SELECT randomblob(1000000000)", "randomblob()"),
    ("SELECT length(hex(zeroblob(500000000)))", "zeroblob()"),
    ("SELECT printf('%.*c', 1000000000, 'x')", "printf()"),
    ("SELECT format('%1000000000d', 1)", "format()"),
    ("SELECT replace(quote(x), 'a', 'b') FROM t", "quote()"),
    ("SELECT sqlite_version()", "sqlite_version()"),
    ("SELECT sqlite_source_id()", "sqlite_source_id()"),
    ("SELECT sqlite_compileoption_used('ENABLE_LOAD_EXTENSION')", "sqlite_compileoption_used()"),
    ("SELECT sqlite_offset(a) FROM t", "sqlite_offset()"),
    ("SELECT changes(), total_changes()", "changes()"),
    ("SELECT last_insert_rowid()", "last_insert_rowid()"),
    ("SELECT likelihood(a, 0.1) FROM t", "likelihood()"),
    ("SELECT * FROM t WHERE a REGEXP 'x'", "regexp()"),
    ("SELECT 1 FROM t WHERE x = (SELECT load_extension('x'))", "load_extension()"),
    ("SELECT * FROM sqlite_master", "system table sqlite_master"),
    ("SELECT sql FROM sqlite_schema", "system table sqlite_schema"),
    ("SELECT * FROM sqlite_temp_master", "system table sqlite_temp_master"),
    ("SELECT * FROM sqlite_temp_schema", "system table sqlite_temp_schema"),
    ("SELECT * FROM SQLITE_MASTER", "system table SQLITE_MASTER"),
    ("SELECT * FROM main.sqlite_master", "system table main.sqlite_master"),
    ("SELECT * FROM sqlite_sequence", "system table sqlite_sequence"),
    ("SELECT * FROM sqlite_stat1", "system table sqlite_stat1"),
    ("SELECT * FROM temp.t", "relation temp.t is outside the database"),
    ("SELECT * FROM other.customers", "relation other.customers is outside the database"),
    ("SELECT * FROM pragma_table_info('singer')", "table-valued function pragma_table_info()"),
    ("SELECT * FROM pragma_database_list", "virtual table pragma_database_list"),
    ("SELECT name FROM pragma_function_list", "virtual table pragma_function_list"),
    ("SELECT * FROM json_each('[1, 2]')", "table-valued function json_each()"),
    ("SELECT * FROM dbstat", "virtual table dbstat"),
    ("SELECT * FROM generate_series(1, 1000000000000)", "table-valued function generate_series()"),
    ("WITH x AS (SELECT * FROM sqlite_master) SELECT * FROM x", "system table sqlite_master"),
    ("SELECT * FROM t FOR UPDATE", "FOR UPDATE"),
    ("ATTACH DATABASE '/tmp/x' AS x", "found ATTACH"),
    ("PRAGMA writable_schema = 1", "found PRAGMA"),
]


def _refusal(sql: str, dialect: str) -> str:
    with pytest.raises(SqlRejected) as info:
        check_sql(sql, dialect)
    reason = str(info.value)
    assert "\n" not in reason
    assert info.value.detail is None, reason  # every payload parses: it is refused for what it is
    return reason


@pytest.mark.parametrize("sql", PG_FUNCTION_PAYLOADS)
def test_postgres_functions_off_the_list_are_refused(sql: str) -> None:
    reason = _refusal(sql, "postgres")
    assert reason.startswith("calling function "), reason
    assert "not on the postgres allowlist" in reason


@pytest.mark.parametrize(("sql", "fragment"), PG_FORMS + PG_RELATIONS)
def test_postgres_other_forms_casts_operators_and_relations_are_refused(sql: str, fragment: str) -> None:
    assert fragment in _refusal(sql, "postgres")


@pytest.mark.parametrize(("sql", "fragment"), SQLITE_PAYLOADS)
def test_sqlite_payloads_are_refused(sql: str, fragment: str) -> None:
    assert fragment in _refusal(sql, "sqlite")


def test_payload_counts() -> None:
    """The figures for the report: every payload tried is refused."""
    tried = refused = 0
    for dialect, sql in (
        [("postgres", s) for s in PG_FUNCTION_PAYLOADS]
        + [("postgres", s) for s, _ in PG_FORMS + PG_RELATIONS]
        + [("sqlite", s) for s, _ in SQLITE_PAYLOADS]
    ):
        tried += 1
        try:
            check_sql(sql, dialect)
        except SqlRejected:
            refused += 1
    print(f"sqlsafe payloads: {tried} tried, {refused} refused")
    assert tried == refused > 150


def test_a_function_refusal_names_it_and_the_kinds_allowed() -> None:
    reason = _refusal("SELECT query_to_xml('select 1', true, true, '')", "postgres")
    assert reason == (
        "calling function query_to_xml() is not allowed: not on the postgres allowlist (aggregate, string, "
        "date/time, math, conversion, conditional and window functions)"
    )


def test_allowed_schemas_open_exactly_what_they_name() -> None:
    assert check_sql("SELECT * FROM sales.orders", "postgres", schemas=["sales"]) == "SELECT * FROM sales.orders"
    assert "outside the database's schema(s) sales" in _refusal_with("SELECT * FROM public.t", ["sales"])
    catalogs = ["public", "pg_catalog", "information_schema"]
    for sql in ("SELECT * FROM pg_catalog.pg_class", "SELECT relname FROM pg_class", "TABLE information_schema.tables"):
        assert check_sql(sql, "postgres", schemas=catalogs) == sql
    # Allowing the catalog's relations does not allow its functions.
    assert "pg_read_file()" in _refusal_with("SELECT pg_read_file('/etc/passwd')", catalogs)


def _refusal_with(sql: str, schemas: list[str]) -> str:
    with pytest.raises(SqlRejected) as info:
        check_sql(sql, "postgres", schemas=schemas)
    return str(info.value)


def test_sqlite_ignores_schemas_main_only() -> None:
    assert check_sql("SELECT * FROM main.t", "sqlite", schemas=["pg_catalog"]) == "SELECT * FROM main.t"
    with pytest.raises(SqlRejected, match="outside the database"):
        check_sql("SELECT * FROM temp.t", "sqlite", schemas=["temp"])


def test_every_function_the_sqlite_engine_knows_is_allowed_exactly_when_listed() -> None:
    # The engine the gateway runs (Python's sqlite3) lists its functions: each one, called by its own name with
    # its own arity, passes exactly when it is on the allowlist; nothing else slips through a sqlglot mapping.
    with sqlite3.connect(":memory:") as con:
        rows = con.execute("SELECT name, narg FROM pragma_function_list").fetchall()
    assert len(rows) > 50
    wrong = []
    for name, narg in rows:
        args = ", ".join(["1"] * (narg if narg >= 0 else 2))
        sql = f"SELECT {name}({args})"
        try:
            check_sql(sql, "sqlite")
            accepted = True
        except SqlRejected:
            accepted = False
        if accepted != (name.lower() in SQLITE_FUNCTIONS):
            wrong.append(f"{sql}: accepted={accepted}")
    assert not wrong, wrong


def test_function_names_sqlite_in_any_case_postgres_exactly() -> None:
    check_sql("SELECT COUNT(*), strftime('%Y', 'now')", "sqlite")
    check_sql("SELECT date_trunc('day', now())", "postgres")
    for sql, dialect in [
        ("SELECT load_extension('x')", "sqlite"),
        ("""SELECT "DATE_TRUNC"('day', now())""", "postgres"),
        ("SELECT query_to_xml('SELECT 1', true, true, '')", "postgres"),
    ]:
        with pytest.raises(SqlRejected, match="not allowed"):
            check_sql(sql, dialect)


def test_every_postgres_catalog_function_is_allowed_exactly_when_listed(pg_admin_url: str) -> None:
    # Every function name of the running server's pg_catalog, called bare and pg_catalog-qualified: accepted
    # exactly when on the allowlist; and every listed name is a real function of the server.
    async def names() -> set[str]:
        conn = await asyncpg.connect(pg_admin_url, timeout=5)
        try:
            rows = await conn.fetch(
                "SELECT DISTINCT proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = 'pg_catalog'"
            )
        finally:
            await conn.close()
        return {str(r[0]) for r in rows}

    catalog = asyncio.run(names())
    assert len(catalog) > 1000
    wrong = []
    for name in sorted(catalog):
        quoted = '"' + name.replace('"', '""') + '"'
        for sql in (f"SELECT {quoted}(1)", f"SELECT pg_catalog.{quoted}(1)"):
            try:
                check_sql(sql, "postgres")
                accepted = True
            except SqlRejected:
                accepted = False
            if accepted != (name in POSTGRES_FUNCTIONS):
                wrong.append(f"{sql}: accepted={accepted}")
    assert not wrong, wrong[:20]
    assert catalog >= POSTGRES_FUNCTIONS, sorted(POSTGRES_FUNCTIONS - catalog)
    print(f"pg_catalog functions: {len(catalog)}, allowed: {len(POSTGRES_FUNCTIONS)}")


class _Recording(Database):
    """A database that records what would run (the check is the base class's)."""

    dialect: ClassVar = "postgres"

    async def _run(self, sql: str) -> QueryResult:
        return QueryResult(["sql"], [[sql]], 1, False, 0.0)

    async def _introspect(self) -> SchemaInfo:  # pragma: no cover - not used
        raise NotImplementedError


def test_execute_checks_with_the_configured_schema_and_allow_schemas() -> None:
    url = "postgresql://reader@db:5432/sales"

    async def run(cfg: DatabaseConfig, sql: str) -> object:
        return (await _Recording("db", cfg).execute(sql)).rows

    default = DatabaseConfig(url=url)
    assert asyncio.run(run(default, "SELECT * FROM public.t")) == [["SELECT * FROM public.t"]]
    with pytest.raises(SqlRejected, match="outside"):
        asyncio.run(run(default, "SELECT * FROM sales.t"))
    sales = DatabaseConfig.model_validate({"url": url, "schema": "sales", "allow_schemas": ["pg_catalog"]})
    assert asyncio.run(run(sales, "SELECT * FROM sales.t")) == [["SELECT * FROM sales.t"]]
    assert asyncio.run(run(sales, "SELECT * FROM pg_class")) == [["SELECT * FROM pg_class"]]
    with pytest.raises(SqlRejected, match="outside"):
        asyncio.run(run(sales, "SELECT * FROM public.t"))


def test_allow_schemas_is_validated() -> None:
    from pydantic import ValidationError

    assert DatabaseConfig(url="sqlite:///x.sqlite").allow_schemas == []
    with pytest.raises(ValidationError):
        DatabaseConfig.model_validate({"url": "sqlite:///x.sqlite", "allow_schemas": [""]})


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_absurd_nesting_is_refused_with_a_reason_not_a_crash(dialect: str) -> None:
    # sqlglot's recursive descent ran out of Python stack (a RecursionError, a 500) on ~50 nested parentheses.
    sql = "SELECT " + "(" * 60000 + "1" + ")" * 60000
    assert "cannot parse SQL" in _refusal_with_detail(sql, dialect)
    assert check_sql("SELECT " + "(" * 30 + "1" + ")" * 30, dialect)


def _refusal_with_detail(sql: str, dialect: str) -> str:
    with pytest.raises(SqlRejected) as info:
        check_sql(sql, dialect)
    return str(info.value)
