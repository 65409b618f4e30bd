"""The project's own demo Text-to-SQL dataset: ``demo_retail``, a small retail company database generated
deterministically (``random.Random(seed)``) for SQLite and PostgreSQL (docs/text2sql.md, "Demo data and
scripted answers"). Gold queries run unchanged on both engines (``query_pg`` for the few that cannot),
never select a raw DATE column and break ``ORDER BY ... LIMIT`` ties on a key. Modules: ``schema``,
``rows``, ``questions``, ``writers``; this package re-exports their names."""

from __future__ import annotations

from gateway.text2sql.demo.questions import DemoQuestion, Difficulty, demo_questions
from gateway.text2sql.demo.rows import demo_rows
from gateway.text2sql.demo.schema import (
    DB_ID,
    ColumnSpec,
    ColumnType,
    Dialect,
    TableSpec,
    Value,
    create_table_sql,
    demo_tables,
    spider_tables_entry,
)
from gateway.text2sql.demo.writers import (
    load_sqlite,
    postgres_script,
    write_demo_databases,
    write_spider_dataset,
    write_sqlite,
)

__all__ = [
    "DB_ID",
    "ColumnSpec",
    "ColumnType",
    "DemoQuestion",
    "Dialect",
    "Difficulty",
    "TableSpec",
    "Value",
    "create_table_sql",
    "demo_questions",
    "demo_rows",
    "demo_tables",
    "load_sqlite",
    "postgres_script",
    "spider_tables_entry",
    "write_demo_databases",
    "write_spider_dataset",
    "write_sqlite",
]
