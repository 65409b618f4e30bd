"""Gateway overhead, measured side by side: the same chat call sent to a worker directly and through the gateway.

    hexflow overhead [--rate 200] [--duration 10] [--max-rate-search] [--json OUT]

Setup (all on this machine): one emulated worker (an A100 profile at a time scale so small that a call's
modelled time is negligible, so what is measured is HTTP and software, not the model), and one gateway
process (``hexflow serve``, policy hexgen, capacity high enough that calls never wait in the gateway's
queue: this measures the gateway's per-call cost, not scheduling delay). A Poisson stream of calls at
``rate`` per second goes through the gateway's ``/v1/chat/completions``, and an independent Poisson stream
at the same rate goes to the worker's ``/v1/chat/completions`` directly, interleaved in one run, so both
see the same machine load. Reported:

* added latency per call: gateway P50 / P99 minus direct P50 / P99 (milliseconds);
* the gateway process's CPU time per call (from ``/proc/<pid>/stat``, utime + stime);
* with ``--max-rate-search``, the highest rate (gateway stream only) at which the gateway keeps up:
  achieved >= 97% of offered and P99 latency below ``--p99-limit-ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import yaml

from gateway.bench.procs import free_port
from gateway.bench.stats import percentile
from gateway.errors import GatewayError

API_KEY = "demo-interactive-key"
BODY = {
    "messages": [{"role": "user", "content": "How many heads of the departments are older than 56 ?"}],
    "max_tokens": 4,
}


@dataclass
class StreamStats:
    """Latencies of one stream of calls."""

    sent: int = 0
    ok: int = 0
    errors: int = 0
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)

    def pct(self, q: float) -> float:
        """Latency percentile in ms (nan when empty)."""
        return percentile(sorted(self.latencies_ms), q) if self.latencies_ms else float("nan")


@dataclass
class OverheadReport:
    """The measured figures."""

    rate: float
    duration_s: float
    direct_p50_ms: float
    direct_p99_ms: float
    gateway_p50_ms: float
    gateway_p99_ms: float
    added_p50_ms: float
    added_p99_ms: float
    gateway_cpu_ms_per_call: float
    gateway_calls: int
    direct_calls: int
    errors: int
    max_rate: float | None = None
    search: list[dict[str, float]] = field(default_factory=list)


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, seconds (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _wait_ready(url: str, path: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + path, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise GatewayError(f"{url} did not become ready; log tail:\n{tail}")
        time.sleep(0.1)


@contextlib.contextmanager
def rig(workdir: Path, *, capacity: int = 1024) -> Iterator[tuple[str, str, int]]:
    """Start an emulated worker and a gateway in front of it; yield (worker url, gateway url, gateway pid)."""
    wport, gport = free_port(), free_port()
    wlog, glog = workdir / "worker.log", workdir / "gateway.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with wlog.open("wb") as wl:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "workers.emulator",
                        "--gpu",
                        "A100",
                        "--port",
                        str(wport),
                        "--time-scale",
                        "1e-4",
                    ],
                    stdout=wl,
                    stderr=subprocess.STDOUT,
                )
            )
        worker = f"http://127.0.0.1:{wport}"
        _wait_ready(worker, "/health", procs[0], wlog)
        from gateway.config import CONFIG_DIR

        tenants = workdir / "tenants.yaml"
        tenants.write_text((CONFIG_DIR / "tenants.yaml").read_text())
        cfg = {
            "policy": "hexgen",
            "time_scale": 1e-4,
            "tenants_file": "tenants.yaml",
            "cluster": {
                "name": "overhead",
                "workers": [{"name": "w0", "gpu": "A100", "url": worker, "capacity": capacity}],
            },
            "listen": {"host": "127.0.0.1", "port": gport},
            "tuning": {"enabled": False},
            "limits": {"max_queued_calls": 100_000},
        }
        (workdir / "gateway.yaml").write_text(yaml.safe_dump(cfg))
        with glog.open("wb") as gl:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "gateway.cli",
                        "serve",
                        "--config",
                        str(workdir / "gateway.yaml"),
                        "--log-level",
                        "warning",
                    ],
                    stdout=gl,
                    stderr=subprocess.STDOUT,
                )
            )
        gateway = f"http://127.0.0.1:{gport}"
        _wait_ready(gateway, "/readyz", procs[1], glog)
        yield worker, gateway, procs[1].pid
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


async def _stream(
    session: aiohttp.ClientSession, url: str, rate: float, duration_s: float, seed: int, stats: StreamStats
) -> None:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    tasks: set[asyncio.Task[None]] = set()
    headers = {"Authorization": f"Bearer {API_KEY}"}
    payload = json.dumps(BODY).encode()
    headers["Content-Type"] = "application/json"

    async def one() -> None:
        t = time.perf_counter()
        try:
            async with session.post(url, data=payload, headers=headers) as r:
                await r.read()
                ok = r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        if ok:
            stats.ok += 1
            stats.latencies_ms.append((time.perf_counter() - t) * 1000.0)
        else:
            stats.errors += 1

    next_t = rng.expovariate(rate)
    while next_t < duration_s:
        delay = t0 + next_t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        stats.sent += 1
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        next_t += rng.expovariate(rate)
    if tasks:
        await asyncio.gather(*tasks)
    stats.wall_s = time.perf_counter() - t0


async def measure(
    worker: str, gateway: str, gw_pid: int, rate: float, duration_s: float, *, direct: bool = True, seed: int = 0
) -> tuple[StreamStats, StreamStats, float]:
    """Run the gateway stream (and the direct stream) for ``duration_s``; returns stats and gateway CPU s.

    The load generator uses aiohttp (cheaper per request than httpx), so it is not the bottleneck
    when searching the gateway's highest sustained rate.
    """
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30.0)) as session:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        for _ in range(20):  # warm both paths (connections, first-call imports)
            async with session.post(gateway + "/v1/chat/completions", json=BODY, headers=auth) as r:
                await r.read()
            async with session.post(worker + "/v1/chat/completions", json=BODY) as r:
                await r.read()
        gs, ds = StreamStats(), StreamStats()
        cpu0 = _cpu_seconds(gw_pid)
        jobs = [_stream(session, gateway + "/v1/chat/completions", rate, duration_s, seed, gs)]
        if direct:
            jobs.append(_stream(session, worker + "/v1/chat/completions", rate, duration_s, seed + 1, ds))
        await asyncio.gather(*jobs)
        cpu = _cpu_seconds(gw_pid) - cpu0
    return gs, ds, cpu


def run_overhead(
    rate: float = 200.0,
    duration_s: float = 10.0,
    *,
    max_rate_search: bool = False,
    p99_limit_ms: float = 20.0,
    seed: int = 0,
) -> OverheadReport:
    """Start the rig, measure side by side, optionally search the highest sustained rate."""
    if not rate > 0 or not duration_s > 0:
        raise GatewayError("rate and duration must be positive")
    with tempfile.TemporaryDirectory(prefix="hexflow-overhead-") as tmp, rig(Path(tmp)) as (worker, gateway, pid):
        gs, ds, cpu = asyncio.run(measure(worker, gateway, pid, rate, duration_s, seed=seed))
        report = OverheadReport(
            rate=rate,
            duration_s=duration_s,
            direct_p50_ms=ds.pct(50),
            direct_p99_ms=ds.pct(99),
            gateway_p50_ms=gs.pct(50),
            gateway_p99_ms=gs.pct(99),
            added_p50_ms=gs.pct(50) - ds.pct(50),
            added_p99_ms=gs.pct(99) - ds.pct(99),
            gateway_cpu_ms_per_call=1000.0 * cpu / max(gs.ok, 1),
            gateway_calls=gs.ok,
            direct_calls=ds.ok,
            errors=gs.errors + ds.errors,
        )
        if max_rate_search:
            r = rate
            best: float | None = None
            span = min(duration_s, 6.0)
            while r <= 5000:
                g, _, c = asyncio.run(measure(worker, gateway, pid, r, span, direct=False, seed=seed))
                row = {
                    "rate": r,
                    "offered": g.sent / span,
                    "achieved": g.ok / max(g.wall_s, span),
                    "p99_ms": g.pct(99),
                    "cpu_ms_per_call": 1000.0 * c / max(g.ok, 1),
                }
                report.search.append(row)
                # Kept up: no errors, the backlog drained right after the window, P99 under the limit.
                if g.errors or g.wall_s > span + p99_limit_ms / 1000.0 + 0.5 or g.pct(99) > p99_limit_ms:
                    break
                best = r
                r *= 1.5
            report.max_rate = best
    return report


def format_report(rep: OverheadReport) -> str:
    """A short human-readable summary."""
    lines = [
        f"side by side at {rep.rate:g} calls/s each for {rep.duration_s:g} s "
        f"({rep.gateway_calls} via gateway, {rep.direct_calls} direct, {rep.errors} errors)",
        f"  direct : p50 {rep.direct_p50_ms:6.2f} ms   p99 {rep.direct_p99_ms:6.2f} ms",
        f"  gateway: p50 {rep.gateway_p50_ms:6.2f} ms   p99 {rep.gateway_p99_ms:6.2f} ms",
        f"  added  : p50 {rep.added_p50_ms:6.2f} ms   p99 {rep.added_p99_ms:6.2f} ms",
        f"  gateway CPU per call: {rep.gateway_cpu_ms_per_call:.2f} ms",
    ]
    for row in rep.search:
        lines.append(
            f"  offered {row['offered']:7.1f}/s: achieved {row['achieved']:7.1f}/s  p99 {row['p99_ms']:7.2f} ms  "
            f"CPU {row['cpu_ms_per_call']:.2f} ms/call"
        )
    if rep.search:
        lines.append(
            f"  highest sustained rate: {rep.max_rate if rep.max_rate is not None else 'below the start rate'}"
        )
    return "\n".join(lines)


def write_json(rep: OverheadReport, path: Path) -> None:
    """Write the report as JSON."""
    data: dict[str, Any] = asdict(rep)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
