"""The demo retail dataset: deterministic data, valid schema, gold queries that answer, Spider layout."""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import sqlglot

from gateway.text2sql.demo import (
    DB_ID,
    TABLES,
    DemoQuestion,
    create_table_sql,
    demo_questions,
    demo_rows,
    load_sqlite,
    postgres_script,
    spider_tables_entry,
    write_spider_dataset,
    write_sqlite,
)
from gateway.text2sql.demo.schema import QUESTIONS_RESOURCE, parse_questions

QUESTIONS = demo_questions()


def dump(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def conn() -> Iterator[sqlite3.Connection]:
    c = sqlite3.connect(":memory:")
    load_sqlite(c)
    yield c
    c.close()


def test_rows_are_deterministic_and_depend_on_the_seed() -> None:
    assert demo_rows() == demo_rows(0)
    assert demo_rows(1) != demo_rows(0)
    rows = demo_rows()
    assert set(rows) == {t.name for t in TABLES}
    assert 2_000 <= sum(len(v) for v in rows.values()) <= 10_000
    assert len(TABLES) == 7


def test_two_sqlite_files_hold_identical_contents(tmp_path: Path) -> None:
    a = write_sqlite(tmp_path / "a" / "demo.sqlite")
    b = write_sqlite(tmp_path / "b.sqlite")
    assert dump(a) == dump(b)
    assert any(line.startswith('INSERT INTO "order_items"') for line in dump(a))
    assert dump(a) != dump(write_sqlite(tmp_path / "c.sqlite", seed=3))


def test_write_sqlite_overwrites_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "demo.sqlite"
    path.write_text("not a database")
    assert write_sqlite(path) == path
    assert write_sqlite(path, seed=0) == path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.sqlite"]
    assert dump(path) == dump(write_sqlite(tmp_path / "again.sqlite"))


def test_keys_hold_and_nullable_columns_hold_nulls(conn: sqlite3.Connection) -> None:
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    for table in TABLES:
        pk = table.primary_key
        total, distinct = conn.execute(f"SELECT COUNT(*), COUNT(DISTINCT {pk}) FROM {table.name}").fetchone()
        assert total == distinct > 0, table.name
        for col in table.columns:
            nulls = conn.execute(f"SELECT COUNT(*) FROM {table.name} WHERE {col.name} IS NULL").fetchone()[0]
            assert (nulls > 0) == col.nullable, f"{table.name}.{col.name}"
    # dates are ISO text, managers are hired employees, every order has an item
    for table_name, col_name in (("employees", "hire_date"), ("orders", "order_date"), ("customers", "signup_date")):
        values = [r[0] for r in conn.execute(f"SELECT {col_name} FROM {table_name}")]
        assert all(re.fullmatch(r"20\d\d-\d\d-\d\d", v) for v in values)
    itemless = "SELECT COUNT(*) FROM orders WHERE order_id NOT IN (SELECT order_id FROM order_items)"
    assert conn.execute(itemless).fetchone()[0] == 0


def test_questions_are_many_unique_and_cover_every_difficulty() -> None:
    assert len(QUESTIONS) >= 60
    assert len({q.question for q in QUESTIONS}) == len(QUESTIONS)
    assert len({q.query for q in QUESTIONS}) == len(QUESTIONS)
    counts = Counter(q.difficulty for q in QUESTIONS)
    assert set(counts) == {"easy", "medium", "hard"} and min(counts.values()) >= 15
    assert sum(q.evidence is not None for q in QUESTIONS) >= 10
    text = " ".join(q.query for q in QUESTIONS)
    constructs = ["JOIN", "GROUP BY", "HAVING", "ORDER BY", "LIMIT", "DISTINCT", "UNION", "INTERSECT", "EXCEPT"]
    for construct in [*constructs, "WITH", "NOT IN", "AVG(", "SUM(", "MAX(", "BETWEEN", "IS NULL", "CASE"]:
        assert construct in text, construct


def test_questions_are_package_data_with_one_line_queries() -> None:
    text = (resources.files("gateway.text2sql") / QUESTIONS_RESOURCE).read_text(encoding="utf-8")
    assert parse_questions(json.loads(text)) == tuple(QUESTIONS)
    assert demo_questions() is not demo_questions()  # a fresh list each call: callers may change theirs
    for q in QUESTIONS:
        for sql in (q.query, q.query_pg):
            assert sql is None or sql == " ".join(sql.split()), sql


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"question": "q"}, "expected a list of questions"),
        (["q"], "[0]: expected an object"),
        ([{"question": "q", "query": "SELECT 1"}], "missing fields ['difficulty']"),
        ([{"question": "q", "query": "SELECT 1", "difficulty": "easy", "gold": "x"}], "unknown fields ['gold']"),
        ([{"question": "q", "query": "SELECT 1", "difficulty": "trivial"}], "[0].difficulty: expected one of"),
        ([{"question": "", "query": "SELECT 1", "difficulty": "easy"}], "[0].question: expected a non-empty string"),
    ],
)
def test_a_bad_questions_file_names_the_entry_and_the_field(data: object, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_questions(data, "questions.json")


@pytest.mark.parametrize("q", QUESTIONS, ids=[f"q{i}" for i in range(len(QUESTIONS))])
def test_every_gold_query_answers_on_sqlite(conn: sqlite3.Connection, q: DemoQuestion) -> None:
    rows = conn.execute(q.query).fetchall()
    assert len(rows) >= 1
    assert sqlglot.parse_one(q.query_pg or q.query, read="postgres") is not None
    assert q.query_pg != q.query


def test_ordered_gold_queries_have_unique_answers(conn: sqlite3.Connection) -> None:
    """A LIMIT after an ORDER BY must not cut through a tie, or dialects could disagree on the answer."""
    for q in QUESTIONS:
        m = re.search(r"ORDER BY (.*) LIMIT (\d+)$", q.query)
        if m is None:
            continue
        assert "," in m.group(1), f"no tie-breaker: {q.question}"


def test_create_table_sql_renders_each_dialect() -> None:
    orders = next(t for t in TABLES if t.name == "orders")
    lite, pg = create_table_sql(orders, "sqlite"), create_table_sql(orders, "postgres")
    assert "order_date TEXT NOT NULL" in lite and "order_date DATE NOT NULL" in pg
    assert "employee_id INTEGER," in pg and "order_id INTEGER PRIMARY KEY" in pg
    assert "FOREIGN KEY (customer_id) REFERENCES customers (customer_id)" in pg
    products = next(t for t in TABLES if t.name == "products")
    assert "price NUMERIC(12,2)" in create_table_sql(products, "postgres")


def test_postgres_script_creates_then_fills_every_table() -> None:
    script = postgres_script()
    assert script == postgres_script() and script.startswith("BEGIN;") and script.rstrip().endswith("COMMIT;")
    rows = demo_rows()
    created = [m.group(1) for m in re.finditer(r"^CREATE TABLE (\w+)", script, re.MULTILINE)]
    assert created == [t.name for t in TABLES]
    for table in TABLES:
        inserted = sum(
            block.count("\n(")
            for block in re.findall(rf"^INSERT INTO {table.name} \(.*?;$", script, re.MULTILINE | re.DOTALL)
        )
        assert inserted == len(rows[table.name]), table.name
    ddl = [s for s in script.split(";\n") if s.startswith("CREATE TABLE")]
    assert all(isinstance(sqlglot.parse_one(s, read="postgres"), sqlglot.exp.Create) for s in ddl)
    assert len(ddl) == len(TABLES)


def test_spider_layout_matches_the_sqlite_schema(tmp_path: Path) -> None:
    out = write_spider_dataset(tmp_path / "demo")
    dev = json.loads((out / "dev.json").read_text())
    tables = json.loads((out / "tables.json").read_text())
    db_file = out / "database" / DB_ID / f"{DB_ID}.sqlite"
    assert len(dev) == len(QUESTIONS)
    assert all({"db_id", "question", "query", "difficulty"} <= set(item) for item in dev)
    assert sum("evidence" in item for item in dev) == sum(q.evidence is not None for q in QUESTIONS)
    assert [t["db_id"] for t in tables] == [DB_ID] and tables[0] == spider_tables_entry()
    entry = tables[0]
    conn = sqlite3.connect(db_file)
    try:
        expected: list[list[object]] = [[-1, "*"]]
        for t_idx, name in enumerate(entry["table_names_original"]):
            expected += [[t_idx, row[1]] for row in conn.execute(f"PRAGMA table_info({name})")]
        assert entry["column_names_original"] == expected
        assert len(entry["column_names"]) == len(entry["column_types"]) == len(expected)
        assert set(entry["column_types"]) == {"text", "number", "time"}
        cols = entry["column_names_original"]
        tnames = entry["table_names_original"]
        for idx in entry["primary_keys"]:
            t_idx, col = cols[idx]
            pk = [r[1] for r in conn.execute(f"PRAGMA table_info({tnames[t_idx]})") if r[5]]
            assert pk == [col]
        fks = {(tname, r[3], r[2], r[4]) for tname in tnames for r in conn.execute(f"PRAGMA foreign_key_list({tname})")}
        spider_fks = {
            (tnames[cols[a][0]], cols[a][1], tnames[cols[b][0]], cols[b][1]) for a, b in entry["foreign_keys"]
        }
        assert spider_fks == fks and len(fks) == 8
        for item in dev:
            assert conn.execute(item["query"]).fetchall()
    finally:
        conn.close()
