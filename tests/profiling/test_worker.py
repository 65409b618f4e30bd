"""``send_arrivals``: the timed stream of requests the open-loop and interleaved checks send to one worker."""

from __future__ import annotations

import asyncio
import json
import math
import time

import httpx

from gateway.profiling.worker import ProbeWorker, send_arrivals


def _worker(delay_s: float, fail_prompt: int | None = None) -> httpx.AsyncClient:
    """A client whose worker answers every completion after ``delay_s`` (HTTP 500 for a prompt of
    ``fail_prompt`` tokens)."""

    async def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        await asyncio.sleep(delay_s)
        n = len(body["prompt"])
        if n == fail_prompt:
            return httpx.Response(500)
        usage = {"prompt_tokens": n, "completion_tokens": body["max_tokens"], "total_tokens": n + body["max_tokens"]}
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": usage})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


async def test_latency_counts_from_the_arrival_and_a_full_client_makes_later_arrivals_wait() -> None:
    done: list[int] = []
    async with _worker(0.05) as client:
        run = await send_arrivals(
            ProbeWorker(client, "http://w", "m"),
            [(0.0, 8, 2), (0.0, 8, 2), (0.2, 8, 2)],
            max_inflight=1,
            deadline=time.monotonic() + 5.0,
            clock=time.monotonic,
            on_done=lambda: done.append(1),
        )
    assert run.complete and len(done) == 3
    assert run.client_waits == 1  # the second arrival found the one slot taken
    first, second, third = run.latencies
    assert first >= 0.045 and third >= 0.045
    assert second >= 0.095 and second > first  # its wait for the slot is in its latency


async def test_a_failed_request_and_one_past_the_deadline_read_nan() -> None:
    async with _worker(0.05, fail_prompt=9) as client:
        run = await send_arrivals(
            ProbeWorker(client, "http://w", "m"),
            [(0.0, 8, 1), (0.0, 9, 1), (0.3, 8, 1)],
            max_inflight=4,
            deadline=time.monotonic() + 0.2,
            clock=time.monotonic,
        )
    ok, failed, late = run.latencies
    assert math.isfinite(ok) and math.isnan(failed) and math.isnan(late)
    assert not run.complete
