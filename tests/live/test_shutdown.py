"""SIGTERM: intake answers 503 at once while the listener stays open, in-flight workflows finish within the
grace period, the process exits 0."""

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


async def test_sigterm_drains_in_flight_workflows_with_the_listener_open(tmp_path: Path) -> None:
    with emulator_process(["--gpu", "A100", "--time-scale", "0.5"], tmp_path / "emu.log") as worker:
        port = free_port()
        cfg = write_config(
            tmp_path,
            [worker],
            ["A100"],
            time_scale=0.5,
            listen={"host": "127.0.0.1", "port": port},
            shutdown_grace_s=60,
        )
        log = (tmp_path / "gateway.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--log-level", "info"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {INTERACTIVE_KEY}"}

        def gateway_log() -> str:
            return (tmp_path / "gateway.log").read_text()

        try:
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if (await client.get("/readyz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert proc.poll() is None and time.monotonic() < deadline, gateway_log()
                    await asyncio.sleep(0.1)
                # Each workflow runs for several seconds at this scale: the drain below happens while they run.
                body = {"calls": chain(2, width=2, prompt=3000, out=300), "deadline_s": 600}
                running = [asyncio.create_task(client.post("/v1/workflows", json=body)) for _ in range(2)]
                while (await client.get("/v1/status")).json()["active_workflows"] < 2:
                    await asyncio.sleep(0.05)
                proc.send_signal(signal.SIGTERM)
                # NEW connections are accepted during the drain: /readyz answers 503 (once the signal is
                # handled), and a new workflow gets 503 with Retry-After.
                while True:
                    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as fresh:
                        ready = await fresh.get("/readyz")
                        if ready.status_code == 503:
                            late = await fresh.post("/v1/workflows", json=body)
                            status = (await fresh.get("/v1/status")).json()
                            break
                    assert ready.status_code == 200, ready.text
                    await asyncio.sleep(0.02)
                assert ready.json()["reason"] == "shutting down"
                assert late.status_code == 503, late.text
                assert int(late.headers["retry-after"]) >= 1
                assert status["draining"] and status["active_workflows"] == 2  # still draining them
                results = await asyncio.gather(*running)
                for r in results:
                    assert r.status_code == 200, r.text
                    assert r.json()["status"] == "ok"
            rc = await asyncio.to_thread(proc.wait, 60)
            assert rc == 0, gateway_log()
            assert "INFO hexflow.server: drained; exiting" in gateway_log()  # the normal way out: INFO
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
