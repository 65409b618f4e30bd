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


def _run_until(wf: KnobbedWorkflow, late_after: str) -> list[tuple[str, int]]:
    """``_run_stages``, the clock passing the deadline when the first ``late_after`` stage returns."""
    out: list[tuple[str, int]] = []
    nxt = wf.start()
    while nxt:
        out.append((nxt[0].kind, len(nxt)))
        if nxt[0].kind == late_after:
            wf.clock = wf.deadline + 1.0
        done: list[CallSpec] = []
        for spec in nxt:
            done = wf.complete(spec)
        nxt = done
    return out


def test_the_deadline_rule_starts_no_revision_or_evaluation_past_the_deadline() -> None:
    """The live pipeline's rule, replayed for every quality mode: past the deadline no new revise round
    starts and evaluation that has not begun is skipped; begun, it finishes. Not a degradation."""
    stages = to_stages(_query())
    late = KnobbedWorkflow(0, "t", 0.0, 100.0, stages, template=CHESS_TEMPLATE, full=FULL, deadline_rule=True)
    got = _run_until(late, REVISE)
    assert got.count((REVISE, 1)) == 1 and not any(k in (UNIT_TEST, EVALUATE, "unit_tester") for k, _ in got)
    assert late.done and not late.degraded and late.used == FULL
    begun = KnobbedWorkflow(0, "t", 0.0, 100.0, stages, template=CHESS_TEMPLATE, full=FULL, deadline_rule=True)
    got = _run_until(begun, "unit_tester")
    assert (EVALUATE, 4) in got and got.count((REVISE, 1)) == 3
    off = KnobbedWorkflow(0, "t", 0.0, 100.0, stages, template=CHESS_TEMPLATE, full=FULL)
    assert _run_until(off, REVISE) == _run_stages(
        KnobbedWorkflow(0, "t", 0.0, 100.0, stages, template=CHESS_TEMPLATE, full=FULL)
    ), "without the rule the clock changes nothing"


def test_build_workload_gives_full_quality_the_deadline_rule_when_asked() -> None:
    arrivals = poisson_arrivals(20, 1.0, random.Random(0))
    wfs = build_workload([_query()], arrivals, tenants=[TenantSpec("t")], slo_s=50.0, rng=random.Random(0))
    assert not any(isinstance(w, KnobbedWorkflow) for w in wfs)
    ruled = build_workload(
        [_query()], arrivals, tenants=[TenantSpec("t")], slo_s=50.0, rng=random.Random(0), deadline_rule=True
    )
    assert all(isinstance(w, KnobbedWorkflow) and w.deadline_rule and w.degrader is None for w in ruled)
