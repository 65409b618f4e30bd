"""The pool's monitor: health probes take workers in and out, scrapes hold dispatch and feed status."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import generate_latest

from gateway.core.worker import WorkerInfo
from gateway.live.transport import CallResult
from gateway.profiling.promparse import WorkerMetrics
from tests.fakes import FakeClock
from tests.live.fake_transport import Hold, fake_pool, one_call


def _m(waiting: float, kv: float | None = 0.95, running: float | None = 0.0) -> WorkerMetrics:
    return WorkerMetrics(running, waiting, kv, None, None, None, None, None, None)


async def test_growing_vllm_waiting_queue_holds_dispatch(tmp_path: Path) -> None:
    t = Hold()
    clock = FakeClock()
    pool = fake_pool(tmp_path, t, clock)
    await pool.start()
    st = pool.workers[0]
    try:
        out: list[object] = []
        pool.submit(one_call(1, out))
        await asyncio.sleep(0.01)
        assert t.sent == 1
        pool.monitor.apply_scrape(st, _m(0.0))
        pool.monitor.apply_scrape(st, _m(3.0))  # vLLM's own queue grows: hold
        assert st.held
        pool.submit(one_call(2, out))
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


async def test_failed_probes_mark_a_worker_down_after_the_threshold_and_a_success_brings_it_back(
    tmp_path: Path,
) -> None:
    t = Hold()
    pool = fake_pool(tmp_path, t, FakeClock())
    st = pool.workers[0]
    t.healthy = False
    await pool.monitor.check_health()
    assert st.up and st.failures == 1, "one failed probe is not enough (failures_to_down is 2)"
    await pool.monitor.check_health()
    assert not st.up and pool.healthy == 0
    t.healthy = True
    await pool.monitor.check_health()
    assert st.up and st.failures == 0 and pool.healthy == 1


async def test_a_worker_that_fails_the_initial_probe_starts_down(tmp_path: Path) -> None:
    t = Hold()
    t.healthy = False
    pool = fake_pool(tmp_path, t, FakeClock())
    await pool.monitor.check_health(initial=True)
    assert not pool.workers[0].up


async def test_a_scrape_shows_in_status_and_a_bad_one_is_counted(tmp_path: Path) -> None:
    t = Hold()
    clock = FakeClock()
    pool = fake_pool(tmp_path, t, clock)
    st = pool.workers[0]
    assert pool.status()[0]["vllm"] is None, "nothing scraped yet"
    model = f'{{model_name="{st.info.served_model}"}}'
    t.metrics_text = f"vllm:num_requests_waiting{model} 2\nvllm:num_requests_running{model} 3\n"
    await pool.monitor.scrape_all()
    clock.t = 1.5
    assert pool.status()[0]["vllm"] == {"running": 3.0, "waiting": 2.0, "kv_cache_usage": None, "age_s": 1.5}
    t.metrics_text = "this is { not prometheus"
    await pool.monitor.scrape_all()
    failures = pool.metrics.scrape_failures.labels(worker=st.name)._value.get()
    assert failures == 1 and st.metrics is not None and st.metrics.waiting == 2.0, "a bad scrape keeps the last"


class _SlowScrape(Hold):
    """A scrape that waits for ``go``: the worker can be removed while it is in flight."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.started = asyncio.Event()
        self.metrics_text = text

    async def scrape(self, worker: WorkerInfo) -> str:
        self.started.set()
        await self.go.wait()
        return self.metrics_text


async def test_a_scrape_that_returns_after_its_worker_was_removed_recreates_no_series(tmp_path: Path) -> None:
    for text in ('vllm:num_requests_waiting{model_name="m"} 1\n', "this is { not prometheus"):
        t = _SlowScrape(text)
        pool = fake_pool(tmp_path, t, FakeClock())
        st = pool.workers[0]
        scrape = asyncio.create_task(pool.monitor.scrape_all())
        await t.started.wait()
        pool.remove_worker(st)
        assert pool.by_name(st.name) is None
        before = generate_latest(pool.metrics.registry).decode()
        assert f'worker="{st.name}"' not in before
        t.go.set()
        await scrape
        after = generate_latest(pool.metrics.registry).decode()
        assert f'worker="{st.name}"' not in after, f"a late scrape ({text!r}) recreated the removed worker's series"


def test_a_waiting_queue_on_an_engine_with_room_does_not_hold(tmp_path: Path) -> None:
    """Prompts wait a moment in vLLM's queue whenever they arrive faster than one iteration takes them; with
    the KV cache and the batch far from full that is no reason to idle the gateway's queue."""
    pool = fake_pool(tmp_path, Hold(), FakeClock())
    st = pool.workers[0]
    cap = st.info.profile.max_num_seqs
    mon = pool.monitor
    mon.apply_scrape(st, _m(0.0, kv=0.3, running=4.0))
    mon.apply_scrape(st, _m(5.0, kv=0.3, running=4.0))
    assert not st.held, "room in the KV cache and the batch"
    mon.apply_scrape(st, _m(9.0, kv=0.3, running=float(cap)))
    assert st.held, "the batch is at max_num_seqs and the queue grows"
    mon.apply_scrape(st, _m(9.0, kv=0.3, running=float(cap)))
    assert not st.held, "full but no longer growing"
    mon.apply_scrape(st, _m(12.0, kv=0.92, running=4.0))
    assert st.held, "the KV cache is full and the queue grows"
    mon.apply_scrape(st, _m(1.0, kv=0.92, running=4.0))
    assert not st.held, "the queue shrank"


def test_without_engine_gauges_the_hold_needs_the_queue_in_two_scrapes_running(tmp_path: Path) -> None:
    pool = fake_pool(tmp_path, Hold(), FakeClock())
    st = pool.workers[0]
    mon = pool.monitor
    mon.apply_scrape(st, _m(0.0, kv=None, running=None))
    mon.apply_scrape(st, _m(2.0, kv=None, running=None))
    assert not st.held, "one scrape with a queue is a moment's wait"
    mon.apply_scrape(st, _m(4.0, kv=None, running=None))
    assert st.held
