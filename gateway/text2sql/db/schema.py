"""Introspected schemas, their prompt text (``serialize_schema``) and the value conversions both engines share."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from gateway.config.databases import Dialect

Descriptions = Mapping[str, Mapping[str, str]]
"""Column descriptions of one database: table -> column -> text (names matched case-insensitively)."""
Scalar = int | float | str | bool | None

_SAMPLE_TEXT_CHARS = 40


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One column: declared type, key and null flags, example values, optional description."""

    name: str
    type: str
    primary_key: bool = False
    nullable: bool = True
    samples: tuple[Scalar, ...] = ()
    description: str = ""


@dataclass(frozen=True, slots=True)
class ForeignKey:
    """``FOREIGN KEY (columns) REFERENCES ref_table(ref_columns)``."""

    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TableInfo:
    """One table (or view) and its columns in declaration order."""

    name: str
    columns: tuple[ColumnInfo, ...]
    primary_key: tuple[str, ...] = ()
    foreign_keys: tuple[ForeignKey, ...] = ()
    kind: Literal["table", "view"] = "table"

    def column(self, name: str) -> ColumnInfo | None:
        """The column called ``name`` (case-insensitive), if any."""
        low = name.lower()
        return next((c for c in self.columns if c.name.lower() == low), None)


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    """The tables of one database, sorted by name."""

    db_id: str
    dialect: Dialect
    tables: tuple[TableInfo, ...]
    description: str = ""

    def table(self, name: str) -> TableInfo | None:
        """The table called ``name`` (case-insensitive), if any."""
        low = name.lower()
        return next((t for t in self.tables if t.name.lower() == low), None)


def json_value(v: object) -> Any:
    """A value as JSON can carry it: bytes as hex, Decimal as float, date/time as ISO 8601, non-finite floats
    as ``"inf"``/``"-inf"``/``"nan"``, arrays as lists, anything else ``str(v)``."""
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float | decimal.Decimal):
        f = float(v)
        return f if math.isfinite(f) else str(f)
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).hex()
    if isinstance(v, dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, list | tuple):
        return [json_value(x) for x in v]
    return str(v)


def sample_value(v: object) -> Scalar:
    """A sample value: JSON-safe, text cut to ``_SAMPLE_TEXT_CHARS`` characters."""
    j = json_value(v)
    if isinstance(j, list):
        j = json.dumps(j, ensure_ascii=False)
    if isinstance(j, str):
        return j[:_SAMPLE_TEXT_CHARS]
    return j  # type: ignore[no-any-return]


def describe(tables: list[TableInfo], descriptions: Descriptions | None) -> tuple[TableInfo, ...]:
    """Tables sorted by name, column descriptions filled in from ``descriptions``."""
    lowered = {t.lower(): {c.lower(): d for c, d in cols.items()} for t, cols in (descriptions or {}).items()}
    out: list[TableInfo] = []
    for t in sorted(tables, key=lambda t: (t.name.lower(), t.name)):
        per_col = lowered.get(t.name.lower(), {})
        cols = tuple(replace(c, description=per_col.get(c.name.lower(), c.description)) for c in t.columns)
        out.append(replace(t, columns=cols))
    return tuple(out)


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_SIMPLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# fmt: off
_RESERVED = frozenset({
    "all", "and", "as", "asc", "between", "by", "case", "cast", "check", "column", "constraint", "create",
    "default", "delete", "desc", "distinct", "drop", "else", "end", "except", "exists", "foreign", "from", "group",
    "having", "in", "index", "insert", "intersect", "into", "is", "join", "key", "like", "limit", "not", "null",
    "offset", "on", "or", "order", "primary", "references", "select", "set", "table", "then", "to", "union",
    "unique", "update", "user", "using", "values", "when", "where", "with",
})
# fmt: on


def _name(name: str, dialect: Dialect) -> str:
    """``name`` as it must be written in SQL: quoted unless a plain identifier."""
    plain = _SIMPLE_NAME.match(name) and name.lower() not in _RESERVED
    if plain and (dialect != "postgres" or name == name.lower()):
        return name
    return quote_ident(name)


def _literal(v: Scalar) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return "'" + v.replace("'", "''").replace("\r", " ").replace("\n", " ") + "'"
    return "NULL" if v is None else str(v)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _table_block(t: TableInfo, dialect: Dialect, examples: bool, descriptions: bool) -> str:
    items: list[tuple[str, str]] = []  # (definition, comment)
    single_pk = len(t.primary_key) == 1
    for c in t.columns:
        key = "PRIMARY KEY" if c.primary_key and single_pk else "" if c.nullable or c.primary_key else "NOT NULL"
        definition = " ".join(p for p in (_name(c.name, dialect), c.type, key) if p)
        notes: list[str] = []
        if descriptions and c.description:
            notes.append(_one_line(c.description))
        if examples and c.samples:
            notes.append("examples: " + ", ".join(_literal(v) for v in c.samples))
        items.append((definition, "; ".join(notes)))
    if len(t.primary_key) > 1:
        items.append((f"PRIMARY KEY ({', '.join(_name(c, dialect) for c in t.primary_key)})", ""))
    for fk in t.foreign_keys:
        ref = _name(fk.ref_table, dialect)
        if fk.ref_columns:
            ref += f"({', '.join(_name(c, dialect) for c in fk.ref_columns)})"
        items.append((f"FOREIGN KEY ({', '.join(_name(c, dialect) for c in fk.columns)}) REFERENCES {ref}", ""))
    lines = [f"CREATE {'VIEW' if t.kind == 'view' else 'TABLE'} {_name(t.name, dialect)} ("]
    for i, (definition, comment) in enumerate(items):
        line = "  " + definition + ("," if i < len(items) - 1 else "")
        lines.append(f"{line} -- {comment}" if comment else line)
    lines.append(");")
    return "\n".join(lines)


def serialize_schema(schema: SchemaInfo, *, max_chars: int | None = None) -> str:
    """The schema as compact ``CREATE TABLE`` text for prompts (equal schemas, equal text); within ``max_chars``
    by dropping examples, then descriptions, then tables from the end (a first table alone over it is cut)."""
    if max_chars is not None and max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    blocks: list[str] = []
    for examples, descriptions in ((True, True), (False, True), (False, False)):
        blocks = [_table_block(t, schema.dialect, examples, descriptions) for t in schema.tables]
        text = "\n\n".join(blocks)
        if max_chars is None or len(text) <= max_chars:
            return text
    assert max_chars is not None
    kept: list[str] = []
    used = 0
    for b in blocks:
        extra = len(b) + (2 if kept else 0)
        if used + extra > max_chars:
            break
        kept.append(b)
        used += extra
    if not kept:
        return blocks[0][:max_chars]
    text = "\n\n".join(kept)
    omitted = len(blocks) - len(kept)
    note = f"-- {omitted} more table{'s' if omitted > 1 else ''} omitted"
    return f"{text}\n\n{note}" if len(text) + 2 + len(note) <= max_chars else text
