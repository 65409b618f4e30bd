"""A client that leaves stops its work: for every route, the workflow is cancelled, its queued calls are
dropped, its in-flight worker requests are aborted (the emulated worker sees the connection close, as
vLLM does), no later stage is sent, and it is counted ``cancelled``, never met, and not recorded for the
tuner.

The gateway runs under uvicorn on a loopback port and the client is a raw socket that sends a request
and closes the connection once the worker has the call (or the gateway has queued it), so the
disconnect happens at a known point of the workflow, with no timing guess.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from gateway.live.service import Gateway
from gateway.text2sql.demo import DB_ID, demo_questions, write_sqlite
from tests.live.harness import INTERACTIVE_KEY, chain, emulators, gateway_server, wait_for, write_config

TENANT = "interactive"
SLOW = 1.0  # real time: every call runs for seconds, so the client surely leaves while it runs


def _config(tmp: Path, urls: list[str], *, capacity: int, time_scale: float = SLOW, **overrides: Any) -> Path:
    workers = [{"name": f"a100-{i}", "gpu": "A100", "url": u, "capacity": capacity} for i, u in enumerate(urls)]
    # These tests hold a slot busy on purpose and queue work behind it: deadline-based admission would
    # (rightly) refuse that work, so the tenant here is admitted by its concurrency bounds only.
    tenants = tmp / "tenants.yaml"
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "config" / "tenants.yaml").read_text())
    for t in doc["tenants"]:
        t["predictive_admission"] = False
    tenants.write_text(yaml.safe_dump(doc))
    return write_config(
        tmp,
        urls,
        ["A100"] * len(urls),
        time_scale=time_scale,
        cluster={"name": "test", "workers": workers},
        **overrides,
    )


async def _emulator_counts(url: str) -> dict[str, float]:
    """The emulated worker's own counters: requests received and aborted (client gone)."""
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"{url}/metrics")).text
    out = {}
    for name in ("received", "aborted"):
        m = re.search(rf"^hexflow_emulator_requests_{name}_total (\S+)$", text, re.MULTILINE)
        assert m is not None, text
        out[name] = float(m.group(1))
    return out


def _outcome(gw: Gateway, outcome: str) -> float:
    v = gw.metrics.registry.get_sample_value("hexflow_workflows_total", {"tenant": TENANT, "outcome": outcome})
    return v or 0.0


def _dispatched(gw: Gateway, kind: str | None = None) -> float:
    total = 0.0
    for fam in gw.metrics.registry.collect():
        if fam.name == "hexflow_dispatch":
            total += sum(s.value for s in fam.samples if s.name.endswith("_total") and kind in (None, s.labels["kind"]))
    return total


@asynccontextmanager
async def _request_then_leave(base: str, path: str, body: dict[str, Any]) -> AsyncIterator[asyncio.StreamReader]:
    """Send ``POST path`` on a raw connection; leaving the block closes the connection."""
    u = urlsplit(base)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    raw = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nAuthorization: Bearer {INTERACTIVE_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
    )
    writer.write(head.encode() + raw)
    await writer.drain()
    try:
        yield reader
    finally:
        writer.close()
        await writer.wait_closed()


async def _until(cond: Callable[[], Any], what: str, timeout_s: float = 60.0) -> None:
    assert await wait_for(cond, timeout_s), f"timed out waiting for {what}"


async def _until_async(probe: Callable[[], Any], what: str, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not await probe():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _idle(gw: Gateway) -> bool:
    """No workflow in progress, no call queued, parked or in flight."""
    sched = gw.scheduler
    return (
        gw.active_total == 0
        and not gw.pool.parked
        and all(sched.queue_len(i) == 0 and sched.inflight(i) == 0 for i in sched.members())
    )


async def test_a_workflow_whose_client_leaves_is_cancelled(tmp_path: Path) -> None:
    # One worker, one slot: of stage 0's two calls one runs and one waits in the gateway's queue.
    async with emulators(["A100"], time_scale=SLOW) as urls:
        cfg = _config(tmp_path, urls, capacity=1)
        async with gateway_server(cfg) as (base, app):
            gw: Gateway = app.state.gateway
            body = {"calls": chain(3, width=2, prompt=2000, out=2000), "deadline_s": 600}
            async with _request_then_leave(base, "/v1/workflows", body):

                async def worker_has_it() -> bool:
                    return (await _emulator_counts(urls[0]))["received"] == 1

                await _until_async(worker_has_it, "the first call to reach the worker")
                assert sum(gw.scheduler.queue_len(i) for i in gw.scheduler.members()) == 1
            await _until(lambda: _outcome(gw, "cancelled") == 1, "the workflow to be counted cancelled")
            await _until(lambda: _idle(gw), "the gateway to hold nothing of the workflow")

            async def aborted() -> bool:
                return (await _emulator_counts(urls[0]))["aborted"] == 1

            await _until_async(aborted, "the worker to see its request aborted")
            # The queued call was dropped and no later stage was dispatched.
            assert _dispatched(gw) == 2
            assert (await _emulator_counts(urls[0]))["received"] == 1
            assert _outcome(gw, "met") == _outcome(gw, "missed") == _outcome(gw, "failed") == 0
            assert gw.recorder.snapshot(gw.clock()) == []
            # The slot is free again: a new workflow runs on the same worker.
            async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {INTERACTIVE_KEY}"}) as c:
                r = await c.post("/v1/workflows", json={"calls": chain(1, prompt=50, out=5), "deadline_s": 600})
            assert r.status_code == 200, r.text


async def test_a_chat_completion_whose_client_leaves_is_cancelled(tmp_path: Path) -> None:
    async with emulators(["A100"], time_scale=SLOW) as urls:
        cfg = _config(tmp_path, urls, capacity=2)
        async with gateway_server(cfg) as (base, app):
            gw: Gateway = app.state.gateway
            body = {"messages": [{"role": "user", "content": "word " * 500}], "max_tokens": 4000}
            async with _request_then_leave(base, "/v1/chat/completions", body):

                async def worker_has_it() -> bool:
                    return (await _emulator_counts(urls[0]))["received"] == 1

                await _until_async(worker_has_it, "the call to reach the worker")
            await _until(lambda: _outcome(gw, "cancelled") == 1, "the chat to be counted cancelled")
            await _until(lambda: _idle(gw), "the gateway to hold nothing of the chat")

            async def aborted() -> bool:
                return (await _emulator_counts(urls[0]))["aborted"] == 1

            await _until_async(aborted, "the worker to see its request aborted")
            assert _outcome(gw, "met") == _outcome(gw, "missed") == 0


async def test_a_streaming_chat_whose_client_leaves_mid_stream_is_cancelled(tmp_path: Path) -> None:
    async with emulators(["A100"], time_scale=SLOW) as urls:
        cfg = _config(tmp_path, urls, capacity=2)
        async with gateway_server(cfg) as (base, app):
            gw: Gateway = app.state.gateway
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000, "stream": True}
            async with _request_then_leave(base, "/v1/chat/completions", body) as reader:
                received = b""
                while b"data: " not in received:  # the stream has started: tokens are flowing
                    chunk = await reader.read(4096)
                    assert chunk, "the gateway closed the stream"
                    received += chunk
                assert received.startswith(b"HTTP/1.1 200")
            await _until(lambda: _outcome(gw, "cancelled") == 1, "the stream to be counted cancelled")
            await _until(lambda: _idle(gw), "the gateway to hold nothing of the stream")

            async def aborted() -> bool:
                return (await _emulator_counts(urls[0]))["aborted"] == 1

            await _until_async(aborted, "the worker to see its stream aborted")
            assert _outcome(gw, "met") == _outcome(gw, "missed") == 0


async def test_a_streaming_chat_whose_client_leaves_while_queued_is_never_sent(tmp_path: Path) -> None:
    # The only slot is busy: the streaming call waits in the gateway's queue, before any byte is sent.
    async with emulators(["A100"], time_scale=SLOW) as urls:
        cfg = _config(tmp_path, urls, capacity=1)
        async with gateway_server(cfg) as (base, app):
            gw: Gateway = app.state.gateway
            busy = {"calls": chain(1, prompt=2000, out=2000), "deadline_s": 600}
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True}
            async with _request_then_leave(base, "/v1/workflows", busy):
                await _until(lambda: _dispatched(gw) == 1, "the slot to be taken")
                async with _request_then_leave(base, "/v1/chat/completions", chat):
                    await _until(lambda: gw.scheduler.queue_len(0) == 1, "the chat call to be queued")
                await _until(lambda: _outcome(gw, "cancelled") == 1, "the chat to be counted cancelled")
                assert gw.scheduler.queue_len(0) == 0 and _dispatched(gw, "chat") == 1
                assert gw.active_total == 1  # the other client's workflow still runs
            await _until(lambda: _outcome(gw, "cancelled") == 2, "the other workflow to be cancelled too")
            await _until(lambda: _idle(gw), "the gateway to be idle")
            assert (await _emulator_counts(urls[0]))["received"] == 1  # the chat call never reached it


async def test_a_text2sql_question_whose_client_leaves_is_cancelled(tmp_path: Path) -> None:
    write_sqlite(tmp_path / f"{DB_ID}.sqlite")
    (tmp_path / "databases.yaml").write_text(
        yaml.safe_dump({"databases": {DB_ID: {"url": f"sqlite:///{DB_ID}.sqlite", "statement_timeout_s": 2.0}}})
    )
    async with emulators(["A100"], time_scale=SLOW * 4) as urls:  # a stage of short calls: slower still
        cfg = _config(tmp_path, urls, capacity=4, time_scale=SLOW * 4, databases_file="databases.yaml")
        async with gateway_server(cfg) as (base, app):
            gw: Gateway = app.state.gateway
            body = {"question": demo_questions()[0].question, "db_id": DB_ID, "deadline_s": 600}
            async with _request_then_leave(base, "/v1/text2sql", body):

                async def worker_has_it() -> bool:
                    return (await _emulator_counts(urls[0]))["received"] >= 1

                await _until_async(worker_has_it, "the first stage to reach the worker")
                first_stage = _dispatched(gw)
            await _until(lambda: _outcome(gw, "cancelled") == 1, "the question to be counted cancelled")
            await _until(lambda: _idle(gw), "the gateway to hold nothing of the question")

            async def all_aborted() -> bool:
                c = await _emulator_counts(urls[0])
                return c["aborted"] == c["received"] == first_stage

            await _until_async(all_aborted, "the worker to see the first stage's requests aborted")
            # No later stage: nothing was dispatched after the first stage's calls.
            assert _dispatched(gw) == first_stage
            assert _outcome(gw, "met") == _outcome(gw, "missed") == _outcome(gw, "failed") == 0
            assert gw.recorder.snapshot(gw.clock()) == []
