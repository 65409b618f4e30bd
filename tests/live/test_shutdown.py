"""SIGTERM: intake stops at once, in-flight workflows finish within the grace period, the process exits 0."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.emulator_process import emulator_process, free_port
from tests.live.harness import INTERACTIVE_KEY, chain, write_config


async def test_sigterm_drains_in_flight_workflows(tmp_path: Path) -> None:
    with emulator_process(["--gpu", "A100", "--time-scale", "0.05"], tmp_path / "emu.log") as worker:
        port = free_port()
        cfg = write_config(tmp_path, [worker], ["A100"], listen={"host": "127.0.0.1", "port": port})
        log = (tmp_path / "gateway.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--log-level", "warning"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {INTERACTIVE_KEY}"}
        try:
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if (await client.get("/readyz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "gateway.log").read_text()
                    await asyncio.sleep(0.1)
                # Each workflow takes about 1-2 s of wall time at this scale.
                body = {"calls": chain(3, width=2, prompt=3000, out=80)}
                running = [asyncio.create_task(client.post("/v1/workflows", json=body)) for _ in range(3)]
                await asyncio.sleep(0.3)
                t_sig = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.2)
                # Intake has stopped: a new connection is refused (or answered 503 while draining).
                try:
                    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=5) as fresh:
                        late = await fresh.post("/v1/workflows", json=body)
                    assert late.status_code == 503, late.text
                except httpx.TransportError:
                    pass
                results = await asyncio.gather(*running)
                for r in results:
                    assert r.status_code == 200, r.text
                    assert r.json()["status"] == "ok"
            rc = await asyncio.to_thread(proc.wait, 30)
            assert rc == 0, (tmp_path / "gateway.log").read_text()
            assert time.monotonic() - t_sig < 15
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
