"""Completion prediction: critical path on the best worker, the queue ahead, plans, Retry-After."""

from __future__ import annotations

import math
import random

import pytest

from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.dag import DagNode
from gateway.core.predict import (
    CacheShare,
    CompletionPredictor,
    QueueCalibration,
    StagePlan,
    ThroughputMeter,
    calls_plan,
    cluster_call_time,
    dag_plan,
    template_plan,
)
from gateway.core.scheduler import Scheduler, WorkerInfo
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow

BIG = CallSpec("generate_candidate", 8000, 400)
SMALL = CallSpec("information_retriever", 300, 5)


def lone(s: Scheduler, w: int, spec: CallSpec) -> float:
    return s.estimator.t_comp(w, spec.kind, spec.input_tokens, spec.output_tokens, 0.0)


def load(s: Scheduler, n: int, spec: CallSpec = BIG, now: float = 0.0) -> list[Call]:
    """Queue ``n`` one-call workflows (their calls stay queued: nobody pops them)."""
    calls = []
    for i in range(n):
        wf = StagedWorkflow(1000 + i, "t", now, now + 1e6, [Stage(spec.kind, (spec,))])
        c = Call(1000 + i, wf, wf.start()[0], now)
        s.submit(c, now)
        calls.append(c)
    return calls


def test_idle_cluster_predicts_the_critical_path_on_the_fastest_worker(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "hexgen", random.Random(0))
    p = CompletionPredictor(s, 10.0)
    plan = calls_plan([[SMALL], [BIG, BIG], [SMALL]])
    fastest_big = min(lone(s, w, BIG) for w in range(3))
    fastest_small = min(lone(s, w, SMALL) for w in range(3))
    # Two parallel BIG calls go to the two (idle) fast workers: the stage takes one BIG call.
    assert p.duration(plan) == pytest.approx(2 * fastest_small + fastest_big)
    assert p.critical_path(plan) == pytest.approx(p.duration(plan))


@pytest.mark.parametrize(
    ("queued", "later_weight", "expect_later_queue"),
    [
        (0, 1.0, False),  # idle: no queue anywhere
        (12, 0.0, False),  # optimistic forecast: only the first stage waits
        (12, 1.0, True),  # stationary forecast: every stage waits as long as now
    ],
)
def test_queue_ahead_counts_for_the_first_stage_and_is_forecast_for_later_ones(
    cluster: list[WorkerInfo], queued: int, later_weight: float, expect_later_queue: bool
) -> None:
    s = Scheduler(cluster, "lw-fcfs", random.Random(0))
    load(s, queued)
    p = CompletionPredictor(s, 0.0, later_queue_weight=later_weight)
    one = p.path_time(calls_plan([[SMALL]]))
    two = p.path_time(calls_plan([[SMALL], [SMALL]]))
    idle = p.critical_path(calls_plan([[SMALL]]))
    if queued:
        assert one > idle  # the first stage waits behind the queue
    else:
        assert one == pytest.approx(idle)
    later = two - one
    if expect_later_queue:
        assert later == pytest.approx(one)
    else:
        assert later == pytest.approx(idle)


def test_prediction_picks_the_worker_that_finishes_first_not_the_fastest(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "lw-fcfs", random.Random(0))
    # Load only the two fast workers heavily: the slow, idle worker now finishes a small call first.
    for w in (0, 1):
        for i in range(20):
            wf = StagedWorkflow(i, "t", 0.0, 1e6, [Stage(BIG.kind, (BIG,))])
            c = Call(i, wf, wf.start()[0], 0.0)
            c.t_comp = lone(s, w, BIG)
            s._enqueue(c, w, 0.0)
    p = CompletionPredictor(s, 0.0)
    assert p.path_time(calls_plan([[SMALL]])) == pytest.approx(lone(s, 2, SMALL))


def test_parallel_siblings_contend_for_the_same_worker(fast_worker_only: Scheduler) -> None:
    p = CompletionPredictor(fast_worker_only, 0.0)
    t1 = p.stage_time([BIG])
    t2 = p.stage_time([BIG, BIG])
    # One worker: the second call's prompt waits for the first's (decodes share the batch).
    assert t2 == pytest.approx(t1 + fast_worker_only.estimator.prefill_s(0, BIG.input_tokens))


def test_fluid_bound_counts_the_backlog_the_committed_work_and_the_plans_own_work(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "lw-fcfs", random.Random(0))
    load(s, 12)
    idle = CompletionPredictor(Scheduler(cluster, "lw-fcfs", random.Random(0)), 0.0)
    p = CompletionPredictor(s, 0.0)
    plan = calls_plan([[BIG, BIG], [SMALL]])
    # Cluster seconds per call: every worker busy with a full batch, each at its own rate. The work of
    # others is forecast at the sustainable share of that rate; the plan's own at the full rate.
    est = s.estimator
    rate = sum(1.0 / est.gpu_s(i, BIG.input_tokens, BIG.output_tokens) for i in range(len(cluster)))
    assert p.cluster_call_time(BIG) == pytest.approx(1.0 / rate)
    assert p.plan_work(plan) == pytest.approx(2 * p.cluster_call_time(BIG) + p.cluster_call_time(SMALL))
    # The backlog: engine seconds queued on each worker, worked through by a balanced cluster.
    backlog = sum(est.queue_view(range(len(cluster)), 0.0)[1]) / len(cluster)
    assert backlog == pytest.approx(12 * est.gpu_s(0, BIG.input_tokens, BIG.output_tokens) / 3, rel=0.5)
    assert p.fluid_time(plan) == pytest.approx(backlog / p.efficiency + p.plan_work(plan))
    assert idle.fluid_time(plan) == pytest.approx(idle.plan_work(plan))
    # Work admitted but not submitted yet counts: it makes the fluid bound the larger term.
    busy = CompletionPredictor(s, 0.0, committed_s=100.0)
    assert busy.fluid_time(plan) == pytest.approx(p.fluid_time(plan) + 100.0 / p.efficiency)
    assert busy.duration(plan) == pytest.approx(busy.fluid_time(plan)) and busy.duration(plan) > p.duration(plan)
    assert p.duration(plan) == pytest.approx(max(p.path_time(plan), p.fluid_time(plan)))


@pytest.fixture
def fast_worker_only(cluster: list[WorkerInfo]) -> Scheduler:
    return Scheduler([cluster[0]], "lw-fcfs", random.Random(0))


def test_no_eligible_worker_predicts_never(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "hexgen", random.Random(0))
    for w in range(3):
        s.set_eligible(w, False)
    p = CompletionPredictor(s, 0.0)
    assert math.isinf(p.duration(calls_plan([[SMALL]])))
    assert p.retry_after_s(calls_plan([[SMALL]]), 100.0) is None


@pytest.mark.parametrize(
    ("queued", "deadline_factor", "expect"),
    [
        (0, 2.0, "now"),  # fits on an idle cluster
        (40, 2.0, "later"),  # fits once the backlog has drained
        (40, 0.5, "never"),  # shorter than the critical path: no wait helps
    ],
)
def test_retry_after_is_when_the_backlog_has_drained_enough(
    cluster: list[WorkerInfo], queued: int, deadline_factor: float, expect: str
) -> None:
    s = Scheduler(cluster, "lw-fcfs", random.Random(0))
    load(s, queued)
    p = CompletionPredictor(s, 0.0, committed_s=5.0 if queued else 0.0)
    plan = calls_plan([[BIG], [SMALL]])
    deadline = deadline_factor * p.critical_path(plan)
    r = p.retry_after_s(plan, deadline)
    if expect == "now":
        assert r == 0.0
    elif expect == "never":
        assert r is None
    else:
        queues = [s.estimator.t_queue(w, 0.0) for w in range(3)]
        top = max([*queues, sum(s.estimator.queue_view(range(3), 0.0)[1]) / 3 + 5.0])
        assert r is not None and 0.0 < r <= top
        assert p.duration(plan, drained_s=r) <= deadline
        assert p.duration(plan, drained_s=max(r - 0.1, 0.0)) > deadline


@pytest.mark.parametrize(
    ("phase", "rounds_done", "kinds"),
    [
        (-1, 0, [p.kind for p in CHESS_TEMPLATE.phases]),
        (4, 1, ["revise", "unit_tester", "generate_unit_test", "unit_tester", "evaluate", "unit_tester"]),
        (5, 1, ["generate_unit_test", "unit_tester", "evaluate", "unit_tester"]),
    ],
)
def test_template_plan_lists_the_phases_still_expected(phase: int, rounds_done: int, kinds: list[str]) -> None:
    plan = template_plan(CHESS_TEMPLATE, phase=phase, rounds_done=rounds_done)
    assert [st.calls[0].kind for st in plan] == kinds


def test_template_plan_keeps_widths_and_expected_rounds() -> None:
    plan = template_plan(CHESS_TEMPLATE)
    by_kind = {st.calls[0].kind: st for st in plan}
    assert len(by_kind["generate_candidate"].calls) == 2
    assert len(by_kind["evaluate"].calls) == 5
    assert by_kind["revise"].rounds == pytest.approx(3.39)
    assert template_plan(CHESS_TEMPLATE, phase=4, rounds_done=1)[0].rounds == pytest.approx(2.39)


def test_template_plan_matches_the_templates_expected_cost_when_calls_are_alike(cluster: list[WorkerInfo]) -> None:
    # On one idle worker, the plan's duration is the template's own expected cost with the worker's t_comp
    # (parallel calls counted once), plus the prompts of a stage's parallel calls, which run one after another.
    s = Scheduler([WorkerInfo("big", cluster[0].profile, 1_000_000)], "lw-fcfs", random.Random(0))
    p = CompletionPredictor(s, 0.0)

    def cost(kind: str, i: int, o: int) -> float:
        return s.estimator.t_comp(0, kind, i, o, 0.0)

    expected = CHESS_TEMPLATE.remaining_after(-1, 0, cost)
    plan = template_plan(CHESS_TEMPLATE)
    siblings = sum(st.rounds * sum(s.estimator.prefill_s(0, c.input_tokens) for c in st.calls[1:]) for st in plan)
    assert siblings > 0.0
    assert expected < p.duration(plan) <= expected + siblings + 1e-9


def test_dag_plan_groups_nodes_by_dependency_depth() -> None:
    nodes = [
        DagNode("a", "k", 10, 1),
        DagNode("b", "k", 10, 1, ("a",)),
        DagNode("c", "k", 10, 1, ("a",)),
        DagNode("d", "k", 10, 1, ("b", "c")),
        DagNode("e", "k", 10, 1),
        DagNode("f", "k", 10, 1, ("a", "d")),
    ]
    plan = dag_plan(nodes)
    assert [len(st.calls) for st in plan] == [2, 2, 1, 1]


def test_dag_plan_handles_a_long_chain_without_recursion() -> None:
    nodes = [DagNode("n0", "k", 10, 1)] + [DagNode(f"n{i}", "k", 10, 1, (f"n{i - 1}",)) for i in range(1, 5000)]
    assert len(dag_plan(nodes)) == 5000


@pytest.mark.parametrize(("calls", "rounds"), [((), 1.0), ((SMALL,), -1.0), ((SMALL,), math.nan)])
def test_stage_plan_rejects_bad_input(calls: tuple[CallSpec, ...], rounds: float) -> None:
    with pytest.raises(ValueError):
        StagePlan(calls, rounds)


def test_later_queue_weight_must_be_a_share(cluster: list[WorkerInfo]) -> None:
    with pytest.raises(ValueError, match="later_queue_weight"):
        CompletionPredictor(Scheduler(cluster, "hexgen", random.Random(0)), 0.0, later_queue_weight=2.0)


def test_running_workflow_counts_in_flight_and_queued_calls_where_they_are(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "lw-fcfs", random.Random(0))
    wf = StagedWorkflow(1, "t", 0.0, 100.0, [Stage(BIG.kind, (BIG, BIG)), Stage(SMALL.kind, (SMALL,))])
    a, b = (Call(i, wf, spec, 0.0) for i, spec in enumerate(wf.start()))
    wa = s.submit(a, 0.0)
    s.submit(b, 0.0)
    s.pop_next(wa, 0.0)  # a runs, b waits
    p = CompletionPredictor(s, 1.0)
    in_flight = max(a.t_comp - 1.0, 0.0)
    queued = s.estimator.t_queue(b.worker, 1.0) + b.t_comp
    assert p.pending_time([a]) == pytest.approx(in_flight)
    assert p.pending_time([a, b]) == pytest.approx(max(in_flight, queued))
    # No template: nothing is expected after the current stage (the StagedWorkflow's template is None).
    assert p.workflow_completion(wf, [a, b]) == pytest.approx(1.0 + max(in_flight, queued))


def test_running_workflow_adds_what_its_template_still_expects(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "lw-fcfs", random.Random(0))
    wf = StagedWorkflow(1, "t", 0.0, 100.0, [Stage(SMALL.kind, (SMALL,))], CHESS_TEMPLATE)
    c = Call(1, wf, wf.start()[0], 0.0)
    s.submit(c, 0.0)
    p = CompletionPredictor(s, 0.0)
    after = wf.expected_remaining(p.call_cost)
    assert after > 0.0
    assert p.workflow_completion(wf, [c]) == pytest.approx(p.pending_time([c]) + after)


def test_cluster_call_time_without_a_predictor_is_the_predictors(cluster: list[WorkerInfo]) -> None:
    s = Scheduler(cluster, "hexgen", random.Random(0))
    calls = load(s, 5)
    for c in calls[:3]:
        s.pop_next(c.worker, 0.0)
    s.on_finish(calls[0], 2.0, observed_s=3.0)  # a learned ratio for BIG's kind on one worker
    s.set_eligible(1, False)
    for now in (2.0, 5.0, 1e6):  # the ratio fresh, then stale
        pred = CompletionPredictor(s, now)
        for spec in (BIG, SMALL):
            assert cluster_call_time(s, spec, now) == pred.cluster_call_time(spec)
    for w in range(len(cluster)):
        s.set_eligible(w, False)
    assert cluster_call_time(s, BIG, 0.0) == math.inf


def load_due(s: Scheduler, n: int, due: float, spec: CallSpec = BIG, now: float = 0.0, first: int = 5000) -> None:
    """Queue ``n`` one-call workflows due at ``due``."""
    for i in range(n):
        wf = StagedWorkflow(first + i, "t", now, due, [Stage(spec.kind, (spec,))])
        s.submit(Call(first + i, wf, wf.start()[0], now), now)


def test_work_due_later_is_left_out_of_the_queue_ahead(cluster: list[WorkerInfo]) -> None:
    """Under a deadline-ordered discipline a new workflow goes before queued work due after it: the queue and the
    backlog ahead of it count only the work due no later than it."""
    s = Scheduler(cluster, "hexgen", random.Random(0))
    load_due(s, 12, due=5.0)
    load_due(s, 30, due=1000.0, first=6000)
    plan = calls_plan([[BIG]])
    everything = CompletionPredictor(s, 0.0)
    after = s.queued_due_after(10.0)
    assert after is not None and sum(n for n, *_ in after.values()) == 30
    ahead = CompletionPredictor(s, 0.0, after=after)
    assert ahead.duration(plan) < everything.duration(plan)
    only_early = Scheduler(cluster, "hexgen", random.Random(0))
    load_due(only_early, 12, due=5.0)
    alone = CompletionPredictor(only_early, 0.0)
    assert ahead.path_time(plan) == pytest.approx(alone.path_time(plan), rel=0.05)
    assert s.queued_due_after(10.0, limit=10) is None, "past the scan limit: not scanned, all counted ahead"


def test_the_calibration_makes_a_forecast_found_too_bold_more_cautious_and_never_bolder() -> None:
    cal = QueueCalibration(window=50, quantile=0.95, min_samples=10)
    assert cal.factor == 1.0 and not cal.verified and cal.calibrated(5.0, 1.0) == 5.0
    for _ in range(10):
        cal.add(latency_s=2.0, predicted_s=5.0, critical_s=1.0)  # took a quarter of the excess
    assert cal.verified and cal.factor == 1.0, "a cautious forecast is a throttle: never loosened"
    cal.add(100.0, 100.0, 100.0)  # no queueing predicted: says nothing of the forecast's queueing part
    assert cal.samples == 10
    for _ in range(40):
        cal.add(9.0, 5.0, 1.0)  # twice the excess: the factor follows (95th percentile)
    assert cal.factor == pytest.approx(2.0)
    assert cal.calibrated(5.0, 1.0) == pytest.approx(9.0)
    assert cal.target(9.0, 1.0) == pytest.approx(5.0), "the raw prediction that calibrates to the target"
    for _ in range(50):
        cal.add(1000.0, 5.0, 1.0)
    assert cal.factor == QueueCalibration.CEIL


def test_the_throughput_meter_reads_work_per_worker_second_over_its_window() -> None:
    m = ThroughputMeter(window_s=10.0)
    assert m.share(0.0, 4) == 0.0
    m.add(0.0, 2.0)
    m.add(0.5, 2.0)
    assert m.share(1.0, 4) == pytest.approx(4.0 / (1.0 * 4)), "a young meter: over the second since it started"
    for t in range(1, 21):
        m.add(float(t), 4.0)
    assert m.share(20.0, 4) == pytest.approx(11 * 4.0 / (10.0 * 4)), "only the last window counts"
    assert m.share(100.0, 4) == 0.0
    m.add(100.0, math.nan)
    assert m.share(100.0, 0) == 0.0


def test_the_cache_share_reads_work_with_the_cache_over_without_over_its_window() -> None:
    m = CacheShare(window=4, min_calls=2)
    m.add(1.0, 2.0)
    assert m.factor == 1.0, "one call is not enough to read"
    m.add(3.0, 4.0)
    assert m.factor == pytest.approx(4.0 / 6.0)
    for bad in ((5.0, 4.0), (1.0, 0.0), (-1.0, 2.0), (1.0, math.inf), (math.nan, 1.0)):
        m.add(*bad)
    assert m.factor == pytest.approx(4.0 / 6.0), "a sample no cache could give is ignored"
    for _ in range(4):
        m.add(1.0, 1.0)
    assert m.factor == 1.0, "only the last window counts"
    with pytest.raises(ValueError, match="window"):
        CacheShare(window=0)
