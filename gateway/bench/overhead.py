"""Gateway overhead (``hexflow overhead``): the same calls sent to a worker directly and through a gateway in
front of it, interleaved in one run; added latency, errors by kind, the gateway's CPU per call, and an
optional search for the highest rate it sustains. Method and figures: docs/live-gateway.md."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gateway.bench.procs import ChildProcess, free_port, gateway_process, probe
from gateway.bench.rig import bench_folder
from gateway.bench.stats import json_safe, percentile, save_json
from gateway.config import CONFIG_DIR
from gateway.errors import GatewayError

API_KEY = "demo-interactive-key"
_QUESTION = "How many heads of the departments are older than 56 ?"
ENDPOINTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": _QUESTION}], "max_tokens": 4}),
    "completions": ("/v1/completions", {"prompt": f"-- {_QUESTION}\nSELECT", "max_tokens": 4}),
}
"""The endpoints ``hexflow overhead`` measures: name -> (path, request body)."""
WORKERS = {
    "null": ["-m", "gateway.bench.nullworker"],
    "emulator": ["-m", "workers.emulator", "--gpu", "A100", "--time-scale", "1e-4"],
}
"""The worker behind the gateway (name -> its command): the null worker or the emulated A100."""
KEEP_UP_SHARE = 0.97
"""A stream keeps up when it achieves at least this share of the offered rate."""
RIG_MAX_CONCURRENT = 4096
SEARCH_CEILING, SEARCH_FLOOR, SEARCH_REL_TOL = 5000.0, 1.0, 0.05
"""The rate search's bounds (calls/s) and when it stops bisecting (failing rate within 5% of passing)."""


def error_kind(status: int | None = None, exc: BaseException | None = None) -> str:
    """The key a failed call is counted under: its HTTP status (``"503"``), or ``"timeout"``,
    ``"connection"`` (refused, reset, disconnected) or ``"protocol"`` (another client-side error)."""
    if exc is None:
        if status is None:
            raise ValueError("a failed call has an HTTP status or an exception")
        return str(status)
    # aiohttp's ServerTimeoutError is both a ClientError and a TimeoutError: a timeout first.
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "connection" if isinstance(exc, aiohttp.ClientConnectionError) else "protocol"


def merge_errors(*counts: dict[str, int]) -> dict[str, int]:
    """Error counts by kind, summed over streams; HTTP statuses first (ascending), then the other kinds."""
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return {k: total[k] for k in sorted(total, key=lambda k: (not k.isdigit(), k)) if total[k]}


def process_cpu_s(pid: int) -> float:
    """A live process's user + system CPU seconds (all its threads), from ``/proc/PID/stat``."""
    tail = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    # After the command: state, ppid, ..., utime (field 14 of the line), stime (15), in clock ticks.
    return (int(tail[11]) + int(tail[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class StreamStats:
    """Latencies and errors of one stream of calls."""

    sent: int = 0
    ok: int = 0
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors_by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        """Failed calls, all kinds."""
        return sum(self.errors_by_kind.values())

    def record_error(self, kind: str) -> None:
        """Count one failed call under ``kind`` (see :func:`error_kind`)."""
        self.errors_by_kind[kind] = self.errors_by_kind.get(kind, 0) + 1

    def pct(self, q: float) -> float:
        """Latency percentile in ms (nan when empty)."""
        return percentile(sorted(self.latencies_ms), q) if self.latencies_ms else math.nan

    def offered(self, duration_s: float) -> float:
        """Calls/s sent over the window."""
        return self.sent / duration_s

    def achieved(self, duration_s: float) -> float:
        """Successful calls/s, over the window or until the last call settled if later."""
        return self.ok / max(self.wall_s, duration_s)


def shortfalls(stats: StreamStats, duration_s: float, p99_limit_ms: float) -> list[str]:
    """Why a stream did not keep up with its offered rate (empty when it did)."""
    reasons: list[str] = [f"{stats.errors} errors"] if stats.errors else []
    if not stats.latencies_ms:
        return [*reasons, "no successful calls"]
    offered, achieved = stats.offered(duration_s), stats.achieved(duration_s)
    if achieved < KEEP_UP_SHARE * offered:
        reasons.append(f"achieved {achieved:.1f}/s < {KEEP_UP_SHARE:.0%} of offered {offered:.1f}/s")
    if stats.wall_s > duration_s + p99_limit_ms / 1000.0 + 0.5:
        reasons.append(f"backlog drained {stats.wall_s - duration_s:.2f} s after the window")
    if (p99 := stats.pct(99)) > p99_limit_ms:
        reasons.append(f"p99 {p99:.1f} ms > limit {p99_limit_ms:g} ms")
    return reasons


@dataclass(frozen=True)
class AddedLatency:
    """The gateway's added latency, P50 and P99 (docs/live-gateway.md), and the raw differences."""

    p50_ms: float
    p99_ms: float
    p50_raw_ms: float
    p99_raw_ms: float


def added_latency(gateway_ms: Sequence[float], direct_ms: Sequence[float]) -> AddedLatency:
    """Added P50 / P99: the upper envelope of the quantile-difference function from the median up,
    floored at 0, so ``p99_ms >= p50_ms >= 0``; nan when either stream has no latencies."""
    if not gateway_ms or not direct_ms:
        return AddedLatency(math.nan, math.nan, math.nan, math.nan)
    g, d = sorted(gateway_ms), sorted(direct_ms)

    def shift(q: float) -> float:
        return percentile(g, q) - percentile(d, q)

    p50 = max(0.0, shift(50))
    return AddedLatency(p50, max([p50, *(shift(q) for q in range(51, 100))]), shift(50), shift(99))


@dataclass(frozen=True)
class SearchResult:
    """What :func:`bracket_search` found: the highest passing rate (None if none passed), every probe."""

    best: float | None
    tried: list[tuple[float, bool]]


def bracket_search(
    passes: Callable[[float], bool],
    start: float,
    *,
    max_steps: int = 10,
    floor: float = SEARCH_FLOOR,
    ceiling: float = SEARCH_CEILING,
    rel_tol: float = SEARCH_REL_TOL,
) -> SearchResult:
    """The highest rate for which ``passes(rate)`` holds, in at most ``max_steps`` probes: from ``start``
    (clamped to [floor, ceiling]) double while every probe passed, halve while every probe failed, then
    bisect until the failing rate is within ``rel_tol`` of the passing one."""
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    if not 0 < floor <= ceiling:
        raise ValueError("need 0 < floor <= ceiling")
    tried: list[tuple[float, bool]] = []
    rate = min(max(start, floor), ceiling)
    while True:
        tried.append((rate, passes(rate)))
        lo = max((r for r, ok in tried if ok), default=None)  # highest passing rate
        hi = min((r for r, ok in tried if not ok), default=None)  # lowest failing rate
        if len(tried) >= max_steps:
            break
        if lo is None:
            assert hi is not None
            if hi <= floor:
                break
            rate = max(hi / 2.0, floor)
        elif hi is None:
            if lo >= ceiling:
                break
            rate = min(lo * 2.0, ceiling)
        elif hi <= lo * (1.0 + rel_tol):
            break
        else:
            rate = (lo + hi) / 2.0
    return SearchResult(best=lo, tried=tried)


@dataclass
class OverheadReport:
    """The measured figures (latencies in ms; ``*_errors`` map a kind, see :func:`error_kind`, to a count;
    ``table``: with ``rates``, one side-by-side row per rate, these fields less the lists; ``worker_cpu_util``:
    the worker's CPU over both streams, as a share of one core)."""

    rate: float
    duration_s: float
    p99_limit_ms: float
    direct_p50_ms: float
    direct_p99_ms: float
    gateway_p50_ms: float
    gateway_p99_ms: float
    added_p50_ms: float
    added_p99_ms: float
    added_p50_raw_ms: float
    added_p99_raw_ms: float
    added_reliable: bool
    direct_shortfalls: list[str]
    gateway_shortfalls: list[str]
    gateway_cpu_ms_per_call: float
    gateway_cpu_util: float
    gateway_calls: int
    direct_calls: int
    gateway_sent: int
    direct_sent: int
    gateway_achieved_rate: float
    direct_achieved_rate: float
    errors: int
    gateway_errors: dict[str, int]
    direct_errors: dict[str, int]
    max_rate: float | None = None
    search: list[dict[str, Any]] = field(default_factory=list)
    endpoint: str = "chat"
    worker: str = "null"
    table: list[dict[str, Any]] = field(default_factory=list)
    worker_cpu_util: float = math.nan


@contextlib.contextmanager
def rig(workdir: Path, *, capacity: int = 1024, worker: str = "null") -> Iterator[tuple[str, str, int, int]]:
    """Start a worker (``WORKERS``) and a gateway in front of it; yield (worker url, gateway url, gateway pid,
    worker pid)."""
    if worker not in WORKERS:
        raise GatewayError(f"unknown worker {worker!r}; one of {', '.join(WORKERS)}")
    wport, gport = free_port(), free_port()
    wurl = f"http://127.0.0.1:{wport}"
    wproc = ChildProcess("the worker", [sys.executable, *WORKERS[worker], "--port", str(wport)], workdir / "worker.log")
    try:
        wproc.wait_until(lambda: probe(wurl, "/health"), "/health")
        # The demo tenants, with a concurrency bound far above what the rates here keep in flight: a stall of
        # the machine would otherwise turn into 429s, which measure admission, not the gateway's cost per call.
        tenants_doc = yaml.safe_load((CONFIG_DIR / "tenants.yaml").read_text())
        for t in tenants_doc["tenants"]:
            t["max_concurrent_workflows"] = RIG_MAX_CONCURRENT
        (workdir / "tenants.yaml").write_text(yaml.safe_dump(tenants_doc))
        cfg = {
            "policy": "hexgen",
            "time_scale": 1e-4,
            "tenants_file": "tenants.yaml",
            "cluster": {"name": "overhead", "workers": [dict(name="w0", gpu="A100", url=wurl, capacity=capacity)]},
            "listen": {"host": "127.0.0.1", "port": gport},
            "tuning": {"enabled": False},
            "limits": {"max_queued_calls": 100_000},
        }
        (workdir / "gateway.yaml").write_text(yaml.safe_dump(cfg))
        with gateway_process(workdir / "gateway.yaml", gport, 1, workdir, "overhead") as (gproc, gurl):
            yield wurl, gurl, gproc.proc.pid, wproc.proc.pid
    finally:
        wproc.stop()


async def _stream(
    session: aiohttp.ClientSession, url: str, rate: float, duration_s: float, seed: int, stats: StreamStats, body: bytes
) -> None:
    """Poisson arrivals at ``rate`` for ``duration_s``, each call a task of its own; results into ``stats``."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    tasks: set[asyncio.Task[None]] = set()
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}

    async def one() -> None:
        t = time.perf_counter()
        kind: str | None = None
        try:
            async with session.post(url, data=body, headers=headers) as r:
                await r.read()
                kind = None if r.status == 200 else error_kind(status=r.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            kind = error_kind(exc=exc)
        if kind is None:
            stats.ok += 1
            stats.latencies_ms.append((time.perf_counter() - t) * 1000.0)
        else:
            stats.record_error(kind)

    next_t = rng.expovariate(rate)
    while next_t < duration_s:
        if (delay := t0 + next_t - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        stats.sent += 1
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        next_t += rng.expovariate(rate)
    if tasks:
        await asyncio.gather(*tasks)
    stats.wall_s = time.perf_counter() - t0


@dataclass(frozen=True)
class Measurement:
    """One side-by-side run: both streams, and the gateway's (and the worker's) CPU seconds over the wall
    seconds measured."""

    gateway: StreamStats
    direct: StreamStats
    cpu_s: float
    wall_s: float
    worker_cpu_s: float = math.nan  # NaN: not measured

    @property
    def cpu_ms_per_call(self) -> float:
        """Gateway CPU milliseconds per successful gateway call."""
        return 1000.0 * self.cpu_s / max(self.gateway.ok, 1)

    @property
    def cpu_util(self) -> float:
        """Gateway CPU over the measurement, as a share of one core (1.0 = one core busy)."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def worker_cpu_util(self) -> float:
        """The worker's CPU over the measurement, as a share of one core (NaN: not measured)."""
        return self.worker_cpu_s / self.wall_s if self.wall_s > 0 else math.nan


async def measure(
    worker: str,
    gateway: str,
    gw_pid: int,
    rate: float,
    duration_s: float,
    *,
    direct: bool = True,
    seed: int = 0,
    endpoint: str = "chat",
    worker_pid: int | None = None,
) -> Measurement:
    """Run the gateway stream (and the direct stream) to ``endpoint`` (``ENDPOINTS``) for ``duration_s``
    (with ``worker_pid``, the worker process's CPU time too). aiohttp, cheaper per request than httpx, keeps
    the load generator from being the bottleneck of the rate search."""
    path, body = ENDPOINTS[endpoint]
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30.0)) as session:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        for _ in range(20):  # warm both paths (connections, first-call imports)
            for url, headers in ((gateway, auth), (worker, None)):
                async with session.post(url + path, json=body, headers=headers) as r:
                    await r.read()
        gs, ds = StreamStats(), StreamStats()
        wcpu0 = process_cpu_s(worker_pid) if worker_pid is not None else math.nan
        cpu0, t0 = process_cpu_s(gw_pid), time.perf_counter()
        payload = json.dumps(body).encode()
        jobs = [_stream(session, gateway + path, rate, duration_s, seed, gs, payload)]
        if direct:
            jobs.append(_stream(session, worker + path, rate, duration_s, seed + 1, ds, payload))
        await asyncio.gather(*jobs)
        cpu, wall = process_cpu_s(gw_pid) - cpu0, time.perf_counter() - t0
        wcpu = process_cpu_s(worker_pid) - wcpu0 if worker_pid is not None else math.nan
    return Measurement(gateway=gs, direct=ds, cpu_s=cpu, wall_s=wall, worker_cpu_s=wcpu)


def build_report(m: Measurement, rate: float, duration_s: float, p99_limit_ms: float) -> OverheadReport:
    """The side-by-side figures of one measurement (no rate search)."""
    streams = {"gateway": m.gateway, "direct": m.direct}
    per: dict[str, Any] = {}
    for name, s in streams.items():
        per |= {f"{name}_p50_ms": s.pct(50), f"{name}_p99_ms": s.pct(99), f"{name}_calls": s.ok}
        per |= {f"{name}_sent": s.sent, f"{name}_achieved_rate": s.achieved(duration_s)}
        per |= {
            f"{name}_errors": merge_errors(s.errors_by_kind),
            f"{name}_shortfalls": shortfalls(s, duration_s, p99_limit_ms),
        }
    added = added_latency(m.gateway.latencies_ms, m.direct.latencies_ms)
    per |= {f"added_{k}": v for k, v in asdict(added).items()}
    return OverheadReport(
        rate=rate,
        duration_s=duration_s,
        p99_limit_ms=p99_limit_ms,
        added_reliable=not per["direct_shortfalls"] and not math.isnan(added.p50_ms),
        gateway_cpu_ms_per_call=m.cpu_ms_per_call,
        gateway_cpu_util=m.cpu_util,
        worker_cpu_util=m.worker_cpu_util,
        errors=m.gateway.errors + m.direct.errors,
        **per,
    )


def run_overhead(
    rate: float = 200.0,
    duration_s: float = 10.0,
    *,
    max_rate_search: bool = False,
    p99_limit_ms: float = 20.0,
    search_steps: int = 10,
    seed: int = 0,
    endpoint: str = "chat",
    worker: str = "null",
    rates: Sequence[float] = (),
    progress: Callable[[str], None] | None = None,
) -> OverheadReport:
    """Start the rig, measure side by side at ``rate`` (and at each of ``rates``, into ``table``), optionally
    search the highest sustained rate. ``progress`` is told what is being measured, step by step."""
    if not rate > 0 or not duration_s > 0 or not p99_limit_ms > 0 or not all(r > 0 for r in rates):
        raise GatewayError("rates, duration and the P99 limit must be positive")
    if search_steps < 1:
        raise GatewayError("search_steps must be at least 1")
    if endpoint not in ENDPOINTS:
        raise GatewayError(f"unknown endpoint {endpoint!r}; one of {', '.join(ENDPOINTS)}")
    say = progress or (lambda _msg: None)
    with bench_folder(None, "hexflow-overhead-") as tmp, rig(tmp, worker=worker) as (wurl, gateway, pid, wpid):

        def side_by_side(r: float) -> OverheadReport:
            say(f"side by side at {r:g} calls/s for {duration_s:g} s")
            m = asyncio.run(measure(wurl, gateway, pid, r, duration_s, seed=seed, endpoint=endpoint, worker_pid=wpid))
            return build_report(m, r, duration_s, p99_limit_ms)

        report = side_by_side(rate)
        report.endpoint, report.worker = endpoint, worker
        report.table = [
            {k: v for k, v in asdict(row).items() if k not in ("search", "table")} for row in map(side_by_side, rates)
        ]
        if max_rate_search:
            span = min(duration_s, 6.0)

            def passes(r: float) -> bool:
                say(f"rate search: {r:.0f} calls/s for {span:g} s")
                m = asyncio.run(measure(wurl, gateway, pid, r, span, direct=False, seed=seed, endpoint=endpoint))
                g, reasons = m.gateway, shortfalls(m.gateway, span, p99_limit_ms)
                row = dict(rate=r, ok=not reasons, reasons=reasons, offered=g.offered(span), achieved=g.achieved(span))
                row |= dict(p99_ms=g.pct(99), cpu_ms_per_call=m.cpu_ms_per_call, cpu_util=m.cpu_util)
                report.search.append({**row, "errors": merge_errors(g.errors_by_kind)})
                return not reasons

            report.max_rate = bracket_search(passes, rate, max_steps=search_steps).best
    return report


def _errors_text(errors: dict[str, int]) -> str:
    return ", ".join(f"{k} x{n}" for k, n in errors.items()) if errors else "none"


def format_report(rep: OverheadReport) -> str:
    """A short human-readable summary."""
    d = asdict(rep)
    lines = [
        f"{rep.endpoint} through the gateway and directly to a {rep.worker} worker, "
        f"side by side at {rep.rate:g} calls/s each for {rep.duration_s:g} s "
        f"({rep.gateway_calls} via gateway, {rep.direct_calls} direct, {rep.errors} errors)",
        *(
            f"  {label}: p50 {d[f'{s}_p50_ms']:6.2f} ms   p99 {d[f'{s}_p99_ms']:6.2f} ms   achieved "
            f"{d[f'{s}_achieved_rate']:.1f}/s of {d[f'{s}_sent'] / rep.duration_s:.1f}/s   "
            f"errors: {_errors_text(d[f'{s}_errors'])}"
            for s, label in (("direct", "direct "), ("gateway", "gateway"))
        ),
        f"  added  : p50 {rep.added_p50_ms:6.2f} ms   p99 {rep.added_p99_ms:6.2f} ms   "
        f"(raw differences of percentiles: p50 {rep.added_p50_raw_ms:.2f}, p99 {rep.added_p99_raw_ms:.2f})",
    ]
    if not rep.added_reliable:
        why = "; ".join(rep.direct_shortfalls) or "no latencies to compare"
        lines.append(f"  added latency UNRELIABLE: the direct stream did not keep up ({why})")
    if rep.gateway_shortfalls:
        lines.append(f"  the gateway stream did not keep up: {'; '.join(rep.gateway_shortfalls)}")
    lines.append(
        f"  gateway CPU: {rep.gateway_cpu_ms_per_call:.2f} ms per call, "
        f"{rep.gateway_cpu_util:.0%} of one core over the measurement"
    )
    if not math.isnan(rep.worker_cpu_util):
        lines.append(f"  worker CPU: {rep.worker_cpu_util:.0%} of one core (both streams)")
    if rep.table:
        lines.append(
            "  calls/s | direct p50   p99 | gateway p50   p99 | added p50   p99 | CPU ms/call  core | worker | errors"
        )
        for row in [d, *rep.table]:
            mark = "" if row["added_reliable"] else "  (added unreliable: the direct stream fell behind)"
            errs = merge_errors(row["gateway_errors"], row["direct_errors"])
            lines.append(
                f"  {row['rate']:7.0f} | {row['direct_p50_ms']:10.2f} {row['direct_p99_ms']:5.2f} | "
                f"{row['gateway_p50_ms']:11.2f} {row['gateway_p99_ms']:5.2f} | "
                f"{row['added_p50_ms']:9.2f} {row['added_p99_ms']:5.2f} | "
                f"{row['gateway_cpu_ms_per_call']:11.3f} {row['gateway_cpu_util']:4.0%} | "
                f"{row['worker_cpu_util']:6.0%} | {_errors_text(errs)}{mark}"
            )
    for row in rep.search:
        lines.append(
            f"  rate {row['rate']:7.1f}/s {'pass' if row['ok'] else 'FAIL'}: offered {row['offered']:7.1f}/s  "
            f"achieved {row['achieved']:7.1f}/s  p99 {row['p99_ms']:7.2f} ms  "
            f"CPU {row['cpu_ms_per_call']:.2f} ms/call, {row['cpu_util']:.0%} of a core"
            + (f"  ({'; '.join(row['reasons'])})" if row["reasons"] else "")
        )
    if rep.search:
        best = f"{rep.max_rate:.1f} calls/s" if rep.max_rate is not None else "none (every rate tried failed)"
        lines.append(f"  highest sustained rate: {best} ({len(rep.search)} rates tried)")
    return "\n".join(lines)


def write_json(rep: OverheadReport, path: Path) -> None:
    """Write the report as JSON (NaN, for a stream with no successful call, is written as null)."""
    save_json(path, json_safe(asdict(rep)), end="")
