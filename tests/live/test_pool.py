"""Worker pool units: the vLLM waiting-queue hold, parked calls, cancellation."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from gateway.config.gateway import load_gateway_config
from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import CallSpec, Stage, StagedWorkflow
from gateway.errors import CallFailed
from gateway.live.metrics import GatewayMetrics
from gateway.live.pool import WorkerPool
from gateway.live.promparse import WorkerMetrics
from gateway.live.transport import CallResult, LiveCall
from tests.live.harness import write_config


class Hold:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.sent = 0

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        self.sent += 1
        await self.release.wait()
        return CallResult({})

    async def probe(self, worker: WorkerInfo) -> bool:
        return True

    async def scrape(self, worker: WorkerInfo) -> str:
        return ""

    async def aclose(self) -> None:
        pass


def _pool(tmp: Path, transport: Hold, clock: list[float]) -> WorkerPool:
    loaded = load_gateway_config(write_config(tmp, ["http://127.0.0.1:1"], ["A100"]))
    sched = Scheduler(loaded.workers, "hexgen", random.Random(0))
    return WorkerPool(
        sched,
        transport,
        GatewayMetrics([w.name for w in loaded.workers], []),
        clock=lambda: clock[0],
        health_period_s=0,
        scrape_period_s=0,
        parked_timeout_s=5.0,
    )


def _call(i: int, outcomes: list[object]) -> LiveCall:
    wf = StagedWorkflow(i, "t", 0.0, 100.0, [Stage("k", (CallSpec("k", 10, 2),))])
    return LiveCall(id=i, workflow=wf, spec=CallSpec("k", 10, 2), ready_at=0.0, on_done=lambda c, o: outcomes.append(o))


def _m(waiting: float) -> WorkerMetrics:
    return WorkerMetrics(0.0, waiting, 0.1, None, None, None, None, None, None)


async def test_growing_vllm_waiting_queue_holds_dispatch(tmp_path: Path) -> None:
    t = Hold()
    clock = [0.0]
    pool = _pool(tmp_path, t, clock)
    await pool.start()
    st = pool.workers[0]
    try:
        out: list[object] = []
        pool.submit(_call(1, out))
        await asyncio.sleep(0.01)
        assert t.sent == 1
        pool.monitor.apply_scrape(st, _m(0.0))
        pool.monitor.apply_scrape(st, _m(3.0))  # vLLM's own queue grows: hold
        assert st.held
        pool.submit(_call(2, out))
        await asyncio.sleep(0.01)
        assert t.sent == 1 and pool.scheduler.queue_len(0) == 1
        pool.monitor.apply_scrape(st, _m(3.0))  # not growing any more: release
        assert not st.held
        await asyncio.sleep(0.01)
        assert t.sent == 2
        t.release.set()
        await asyncio.sleep(0.01)
        assert len(out) == 2 and all(isinstance(o, CallResult) for o in out)
    finally:
        await pool.stop()


async def test_parked_calls_wait_for_a_worker_then_fail_with_503(tmp_path: Path) -> None:
    t = Hold()
    clock = [0.0]
    pool = _pool(tmp_path, t, clock)
    await pool.start()
    st = pool.workers[0]
    try:
        pool.mark_down(st, "test")
        out: list[object] = []
        pool.submit(_call(1, out))
        pool.submit(_call(2, out))
        assert len(pool.parked) == 2
        pool.mark_up(st)  # comes back: parked calls are dispatched
        await asyncio.sleep(0.01)
        assert not pool.parked and t.sent == 2
        t.release.set()
        await asyncio.sleep(0.01)
        pool.mark_down(st, "test again")
        pool.submit(_call(3, out))
        clock[0] = 6.0
        pool.expire_parked()
        assert isinstance(out[-1], CallFailed) and out[-1].status == 503 and "no healthy worker" in str(out[-1])
    finally:
        await pool.stop()


async def test_cancel_takes_queued_and_in_flight_calls_back(tmp_path: Path) -> None:
    t = Hold()
    clock = [0.0]
    pool = _pool(tmp_path, t, clock)
    await pool.start()
    try:
        out: list[object] = []
        calls = [_call(i, out) for i in range(6)]
        for c in calls:
            pool.submit(c)
        await asyncio.sleep(0.01)
        assert t.sent == 4 and pool.scheduler.queue_len(0) == 2
        pool.cancel(calls[5])  # queued
        assert pool.scheduler.queue_len(0) == 1
        pool.cancel(calls[0])  # in flight
        await asyncio.sleep(0.01)
        assert pool.scheduler.inflight(0) == 4  # the freed slot went to the remaining queued call
        assert any(isinstance(o, CallFailed) for o in out)
        t.release.set()
        await asyncio.sleep(0.01)
        assert pool.scheduler.inflight(0) == 0
    finally:
        await pool.stop()
