"""Degradation replayed in the simulator: traced stages follow the knobs; steady load degrades nothing."""

from __future__ import annotations

import random

from gateway.config.cluster import load_cluster
from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.degrade import FLOOR, Degrader, Knobs, QualityMode, quality_from_rows
from gateway.core.workflow import CANDIDATE, EVALUATE, REVISE, UNIT_TEST, CallSpec, StagedWorkflow
from gateway.sim.degrade import KnobbedWorkflow
from gateway.sim.simulator import Simulator
from gateway.sim.workload import TenantSpec, build_workload, poisson_arrivals
from gateway.sim.workload.traces import to_stages

FULL = Knobs(2, 10, True)
Q = quality_from_rows([(2, 10, True, 1.0), (2, 10, False, 0.9), (1, 1, False, 0.8)])


def _query(revisions: int = 3, evaluations: int = 4) -> list[CallSpec]:
    calls = [CallSpec("information_retriever", 300, 5), CallSpec("extract_keywords", 660, 45)]
    calls += [CallSpec(CANDIDATE, 10000, 680)] * 2
    calls += [CallSpec(REVISE, 6000, 80)] * revisions
    calls += [CallSpec("unit_tester", 275, 4), CallSpec(UNIT_TEST, 1100, 100), CallSpec("unit_tester", 275, 4)]
    calls += [CallSpec(EVALUATE, 960, 22)] * evaluations
    return calls


def _run_stages(wf: KnobbedWorkflow) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    nxt = wf.start()
    while nxt:
        out.append((nxt[0].kind, len(nxt)))
        done: list[CallSpec] = []
        for spec in nxt:
            done = wf.complete(spec)
        nxt = done
    return out


def test_full_knobs_replay_the_trace() -> None:
    wf = KnobbedWorkflow(0, "t", 0.0, 100.0, to_stages(_query()), template=CHESS_TEMPLATE, full=FULL)
    stages = _run_stages(wf)
    assert (CANDIDATE, 2) in stages and stages.count((REVISE, 1)) == 3 and (EVALUATE, 4) in stages
    assert wf.done and not wf.degraded and wf.used == FULL


def test_floor_cuts_candidates_revisions_and_evaluation() -> None:
    wf = KnobbedWorkflow(0, "t", 0.0, 100.0, to_stages(_query()), template=CHESS_TEMPLATE, full=FULL, knobs=FLOOR)
    stages = _run_stages(wf)
    assert (CANDIDATE, 1) in stages
    assert stages.count((REVISE, 1)) == 1
    assert not any(k in (EVALUATE, UNIT_TEST) for k, _ in stages)
    assert wf.done and wf.degraded and wf.used == FLOOR


def test_a_cap_above_the_traced_rounds_is_not_a_cut() -> None:
    wf = KnobbedWorkflow(
        0, "t", 0.0, 100.0, to_stages(_query(revisions=1)), template=CHESS_TEMPLATE, full=FULL, knobs=Knobs(2, 2, True)
    )
    _run_stages(wf)
    assert wf.used == FULL and not wf.degraded


def _workload(mode: QualityMode, rate: float, n: int = 200) -> list[StagedWorkflow]:
    arrivals = poisson_arrivals(n, rate, random.Random(1))
    queries = [_query(r % 4, 3 + r % 3) for r in range(20)]
    return build_workload(
        queries, arrivals, tenants=[TenantSpec("a", quality=mode)], slo_s=120.0, rng=random.Random(2), quality=Q
    )


def test_light_load_degrades_nothing_and_overload_degrades() -> None:
    paper_workers = load_cluster("paper-4gpu")
    light = Simulator(paper_workers, "hexgen", seed=0).run(_workload("adaptive", 0.02))
    assert len(light.workflows) == 200
    assert not any(r.degraded for r in light.workflows)
    heavy_full = Simulator(paper_workers, "hexgen", seed=0).run(_workload("full", 0.5))
    heavy = Simulator(paper_workers, "hexgen", seed=0).run(_workload("adaptive", 0.5))
    assert sum(r.degraded for r in heavy.workflows) > 20
    assert not any(r.degraded for r in heavy_full.workflows)
    # Less work per question under overload: more deadlines met.
    assert sum(r.met for r in heavy.workflows) > sum(r.met for r in heavy_full.workflows)


def test_fast_mode_always_runs_the_floor() -> None:
    paper_workers = load_cluster("paper-4gpu")
    res = Simulator(paper_workers, "hexgen", seed=0).run(_workload("fast", 0.02, n=30))
    # One candidate, no evaluation; the revision cap counts only where the trace had more rounds.
    assert all(r.knobs is not None and r.knobs.candidates == 1 and not r.knobs.evaluate for r in res.workflows)
    assert all(
        r.knobs is not None and r.knobs.max_revisions in (FLOOR.max_revisions, FULL.max_revisions)
        for r in res.workflows
    )
    assert sum(r.degraded for r in res.workflows) == 30


def test_build_workload_needs_a_quality_model_to_degrade() -> None:
    import pytest

    with pytest.raises(ValueError, match="quality model"):
        build_workload(
            [_query()], [0.0], tenants=[TenantSpec("a", quality="adaptive")], slo_s=10.0, rng=random.Random(0)
        )
    deg = Degrader("adaptive", FULL, Q)
    assert deg.full == FULL
