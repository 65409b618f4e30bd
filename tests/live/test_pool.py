"""Worker pool units: parked calls, cancellation, capacity changes, draining."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.core.worker import WorkerInfo
from gateway.errors import CallFailed
from gateway.live.logs import REQUEST_ID
from gateway.live.transport import CallResult, LiveCall
from tests.fakes import FakeClock
from tests.live.fake_transport import Hold, fake_gateway, fake_pool, one_call
from tests.live.harness import write_config


async def test_parked_calls_wait_for_a_worker_then_fail_with_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="hexflow")
    t = Hold()
    clock = FakeClock()
    pool = fake_pool(tmp_path, t, clock, limits={"parked_timeout_s": 5.0})
    await pool.start()
    st = pool.workers[0]
    try:
        pool.mark_down(st, "test")
        out: list[object] = []
        pool.submit(one_call(1, out))
        pool.submit(one_call(2, out))
        assert len(pool.parked) == 2
        pool.mark_up(st)  # comes back: parked calls are dispatched
        back = [r for r in caplog.records if r.getMessage() == f"worker {st.name} is up again"]
        assert [r.levelname for r in back] == ["INFO"]  # a recovery is normal operation, not a warning
        await asyncio.sleep(0.01)
        assert not pool.parked and t.sent == 2
        t.release.set()
        await asyncio.sleep(0.01)
        pool.mark_down(st, "test again")
        pool.submit(one_call(3, out))
        clock.t = 6.0
        pool.expire_parked()
        assert isinstance(out[-1], CallFailed) and out[-1].status == 503 and "no healthy worker" in str(out[-1])
    finally:
        await pool.stop()


async def test_cancel_takes_queued_and_in_flight_calls_back(tmp_path: Path) -> None:
    t = Hold()
    clock = FakeClock()
    pool = fake_pool(tmp_path, t, clock)
    await pool.start()
    try:
        out: list[object] = []
        calls = [one_call(i, out) for i in range(6)]
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


async def test_set_capacity_changes_the_one_capacity_that_dispatch_and_status_read(tmp_path: Path) -> None:
    t = Hold()
    pool = fake_pool(tmp_path, t, FakeClock())
    await pool.start()
    st = pool.workers[0]
    try:
        out: list[object] = []
        for i in range(6):
            pool.submit(one_call(i, out))
        await asyncio.sleep(0.01)
        assert t.sent == 4
        pool.set_capacity(st, 5)
        await asyncio.sleep(0.01)
        assert t.sent == 5, "the worker is drained into the new slot"
        assert st.info is pool.scheduler.workers[st.index] and st.info.capacity == 5
        assert pool.status()[0]["capacity"] == 5
    finally:
        t.release.set()
        await pool.stop()


async def test_the_gateway_closes_its_transport_when_it_stops(tmp_path: Path) -> None:
    t = Hold()
    gw = fake_gateway(write_config(tmp_path, ["http://127.0.0.1:1"], ["A100"]), t)
    await gw.start()
    await gw.stop()
    assert t.closed == 1


async def test_served_models_follow_the_membership(tmp_path: Path) -> None:
    """The served models are computed once per membership: a worker added, being removed, or gone shows."""
    t = Hold()
    pool = fake_pool(tmp_path, t, FakeClock())
    await pool.start()
    try:
        first = pool.workers[0].info
        assert pool.served_models() == (first.served_model,)
        assert pool.served_models() is pool.served_models()  # cached
        st = pool.add_worker(replace(first, name="other", url="http://127.0.0.1:2", served_model="another-model"))
        assert pool.served_models() == tuple(sorted({first.served_model, "another-model"}))
        pool.remove_worker(st)  # nothing in flight: gone at once
        assert not pool.is_member(st)
        assert pool.served_models() == (first.served_model,)
        out: list[object] = []
        pool.submit(one_call(1, out))
        await asyncio.sleep(0.01)
        busy = pool.workers[0]
        pool.remove_worker(busy)  # a call in flight: being removed, its model no longer offered
        assert pool.is_member(busy) and pool.served_models() == ()
        t.release.set()
        await asyncio.sleep(0.01)
        assert not pool.is_member(busy) and pool.served_models() == ()
    finally:
        t.release.set()
        await pool.stop()


class _SeesRequestId(Hold):
    """Records the request id of the context each call is sent in."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str | None] = []

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        self.ids.append(REQUEST_ID.get())
        return await super().send(worker, call)


async def test_calls_are_sent_in_the_pools_context_not_in_the_submitting_requests(tmp_path: Path) -> None:
    """Whichever request's submission or completion drains a worker, the calls it sends are not logged as
    that request's (the pool's own, as when each worker had a drain loop task)."""
    t = _SeesRequestId()
    pool = fake_pool(tmp_path, t, FakeClock())
    await pool.start()
    await asyncio.sleep(0.01)  # the start's own drain is done
    try:
        out: list[object] = []
        token = REQUEST_ID.set("req-1")
        try:
            for i in range(6):  # four sent after the submissions, two when slots free
                pool.submit(one_call(i, out))
        finally:
            REQUEST_ID.reset(token)
        await asyncio.sleep(0.01)
        assert t.sent == 4
        t.release.set()
        await asyncio.sleep(0.01)
        assert t.sent == 6 and len(out) == 6
        assert t.ids == [None] * 6
    finally:
        await pool.stop()


async def test_calls_submitted_before_start_are_sent_when_it_starts(tmp_path: Path) -> None:
    t = Hold()
    pool = fake_pool(tmp_path, t, FakeClock())
    out: list[object] = []
    for i in range(2):
        pool.submit(one_call(i, out))
    await asyncio.sleep(0.01)
    assert t.sent == 0 and pool.scheduler.queue_len(0) == 2
    await pool.start()
    try:
        await asyncio.sleep(0.01)
        assert t.sent == 2
    finally:
        t.release.set()
        await pool.stop()


async def test_drain_kicked_sends_the_queued_calls_without_waiting_for_the_event_loop(tmp_path: Path) -> None:
    t = Hold()
    pool = fake_pool(tmp_path, t, FakeClock())
    await pool.start()
    await asyncio.sleep(0.01)
    try:
        out: list[object] = []
        calls = [one_call(i, out) for i in range(6)]
        for c in calls:
            pool.submit(c)
        pool.drain_kicked()  # no turn of the event loop in between
        sent = [c for c in calls if c.task is not None]
        assert len(sent) == 4 and pool.scheduler.queue_len(0) == 2
        pool.drain_kicked()  # nothing is pending any more: a no-op
        assert sum(c.task is not None for c in calls) == 4
        await asyncio.sleep(0.01)
        assert t.sent == 4
    finally:
        t.release.set()
        await pool.stop()


async def test_a_call_cancelled_before_its_task_ran_is_settled_and_frees_its_slot(tmp_path: Path) -> None:
    t = Hold()
    pool = fake_pool(tmp_path, t, FakeClock())
    await pool.start()
    await asyncio.sleep(0.01)
    try:
        out: list[object] = []
        c = one_call(1, out)
        pool.submit(c)
        pool.drain_kicked()
        assert c.task is not None and pool.scheduler.inflight(0) == 1
        pool.cancel(c)  # in the same turn: its task never runs a step of ``_execute``
        await asyncio.sleep(0.01)
        assert t.sent == 0
        assert pool.scheduler.inflight(0) == 0 and not pool.workers[0].inflight
        assert len(out) == 1 and isinstance(out[0], CallFailed) and out[0].status == 503
        assert c.task is None
    finally:
        t.release.set()
        await pool.stop()
