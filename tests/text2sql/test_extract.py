"""Extraction of SQL, verdicts and lists from model output: tricky answers, fuzzing, scripted answers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gateway.text2sql.answers import build_demo_answers, normalise_sql
from gateway.text2sql.extract import MAX_ITEM_CHARS, MAX_ITEMS, extract_list, extract_sql, extract_verdict

SPIDER = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "spider-dev"

SQL_CASES: list[tuple[str, str | None]] = [
    ("```sql\nSELECT name FROM singer;\n```", "SELECT name FROM singer"),
    ("```SQL\nSELECT name FROM singer\n```", "SELECT name FROM singer"),
    ("```sqlite\nSELECT 1 FROM t\n```", "SELECT 1 FROM t"),
    ("Here you go:\n```\nSELECT name FROM singer\n```\nDone.", "SELECT name FROM singer"),
    ("Draft:\n```sql\nSELECT 1\n```\nFinal:\n```sql\nSELECT a FROM t WHERE b > 2;\n```", "SELECT a FROM t WHERE b > 2"),
    ("The answer is:\nSELECT count(*) FROM singer;\nThis query counts the singers.", "SELECT count(*) FROM singer"),
    ("select name from singer where age > 20\n\nExplanation: it filters.", "select name from singer where age > 20"),
    ("SELECT name\nFROM singer\nWHERE age > 20\nExplanation:\nIt filters.", "SELECT name\nFROM singer\nWHERE age > 20"),
    ("SELECT name FROM singer\nThis query returns every name.", "SELECT name FROM singer"),
    ("SELECT name FROM singer\nNote that names repeat.", "SELECT name FROM singer"),
    ("SELECT name FROM singer\n- The query selects names.", "SELECT name FROM singer"),
    ("WITH x AS (SELECT a FROM t)\nSELECT * FROM x\nThis uses a CTE.", "WITH x AS (SELECT a FROM t)\nSELECT * FROM x"),
    ("with recursive r(n) as (select 1 union all select n + 1 from r where n < 3) select n from r",
     "with recursive r(n) as (select 1 union all select n + 1 from r where n < 3) select n from r"),
    ("SELECT a FROM t WHERE note = 'x;y' AND b = 1; -- done", "SELECT a FROM t WHERE note = 'x;y' AND b = 1"),
    ("```sql\nSELECT a FROM t WHERE s = 'it''s; fine'\n```", "SELECT a FROM t WHERE s = 'it''s; fine'"),
    ("Use `SELECT name FROM singer` to get it.", "SELECT name FROM singer"),
    ('"SELECT name FROM singer"', "SELECT name FROM singer"),
    ("SQL: SELECT name FROM singer.", "SELECT name FROM singer"),
    ("```sql\nSELECT T1.a FROM x AS T1\nWHERE T1.b IN (\n  SELECT c FROM y\n)\n```",
     "SELECT T1.a FROM x AS T1\nWHERE T1.b IN (\n  SELECT c FROM y\n)"),
    ("The query:\n\n    SELECT name\n    FROM singer\n\nThe result is a list.", "SELECT name\n    FROM singer"),
    ("```sql\nSELECT name FROM singer WHERE", "SELECT name FROM singer WHERE"),
    ("Try:\n```\nSELECT a FROM t WHERE x ~~~ 3\n```\nok", "SELECT a FROM t WHERE x ~~~ 3"),
    ("I cannot answer this question with the given schema.", None),
    ("We select the rows from the table where the id is 1.", None),
    ("with the schema alone, nothing can be said", None),
    ('```python\ncursor.execute("SELECT 1")\n```', None),
    ("```sql\n```", None),
    ("", None),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), SQL_CASES)
def test_extract_sql(text: str, expected: str | None) -> None:
    assert extract_sql(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("VERDICT: correct", True),
        ("verdict: INCORRECT", False),
        ("Verdict: **correct**", True),
        ("The query looks correct.\nVERDICT: incorrect", False),
        ("VERDICT: incorrect\nOn reflection... VERDICT: correct", True),
        ("Yes", True),
        ("no.", False),
        ("PASS", True),
        ("Result: FAIL", False),
        ("It is not correct.", False),
        ("The candidate answers the question; the SQL is correct.", True),
        ("I am unsure.", None),
        ("", None),
    ],
)
def test_extract_verdict(text: str, expected: bool | None) -> None:
    assert extract_verdict(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('["singer", "age", "singer"]', ["singer", "age"]),
        ('Keywords: ["t.a", "t.b"] -- done', ["t.a", "t.b"]),
        ('{"keywords": ["x", "y"], "tables": ["t"]}', ["x", "y", "t"]),
        ("[1, 2.5, null, true]", ["1", "2.5", "true"]),
        ("Keywords: singer, age, singer", ["singer", "age"]),
        ("- singer.name\n- singer.age\n* concert.year", ["singer.name", "singer.age", "concert.year"]),
        ("1. foo\n2) bar\n\n3. `baz`", ["foo", "bar", "baz"]),
        ("[customers.name, orders.id]", ["customers.name", "orders.id"]),
        ("", []),
    ],
)
def test_extract_list(text: str, expected: list[str]) -> None:
    assert extract_list(text) == expected


def test_extract_list_caps_items_and_their_length() -> None:
    many = extract_list(json.dumps([f"k{i}" for i in range(500)]))
    assert many == [f"k{i}" for i in range(MAX_ITEMS)]
    long = extract_list("x" * 1000 + ", y")
    assert long == ["x" * MAX_ITEM_CHARS, "y"]


def test_extractors_never_raise_on_random_text() -> None:
    rng = random.Random(7)
    alphabet = ["SELECT", "select", "WITH", " x AS (", "FROM", "t", "'", '"', "`", "```", "```sql", "\n", ";"]
    alphabet += ["(", ")", "[", "]", "{", "}", ",", ":", "VERDICT", "correct", "no", " ", "The", "é", "\x00", "--"]
    for _ in range(1500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(50)))
        sql = extract_sql(text)
        assert sql is None or (isinstance(sql, str) and sql == sql.strip() and sql)
        assert extract_verdict(text) in (True, False, None)
        items = extract_list(text)
        assert len(items) == len(set(items)) <= MAX_ITEMS
    for text in ("SELECT " * 5000, "(" * 20000, "[" * 20000, "{" * 20000, "'" * 20001, "```sql\n" * 3000):
        extract_sql(text)
        extract_verdict(text)
        extract_list(text)


def test_the_scripted_answer_format_round_trips_every_demo_query() -> None:
    """The emulator wraps SQL as below; the pipeline must get the same query back (normalised)."""
    for entry in build_demo_answers().values():
        for sql in [entry["gold"], *entry.get("wrong", [])]:
            got = extract_sql(f"Here is the query.\n```sql\n{sql}\n```")
            assert got is not None and normalise_sql(got) == normalise_sql(sql)


@pytest.mark.shared
def test_spider_gold_queries_survive_extraction() -> None:
    if not (SPIDER / "dev.json").is_file():
        pytest.skip(f"{SPIDER} is absent")
    dev = json.loads((SPIDER / "dev.json").read_text())
    for item in dev[:300]:
        got = extract_sql(f"```sql\n{item['query']}\n```")
        assert got is not None and normalise_sql(got) == normalise_sql(item["query"]), item["query"]
        assert extract_sql(f"The query is:\n{item['query']}\nIt answers the question.") == got.strip()


def test_a_sql_block_with_several_statements_is_kept_whole_for_the_safety_check() -> None:
    from gateway.text2sql.sqlsafe import SqlRejected, check_sql

    out = extract_sql("Here:\n```sql\nSELECT name FROM t; DROP TABLE t;\n```")
    assert out is not None and "DROP TABLE t" in out
    import pytest

    with pytest.raises(SqlRejected):
        check_sql(out, "sqlite")
