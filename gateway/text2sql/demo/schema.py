"""The demo dataset's definition: the database's seven tables in one portable spec, rendered per dialect and for
Spider, and its gold questions (package data ``data/demo_questions.json``, read once). Gold queries run unchanged
on both engines (``query_pg`` for the few that cannot), never select a raw DATE column and break
``ORDER BY ... LIMIT`` ties on a key."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal, cast, get_args

DB_ID = "demo_retail"
"""The database id of the demo dataset (Spider ``db_id``)."""

Dialect = Literal["sqlite", "postgres"]
ColumnType = Literal["INTEGER", "TEXT", "REAL", "DATE"]
Value = int | float | str | None
"""One cell of a generated row."""

_SQL_TYPES: dict[str, dict[ColumnType, str]] = {
    "sqlite": {"INTEGER": "INTEGER", "TEXT": "TEXT", "REAL": "REAL", "DATE": "TEXT"},
    "postgres": {"INTEGER": "INTEGER", "TEXT": "TEXT", "REAL": "NUMERIC(12,2)", "DATE": "DATE"},
}
_SPIDER_TYPES: dict[ColumnType, str] = {"INTEGER": "number", "REAL": "number", "TEXT": "text", "DATE": "time"}


@dataclass(frozen=True)
class ColumnSpec:
    """One column: name, portable type, nullability and an optional foreign key ``(table, column)``."""

    name: str
    type: ColumnType
    nullable: bool = False
    references: tuple[str, str] | None = None


@dataclass(frozen=True)
class TableSpec:
    """One table: its columns in order; the first column is the (single-column) primary key."""

    name: str
    columns: tuple[ColumnSpec, ...]

    @property
    def primary_key(self) -> str:
        """The primary key column's name."""
        return self.columns[0].name

    @property
    def column_names(self) -> list[str]:
        """The column names in order."""
        return [c.name for c in self.columns]


def _table(name: str, columns: str) -> TableSpec:
    """A table from ``"name TYPE[?] [-> table.column], ..."`` (``?``: nullable; ``->``: a foreign key)."""
    specs = []
    for col in columns.split(", "):
        decl, _, ref = col.partition(" -> ")
        cname, ctype = decl.split()
        table, _, column = ref.partition(".")
        target = (table, column) if ref else None
        specs.append(ColumnSpec(cname, cast(ColumnType, ctype.rstrip("?")), ctype.endswith("?"), target))
    return TableSpec(name, tuple(specs))


TABLES: tuple[TableSpec, ...] = (  # in an order that satisfies every foreign key
    _table("departments", "department_id INTEGER, name TEXT, budget REAL, city TEXT"),
    _table("stores", "store_id INTEGER, name TEXT, city TEXT, country TEXT, opened_date DATE, size_sqm INTEGER"),
    _table(
        "employees",
        "employee_id INTEGER, first_name TEXT, last_name TEXT, job_title TEXT, department_id INTEGER -> "
        "departments.department_id, store_id INTEGER? -> stores.store_id, manager_id INTEGER? -> "
        "employees.employee_id, hire_date DATE, salary INTEGER",
    ),
    _table(
        "customers",
        "customer_id INTEGER, first_name TEXT, last_name TEXT, email TEXT?, city TEXT, country TEXT, "
        "signup_date DATE, loyalty_tier TEXT?",
    ),
    _table("products", "product_id INTEGER, name TEXT, category TEXT, price REAL, stock INTEGER, discontinued INTEGER"),
    _table(
        "orders",
        "order_id INTEGER, customer_id INTEGER -> customers.customer_id, employee_id INTEGER? -> "
        "employees.employee_id, store_id INTEGER? -> stores.store_id, channel TEXT, order_date DATE, status "
        "TEXT",
    ),
    _table(
        "order_items",
        "item_id INTEGER, order_id INTEGER -> orders.order_id, product_id INTEGER -> products.product_id, "
        "quantity INTEGER, unit_price REAL",
    ),
)


def create_table_sql(table: TableSpec, dialect: Dialect) -> str:
    """``CREATE TABLE`` for ``table`` in ``dialect`` (primary key, NOT NULL and foreign keys included)."""
    types = _SQL_TYPES[dialect]
    lines = [
        f"    {c.name} {types[c.type]}" + (" PRIMARY KEY" if i == 0 else "" if c.nullable else " NOT NULL")
        for i, c in enumerate(table.columns)
    ]
    lines += [
        f"    FOREIGN KEY ({c.name}) REFERENCES {c.references[0]} ({c.references[1]})"
        for c in table.columns
        if c.references is not None
    ]
    return f"CREATE TABLE {table.name} (\n" + ",\n".join(lines) + "\n)"


def spider_tables_entry() -> dict[str, object]:
    """The demo database's schema as one Spider ``tables.json`` entry."""
    columns = [(-1, "*", "text")]
    columns += [(t, c.name, _SPIDER_TYPES[c.type]) for t, table in enumerate(TABLES) for c in table.columns]
    index = {(TABLES[t].name, name): i for i, (t, name, _) in enumerate(columns) if t >= 0}
    return {
        "db_id": DB_ID,
        "table_names_original": [t.name for t in TABLES],
        "table_names": [t.name.replace("_", " ") for t in TABLES],
        "column_names_original": [[t, name] for t, name, _ in columns],
        "column_names": [[t, name.replace("_", " ")] for t, name, _ in columns],
        "column_types": [kind for _, _, kind in columns],
        "primary_keys": [index[(t.name, t.primary_key)] for t in TABLES],
        "foreign_keys": [
            [index[(t.name, c.name)], index[c.references]] for t in TABLES for c in t.columns if c.references
        ],
    }


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
