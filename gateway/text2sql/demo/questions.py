"""The demo dataset's gold questions (package data ``data/demo_questions.json``, read once). Gold queries run
unchanged on both engines (``query_pg`` for the few that cannot), never select a raw DATE column and break
``ORDER BY ... LIMIT`` ties on a key."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal, get_args

from gateway.text2sql.demo.schema import Dialect

Difficulty = Literal["easy", "medium", "hard"]
QUESTIONS_RESOURCE = "data/demo_questions.json"
"""Where the questions live, relative to the ``gateway.text2sql`` package."""
_FIELDS = {"question", "difficulty", "evidence", "query", "query_pg"}
_REQUIRED = {"question", "difficulty", "query"}


@dataclass(frozen=True)
class DemoQuestion:
    """A gold question: English text, gold SQL (portable; ``query_pg`` overrides it for PostgreSQL)."""

    question: str
    query: str
    difficulty: Difficulty
    evidence: str | None = None
    query_pg: str | None = None

    def sql_for(self, dialect: Dialect) -> str:
        """The gold SQL to run on ``dialect``."""
        if dialect == "postgres" and self.query_pg is not None:
            return self.query_pg
        return self.query


def parse_questions(data: Any, source: str = QUESTIONS_RESOURCE) -> tuple[DemoQuestion, ...]:
    """Questions from the parsed JSON (a list of objects); ``ValueError`` naming the entry and field otherwise."""
    if not isinstance(data, list):
        raise ValueError(f"{source}: expected a list of questions")
    out: list[DemoQuestion] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError(f"{source}: [{i}]: expected an object")
        unknown, missing = set(item) - _FIELDS, _REQUIRED - set(item)
        if unknown or missing:
            raise ValueError(f"{source}: [{i}]: unknown fields {sorted(unknown)}, missing fields {sorted(missing)}")
        for key, value in item.items():
            if not isinstance(value, str) or not value:
                raise ValueError(f"{source}: [{i}].{key}: expected a non-empty string")
        if item["difficulty"] not in get_args(Difficulty):
            raise ValueError(f"{source}: [{i}].difficulty: expected one of {', '.join(get_args(Difficulty))}")
        out.append(DemoQuestion(**item))
    return tuple(out)


@functools.cache
def _load() -> tuple[DemoQuestion, ...]:
    text = (resources.files("gateway.text2sql") / QUESTIONS_RESOURCE).read_text(encoding="utf-8")
    return parse_questions(json.loads(text))


def demo_questions() -> list[DemoQuestion]:
    """The gold questions of the demo dataset (at least 60), easy to hard."""
    return list(_load())
