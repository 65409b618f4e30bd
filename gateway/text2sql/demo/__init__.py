"""The project's own demo Text-to-SQL dataset: ``demo_retail``, a small retail company database generated from a
seed for SQLite and PostgreSQL, and its gold questions (docs/text2sql.md, "Demo data and scripted answers")."""

from __future__ import annotations

from gateway.text2sql.demo.rows import demo_rows
from gateway.text2sql.demo.schema import (
    DB_ID,
    TABLES,
    DemoQuestion,
    create_table_sql,
    demo_questions,
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
    "TABLES",
    "DemoQuestion",
    "create_table_sql",
    "demo_questions",
    "demo_rows",
    "load_sqlite",
    "postgres_script",
    "spider_tables_entry",
    "write_demo_databases",
    "write_spider_dataset",
    "write_sqlite",
]
