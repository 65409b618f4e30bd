"""A settled call and a finished workflow are freed by reference counting alone: with the cyclic garbage
collector off, nothing of theirs is left behind (no reference cycle per call for the collector to find),
whether the workflow met its deadline, failed, or was cancelled, DAG or stage by stage."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.config.gateway import load_gateway_config
from gateway.core.admission import Admission
from gateway.core.dag import DagNode, DagWorkflow
from gateway.core.predict import CompletionPredictor, calls_plan, dag_plan
from gateway.core.records import CallOutcome
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import CallSpec, OnlineWorkflow
from gateway.errors import CallFailed, WorkerError
from gateway.live.runner import CallRequest, Running, _Execution
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant
from gateway.live.transport import CallResult, LiveCall
from tests.live.fake_transport import FakeTransport, fake_gateway
from tests.live.harness import write_config

TENANT = Tenant("t", 10.0, 1.0, 100.0, 1.0, 100)
OURS = (LiveCall, _Execution, CallOutcome, CompletionPredictor, DagWorkflow, OnlineWorkflow)
DIAMOND = [
    DagNode("a", "k", 10, 2),
    DagNode("b", "k", 10, 2, ("a",)),
    DagNode("c", "k", 10, 2, ("a",)),
    DagNode("d", "k", 10, 2, ("b", "c")),
]


class Scripted(FakeTransport):
    """Answers by the prompt: ``ok``, ``refuse`` (a 400), ``flaky`` (a worker error on the first attempt),
    ``hang`` (never answers)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[int] = set()

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        await asyncio.sleep(0)
        prompt = call.body["messages"][0]["content"]
        if prompt == "refuse":
            raise CallFailed("bad request", 400)
        if prompt == "flaky" and call.id not in self.seen:
            self.seen.add(call.id)
            raise WorkerError("connection reset")
        if prompt == "hang":
            await asyncio.sleep(3600)
        return CallResult({"choices": [{"message": {"content": "x"}}]}, 1, 1)


def _req(prompt: str) -> CallRequest:
    return CallRequest("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]})


async def _settle_loop() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


@contextmanager
def _collector_off() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _live_calls() -> int:
    return sum(1 for o in gc.get_objects() if type(o) is LiveCall)


async def _cancel_after_start(work: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(work)
    await _settle_loop()  # its first calls are queued and in flight
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def _scenarios(gw: Gateway) -> dict[str, Callable[[], Awaitable[Any]]]:
    def dag(prompts: list[str]) -> Callable[[], Awaitable[Any]]:
        # Admitted with its plan: admission predicts its completion, and each submitted call's work is
        # taken off the committed work (a predictor each).
        return lambda: gw.run_workflow(
            TENANT,
            50.0,
            DIAMOND,
            [_req(p) for p in prompts],
            admission=gw.admit(TENANT, 4, dag_plan(DIAMOND), 50.0),
            route="workflows",
        )

    def stage_admission(n: int) -> Admission:
        return gw.admit(TENANT, n, calls_plan([[CallSpec("k", 10, 2)] * n]), 50.0)

    async def stage(prompts: list[str]) -> None:
        wf = gw.open_workflow(TENANT, 50.0, None, admission=stage_admission(len(prompts)), route="text2sql")
        await gw.run_stage(wf, "k", [(CallSpec("k", 10, 2), _req(p)) for p in prompts])
        gw.close_workflow(wf)

    async def stage_cancelled() -> None:
        wf = gw.open_workflow(TENANT, 50.0, None, admission=stage_admission(2), route="text2sql")
        try:
            await _cancel_after_start(gw.run_stage(wf, "k", [(CallSpec("k", 10, 2), _req("hang"))] * 2))
        finally:
            gw.close_workflow(wf, cancelled=True)

    return {
        "met": dag(["ok"] * 4),
        "retried": dag(["ok", "flaky", "ok", "ok"]),
        "failed": dag(["ok", "refuse", "hang", "ok"]),  # c is cancelled in flight when b fails
        "cancelled": lambda: _cancel_after_start(dag(["ok", "hang", "hang", "ok"])()),
        "stage": lambda: stage(["ok", "refuse"]),
        "stage-cancelled": stage_cancelled,
    }


@pytest.mark.parametrize("scenario", ["met", "retried", "failed", "cancelled", "stage", "stage-cancelled"])
async def test_a_finished_workflow_is_freed_without_the_cyclic_collector(tmp_path: Path, scenario: str) -> None:
    cfg = write_config(
        tmp_path, ["http://127.0.0.1:9", "http://127.0.0.1:10"], ["A100", "A100"], health={"failures_to_down": 100}
    )
    gw = fake_gateway(cfg, Scripted())
    await gw.start()
    executions: list[weakref.ref[_Execution]] = []
    begin = gw.runner.begin

    def watch(run: Running) -> None:
        if isinstance(run, _Execution):
            executions.append(weakref.ref(run))
        begin(run)

    gw.runner.begin = watch  # type: ignore[method-assign]
    run = _scenarios(gw)[scenario]
    try:
        await run()  # warm up (lazily built caches, first-use state) before counting
        await _settle_loop()
        gc.collect()
        with _collector_off():
            before = _live_calls()
            executions.clear()
            for _ in range(3):
                await run()
            await _settle_loop()
            assert gw.active_total == 0
            assert all(ref() is None for ref in executions), "a finished workflow's execution is still alive"
            assert _live_calls() == before, "a settled call is still alive"
            # The collector would find nothing of ours either.
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                gc.collect()
                ours = [o for o in gc.garbage if type(o) in OURS]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
            assert ours == []
    finally:
        await gw.stop()


async def test_pass_through_calls_leave_no_cycles_of_ours(tmp_path: Path) -> None:
    """The whole per-call path of a chat or text completion (the fast path, admission, the pool, the calls'
    HTTP client against a real socket, the answer passed through), plain and streamed: with the collector
    off, nothing from the gateway's modules is left for it to find."""
    import httpx

    from gateway.bench.nullworker import NullWorker
    from gateway.live.server import build_app
    from tests.live.harness import INTERACTIVE_KEY

    loop = asyncio.get_running_loop()
    server = await loop.create_server(NullWorker, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    app = build_app(load_gateway_config(write_config(tmp_path, [url], ["A100"], time_scale=0.001)))
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    bodies = [
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", {**chat, "stream": True}),
        ("/v1/completions", {"prompt": "SELECT", "max_tokens": 2}),
    ]
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://gw",
                headers={"Authorization": f"Bearer {INTERACTIVE_KEY}"},
            ) as client,
        ):

            async def calls() -> None:
                for path, body in bodies:
                    r = await client.post(path, json=body)
                    assert r.status_code == 200, r.text

            await calls()  # warm up
            await _settle_loop()
            gc.collect()
            with _collector_off():
                for _ in range(5):
                    await calls()
                await _settle_loop()
                gc.set_debug(gc.DEBUG_SAVEALL)
                try:
                    gc.collect()
                    ours = [type(o) for o in gc.garbage if type(o).__module__.startswith("gateway.")]
                finally:
                    gc.set_debug(0)
                    gc.garbage.clear()
                assert ours == []
    finally:
        server.close()
        await server.wait_closed()
