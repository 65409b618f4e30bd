"""Arrival processes in seconds: Poisson, Gamma (by coefficient of variation) and recorded patterns (CSV such as
Azure's or BurstGPT's, Mooncake's JSON lines, ServeGen's fits; ``pattern_arrivals`` picks by format) and flash
crowds (``flash_arrivals``, a Markov-modulated Poisson process)."""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TextIO

from gateway.errors import ConfigError


def _check_positive(name: str, value: float | None) -> None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number, got {value}")


def _check_count(n: int | None) -> None:
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0, got {n}")


def _renewal(n: int, start: float, gap: Callable[..., float], *params: float) -> list[float]:
    """``n`` times, each ``gap(*params)`` after the one before (the first after ``start``)."""
    out: list[float] = []
    t = start
    for _ in range(n):
        t += gap(*params)
        out.append(t)
    return out


@contextmanager
def _trace_file(path: Path, format_name: str, newline: str | None = None) -> Iterator[TextIO]:
    """``path`` open as UTF-8 text; a file that cannot be read or decoded raises ``ConfigError``."""
    try:
        with path.open(newline=newline, encoding="utf-8") as f:
            yield f
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read the arrival trace: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), "", f"expected a UTF-8 {format_name}") from exc


def poisson_arrivals(n: int, rate_qps: float, rng: random.Random, start: float = 0.0) -> list[float]:
    """``n`` arrival times of a Poisson process of rate ``rate_qps`` (the first one gap after ``start``)."""
    _check_count(n)
    _check_positive("rate_qps", rate_qps)
    return _renewal(n, start, rng.expovariate, rate_qps)


FLASH_CALM = 0.2 / 0.45
"""A flash crowd's calm rate over its mean rate (0.2 of a cluster's bound when the mean is 0.45 of it)."""
FLASH_BURST = 2.4 / 0.45
"""A flash crowd's burst rate over its mean rate (2.4 of the bound when the mean is 0.45 of it)."""
FLASH_BURST_LEN = 142.0
"""A burst's mean length in mean inter-arrival times (about 760 arrivals: ten minutes at 0.45 of paper-4gpu's
bound); the calm spells' mean length makes the long-run mean rate 1."""


def flash_arrivals(n: int, rng: random.Random, *, mean_rate: float = 1.0) -> list[float]:
    """``n`` arrival times of a flash-crowd pattern at ``mean_rate``: a Markov-modulated Poisson process that
    alternates calm spells (``FLASH_CALM`` x the mean rate) and bursts (``FLASH_BURST`` x it) of exponential
    lengths (bursts ``FLASH_BURST_LEN`` mean gaps on average), starting calm at a random point of its spell."""
    _check_count(n)
    _check_positive("mean_rate", mean_rate)
    p = (1.0 - FLASH_CALM) / (FLASH_BURST - FLASH_CALM)  # the share of time in bursts that makes the mean 1
    lengths = (FLASH_BURST_LEN * (1.0 - p) / p / mean_rate, FLASH_BURST_LEN / mean_rate)
    rates = (FLASH_CALM * mean_rate, FLASH_BURST * mean_rate)
    out: list[float] = []
    t, state = 0.0, 0
    end = rng.uniform(0.0, lengths[0])
    while len(out) < n:
        t += rng.expovariate(rates[state])
        while t >= end:  # the state changed before this arrival: memoryless, so draw it again from there
            t, state = end, 1 - state
            end = t + rng.expovariate(1.0 / lengths[state])
            t += rng.expovariate(rates[state])
        out.append(t)
    return out


def gamma_arrivals(n: int, rate_qps: float, cv: float, rng: random.Random, start: float = 0.0) -> list[float]:
    """``n`` arrival times with Gamma gaps of mean ``1 / rate_qps`` and coefficient of variation ``cv`` (1:
    Poisson; larger: burstier)."""
    _check_count(n)
    _check_positive("rate_qps", rate_qps)
    _check_positive("cv", cv)
    shape = 1.0 / (cv * cv)
    return _renewal(n, start, rng.gammavariate, shape, 1.0 / (rate_qps * shape))


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
    """At most ``n`` arrival offsets from the first row of a CSV trace's time column (``column`` or a usual name;
    datetimes or seconds), times ``time_scale`` or rescaled to ``rate_qps``; ``ConfigError`` for a bad file."""
    if rate_qps is not None and time_scale is not None:
        raise ValueError("give rate_qps or time_scale, not both")
    _check_positive("rate_qps", rate_qps)
    _check_positive("time_scale", time_scale)
    _check_count(n)
    where = str(path)
    with _trace_file(path, "CSV file", newline="") as f:
        reader = csv.DictReader(f)
        col = _time_column(list(reader.fieldnames or []), column, where)
        stamps = _offsets(_read_times(reader, col, where), n, where)
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


def _read_times(reader: csv.DictReader[str], col: str, where: str) -> Iterator[tuple[str, float | datetime]]:
    """Each row's time in column ``col``, with where it stands (for ``_offsets``)."""
    for row_index, row in enumerate(reader, start=1):
        raw = row.get(col)
        at = f"row {row_index} column {col}"
        try:
            if raw is None:
                raise ValueError("missing")
            yield at, _parse_time(raw)
        except ValueError:
            raise ConfigError(
                where,
                at,
                f"expected seconds or a timestamp like 2023-11-16 18:15:46.6805900, got {raw!r}",
            ) from None


def _offsets(times: Iterable[tuple[str, float | datetime]], n: int | None, where: str) -> list[float]:
    """The first ``n`` times as offsets from the first one, checking they keep its format and never go backwards."""
    out: list[float] = []
    first: float | datetime | None = None
    for at, value in itertools.islice(times, n):
        if first is None:
            first = value
        if isinstance(value, datetime) and isinstance(first, datetime):
            offset = (value - first).total_seconds()
        elif isinstance(value, float) and isinstance(first, float):
            offset = value - first
        else:
            raise ConfigError(where, at, "expected the same time format as the first row")
        if out and offset < out[-1]:
            raise ConfigError(where, at, "expected non-decreasing times (the trace must be sorted)")
        out.append(offset)
    return out


def jsonl_arrivals(path: Path, n: int | None = None, key: str = "timestamp") -> list[float]:
    """Arrival offsets (in the file's time unit) from a JSON-lines trace such as Mooncake's (``timestamp``
    in milliseconds), 0.0 first; only the first ``n`` lines when given. Times must not go backwards."""
    where = str(path)

    def times(lines: Iterable[str]) -> Iterator[tuple[str, float | datetime]]:
        for i, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            at = f"line {i}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(where, at, f"not valid JSON ({exc.msg})") from None
            raw = obj.get(key) if isinstance(obj, dict) else None
            if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
                raise ConfigError(where, f"{at}.{key}", f"expected a number, got {raw!r}")
            yield at, float(raw)

    with _trace_file(path, "JSON-lines file") as f:
        return _offsets(times(f), n, where)


SERVEGEN_WINDOW_S = 600.0
"""Length of one ServeGen rate window (seconds)."""


def servegen_arrivals(path: Path, n: int, rng: random.Random) -> list[float]:
    """``n`` arrival offsets drawn from a ServeGen client trace (one row per 10-minute window) as ServeGen's sampler
    does: per window, gaps from the fitted Gamma or Weibull; idle windows skipped, windows cycled."""
    where = str(path)
    windows: list[tuple[float, str, float, float]] = []
    with _trace_file(path, "CSV file", newline="") as f:
        for i, row in enumerate(csv.reader(f), start=1):
            if not row or not "".join(row).strip():
                continue
            at = f"row {i}"
            if len(row) < 6:
                raise ConfigError(
                    where, at, f"expected 6 fields (start, rate, cv, family, shape, scale), got {len(row)}"
                )
            try:
                rate, shape, scale = float(row[1]), float(row[4]), float(row[5])
            except ValueError:
                raise ConfigError(where, at, "expected numbers in the rate, shape and scale fields") from None
            family = row[3].strip()
            if rate > 0:
                if family not in ("Gamma", "Weibull") or not (shape > 0 and scale > 0):
                    raise ConfigError(
                        where, at, f"expected family Gamma or Weibull with positive parameters, got {family!r}"
                    )
                windows.append((rate, family, shape, scale))
    if not windows:
        raise ConfigError(where, "", "no window with traffic")
    out: list[float] = []
    t0 = 0.0
    w = 0
    while len(out) < n:
        rate, family, shape, scale = windows[w % len(windows)]
        w += 1
        count = max(1, round(rate * SERVEGEN_WINDOW_S))
        gaps = [
            rng.gammavariate(shape, scale) if family == "Gamma" else rng.weibullvariate(scale, shape)
            for _ in range(count)
        ]
        total = sum(gaps)
        factor = SERVEGEN_WINDOW_S / total if total > 0 else 0.0
        t = t0
        for g in gaps:
            t += g * factor
            out.append(t)
            if len(out) >= n:
                break
        t0 += SERVEGEN_WINDOW_S
    first = out[0]
    return [x - first for x in out]


def pattern_arrivals(path: Path, n: int, rng: random.Random) -> list[float]:
    """The first ``n`` arrival offsets of a recorded pattern, by format: a JSON-lines file (Mooncake), a
    ServeGen client trace (a CSV without header), or a CSV with a time column (Azure LLM, BurstGPT)."""
    if path.suffix == ".jsonl":
        return jsonl_arrivals(path, n)
    with _trace_file(path, "text file") as f:
        head = f.readline()
    first = head.split(",")[0].strip()
    try:
        float(first)
    except ValueError:
        return replay_arrivals(path, n)
    return servegen_arrivals(path, n, rng)
