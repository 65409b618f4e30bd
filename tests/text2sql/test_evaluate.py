"""Execution accuracy (result comparison, ordering, accounting) and the emulator's scripted answers."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.text2sql.answers import (
    MUTATIONS,
    AnswerEntry,
    AnswersError,
    answers_from_spider,
    build_demo_answers,
    candidate_sql,
    load_answers,
    mutate_sql,
    normalise_sql,
    validate_answers,
    write_answers,
)
from gateway.text2sql.demo import demo_questions, write_sqlite
from gateway.text2sql.evaluate import ExecutionAccuracy, execute_sqlite, gold_is_ordered, results_match

SPIDER = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "spider-dev"
Rows = list[tuple[object, ...]]


@pytest.mark.parametrize(
    ("gold", "pred", "ordered", "expected"),
    [
        ([(1, "a"), (2, "b")], [(2, "b"), (1, "a")], False, True),
        ([(1, "a"), (2, "b")], [(2, "b"), (1, "a")], True, False),
        ([(1, "a"), (2, "b")], [(1, "a"), (2, "b")], True, True),
        ([(1,), (1,), (2,)], [(1,), (2,), (2,)], False, False),  # duplicates count
        ([(1,), (1,), (2,)], [(2,), (1,), (1,)], False, True),
        ([(1,), (2,)], [(1,)], False, False),
        ([(1, 2)], [(2, 1)], False, False),  # columns keep their order
        ([(1, 2)], [(1,)], False, False),
        ([(3,)], [(3.0,)], False, True),  # int vs float
        ([(3,)], [(4,)], False, False),
        ([(1.0000001,)], [(1.0,)], False, True),  # within 1e-6 relative
        ([(1.001,)], [(1.0,)], False, False),
        ([(12345,)], [(12349,)], False, False),  # integers compare exactly
        ([(0.1 + 0.2, "x")], [(0.3, "x")], True, True),
        ([(Decimal("19.99"),)], [(19.99,)], False, True),
        ([(Decimal("7"),)], [(7,)], False, True),
        ([(None,)], [(None,)], False, True),
        ([(None,)], [(0,)], False, False),
        ([(None,)], [("",)], False, False),
        ([("Paris",)], [("paris",)], False, False),  # strings exactly
        ([("1",)], [(1,)], False, False),
        ([(dt.date(2024, 1, 2),)], [("2024-01-02",)], False, True),
        ([(True,)], [(1,)], False, True),
        ([(float("nan"),)], [(float("nan"),)], False, True),
        ([], [], True, True),
        ([(1.0, "a"), (1.0000000001, "a"), (2.5, "b")], [(2.5, "b"), (1.0, "a"), (1.0, "a")], False, True),
    ],
)
def test_results_match(gold: Rows, pred: Rows, ordered: bool, expected: bool) -> None:
    assert results_match(gold, pred, ordered=ordered) is expected
    assert results_match(pred, gold, ordered=ordered) is expected


def test_results_match_pairs_close_floats_that_sort_differently() -> None:
    gold = [(1.0, 2.0), (1.0000000001, 1.0)]
    pred = [(1.0000000001, 2.0), (1.0, 1.0)]
    assert results_match(gold, pred, ordered=False)
    assert not results_match(gold, [(1.0, 2.0), (1.0, 1.5)], ordered=False)


@pytest.mark.parametrize(
    ("sql", "ordered"),
    [
        ("SELECT a FROM t ORDER BY a", True),
        ("select a from t order   by a desc limit 3", True),
        ("SELECT a FROM t", False),
        ("SELECT * FROM (SELECT a FROM t ORDER BY a LIMIT 3) AS s", False),
        ("SELECT a FROM t WHERE b IN (SELECT b FROM u ORDER BY b LIMIT 1)", False),
        ("WITH c AS (SELECT a FROM t ORDER BY a) SELECT a FROM c", False),
        ("WITH c AS (SELECT a FROM t) SELECT a FROM c ORDER BY a", True),
        ("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1", True),
        ("(SELECT a FROM t ORDER BY a)", True),
        ("SELECT 'order by' FROM t", False),
        ("SELECT a FROM t WHERE x = 'ORDER BY' ORDER BY a", True),
        ("SELECT a FROM t ORDER BY a ???", True),  # unparseable: the regex decides
        ("SELECT a FROM (SELECT a FROM t ORDER BY a) ???", False),
    ],
)
def test_gold_is_ordered(sql: str, ordered: bool) -> None:
    assert gold_is_ordered(sql) is ordered


def test_execution_accuracy_counts_overall_and_by_difficulty() -> None:
    acc = ExecutionAccuracy()
    assert acc.accuracy == 0.0
    acc.add(True, "easy")
    acc.add(False, "easy", error=True)
    acc.add(True, "hard")
    acc.add(True)
    assert (acc.count, acc.correct, acc.errors) == (4, 3, 1)
    assert acc.accuracy == 0.75
    d = acc.as_dict()
    assert d["by_difficulty"] == {
        "easy": {"count": 2, "correct": 1, "accuracy": 0.5},
        "hard": {"count": 1, "correct": 1, "accuracy": 1.0},
    }
    assert json.loads(json.dumps(d)) == d


def test_execute_sqlite_is_read_only_and_times_out(tmp_path: Path) -> None:
    db = tmp_path / "t.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")
        conn.execute("INSERT INTO t VALUES (1, 'x'), (2, 'y')")
    conn.close()
    assert execute_sqlite(db, "SELECT a, b FROM t ORDER BY a") == [(1, "x"), (2, "y")]
    assert execute_sqlite(db, "SELECT a FROM t ORDER BY a", max_rows=1) == [(1,)]
    with pytest.raises(sqlite3.OperationalError):
        execute_sqlite(db, "INSERT INTO t VALUES (3, 'z')")
    with pytest.raises(sqlite3.OperationalError):
        execute_sqlite(db, "SELECT nope FROM t")
    forever = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r"
    with pytest.raises(sqlite3.OperationalError, match="interrupt"):
        execute_sqlite(db, forever, timeout_s=0.2)


# ------------------------------------------------------------------------------------ scripted answers


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("select  count(*)\nfrom t;", "SELECT COUNT(*) FROM t", True),
        ("SELECT a FROM t WHERE b = 'X'", "select a from t where b = 'X';;", True),
        ("SELECT a FROM t WHERE b = 'X'", "SELECT a FROM t WHERE b = 'x'", False),
        ("SELECT Name FROM t", "SELECT name FROM t", False),
        ("SELECT a FROM t  -- comment", "SELECT a FROM t", True),
        ("SELECT a FROM t ORDER  BY a", "select a from t order by a", True),
        ("SELECT a FROM t", "SELECT b FROM t", False),
    ],
)
def test_normalise_sql(a: str, b: str, equal: bool) -> None:
    assert (normalise_sql(a) == normalise_sql(b)) is equal
    assert normalise_sql("'unterminated") == "'unterminated"


@pytest.mark.parametrize(
    ("mutation", "sql", "expected"),
    [
        ("drop_where", "SELECT a FROM t WHERE b = 1 ORDER BY a", "SELECT a FROM t ORDER BY a"),
        ("drop_where", "SELECT a FROM t WHERE b IN (SELECT c FROM u WHERE d = 2)", "SELECT a FROM t"),
        ("drop_where", "SELECT a FROM t", None),
        ("misspell_column", "SELECT T1.name FROM singer AS T1", "SELECT T1.nmae FROM singer AS T1"),
        ("misspell_column", "SELECT count(*) FROM singer", None),
        ("misspell_table", "SELECT count(*) FROM singer", "SELECT count(*) FROM sniger"),
        (
            "change_operator",
            "SELECT a FROM t JOIN u ON t.x = u.x WHERE b > 3",
            "SELECT a FROM t JOIN u ON t.x = u.x WHERE b < 3",
        ),
        ("change_operator", "SELECT a FROM t WHERE b = 'x'", "SELECT a FROM t WHERE b != 'x'"),
        ("change_operator", "SELECT a FROM t", None),
        ("limit_1_to_2", "SELECT a FROM t ORDER BY a LIMIT 1", "SELECT a FROM t ORDER BY a LIMIT 2"),
        ("limit_1_to_2", "SELECT a FROM t LIMIT 10", None),
        ("swap_aggregate", "SELECT max(a) FROM t", "SELECT MIN(a) FROM t"),
        ("flip_order", "SELECT a FROM t ORDER BY a DESC", "SELECT a FROM t ORDER BY a ASC"),
    ],
)
def test_mutate_sql(mutation: str, sql: str, expected: str | None) -> None:
    assert mutate_sql(sql, mutation) == expected


def test_mutate_sql_rejects_unknown_mutations() -> None:
    with pytest.raises(ValueError, match="unknown mutation 'nope'"):
        mutate_sql("SELECT 1", "nope")
    assert set(MUTATIONS) == {"drop_where", "misspell_column", "change_operator", "limit_1_to_2"}


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield write_sqlite(tmp_path_factory.mktemp("demo") / "demo_retail.sqlite")


def _run(db: Path, sql: str) -> Rows | None:
    try:
        return execute_sqlite(db, sql)
    except sqlite3.Error:
        return None


def test_demo_answers_are_deterministic_and_respect_the_wrong_fraction() -> None:
    answers = build_demo_answers()
    questions = demo_questions()
    assert answers == build_demo_answers(seed=0, wrong_fraction=0.25)
    assert list(answers) == [q.question for q in questions]
    assert [a["gold"] for a in answers.values()] == [q.query for q in questions]
    wrong = [q for q, a in answers.items() if "wrong" in a]
    assert len(wrong) == round(0.25 * len(questions))
    assert build_demo_answers(seed=1) != answers
    assert not any("wrong" in a for a in build_demo_answers(wrong_fraction=0.0).values())
    assert all("wrong" in a for a in build_demo_answers(wrong_fraction=1.0).values())
    with pytest.raises(ValueError, match="wrong_fraction"):
        build_demo_answers(wrong_fraction=1.5)


def test_demo_wrong_candidates_do_what_their_note_says(demo_db: Path) -> None:
    answers = build_demo_answers()
    kinds: Counter[str] = Counter()
    first_correct = 0
    for entry in answers.values():
        gold_sql = entry["gold"]
        gold = _run(demo_db, gold_sql)
        assert gold, gold_sql
        first = _run(demo_db, candidate_sql(entry, 0))
        ok = first is not None and results_match(gold, first, ordered=gold_is_ordered(gold_sql))
        first_correct += ok
        assert candidate_sql(entry, 1) == gold_sql
        if "wrong" not in entry:
            assert ok and "note" not in entry
            continue
        kind = entry["note"].split(":")[0]
        kinds[kind] += 1
        assert not ok
        assert normalise_sql(entry["wrong"][0]) != normalise_sql(gold_sql)
        if kind == "error":
            assert first is None
        elif kind == "empty":
            assert first == []
        else:
            assert kind == "different" and first
    # What the script allows: the first candidate is right exactly on the questions without a wrong one.
    assert first_correct == len(answers) - sum(kinds.values())
    assert set(kinds) == {"error", "empty", "different"}


def test_answers_file_round_trip(tmp_path: Path) -> None:
    answers = build_demo_answers()
    path = write_answers(tmp_path / "sub" / "answers.json", answers)
    assert load_answers(path) == answers
    assert sorted(p.name for p in path.parent.iterdir()) == ["answers.json"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a JSON object"),
        ({"": {"gold": "SELECT 1"}}, "non-empty string"),
        ({"Q1": "SELECT 1"}, "entry 'Q1': expected an object"),
        ({"Q1": {}}, "entry 'Q1'.gold: expected a non-empty SQL string"),
        ({"Q1": {"gold": 3}}, "entry 'Q1'.gold"),
        ({"Q1": {"gold": "SELECT 1", "wrong": "SELECT 2"}}, "entry 'Q1'.wrong: expected a list of strings"),
        ({"Q1": {"gold": "SELECT 1", "wrong": [""]}}, "entry 'Q1'.wrong: empty SQL"),
        ({"Q1": {"gold": "SELECT 1", "keywords": [1]}}, "entry 'Q1'.keywords"),
        ({"Q1": {"gold": "SELECT 1", "note": 1}}, "entry 'Q1'.note: expected a string"),
        ({"Q1": {"gold": "SELECT 1", "golden": "x"}}, "entry 'Q1': unknown key 'golden'"),
    ],
)
def test_invalid_answers_name_the_entry(tmp_path: Path, data: object, message: str) -> None:
    path = tmp_path / "answers.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message) as info:
        load_answers(path)
    assert str(path) in str(info.value) and isinstance(info.value, AnswersError)
    with pytest.raises(AnswersError):
        write_answers(tmp_path / "out.json", data)  # type: ignore[arg-type]


def test_unreadable_answers_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_answers(bad)
    with pytest.raises(ValueError, match="cannot read"):
        load_answers(tmp_path / "missing.json")
    entry: AnswerEntry = {"gold": "SELECT 1", "wrong": ["SELECT 2"], "keywords": ["k"], "db_id": "d", "note": "n"}
    assert validate_answers({"Q": entry}) == {"Q": entry}


@pytest.mark.shared
def test_answers_from_spider_first_50() -> None:
    if not (SPIDER / "dev.json").is_file():
        pytest.skip(f"{SPIDER} is absent")
    answers = answers_from_spider(SPIDER, wrong_fraction=0.3, seed=0, limit=50)
    assert answers == answers_from_spider(SPIDER, wrong_fraction=0.3, seed=0, limit=50)
    dev = json.loads((SPIDER / "dev.json").read_text())[:50]
    firsts: dict[str, dict[str, str]] = {}
    for item in dev:
        firsts.setdefault(" ".join(item["question"].split()), item)
    assert len(answers) == len(firsts)
    for question, entry in answers.items():
        item = firsts[" ".join(question.split())]
        assert entry["gold"] == item["query"] and entry.get("db_id") == item["db_id"]
    wrong = {q: a for q, a in answers.items() if "wrong" in a}
    assert len(wrong) == round(0.3 * len(answers))
    notes = Counter(a["note"] for a in wrong.values())
    known = {*MUTATIONS, "swap_aggregate", "flip_order", "misspell_table"}
    assert all(n.removeprefix("mutation: ") in known for n in notes)
    assert len(notes) >= 3
    # Execute (never assume): how many first candidates are right, and how many wrong ones really differ.
    acc = ExecutionAccuracy()
    differ = 0
    for question, entry in answers.items():
        db = SPIDER / "database" / entry.get("db_id", "") / f"{entry.get('db_id', '')}.sqlite"
        if not db.is_file():
            continue
        gold = _run(db, entry["gold"])
        assert gold is not None, entry["gold"]
        first = _run(db, candidate_sql(entry, 0))
        ok = first is not None and results_match(gold, first, ordered=gold_is_ordered(entry["gold"]))
        acc.add(ok, error=first is None)
        if "wrong" in entry:
            assert normalise_sql(entry["wrong"][0]) != normalise_sql(entry["gold"])
            differ += not ok
        else:
            assert ok, question
    assert acc.count >= 40
    assert differ >= len(wrong) // 2
    assert acc.correct == acc.count - differ
