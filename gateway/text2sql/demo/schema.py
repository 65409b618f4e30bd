"""The demo database's schema: seven tables in one portable spec, rendered per dialect and for Spider."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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


def _c(name: str, type_: ColumnType, nullable: bool = False, references: tuple[str, str] | None = None) -> ColumnSpec:
    return ColumnSpec(name, type_, nullable, references)


TABLES: tuple[TableSpec, ...] = (
    TableSpec(
        "departments",
        (_c("department_id", "INTEGER"), _c("name", "TEXT"), _c("budget", "REAL"), _c("city", "TEXT")),
    ),
    TableSpec(
        "stores",
        (
            _c("store_id", "INTEGER"),
            _c("name", "TEXT"),
            _c("city", "TEXT"),
            _c("country", "TEXT"),
            _c("opened_date", "DATE"),
            _c("size_sqm", "INTEGER"),
        ),
    ),
    TableSpec(
        "employees",
        (
            _c("employee_id", "INTEGER"),
            _c("first_name", "TEXT"),
            _c("last_name", "TEXT"),
            _c("job_title", "TEXT"),
            _c("department_id", "INTEGER", references=("departments", "department_id")),
            _c("store_id", "INTEGER", nullable=True, references=("stores", "store_id")),
            _c("manager_id", "INTEGER", nullable=True, references=("employees", "employee_id")),
            _c("hire_date", "DATE"),
            _c("salary", "INTEGER"),
        ),
    ),
    TableSpec(
        "customers",
        (
            _c("customer_id", "INTEGER"),
            _c("first_name", "TEXT"),
            _c("last_name", "TEXT"),
            _c("email", "TEXT", nullable=True),
            _c("city", "TEXT"),
            _c("country", "TEXT"),
            _c("signup_date", "DATE"),
            _c("loyalty_tier", "TEXT", nullable=True),
        ),
    ),
    TableSpec(
        "products",
        (
            _c("product_id", "INTEGER"),
            _c("name", "TEXT"),
            _c("category", "TEXT"),
            _c("price", "REAL"),
            _c("stock", "INTEGER"),
            _c("discontinued", "INTEGER"),
        ),
    ),
    TableSpec(
        "orders",
        (
            _c("order_id", "INTEGER"),
            _c("customer_id", "INTEGER", references=("customers", "customer_id")),
            _c("employee_id", "INTEGER", nullable=True, references=("employees", "employee_id")),
            _c("store_id", "INTEGER", nullable=True, references=("stores", "store_id")),
            _c("channel", "TEXT"),
            _c("order_date", "DATE"),
            _c("status", "TEXT"),
        ),
    ),
    TableSpec(
        "order_items",
        (
            _c("item_id", "INTEGER"),
            _c("order_id", "INTEGER", references=("orders", "order_id")),
            _c("product_id", "INTEGER", references=("products", "product_id")),
            _c("quantity", "INTEGER"),
            _c("unit_price", "REAL"),
        ),
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
    column_names_original: list[list[object]] = [[-1, "*"]]
    column_types = ["text"]
    index: dict[tuple[str, str], int] = {}
    primary_keys: list[int] = []
    for t_idx, table in enumerate(TABLES):
        for col in table.columns:
            index[(table.name, col.name)] = len(column_names_original)
            if col.name == table.primary_key:
                primary_keys.append(len(column_names_original))
            column_names_original.append([t_idx, col.name])
            column_types.append(_SPIDER_TYPES[col.type])
    foreign_keys = [
        [index[(table.name, col.name)], index[col.references]]
        for table in TABLES
        for col in table.columns
        if col.references is not None
    ]
    return {
        "db_id": DB_ID,
        "table_names_original": [t.name for t in TABLES],
        "table_names": [t.name.replace("_", " ") for t in TABLES],
        "column_names_original": column_names_original,
        "column_names": [[t, str(n).replace("_", " ")] for t, n in column_names_original],
        "column_types": column_types,
        "primary_keys": primary_keys,
        "foreign_keys": foreign_keys,
    }
