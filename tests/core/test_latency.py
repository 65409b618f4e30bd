"""The latency model (``gateway.core.latency``): its pieces agree with each other and with the profile."""

from __future__ import annotations

import pytest

from gateway.config import load_gpu_catalog
from gateway.core.latency import LatencyModel, WorkerLoad, decode_steps, mean_context, prefill_token_s
from gateway.core.profile import PerfProfile
from gateway.profiling.refit import constants_of


@pytest.fixture(scope="module")
def a100() -> PerfProfile:
    return load_gpu_catalog().profile("A100", "llama-3.1-70b")


def test_a_lone_call_on_an_idle_worker_takes_the_profiles_lone_latency(a100: PerfProfile) -> None:
    m = LatencyModel(a100)
    for n_in, n_out in ((1, 1), (308, 5), (11748, 678)):
        own = m.compute_s(m.prefill_s(n_in), decode_steps(n_out), WorkerLoad(limit=16), mean_context(n_in, n_out))
        # The lone latency reads the growing context step by step; the batch model its mean: close, not equal.
        assert own == pytest.approx(m.lone_s(n_in, n_out), rel=0.02)
        assert m.lone_s(n_in, n_out) == a100.single_latency(n_in, n_out)


def test_compute_s_is_the_batch_it_joins_stepped_output_minus_one_times(a100: PerfProfile) -> None:
    m = LatencyModel(a100)
    for inflight, limit in ((0, 8), (3, 8), (20, 8)):
        load = WorkerLoad(inflight=inflight, inflight_ctx=5000.0 * inflight, limit=limit)
        n, ctx = m.batch(load, 5000.0)
        assert n == min(inflight + 1, limit)
        assert ctx == pytest.approx(5000.0 * n)
        step = a100.iter_base_s + (a100.token_s + a100.seq_s) * n + a100.ctx_s * ctx
        pre = m.prefill_s(4000)
        got = m.compute_s(pre, 99, load, 5000.0)
        assert got == a100.request_overhead_s + pre + 99 * step


def test_a_samples_terms_times_the_constants_give_the_prediction(a100: PerfProfile) -> None:
    m = LatencyModel(a100)
    n_in, n_out, wait_s = 3000, 120, 0.25
    load = WorkerLoad(inflight=4, inflight_ctx=4 * 2000.0, limit=16)
    n, ctx = m.batch(load, mean_context(n_in, n_out))
    terms = m.sample_terms(n_in, n_out, n, ctx, wait_s / prefill_token_s(a100))
    predicted = sum(t * c for t, c in zip(terms, constants_of(a100), strict=True))
    own = m.compute_s(m.prefill_s(n_in), decode_steps(n_out), load, mean_context(n_in, n_out))
    assert predicted == pytest.approx(own + wait_s, rel=0.01)


def test_the_queue_wait_is_the_prefill_ahead_until_no_slot_is_free(a100: PerfProfile) -> None:
    m = LatencyModel(a100)
    assert m.queue_s(WorkerLoad(capacity=4), 0.0, 0, 0.0, 0.0) == 0.0
    load = WorkerLoad(inflight=2, prefill_free_at=1.5, inflight_end_sum=20.0, inflight_service_sum=16.0, capacity=4)
    assert m.queue_s(load, 1.0, 1, 0.25, 0.0) == 0.5 + 0.25  # a slot is free: the prompts ahead
    load.capacity = 2
    full = m.queue_s(load, 1.0, 1, 0.25, 0.0)  # none: the work ahead over the slots
    assert full == 2 * load.outstanding(1.0) / (3 * 2)
    assert m.queue_s(load, 1.0, 1, 0.25, 1e9) == 0.5 + 0.25  # the work ahead all goes after it


def test_gpu_s_shares_each_steps_base_over_the_full_batch_and_under_load_adds_what_joined(a100: PerfProfile) -> None:
    m = LatencyModel(a100)
    pre = m.prefill_s(1000)
    assert m.gpu_s(pre, 0, 1000.0, 8) == pre
    assert m.gpu_s(pre, 10, 1000.0, 8) > m.gpu_s(pre, 10, 1000.0, 16)
    assert m.under_load_s(2.0, -1.0, -3.0, 50) == 2.0  # nothing joined (negative marks read as none)
    assert m.under_load_s(2.0, 0.5, 2.0, 50) == 2.0 + 0.5 + 2.0 * (a100.token_s + a100.seq_s) * 50
