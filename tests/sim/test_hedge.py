"""Hedging a straggling critical-path call in the simulator (``Simulator(hedge=HedgeSettings())``)."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.config import load_gpu_catalog
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import CallSpec, Stage, StagedWorkflow
from gateway.sim.simulator import HedgeSettings, Simulator

A100 = load_gpu_catalog().profile("A100", "llama-3.1-8b")


def _workflows(n: int, gap_s: float) -> list[StagedWorkflow]:
    """``n`` two-stage workflows (two parallel candidates, then one revise), ``gap_s`` apart."""
    out = []
    for i in range(n):
        cand = CallSpec("generate_candidate", 6000, 300)
        revise = CallSpec("revise", 4000, 200)
        stages = [Stage("c", (cand, cand)), Stage("r", (revise,))]
        out.append(StagedWorkflow(i, "t", i * gap_s, i * gap_s + 1e4, stages))
    return out


def _cluster() -> list[WorkerInfo]:
    return [WorkerInfo("a", A100, 8), WorkerInfo("b", A100, 8)]


def test_a_straggler_on_a_mislabelled_worker_is_hedged_and_the_copy_wins() -> None:
    # Worker a's engine runs 6x slower than its label says: every call there straggles.
    slow = dataclasses.replace(A100, iter_base_s=A100.iter_base_s * 6, token_s=A100.token_s * 6)
    truth = [slow, A100]
    plain = Simulator(_cluster(), "lw-fcfs", engine_profiles=truth).run(_workflows(6, 200.0))
    sim = Simulator(_cluster(), "lw-fcfs", engine_profiles=truth, hedge=HedgeSettings())
    hedged = sim.run(_workflows(6, 200.0))
    assert sim.hedges > 0 and 0 < sim.hedges_won <= sim.hedges
    assert len(hedged.workflows) == len(plain.workflows) == 6 and hedged.unfinished == 0
    # Every workflow completed once, no slower, and in total faster.
    lat = {r.wid: r.finish - r.arrival for r in hedged.workflows}
    base = {r.wid: r.finish - r.arrival for r in plain.workflows}
    assert all(lat[w] <= base[w] + 1e-9 for w in base)
    assert sum(lat.values()) < 0.8 * sum(base.values())
    # The losers were aborted: nothing left running or holding KV, and the scheduler's slots are free.
    for eng in sim.engines:
        assert eng.running == 0 and eng.kv_used == 0 and not eng.waiting
    assert sum(e.stats.cancelled for e in sim.engines) > 0
    assert all(sim.scheduler.inflight(w) == 0 for w in range(2))
    assert hedged.num_calls == plain.num_calls + sim.hedges


def test_calls_that_run_as_predicted_are_never_hedged() -> None:
    wfs = _workflows(20, 30.0)
    plain = Simulator(_cluster(), "hexgen", alpha=0.3).run(wfs)
    sim = Simulator(_cluster(), "hexgen", alpha=0.3, hedge=HedgeSettings())
    hedged = sim.run(_workflows(20, 30.0))
    assert sim.hedges == 0
    assert [(r.wid, r.finish) for r in hedged.workflows] == [(r.wid, r.finish) for r in plain.workflows]


def test_hedge_settings_are_checked() -> None:
    for bad in ({"after": 0.0}, {"after": float("inf")}, {"gain": 0.0}, {"gain": 1.5}):
        with pytest.raises(ValueError, match="hedge"):
            HedgeSettings(**bad)
