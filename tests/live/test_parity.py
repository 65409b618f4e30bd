"""Parity: the live gateway and the simulator take the same decisions on the same sequence of events.

The simulator runs a workload and records, for every call, when it was ready, which worker got it,
when it was sent and when its result arrived. The same workload is then driven through the live path —
``Gateway.run_workflow``, the worker pool's drains, ``WorkerPool._execute`` — with a fake clock
and a fake transport that returns each call's result exactly when the simulator says it arrived. Every
call must go to the same worker and be sent at the same time.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from gateway.bench.simbench import fluid_bound
from gateway.config.gateway import load_gateway_config
from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.dag import DagCallSpec, DagWorkflow, chain_nodes
from gateway.core.worker import WorkerInfo
from gateway.live.runner import CallRequest
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant, TenantStore
from gateway.live.transport import CallResult, LiveCall
from gateway.sim.simulator import Simulator
from gateway.sim.workload import generate_chess_bird, poisson_arrivals, to_stages
from tests.fakes import FakeClock
from tests.live.fake_transport import FakeTransport
from tests.live.harness import write_config

GPUS = ["A100", "A100", "A6000", "L40S"]


class ReplayTransport(FakeTransport):
    """Holds every sent call until the test releases its result; records (worker, send time)."""

    def __init__(self, clock: FakeClock, wid_of: dict[int, int]) -> None:
        super().__init__()
        self.clock = clock
        self.wid_of = wid_of
        self.pending: dict[tuple[int, int], asyncio.Future[CallResult]] = {}
        self.sent: list[tuple[int, int, int, float]] = []  # (wid, node, worker, time)

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        assert isinstance(call.spec, DagCallSpec)
        key = (self.wid_of[call.workflow.wid], call.spec.node)
        self.sent.append((*key, call.worker, self.clock()))
        fut: asyncio.Future[CallResult] = asyncio.get_running_loop().create_future()
        self.pending[key] = fut
        return await fut


async def settle() -> None:
    for _ in range(200):
        await asyncio.sleep(0)


@pytest.mark.parametrize("policy", ["hexgen", "p2c-fcfs", "rr-fcfs", "llf"])
async def test_live_path_takes_the_simulators_decisions(tmp_path: Path, policy: str) -> None:
    cfg_path = write_config(tmp_path, [f"http://127.0.0.1:{9000 + i}" for i in range(4)], GPUS, policy=policy)
    loaded = load_gateway_config(cfg_path)
    workers = loaded.workers
    queries = generate_chess_bird(60, random.Random(11))
    # Loaded enough that the gateway's queues form (capacity 4 per worker in the test config).
    rate = 0.8 * fluid_bound(workers, queries)
    arrivals = poisson_arrivals(len(queries), rate, random.Random(12))
    deadline_rel = 200.0
    stages = [[s.calls for s in to_stages(q)] for q in queries]
    dags = [
        DagWorkflow.build(i, "t", a, a + deadline_rel, chain_nodes(st), CHESS_TEMPLATE)
        for i, (a, st) in enumerate(zip(arrivals, stages, strict=True))
    ]
    sim = Simulator(workers, policy, alpha=0.3 if policy == "hexgen" else None, seed=0, record_calls=True)
    res = sim.run([d.shifted(d.arrival, d.deadline) for d in dags])
    assert res.unfinished == 0
    assert max(sim.scheduler.queue_len(i) for i in range(4)) == 0
    queued_somewhere = any(c.queued_s > 1e-9 for c in res.calls)
    assert queued_somewhere, "the workload never queued: the parity test would prove little"

    # The same events, in the simulator's order: arrivals, then each call's result at its time.
    events: list[tuple[float, int, str, tuple[int, int]]] = []
    for i, d in enumerate(dags):
        events.append((d.arrival, 0, "arrive", (i, -1)))
    for k, c in enumerate(res.calls):
        events.append((c.result, 1 + k, "result", (c.wid, c.node)))
    events.sort()

    clock = FakeClock()
    wid_of: dict[int, int] = {}
    transport = ReplayTransport(clock, wid_of)
    tenants = TenantStore.load(loaded.tenants_path)
    gw = Gateway(loaded, tenants, transport, clock=clock, background=False)
    if policy == "hexgen":
        gw.scheduler.alpha = 0.3
    tenant = Tenant("t", 1.0, 1.0, 1e9, 1.0, 10_000)
    await gw.start()
    runs: list[asyncio.Task[object]] = []
    try:
        for t, _, kind, (wid, node) in events:
            clock.t = t
            if kind == "arrive":
                wid_of[len(wid_of) + 1] = wid
                nodes = list(dags[wid].nodes)
                reqs = [CallRequest("/v1/completions", {"prompt": [1], "max_tokens": 1}) for _ in nodes]
                runs.append(
                    asyncio.create_task(
                        gw.run_workflow(tenant, deadline_rel, nodes, reqs, template=CHESS_TEMPLATE, route="workflows")
                    )
                )
            else:
                fut = transport.pending.pop((wid, node), None)
                assert fut is not None, (
                    f"call {(wid, node)} returns at {t:.3f} in the simulator but is not in flight live"
                )
                fut.set_result(CallResult({"choices": []}))
            await settle()
        outcomes = await asyncio.gather(*runs)
    finally:
        await gw.stop()
    assert all(getattr(o, "status", None) == "ok" for o in outcomes)

    live = {(wid, node): (w, t) for wid, node, w, t in transport.sent}
    simd = {(c.wid, c.node): (c.worker, c.ready + c.queued_s) for c in res.calls}
    assert len(live) == len(simd) == res.num_calls
    mismatched = [k for k in simd if live[k][0] != simd[k][0] or abs(live[k][1] - simd[k][1]) > 1e-9]
    assert not mismatched, f"{len(mismatched)} of {len(simd)} calls differ, first {mismatched[0]}"
