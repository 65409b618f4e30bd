"""The live gateway's prefix index: prompts are hashed into blocks, and a prefix-aware policy sends a call
to the worker that holds its prompt's prefix even when another worker is idle."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.core.dag import DagNode
from gateway.core.worker import WorkerInfo
from gateway.live.runner import CallRequest, request_prompt
from gateway.live.tenants import Tenant
from gateway.live.transport import CallResult, LiveCall
from tests.fakes import FakeClock
from tests.live.fake_transport import FakeTransport, fake_gateway
from tests.live.harness import write_config

TENANT = Tenant("t", 600.0, 1.0, 6000.0, 1.0, 10)
SCHEMA = " ".join(f"CREATE TABLE t{i} (id INTEGER PRIMARY KEY, name TEXT, amount REAL);" for i in range(400))


class Recording(FakeTransport):
    """Answers each call when the test releases it; records the worker of every call and its prefix length."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, int]] = []
        self.gates: list[asyncio.Event] = []

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        self.sent.append((worker.name, len(call.spec.prefix)))
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return CallResult({"choices": [{"message": {"content": "ok"}}]})


def chat(question: str) -> CallRequest:
    return CallRequest(
        "/v1/chat/completions",
        {"messages": [{"role": "system", "content": SCHEMA}, {"role": "user", "content": question}], "max_tokens": 50},
    )


@pytest.mark.parametrize(
    ("policy", "caching", "follows"), [("hexgen", True, True), ("hexgen", False, False), ("lw-fcfs", True, False)]
)
async def test_a_second_prompt_with_the_same_schema_goes_where_the_first_one_is(
    tmp_path: Path, policy: str, caching: bool, follows: bool
) -> None:
    cfg = write_config(
        tmp_path, ["http://127.0.0.1:1", "http://127.0.0.1:2"], ["A100", "A100"], policy=policy, prefix_caching=caching
    )
    transport = Recording()
    now = FakeClock()
    gw = fake_gateway(cfg, transport, now)
    await gw.start()
    n_in = len(SCHEMA) // 4
    first = asyncio.create_task(
        gw.run_workflow(TENANT, 600.0, [DagNode("a", "chat", n_in, 50)], [chat("How many?")], route="workflows")
    )
    async with asyncio.timeout(10):
        while not transport.sent:
            await asyncio.sleep(0.001)
    now.t = 5.0  # the first prompt is processed (and cached) by now; its call still decodes
    second = asyncio.create_task(
        gw.run_workflow(TENANT, 600.0, [DagNode("a", "chat", n_in, 50)], [chat("Which one?")], route="workflows")
    )
    async with asyncio.timeout(10):
        while len(transport.sent) < 2:
            await asyncio.sleep(0.001)
    (w1, blocks1), (w2, _) = transport.sent
    assert (w1 == w2) == follows
    assert (blocks1 > 0) == (caching and policy == "hexgen")
    for g in transport.gates:
        g.set()
    await asyncio.gather(first, second)
    await gw.stop()


def test_request_prompt_reads_completions_and_chat_bodies() -> None:
    assert request_prompt({"prompt": "abc"}) == "abc"
    assert request_prompt({"prompt": [1, 2, 3]}) == [1, 2, 3]
    assert request_prompt({"prompt": [[1, 2], [3]]}) is None  # a batch: nothing to hash
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "Q"}]}]
    assert request_prompt({"messages": msgs}) == "<|system|>S<|user|>Q"
    assert request_prompt({"messages": []}) is None
    assert request_prompt({}) is None
