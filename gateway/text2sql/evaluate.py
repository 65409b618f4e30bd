"""Execution accuracy: does a predicted query return the gold query's result (``results_match``)?"""

from __future__ import annotations

import datetime as dt
import math
import re
import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlglot import exp

from gateway.text2sql.extract import parse_sqlite

REL_TOL = 1e-6
"""Relative tolerance for comparing non-integer numbers."""
ABS_TOL = 1e-9
"""Absolute tolerance for comparing numbers near zero."""
_GREEDY_LIMIT = 2000

Row = Sequence[object]
_Cell = tuple[str, object]  # ("s", text) / ("N", None) / ("b", bytes) / ("o", repr) ; numbers go apart


def normalise_value(value: object) -> object:
    """A cell in comparable form: numbers as ``int``/``float``, dates as ISO text, other values unchanged."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, Decimal):
        if value.is_finite() and value == value.to_integral_value():
            return int(value)
        return float(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    return value


def _split(row: Row) -> tuple[tuple[_Cell, ...], tuple[int | float, ...]]:
    """A row's non-numeric cells (with placeholders for numbers) and its numbers."""
    shape: list[_Cell] = []
    numbers: list[int | float] = []
    for raw in row:
        v = normalise_value(raw)
        if isinstance(v, int | float):
            shape.append(("n", None))
            numbers.append(v)
        elif v is None:
            shape.append(("N", None))
        elif isinstance(v, str):
            shape.append(("s", v))
        elif isinstance(v, bytes):
            shape.append(("b", v))
        else:
            shape.append(("o", repr(v)))
    return tuple(shape), tuple(numbers)


def _num_equal(a: int | float, b: int | float) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    fa, fb = float(a), float(b)
    if math.isnan(fa) or math.isnan(fb):
        return math.isnan(fa) and math.isnan(fb)
    return math.isclose(fa, fb, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def _nums_equal(a: tuple[int | float, ...], b: tuple[int | float, ...]) -> bool:
    return len(a) == len(b) and all(_num_equal(x, y) for x, y in zip(a, b, strict=True))


def _sort_key(nums: tuple[int | float, ...]) -> tuple[tuple[bool, float], ...]:
    return tuple((math.isnan(float(x)), 0.0 if math.isnan(float(x)) else float(x)) for x in nums)


def _groups_match(gold: list[tuple[int | float, ...]], pred: list[tuple[int | float, ...]]) -> bool:
    """Whether two equally long lists of number tuples pair up within tolerance (as multisets)."""
    gold_sorted = sorted(gold, key=_sort_key)
    pred_sorted = sorted(pred, key=_sort_key)
    if all(_nums_equal(g, p) for g, p in zip(gold_sorted, pred_sorted, strict=True)):
        return True
    if len(gold) > _GREEDY_LIMIT:
        return False
    unmatched = list(pred_sorted)
    for g in gold_sorted:
        for i, p in enumerate(unmatched):
            if _nums_equal(g, p):
                del unmatched[i]
                break
        else:
            return False
    return True


def results_match(gold_rows: Sequence[Row], pred_rows: Sequence[Row], *, ordered: bool) -> bool:
    """Whether ``pred_rows`` is the same result as ``gold_rows``, cell by cell after ``normalise_value``: numbers
    numerically (integers exactly, else within ``REL_TOL``/``ABS_TOL``; NaN equals NaN), the rest exactly, same
    columns in the same order; rows as multisets unless ``ordered`` (``gold_is_ordered``)."""
    if len(gold_rows) != len(pred_rows):
        return False
    gold = [_split(r) for r in gold_rows]
    pred = [_split(r) for r in pred_rows]
    if ordered:
        return all(g[0] == p[0] and _nums_equal(g[1], p[1]) for g, p in zip(gold, pred, strict=True))
    gold_groups: dict[tuple[_Cell, ...], list[tuple[int | float, ...]]] = defaultdict(list)
    pred_groups: dict[tuple[_Cell, ...], list[tuple[int | float, ...]]] = defaultdict(list)
    for split, groups in ((gold, gold_groups), (pred, pred_groups)):
        for shape, numbers in split:
            groups[shape].append(numbers)
    if Counter({k: len(v) for k, v in gold_groups.items()}) != Counter({k: len(v) for k, v in pred_groups.items()}):
        return False
    return all(_groups_match(nums, pred_groups[shape]) for shape, nums in gold_groups.items())


_STRING_LITERAL = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")
_PARENS = re.compile(r"\([^()]*\)")
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


def _ordered_regex(sql: str) -> bool:
    text = _STRING_LITERAL.sub("''", sql)
    for _ in range(200):
        stripped = _PARENS.sub(" ", text)
        if stripped == text:
            break
        text = stripped
    return bool(_ORDER_BY.search(text))


def gold_is_ordered(sql: str) -> bool:
    """Whether ``sql`` orders its result: a top-level ``ORDER BY`` (sqlglot; a regex when it cannot parse)."""
    tree = parse_sqlite(sql)
    while isinstance(tree, exp.Subquery):
        tree = tree.this
    if isinstance(tree, exp.Query):
        return tree.args.get("order") is not None
    return _ordered_regex(sql)


def matches_gold(gold_sql: str, gold: Sequence[Row], rows: Sequence[Row]) -> bool:
    """Whether ``rows`` are the gold query's result ``gold`` (in order when the gold query orders them)."""
    return results_match(gold, rows, ordered=gold_is_ordered(gold_sql))


@dataclass
class Tally:
    """Questions counted and answered correctly."""

    count: int = 0
    correct: int = 0

    @property
    def accuracy(self) -> float:
        """Fraction of questions answered correctly (0.0 before any)."""
        return self.correct / self.count if self.count else 0.0

    def add(self, correct: bool) -> None:
        self.count += 1
        self.correct += int(correct)

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "correct": self.correct, "accuracy": self.accuracy}


@dataclass
class ExecutionAccuracy(Tally):
    """Running execution accuracy, overall and per difficulty (``easy``/``medium``/``hard``/...)."""

    errors: int = 0
    by_difficulty: dict[str, Tally] = field(default_factory=dict)

    def add(self, correct: bool, difficulty: str | None = None, *, error: bool = False) -> None:
        """Record one question: whether the prediction matched, its difficulty, whether it failed to run."""
        super().add(correct)
        self.errors += int(error)
        if difficulty is not None:
            self.by_difficulty.setdefault(difficulty, Tally()).add(correct)

    def as_dict(self) -> dict[str, Any]:
        """JSON view: count, correct, errors, accuracy and ``by_difficulty`` (sorted by name)."""
        view = {k: getattr(self, k) for k in ("count", "correct", "errors", "accuracy")}
        return view | {"by_difficulty": {k: self.by_difficulty[k].as_dict() for k in sorted(self.by_difficulty)}}


def execute_sqlite(
    path: Path, sql: str, *, timeout_s: float = 30.0, max_rows: int | None = None
) -> list[tuple[object, ...]]:
    """Run ``sql`` read-only on the SQLite file ``path``; ``sqlite3.Error`` on failure or past ``timeout_s``
    (invalid UTF-8, which some Spider databases hold, is replaced)."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    conn.text_factory = lambda b: b.decode("utf-8", errors="replace")
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        cursor = conn.execute(sql)
        rows = cursor.fetchall() if max_rows is None else cursor.fetchmany(max_rows)
        return [tuple(r) for r in rows]
    finally:
        conn.close()
