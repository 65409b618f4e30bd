"""Start an emulated worker for tests: as a real subprocess (uvicorn on a free loopback port), or in process
behind an httpx client (``emulated_client``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx

from gateway.bench.procs import free_port
from gateway.core.profile import PerfProfile
from workers.emulator import EmulatorConfig, create_app

__all__ = ["emulated_client", "emulator_process", "emulator_subprocess", "free_port"]


@asynccontextmanager
async def emulated_client(profile: PerfProfile, model: str, time_scale: float) -> AsyncIterator[httpx.AsyncClient]:
    """An emulated worker with ``profile`` in this process (its lifespan run), behind an httpx client (any
    base URL reaches it). Its clock is the running loop's: on ``tests.fakes.virtual_time_loop`` it runs in
    virtual time."""
    clock = asyncio.get_running_loop().time
    app = create_app(EmulatorConfig(profile=profile, served_model_name=model, time_scale=time_scale, clock=clock))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, timeout=60.0) as client:
            yield client


@contextmanager
def emulator_process(args: Sequence[str], log_path: Path, *, start_timeout_s: float = 30.0) -> Iterator[str]:
    """Run ``python -m workers.emulator ARGS --port P``; yield its base URL once ``/health`` answers."""
    with emulator_subprocess(args, log_path, start_timeout_s=start_timeout_s) as (url, _):
        yield url


@contextmanager
def emulator_subprocess(
    args: Sequence[str], log_path: Path, *, start_timeout_s: float = 30.0
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Like ``emulator_process`` but also yields the process (to kill it in failure tests)."""
    port = free_port()
    cmd = [sys.executable, "-m", "workers.emulator", *args, "--port", str(port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + start_timeout_s
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"emulator did not start: {log_path.read_text()}")
                time.sleep(0.1)
            yield url, proc
        finally:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=10)
