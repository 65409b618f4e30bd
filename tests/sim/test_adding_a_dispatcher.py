"""Adding a dispatcher is one module plus its registration (``docs/architecture.md``, "Adding a dispatcher").

This module is that module: it defines join-the-shortest-queue, registers it with what it reads (the rows'
queue lengths) and a policy that runs it, and drives it through the scheduler and the simulator as any built-in
dispatcher is driven.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from gateway.bench.simbench import Setup
from gateway.config import load_cluster
from gateway.core.dispatchers import DISPATCHERS, Capabilities, DispatchView, Rng, register_dispatcher
from gateway.core.policy import POLICIES, Policy, register_policy
from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from gateway.sim.simulator import Simulator
from gateway.sim.workload import load_queries


class JoinShortestQueue:
    """Join the shortest queue: the fewest calls queued and in flight; ties to the lower position."""

    calls = 0
    """Choices made by every instance (the test's evidence that the simulator asked this dispatcher)."""

    def choose(self, view: DispatchView) -> int:
        """Position of the worker with the fewest calls queued and in flight."""
        JoinShortestQueue.calls += 1
        lengths = [view.rows[w].queued + view.rows[w].inflight for w in view.workers]
        return lengths.index(min(lengths))


def make_jsq(rng: Rng) -> JoinShortestQueue:
    """One per scheduler (it needs no randomness)."""
    return JoinShortestQueue()


@pytest.fixture
def jsq() -> Iterator[str]:
    """``jsq`` registered with its policy ``jsq-fcfs`` for the test, gone after it."""
    register_dispatcher("jsq", make_jsq, Capabilities(queue_len=True))
    register_policy(Policy("jsq-fcfs", "jsq", "fcfs", "join the shortest queue", "baseline"))
    JoinShortestQueue.calls = 0
    yield "jsq-fcfs"
    del POLICIES["jsq-fcfs"]
    del DISPATCHERS["jsq"]


def _call(cid: int) -> Call:
    spec = CallSpec("generate_candidate", 1000, 50)
    return Call(cid, StagedWorkflow(cid, "t", 0.0, 1e6, [Stage(spec.kind, (spec,))]), spec, 0.0)


def test_the_scheduler_runs_a_registered_dispatcher_and_fills_what_it_declares(jsq: str) -> None:
    profile = load_cluster("paper-4gpu")[0].profile
    workers = [WorkerInfo(f"w{i}", profile, 4) for i in range(3)]
    sched = Scheduler(workers, jsq, random.Random(0))
    assert [sched.submit(_call(i), 0.0) for i in range(4)] == [0, 1, 2, 0]  # the queues it reads are filled
    assert sched.pop_next(1, 0.0) is not None  # in flight counts as much as queued
    assert sched.submit(_call(4), 0.0) == 1
    sched.set_eligible(1, False)
    assert sched.submit(_call(5), 0.0) == 2  # positions are in the eligible workers
    assert JoinShortestQueue.calls == 6


def test_the_simulator_runs_a_registered_dispatcher(jsq: str) -> None:
    workers = load_cluster("paper-4gpu")
    queries = load_queries("chess-bird", 30, random.Random(1))
    setup = Setup(workers=workers, queries=queries, trace="chess-bird", n_workflows=30, slo_scale=3.0, seed=1)
    res = Simulator(workers, jsq, seed=1).run(setup.workflows(0.8 * setup.bound.rate_qps))
    assert res.unfinished == 0 and len(res.workflows) == 30
    assert JoinShortestQueue.calls == res.num_calls  # every call placed by it
    assert all(sum(counts.values()) > 0 for counts in res.dispatch_counts)
