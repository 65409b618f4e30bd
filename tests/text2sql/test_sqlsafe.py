"""``check_sql``: one read-only query passes unchanged; everything else is rejected with a reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.errors import BadRequest
from gateway.text2sql.sqlsafe import SqlRejected, check_sql, is_dangerous_function

SPIDER_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "spider-dev"

ACCEPTED: list[tuple[str, str]] = [
    ("sqlite", "SELECT name FROM singer"),
    ("sqlite", "select count(*) from singer where age > 30"),
    ("sqlite", "SELECT T1.name FROM singer AS T1 JOIN concert AS T2 ON T1.id = T2.singer_id WHERE T2.year = 2014"),
    (
        "sqlite",
        "SELECT name FROM singer WHERE id IN (SELECT singer_id FROM concert GROUP BY singer_id HAVING count(*) > 1)",
    ),
    ("sqlite", "WITH t AS (SELECT 1 AS x) SELECT x FROM t"),
    ("sqlite", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5) SELECT x FROM c"),
    ("sqlite", "SELECT a FROM t UNION SELECT b FROM u"),
    ("sqlite", "SELECT a FROM t INTERSECT SELECT b FROM u EXCEPT SELECT c FROM v"),
    ("sqlite", "SELECT name, rank() OVER (PARTITION BY country ORDER BY age DESC) FROM singer"),
    ("sqlite", "VALUES (1, 'a'), (2, 'b')"),
    ("sqlite", "SELECT 'a;b' AS semicolon_in_string"),
    ("sqlite", 'SELECT "weird name" FROM "order items" LIMIT 5 OFFSET 2'),
    ("postgres", "SELECT x::text, now() - interval '1 day' FROM unnest(ARRAY[1, 2, 3]) AS g(x)"),
    ("postgres", "SELECT DISTINCT ON (a) a, b FROM t ORDER BY a, b"),
    ("postgres", "(SELECT 1) UNION ALL (SELECT 2)"),
    ("postgres", "SELECT lower(name), lo FROM t"),
]


@pytest.mark.parametrize(("dialect", "sql"), ACCEPTED)
def test_read_only_queries_pass_unchanged(dialect: str, sql: str) -> None:
    assert check_sql(sql, dialect) == sql


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("select 1;", "select 1"),
        ("  select 1 ;  \n", "select 1"),
        ("select 1;;", "select 1"),
        ("select 1; -- done", "select 1"),
        ("SELECT 'x;' ;", "SELECT 'x;'"),
        ("-- lead\nSELECT 1", "-- lead\nSELECT 1"),
    ],
)
def test_trailing_semicolons_and_comments_are_cut_from_the_original_text(sql: str, expected: str) -> None:
    assert check_sql(sql, "sqlite") == expected


def test_the_text_is_not_regenerated() -> None:
    sql = "select   Name  from SINGER where x = 'It''s'"
    assert check_sql(sql, "sqlite") == sql
    assert check_sql("SELECT $$a$$::text", "postgres") == "SELECT $$a$$::text"


REJECTED: list[tuple[str, str, str]] = [
    ("sqlite", "", "empty SQL"),
    ("sqlite", "   \n ", "empty SQL"),
    ("sqlite", ";;", "empty SQL"),
    ("sqlite", "-- just a comment", "empty SQL"),
    ("sqlite", "select from where", "cannot parse SQL"),
    ("sqlite", "SELECT (1", "cannot parse SQL"),
    ("sqlite", "select 'unterminated", "cannot parse SQL"),
    ("sqlite", "hello world", "found HELLO"),
    ("sqlite", "select 1; select 2", "more than one statement"),
    ("sqlite", "select 1; drop table t", "more than one statement (2: SELECT, DROP)"),
    ("sqlite", "INSERT INTO t VALUES (1)", "found INSERT"),
    ("sqlite", "insert or replace into t values (1)", "found INSERT"),
    ("sqlite", "replace into t values (1)", "found REPLACE"),
    ("sqlite", "UPDATE t SET a = 1", "found UPDATE"),
    ("sqlite", "DELETE FROM t", "found DELETE"),
    ("postgres", "MERGE INTO t USING s ON t.a = s.a WHEN MATCHED THEN DELETE", "found MERGE"),
    ("sqlite", "CREATE TABLE x (a int)", "found CREATE"),
    ("sqlite", "create table x as select * from t", "found CREATE"),
    ("sqlite", "create view v as select 1", "found CREATE"),
    ("sqlite", "DROP TABLE t", "found DROP"),
    ("sqlite", "ALTER TABLE t ADD COLUMN b int", "found ALTER"),
    ("postgres", "TRUNCATE t", "found TRUNCATE"),
    ("postgres", "GRANT SELECT ON t TO u", "found GRANT"),
    ("postgres", "REVOKE ALL ON t FROM u", "found REVOKE"),
    ("sqlite", "attach database 'x' as y", "found ATTACH"),
    ("sqlite", "DETACH y", "found DETACH"),
    ("sqlite", "pragma table_info(t)", "found PRAGMA"),
    ("sqlite", "PRAGMA writable_schema = 1", "found PRAGMA"),
    ("sqlite", "VACUUM", "found VACUUM"),
    ("postgres", "VACUUM FULL t", "found VACUUM"),
    ("postgres", "COPY t TO STDOUT", "found COPY"),
    ("postgres", "COPY t FROM '/etc/passwd'", "found COPY"),
    ("postgres", "SET statement_timeout = 0", "found SET"),
    ("postgres", "CALL p()", "found CALL"),
    ("postgres", "DO $$ BEGIN END $$", "found DO"),
    ("postgres", "LOCK TABLE t", "found LOCK"),
    ("postgres", "REINDEX TABLE t", "found REINDEX"),
    ("sqlite", "REINDEX", "found REINDEX"),
    ("postgres", "ANALYZE t", "found ANALYZE"),
    ("sqlite", "BEGIN", "found BEGIN"),
    ("postgres", "EXPLAIN ANALYZE DELETE FROM t", "found EXPLAIN"),
    ("postgres", "with x as (delete from t returning *) select * from x", "found DELETE (nested inside the query)"),
    ("postgres", "WITH a AS (INSERT INTO t VALUES (1) RETURNING 1) SELECT * FROM a", "found INSERT (nested"),
    ("postgres", "WITH a AS (UPDATE t SET x = 1 RETURNING x) SELECT * FROM a", "found UPDATE (nested"),
    ("sqlite", "with x as (select 1) insert into t select * from x", "found INSERT"),
    ("postgres", "SELECT * INTO t2 FROM t", "SELECT ... INTO"),
    ("postgres", "SELECT * FROM t FOR UPDATE", "FOR UPDATE"),
    ("postgres", "SELECT * FROM t FOR SHARE", "FOR SHARE"),
    ("postgres", "SELECT * FROM t FOR NO KEY UPDATE SKIP LOCKED", "FOR NO KEY UPDATE"),
    ("postgres", "SELECT * FROM (SELECT * FROM t FOR UPDATE) AS s", "FOR UPDATE"),
    ("postgres", "select pg_sleep(10)", "pg_sleep()"),
    ("postgres", "SELECT PG_SLEEP_FOR('5 minutes')", "pg_sleep_for()"),
    ("postgres", "select public.pg_sleep(1)", "pg_sleep()"),
    ("postgres", 'select "pg_sleep"(1)', "pg_sleep()"),
    ("postgres", "SELECT 1 FROM t WHERE x = (SELECT pg_sleep(1))", "pg_sleep()"),
    ("postgres", "SELECT pg_read_file('/etc/passwd')", "pg_read_file()"),
    ("postgres", "SELECT pg_read_binary_file('/etc/passwd')", "pg_read_binary_file()"),
    ("postgres", "SELECT pg_ls_dir('.')", "pg_ls_dir()"),
    ("postgres", "SELECT lo_import('/etc/passwd')", "lo_import()"),
    ("postgres", "SELECT lo_export(1, '/tmp/x')", "lo_export()"),
    ("postgres", "SELECT dblink('db', 'select 1')", "dblink()"),
    ("postgres", "SELECT dblink_exec('db', 'drop table t')", "dblink_exec()"),
    ("postgres", "SELECT pg_terminate_backend(1)", "pg_terminate_backend()"),
    ("postgres", "SELECT pg_cancel_backend(1)", "pg_cancel_backend()"),
    ("postgres", "SELECT set_config('statement_timeout', '0', false)", "set_config()"),
    ("postgres", "SELECT pg_advisory_lock(1)", "pg_advisory_lock()"),
    ("postgres", "SELECT pg_advisory_xact_lock(1)", "pg_advisory_xact_lock()"),
    ("postgres", "SELECT nextval('s')", "nextval()"),
    ("sqlite", "select load_extension('x')", "load_extension()"),
    ("sqlite", "SELECT readfile('/etc/passwd')", "readfile()"),
    ("sqlite", "SELECT writefile('/tmp/x', 'y')", "writefile()"),
    ("sqlite", "SELECT fts3_tokenizer('simple')", "fts3_tokenizer()"),
]


@pytest.mark.parametrize(("dialect", "sql", "fragment"), REJECTED)
def test_everything_else_is_rejected_with_a_reason(dialect: str, sql: str, fragment: str) -> None:
    # The fragments are our words (sqlsafe's), never sqlglot's: its wording changes between versions.
    with pytest.raises(SqlRejected) as info:
        check_sql(sql, dialect)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message
    assert info.value.reason == message


NOT_A_QUERY = "only read-only queries (SELECT, WITH, VALUES) may run; found "


@pytest.mark.parametrize(
    ("dialect", "sql", "keyword"),
    [
        # Statements sqlglot models, statements it only knows as a "Command", and text that is no statement:
        # one wording, the keyword read from the text.
        ("sqlite", "INSERT INTO t VALUES (1)", "INSERT"),
        ("sqlite", "with x as (select 1) insert into t select * from x", "INSERT"),
        ("sqlite", "pragma table_info(t)", "PRAGMA"),
        ("sqlite", "REINDEX", "REINDEX"),
        ("postgres", "REINDEX TABLE t", "REINDEX"),
        ("sqlite", "VACUUM", "VACUUM"),
        ("postgres", "CALL p()", "CALL"),
        ("postgres", "EXPLAIN ANALYZE DELETE FROM t", "EXPLAIN"),
        ("sqlite", "-- why\nhello world", "HELLO"),
    ],
)
def test_a_statement_that_is_not_a_query_is_refused_in_our_words(dialect: str, sql: str, keyword: str) -> None:
    with pytest.raises(SqlRejected) as info:
        check_sql(sql, dialect)
    assert str(info.value) == NOT_A_QUERY + keyword
    assert info.value.detail is None


@pytest.mark.parametrize(
    ("sql", "where"),
    [
        ("select from where", " (line 1, column 17)"),
        ("SELECT (1", " (line 1, column 9)"),
        ("select 'unterminated", ""),
    ],
)
def test_text_that_does_not_parse_is_refused_in_our_words_with_the_parsers_apart(sql: str, where: str) -> None:
    with pytest.raises(SqlRejected) as info:
        check_sql(sql, "sqlite")
    reason = str(info.value)
    assert reason.startswith("cannot parse SQL: not one valid sqlite query")
    assert reason.endswith(where)
    # The parser's own description travels apart (for a model revising its query); its wording is not ours.
    assert info.value.detail and "\n" not in info.value.detail
    assert info.value.detail not in reason


def test_sql_rejected_is_a_bad_request() -> None:
    assert issubclass(SqlRejected, BadRequest)


def test_unknown_dialect_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unsupported SQL dialect 'mysql'"):
        check_sql("select 1", "mysql")
    assert check_sql("select 1", "postgresql") == "select 1"


def test_the_authorizers_short_blocklist_is_still_exported() -> None:
    # gateway.text2sql.db.sqlite's authorizer (the engine-side wall) still uses it; the static check does not.
    assert is_dangerous_function("PG_SLEEP")
    assert is_dangerous_function("pg_sleep_until")
    assert is_dangerous_function("dblink_connect")
    assert not is_dangerous_function("current_setting")
    assert not is_dangerous_function("lower")
    assert not is_dangerous_function("count")


@pytest.mark.shared
def test_every_spider_dev_gold_query_passes() -> None:
    dev = SPIDER_DIR / "dev.json"
    if not dev.is_file():
        pytest.skip(f"Spider dev set {dev} is absent")
    present = {p.name for p in (SPIDER_DIR / "database").iterdir() if p.is_dir()}
    items = [it for it in json.loads(dev.read_text(encoding="utf-8")) if it["db_id"] in present]
    assert len(present) == 19
    assert len(items) == 972
    failures = []
    for it in items:
        try:
            check_sql(it["query"], "sqlite")
        except SqlRejected as exc:
            failures.append(f"{it['db_id']}: {it['query']} -> {exc}")
    assert not failures, "\n".join(failures[:20])
