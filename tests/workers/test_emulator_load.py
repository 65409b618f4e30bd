"""One emulator process holds 256 concurrent streaming requests with event-loop lag under 20 ms."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.emulator_process import emulator_process
from tests.workers.conftest import MODEL


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[str]:
    args = ["--gpu", "A100", "--time-scale", "0.05", "--max-num-seqs", "256"]
    with emulator_process(args, tmp_path / "emulator.log") as url:
        yield url


def _gauge(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_256_concurrent_streams_with_low_event_loop_lag(emulator: str) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "w " * 300}],
        "max_tokens": 200,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    async def one(client: httpx.AsyncClient) -> int:
        n = 0
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                n += bool(line)
        return n

    async def main() -> tuple[list[int], str]:
        limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
        async with httpx.AsyncClient(base_url=emulator, limits=limits, timeout=120.0) as client:
            counts = await asyncio.gather(*(one(client) for _ in range(256)))
        # A fresh connection: pooled ones may have passed the server's keep-alive timeout.
        async with httpx.AsyncClient(base_url=emulator, timeout=10.0) as client:
            return list(counts), (await client.get("/metrics")).text

    counts, metrics = asyncio.run(main())
    assert all(n >= 4 for n in counts)
    assert _gauge(metrics, "hexflow_emulator_event_loop_lag_p99_seconds") < 0.020
    iterations = _gauge(metrics, "hexflow_emulator_model_iterations")
    cpu = _gauge(metrics, "hexflow_emulator_model_cpu_seconds")
    assert iterations > 200
    print(
        f"\nmodel CPU per iteration: {cpu / iterations * 1e6:.1f} us over {iterations:.0f} iterations; "
        f"lag p99 {_gauge(metrics, 'hexflow_emulator_event_loop_lag_p99_seconds') * 1e3:.2f} ms, "
        f"max {_gauge(metrics, 'hexflow_emulator_event_loop_lag_max_seconds') * 1e3:.2f} ms"
    )
