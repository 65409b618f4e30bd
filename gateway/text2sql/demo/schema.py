"""The demo database's schema: seven tables in one portable spec, rendered per dialect and for Spider."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

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


TABLES: tuple[TableSpec, ...] = (
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


def demo_tables() -> list[TableSpec]:
    """The demo database's tables, in an order that satisfies every foreign key."""
    return list(TABLES)


def create_table_sql(table: TableSpec, dialect: Dialect) -> str:
    """``CREATE TABLE`` for ``table`` in ``dialect`` (primary key, NOT NULL and foreign keys included)."""
    types = _SQL_TYPES[dialect]
    lines = []
    for i, col in enumerate(table.columns):
        line = f"    {col.name} {types[col.type]}"
        if i == 0:
            line += " PRIMARY KEY"
        elif not col.nullable:
            line += " NOT NULL"
        lines.append(line)
    for col in table.columns:
        if col.references is not None:
            ref_table, ref_col = col.references
            lines.append(f"    FOREIGN KEY ({col.name}) REFERENCES {ref_table} ({ref_col})")
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
