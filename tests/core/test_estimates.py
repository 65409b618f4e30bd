"""The batching-aware estimates: prompts wait for prompts, decode slows with the batch, ratios learn."""

from __future__ import annotations

import pytest

from gateway.core.estimates import Estimator
from gateway.core.latency import LatencyModel
from gateway.core.profile import PerfProfile
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow

LONG = CallSpec("generate_candidate", 8000, 400)
SHORT = CallSpec("information_retriever", 300, 5)


def call(i: int, spec: CallSpec, worker: int = 0, at: float = 0.0) -> Call:
    wf = StagedWorkflow(i, "t", at, at + 100.0, [Stage(spec.kind, (spec,))])
    c = Call(i, wf, spec, at)
    c.worker = worker
    return c


def sent(est: Estimator, c: Call, now: float) -> Call:
    """Queue ``c`` on its worker and send it at ``now`` (what the scheduler reports)."""
    s = c.spec
    c.t_comp = est.t_comp(c.worker, s.kind, s.input_tokens, s.output_tokens, now)
    est.enqueue(c, c.worker)
    est.dequeue(c, c.worker)
    est.start(c, c.worker, now)
    c.started_at = now
    return c


def test_an_idle_worker_has_no_queue_and_a_lone_call_costs_its_profile_latency(fast: PerfProfile) -> None:
    est = Estimator([WorkerInfo("w", fast, 8)])
    assert est.t_queue(0, 5.0) == 0.0
    s = LONG
    assert est.t_comp(0, s.kind, s.input_tokens, s.output_tokens, 5.0) == pytest.approx(
        fast.single_latency(s.input_tokens, s.output_tokens), rel=0.01
    )


def test_a_newcomer_waits_for_the_prompts_ahead_but_not_for_their_decode(fast: PerfProfile) -> None:
    est = Estimator([WorkerInfo("w", fast, 8)])
    sent(est, call(1, LONG), 0.0)
    pre = LatencyModel(fast).prefill_s(LONG.input_tokens)
    assert est.t_queue(0, 0.0) == pytest.approx(pre)
    assert est.t_queue(0, pre / 2) == pytest.approx(pre / 2)
    # Past its prompt the first call only decodes: a newcomer's prompt starts at once...
    assert est.t_queue(0, pre + 0.1) == 0.0
    # ... but it joins a batch of two, so its own decode is slower than alone.
    alone = Estimator([WorkerInfo("w", fast, 8)]).t_comp(0, SHORT.kind, 300, 400, 0.0)
    assert est.t_comp(0, SHORT.kind, 300, 400, pre + 0.1) > alone


@pytest.mark.parametrize(("inflight", "grows"), [(1, True), (10, True), (62, True), (63, False), (100, False)])
def test_decode_slows_with_the_batch_up_to_the_engines_batch_limit(
    fast: PerfProfile, inflight: int, grows: bool
) -> None:
    # capacity above max_num_seqs (64): past 64 calls the batch no longer grows.
    est = Estimator([WorkerInfo("w", fast, 200)])
    for i in range(inflight):
        sent(est, call(i, SHORT), 0.0)
    before = est.t_comp(0, LONG.kind, 300, 400, 0.0)
    sent(est, call(1000, SHORT), 0.0)
    after = est.t_comp(0, LONG.kind, 300, 400, 0.0)
    assert (after > before) is grows


def test_a_full_worker_adds_the_wait_for_a_free_slot(fast: PerfProfile) -> None:
    est = Estimator([WorkerInfo("w", fast, 2)])
    calls = [sent(est, call(i, LONG), 0.0) for i in (1, 2)]
    clock_only = est.loads[0].prefill_free_at - 30.0
    assert clock_only < 0.0  # both prompts are done by t=30 ...
    assert est.t_queue(0, 30.0) > 0.0  # ... yet both slots are taken until a call returns (even late)
    assert est.t_queue(0, 5.0) > est.t_queue(0, 6.0) > 0.0  # and the wait shrinks as they progress
    est.release(calls[0], 0)
    assert est.t_queue(0, 30.0) == 0.0


def test_release_of_the_last_call_resets_the_worker(fast: PerfProfile) -> None:
    est = Estimator([WorkerInfo("w", fast, 4)])
    c = sent(est, call(1, LONG), 0.0)
    est.release(c, 0)
    load = est.loads[0]
    assert (load.inflight, load.inflight_ctx, load.inflight_end_sum, load.prefill_free_at) == (0, 0.0, 0.0, 0.0)
    assert load.inflight_service_sum == 0.0
    assert est.t_queue(0, 0.0) == 0.0


def test_the_ratio_converges_to_what_the_model_misses(fast: PerfProfile) -> None:
    est = Estimator([WorkerInfo("w", fast, 4)], ewma=0.5)
    now = 0.0
    for i in range(30):
        c = sent(est, call(i, LONG, at=now), now)
        est.release(c, 0)
        est.observe(c, 1.5 * c.model_s, now + 1.5 * c.model_s)
        now += 100.0
    assert est.ratio(0, LONG.kind, now) == pytest.approx(1.5, rel=1e-3)
    # The prediction of the next call carries the correction.
    c = call(99, LONG, at=now)
    assert est.t_comp(0, LONG.kind, LONG.input_tokens, LONG.output_tokens, now) == pytest.approx(
        1.5 * fast.single_latency(LONG.input_tokens, LONG.output_tokens), rel=0.01
    )


def test_a_long_answer_at_the_workers_speed_does_not_raise_the_ratio(fast: PerfProfile) -> None:
    """A call that wrote ten times its expected output, each token at the profile's speed, is judged for the
    tokens it processed: the ratio stays at 1 (judged for the expected tokens it read about 10x, and every later
    call of the kind was predicted that much slower)."""
    est = Estimator([WorkerInfo("w", fast, 4)], ewma=0.5)
    c = sent(est, call(1, LONG), 0.0)
    est.release(c, 0)
    tokens = (LONG.input_tokens, 10 * LONG.output_tokens)
    took = est.model_for_tokens(c, tokens)
    assert took > 5 * c.model_s
    est.observe(c, took, took, tokens)
    assert est.ratio(0, LONG.kind, took) == pytest.approx(1.0)
    assert (
        est.model_for_tokens(c, None) == est.model_for_tokens(c, (LONG.input_tokens, LONG.output_tokens)) == c.model_s
    )


def test_a_stale_ratio_reads_as_unknown(fast: PerfProfile) -> None:
    est = Estimator([WorkerInfo("w", fast, 4)], max_age_s=10.0)
    c = sent(est, call(1, SHORT), 0.0)
    est.release(c, 0)
    est.observe(c, 3 * c.model_s, 1.0)
    assert est.ratio(0, SHORT.kind, 2.0) > 1.0
    assert est.ratio(0, SHORT.kind, 20.0) == 1.0


def test_harm_is_the_prompts_prefill_times_the_calls_it_would_stall(fast: PerfProfile) -> None:
    est = Estimator([WorkerInfo("w", fast, 8)])
    assert est.snapshot([0], LONG.kind, 8000, 400, 0.0)[2] == [0.0]  # nothing in flight: nobody to stall
    for i in range(3):
        sent(est, call(i, SHORT), 0.0)
    _, _, harm, _ = est.snapshot([0], LONG.kind, 8000, 400, 0.0)
    assert harm == [pytest.approx(3 * LatencyModel(fast).prefill_s(8000))]


def test_gpu_s_is_a_calls_share_of_a_full_workers_time(fast: PerfProfile) -> None:
    est = Estimator([WorkerInfo("w", fast, 8)])
    g = est.gpu_s(0, 8000, 400)
    # Its prompt alone costs what it costs alone; its decode steps are shared by the batch of 8.
    assert LatencyModel(fast).prefill_s(8000) < g < fast.engine_latency(8000, 400)
    assert est.gpu_s(0, 8000, 1) == pytest.approx(LatencyModel(fast).prefill_s(8000))


def test_backlog_counts_queued_work_and_what_is_left_of_work_in_flight(fast: PerfProfile) -> None:
    est = Estimator([WorkerInfo("w", fast, 8)])

    def backlog_s(now: float) -> float:
        return est.queue_view([0], now)[1][0]

    assert backlog_s(0.0) == 0.0
    c = sent(est, call(1, LONG), 0.0)
    full = backlog_s(0.0)
    assert full == pytest.approx(c.gpu_s)
    assert backlog_s(c.service_s / 2) == pytest.approx(full / 2)
    assert backlog_s(10 * c.service_s) == pytest.approx(full * 0.1)  # late, but still holding the worker
    q = call(2, LONG)
    q.t_comp = 1.0
    est.enqueue(q, 0)
    assert backlog_s(0.0) == pytest.approx(full + q.gpu_s)
    est.release(c, 0)
    est.dequeue(q, 0)
    assert backlog_s(0.0) == 0.0
