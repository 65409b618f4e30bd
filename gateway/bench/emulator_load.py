"""Load on one emulated worker: many concurrent streaming chat requests against one emulator process.

    python -m gateway.bench.emulator_load [--streams 256] [--max-tokens 200] [--time-scale 0.05] [--json OUT]

It starts ``python -m workers.emulator`` (an A100 profile, ``--max-num-seqs`` = the number of streams) on a
free loopback port, sends every stream at once (``stream_options.include_usage``), reads each to its
``[DONE]``, then reads the worker's ``/metrics``. Reported: whether every stream completed with the tokens
it asked for, and the figures that depend on the machine: the worker's event-loop lag (P99 and max over
its recent samples) and the model's CPU time per engine iteration. ``tests/workers/test_emulator_load.py``
runs the same load and asserts only the behaviour; the timing figures are this command's to print.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gateway.bench.procs import ChildProcess, StartError, free_port, probe

__all__ = ["LoadReport", "StreamResult", "format_report", "main", "run_load"]

MODEL = "llama-3.1-70b"
START_TIMEOUT_S = 30.0


@dataclass
class StreamResult:
    """One streamed request as the client saw it."""

    status: int
    chunks: int = 0
    """Server-sent events with content."""
    completion_tokens: int | None = None
    """From the final usage event."""
    done: bool = False
    """The stream ended with ``data: [DONE]``."""


@dataclass
class LoadReport:
    """Every stream's outcome, and the worker's own counters and event-loop lag after the load."""

    max_tokens: int
    streams: list[StreamResult] = field(default_factory=list)
    requests_succeeded: float = 0.0
    generation_tokens: float = 0.0
    model_iterations: float = 0.0
    model_cpu_s: float = 0.0
    lag_p99_s: float = 0.0
    lag_max_s: float = 0.0
    wall_s: float = 0.0

    @property
    def complete(self) -> int:
        """Streams answered 200 that ended with ``[DONE]`` after exactly ``max_tokens`` tokens."""
        return sum(s.status == 200 and s.done and s.completion_tokens == self.max_tokens for s in self.streams)


def _metric(text: str, name: str) -> float:
    """The sum of a metric's samples (all label sets) in Prometheus text format; 0 when absent."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.M)
    return sum(float(m.group(1)) for m in pattern.finditer(text))


async def _one(client: httpx.AsyncClient, body: dict[str, Any]) -> StreamResult:
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        res = StreamResult(status=r.status_code)
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                res.done = True
                continue
            event = json.loads(data)
            if event.get("usage"):
                res.completion_tokens = int(event["usage"]["completion_tokens"])
            if any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
                res.chunks += 1
        return res


async def run_load(url: str, *, streams: int = 256, max_tokens: int = 200, prompt_words: int = 300) -> LoadReport:
    """Send ``streams`` streaming chat requests at once to the worker at ``url``; read its metrics after."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "w " * prompt_words}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    report = LoadReport(max_tokens=max_tokens)
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=streams + 44, max_keepalive_connections=streams + 44)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120.0) as client:
        report.streams = list(await asyncio.gather(*(_one(client, body) for _ in range(streams))))
    report.wall_s = time.monotonic() - t0
    # A fresh connection: pooled ones may have passed the server's keep-alive timeout.
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        text = (await client.get("/metrics")).text
    report.requests_succeeded = _metric(text, "vllm:request_success_total")
    report.generation_tokens = _metric(text, "vllm:generation_tokens_total")
    report.model_iterations = _metric(text, "hexflow_emulator_model_iterations")
    report.model_cpu_s = _metric(text, "hexflow_emulator_model_cpu_seconds")
    report.lag_p99_s = _metric(text, "hexflow_emulator_event_loop_lag_p99_seconds")
    report.lag_max_s = _metric(text, "hexflow_emulator_event_loop_lag_max_seconds")
    return report


def format_report(rep: LoadReport) -> str:
    """What ``python -m gateway.bench.emulator_load`` prints."""
    per_iter_us = rep.model_cpu_s / rep.model_iterations * 1e6 if rep.model_iterations else float("nan")
    return "\n".join(
        [
            f"{len(rep.streams)} concurrent streams of {rep.max_tokens} tokens: {rep.complete} complete, "
            f"{rep.requests_succeeded:.0f} requests and {rep.generation_tokens:.0f} tokens counted by the worker, "
            f"{rep.wall_s:.1f} s wall",
            f"event-loop lag p99 {rep.lag_p99_s * 1e3:.2f} ms, max {rep.lag_max_s * 1e3:.2f} ms; "
            f"model CPU per iteration {per_iter_us:.1f} us over {rep.model_iterations:.0f} iterations",
        ]
    )


def _start(log_dir: Path, streams: int, time_scale: float) -> tuple[ChildProcess, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "workers.emulator", "--gpu", "A100", "--model", MODEL, "--port", str(port)]
    cmd += ["--time-scale", repr(time_scale), "--max-num-seqs", str(streams)]
    proc = ChildProcess("the emulated worker", cmd, log_dir / "emulator.log")
    url = f"http://127.0.0.1:{port}"
    proc.wait_until(lambda: probe(url, "/health"), "/health", START_TIMEOUT_S)
    return proc, url


def main(argv: Sequence[str] | None = None) -> int:
    """Start an emulated worker, run the load, print the report (exit 1 unless every stream completed)."""
    parser = argparse.ArgumentParser(prog="python -m gateway.bench.emulator_load", description=__doc__)
    parser.add_argument("--streams", type=int, default=256, help="concurrent streaming requests")
    parser.add_argument("--max-tokens", type=int, default=200, help="tokens per request")
    parser.add_argument("--time-scale", type=float, default=0.05, help="the worker's --time-scale")
    parser.add_argument("--json", default=None, help="write the report as JSON here")
    args = parser.parse_args(argv)
    if args.streams < 1 or args.max_tokens < 1 or not args.time_scale > 0:
        parser.error("--streams, --max-tokens and --time-scale must be positive")
    with tempfile.TemporaryDirectory(prefix="hexflow-emulator-load-") as tmp:
        try:
            proc, url = _start(Path(tmp), args.streams, args.time_scale)
        except StartError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        try:
            report = asyncio.run(run_load(url, streams=args.streams, max_tokens=args.max_tokens))
        finally:
            proc.stop()
    print(format_report(report))
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**asdict(report), "complete": report.complete}, indent=2) + "\n")
    return 0 if report.complete == len(report.streams) else 1


if __name__ == "__main__":
    sys.exit(main())
