"""Scripted answers for the emulated worker (``workers.scripted``), so the Text-to-SQL pipeline runs end to end
without a model: question text -> ``AnswerEntry`` (docs/text2sql.md, "Demo data and scripted answers").
``build_demo_answers`` makes wrong first candidates checked on the demo database, ``answers_from_spider``
``MUTATIONS`` of the gold (not executed: whether one ends right must be found by executing it)."""

from __future__ import annotations

import functools
import itertools
import json
import random
import re
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NotRequired, TypedDict, cast

import sqlglot
from sqlglot import Token, TokenType, exp

from gateway.errors import ConfigError, unknown_name_message
from gateway.text2sql.demo import DB_ID, demo_questions, load_sqlite
from gateway.text2sql.demo.writers import write_text_atomic
from gateway.text2sql.evaluate import matches_gold
from gateway.text2sql.extract import parse_sqlite


class AnswerEntry(TypedDict):
    """One question's script: the gold SQL (answers a revise; the evaluator says correct iff a candidate
    equals it, ``normalise_sql``) and, optionally, wrong candidates by index, keywords, db id and a note."""

    gold: str
    wrong: NotRequired[list[str]]
    keywords: NotRequired[list[str]]
    db_id: NotRequired[str]
    note: NotRequired[str]


Answers = dict[str, AnswerEntry]
"""Question text -> its script."""


class AnswersError(ConfigError, ValueError):
    """An answers file or mapping is invalid; the message names the file and the entry."""


_LITERAL_TYPES = frozenset({
    TokenType.STRING, TokenType.NATIONAL_STRING, TokenType.IDENTIFIER, TokenType.NUMBER, TokenType.BIT_STRING,
    TokenType.HEX_STRING, TokenType.BYTE_STRING,
})  # fmt: skip
_WORD = re.compile(r"[A-Za-z_][A-Za-z_ \t\r\n]*")


def _strip_semicolons(sql: str) -> str:
    return re.sub(r"[\s;]+$", "", sql.strip())


def _tokens(sql: str) -> list[Token] | None:
    try:
        return list(sqlglot.tokenize(sql, read="sqlite"))
    except Exception:
        return None


def normalise_sql(sql: str) -> str:
    """``sql`` for equality tests: whitespace collapsed, trailing semicolons and comments gone, keywords and
    function names upper-cased outside literals (text sqlglot cannot tokenise: whitespace only)."""
    s = _strip_semicolons(sql)
    tokens = _tokens(s)
    if tokens is None:
        return " ".join(s.split())
    parts: list[str] = []
    for i, tok in enumerate(tokens):
        text = s[tok.start : tok.end + 1]
        if tok.token_type not in _LITERAL_TYPES and _WORD.fullmatch(text):
            is_call = i + 1 < len(tokens) and tokens[i + 1].token_type == TokenType.L_PAREN
            if tok.token_type != TokenType.VAR or is_call:
                text = " ".join(text.split()).upper()
        parts.append(text)
    return " ".join(parts)


MUTATIONS: tuple[str, ...] = ("drop_where", "misspell_column", "change_operator", "limit_1_to_2")
"""The Spider mutations, in rotation order (``swap_aggregate``, ``flip_order``, ``misspell_table`` exist too)."""

_CLAUSE_END = frozenset({
    TokenType.GROUP_BY, TokenType.ORDER_BY, TokenType.HAVING, TokenType.LIMIT, TokenType.UNION,
    TokenType.INTERSECT, TokenType.EXCEPT, TokenType.WINDOW,
})  # fmt: skip
_FLIP = {
    TokenType.EQ: "!=", TokenType.NEQ: "=", TokenType.GT: "<", TokenType.LT: ">", TokenType.GTE: "<", TokenType.LTE: ">"
}  # fmt: skip
_AGGREGATES = {"max": "MIN", "min": "MAX", "avg": "SUM", "sum": "AVG"}


def _replace(sql: str, tok: Token, new: str) -> str:
    return sql[: tok.start] + new + sql[tok.end + 1 :]


def _misspell(name: str) -> str:
    if len(name) >= 3 and name[1] != name[2]:
        return name[0] + name[2] + name[1] + name[3:]
    return name + name[-1]


def _names(sql: str, kind: type[exp.Expression]) -> list[str]:
    tree = parse_sqlite(sql)
    return [] if tree is None else [n.name.lower() for n in tree.find_all(kind) if n.name]


def _drop_where(sql: str, tokens: list[Token]) -> str | None:
    depth = 0
    start: Token | None = None
    for tok in tokens:
        if tok.token_type == TokenType.L_PAREN:
            depth += 1
        elif tok.token_type == TokenType.R_PAREN:
            depth -= 1
        elif depth == 0 and start is None and tok.token_type == TokenType.WHERE:
            start = tok
        elif depth == 0 and start is not None and tok.token_type in _CLAUSE_END:
            return (sql[: start.start].rstrip() + " " + sql[tok.start :]).strip()
    return None if start is None else sql[: start.start].rstrip()


def _misspell_named(kind: type[exp.Expression], sql: str, tokens: list[Token]) -> str | None:
    wanted = set(_names(sql, kind))
    for tok in tokens:
        if tok.token_type == TokenType.VAR and tok.text.lower() in wanted:
            new = _misspell(tok.text)
            if new.lower() not in wanted:
                return _replace(sql, tok, new)
    return None


def _change_operator(sql: str, tokens: list[Token]) -> str | None:
    after_where = False
    for tok in tokens:
        if tok.token_type in (TokenType.WHERE, TokenType.HAVING):
            after_where = True
        elif after_where and tok.token_type in _FLIP:
            return _replace(sql, tok, _FLIP[tok.token_type])
    return None


def _limit_1_to_2(sql: str, tokens: list[Token]) -> str | None:
    for tok, nxt in itertools.pairwise(tokens):
        if tok.token_type == TokenType.LIMIT and nxt.token_type == TokenType.NUMBER and nxt.text == "1":
            return _replace(sql, nxt, "2")
    return None


def _swap_aggregate(sql: str, tokens: list[Token]) -> str | None:
    for tok, nxt in itertools.pairwise(tokens):
        if tok.text.lower() in _AGGREGATES and nxt.token_type == TokenType.L_PAREN:
            return _replace(sql, tok, _AGGREGATES[tok.text.lower()])
    return None


def _flip_order(sql: str, tokens: list[Token]) -> str | None:
    for kind, new in ((TokenType.DESC, "ASC"), (TokenType.ASC, "DESC")):
        for tok in tokens:
            if tok.token_type == kind:
                return _replace(sql, tok, new)
    return None


_MUTATORS: dict[str, Callable[[str, list[Token]], str | None]] = {
    "drop_where": _drop_where,
    "misspell_column": functools.partial(_misspell_named, exp.Column),
    "change_operator": _change_operator,
    "limit_1_to_2": _limit_1_to_2,
    "swap_aggregate": _swap_aggregate,
    "flip_order": _flip_order,
    "misspell_table": functools.partial(_misspell_named, exp.Table),
}


def mutate_sql(sql: str, mutation: str) -> str | None:
    """``sql`` changed by ``mutation`` (a ``MUTATIONS`` name, ``swap_aggregate``, ``flip_order`` or
    ``misspell_table``), editing the original text; ``None`` when it does not apply (or changes nothing)."""
    if mutation not in _MUTATORS:
        raise ValueError(f"unknown mutation {mutation!r}; known: {', '.join(_MUTATORS)}")
    s = _strip_semicolons(sql)
    tokens = _tokens(s)
    if not tokens:
        return None
    out = _MUTATORS[mutation](s, tokens)
    if out is None or normalise_sql(out) == normalise_sql(s):
        return None
    return out


def _keywords(sql: str) -> list[str]:
    """Literal values, then table and column names of ``sql``, deduplicated (at most 12)."""
    tokens = _tokens(sql) or []
    values = [t.text for t in tokens if t.token_type == TokenType.STRING]
    names = _names(sql, exp.Table) + _names(sql, exp.Column)
    return list(dict.fromkeys(v for v in values + names if v))[:12]


def candidate_sql(entry: AnswerEntry, k: int) -> str:
    """The SQL the scripted model gives as candidate ``k``: ``wrong[k]`` if present, else the gold."""
    wrong = entry.get("wrong", [])
    return wrong[k] if 0 <= k < len(wrong) and wrong[k] else entry["gold"]


def _chosen(n: int, wrong_fraction: float, seed: int) -> list[int]:
    """Indices (sorted) of the ``round(wrong_fraction * n)`` questions that get a wrong candidate."""
    if not 0.0 <= wrong_fraction <= 1.0:
        raise ValueError(f"wrong_fraction must be within [0, 1], got {wrong_fraction}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return sorted(order[: round(wrong_fraction * n)])


def _run(conn: sqlite3.Connection, sql: str) -> list[tuple[object, ...]] | None:
    try:
        return [tuple(r) for r in conn.execute(sql).fetchall()]
    except sqlite3.Error:
        return None


def _wrong_value(sql: str) -> list[str]:
    """Variants of ``sql`` with one string literal changed (lower-cased, or an ``x`` appended)."""
    out = []
    for tok in _tokens(sql) or []:
        if tok.token_type == TokenType.STRING:
            value = tok.text.lower() if tok.text.lower() != tok.text else tok.text + "x"
            out.append(_replace(sql, tok, "'" + value.replace("'", "''") + "'"))
    return out


_KINDS = ("error", "empty", "different")


def _demo_wrong(conn: sqlite3.Connection, gold: str, kind: str, j: int) -> tuple[str, str] | None:
    """A wrong candidate of ``kind`` (verified by executing it) and its note, or None."""
    gold_rows = _run(conn, gold) or []
    if kind == "error":
        for name in ("misspell_column", "misspell_table"):
            sql = mutate_sql(gold, name)
            if sql is not None and _run(conn, sql) is None:
                return sql, f"error: {name.replace('_', ' ')} (fails to execute)"
    elif kind == "empty":
        for sql in _wrong_value(gold):
            if _run(conn, sql) == []:
                return sql, "empty: a wrong literal value (returns no rows)"
    else:
        names = ["drop_where", "change_operator", "limit_1_to_2", "swap_aggregate", "flip_order"]
        names = names[j % len(names) :] + names[: j % len(names)]
        for name in names:
            sql = mutate_sql(gold, name)
            rows = None if sql is None else _run(conn, sql)
            if sql is not None and rows and not matches_gold(gold, gold_rows, rows):
                return sql, f"different: {name} (returns other rows)"
    return None


def build_demo_answers(seed: int = 0, wrong_fraction: float = 0.25) -> Answers:
    """Scripted answers for the demo questions (see the module doc); deterministic in ``seed``."""
    questions = demo_questions()
    chosen = _chosen(len(questions), wrong_fraction, seed)
    conn = sqlite3.connect(":memory:")
    try:
        load_sqlite(conn, seed)
        answers: Answers = {}
        wanted = 0  # index of the kind the next wrong candidate should have; advances when one is made
        for i, q in enumerate(questions):
            made = None
            for step in range(len(_KINDS) if i in chosen else 0):
                made = _demo_wrong(conn, q.query, _KINDS[(wanted + step) % len(_KINDS)], i)
                if made is not None:
                    wanted += step == 0
                    break
            answers[q.question] = _entry(q.query, DB_ID, made)
    finally:
        conn.close()
    return answers


def answers_from_spider(dataset_dir: Path, *, wrong_fraction: float, seed: int, limit: int | None = None) -> Answers:
    """Scripted answers for the first ``limit`` questions of a Spider-layout ``dev.json``; a question text that
    repeats (whitespace-normalised) keeps its first entry."""
    path = Path(dataset_dir) / "dev.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AnswersError(str(path), "", f"cannot read the dataset: {exc}") from exc
    if not isinstance(data, list):
        raise AnswersError(str(path), "", "expected a JSON list of questions")
    firsts: dict[str, tuple[str, str, str]] = {}  # whitespace-normalised question -> its first item
    for i, item in enumerate(data if limit is None else data[: max(limit, 0)]):
        if not isinstance(item, dict) or not isinstance(item.get("question"), str) or not item.get("query"):
            raise AnswersError(str(path), f"[{i}]", "expected an object with 'question' and 'query'")
        entry = (item["question"], str(item["query"]), str(item.get("db_id", "")))
        firsts.setdefault(" ".join(item["question"].split()), entry)
    chosen = _chosen(len(firsts), wrong_fraction, seed)
    answers: Answers = {}
    for i, (question, gold, db_id) in enumerate(firsts.values()):
        made = None
        if i in chosen:
            j = chosen.index(i) % len(MUTATIONS)
            order = [*MUTATIONS[j:], *MUTATIONS[:j], "swap_aggregate", "flip_order", "misspell_table"]
            made = next(((sql, f"mutation: {n}") for n in order if (sql := mutate_sql(gold, n)) is not None), None)
        answers[question] = _entry(gold, db_id, made)
    return answers


def _entry(gold: str, db_id: str, wrong: tuple[str, str] | None) -> AnswerEntry:
    """A built entry: the gold, its keywords, the db id (if any) and the wrong candidate with its note."""
    entry: AnswerEntry = {"gold": gold, "keywords": _keywords(gold)}
    if db_id:
        entry["db_id"] = db_id
    if wrong is not None:
        entry["wrong"], entry["note"] = [wrong[0]], wrong[1]
    return entry


_OPTIONAL = ("wrong", "keywords", "db_id", "note")
_KEYS = frozenset({"gold", *_OPTIONAL})


def _checked(key: str, value: object, source: str, field: str) -> object:
    if key in ("db_id", "note"):
        if not isinstance(value, str):
            raise AnswersError(source, field, "expected a string")
        return value
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AnswersError(source, field, "expected a list of strings")
    items = [str(v) for v in value]
    if key == "wrong" and not all(w.strip() for w in items):
        raise AnswersError(source, field, "empty SQL string")
    return items


def validate_answers(data: object, source: str = "<answers>") -> Answers:
    """``data`` checked as an answers mapping; ``AnswersError`` (a ``ValueError``) names the bad entry."""
    if not isinstance(data, Mapping):
        raise AnswersError(source, "", "expected a JSON object mapping question text to an entry")
    out: Answers = {}
    for question, raw in data.items():
        where = f"entry {question!r}"
        if not isinstance(question, str) or not question.strip():
            raise AnswersError(source, where, "the question text must be a non-empty string")
        if not isinstance(raw, Mapping):
            raise AnswersError(source, where, "expected an object with a 'gold' SQL string")
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            raise AnswersError(source, where, unknown_name_message("key", unknown[0], _KEYS))
        gold = raw.get("gold")
        if not isinstance(gold, str) or not gold.strip():
            raise AnswersError(source, f"{where}.gold", "expected a non-empty SQL string")
        checked = {k: _checked(k, raw[k], source, f"{where}.{k}") for k in _OPTIONAL if k in raw}
        out[question] = cast(AnswerEntry, {"gold": gold, **checked})
    return out


def load_answers(path: Path) -> Answers:
    """Read and validate an answers file; ``AnswersError`` (a ``ValueError``) names the file and entry."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AnswersError(str(path), "", f"cannot read: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise AnswersError(str(path), "", f"not valid JSON: {exc}") from exc
    return validate_answers(data, str(path))


def write_answers(path: Path, answers: Mapping[str, AnswerEntry]) -> Path:
    """Validate ``answers`` and write them to ``path`` as JSON (atomically); returns ``path``."""
    path = Path(path)
    checked = validate_answers(answers, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(checked, indent=2, ensure_ascii=False) + "\n")
    return path
