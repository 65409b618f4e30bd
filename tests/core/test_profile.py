"""The iteration-time model: closed forms agree with iteration-by-iteration sums."""

from __future__ import annotations

import pytest

from gateway.core.profile import PerfProfile, iterations_within

P = PerfProfile("X", "m", 0.02, 2e-4, 5e-8, 0.7, 100_000, 16, 512)


def brute_engine_latency(p: PerfProfile, n_in: int, n_out: int) -> float:
    t, done = 0.0, 0
    while done < n_in:
        k = min(p.max_batched_tokens, n_in - done)
        t += p.iter_time(k, done)
        done += k
    for j in range(n_out - 1):
        t += p.iter_time(1, n_in + j)
    return t


@pytest.mark.parametrize(("n_in", "n_out"), [(1, 1), (511, 2), (512, 5), (513, 5), (3000, 100), (12000, 678)])
def test_engine_latency_closed_form_matches_iteration_sum(n_in: int, n_out: int) -> None:
    assert P.engine_latency(n_in, n_out) == pytest.approx(brute_engine_latency(P, n_in, n_out), rel=1e-9)
    assert P.single_latency(n_in, n_out) == pytest.approx(P.engine_latency(n_in, n_out) + 0.7)


@pytest.mark.parametrize(
    ("a", "g", "elapsed"), [(0.1, 0.0, 1.05), (0.1, 0.01, 3.0), (0.02, 1e-6, 10.0), (0.5, 0.0, 0.2)]
)
def test_iterations_within_is_the_largest_fitting_count(a: float, g: float, elapsed: float) -> None:
    k = iterations_within(a, g, elapsed)
    assert k * a + g * k * (k - 1) / 2 <= elapsed
    assert (k + 1) * a + g * (k + 1) * k / 2 > elapsed


def test_throughput_grows_with_batch() -> None:
    # decode tokens per second with n calls of 1000 tokens' context
    rate = [n / P.iter_time(n, n * 1000, decoders=n) for n in (1, 16)]
    assert rate[1] > 4 * rate[0]


def test_constants_list_matches_the_profile_fields() -> None:
    import dataclasses

    from gateway.core.profile import CONSTANTS, profile_from

    names = [f.name for f in dataclasses.fields(PerfProfile)]
    assert tuple(names[2:]) == CONSTANTS
    assert profile_from("X", "m", P) == P


@pytest.mark.parametrize(
    ("kv_tokens", "max_seqs", "iter_base", "expected"),
    [
        (1_000_000, 64, 0.02, 51),  # latency binds: 51 calls make a step 2x a lone one
        (1_000_000, 16, 0.02, 16),  # vLLM's max_num_seqs binds
        (40_960, 64, 0.02, 10),  # the KV cache binds: 10 calls of 4096 tokens
        (1_000_000, 64, 1.0, 64),  # weight reads dominate a step: batching is almost free
    ],
)
def test_derived_capacity_is_the_largest_batch_that_kv_seqs_and_latency_allow(
    kv_tokens: int, max_seqs: int, iter_base: float, expected: int
) -> None:
    p = PerfProfile("G", "m", iter_base, 2e-4, 5e-8, 0.0, kv_tokens, max_seqs, 2048)
    assert p.derived_capacity() == expected
    if expected < max_seqs and expected < kv_tokens // 4096:  # latency bound: the next call would break it
        assert p.iter_time(expected, expected * 4096) <= 2 * p.iter_time(1, 4096)
        assert p.iter_time(expected + 1, (expected + 1) * 4096) > 2 * p.iter_time(1, 4096)


def test_derived_capacity_refuses_nonsense_parameters() -> None:
    p = PerfProfile("G", "m", 0.02, 2e-4, 5e-8, 0.0, 10_000, 64, 2048)
    with pytest.raises(ValueError, match="slowdown"):
        p.derived_capacity(slowdown=0.5)
