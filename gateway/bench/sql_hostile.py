"""Hostile SQL against the database layer's caps, with a health endpoint probed meanwhile
(docs/text2sql.md, "Caps that hold before memory is spent").

    python -m gateway.bench.sql_hostile [--timeout-s 3] [--pg-admin-url postgresql://postgres@127.0.0.1:5432/test]
                                        [--no-pg] [--json OUT]

Each payload runs through the engine side only (``Database._run``: no static check) on SQLite and, when
the server answers, PostgreSQL as a least-privilege role, while a thread probes ``GET /healthz`` every
10 ms (a blocked loop shows as health latency). Printed per payload: outcome, wall seconds, RSS and the
health probes' p99 and max."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import math
import os
import resource
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from gateway.bench.stats import fmt, percentile, save_json, table
from gateway.text2sql.db import DatabaseConfig, PostgresDatabase, QueryFailed, SqliteDatabase
from gateway.text2sql.db.base import Database

_RECURSE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) "
PAYLOADS: dict[str, dict[str, str]] = {
    "sqlite": {
        "randomblob(1e9)": "SELECT length(randomblob(1000000000))",
        "zeroblob(1e9)": "SELECT length(zeroblob(1000000000))",
        "printf('%.*c', 2e9)": "SELECT length(printf('%.*c', 2000000000, 'x'))",
        "replace(hex(zeroblob(1e8)))": "SELECT length(replace(hex(zeroblob(100000000)), '0', 'ab'))",
        "doubling CTE (s || s)": "WITH RECURSIVE c(x, s) AS (SELECT 1, 'a' UNION ALL "
        "SELECT x + 1, s || s FROM c WHERE x < 40) SELECT max(length(s)) FROM c",
        "count to 1e9": _RECURSE.format(n=1_000_000_000) + "SELECT count(*) FROM c",
        "sort 1e8 rows": _RECURSE.format(n=100_000_000) + "SELECT x FROM c ORDER BY x DESC LIMIT 1",
        "group_concat 1e7 x 2 KB": "SELECT length(group_concat(hex(randomblob(1000)))) FROM ("
        + _RECURSE.format(n=10_000_000)
        + "SELECT x FROM c)",
    },
    "postgres": {
        "repeat 400 MB": "SELECT repeat('x', 400000000)",
        "bytea 100 MB": "SELECT decode(repeat('ab', 50000000), 'hex')",
        "array_agg 1e7": "SELECT array_agg(g) FROM generate_series(1, 10000000) AS g",
        "1000 rows x 0.9 MB": "SELECT g, repeat('x', 900000) FROM generate_series(1, 1000) AS g",
        "count to 1e10": "SELECT count(*) FROM generate_series(1, 10000000000)",
    },
}
"""engine -> payload name -> SQL."""


@dataclass
class PayloadResult:
    """One payload's outcome and figures."""

    engine: str
    name: str
    outcome: str
    wall_s: float
    rss_mb: float
    peak_rss_mb: float
    health_p99_ms: float
    health_max_ms: float
    health_probes: int


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Prober(threading.Thread):
    """Sends ``GET /healthz`` every 10 ms on a new connection and records each latency (ms)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.samples: list[tuple[float, float]] = []  # (monotonic start, latency ms)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                conn.close()
            except OSError:
                continue
            self.samples.append((start, (time.monotonic() - start) * 1000))
            self.stop.wait(0.01)

    def between(self, t0: float, t1: float) -> list[float]:
        return [ms for start, ms in list(self.samples) if t0 <= start <= t1]


async def _health(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
    await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def _pg_reader(admin_url: str) -> AsyncIterator[str]:
    """A throw-away database and a login role with CONNECT only, dropped when the block ends: the reader's URL."""
    import asyncpg

    name, role, password = f"hexflow_b_{uuid.uuid4().hex[:10]}", f"hexflow_b_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    conn = await asyncpg.connect(admin_url, timeout=5)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
        await conn.execute(
            f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}' NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS"
        )
        await conn.execute(f'GRANT CONNECT ON DATABASE "{name}" TO "{role}"')
        parts = urlsplit(admin_url)
        host = parts.netloc.rsplit("@", 1)[-1]
        yield urlunsplit(parts._replace(path=f"/{name}", netloc=f"{role}:{password}@{host}"))
    finally:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        await conn.close()


async def _payload(engine: str, name: str, db: Database, sql: str, prober: _Prober) -> PayloadResult:
    """Run one payload: its outcome, wall time, RSS and the health probes sent meanwhile."""
    t0 = time.monotonic()
    try:
        r = await db._run(sql)
        outcome = f"ok ({r.row_count} rows{', truncated' if r.truncated else ''})"
    except QueryFailed as exc:
        outcome = exc.kind
    t1 = time.monotonic()
    await asyncio.sleep(0.05)
    probes = prober.between(t0, t1)
    health = (percentile(probes, 99) if probes else math.nan, max(probes, default=math.nan), len(probes))
    print(f"  {engine:8} {name:28} {outcome:10} {t1 - t0:6.2f} s", file=sys.stderr, flush=True)
    return PayloadResult(engine, name, outcome, t1 - t0, _rss_mb(), _peak_rss_mb(), *health)


async def run(timeout_s: float, pg_admin_url: str | None, workdir: Path) -> tuple[list[PayloadResult], list[float]]:
    """Run every payload with the health prober going: the results in order, and every probe's latency (ms)."""
    server = await asyncio.start_server(_health, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    prober = _Prober(port)
    prober.start()
    path = workdir / "bench.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (a int)")
    conn.commit()
    conn.close()
    dbs: dict[str, Database] = {
        "sqlite": SqliteDatabase("bench", DatabaseConfig(url=f"sqlite:///{path}", statement_timeout_s=timeout_s))
    }
    results: list[PayloadResult] = []
    async with contextlib.AsyncExitStack() as pg:
        if pg_admin_url is not None:
            try:
                reader = await pg.enter_async_context(_pg_reader(pg_admin_url))
            except Exception as exc:
                print(f"PostgreSQL skipped: {exc}", file=sys.stderr)
            else:
                dbs["postgres"] = PostgresDatabase("bench", DatabaseConfig(url=reader, statement_timeout_s=timeout_s))
        try:
            await asyncio.sleep(0.2)
            for engine, db in dbs.items():
                results += [await _payload(engine, name, db, sql, prober) for name, sql in PAYLOADS[engine].items()]
        finally:
            prober.stop.set()
            server.close()
            for db in dbs.values():
                await db.close()
    return results, [ms for _, ms in prober.samples]


def format_results(results: Sequence[PayloadResult], all_probes: Sequence[float]) -> str:
    """The table and the whole run's health p99."""
    rows = []
    for r in results:
        figures = [fmt(r.wall_s, 2), fmt(r.rss_mb, 0), fmt(r.peak_rss_mb, 0), fmt(r.health_p99_ms, 1)]
        rows.append([r.engine, r.name, r.outcome, *figures, fmt(r.health_max_ms, 1), str(r.health_probes)])
    head = ["engine", "payload", "outcome", "wall s", "RSS MB", "peak MB", "health p99 ms", "max ms", "probes"]
    text = table(head, rows, left=3)
    if all_probes:
        text += f"\n\nhealth over the whole run: p99 {percentile(all_probes, 99):.1f} ms, max {max(all_probes):.1f} ms"
        text += f" ({len(all_probes)} probes)"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Run the payloads and print the figures."""
    parser = argparse.ArgumentParser(prog="python -m gateway.bench.sql_hostile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout-s", type=float, default=3.0, help="statement timeout of both databases")
    parser.add_argument("--pg-admin-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    parser.add_argument("--json", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not args.timeout_s > 0:
        parser.error("--timeout-s must be positive")
    with tempfile.TemporaryDirectory(prefix="hexflow-sql-hostile-") as tmp:
        results, probes = asyncio.run(run(args.timeout_s, None if args.no_pg else args.pg_admin_url, Path(tmp)))
    print(format_results(results, probes))
    if args.json:
        save_json(args.json, [asdict(r) for r in results], allow_nan=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
