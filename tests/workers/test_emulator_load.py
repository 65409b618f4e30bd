"""One emulator process serves 256 concurrent streaming requests, every one to the end, none lost (the load:
many concurrent streaming chat requests, each read to its ``[DONE]``, then the worker's ``/metrics``); and the
same load in virtual time streams every request's tokens as they are produced, in several chunks.

The machine-dependent figures of the process's load (chunks per stream, event-loop lag, model CPU per
iteration) are printed here; no test bounds them, since a busy machine moves them: a stream is sent the tokens
produced since its last wake-up every 100 ms of wall clock, so its chunks count the wake-ups its loop managed
in the stream's life (on a loaded 2-core machine a stall of the loop merged them down to 2).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.emulator_process import emulator_process
from tests.fakes import virtual_time_loop
from tests.workers.conftest import a100
from workers.emulator import EmulatorConfig, create_app

MODEL = "llama-3.1-70b"


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


async def run_load(
    url: str,
    *,
    streams: int = 256,
    max_tokens: int = 200,
    prompt_words: int = 300,
    transport: httpx.AsyncBaseTransport | None = None,
) -> LoadReport:
    """Send ``streams`` streaming chat requests at once to the worker at ``url`` (through ``transport``, an app
    in process, where given); read its metrics after."""
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
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120.0, transport=transport) as client:
        report.streams = list(await asyncio.gather(*(_one(client, body) for _ in range(streams))))
    report.wall_s = time.monotonic() - t0
    # A fresh connection: pooled ones may have passed the server's keep-alive timeout.
    async with httpx.AsyncClient(base_url=url, timeout=10.0, transport=transport) as client:
        text = (await client.get("/metrics")).text
    for attr, name in _METRICS:
        setattr(report, attr, _metric(text, name))
    return report


_METRICS = (
    ("requests_succeeded", "vllm:request_success_total"),
    ("generation_tokens", "vllm:generation_tokens_total"),
    ("model_iterations", "hexflow_emulator_model_iterations"),
    ("model_cpu_s", "hexflow_emulator_model_cpu_seconds"),
    ("lag_p99_s", "hexflow_emulator_event_loop_lag_p99_seconds"),
    ("lag_max_s", "hexflow_emulator_event_loop_lag_max_seconds"),
)


def format_report(rep: LoadReport) -> str:
    """The load's outcome and the machine-dependent figures, two lines."""
    per_iter_us = rep.model_cpu_s / rep.model_iterations * 1e6 if rep.model_iterations else float("nan")
    chunks = sorted(s.chunks for s in rep.streams) or [0]
    return "\n".join(
        [
            f"{len(rep.streams)} concurrent streams of {rep.max_tokens} tokens: {rep.complete} complete, "
            f"{rep.requests_succeeded:.0f} requests and {rep.generation_tokens:.0f} tokens counted by the worker, "
            f"{rep.wall_s:.1f} s wall; content chunks per stream min {chunks[0]}, median {chunks[len(chunks) // 2]}",
            f"event-loop lag p99 {rep.lag_p99_s * 1e3:.2f} ms, max {rep.lag_max_s * 1e3:.2f} ms; "
            f"model CPU per iteration {per_iter_us:.1f} us over {rep.model_iterations:.0f} iterations",
        ]
    )


STREAMS = 256
MAX_TOKENS = 200


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[str]:
    args = ["--gpu", "A100", "--model", MODEL, "--time-scale", "0.05", "--max-num-seqs", str(STREAMS)]
    with emulator_process(args, tmp_path / "emulator.log") as url:
        yield url


def test_256_concurrent_streams_all_complete_and_none_is_lost(emulator: str) -> None:
    rep = asyncio.run(run_load(emulator, streams=STREAMS, max_tokens=MAX_TOKENS))
    assert [s.status for s in rep.streams] == [200] * STREAMS
    assert all(s.done for s in rep.streams), "a stream ended without data: [DONE]"
    assert [s.completion_tokens for s in rep.streams] == [MAX_TOKENS] * STREAMS
    assert rep.complete == STREAMS
    # The worker counted every request and token it served, and batched them over many engine iterations.
    assert rep.requests_succeeded == STREAMS
    assert rep.generation_tokens == STREAMS * MAX_TOKENS
    assert rep.model_iterations > 200
    print("\n" + format_report(rep))


def test_in_virtual_time_every_stream_gets_its_tokens_in_several_chunks_as_they_are_produced() -> None:
    """The same load in process on a virtual clock (``tests.fakes.virtual_time_loop``): the worker's wake-ups
    keep their model times however busy the machine, so the chunks a stream gets depend on the worker alone."""

    async def load() -> LoadReport:
        clock = asyncio.get_running_loop().time
        profile = a100(max_num_seqs=STREAMS)
        app = create_app(EmulatorConfig(profile=profile, served_model_name=MODEL, time_scale=0.05, clock=clock))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            return await run_load("http://emulator", streams=STREAMS, max_tokens=MAX_TOKENS, transport=transport)

    with asyncio.Runner(loop_factory=virtual_time_loop) as runner:
        rep = runner.run(load())
    assert rep.complete == STREAMS and rep.generation_tokens == STREAMS * MAX_TOKENS
    # Tokens arrive as they are produced, in several chunks, not in one piece at the end.
    assert all(s.chunks >= 4 for s in rep.streams)
