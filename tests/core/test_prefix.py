"""Prompt prefixes: chained keys, vLLM's block rounding, the gateway's per-worker index, llm-d's scorer."""

from __future__ import annotations

import random

import pytest

from gateway.core.prefix import BLOCK_TOKENS, PrefixIndex, PrefixSeg, cached_tokens, segment_keys
from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow

TPL = PrefixSeg("tpl", 320)
Q = PrefixSeg("q", 1000, per_query=True)


def test_keys_chain_and_per_query_segments_are_keyed_by_workflow() -> None:
    a = segment_keys((TPL, Q), wid=1)
    b = segment_keys((TPL, Q), wid=2)
    assert a[0] == b[0]  # the template is shared
    assert a[1] != b[1]  # the per-query part is not
    # A segment's key names everything before it: the same segment after another template differs.
    assert segment_keys((PrefixSeg("other", 320), Q), wid=1)[1] != a[1]
    assert segment_keys((PrefixSeg("empty", 0), TPL), wid=1) == segment_keys((TPL,), wid=1)


@pytest.mark.parametrize(
    ("matched", "n_in", "want"),
    [(0, 100, 0), (15, 100, 0), (16, 100, 16), (100, 100, 96), (99, 100, 96), (5000, 4100, 4096), (320, 321, 320)],
)
def test_only_whole_blocks_and_never_the_last_token_are_served(matched: int, n_in: int, want: int) -> None:
    assert cached_tokens(matched, n_in) == want
    assert want % BLOCK_TOKENS == 0 and want <= max(n_in - 1, 0)


def test_index_matches_leading_segments_and_evicts_least_recently_used() -> None:
    ix = PrefixIndex(capacity_tokens=2500)
    q1 = segment_keys((TPL, Q), wid=1)
    assert ix.match(q1) == 0
    ix.record(q1)
    assert ix.match(q1) == 1320
    assert ix.match(segment_keys((TPL, Q), wid=2)) == 320  # the template only
    ix.record(segment_keys((PrefixSeg("x", 1000),), wid=0))  # 2320 tokens held
    ix.record(q1)  # q1's segments are now the most recent
    ix.record(segment_keys((PrefixSeg("y", 500),), wid=0))  # over capacity: "x" goes first
    assert ix.match(q1) == 1320
    assert ix.match(segment_keys((PrefixSeg("x", 1000),), wid=0)) == 0
    assert ix.tokens <= 2500
    ix.clear()
    assert ix.match(q1) == 0 and len(ix) == 0
    # A segment counts once the call that carried it has had its prompt processed.
    ix.record(q1, ready_at=5.0)
    assert (ix.match(q1, now=4.9), ix.match(q1, now=5.0)) == (0, 1320)
    ix.record(q1, ready_at=2.0)  # sent again: the earlier time holds
    assert ix.match(q1, now=2.0) == 1320


def test_segments_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        PrefixSeg("bad", -1)


class _Rng:
    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)

    def random(self) -> float:
        return self._r.random()


def _call(cid: int, wid: int, spec: CallSpec) -> Call:
    wf = StagedWorkflow(wid, "t", 0.0, 1e6, [Stage(spec.kind, (spec,))])
    return Call(cid, wf, spec, 0.0)


@pytest.mark.parametrize(
    ("policy", "caching", "follows"),
    [("hexgen", True, True), ("hexgen", False, False), ("llmd", True, True), ("lw-fcfs", True, False)],
)
def test_prefix_aware_policies_send_a_workflows_next_round_where_its_prefix_is(
    cluster: list[WorkerInfo], policy: str, caching: bool, follows: bool
) -> None:
    same = [WorkerInfo(f"w{i}", cluster[0].profile, 4) for i in range(3)]
    sched = Scheduler(same, policy, _Rng(1), prefix_caching=caching)
    spec = CallSpec("revise", 6000, 80, (PrefixSeg("revise", 5700, per_query=True),))
    first = _call(1, 7, spec)
    w1 = sched.submit(first, 0.0)
    assert (first.cached == 0) and (sched.prefix_aware == (caching and policy != "lw-fcfs"))
    started = sched.pop_next(w1, 0.0)
    assert started is first
    second = _call(2, 7, spec)
    # Later, the first round's prompt is processed but it still decodes on w1: a load-only choice goes
    # elsewhere, a prefix-aware one where the prefix is.
    w2 = sched.submit(second, 100.0)
    assert (w2 == w1) == follows
    assert second.cached == (5696 if follows else 0)
    if follows:
        # Its estimates count only the uncached prompt as prefill, once (hexgen's dispatch credit of the
        # cached tokens, 3x, is for choosing the worker only).
        assert second.prefill_s == pytest.approx(sched.estimator.prefill_s(w2, 6000 - 5696))
        true_t_comp = sched.estimator.snapshot([w2], "revise", 6000, 80, 100.0, [5696])[0][0]
        assert second.t_comp == pytest.approx(true_t_comp)


def test_calls_sent_together_count_each_others_prefix_where_the_first_went(cluster: list[WorkerInfo]) -> None:
    """vLLM caches a block when it schedules it and a call sent after another to the same worker is prefilled
    after it, so a sibling sent at the same instant finds the first's prefix there (``tests/contract``)."""
    same = [WorkerInfo(f"w{i}", cluster[0].profile, 4) for i in range(3)]
    spec = CallSpec("evaluate", 900, 20, (PrefixSeg("evaluate", 850, per_query=True),))
    sched = Scheduler(same, "hexgen", _Rng(1), prefix_caching=True)
    first, second = _call(1, 7, spec), _call(2, 7, spec)
    w1 = sched.submit(first, 0.0)
    for w in range(3):
        sched.set_eligible(w, w == w1)
    assert sched.submit(second, 0.0) == w1
    assert (first.cached, second.cached) == (0, 848)  # whole blocks of the 850 shared tokens
    assert second.prefill_s == pytest.approx(sched.estimator.prefill_s(w1, 900 - 848))
    # llm-d's prefix score (weight 3) stacks a query's siblings on the worker that holds their prefix.
    llmd = Scheduler(same, "llmd", _Rng(1), prefix_caching=True)
    calls = [_call(i, 7, spec) for i in range(3)]
    assert len({llmd.submit(c, 0.0) for c in calls}) == 1
    assert [c.cached for c in calls] == [0, 848, 848]


def test_the_reverse_index_matches_every_worker_as_its_own_index_does() -> None:
    """``match_holders`` equals ``PrefixIndex.match`` worker by worker through records, evictions (small
    capacities), clears and readiness times; an index cleared or evicted leaves no trace in the reverse index."""
    import random

    from gateway.core.prefix import Holders, match_holders

    rng = random.Random(3)
    holders: Holders = {}
    ixs = [PrefixIndex(rng.choice([300, 1000, 5000]), holders, w) for w in range(6)]
    names = [f"s{i}" for i in range(8)]
    for step in range(3000):
        now = step * 0.1
        chain = [PrefixSeg(rng.choice(names), rng.choice([16, 64, 256]), per_query=rng.random() < 0.3)]
        while rng.random() < 0.6:
            chain.append(PrefixSeg(rng.choice(names), rng.choice([16, 64, 256])))
        keys = segment_keys(chain, rng.randrange(3))
        got = match_holders(holders, keys, now)
        for w, ix in enumerate(ixs):
            assert got.get(w, 0) == ix.match(keys, now)
        r = rng.random()
        if r < 0.6:
            ixs[rng.randrange(6)].record(keys, now + rng.choice([0.0, 0.5, 3.0]))
        elif r < 0.62:
            ixs[rng.randrange(6)].clear()
    for ix in ixs:
        ix.clear()
    assert holders == {}
