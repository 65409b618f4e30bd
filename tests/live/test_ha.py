"""High availability with real gateway processes: three replicas elect a leader on the fake Kubernetes API,
the leader is killed (SIGKILL) under load, another takes over, and clients that retry with the same
``Idempotency-Key`` lose no workflow, and none runs twice on one replica.

The figures (time to take over, workflows interrupted, lost) are printed: run with ``-s`` to see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.emulator_process import free_port
from tests.live.fake_kube import fake_kube
from tests.live.harness import INTERACTIVE_KEY, chain, emulators, write_config

LEASE_DURATION_S = 2
TIME_SCALE = 0.2
RETRY_FOR_S = 60.0  # how long a client keeps retrying one workflow before it counts it lost


@dataclass
class Replica:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Outcome:
    """One workflow as its client saw it: every attempt's replica and result, and the answer."""

    key: str
    attempts: list[tuple[str, str]] = field(default_factory=list)  # (replica, status or error)
    served_by: str | None = None
    replayed: bool = False
    workflow_id: str | None = None


@contextlib.contextmanager
def replicas(tmp: Path, urls: list[str], kube_url: str, n: int) -> Iterator[list[Replica]]:
    token = tmp / "token"
    token.write_text("test-token")
    out: list[Replica] = []
    try:
        for i in range(n):
            d = tmp / f"gw-{i}"
            d.mkdir()
            port = free_port()
            cfg = write_config(
                d,
                urls,
                ["A100", "L40S"],
                time_scale=TIME_SCALE,
                listen={"host": "127.0.0.1", "port": port},
                leader_election={
                    "enabled": True,
                    "identity": f"gw-{i}",
                    "lease_duration_s": LEASE_DURATION_S,
                    "renew_deadline_s": 1.5,
                    "retry_period_s": 0.25,
                    "api_url": kube_url,
                    "token_file": str(token),
                    "namespace": "hexflow",
                },
            )
            log = d / "gateway.log"
            with log.open("wb") as f:  # the child keeps its own descriptor
                proc = subprocess.Popen(
                    [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--log-level", "info"],
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            out.append(Replica(f"gw-{i}", f"http://127.0.0.1:{port}", proc, log))
        yield out
    finally:
        for r in out:
            if r.proc.poll() is None:
                r.proc.terminate()
        for r in out:
            try:
                r.proc.wait(15)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()


async def readiness(client: httpx.AsyncClient, r: Replica) -> dict[str, object] | None:
    """The replica's ``/readyz`` answer; None while it does not answer."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        body = (await client.get(f"{r.url}/readyz", timeout=2)).json()
        return body if isinstance(body, dict) else None
    return None


async def leaders(client: httpx.AsyncClient, rs: list[Replica]) -> list[Replica]:
    live = [r for r in rs if r.proc.poll() is None]
    answers = await asyncio.gather(*(readiness(client, r) for r in live))
    return [r for r, a in zip(live, answers, strict=True) if a is not None and a.get("ready") is True]


async def send(client: httpx.AsyncClient, rs: list[Replica], out: Outcome) -> None:
    """POST one workflow as a client behind a Service would, retrying with the same key: a refused or broken
    attempt (503 from a follower, connection refused or reset by a dead leader) moves to the next replica."""
    body = {"calls": chain(2, width=2, prompt=400, out=40), "deadline_s": 120}
    headers = {"Idempotency-Key": out.key}
    give_up = time.monotonic() + RETRY_FOR_S
    i = 0
    while time.monotonic() < give_up:
        r = rs[i % len(rs)]
        i += 1
        try:
            resp = await client.post(f"{r.url}/v1/workflows", json=body, headers=headers, timeout=30)
        except httpx.HTTPError as exc:
            out.attempts.append((r.name, type(exc).__name__))
            await asyncio.sleep(0.05)
            continue
        out.attempts.append((r.name, str(resp.status_code)))
        if resp.status_code == 200:
            out.served_by = r.name
            out.replayed = resp.headers.get("idempotent-replayed") == "true"
            out.workflow_id = resp.json()["id"]
            return
        assert resp.status_code in (429, 503), resp.text
        await asyncio.sleep(0.05)


def completed_workflows(metrics: str) -> int:
    return round(
        sum(
            float(v)
            for v in re.findall(r'^hexflow_workflows_total\{outcome="(?:met|missed)",[^}]*\} (\S+)$', metrics, re.M)
        )
    )


async def test_killing_the_leader_under_load_loses_no_keyed_workflow(tmp_path: Path) -> None:
    async with emulators(["A100", "L40S"], time_scale=TIME_SCALE) as urls, fake_kube() as kube:
        with replicas(tmp_path, urls, kube.url, 3) as rs:
            auth = {"Authorization": f"Bearer {INTERACTIVE_KEY}"}
            async with httpx.AsyncClient(headers=auth) as client:
                deadline = time.monotonic() + 60
                while True:  # every replica answers: one leader, two followers that name it
                    answers = await asyncio.gather(*(readiness(client, r) for r in rs))
                    lead = [r for r, a in zip(rs, answers, strict=True) if a is not None and a["ready"] is True]
                    if len(lead) == 1 and all(
                        a == {"ready": False, "reason": "not the leader", "leader": lead[0].name}
                        for r, a in zip(rs, answers, strict=True)
                        if r is not lead[0]
                    ):
                        break
                    assert time.monotonic() < deadline, [r.log.read_text()[-2000:] for r in rs]
                    assert all(r.proc.poll() is None for r in rs), [r.log.read_text()[-2000:] for r in rs]
                    await asyncio.sleep(0.1)
                (old,) = lead

                outcomes: list[Outcome] = []
                stop = asyncio.Event()

                async def user(u: int) -> None:
                    k = 0
                    while not stop.is_set():
                        out = Outcome(f"user{u}-wf{k}")
                        outcomes.append(out)
                        await send(client, rs, out)
                        k += 1

                users = [asyncio.create_task(user(u)) for u in range(4)]
                # Kill the leader while it runs workflows, after a few have finished.
                while sum(o.served_by is not None for o in outcomes) < 4:
                    await asyncio.sleep(0.05)
                while (await client.get(f"{old.url}/v1/status")).json()["active_workflows"] < 2:
                    await asyncio.sleep(0.01)
                old.proc.send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
                while not (lead := await leaders(client, rs)):
                    assert time.monotonic() - killed_at < 60, "no replica took over"
                    await asyncio.sleep(0.02)
                takeover_s = time.monotonic() - killed_at
                (new,) = lead
                before = sum(o.served_by is not None for o in outcomes)
                while sum(o.served_by is not None for o in outcomes) < before + 4:
                    await asyncio.sleep(0.05)
                stop.set()
                await asyncio.gather(*users)

                interrupted = [o for o in outcomes if any(a[0] == old.name and not a[1].isdigit() for a in o.attempts)]
                lost = [o for o in outcomes if o.served_by is None]
                by_new = [o for o in outcomes if o.served_by == new.name]
                print(
                    f"\nHA: take-over {takeover_s:.2f} s after SIGKILL (lease {LEASE_DURATION_S} s); "
                    f"{len(outcomes)} workflows, {len(interrupted)} interrupted by the kill and retried, "
                    f"{len(lost)} lost; lease transitions {kube.leases['hexflow-gateway']['spec']['leaseTransitions']}"
                )
                assert new is not old and not lost
                assert interrupted, "the kill hit no workflow in flight"
                assert all(o.served_by == new.name for o in interrupted)
                assert kube.leases["hexflow-gateway"]["spec"]["holderIdentity"] == new.name
                # None ran twice on the new leader: it completed one workflow per key it answered first-hand,
                # and a retry of each of those keys now gets the stored answer.
                firsthand = [o for o in by_new if not o.replayed]
                metrics = (await client.get(f"{new.url}/metrics")).text
                assert completed_workflows(metrics) == len(firsthand)
                for o in firsthand[:5]:
                    again = Outcome(o.key)
                    await send(client, [new], again)
                    assert again.replayed and again.workflow_id == o.workflow_id
                assert completed_workflows((await client.get(f"{new.url}/metrics")).text) == len(firsthand)
                # The replica that never led completed nothing: followers refuse work.
                (third,) = [r for r in rs if r is not old and r is not new]
                assert completed_workflows((await client.get(f"{third.url}/metrics")).text) == 0
                assert takeover_s < 30  # a lease period plus rounds; generous for a busy machine
