"""Queue disciplines: urgency order, EDF, LLF, FCFS and VTC fair share."""

from __future__ import annotations

import itertools

import pytest

from gateway.core.queues import (
    QUEUES,
    FcfsQueue,
    KeyedQueue,
    VtcCounters,
    VtcQueue,
    register_queue,
    urgency_key,
)
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow


def wf(tenant: str = "t", deadline: float = 100.0, wid: int = 0) -> StagedWorkflow:
    return StagedWorkflow(wid, tenant, 0.0, deadline, [Stage("x", (CallSpec("x", 1, 1),))])


_SEQ = itertools.count(1)


def call(
    *,
    ready: float = 0.0,
    budget: float = 10.0,
    t_comp: float = 1.0,
    deadline: float = 100.0,
    remaining: float = 0.0,
    tenant: str = "t",
    tokens: tuple[int, int] = (100, 10),
) -> Call:
    n = next(_SEQ)
    c = Call(n, wf(tenant, deadline), CallSpec("x", *tokens), ready, seq=n)
    c.budget, c.t_comp, c.remaining_cost = budget, t_comp, remaining
    return c


def drain(q: object, now: float = 0.0) -> list[Call]:
    out = []
    while (c := q.pop(now)) is not None:  # type: ignore[attr-defined]
        out.append(c)
    return out


def test_urgency_queue_pops_tightest_slack_first() -> None:
    q = QUEUES["urgency"].family()()
    relaxed = call(ready=0.0, budget=50.0, t_comp=5.0)  # slack 45
    tight = call(ready=0.0, budget=10.0, t_comp=8.0)  # slack 2
    waited = call(ready=-30.0, budget=40.0, t_comp=5.0)  # waited 30 s: slack 5
    for c in (relaxed, tight, waited):
        q.push(c)
    assert drain(q) == [tight, waited, relaxed]


def test_urgency_equals_documented_formula_at_any_now() -> None:
    # U = t_comp - (budget - (now - ready)); order by U descending == key ascending.
    cs = [call(ready=r, budget=b, t_comp=t) for r, b, t in [(0, 10, 3), (5, 4, 1), (-2, 20, 9), (1, 1, 0.5)]]
    for now in (0.0, 7.0, 100.0):
        by_u = sorted(cs, key=lambda c: -(c.t_comp - (c.budget - (now - c.ready_at))))
        assert sorted(cs, key=urgency_key) == by_u


def test_urgency_ties_are_fifo() -> None:
    q = KeyedQueue(urgency_key)
    a, b = call(budget=5.0), call(budget=5.0)
    q.push(b)
    q.push(a)
    # Same key: submission order (seq) decides, not push order.
    assert drain(q) == [a, b]


@pytest.mark.parametrize(
    ("discipline", "fields", "expected_order"),
    [
        ("edf", [{"deadline": 50.0}, {"deadline": 20.0}, {"deadline": 30.0}], [1, 2, 0]),
        # llf: deadline - t_comp - remaining: 100-10-80=10, 60-5-0=55, 70-30-30=10 (tie: FIFO)
        (
            "llf",
            [
                {"deadline": 100.0, "t_comp": 10.0, "remaining": 80.0},
                {"deadline": 60.0, "t_comp": 5.0},
                {"deadline": 70.0, "t_comp": 30.0, "remaining": 30.0},
            ],
            [0, 2, 1],
        ),
        ("fcfs", [{"deadline": 50.0}, {"deadline": 20.0}, {"deadline": 30.0}], [0, 1, 2]),
    ],
)
def test_deadline_disciplines_table(discipline: str, fields: list[dict[str, float]], expected_order: list[int]) -> None:
    q = QUEUES[discipline].family()()
    cs = [call(**f) for f in fields]  # type: ignore[arg-type]
    for c in cs:
        q.push(c)
    assert drain(q) == [cs[i] for i in expected_order]


def test_keyed_queue_remove_skips_removed_call() -> None:
    q = KeyedQueue(urgency_key)
    a, b = call(budget=1.0), call(budget=2.0)
    q.push(a)
    q.push(b)
    assert q.remove(a) and not q.remove(a)
    assert len(q) == 1 and drain(q) == [b]


def test_fcfs_remove() -> None:
    q = FcfsQueue()
    a, b = call(), call()
    q.push(a)
    q.push(b)
    assert q.remove(a) and list(q) == [b]


def test_vtc_serves_the_tenant_with_less_service_first() -> None:
    counters = VtcCounters()
    q = VtcQueue(counters)
    heavy = [call(tenant="heavy", tokens=(1000, 100)) for _ in range(3)]
    light = [call(tenant="light", tokens=(100, 10)) for _ in range(3)]
    for c in heavy + light:
        q.push(c)
    order = [c.tenant for c in drain(q)]
    # heavy is first by age, then light is served until it has caught up with heavy's 1200 tokens.
    assert order == ["heavy", "light", "light", "light", "heavy", "heavy"]


def test_vtc_lifts_a_newly_backlogged_tenant_so_idling_earns_no_credit() -> None:
    counters = VtcCounters()
    q = VtcQueue(counters)
    for _ in range(5):
        q.push(call(tenant="busy", tokens=(1000, 0)))
    for _ in range(3):
        q.pop(0.0)
    assert counters.counter["busy"] == 3000
    q.push(call(tenant="late", tokens=(10, 0)))
    # The late tenant starts at the smallest backlogged counter, not at 0.
    assert counters.counter["late"] == 3000


def test_vtc_counters_are_shared_between_worker_queues() -> None:
    family = QUEUES["vtc"].family()
    q1, q2 = family(), family()
    q1.push(call(tenant="a", tokens=(500, 0)))
    q1.push(call(tenant="b", tokens=(500, 0)))
    assert q1.pop(0.0).tenant == "a"  # type: ignore[union-attr]
    # q2 never served anyone, but tenant a was served on q1: b goes first on q2.
    q2.push(call(tenant="a", tokens=(10, 0)))
    q2.push(call(tenant="b", tokens=(10, 0)))
    assert q2.pop(0.0).tenant == "b"  # type: ignore[union-attr]


def test_duplicate_queue_registration_raises() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_queue("fcfs", lambda: FcfsQueue)


def test_vtc_tenant_weights_split_service_in_proportion() -> None:
    import random as _random

    from gateway.config import load_gpu_catalog
    from gateway.core.scheduler import Scheduler, WorkerInfo
    from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow

    prof = load_gpu_catalog().profile("A100", "llama-3.1-70b")
    s = Scheduler([WorkerInfo("w", prof, 1)], "vtc", _random.Random(0))
    s.set_tenant_weights({"gold": 2.0, "bronze": 1.0})
    spec = CallSpec("k", 100, 10)
    n = 0
    for tenant in ("gold", "bronze"):
        wf = StagedWorkflow(0, tenant, 0.0, 1e9, [Stage("k", (spec,))])
        for _ in range(60):
            n += 1
            s.submit(Call(n, wf, spec, 0.0), 0.0)
    served = [s.pop_next(0, 0.0) for _ in range(60)]
    gold = sum(1 for c in served if c is not None and c.tenant == "gold")
    assert gold == 40  # 2:1 while both are backlogged


def test_a_call_resubmitted_after_removal_counts_once_and_leaves_no_ghost() -> None:
    """Drained off a worker, resubmitted elsewhere with a new seq: the stale heap entry of the first queue
    must not show in it, be removable again, or make its length negative."""
    for name in ("urgency", "edf", "llf"):
        q = QUEUES[name].family()()
        other = QUEUES[name].family()()
        c = call()
        q.push(c)
        assert q.remove(c) and len(q) == 0
        c.seq = next(_SEQ)  # the scheduler gives a resubmitted call a new seq
        other.push(c)
        assert list(q) == [] and not q.remove(c) and len(q) == 0, name
        assert q.pop(0.0) is None and len(other) == 1 and other.pop(0.0) is c
        c.seq = next(_SEQ)
        q.push(c)  # and back on the first queue again: a live entry beside the stale one
        assert len(q) == 1 and list(q) == [c] and q.remove(c) and len(q) == 0 and q.pop(0.0) is None


@pytest.mark.parametrize("discipline", sorted(QUEUES))
def test_best_effort_calls_wait_behind_every_other_call(discipline: str) -> None:
    q = QUEUES[discipline].family()()
    late = call(budget=0.1, deadline=1.0)
    late.best_effort = True  # the most urgent by every key, but demoted
    normal = [call(budget=50.0, deadline=100.0), call(budget=60.0, deadline=200.0)]
    q.push(late)
    for c in normal:
        q.push(c)
    assert len(q) == 3 and list(q)[-1] is late
    out = drain(q)
    assert out[-1] is late and set(out[:2]) == set(normal)


def test_best_effort_call_can_be_removed() -> None:
    q = QUEUES["urgency"].family()()
    c = call()
    c.best_effort = True
    q.push(c)
    assert q.remove(c) and not q.remove(c) and len(q) == 0


def test_the_deadline_ordered_disciplines_declare_it_at_registration() -> None:
    assert {n for n, q in QUEUES.items() if q.deadline_ordered} == {"urgency", "edf", "llf"}
