"""What a query returns: ``QueryResult`` (rows as JSON-safe values) and the row collector that holds the caps."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.text2sql.db.errors import QueryFailed

FETCH_CHUNK = 256
"""Rows fetched from a cursor at a time."""


@dataclass(frozen=True, slots=True)
class QueryResult:
    """Rows of one query, as JSON-safe values (see ``json_value``)."""

    columns: list[str]
    rows: list[list[Any]]
    row_count: int
    """Rows returned (``len(rows)``, at most ``max_rows``)."""
    truncated: bool
    """More rows existed than returned (the row cap or the byte cap cut the result)."""
    elapsed_s: float


def json_value(v: object) -> Any:
    """A value as JSON can carry it: bytes as hex, Decimal as float, date/time as ISO 8601, non-finite floats
    as ``"inf"``/``"-inf"``/``"nan"``, arrays as lists, anything else ``str(v)``."""
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).hex()
    if isinstance(v, decimal.Decimal):
        f = float(v)
        return f if math.isfinite(f) else str(f)
    if isinstance(v, dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, list | tuple):
        return [json_value(x) for x in v]
    return str(v)


def too_large(max_bytes: int) -> str:
    """The message of a ``QueryFailed("too_large", ...)``: a value or one row over the byte cap."""
    return f"a value or a single row of the result is larger than the limit of {max_bytes} bytes"


class CappedRows:
    """Collects converted rows up to the row and byte caps: a row that does not fit truncates the result; a
    first row alone over the byte cap raises ``QueryFailed("too_large")``."""

    def __init__(self, columns: list[str], max_rows: int, max_bytes: int) -> None:
        self.columns = columns
        self.rows: list[list[Any]] = []
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.size = len(json.dumps(columns, ensure_ascii=False).encode())
        self.truncated = False

    def want(self) -> int:
        """How many more rows to fetch: up to one past the cap, to learn whether more exist."""
        return 0 if self.truncated else min(FETCH_CHUNK, self.max_rows + 1 - len(self.rows))

    def add(self, batch: Iterable[Iterable[object]]) -> None:
        """Take rows until a cap is hit (then ``truncated`` is set and ``want()`` is 0)."""
        for raw in batch:
            if len(self.rows) >= self.max_rows:
                self.truncated = True
                return
            row = [json_value(v) for v in raw]
            n = len(json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode()) + 1
            if self.size + n > self.max_bytes:
                if not self.rows:
                    raise QueryFailed("too_large", too_large(self.max_bytes))
                self.truncated = True
                return
            self.rows.append(row)
            self.size += n

    def result(self, start: float) -> QueryResult:
        """The rows collected so far, ``elapsed_s`` counted from ``start`` (``time.perf_counter``)."""
        return QueryResult(self.columns, self.rows, len(self.rows), self.truncated, time.perf_counter() - start)
