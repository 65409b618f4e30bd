"""A worker started without vLLM's ``--scheduling-policy priority`` refuses the ``priority`` field: the gateway
sends it the call again at once without the field, and never sends the field to it again."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from gateway.core.workflow import CallSpec, Stage, StagedWorkflow
from gateway.errors import CallFailed
from gateway.live.transport import LiveCall, PriorityRefused, _payload, _result
from gateway.profiling.promparse import parse_families
from tests.live.chaos_worker import App, Receive, Scope, Send, answer, read_body, replay_body
from tests.live.harness import chain, emulator_app, emulators, gateway_client, serving, write_config

# vLLM's answers, old (``ErrorResponse`` at the top level) and new (under ``error``).
OLD = {"object": "error", "type": "BadRequestError", "param": None, "code": 400}


def _refusal(priority: int, shape: str) -> dict[str, Any]:
    message = f"Got priority {priority} but Priority scheduling is not enabled."
    if shape == "old":
        return {**OLD, "message": message}
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}


class FcfsWorker:
    """The emulator behind vLLM's check of a worker without priority scheduling: a completion request whose
    ``priority`` is not 0 gets HTTP 400 and nothing runs; every other request passes through."""

    def __init__(self, app: App, shape: str) -> None:
        self.app = app
        self.shape = shape
        self.refused = 0
        self.passed = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("completions"):
            await self.app(scope, receive, send)
            return
        raw = await read_body(receive)
        if raw is None:
            return
        priority = json.loads(raw).get("priority", 0)
        if priority != 0:
            self.refused += 1
            await answer(send, 400, "application/json", json.dumps(_refusal(priority, self.shape)).encode())
            return
        self.passed += 1
        await self.app(scope, replay_body(raw, receive), send)


@pytest.mark.parametrize("shape", ["old", "new"])
async def test_a_worker_that_refuses_priority_gets_every_call_without_it_and_says_so_once(
    tmp_path: Path, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    fcfs = FcfsWorker(emulator_app("A100"), shape)
    async with (
        serving(fcfs, what="the FCFS worker") as fcfs_url,
        emulators(["A100"]) as (priority_url,),
        gateway_client(write_config(tmp_path, [fcfs_url, priority_url], ["A100", "A100"])) as (client, app),
    ):
        caplog.set_level(logging.WARNING, logger="hexflow.pool")
        for _ in range(3):
            results = await asyncio.gather(
                *(client.post("/v1/workflows", json={"calls": chain(3, width=2)}) for _ in range(4))
            )
            for r in results:
                assert r.status_code == 200, r.text
                assert r.json()["status"] == "ok", r.text
        pool = app.state.gateway.pool
        refusing, accepting = pool.workers
        assert refusing.sent > 0 and accepting.sent > 0
        assert refusing.failed == 0 and not refusing.ejected and refusing.up
        # Only the calls in flight when the first refusal came back were refused (capacity 4).
        assert 1 <= fcfs.refused <= refusing.info.capacity and fcfs.passed == refusing.sent
        status = {w["name"]: w for w in (await client.get("/v1/status")).json()["workers"]}
        assert status[refusing.name]["priority_scheduling"] is False
        assert status[accepting.name]["priority_scheduling"] is True
        warnings = [r for r in caplog.records if "refuses vLLM's priority field" in r.getMessage()]
        assert len(warnings) == 1 and refusing.name in warnings[0].getMessage()
        fam = parse_families((await client.get("/metrics")).text)
        gauge = {labels["worker"]: v for labels, v in fam["hexflow_worker_priority_scheduling"]}
        assert gauge == {refusing.name: 0.0, accepting.name: 1.0}


@pytest.mark.parametrize("shape", ["old", "new"])
def test_vllms_refusal_of_priority_is_told_apart_from_other_400s(shape: str) -> None:
    with pytest.raises(PriorityRefused) as info:
        _result(400, json.dumps(_refusal(7, shape)).encode())
    assert info.value.status == 400
    other = {**OLD, "message": "This model's maximum context length is 4096 tokens."}
    with pytest.raises(CallFailed) as failed:
        _result(400, json.dumps(other).encode())
    assert not isinstance(failed.value, PriorityRefused)
    refusal_as_422 = json.dumps(_refusal(7, shape)).encode()
    with pytest.raises(CallFailed) as failed:
        _result(422, refusal_as_422)
    assert not isinstance(failed.value, PriorityRefused)


def test_a_call_without_priority_sends_no_priority_field() -> None:
    spec = CallSpec("k", 10, 2)
    wf = StagedWorkflow(0, "t", 0.0, 10.0, [Stage("k", (spec,))])
    call = LiveCall(id=0, workflow=wf, spec=spec, ready_at=0.0, body={"prompt": "x", "max_tokens": 2}, priority=5)
    assert json.loads(_payload(call, b'"m"')) == {"priority": 5, "prompt": "x", "max_tokens": 2, "model": "m"}
    call.priority = None
    assert json.loads(_payload(call, b'"m"')) == {"prompt": "x", "max_tokens": 2, "model": "m"}
    own = LiveCall(id=1, workflow=wf, spec=spec, ready_at=0.0, body={"priority": 3, "model": "x"}, priority=None)
    assert json.loads(_payload(own, b'"m"')) == {"model": "m"}
