"""The HTTP side of probing a live OpenAI-compatible worker: one request of exactly the asked token counts, one
``/metrics`` read, back-off while others' requests queue, and a timed stream of requests (``send_arrivals``).

Prompts are token ids from a salted per-request seed, so no two requests share a prefix (the prefix cache
would make repeats look fast); ``min_tokens = max_tokens`` with ``ignore_eos`` fixes the output length; the
worker's own ``usage`` counts are returned."""

from __future__ import annotations

import asyncio
import math
import random
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from gateway.profiling.plan import CalibrationError, Probe
from gateway.profiling.promparse import MetricsParseError, WorkerMetrics, parse_worker_metrics

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
TOKEN_ID_RANGE = (100, 1100)
"""Prompt token ids are drawn from here: ordinary vocabulary entries of any current LLM tokenizer and of
small ones (the tiny CPU test model has 3072); the range of the gateway's synthetic prompts
(``gateway.live.routers.workflows.SYNTHETIC_VOCAB``)."""

Arrival = tuple[float, int, int]
"""One request of a timed stream: (offset from the stream's start in seconds, prompt tokens, output tokens)."""


class ProbeWorker:
    """The HTTP side of a calibration: one completion request, one ``/metrics`` read (None when there are none)."""

    def __init__(self, client: httpx.AsyncClient, url: str, model: str) -> None:
        self.client = client
        self.url = url.rstrip("/")
        self.model = model
        self.salt = secrets.token_hex(8)
        """Salts every prompt of this calibration: a second calibration of the same worker must not hit the
        blocks the first one left in its prefix cache."""

    async def load(self) -> WorkerMetrics | None:
        """The worker's ``/metrics`` now (None when it has none or does not answer)."""
        try:
            r = await self.client.get(f"{self.url}/metrics", timeout=5.0)
            if r.status_code != 200:
                return None
            return parse_worker_metrics(r.text)
        except (httpx.HTTPError, MetricsParseError):
            return None

    async def load_when_quiet(
        self,
        deadline: float,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        on_wait: Callable[[float, float], None] | None = None,
    ) -> WorkerMetrics | None:
        """The worker's load once none of others' requests wait on it: while some do, back off (1 s,
        doubling up to 30 s; ``on_wait(waiting, seconds)`` before each wait) until ``deadline``, when the
        last read, still showing waiting requests, is returned. None when the worker has no metrics."""
        delay = BACKOFF_FIRST_S
        load = await self.load()
        while load is not None and load.queued > 0:
            wait = min(delay, deadline - clock())
            if wait <= 0:
                break
            if on_wait is not None:
                on_wait(load.queued, wait)
            await sleep(wait)
            delay = min(delay * 2, BACKOFF_MAX_S)
            load = await self.load()
        return load

    async def complete(
        self, probe: Probe, clock: Callable[[], float], timeout_s: float, member: int = 0
    ) -> tuple[float, int, int]:
        """(latency, prompt tokens, completion tokens) of request ``member`` of ``probe``. Each request of a
        batch has its own prompt: identical prompts would hit the prefix cache once the first one's blocks
        are computed, and the batch would measure the cache instead of the batch."""
        rng = random.Random(f"{self.salt}/{probe.seed}/{member}")
        ids = [rng.randrange(*TOKEN_ID_RANGE) for _ in range(probe.prompt)]
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": probe.output,
            "min_tokens": probe.output,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": False,
        }
        t0 = clock()
        try:
            r = await self.client.post(f"{self.url}/v1/completions", json=body, timeout=max(timeout_s, 0.001))
        except httpx.TimeoutException:
            raise
        except httpx.HTTPError as exc:
            raise CalibrationError(f"{self.url}: request failed ({type(exc).__name__})") from None
        dt = clock() - t0
        if r.status_code != 200:
            # The body is the worker's; its message may quote the prompt, so only the status is shown.
            raise CalibrationError(f"{self.url}/v1/completions answered HTTP {r.status_code}")
        try:
            usage = r.json()["usage"]
            return dt, int(usage["prompt_tokens"]), int(usage["completion_tokens"])
        except (ValueError, KeyError, TypeError):
            raise CalibrationError(f"{self.url}/v1/completions: a response without usage counts") from None


@dataclass(frozen=True)
class ArrivalRun:
    """What ``send_arrivals`` measured: each request's latency from its arrival (NaN: failed or not answered
    before the deadline) and how many waited in the client for a free in-flight slot."""

    latencies: list[float]
    client_waits: int

    @property
    def complete(self) -> bool:
        """Every request answered."""
        return all(math.isfinite(v) for v in self.latencies)


async def send_arrivals(
    w: ProbeWorker,
    arrivals: Sequence[Arrival],
    *,
    max_inflight: int,
    deadline: float,
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    seed_base: int = 0,
    on_done: Callable[[], object] | None = None,
) -> ArrivalRun:
    """Send each request at its offset from now (at most ``max_inflight`` in flight: a later arrival waits in
    the client, and its latency counts the wait). Requests still running at ``deadline`` are cancelled; one
    that fails or is cancelled reads NaN. Request ``i``'s prompt has seed ``seed_base + i``."""
    slots = asyncio.Semaphore(max_inflight)
    live = [math.nan] * len(arrivals)
    waits = 0
    t0 = clock()

    async def one(i: int, at: float, prompt: int, output: int) -> None:
        nonlocal waits
        await sleep(max(0.0, t0 + at - clock()))
        arrived = clock()
        waits += slots.locked()
        async with slots:
            try:
                await w.complete(Probe("lone", prompt, output, 1, seed_base + i), clock, deadline - clock())
            except (CalibrationError, httpx.HTTPError):
                return
            finally:
                if on_done is not None:
                    on_done()
            live[i] = clock() - arrived

    tasks = [asyncio.ensure_future(one(i, *a)) for i, a in enumerate(arrivals)]
    try:
        async with asyncio.timeout(max(0.0, deadline - clock())):
            await asyncio.gather(*tasks)
    except TimeoutError:
        pass
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return ArrivalRun(live, waits)
