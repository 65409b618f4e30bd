"""The demo dataset as files, each written atomically (rewriting is harmless while a gateway reads them)."""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from pathlib import Path

import yaml

from gateway.text2sql.demo.rows import demo_rows
from gateway.text2sql.demo.schema import DB_ID, TABLES, Value, create_table_sql, demo_questions, spider_tables_entry


def load_sqlite(conn: sqlite3.Connection, seed: int = 0) -> None:
    """Create the demo tables in an open (empty) SQLite connection, e.g. ``sqlite3.connect(":memory:")``."""
    rows = demo_rows(seed)
    for table in TABLES:
        conn.execute(create_table_sql(table, "sqlite"))
        marks = ", ".join("?" for _ in table.columns)
        conn.executemany(f"INSERT INTO {table.name} VALUES ({marks})", rows[table.name])
    conn.commit()


def write_sqlite(path: Path, seed: int = 0) -> Path:
    """Write the demo database to ``path`` (overwriting it atomically: a temporary file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        conn = sqlite3.connect(tmp)
        try:
            load_sqlite(conn, seed)
        finally:
            conn.close()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_demo_databases(
    out_path: Path | str,
    seed: int = 0,
    *,
    statement_timeout_s: float | None = None,
    max_rows: int | None = None,
) -> Path:
    """Write ``<folder of out_path>/demo_retail.sqlite`` (world-readable) and, at ``out_path``, a databases file
    naming it by a relative path; returns ``out_path``. ``ValueError`` when ``out_path`` is the database's name."""
    out = Path(out_path)
    if out.name == f"{DB_ID}.sqlite":
        raise ValueError(f"{out}: that is where the database goes; name the databases file e.g. databases.yaml")
    db = write_sqlite(out.parent / f"{DB_ID}.sqlite", seed)
    db.chmod(0o644)
    limits = {"statement_timeout_s": statement_timeout_s, "max_rows": max_rows}
    entry: dict[str, object] = {"url": f"sqlite:///{db.name}", "description": "demo retail"}
    entry |= {k: v for k, v in limits.items() if v is not None}
    text = "# The demo database of HexGen-Flow (hexflow databases --demo); the path is relative to this file.\n"
    text += yaml.safe_dump({"databases": {DB_ID: entry}}, sort_keys=False)
    write_text_atomic(out, text)
    return out


def _pg_literal(value: Value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + value.replace("'", "''") + "'"


def postgres_script(seed: int = 0, *, rows_per_insert: int = 500) -> str:
    """A PostgreSQL 15 script that creates and fills the demo tables (keys included), in one transaction."""
    rows = demo_rows(seed)
    out = ["BEGIN;"]
    for table in TABLES:
        out.append(create_table_sql(table, "postgres") + ";")
    for table in TABLES:
        data = rows[table.name]
        cols = ", ".join(table.column_names)
        for start in range(0, len(data), rows_per_insert):
            chunk = data[start : start + rows_per_insert]
            values = ",\n".join("(" + ", ".join(_pg_literal(v) for v in row) + ")" for row in chunk)
            out.append(f"INSERT INTO {table.name} ({cols}) VALUES\n{values};")
    out.append("COMMIT;")
    return "\n".join(out) + "\n"


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_spider_dataset(out_dir: Path, seed: int = 0) -> Path:
    """Write the demo dataset in Spider layout under ``out_dir`` (created if needed); returns ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_sqlite(out_dir / "database" / DB_ID / f"{DB_ID}.sqlite", seed)
    dev = [
        {"db_id": DB_ID, "question": q.question, "query": q.query, "difficulty": q.difficulty}
        | ({} if q.evidence is None else {"evidence": q.evidence})
        for q in demo_questions()
    ]
    write_text_atomic(out_dir / "dev.json", json.dumps(dev, indent=2) + "\n")
    write_text_atomic(out_dir / "tables.json", json.dumps([spider_tables_entry()], indent=2) + "\n")
    return out_dir
