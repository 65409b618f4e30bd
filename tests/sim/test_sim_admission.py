"""Admission in the simulator (``Simulator(admission=True)``): the live gateway's predictive admission,
replayed, keeps its promises under overload where admitting everything keeps none."""

from __future__ import annotations

import random

import pytest

from gateway.bench.bound import fluid_bound
from gateway.bench.simbench import Setup
from gateway.config import load_cluster
from gateway.sim.simulator import Simulator
from gateway.sim.workload import load_queries


def overload(policy: str, admission: bool, factor: float = 5.0) -> tuple[int, int, int, float]:
    """(arrived, accepted, met, goodput per second) of 300 CHESS workflows at ``factor`` x the fluid bound."""
    workers = load_cluster("paper-4gpu")
    queries = load_queries("chess-bird", 300, random.Random(0))
    setup = Setup(workers=workers, queries=queries, trace="chess-bird", n_workflows=300, slo_scale=5.0)
    wfs = setup.workflows(factor * fluid_bound(workers, queries))
    res = Simulator(workers, policy, admission=admission).run(wfs)
    met = sum(1 for r in res.workflows if r.met)
    span = wfs[-1].arrival - wfs[0].arrival
    assert res.unfinished == 0
    assert len(res.workflows) + len(res.rejected) == len(wfs)
    return len(wfs), len(wfs) - len(res.rejected), met, met / span


@pytest.mark.parametrize("policy", ["hexgen", "lw-fcfs"])
def test_admission_keeps_its_promises_under_5x_overload(policy: str) -> None:
    n, accepted, met, goodput = overload(policy, admission=True)
    n0, accepted0, met0, goodput0 = overload(policy, admission=False)
    assert accepted0 == n0 and met0 < 0.1 * n0  # everything admitted: almost nothing in time
    assert 0 < accepted < n  # refuses most of the overload ...
    assert met >= 0.95 * accepted  # ... and serves what it accepts in time
    assert goodput > 5 * goodput0


def test_admission_off_changes_nothing() -> None:
    workers = load_cluster("paper-4gpu")
    queries = load_queries("chess-bird", 60, random.Random(1))
    setup = Setup(workers=workers, queries=queries, trace="chess-bird", n_workflows=60, slo_scale=3.0, seed=1)
    wfs = setup.workflows(0.5 * fluid_bound(workers, queries))
    a = Simulator(workers, "hexgen").run([w.fresh() for w in wfs])
    b = Simulator(workers, "hexgen", admission=False).run([w.fresh() for w in wfs])
    assert [(r.wid, r.finish) for r in a.workflows] == [(r.wid, r.finish) for r in b.workflows] and not b.rejected


def test_admission_headroom_must_be_a_share() -> None:
    with pytest.raises(ValueError, match="admission_headroom"):
        Simulator(load_cluster("paper-4gpu"), "hexgen", admission=True, admission_headroom=1.5)
