"""The segment-based engine agrees with an iteration-by-iteration reference model of vLLM batching."""

from __future__ import annotations

import heapq
import random
from dataclasses import replace
from typing import TypedDict

import pytest

from gateway.core.prefix import Key, PrefixSeg, cached_tokens, segment_keys
from gateway.core.profile import PerfProfile
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from gateway.sim.engine import SimEngine

PROFILE = PerfProfile("X", "m", 0.02, 2e-4, 5e-8, 0.0, 60_000, 6, 512)


def _call(i: int, n_in: int, n_out: int) -> Call:
    spec = CallSpec("x", n_in, n_out)
    wf = StagedWorkflow(i, "t", 0.0, 1e9, [Stage("x", (spec,))])
    return Call(i, wf, spec, 0.0, seq=i)


def run_engine_with(
    p: PerfProfile, arrivals: list[tuple[float, int, int]], cancels: dict[int, float] | None = None
) -> tuple[dict[int, float], SimEngine]:
    """Drive SimEngine the way the simulator does, with ``cancels`` (call index -> time: ``SimEngine.cancel``
    then); return the finish time per call index, and the engine."""
    cancels = cancels or {}
    eng = SimEngine(p)
    events: list[tuple[float, int, int, int]] = [(t, 0, i, 0) for i, (t, _, _) in enumerate(arrivals)]
    events += [(t, 2, i, 0) for i, t in cancels.items()]
    heapq.heapify(events)
    calls = [_call(i, n_in, n_out) for i, (_, n_in, n_out) in enumerate(arrivals)]
    done: dict[int, float] = {}
    seq = len(arrivals) + len(cancels)
    while events:
        t, kind, i, version = heapq.heappop(events)
        if kind == 0:
            eng.add(calls[i])
            changed = eng.kick(t)
        elif kind == 2:
            changed = eng.cancel(calls[i], t)
        else:
            if version != eng.version or not eng.busy:
                continue
            for c in eng.on_wake(t):
                done[c.id] = t
            changed = eng.kick(t)
        if changed:
            seq += 1
            heapq.heappush(events, (eng.wake_at, 1, seq, eng.version))
    return done, eng


def run_engine(p: PerfProfile, arrivals: list[tuple[float, int, int]]) -> dict[int, float]:
    """Finish time per call index (``run_engine_with`` without cancellations)."""
    return run_engine_with(p, arrivals)[0]


def reference(
    p: PerfProfile, arrivals: list[tuple[float, int, int]], cancels: dict[int, float] | None = None
) -> dict[int, float]:
    """vLLM's loop, one iteration at a time: admit FIFO (max_num_seqs, KV), decode 1 token per running
    call, fill the rest of the token budget with prompt chunks FIFO. A call cancelled at time c leaves at
    the first iteration boundary at or after c (finishing in that iteration first if it would), or the
    waiting queue at once."""
    cancels = cancels or {}
    pending = sorted(range(len(arrivals)), key=lambda i: (arrivals[i][0], i))
    waiting: list[int] = []
    running: list[dict[str, int]] = []
    kv = 0
    t = 0.0
    done: dict[int, float] = {}
    gone: set[int] = set()
    while pending or waiting or running:
        while pending and arrivals[pending[0]][0] <= t:
            waiting.append(pending.pop(0))
        for r in [r for r in running if cancels.get(r["i"], float("inf")) <= t]:
            running.remove(r)
            kv -= r["kv"]
            gone.add(r["i"])
        waiting = [i for i in waiting if cancels.get(i, float("inf")) > t]
        admitted = 0
        while waiting and len(running) < p.max_num_seqs:
            i = waiting[0]
            need = arrivals[i][1] + arrivals[i][2]
            if kv + need > p.kv_capacity_tokens and running:
                break
            waiting.pop(0)
            admitted += 1
            kv += need
            running.append({"i": i, "pre": arrivals[i][1], "done_pre": 0, "out": arrivals[i][2], "ctx": 0, "kv": need})
        if not running:
            nxt = [arrivals[pending[0]][0]] if pending else []
            nxt += [cancels[i] for i in waiting if cancels.get(i, float("inf")) > t]
            if not nxt:
                break
            t = min(nxt)
            continue
        decoders = [r for r in running if r["pre"] == 0]
        budget = p.max_batched_tokens - len(decoders)
        alloc: list[tuple[dict[str, int], int]] = []
        for r in running:
            if r["pre"] > 0 and budget > 0:
                k = min(r["pre"], budget)
                alloc.append((r, k))
                budget -= k
        tokens = len(decoders) + sum(k for _, k in alloc)
        ctx = sum(r["ctx"] for r in decoders) + sum(r["done_pre"] for r in running if r["pre"] > 0)
        pairs = sum(k * r["done_pre"] + k * (k + 1) / 2 for r, k in alloc)  # causal attention of the chunks
        t += p.iter_time(tokens, ctx, pairs, decoders=len(decoders)) + p.admit_s * admitted  # the intakes stall it
        finished = []
        for r in decoders:
            r["ctx"] += 1
            r["out"] -= 1
            if r["out"] == 0:
                finished.append(r)
        for r, k in alloc:
            r["pre"] -= k
            r["done_pre"] += k
            if r["pre"] == 0:
                r["ctx"] = r["done_pre"]
                r["out"] -= 1
                if r["out"] == 0:
                    finished.append(r)
        for r in finished:
            running.remove(r)
            kv -= r["kv"]
            done[r["i"]] = t
    return done


def random_arrivals(seed: int) -> list[tuple[float, int, int]]:
    """25 Poisson arrivals of mixed prompt and output lengths (long prompts span several chunks)."""
    rng = random.Random(seed)
    t = 0.0
    arrivals = []
    for _ in range(25):
        t += rng.expovariate(1.0)
        arrivals.append((t, rng.choice([1, 40, 300, 700, 2500, 9000]), rng.choice([1, 2, 5, 30, 120])))
    return arrivals


@pytest.mark.parametrize("seed", range(6))
def test_engine_matches_iteration_by_iteration_reference(seed: int) -> None:
    arrivals = random_arrivals(seed)
    got = run_engine(PROFILE, arrivals)
    want = reference(PROFILE, arrivals)
    assert set(got) == set(want) == set(range(len(arrivals)))
    for i in want:
        assert got[i] == pytest.approx(want[i], rel=1e-9, abs=1e-9), i


def test_lone_request_takes_the_closed_form_latency() -> None:
    got = run_engine(PROFILE, [(3.0, 4000, 200)])
    assert got[0] - 3.0 == pytest.approx(PROFILE.engine_latency(4000, 200), rel=1e-12)
    got = run_engine(PROFILE_ATTN, [(3.0, 4000, 200)])
    assert got[0] - 3.0 == pytest.approx(PROFILE_ATTN.engine_latency(4000, 200), rel=1e-12)
    assert PROFILE_ATTN.engine_latency(4000, 200) > PROFILE.engine_latency(4000, 200)


# Prefill attention as large as on the CPU's tiny model: a 2500-token prompt's pairs cost 1.5x its tokens.
PROFILE_ATTN = PerfProfile("X", "m", 0.02, 2e-4, 5e-8, 0.0, 60_000, 6, 512, attn_s=2.4e-7)


@pytest.mark.parametrize("seed", range(6))
def test_prefill_attention_matches_the_iteration_by_iteration_reference(seed: int) -> None:
    """With ``attn_s`` every iteration's attention pairs count: the engine's segments grow them as the head
    prompt's, and an iteration that ends one prompt and starts the next is a segment of its own."""
    arrivals = random_arrivals(seed)
    got = run_engine(PROFILE_ATTN, arrivals)
    want = reference(PROFILE_ATTN, arrivals)
    linear = reference(PROFILE, arrivals)
    assert set(got) == set(want) == set(range(len(arrivals)))
    errors = [abs(got[i] - want[i]) / (want[i] - arrivals[i][0]) for i in want]
    assert max(errors) < 1e-9, errors
    # The term matters: without it the same calls finish measurably earlier.
    assert sum(want[i] - linear[i] for i in want) > 0.05 * sum(want[i] - arrivals[i][0] for i in want)


# Host work per decoding call per step as on the CPU's vLLM (0.2 ms where a token's compute is 0.03 ms).
PROFILE_SEQ = PerfProfile("X", "m", 0.003, 3e-5, 5e-8, 0.0, 60_000, 6, 512, attn_s=2.4e-7, seq_s=2e-4)


@pytest.mark.parametrize("seed", range(6))
def test_per_call_step_cost_matches_the_iteration_by_iteration_reference(seed: int) -> None:
    """With ``seq_s`` every iteration costs that much more per decoding call (not per prompt chunk): the
    engine's segments charge it per decoder, exactly as the reference's iterations do."""
    arrivals = random_arrivals(seed)
    got = run_engine(PROFILE_SEQ, arrivals)
    want = reference(PROFILE_SEQ, arrivals)
    without = reference(replace(PROFILE_SEQ, seq_s=0.0), arrivals)
    assert set(got) == set(want) == set(range(len(arrivals)))
    errors = [abs(got[i] - want[i]) / (want[i] - arrivals[i][0]) for i in want]
    assert max(errors) < 1e-9, errors
    # The term is charged: calls that decode finish later than without it (about seq_s per decode step).
    steps = sum(a[2] - 1 for a in arrivals)
    assert sum(want[i] - without[i] for i in want) > 0.5 * steps * PROFILE_SEQ.seq_s


def test_per_call_step_cost_charges_decode_steps_not_prompts() -> None:
    """A lone call pays ``seq_s`` once per decode step after its first token; a prompt-only call not at all;
    n calls decoding together pay it n times per step."""
    q = PROFILE_SEQ
    base = replace(q, seq_s=0.0)
    assert q.engine_latency(3000, 1) == base.engine_latency(3000, 1)
    assert q.engine_latency(100, 51) - base.engine_latency(100, 51) == pytest.approx(50 * q.seq_s, rel=1e-9)
    got = run_engine(q, [(0.0, 8, 41)] * 4)
    got0 = run_engine(base, [(0.0, 8, 41)] * 4)
    assert got[0] - got0[0] == pytest.approx(40 * 4 * q.seq_s, rel=1e-9)
    assert q.iter_time(10, 0.0, decoders=4) - base.iter_time(10, 0.0, decoders=4) == pytest.approx(4 * q.seq_s)


# Intake on the engine's core as on the CPU's vLLM (6 ms per request against a 3 ms step).
PROFILE_ADMIT = replace(PROFILE_SEQ, admit_s=0.006)


@pytest.mark.parametrize("seed", range(6))
def test_intake_cost_matches_the_iteration_by_iteration_reference(seed: int) -> None:
    """With ``admit_s`` the iteration that admits calls is stalled by that much per call admitted: every call
    running then waits for it too, exactly as in the reference's iterations."""
    arrivals = random_arrivals(seed)
    got = run_engine(PROFILE_ADMIT, arrivals)
    want = reference(PROFILE_ADMIT, arrivals)
    assert set(got) == set(want) == set(range(len(arrivals)))
    errors = [abs(got[i] - want[i]) / (want[i] - arrivals[i][0]) for i in want]
    assert max(errors) < 1e-9, errors


def test_intake_stalls_a_running_decode_once_per_arrival() -> None:
    """A lone call pays its own intake once (``single_latency``); a call decoding while k others arrive (each
    finishing in its prefill iteration) is delayed by their k intakes beyond what their prompts cost."""
    q, base = PROFILE_ADMIT, PROFILE_SEQ
    assert q.single_latency(300, 20) - base.single_latency(300, 20) == pytest.approx(q.admit_s, rel=1e-9)
    alone = run_engine(q, [(0.0, 8, 200)])
    assert alone[0] == pytest.approx(q.engine_latency(8, 200) + q.admit_s, rel=1e-9)
    arrivals = [(0.0, 8, 200)] + [(0.1 + 0.05 * k, 16, 1) for k in range(5)]
    stalled = run_engine(q, arrivals)[0] - run_engine(base, arrivals)[0]
    assert stalled == pytest.approx(6 * q.admit_s, rel=1e-9)  # its own intake and the 5 arrivals'


def test_batching_two_requests_is_slower_than_one_but_faster_than_two_in_a_row() -> None:
    alone = PROFILE.engine_latency(2000, 300)
    got = run_engine(PROFILE, [(0.0, 2000, 300), (0.0, 2000, 300)])
    assert alone < max(got.values()) < 2 * alone


def test_kv_capacity_and_max_num_seqs_are_never_exceeded() -> None:
    rng = random.Random(3)
    arrivals = [(rng.random() * 5, rng.choice([3000, 9000, 20000]), rng.choice([10, 200])) for _ in range(40)]
    eng_profile = PROFILE
    eng = SimEngine(eng_profile)
    events = sorted((t, i) for i, (t, _, _) in enumerate(arrivals))
    i = 0
    finished = 0
    t_now = 0.0
    while finished < len(arrivals):
        next_arrival = events[i][0] if i < len(events) else float("inf")
        next_wake = eng.wake_at if eng.busy else float("inf")
        if next_arrival <= next_wake:
            t_now = next_arrival
            _, idx = events[i]
            i += 1
            eng.add(_call(idx, arrivals[idx][1], arrivals[idx][2]))
            eng.kick(t_now)
        else:
            t_now = next_wake
            finished += len(eng.on_wake(t_now))
            eng.kick(t_now)
        assert eng.running <= eng_profile.max_num_seqs
        assert eng.kv_used <= eng_profile.kv_capacity_tokens
    assert eng.stats.max_running <= eng_profile.max_num_seqs
    assert eng.stats.max_kv <= eng_profile.kv_capacity_tokens


# -- prefix caching -------------------------------------------------------------------------------------------

SHARED = [PrefixSeg("tpl-a", 600), PrefixSeg("tpl-b", 2000)]


def _prefixed_arrivals(seed: int, n: int = 30) -> list[tuple[float, int, int, int, tuple[PrefixSeg, ...]]]:
    """(time, input, output, workflow id, prefix): calls of a few workflows sharing templates and
    per-workflow segments, some arriving together (so some hits wait on a prompt still being computed)."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        if rng.random() < 0.7:
            t += rng.expovariate(2.0)
        wid = rng.randrange(4)
        chain: tuple[PrefixSeg, ...] = ()
        r = rng.random()
        if r < 0.4:
            chain = (rng.choice(SHARED),)
        elif r < 0.8:
            chain = (SHARED[0], PrefixSeg("q", rng.choice([500, 1500]) if wid % 2 else 900, per_query=True))
        prefix_len = sum(s.tokens for s in chain)
        n_in = prefix_len + rng.choice([1, 7, 40, 300])
        out.append((t, n_in, rng.choice([1, 3, 30, 90]), wid, chain))
    return out


def run_prefixed(
    p: PerfProfile, arrivals: list[tuple[float, int, int, int, tuple[PrefixSeg, ...]]]
) -> tuple[dict[int, float], SimEngine]:
    eng = SimEngine(p, prefix_caching=True)
    calls = []
    for i, (_, n_in, n_out, wid, chain) in enumerate(arrivals):
        spec = CallSpec("x", n_in, n_out, chain)
        calls.append(Call(i, StagedWorkflow(wid, "t", 0.0, 1e9, [Stage("x", (spec,))]), spec, 0.0, seq=i))
    events: list[tuple[float, int, int, int]] = [(t, 0, i, 0) for i, (t, *_rest) in enumerate(arrivals)]
    heapq.heapify(events)
    done: dict[int, float] = {}
    seq = len(events)
    while events:
        t, kind, i, version = heapq.heappop(events)
        if kind == 0:
            eng.add(calls[i])
            changed = eng.kick(t)
        else:
            if version != eng.version or not eng.busy:
                continue
            for c in eng.on_wake(t):
                done[c.id] = t
            changed = eng.kick(t)
        assert eng.evictable_tokens <= p.kv_capacity_tokens - eng.kv_used or eng.running == 0
        if changed:
            seq += 1
            heapq.heappush(events, (eng.wake_at, 1, seq, eng.version))
    return done, eng


class _RefRunning(TypedDict):
    """A running call in ``reference_prefixed``: its index, prompt tokens left and done, output tokens left,
    decode context, KV reserved, and the cache keys it pins."""

    i: int
    pre: int
    done_pre: int
    out: int
    ctx: int
    kv: int
    held: list[Key]


def reference_prefixed(
    p: PerfProfile, arrivals: list[tuple[float, int, int, int, tuple[PrefixSeg, ...]]]
) -> tuple[dict[int, float], int]:
    """``reference`` with vLLM's prefix cache: a prompt's segments are cached from its admission (vLLM caches
    blocks when it schedules them, and later calls' chunks come after), pinned while a call using them runs,
    otherwise kept in free KV and evicted least recently used first; an admitted call skips the whole blocks
    of its cached leading segments (never its last token)."""
    cache: dict[Key, list[int]] = {}  # key -> [tokens, pins, last use]
    clock = 0
    pending = sorted(range(len(arrivals)), key=lambda i: (arrivals[i][0], i))
    waiting: list[int] = []
    running: list[_RefRunning] = []
    kv = 0
    t = 0.0
    hits = 0
    done: dict[int, float] = {}

    def keys_of(i: int) -> list[tuple[Key, int]]:
        return segment_keys(arrivals[i][4], arrivals[i][3])

    while pending or waiting or running:
        while pending and arrivals[pending[0]][0] <= t:
            waiting.append(pending.pop(0))
        while waiting and len(running) < p.max_num_seqs:
            i = waiting[0]
            need = arrivals[i][1] + arrivals[i][2]
            if kv + need > p.kv_capacity_tokens and running:
                break
            waiting.pop(0)
            kv += need
            held: list[Key] = []
            matched = 0
            for key, tokens in keys_of(i):
                if key not in cache:
                    break
                clock += 1
                cache[key][1] += 1
                cache[key][2] = clock
                held.append(key)
                matched += tokens
            hit = cached_tokens(matched, arrivals[i][1])
            hits += hit
            for key, tokens in keys_of(i)[len(held) :]:
                clock += 1
                e = cache.setdefault(key, [tokens, 0, clock])
                e[1] += 1
                e[2] = clock
                held.append(key)
            running.append(
                {
                    "i": i,
                    "pre": arrivals[i][1] - hit,
                    "done_pre": hit,
                    "out": arrivals[i][2],
                    "ctx": 0,
                    "kv": need,
                    "held": held,
                }
            )
        free = p.kv_capacity_tokens - kv
        for key in sorted((k for k, e in cache.items() if not e[1]), key=lambda k: cache[k][2]):
            if sum(e[0] for e in cache.values() if not e[1]) <= free:
                break
            del cache[key]
        if not running:
            t = arrivals[pending[0]][0]
            continue
        decoders = [r for r in running if r["pre"] == 0]
        budget = p.max_batched_tokens - len(decoders)
        alloc: list[tuple[_RefRunning, int]] = []
        for r in running:
            if r["pre"] > 0 and budget > 0:
                k = min(r["pre"], budget)
                alloc.append((r, k))
                budget -= k
        tokens = len(decoders) + sum(k for _, k in alloc)
        ctx = sum(r["ctx"] for r in decoders) + sum(r["done_pre"] for r in running if r["pre"] > 0)
        # A chunk attends to the prompt before it, the cached prefix included.
        pairs = sum(k * r["done_pre"] + k * (k + 1) / 2 for r, k in alloc)
        t += p.iter_time(tokens, ctx, pairs, decoders=len(decoders))
        finished: list[_RefRunning] = []
        for r in decoders:
            r["ctx"] += 1
            r["out"] -= 1
            if r["out"] == 0:
                finished.append(r)
        for r, k in alloc:
            r["pre"] -= k
            r["done_pre"] += k
            if r["pre"] == 0:
                r["ctx"] = r["done_pre"]
                r["out"] -= 1
                if r["out"] == 0:
                    finished.append(r)
        for r in finished:
            running.remove(r)
            kv -= r["kv"]
            for key in r["held"]:
                cache[key][1] -= 1
            done[r["i"]] = t
    return done, hits


@pytest.mark.parametrize(("attn_s", "seq_s"), [(0.0, 0.0), (2.4e-7, 0.0), (2.4e-7, 2e-4)])
@pytest.mark.parametrize("kv_capacity", [60_000, 9_000])
@pytest.mark.parametrize("seed", range(4))
def test_prefix_cache_matches_the_reference_including_eviction(
    seed: int, kv_capacity: int, attn_s: float, seq_s: float
) -> None:
    p = PerfProfile("X", "m", 0.02, 2e-4, 5e-8, 0.0, kv_capacity, 6, 512, attn_s, seq_s=seq_s)
    arrivals = _prefixed_arrivals(seed)
    got, eng = run_prefixed(p, arrivals)
    want, hits = reference_prefixed(p, arrivals)
    assert set(got) == set(want) == set(range(len(arrivals)))
    for i in want:
        assert got[i] == pytest.approx(want[i], rel=1e-9, abs=1e-9), i
    assert eng.stats.prefix_hit_tokens == hits > 0
    assert eng.stats.prompt_tokens == sum(a[1] for a in arrivals)
    if kv_capacity == 9_000:
        assert eng.stats.evicted_tokens > 0


def test_a_cached_prefix_cuts_the_second_calls_latency_even_when_both_arrive_together() -> None:
    chain = (PrefixSeg("q", 4000, per_query=True),)
    # Two calls of one workflow: the second arrives after the first's prompt is processed.
    first, second = (0.0, 4100, 20, 1, chain), (10.0, 4100, 20, 1, chain)
    got, eng = run_prefixed(PROFILE, [first, second])
    assert got[1] - 10.0 < 0.5 * (got[0] - 0.0)
    assert eng.stats.prefix_hit_tokens == 4000  # whole blocks of the 4000 shared tokens
    # Another workflow's per-query segment is not shared.
    got, eng = run_prefixed(PROFILE, [first, (10.0, 4100, 20, 2, chain)])
    assert eng.stats.prefix_hit_tokens == 0
    # Arriving together: vLLM caches the first's blocks as it schedules them, and the second's chunks come
    # after them, so the second computes only its own 100 tokens and finishes right behind the first.
    alone, _ = run_prefixed(PROFILE, [first])
    got, eng = run_prefixed(PROFILE, [first, (0.0, 4100, 20, 1, chain)])
    assert eng.stats.prefix_hit_tokens == 4000
    assert got[1] < 1.2 * alone[0]
    # Without the shared chain the second call's prompt is computed in full and it finishes much later.
    got, eng = run_prefixed(PROFILE, [first, (0.0, 4100, 20, 2, chain)])
    assert eng.stats.prefix_hit_tokens == 0
    assert got[1] > 1.5 * alone[0]


def test_without_prefix_caching_prefixes_change_nothing() -> None:
    arrivals = _prefixed_arrivals(5)
    plain = run_engine(PROFILE, [(t, n_in, n_out) for t, n_in, n_out, _, _ in arrivals])
    want, hits = reference_prefixed(PROFILE, [(t, n_in, n_out, w, ()) for t, n_in, n_out, w, _ in arrivals])
    assert hits == 0
    for i in want:
        assert plain[i] == pytest.approx(want[i], rel=1e-9, abs=1e-9)


def test_cached_of_reports_each_calls_hit_while_it_runs() -> None:
    chain = (PrefixSeg("template", 1000),)
    eng = SimEngine(PROFILE, prefix_caching=True)
    wf = StagedWorkflow(1, "t", 0.0, 1e9, [Stage("x", (CallSpec("x", 1, 1),))])
    first, second, plain = (Call(i, wf, CallSpec("x", 1100, 5, chain if i < 3 else ()), 0.0) for i in (1, 2, 3))
    eng.add(first)
    eng.kick(0.0)
    assert eng.cached_of(first) == 0
    while eng.busy:  # run the first call to completion: its segment is cached
        t = eng.wake_at
        eng.on_wake(t)
        eng.kick(t)
    eng.add(second)
    eng.add(plain)
    assert eng.cached_of(second) == 0  # waiting: not admitted yet
    eng.kick(t)
    assert eng.cached_of(second) == cached_tokens(1000, 1100) == 992
    assert eng.cached_of(plain) == 0
    assert eng.stats.prefix_hit_tokens == 992
    while eng.busy:
        t = eng.wake_at
        eng.on_wake(t)
        eng.kick(t)
    assert eng.cached_of(second) == 0  # gone from the engine


def test_cancelled_calls_leave_the_batch_at_the_next_iteration_as_in_the_reference() -> None:
    took_effect = 0
    for seed in range(8):
        rng = random.Random(100 + seed)
        t = 0.0
        arrivals = []
        for _ in range(25):
            t += rng.expovariate(1.0)
            arrivals.append((t, rng.choice([1, 40, 300, 700, 2500, 9000]), rng.choice([1, 2, 5, 30, 120])))
        # A third of the calls cancelled: some while waiting, prefilling or decoding, some after they finished.
        cancels = {i: a[0] + rng.uniform(0.001, 6.0) for i, a in enumerate(arrivals) if rng.random() < 0.35}
        got, eng = run_engine_with(PROFILE, arrivals, cancels)
        want = reference(PROFILE, arrivals, cancels)
        assert set(got) == set(want), seed
        for i in want:
            assert got[i] == pytest.approx(want[i], rel=1e-9, abs=1e-9), (seed, i)
        assert eng.running == 0 and eng.kv_used == 0 and not eng.waiting and not eng.busy
        # Running calls aborted are counted; calls taken off the waiting queue are not.
        assert eng.stats.cancelled <= len(arrivals) - len(want)
        took_effect += len(arrivals) - len(want)
    assert took_effect >= 10
