"""The segment-based engine agrees with an iteration-by-iteration reference model of vLLM batching."""

from __future__ import annotations

import heapq
import random

import pytest

from gateway.core.profile import PerfProfile
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from gateway.sim.engine import SimEngine

PROFILE = PerfProfile("X", "m", 0.02, 2e-4, 5e-8, 0.0, 60_000, 6, 512)


def _call(i: int, n_in: int, n_out: int) -> Call:
    spec = CallSpec("x", n_in, n_out)
    wf = StagedWorkflow(i, "t", 0.0, 1e9, [Stage("x", (spec,))])
    return Call(i, wf, spec, 0.0, seq=i)


def run_engine(p: PerfProfile, arrivals: list[tuple[float, int, int]]) -> dict[int, float]:
    """Drive SimEngine the way the simulator does; return finish time per call index."""
    eng = SimEngine(p)
    events: list[tuple[float, int, int, int]] = [(t, 0, i, 0) for i, (t, _, _) in enumerate(arrivals)]
    heapq.heapify(events)
    calls = [_call(i, n_in, n_out) for i, (_, n_in, n_out) in enumerate(arrivals)]
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
        if changed:
            seq += 1
            heapq.heappush(events, (eng.wake_at, 1, seq, eng.version))
    return done


def reference(p: PerfProfile, arrivals: list[tuple[float, int, int]]) -> dict[int, float]:
    """vLLM's loop, one iteration at a time: admit FIFO (max_num_seqs, KV), decode 1 token per running
    call, fill the rest of the token budget with prompt chunks FIFO."""
    pending = sorted(range(len(arrivals)), key=lambda i: (arrivals[i][0], i))
    waiting: list[int] = []
    running: list[dict[str, int]] = []
    kv = 0
    t = 0.0
    done: dict[int, float] = {}
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
            running.append({"i": i, "pre": arrivals[i][1], "done_pre": 0, "out": arrivals[i][2], "ctx": 0, "kv": need})
        if not running:
            t = arrivals[pending[0]][0]
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
        t += p.iter_time(tokens, ctx)
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
                r["out"] -= 1  # the last prompt chunk yields the first token
                if r["out"] == 0:
                    finished.append(r)
        for r in finished:
            running.remove(r)
            kv -= r["kv"]
            done[r["i"]] = t
    return done


@pytest.mark.parametrize("seed", range(6))
def test_engine_matches_iteration_by_iteration_reference(seed: int) -> None:
    rng = random.Random(seed)
    t = 0.0
    arrivals = []
    for _ in range(25):
        t += rng.expovariate(1.0)
        arrivals.append((t, rng.choice([1, 40, 300, 700, 2500, 9000]), rng.choice([1, 2, 5, 30, 120])))
    got = run_engine(PROFILE, arrivals)
    want = reference(PROFILE, arrivals)
    assert set(got) == set(want) == set(range(len(arrivals)))
    for i in want:
        assert got[i] == pytest.approx(want[i], rel=1e-9, abs=1e-9), i


def test_lone_request_takes_the_closed_form_latency() -> None:
    got = run_engine(PROFILE, [(3.0, 4000, 200)])
    assert got[0] - 3.0 == pytest.approx(PROFILE.engine_latency(4000, 200), rel=1e-12)


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
