"""The scheduler facade: budgets at submit, queue/in-flight accounting, online estimate correction."""

from __future__ import annotations

import random

import pytest

from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.policy import POLICIES
from gateway.core.profile import PerfProfile
from gateway.core.scheduler import NoEligibleWorker, Scheduler, WorkerInfo
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from gateway.errors import UnknownName

SPEC = CallSpec("generate_candidate", 8000, 400)


def one_call_wf(deadline: float = 100.0, tenant: str = "t", wid: int = 0) -> StagedWorkflow:
    return StagedWorkflow(wid, tenant, 0.0, deadline, [Stage(SPEC.kind, (SPEC,))])


def test_unknown_policy_raises_a_clear_error(cluster: list[WorkerInfo]) -> None:
    with pytest.raises(UnknownName, match="unknown policy 'nope'"):
        Scheduler(cluster, "nope", random.Random(0))


def test_submit_sets_budget_from_remaining_deadline(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "hexgen", random.Random(0))
    wf = StagedWorkflow(0, "t", 0.0, 200.0, [Stage(SPEC.kind, (SPEC, SPEC))], CHESS_TEMPLATE)
    specs = wf.start()
    c = Call(1, wf, specs[0], 0.0)
    s.submit(c, 10.0)
    assert c.remaining_cost > 0.0
    expected = (200.0 - 10.0) * c.stage_cost / (c.stage_cost + c.remaining_cost)
    assert c.budget == pytest.approx(expected)
    assert c.ready_at == 10.0


def test_pop_next_moves_call_from_queue_to_in_flight(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "lw-fcfs", random.Random(0))
    c = Call(1, one_call_wf(), SPEC, 0.0)
    w = s.submit(c, 0.0)
    assert s.queue_len(w) == 1 and s.inflight(w) == 0
    assert s.estimator.t_queue(w, 0.0) > 0.0
    assert s.pop_next(w, 1.0) is c
    assert s.queue_len(w) == 0 and s.inflight(w) == 1 and c.started_at == 1.0
    s.on_finish(c, 21.0)
    assert s.inflight(w) == 0 and s.estimator.t_queue(w, 21.0) == 0.0


def test_idle_cluster_sends_heavy_call_to_fast_worker(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "hexgen", random.Random(0), alpha=0.5)
    w = s.submit(Call(1, one_call_wf(), SPEC, 0.0), 0.0)
    assert cluster[w].profile.gpu == "FAST"


def test_lw_spreads_load_then_uses_the_slow_worker(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "lw-fcfs", random.Random(0))
    chosen = [s.submit(Call(i, one_call_wf(wid=i), SPEC, 0.0), 0.0) for i in range(3)]
    assert sorted(chosen) == [0, 1, 2]


def test_observed_latency_corrects_the_estimate_and_goes_stale(fast: PerfProfile) -> None:
    s = Scheduler([WorkerInfo("f", fast, 4)], "lw-fcfs", random.Random(0), ewma=0.5, max_age_s=100.0)
    base = s.estimator.t_comp(0, SPEC.kind, SPEC.input_tokens, SPEC.output_tokens, 0.0)
    for i in range(8):
        c = Call(i, one_call_wf(wid=i), SPEC, 0.0)
        s.submit(c, float(i))
        s.pop_next(0, float(i))
        s.on_finish(c, float(i), observed_s=2.0 * base)
    assert s.estimator.t_comp(0, SPEC.kind, SPEC.input_tokens, SPEC.output_tokens, 8.0) == pytest.approx(
        2 * base, rel=0.01
    )
    # Other stage kinds are unaffected; a stale ratio reads as unknown.
    assert s.estimator.ratio(0, "revise", 8.0) == 1.0
    assert s.estimator.ratio(0, SPEC.kind, 500.0) == 1.0


def test_outlier_observation_is_clamped(fast: PerfProfile) -> None:
    s = Scheduler([WorkerInfo("f", fast, 4)], "lw-fcfs", random.Random(0), ewma=1.0)
    c = Call(1, one_call_wf(), SPEC, 0.0)
    s.submit(c, 0.0)
    s.pop_next(0, 0.0)
    s.on_finish(c, 0.0, observed_s=1e9)
    assert s.estimator.ratio(0, SPEC.kind, 0.0) == s.estimator.clamp


def test_ineligible_workers_get_nothing_and_none_eligible_raises(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "rr-fcfs", random.Random(0))
    s.set_eligible(0, False)
    picks = {s.submit(Call(i, one_call_wf(wid=i), SPEC, 0.0), 0.0) for i in range(6)}
    assert picks == {1, 2}
    for i in range(3):
        s.set_eligible(i, False)
    with pytest.raises(NoEligibleWorker):
        s.submit(Call(99, one_call_wf(), SPEC, 0.0), 0.0)


def test_drain_worker_returns_queued_calls_for_resubmission(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "rr-fcfs", random.Random(0))
    calls = [Call(i, one_call_wf(wid=i), SPEC, 0.0) for i in range(6)]
    for c in calls:
        s.submit(c, 0.0)
    drained = s.drain_worker(0)
    assert drained == [calls[0], calls[3]]
    assert s.queue_len(0) == 0 and s.estimator.t_queue(0, 0.0) == 0.0


def test_on_fail_frees_the_slot_and_counts_the_attempt(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "lw-fcfs", random.Random(0))
    c = Call(1, one_call_wf(), SPEC, 0.0)
    w = s.submit(c, 0.0)
    s.pop_next(w, 0.0)
    s.on_fail(c, 1.0)
    assert s.inflight(w) == 0 and c.attempts == 1 and c.started_at is None


def test_alpha_out_of_range_is_rejected(cluster: list[WorkerInfo]) -> None:
    with pytest.raises(ValueError, match="alpha"):
        Scheduler(cluster, "hexgen", random.Random(0), alpha=1.5)


def test_a_worker_needs_a_capacity_of_at_least_one(fast: PerfProfile) -> None:
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        WorkerInfo("w", fast, 0)


def test_set_capacity_replaces_the_workers_description_that_estimates_read(fast: PerfProfile) -> None:
    # One slot, one call in flight and one queued: a newcomer waits for two returns. With four slots it
    # waits only for the prompts ahead of it.
    s = Scheduler([WorkerInfo("w", fast, 1)], "lw-fcfs", random.Random(0))
    for i in (1, 2):
        s.submit(Call(i, one_call_wf(wid=i), SPEC, 0.0), 0.0)
    s.pop_next(0, 0.0)
    est = s.estimator
    prompts_ahead = est.loads[0].prefill_free_at + est.loads[0].queued_prefill_s
    before = est.t_queue(0, 0.0)
    assert before > prompts_ahead
    s.set_capacity(0, 4)
    assert s.workers[0].capacity == 4 and s.workers[0].name == "w"
    assert est.t_queue(0, 0.0) == pytest.approx(prompts_ahead)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_queued_total_is_the_sum_of_the_queues(cluster: list[WorkerInfo], policy: str) -> None:
    """``queued_total`` (O(1), for admission) follows every way a call enters or leaves a queue."""
    s = Scheduler(cluster, policy, random.Random(0))
    rng = random.Random(1)
    queued: list[Call] = []
    inflight: list[Call] = []
    for i in range(400):
        op = rng.random()
        members = s.members()
        if op < 0.45:
            c = Call(i, one_call_wf(tenant=rng.choice("ab"), wid=i), SPEC, float(i))
            c.best_effort = rng.random() < 0.2
            try:
                s.submit(c, float(i))
                queued.append(c)
            except NoEligibleWorker:
                pass
        elif op < 0.7 and members:
            popped = s.pop_next(rng.choice(members), float(i))
            if popped is not None:
                queued.remove(popped)
                inflight.append(popped)
        elif op < 0.8 and queued:
            c = rng.choice(queued)
            assert s.cancel(c)
            queued.remove(c)
        elif op < 0.85 and inflight:
            c = inflight.pop(rng.randrange(len(inflight)))
            assert not s.cancel(c)  # in flight: not queued
            s.on_finish(c, float(i))
        elif op < 0.9 and members:
            w = rng.choice(members)
            for c in s.drain_worker(w):
                queued.remove(c)
        elif op < 0.95:
            w = rng.choice(range(len(s.workers)))
            s.set_eligible(w, not s.eligible[w] and s.member[w])
        else:  # membership: remove an idle worker, or add one back into a free slot
            idle = [w for w in members if s.queue_len(w) == 0 and s.inflight(w) == 0]
            if idle and len(members) > 1:
                s.remove_worker(rng.choice(idle))
            else:
                s.add_worker(cluster[rng.randrange(len(cluster))])
        assert s.queued_total() == sum(s.queue_len(w) for w in s.members()) == len(queued)


def test_eligible_workers_follow_eligibility_and_membership(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "rr-fcfs", random.Random(0))
    assert s.eligible_workers() == [0, 1, 2]
    assert s.eligible_workers() is s.eligible_workers(), "kept until something changes"
    s.set_eligible(1, False)
    assert s.eligible_workers() == [0, 2]
    s.set_eligible(1, True)
    assert s.eligible_workers() == [0, 1, 2]
    s.set_eligible(0, False)
    s.remove_worker(0)
    assert s.eligible_workers() == [1, 2]
    w = s.add_worker(cluster[0], eligible=False)
    assert w == 0 and s.eligible_workers() == [1, 2]
    s.set_eligible(w, True)
    assert s.eligible_workers() == [0, 1, 2]
    s.set_eligible(0, False)
    s.set_eligible(1, False)
    s.set_eligible(2, False)
    assert s.eligible_workers() == []
