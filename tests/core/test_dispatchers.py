"""Dispatchers: table-driven scores and tie-breaks, on the one interface (``choose(view)`` over rows)."""

from __future__ import annotations

import random

import pytest

from gateway.core.dispatchers import DISPATCHERS, Capabilities, DispatchView, WorkerEstimate, register_dispatcher
from gateway.core.dispatchers.llmd import LlmdScorer
from gateway.core.dispatchers.lw import LeastWork
from gateway.core.dispatchers.p2c import PowerOfTwo
from gateway.core.dispatchers.rr import RoundRobin
from gateway.core.dispatchers.wb import WorkloadBalanced


def view(
    t_comp: list[float],
    t_queue: list[float],
    alpha: float = 0.5,
    workers: list[int] | None = None,
    queue_len: list[int] | None = None,
    inflight: list[int] | None = None,
    budget: float = 0.0,
    harm: list[float] | None = None,
) -> DispatchView:
    """A view over rows built from lists aligned with ``workers`` (default: every worker); other rows are filler
    a dispatcher must not read."""
    n = len(t_comp)
    ws = workers if workers is not None else list(range(n))
    rows = [WorkerEstimate(t_comp=-1.0, t_queue=-1.0, queued=10**6) for _ in range(max(ws) + 1)]
    for i, w in enumerate(ws):
        rows[w] = WorkerEstimate(
            t_comp=t_comp[i],
            t_queue=t_queue[i],
            harm=harm[i] if harm else 0.0,
            inflight=inflight[i] if inflight else 0,
            queued=queue_len[i] if queue_len else 0,
        )
    return DispatchView(rows, ws, alpha=alpha, budget=budget, t_comp_min=min(t_comp))


@pytest.mark.parametrize(
    ("name", "alpha", "t_comp", "t_queue", "expected"),
    [
        ("alpha 0 is pure load balance", 0.0, [10.0, 20.0], [5.0, 1.0], 1),
        ("alpha 1 always takes the fastest GPU", 1.0, [10.0, 20.0], [500.0, 0.0], 0),
        ("heavy call goes to the fast GPU despite some queue", 0.5, [10.0, 20.0], [3.0, 0.0], 0),
        ("light call spills onto the idle slow GPU", 0.3, [1.0, 2.0], [30.0, 0.0], 1),
        ("idle workers: no division by zero, fastest wins", 0.5, [4.0, 8.0, 6.0], [0.0, 0.0, 0.0], 0),
        ("equal scores tie to the lower t_comp", 0.0, [9.0, 3.0], [0.0, 0.0], 1),
        ("equal everything ties to the lower position", 0.5, [3.0, 3.0], [1.0, 1.0], 0),
    ],
)
def test_wb_score_table(name: str, alpha: float, t_comp: list[float], t_queue: list[float], expected: int) -> None:
    assert WorkloadBalanced().choose(view(t_comp, t_queue, alpha)) == expected, name


@pytest.mark.parametrize("budget", [-5.0, 0.0, 1.0, 3.0, 10.0, 100.0])
def test_wb_score_formula_matches_documentation(budget: float) -> None:
    # Score = (1-a) * beta/(beta + tq) - a * tc/beta with beta = max(budget, min tc).
    a, tc, tq = 0.4, [2.0, 5.0, 3.0], [6.0, 0.5, 2.0]
    beta = max(budget, 2.0)
    scores = [(1 - a) * beta / (beta + q) - a * c / beta for c, q in zip(tc, tq, strict=True)]
    assert WorkloadBalanced().choose(view(tc, tq, a, budget=budget)) == scores.index(max(scores))


@pytest.mark.parametrize(
    ("budget", "expected", "why"),
    [
        (200.0, 1, "a loose budget: the idle slow GPU still meets it, the busy fast one is left free"),
        (12.0, 0, "a tight budget: the fast GPU, whose urgency queue lets the call pass"),
        (-30.0, 0, "a late call: beta falls to the best-case compute time, the fast GPU"),
    ],
)
def test_wb_budget_couples_dispatch_to_urgency(budget: float, expected: int, why: str) -> None:
    # Fast GPU: 10 s compute but 15 s of queued work per slot (finishes later); slow GPU: 20 s, idle.
    v = view([10.0, 20.0], [15.0, 0.0], alpha=0.5, budget=budget)
    assert WorkloadBalanced().choose(v) == expected, why


@pytest.mark.parametrize(
    ("interference", "t_comp", "harm", "expected", "why"),
    [
        (1.0, [10.0, 10.0], [30.0, 0.0], 1, "equal otherwise: the prompt goes where it stalls no decoding call"),
        (0.0, [10.0, 10.0], [30.0, 0.0], 0, "the paper's score ignores harm: tie to the lower index"),
        (1.0, [10.0, 10.0], [0.0, 0.0], 0, "no harm: the paper's score"),
        (1.0, [10.0, 14.0], [0.5, 0.0], 0, "a small harm does not outweigh a faster worker"),
        (1.0, [10.0, 14.0], [60.0, 0.0], 1, "a large one does"),
    ],
)
def test_wbi_charges_the_prompts_stall_of_calls_in_flight_as_queue_time(
    interference: float, t_comp: list[float], harm: list[float], expected: int, why: str
) -> None:
    v = view(t_comp, [0.0, 0.0], 0.3, budget=60.0, harm=harm)
    assert WorkloadBalanced(interference).choose(v) == expected, why


def test_wbi_refuses_a_negative_weight() -> None:
    with pytest.raises(ValueError, match="interference"):
        WorkloadBalanced(-1.0)


@pytest.mark.parametrize(
    ("t_comp", "t_queue", "expected"),
    [
        ([1.0, 1.0, 1.0], [3.0, 1.0, 2.0], 1),
        ([5.0, 2.0], [1.0, 1.0], 1),  # tie on load goes to the faster worker
        ([2.0, 2.0], [0.0, 0.0], 0),  # full tie goes to the first
    ],
)
def test_least_work_picks_least_outstanding_work(t_comp: list[float], t_queue: list[float], expected: int) -> None:
    assert LeastWork().choose(view(t_comp, t_queue)) == expected


@pytest.mark.parametrize(
    ("name", "t_comp", "t_queue", "expected"),
    [
        ("idle slow GPU finishes first", [10.0, 20.0], [15.0, 0.0], 1),
        ("busy fast GPU still finishes first", [10.0, 20.0], [5.0, 0.0], 0),
        ("least work alone would pick the idle slow GPU", [2.0, 30.0], [10.0, 0.0], 0),
        ("equal finish times tie to the lower t_comp", [12.0, 4.0], [0.0, 8.0], 1),
        ("equal everything ties to the lower position", [3.0, 3.0, 3.0], [1.0, 1.0, 1.0], 0),
        ("one worker", [7.0], [100.0], 0),
    ],
)
def test_earliest_finish_picks_least_queue_plus_compute(
    name: str, t_comp: list[float], t_queue: list[float], expected: int
) -> None:
    assert LeastWork(finish=True).choose(view(t_comp, t_queue)) == expected, name


def test_round_robin_cycles_by_worker_index_and_skips_ineligible() -> None:
    rr = RoundRobin()
    picks = []
    for _ in range(4):
        v = view([1.0] * 3, [0.0] * 3)
        picks.append(v.workers[rr.choose(v)])
    assert picks == [0, 1, 2, 0]
    # Worker 1 becomes ineligible: the turn passes to 2 without shifting later turns.
    v = view([1.0, 1.0], [0.0, 0.0], workers=[0, 2])
    assert v.workers[rr.choose(v)] == 2
    v = view([1.0] * 3, [0.0] * 3)
    assert v.workers[rr.choose(v)] == 0


class SeqRng:
    """A fake RNG returning a fixed sequence."""

    def __init__(self, values: list[float]) -> None:
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


@pytest.mark.parametrize(
    ("draws", "lengths", "expected"),
    [
        ([0.0, 0.0], [5, 1, 9], 1),  # samples 0 and 1: 1 is shorter
        ([0.0, 0.99], [5, 1, 9], 0),  # samples 0 and 2: 0 is shorter
        ([0.5, 0.0], [4, 4, 4], 1),  # tie keeps the first sample
    ],
)
def test_power_of_two_picks_shorter_of_two_distinct_samples(
    draws: list[float], lengths: list[int], expected: int
) -> None:
    v = view([1.0] * 3, [0.0] * 3, queue_len=lengths)
    assert PowerOfTwo(SeqRng(draws)).choose(v) == expected


def test_duplicate_dispatcher_registration_raises() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_dispatcher("wb", lambda rng: WorkloadBalanced(), Capabilities(uses_alpha=True))
    assert set(DISPATCHERS) >= {"rr", "p2c", "lw", "eft", "wb", "wbi", "llmd"}


@pytest.mark.parametrize(
    ("name", "caps"),
    [
        ("rr", Capabilities()),
        ("p2c", Capabilities(queue_len=True)),
        ("lw", Capabilities()),
        ("eft", Capabilities()),
        ("wb", Capabilities(uses_alpha=True)),
        ("wbi", Capabilities(uses_alpha=True)),
        ("llmd", Capabilities(queue_len=True, kv_util=True, prefix_index=True)),
    ],
)
def test_each_dispatcher_declares_what_it_reads(name: str, caps: Capabilities) -> None:
    assert DISPATCHERS[name].capabilities == caps


@pytest.mark.parametrize(
    "d",
    [WorkloadBalanced(), WorkloadBalanced(interference=1.0), LeastWork(), LeastWork(finish=True)],
    ids=["wb", "wbi", "lw", "eft"],
)
def test_a_dispatcher_reads_only_the_eligible_workers_rows(d: WorkloadBalanced | LeastWork) -> None:
    """The choice over a subset of the rows is the choice over those rows alone, ties included (equal values are
    drawn often); the position returned is in ``view.workers``."""
    rng = random.Random(7)
    for _ in range(2000):
        n_all = rng.randint(1, 9)
        rows = [
            WorkerEstimate(
                t_comp=rng.choice([1.0, 2.0, rng.uniform(0.5, 40.0)]),
                t_queue=rng.choice([0.0, 3.0, rng.uniform(0.0, 60.0)]),
                harm=rng.choice([0.0, rng.uniform(0.0, 20.0)]),
            )
            for _ in range(n_all)
        ]
        workers = sorted(rng.sample(range(n_all), rng.randint(1, n_all)))
        alpha = rng.choice([0.0, 0.2, 0.5, 1.0])
        budget = rng.choice([-5.0, 0.0, rng.uniform(0.0, 50.0)])
        least = min(rows[w].t_comp for w in workers)
        full = d.choose(DispatchView(rows, workers, alpha=alpha, budget=budget, t_comp_min=least))
        alone = d.choose(DispatchView([rows[w] for w in workers], list(range(len(workers))), alpha, budget, least))
        assert full == alone


class _Rng:
    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)

    def random(self) -> float:
        return self._r.random()


def llmd_view(queue_len: list[int], cached: list[int], kv: list[float], n_in: int = 1000) -> DispatchView:
    rows = [
        WorkerEstimate(t_comp=1.0, cached=c, queued=q, kv_util=k) for q, c, k in zip(queue_len, cached, kv, strict=True)
    ]
    return DispatchView(rows, list(range(len(rows))), input_tokens=n_in, prefix=True)


@pytest.mark.parametrize(
    ("queue_len", "cached", "kv", "want"),
    [
        # prefix 3 x share held, queue 2 x (max - q) / (max - min), KV 2 x (1 - use)
        ([0, 0, 0], [0, 800, 0], [0.1, 0.1, 0.1], 1),  # the prefix decides
        ([4, 0, 2], [0, 0, 0], [0.0, 0.0, 0.0], 1),  # the shortest queue
        ([0, 0], [0, 0], [0.9, 0.2], 1),  # the emptier KV cache
        # worker 0: 3 x 0.9 + 2 x 0 + 2 x 0.5 = 3.7; worker 1: 0 + 2 + 2 x 0.5 = 3.0
        ([5, 0], [900, 0], [0.5, 0.5], 0),
        # worker 0: 3 x 0.2 + 0 + 2 x 0.5 = 1.6; worker 1: 0 + 2 + 1 = 3.0
        ([5, 0], [200, 0], [0.5, 0.5], 1),
    ],
)
def test_llmd_scorer_weights_prefix_queue_and_kv_as_llm_d_defaults(
    queue_len: list[int], cached: list[int], kv: list[float], want: int
) -> None:
    assert LlmdScorer(_Rng(0)).choose(llmd_view(queue_len, cached, kv)) == want


def test_llmd_scorer_without_a_prefix_match_ignores_the_rows_cached_tokens() -> None:
    v = llmd_view([0, 0], [0, 900], [0.5, 0.1])
    v.prefix = False
    assert LlmdScorer(_Rng(0)).choose(v) == 1  # the KV score alone
    v = llmd_view([0, 0], [900, 0], [0.5, 0.1])
    v.prefix = False
    assert LlmdScorer(_Rng(0)).choose(v) == 1


def test_llmd_scorer_breaks_ties_at_random() -> None:
    picks = {LlmdScorer(_Rng(s)).choose(llmd_view([0, 0, 0], [0, 0, 0], [0.0, 0.0, 0.0])) for s in range(30)}
    assert picks == {0, 1, 2}
