"""Arrival processes: Poisson, Gamma (burstiness set by the coefficient of variation) and CSV replay.

Times are in seconds. ``replay_arrivals`` reads a CSV trace such as the Azure LLM inference trace 2023
or BurstGPT. The random processes take a ``random.Random`` instance and never the global generator.
"""

from __future__ import annotations

import csv
import math
import random
from datetime import datetime
from pathlib import Path

from gateway.errors import ConfigError

__all__ = ["gamma_arrivals", "poisson_arrivals", "replay_arrivals"]


def _check_arrival_args(n: int, rate_qps: float) -> None:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not (rate_qps > 0 and math.isfinite(rate_qps)):
        raise ValueError(f"rate_qps must be a positive number, got {rate_qps}")


def poisson_arrivals(n: int, rate_qps: float, rng: random.Random, start: float = 0.0) -> list[float]:
    """``n`` arrival times of a Poisson process of rate ``rate_qps`` that starts at ``start``.

    The first arrival is one exponential gap after ``start``, like every later one.
    """
    _check_arrival_args(n, rate_qps)
    out: list[float] = []
    t = start
    for _ in range(n):
        t += rng.expovariate(rate_qps)
        out.append(t)
    return out


def gamma_arrivals(n: int, rate_qps: float, cv: float, rng: random.Random, start: float = 0.0) -> list[float]:
    """``n`` arrival times with Gamma inter-arrival gaps of mean ``1 / rate_qps``.

    ``cv`` is the gaps' coefficient of variation: ``cv = 1`` is a Poisson process, larger values are
    burstier (Gamma shape ``1 / cv**2``).
    """
    _check_arrival_args(n, rate_qps)
    if not (cv > 0 and math.isfinite(cv)):
        raise ValueError(f"cv must be a positive number, got {cv}")
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate_qps * shape)
    out: list[float] = []
    t = start
    for _ in range(n):
        t += rng.gammavariate(shape, scale)
        out.append(t)
    return out


_TIME_COLUMNS = ("timestamp", "time", "arrival_time", "arrival")


def _parse_time(text: str) -> float | datetime:
    """Seconds as a number, or a naive wall-clock timestamp (fraction cut to the 6 digits Python reads)."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ValueError("not a finite number")
        return seconds
    head, dot, frac = value.partition(".")
    if dot:
        value = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(value)


def replay_arrivals(
    path: Path,
    n: int | None = None,
    column: str | None = None,
    *,
    rate_qps: float | None = None,
    time_scale: float | None = None,
) -> list[float]:
    """Arrival offsets in seconds from the first row of a CSV trace (0.0 first).

    The time column is ``column`` or, by default, the first header named ``timestamp``, ``time``,
    ``arrival_time`` or ``arrival`` (any case): the Azure LLM trace's ``TIMESTAMP``
    (``2023-11-16 18:15:46.6805900``) or BurstGPT's ``Timestamp`` in seconds both work. Only the first
    ``n`` rows are read when ``n`` is given. ``time_scale`` multiplies the offsets (2.0 replays at half
    speed); ``rate_qps`` instead rescales them so the mean rate (arrivals - 1) / span equals it.
    A bad file raises ``ConfigError`` naming the column or row and what was expected.
    """
    if rate_qps is not None and time_scale is not None:
        raise ValueError("give rate_qps or time_scale, not both")
    if rate_qps is not None and not (rate_qps > 0 and math.isfinite(rate_qps)):
        raise ValueError(f"rate_qps must be a positive number, got {rate_qps}")
    if time_scale is not None and not (time_scale > 0 and math.isfinite(time_scale)):
        raise ValueError(f"time_scale must be a positive number, got {time_scale}")
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    where = str(path)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            col = _time_column(header, column, where)
            stamps = _read_times(reader, col, n, where)
    except OSError as exc:
        raise ConfigError(where, "", f"cannot read the arrival trace: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(where, "", "expected a UTF-8 CSV file") from exc
    if not stamps:
        return []
    offsets = stamps
    if time_scale is not None:
        offsets = [t * time_scale for t in offsets]
    elif rate_qps is not None:
        span = offsets[-1]
        if len(offsets) < 2 or span <= 0:
            raise ConfigError(where, col, "needs at least two distinct timestamps to rescale to a rate")
        factor = (len(offsets) - 1) / span / rate_qps
        offsets = [t * factor for t in offsets]
    return offsets


def _time_column(header: list[str], column: str | None, where: str) -> str:
    if not header:
        raise ConfigError(where, "", "expected a CSV header row")
    if column is not None:
        if column not in header:
            raise ConfigError(where, column, f"no such column; the header has {', '.join(header)}")
        return column
    lowered = {h.strip().lower(): h for h in header}
    for name in _TIME_COLUMNS:
        if name in lowered:
            return lowered[name]
    raise ConfigError(
        where, "", f"expected a time column ({', '.join(_TIME_COLUMNS)}); the header has {', '.join(header)}"
    )


def _read_times(reader: csv.DictReader[str], col: str, n: int | None, where: str) -> list[float]:
    """Offsets from the first row, checking every row parses and time never goes backwards."""
    out: list[float] = []
    first: float | datetime | None = None
    prev = 0.0
    for row_index, row in enumerate(reader, start=1):
        if n is not None and row_index > n:
            break
        raw = row.get(col)
        at = f"row {row_index} column {col}"
        try:
            if raw is None:
                raise ValueError("missing")
            value = _parse_time(raw)
        except ValueError:
            raise ConfigError(
                where,
                at,
                f"expected seconds or a timestamp like 2023-11-16 18:15:46.6805900, got {raw!r}",
            ) from None
        if first is None:
            first = value
        if isinstance(value, datetime) and isinstance(first, datetime):
            offset = (value - first).total_seconds()
        elif isinstance(value, float) and isinstance(first, float):
            offset = value - first
        else:
            raise ConfigError(where, at, "expected the same time format as the first row")
        if offset < prev:
            raise ConfigError(where, at, "expected non-decreasing times (the trace must be sorted)")
        prev = offset
        out.append(offset)
    return out
