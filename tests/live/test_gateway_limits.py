"""Admission limits, worker failure, no healthy worker: 429/503 with Retry-After, nothing lost."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from tests.emulator_process import emulator_subprocess, free_port
from tests.live.harness import chain, emulators, gateway_client, write_config


async def test_queue_bound_answers_429_with_retry_after(tmp_path: Path) -> None:
    async with emulators(["A100"], time_scale=0.05) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], limits={"max_queued_calls": 3})
        async with gateway_client(cfg) as (client, _):
            body = {"calls": chain(1, width=2, prompt=4000, out=40)}
            results = await asyncio.gather(*(client.post("/v1/workflows", json=body) for _ in range(8)))
            codes = sorted(r.status_code for r in results)
            assert 429 in codes and 200 in codes, codes
            for r in results:
                if r.status_code == 429:
                    assert int(r.headers["retry-after"]) >= 1
                    assert "queues are full" in r.json()["error"]["message"]
                else:
                    assert r.json()["status"] == "ok"
            m = (await client.get("/metrics")).text
            assert 'hexflow_workflows_total{outcome="rejected",tenant="interactive"}' in m


async def test_tenant_concurrency_bound_answers_429(tmp_path: Path) -> None:
    (tmp_path / "tenants.yaml").write_text(
        (Path(__file__).resolve().parents[2] / "config" / "tenants.yaml")
        .read_text()
        .replace("max_concurrent_workflows: 64", "max_concurrent_workflows: 1")
    )
    async with (
        emulators(["A100"], time_scale=0.05) as urls,
        gateway_client(write_config(tmp_path, urls, ["A100"])) as (client, _),
    ):
        body = {"calls": chain(2, prompt=2000, out=30)}
        first = asyncio.create_task(client.post("/v1/workflows", json=body))
        await asyncio.sleep(0.05)
        r = await client.post("/v1/workflows", json=body)
        assert r.status_code == 429 and "tenant 'interactive'" in r.json()["error"]["message"]
        assert (await first).status_code == 200
        assert (await client.post("/v1/workflows", json=body)).status_code == 200


async def test_no_healthy_worker_answers_503_and_readyz_says_so(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with gateway_client(write_config(tmp_path, [dead], ["A100"])) as (client, _):
        r = await client.get("/readyz")
        assert r.status_code == 503 and r.json()["reason"] == "no healthy worker"
        assert (await client.get("/healthz")).status_code == 200
        r = await client.post("/v1/workflows", json={"calls": chain(1)})
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert "no healthy worker" in r.json()["error"]["message"]


async def test_worker_killed_mid_workflow_loses_nothing(tmp_path: Path) -> None:
    """Kill one of two workers while workflows run on both: every workflow still completes."""
    args = ["--gpu", "A100", "--time-scale", "0.05"]
    async with emulators(["L40S"], time_scale=0.05) as (survivor,):
        with emulator_subprocess(args, tmp_path / "victim.log") as (victim, proc):
            cfg = write_config(tmp_path, [victim, survivor], ["A100", "L40S"])
            async with gateway_client(cfg) as (client, app):
                body = {"calls": chain(4, width=2, prompt=3000, out=60)}
                tasks = [asyncio.create_task(client.post("/v1/workflows", json=body)) for _ in range(6)]
                gw = app.state.gateway
                # Kill as soon as the victim holds calls (a fixed sleep raced the workflows' end under load).
                for _ in range(500):
                    if gw.pool.workers[0].inflight:
                        break
                    await asyncio.sleep(0.01)
                assert gw.pool.workers[0].inflight, "the victim has no call in flight to lose"
                # Kill the victim hard (no graceful close): in-flight calls see broken connections.
                proc.send_signal(signal.SIGKILL)
                results = await asyncio.gather(*tasks)
                for r in results:
                    assert r.status_code == 200, r.text
                    assert r.json()["status"] == "ok"
                status = (await client.get("/v1/status")).json()
                victim_status = status["workers"][0]
                assert victim_status["up"] is False and victim_status["failed"] >= 1
                assert sum(len(r.json()["calls"]) for r in results) == 6 * 8
                m = (await client.get("/metrics")).text
                assert 'hexflow_worker_up{worker="a100-0"} 0.0' in m
                assert 'hexflow_call_retries_total{worker="a100-0"}' in m
