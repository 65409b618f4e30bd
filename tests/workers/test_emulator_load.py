"""One emulator process holds 256 concurrent streaming requests with event-loop lag under 20 ms."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.workers.conftest import MODEL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def emulator_process(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "workers.emulator",
        "--gpu",
        "A100",
        "--port",
        str(port),
        "--time-scale",
        "0.05",
        "--max-num-seqs",
        "256",
    ]
    log = (tmp_path / "emulator.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"emulator did not start: {(tmp_path / 'emulator.log').read_text()}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _gauge(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_256_concurrent_streams_with_low_event_loop_lag(emulator_process: str) -> None:
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
        async with httpx.AsyncClient(base_url=emulator_process, limits=limits, timeout=120.0) as client:
            counts = await asyncio.gather(*(one(client) for _ in range(256)))
        # A fresh connection: pooled ones may have passed the server's keep-alive timeout.
        async with httpx.AsyncClient(base_url=emulator_process, timeout=10.0) as client:
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
