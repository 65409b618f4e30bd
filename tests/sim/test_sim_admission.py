"""Admission in the simulator (``Simulator(admission=True)``): the live gateway's predictive admission,
replayed, keeps its promises under overload where admitting everything keeps none."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from gateway.bench.bound import fluid_bound
from gateway.bench.simbench import Setup
from gateway.config import load_cluster
from gateway.core.workflow import StagedWorkflow
from gateway.sim.simulator import SimResult, Simulator
from gateway.sim.workload import load_queries


def fresh(wfs: Sequence[StagedWorkflow]) -> list[StagedWorkflow]:
    """Unstarted copies of ``wfs``, to run them again."""
    return [w.shifted(w.arrival, w.deadline) for w in wfs]


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
    assert len(res.workflows) + len(res.rejected) + len(res.shed) == len(wfs)
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
    a = Simulator(workers, "hexgen").run(fresh(wfs))
    b = Simulator(workers, "hexgen", admission=False).run(fresh(wfs))
    assert [(r.wid, r.finish) for r in a.workflows] == [(r.wid, r.finish) for r in b.workflows] and not b.rejected


def test_admission_headroom_must_be_a_share() -> None:
    with pytest.raises(ValueError, match="admission_headroom"):
        Simulator(load_cluster("paper-4gpu"), "hexgen", admission=True, admission_headroom=1.5)


def test_admission_share_and_miss_are_checked() -> None:
    workers = load_cluster("paper-4gpu")
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="admission_share"):
            Simulator(workers, "hexgen", admission=True, admission_share=bad)
    with pytest.raises(ValueError, match="admission_miss"):
        Simulator(workers, "hexgen", admission=True, admission_miss="shed")


def run_at(factor: float, **kw: Any) -> tuple[int, SimResult]:
    workers = load_cluster("paper-4gpu")
    queries = load_queries("chess-bird", 200, random.Random(2))
    setup = Setup(workers=workers, queries=queries, trace="chess-bird", n_workflows=200, slo_scale=3.0, seed=2)
    wfs = setup.workflows(factor * fluid_bound(workers, queries))
    return len(wfs), Simulator(workers, "hexgen", admission=True, **kw).run(wfs)


def test_a_larger_share_refuses_less_and_no_more_than_a_smaller_one() -> None:
    """The share is the throughput the work ahead is forecast at: a larger one predicts sooner completions, so
    it refuses a subset's worth less at the same load (same arrivals, same seed)."""
    _, tight = run_at(0.6, admission_share=0.25)
    _, loose = run_at(0.6, admission_share=1.0)
    assert len(loose.rejected) < len(tight.rejected)


def test_best_effort_admits_every_workflow_but_a_deadline_no_wait_can_meet_and_marks_the_predicted_misses() -> None:
    """As the gateway: a predicted miss runs at the lowest urgency; a deadline shorter than the workflow takes even
    on idle workers (the forecast calibrated) is refused whatever the tenant says."""
    n, refused = run_at(1.5, admission_share=0.25)
    n2, demoted = run_at(1.5, admission_share=0.25, admission_miss="best_effort", best_effort_max_age=None)
    assert n == n2
    assert refused.rejected and not refused.demoted and not refused.shed
    assert demoted.demoted and len(demoted.rejected) < 0.05 * n and not demoted.shed
    assert len(demoted.workflows) + len(demoted.rejected) == n  # every admitted one ran to its end


def test_best_effort_work_past_its_age_limit_is_shed_as_the_gateway_sheds_it() -> None:
    n, aged = run_at(1.5, admission_share=0.25, admission_miss="best_effort")  # the gateway's default limit: 4x
    assert aged.shed and set(aged.shed) <= set(aged.demoted)
    assert len(aged.workflows) + len(aged.rejected) + len(aged.shed) == n and aged.unfinished == 0
    assert not {r.wid for r in aged.workflows} & set(aged.shed)


def test_a_cold_start_admits_on_unchecked_forecasts_and_sheds_what_falls_behind() -> None:
    """A gateway just started (``admission_warm=False``) refuses only what cannot make it even at full throughput
    until its forecast is checked: under 5x overload it admits more than a warm one, and the overload re-check
    sheds the admitted workflows predicted past their deadlines."""
    workers = load_cluster("paper-4gpu")
    queries = load_queries("chess-bird", 300, random.Random(0))
    setup = Setup(workers=workers, queries=queries, trace="chess-bird", n_workflows=300, slo_scale=5.0)
    wfs = setup.workflows(5.0 * fluid_bound(workers, queries))
    warm = Simulator(workers, "hexgen", admission=True).run(fresh(wfs))
    cold = Simulator(workers, "hexgen", admission=True, admission_warm=False).run(fresh(wfs))
    assert len(cold.rejected) < len(warm.rejected) and cold.shed and not warm.shed
    assert len(cold.workflows) + len(cold.rejected) + len(cold.shed) == len(wfs) and cold.unfinished == 0


def test_best_effort_work_does_not_crowd_out_the_admitted_under_overload() -> None:
    """Best effort under 2x overload serves about as many deadlines as rejecting, and keeps its promises: the
    demoted workflows' calls neither count in the queues urgent arrivals are predicted against nor start on
    busy workers (before, 95%+ of arrivals ended up demoted and almost none met their deadline)."""
    workers = load_cluster("paper-4gpu")
    queries = load_queries("chess-bird", 300, random.Random(0))
    setup = Setup(workers=workers, queries=queries, trace="chess-bird", n_workflows=300, slo_scale=3.0)
    wfs = setup.workflows(2.0 * fluid_bound(workers, queries))
    rej = Simulator(workers, "hexgen", admission=True).run(fresh(wfs))
    be = Simulator(workers, "hexgen", admission=True, admission_miss="best_effort").run(fresh(wfs))
    met_rej = sum(1 for r in rej.workflows if r.met)
    low = set(be.demoted)
    kept = [r for r in be.workflows if r.wid not in low]
    assert be.unfinished == 0 and len(be.rejected) < 0.05 * len(wfs) and 0 < len(low) < len(wfs)
    assert sum(1 for r in kept if r.met) >= 0.95 * len(kept)
    assert sum(1 for r in be.workflows if r.met) >= 0.8 * met_rej
