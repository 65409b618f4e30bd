"""Split calls in the simulated engine (prefill/decode disaggregation): a prefill keeps its KV until released, a
decode takes its slot and KV at admission, waits for the KV to arrive, then decodes as the closed form says."""

from __future__ import annotations

import pytest

from gateway.core.profile import PerfProfile
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from gateway.sim.engine import SimEngine

PROFILE = PerfProfile("X", "m", 0.02, 2e-4, 5e-8, 0.0, 60_000, 6, 512, seq_s=1e-4)
LINK = (0.002, 1e-6)  # latency, seconds per token


def _call(i: int, n_in: int, n_out: int) -> Call:
    spec = CallSpec("x", n_in, n_out)
    wf = StagedWorkflow(i, "t", 0.0, 1e9, [Stage("x", (spec,))])
    return Call(i, wf, spec, 0.0, seq=i)


def _run(eng: SimEngine, t: float) -> tuple[float, list[Call]]:
    """Run the engine from ``t`` to its next wake-up; (that time, the calls finished then)."""
    assert eng.busy
    t = eng.wake_at
    return t, eng.on_wake(t)


def _decode_s(p: PerfProfile, n_in: int, steps: int) -> float:
    """Iteration by iteration: ``steps`` decode steps of a lone call whose context starts at ``n_in``."""
    t, ctx = 0.0, float(n_in)
    for _ in range(steps):
        t += p.iter_base_s + p.token_s + p.ctx_s * ctx + p.seq_s
        ctx += 1
    return t


def test_a_prefill_stops_at_its_first_token_and_keeps_its_kv_until_released() -> None:
    eng = SimEngine(PROFILE)
    c = _call(1, 4000, 300)
    eng.add(c, prefill_only=True)
    assert eng.kick(0.0)
    t, done = _run(eng, 0.0)
    while not done:
        eng.kick(t)
        t, done = _run(eng, t)
    assert done == [c] and t == pytest.approx(PROFILE.prefill_time(4000), rel=1e-12)
    assert not eng.kick(t) and eng.running == 0
    assert eng.kv_used == eng.held_kv == 4001 and eng.stats.max_held_kv == 4001
    assert not eng.release(c), "nothing waits: nothing to kick"
    assert eng.kv_used == eng.held_kv == 0 and not eng.release(c)


def test_held_kv_keeps_a_waiting_call_out_until_released() -> None:
    small = PerfProfile("X", "m", 0.02, 2e-4, 5e-8, 0.0, 6000, 6, 512)
    eng = SimEngine(small)
    first, second = _call(1, 4000, 10), _call(2, 3000, 10)
    eng.add(first, prefill_only=True)
    eng.kick(0.0)
    t, done = 0.0, list[Call]()
    while not done:
        t, done = _run(eng, t)
        eng.kick(t)
    eng.add(second)
    assert not eng.kick(t) and eng.running == 0, "4001 held + 3010 > 6000: it waits"
    assert eng.release(first) and eng.kick(t) and eng.running == 1


def test_a_lone_split_decode_waits_for_its_kv_then_decodes_as_the_closed_form() -> None:
    eng = SimEngine(PROFILE)
    c = _call(1, 4000, 300)
    eng.add(c, remote=LINK)
    assert not eng.kick(5.0), "only KV arriving: nothing to compute"
    assert eng.running == 1 and eng.kv_used == 4300
    [(call, until)] = eng.started_loads()
    assert call is c and until == pytest.approx(5.0 + 0.002 + 4000 * 1e-6)
    assert eng.started_loads() == []
    assert eng.progress(c, until) == (0, None)
    assert eng.loaded(c, until)
    t, done = until, list[Call]()
    while not done:
        t, done = _run(eng, t)
        eng.kick(t)
    assert done == [c] and t - until == pytest.approx(_decode_s(PROFILE, 4000, 299), rel=1e-9)
    assert eng.stats.loaded_tokens == 4000 and eng.stats.prompt_tokens == 0
    assert eng.kv_used == 0 and eng.running == 0


@pytest.mark.parametrize(("delay", "cut"), [(0.0123, False), (0.0523, True)])
def test_a_split_decode_joins_a_running_batch_at_the_next_iteration_boundary(delay: float, cut: bool) -> None:
    """Its KV arrives inside the running segment's last iteration (it joins at the segment's end) or before it (the
    segment is cut at the next boundary)."""
    p = PROFILE
    eng = SimEngine(p)
    other, c = _call(1, 1, 2000), _call(2, 1000, 50)
    eng.add(other)
    eng.add(c, remote=(0.0, 0.0))
    eng.kick(0.0)
    [(_, until)] = eng.started_loads()
    arrive = until + delay
    while eng.busy and eng.wake_at <= arrive:  # (the simulator's events before the KV's)
        eng.on_wake(eng.wake_at)
        eng.kick(eng.wake_at)
    assert eng.loaded(c, arrive) is cut
    t, done = arrive, list[Call]()
    while c not in done:
        t, done = _run(eng, t)
        eng.kick(t)
    # Iteration by iteration: the other call's one-token prompt, then its decode alone until the first boundary at
    # or after ``arrive``, then both decode (the split call's 1000-token prompt is context from then on).
    now, ctx = p.iter_base_s + p.token_s, 1.0
    while now < arrive - 1e-12:
        now += p.iter_base_s + p.token_s + p.ctx_s * ctx + p.seq_s
        ctx += 1
    ctx += 1000
    for _ in range(49):
        now += p.iter_base_s + 2 * p.token_s + p.ctx_s * ctx + 2 * p.seq_s
        ctx += 2
    assert t == pytest.approx(now, rel=1e-9)
    assert eng.stats.loaded_tokens == 1000


def test_cancelling_a_split_decode_whose_kv_is_arriving_frees_its_slot_and_kv() -> None:
    eng = SimEngine(PROFILE)
    c = _call(1, 4000, 300)
    eng.add(c, remote=LINK)
    eng.kick(0.0)
    assert eng.running == 1
    assert not eng.cancel(c, 0.001)
    assert eng.running == 0 and eng.kv_used == 0
    assert not eng.loaded(c, 1.0), "its KV arriving later changes nothing"


def test_a_call_is_either_a_prefill_or_a_decode_and_a_decode_has_tokens_to_make() -> None:
    eng = SimEngine(PROFILE)
    with pytest.raises(ValueError, match="either"):
        eng.add(_call(1, 10, 10), prefill_only=True, remote=LINK)
    with pytest.raises(ValueError, match="2 output tokens"):
        eng.add(_call(2, 10, 1), remote=LINK)
