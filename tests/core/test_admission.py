"""Admission in core (``gateway.core.admission``): the decision, the token's committed work, the overload
re-check's verdicts, and refusals as domain errors (no HTTP status)."""

from __future__ import annotations

import math
import random

import pytest

from gateway.core.admission import (
    AdmissionRefused,
    Admitter,
    DeadlineTooShort,
    NoWorkerCanRun,
    PredictedMiss,
    round_up,
    whole_seconds,
)
from gateway.core.degrade import BurstRegime
from gateway.core.predict import CompletionPredictor, calls_plan
from gateway.core.scheduler import Scheduler, WorkerInfo
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow, Workflow
from gateway.errors import DomainError, GatewayError

BIG = CallSpec("generate_candidate", 8000, 400)
PLAN = calls_plan([[BIG], [BIG]])


def _flow(wid: int, now: float, deadline_s: float) -> StagedWorkflow:
    return StagedWorkflow(wid, "t", now, now + deadline_s, [Stage(BIG.kind, (BIG,)), Stage(BIG.kind, (BIG,))])


def _admitter(cluster: list[WorkerInfo], **kw: object) -> Admitter:
    return Admitter(Scheduler(cluster, "hexgen", random.Random(0)), lenient_start=False, **kw)  # type: ignore[arg-type]


def test_refusals_are_domain_errors_without_an_http_status() -> None:
    for err in (PredictedMiss(10.0, 5.0, 3.2), DeadlineTooShort(1.0, 4.0, 0.9), NoWorkerCanRun()):
        assert isinstance(err, AdmissionRefused) and isinstance(err, DomainError)
        assert not isinstance(err, GatewayError) and not hasattr(err, "status")
    assert PredictedMiss(10.0, 5.0, 3.2).retry_after_s == 4
    assert DeadlineTooShort(1.0, 4.0, 0.9).min_deadline_s == round_up(4.0 / 0.9) == 4.5
    assert whole_seconds(math.inf) == 60 and whole_seconds(0.01) == 1


def test_the_token_owns_its_committed_work_until_taken_or_released(cluster: list[WorkerInfo]) -> None:
    adm = _admitter(cluster)
    a = adm.admit(0.0, PLAN, 1e6)
    work = CompletionPredictor(adm.scheduler, 0.0).plan_work(PLAN)
    assert a.work_s == pytest.approx(work) and adm.committed_s == pytest.approx(work)
    a.release()
    a.release()  # idempotent
    assert adm.committed_s == 0.0
    b = adm.admit(0.0, PLAN, 1e6)
    wf = _flow(1, 0.0, 1e6)
    adm.take(wf, b)
    b.release()  # taken over: the workflow holds it now
    assert adm.committed_of(wf) and adm.committed_s == pytest.approx(work)
    for spec in wf.start():
        adm.submitted(wf, spec, 0.0)
    assert adm.committed_s == pytest.approx(work / 2)
    adm.ended(wf, 10.0)
    assert adm.committed_s == 0.0 and not adm.committed_of(wf)


def test_a_deadline_no_wait_can_meet_is_refused_whatever_the_tenant_says(cluster: list[WorkerInfo]) -> None:
    adm = _admitter(cluster)
    with pytest.raises(DeadlineTooShort) as info:
        adm.admit(0.0, PLAN, 0.01, best_effort_on_miss=True)
    path = CompletionPredictor(adm.scheduler, 0.0).critical_path(PLAN)
    assert info.value.min_deadline_s >= path / adm.headroom
    assert adm.committed_s == 0.0
    unchecked = adm.admit(0.0, PLAN, 0.01, checked=False)  # not checked: admitted, its work committed
    assert not unchecked.best_effort and adm.committed_s > 0.0


def test_a_predicted_miss_is_refused_or_admitted_at_the_lowest_urgency(cluster: list[WorkerInfo]) -> None:
    adm = _admitter(cluster)
    path = CompletionPredictor(adm.scheduler, 0.0).critical_path(PLAN)
    deadline = 2.0 * path / adm.headroom
    held = [adm.admit(0.0, PLAN, deadline) for _ in range(3)]  # their work is committed ahead of the next
    with pytest.raises(PredictedMiss) as info:
        while True:
            held.append(adm.admit(0.0, PLAN, deadline))
    assert info.value.retry_after_s >= 1
    low = adm.admit(0.0, PLAN, deadline, best_effort_on_miss=True)
    assert low.best_effort and low.work_s == 0.0  # behind every other call: it commits nothing
    wf = _flow(99, 0.0, deadline)
    adm.take(wf, low)
    assert wf in adm.best_effort


def test_no_eligible_worker_is_not_the_deadlines_fault(cluster: list[WorkerInfo]) -> None:
    adm = _admitter(cluster)
    for w in range(len(cluster)):
        adm.scheduler.set_eligible(w, False)
    with pytest.raises(NoWorkerCanRun):
        adm.admit(0.0, PLAN, 100.0)


def _queued(adm: Admitter, wf: Workflow, now: float) -> list[Call]:
    calls = []
    for i, spec in enumerate(wf.start()):
        c = Call(wf.wid * 100 + i, wf, spec, now)
        adm.scheduler.submit(c, now)
        calls.append(c)
    return calls


def test_the_overload_recheck_sheds_demotes_and_expires(cluster: list[WorkerInfo]) -> None:
    adm = _admitter(cluster, best_effort_max_age=2.0)
    late, fine, low = _flow(1, 0.0, 0.5), _flow(2, 0.0, 1e6), _flow(3, 0.0, 1.0)
    adm.best_effort.add(low)
    pending: dict[Workflow, list[Call]] = {wf: _queued(adm, wf, 0.0) for wf in (late, fine, low)}
    [shed] = adm.overdue(0.1, pending, lambda wf: "reject")
    assert (shed.wf, shed.action) == (late, "shed") and "after its deadline" in shed.message
    [demoted] = adm.overdue(0.1, pending, lambda wf: "best_effort")
    assert (demoted.wf, demoted.action) == (late, "demote") and demoted.queued == tuple(pending[late])
    assert late in adm.best_effort
    assert adm.overdue(0.1, pending, lambda wf: None) == []  # not watched (no predictive admission)
    expired = adm.overdue(2.5, pending, lambda wf: "reject", skip={late})
    assert [(v.wf, v.action) for v in expired] == [(low, "expire")] and expired[0].retry_after_s == 1


def test_committed_and_arriving_work_count_the_prefix_cache_completed_calls_were_credited(
    cluster: list[WorkerInfo],
) -> None:
    adm = _admitter(cluster, regime=BurstRegime(capacity=1.0))
    est = adm.scheduler.estimator
    wf = _flow(1, 0.0, 1e6)
    for i in range(40):  # half of every prompt came from the cache
        c = Call(i, wf, BIG, 0.0)
        c.worker, c.cached = 0, BIG.input_tokens // 2
        c.gpu_s = est.gpu_s(0, BIG.input_tokens, BIG.output_tokens, c.cached)
        adm.completed(1.0, c)
    share = adm.cache.factor
    assert share == pytest.approx(est.gpu_s(0, 8000, 400, 4000) / est.gpu_s(0, 8000, 400)) and share < 0.9
    work = CompletionPredictor(adm.scheduler, 2.0).plan_work(PLAN)
    adm.admit(2.0, PLAN, 60.0)  # (a window of 30 s)
    assert adm.committed_s == pytest.approx(work), "committed in the plan's units"
    assert adm.predictor(2.0).committed_s == pytest.approx(work * share), "forecast net of the cache"
    assert adm.regime is not None
    assert adm.regime.load == pytest.approx(work * share / 30.0), "the burst regime reads arriving work net of it"
