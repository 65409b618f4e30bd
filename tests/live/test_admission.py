"""Admission that keeps promises: a workflow predicted to miss its deadline is refused (429 + Retry-After)
or run best effort; admitted work that falls behind is shed or demoted. Fake clock, no worker reached."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.base import load_yaml_model
from gateway.config.tenants import TenantsFile, hash_key
from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.admission import ADMISSION_HEADROOM
from gateway.core.dag import DagNode
from gateway.core.degrade import FLOOR, Knobs, QuestionPlan, knob_plan
from gateway.core.predict import CompletionPredictor, calls_plan, template_plan
from gateway.core.workflow import CallSpec
from gateway.errors import ConfigError, Rejected, Unprocessable
from gateway.live.runner import CallRequest
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant, TenantStore
from tests.fakes import FakeClock
from tests.live.fake_transport import Hold, fake_gateway
from tests.live.harness import write_config

FULL = Knobs(2, 10, True)
"""The pipeline's full-quality knobs (its default configuration)."""

CALL = CallSpec("generate_candidate", 8000, 400)


def tenant_entry(name: str, **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "api_key_sha256": [hash_key(f"{name}-key")],
        "default_deadline_s": 60,
        "min_deadline_s": 0.001,
        "max_deadline_s": 1000,
        "max_concurrent_workflows": 1000,
        **kw,
    }


def make_gateway(tmp_path: Path, clock: FakeClock, capacity: int = 2, **overrides: Any) -> Gateway:
    """One A100 worker (the pool is not started, so no worker is drained: submitted calls stay queued until a
    test sends them) and three tenants: ``rej`` (reject), ``be`` (best effort), ``off`` (predictive admission off)."""
    doc = {
        "tenants": [
            tenant_entry("rej"),
            tenant_entry("be", on_predicted_miss="best_effort"),
            tenant_entry("off", predictive_admission=False),
        ]
    }
    (tmp_path / "tenants.yaml").write_text(yaml.safe_dump(doc))
    cfg = write_config(tmp_path, ["http://127.0.0.1:9"], ["A100"], **overrides)
    text = cfg.read_text().replace("capacity: 4", f"capacity: {capacity}")
    cfg.write_text(text)
    return fake_gateway(cfg, Hold(), clock)


def tenant(gw: Gateway, name: str) -> Tenant:
    t = gw.tenants.get(name)
    assert t is not None
    return t


def lone_s(gw: Gateway, spec: CallSpec = CALL) -> float:
    return gw.scheduler.estimator.t_comp(0, spec.kind, spec.input_tokens, spec.output_tokens, 0.0)


def fill_queue(gw: Gateway, n: int, deadline_s: float | None = None) -> list[asyncio.Task[Any]]:
    """Queue ``n`` calls of an 'off' tenant's workflows (never shed), due in ``deadline_s`` (default: half a lone
    call's time, so that they are ahead of any new work under the deadline-ordered queues): the backlog ahead."""
    node = DagNode("x", CALL.kind, CALL.input_tokens, CALL.output_tokens)
    off = tenant(gw, "off")
    due = 0.5 * lone_s(gw) if deadline_s is None else deadline_s
    return [
        asyncio.create_task(gw.run_workflow(off, due, [node], [CallRequest("/v1/completions", {})], route="workflows"))
        for _ in range(n)
    ]


def verify(gw: Gateway) -> None:
    """Admitted workflows took what admission forecast (the forecast is verified, its factor 1): admission
    judges by its forecast, not by the bound it uses until then."""
    for _ in range(gw.admitter.calibration.min_samples):
        gw.admitter.calibration.add(2.0, 2.0, 1.0)
    assert gw.admitter.calibration.verified and gw.admitter.calibration.factor == 1.0


def rejections(gw: Gateway, name: str, reason: str) -> float:
    v = gw.metrics.registry.get_sample_value("hexflow_admission_rejections_total", {"tenant": name, "reason": reason})
    return v or 0.0


def outcomes(gw: Gateway, name: str, outcome: str) -> float:
    v = gw.metrics.registry.get_sample_value("hexflow_workflows_total", {"tenant": name, "outcome": outcome})
    return v or 0.0


# ------------------------------------------------------------------------------------------ admission


@pytest.mark.parametrize(
    ("queued", "deadline_lone", "who", "expect"),
    [
        (0, 3.0, "rej", "admit"),  # idle: the call fits
        (20, 3.0, "rej", "429"),  # ten calls' worth of backlog per slot ahead: it cannot fit
        (20, 3.0, "be", "best_effort"),  # the same, for a best-effort tenant: admitted, demoted
        (20, 3.0, "off", "admit"),  # predictive admission off: only the concurrency bounds apply
        (20, 200.0, "rej", "admit"),  # a deadline long enough for the backlog
    ],
)
async def test_admission_decision_follows_the_predicted_completion(
    tmp_path: Path, queued: int, deadline_lone: float, who: str, expect: str
) -> None:
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock)
    fill_queue(gw, queued)
    await asyncio.sleep(0)
    assert sum(gw.scheduler.queue_len(w) for w in gw.scheduler.members()) == queued
    plan = calls_plan([[CALL]])
    deadline = deadline_lone * lone_s(gw)
    if expect == "429":
        with pytest.raises(Rejected) as info:
            gw.admit(tenant(gw, who), 1, plan, deadline)
        err = info.value
        assert err.status == 429 and "predicted" in err.message
        assert rejections(gw, who, "deadline") == 1 and outcomes(gw, who, "rejected") == 1
    else:
        adm = gw.admit(tenant(gw, who), 1, plan, deadline)
        assert adm.best_effort is (expect == "best_effort")
        demoted = gw.metrics.registry.get_sample_value(
            "hexflow_workflows_demoted_total", {"tenant": who, "when": "admission"}
        )
        assert demoted == (1.0 if expect == "best_effort" else 0.0)
    for t in list(asyncio.all_tasks() - {asyncio.current_task()}):
        t.cancel()


async def test_retry_after_is_when_the_backlog_would_have_drained_enough(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock)
    fill_queue(gw, 20)
    await asyncio.sleep(0)
    plan = calls_plan([[CALL]])
    deadline = 3.0 * lone_s(gw)
    with pytest.raises(Rejected) as info:
        gw.admit(tenant(gw, "rej"), 1, plan, deadline)
    retry = int(info.value.headers["Retry-After"])  # type: ignore[index]
    pred = CompletionPredictor(gw.scheduler, clock.t)
    target = ADMISSION_HEADROOM * deadline  # admission keeps a margin below the deadline
    wait = pred.retry_after_s(plan, target)
    assert wait is not None and retry == max(1, math.ceil(wait))
    # Sane: no sooner than the part of the backlog that must drain, no later than all of it.
    backlog = gw.scheduler.estimator.t_queue(0, clock.t)
    assert pred.duration(plan, drained_s=retry) <= target
    assert 1 <= retry <= math.ceil(backlog)
    for t in list(asyncio.all_tasks() - {asyncio.current_task()}):
        t.cancel()
    await asyncio.sleep(0)


@pytest.mark.parametrize("who", ["rej", "be"])
async def test_a_deadline_shorter_than_the_critical_path_is_a_client_error_naming_the_shortest_that_works(
    tmp_path: Path, who: str
) -> None:
    """No wait can meet it: 422 (never a 429 a client would retry forever, nor best effort) with the shortest
    deadline admission would take on idle workers; asking again with that deadline is admitted."""
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock)
    plan = template_plan(CHESS_TEMPLATE)
    with pytest.raises(Unprocessable) as info:  # (core's DeadlineTooShort, as the live edge answers it)
        gw.admit(tenant(gw, who), 1, plan, 0.01)
    err = info.value
    assert err.status == 422 and err.param == "deadline_s" and "Retry-After" not in (err.headers or {})
    shortest = err.response_body()["min_deadline_s"]
    assert f"at least {shortest:g} s" in err.message and err.response_body()["reason"] == "deadline"
    critical = CompletionPredictor(gw.scheduler, clock.t).critical_path(plan)
    assert critical / ADMISSION_HEADROOM <= shortest <= 1.1 * critical / ADMISSION_HEADROOM
    adm = gw.admit(tenant(gw, who), 1, plan, shortest)
    assert not adm.best_effort
    adm.release()
    assert gw.admitter.committed_s == 0.0


async def test_an_unobserved_plan_is_not_refused_on_its_guess(tmp_path: Path) -> None:
    """Before the model answered anything the plan's output lengths are a guess: admitted, its work committed."""
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock)
    guess = QuestionPlan(CHESS_TEMPLATE, FULL, FULL, observed=False)
    adm = gw.admit(tenant(gw, "rej"), 1, guess.rest(), 0.01, question=guess)
    assert not adm.best_effort and adm.plan is guess and gw.admitter.committed_s > 0.0
    adm.release()
    with pytest.raises(Unprocessable, match="cannot be met"):
        known = QuestionPlan(CHESS_TEMPLATE, FULL, FULL)
        gw.admit(tenant(gw, "rej"), 1, known.rest(), 0.01, question=known)


async def test_concurrency_refusals_are_counted_by_reason(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock)
    small = Tenant("rej", 60, 0.001, 1000, 1.0, 1)  # at most one workflow in progress
    gw.runner.active["rej"] = 1
    with pytest.raises(Rejected) as info:
        gw.admit(small, 1, calls_plan([[CALL]]), 1e6)
    assert info.value.status == 429
    assert rejections(gw, "rej", "concurrency") == 1 and rejections(gw, "rej", "deadline") == 0


# ------------------------------------------------------------------------------------------ shedding


async def start_workflow(gw: Gateway, who: str, deadline_s: float) -> asyncio.Task[Any]:
    nodes = [DagNode("a", CALL.kind, CALL.input_tokens, CALL.output_tokens)]
    task = asyncio.create_task(
        gw.run_workflow(tenant(gw, who), deadline_s, nodes, [CallRequest("/v1/completions", {})], route="workflows")
    )
    await asyncio.sleep(0)
    return task


async def test_reject_tenant_workflow_that_can_no_longer_make_it_is_shed_with_503(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock)
    deadline = 10 * lone_s(gw)
    task = await start_workflow(gw, "rej", deadline)
    assert gw.shed_overdue() == (0, 0)  # in time: untouched
    clock.t += deadline - 0.5 * lone_s(gw)  # still queued, and a call takes longer than what is left
    assert gw.shed_overdue() == (1, 0)
    with pytest.raises(Rejected) as info:
        await task
    err = info.value
    assert err.status == 503 and "deadline" in err.message
    assert int(err.headers["Retry-After"]) >= 1  # type: ignore[index]
    assert gw.scheduler.queue_len(0) == 0 and gw.active_total == 0
    assert outcomes(gw, "rej", "shed") == 1 and outcomes(gw, "rej", "failed") == 0


async def test_best_effort_tenant_workflow_is_demoted_not_shed(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock)
    deadline = 10 * lone_s(gw)
    late = await start_workflow(gw, "be", deadline)
    clock.t += deadline - 0.5 * lone_s(gw)
    assert gw.shed_overdue() == (0, 1)
    assert gw.shed_overdue() == (0, 0)  # once
    on_time = await start_workflow(gw, "off", 1e6)
    # The demoted call waits behind the later, normal one, and starts only on an idle worker (its capacity
    # times the default best-effort share is below one slot).
    first = gw.scheduler.pop_next(0, clock.t)
    assert first is not None and first.tenant == "off"
    assert gw.scheduler.best_effort_slots(0) == 1
    assert gw.scheduler.pop_next(0, clock.t) is None  # one call in flight: too busy for best effort
    gw.scheduler.on_finish(first, clock.t, 0.1)
    second = gw.scheduler.pop_next(0, clock.t)
    assert second is not None and second.tenant == "be" and second.best_effort
    demoted = gw.metrics.registry.get_sample_value(
        "hexflow_workflows_demoted_total", {"tenant": "be", "when": "queued"}
    )
    assert demoted == 1
    for t in (late, on_time):
        t.cancel()


async def test_a_best_effort_workflow_past_its_age_limit_is_shed_queued_or_running(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock, admission={"best_effort_max_age": 3.0})
    deadline = 10 * lone_s(gw)
    queued = await start_workflow(gw, "be", deadline)
    running = await start_workflow(gw, "be", deadline)
    clock.t += deadline - 0.5 * lone_s(gw)
    assert gw.shed_overdue() == (0, 2)  # both demoted
    sent = gw.pool.fill(gw.pool.workers[0])  # the worker is idle: one best-effort call starts
    assert len(sent) == 1
    clock.t += 2 * deadline  # 2.95 x its deadline after arrival: still waiting
    assert gw.shed_overdue() == (0, 0)
    clock.t += 0.1 * deadline  # past 3 x
    assert gw.shed_overdue() == (2, 0)
    for task in (queued, running):
        with pytest.raises(Rejected) as info:
            await task
        assert info.value.status == 503 and "best_effort_max_age" in info.value.message
        assert int(info.value.headers["Retry-After"]) == max(1, math.ceil(deadline))  # type: ignore[index]
    # The queued call left its queue; the running one was cancelled (its request is aborted: no pool runs here).
    assert gw.scheduler.queue_len(0) == 0 and sent[0].on_done is None and gw.active_total == 0
    assert outcomes(gw, "be", "shed") == 2


async def test_best_effort_age_limit_off_keeps_starved_work_and_never_touches_urgent_work(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock, admission={"best_effort_max_age": None})
    deadline = 10 * lone_s(gw)
    starved = await start_workflow(gw, "be", deadline)
    urgent = await start_workflow(gw, "off", deadline)  # never predicted (admission off), never demoted
    clock.t += deadline - 0.5 * lone_s(gw)
    assert gw.shed_overdue() == (0, 1)
    clock.t += 100 * deadline
    assert gw.shed_overdue() == (0, 0)
    assert gw.scheduler.queue_len(0) == 2 and not starved.done() and not urgent.done()
    for t in (starved, urgent):
        t.cancel()


async def test_a_workflow_whose_calls_are_all_in_flight_is_never_shed(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock)
    deadline = 2 * lone_s(gw)
    task = await start_workflow(gw, "rej", deadline)
    sent = gw.pool.fill(gw.pool.workers[0])  # marks the call in flight (no request is made here)
    assert len(sent) == 1
    clock.t += 10 * deadline  # hopelessly late, but nothing of it is queued
    assert gw.shed_overdue() == (0, 0)
    task.cancel()


async def test_online_workflow_shed_fails_its_stage_and_later_calls(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock)
    t = tenant(gw, "rej")
    deadline = 10 * lone_s(gw)
    wf = gw.open_workflow(t, deadline, QuestionPlan(CHESS_TEMPLATE, FULL, FULL), route="text2sql")
    stage = asyncio.create_task(gw.run_stage(wf, CALL.kind, [(CALL, CallRequest("/v1/chat/completions", {}))]))
    await asyncio.sleep(0)
    clock.t += deadline
    assert gw.shed_overdue() == (1, 0)
    [outcome] = await stage
    assert outcome.error is not None and outcome.error.status == 503
    # A stage the pipeline still tries fails at once, without reaching a queue.
    [again] = await gw.run_stage(wf, CALL.kind, [(CALL, CallRequest("/v1/chat/completions", {}))])
    assert again.error is not None and gw.scheduler.queue_len(0) == 0
    gw.close_workflow(wf, failed=True)
    assert outcomes(gw, "rej", "shed") == 1 and gw.active_total == 0


async def test_a_degrading_tenant_is_shed_only_when_even_its_floor_cannot_make_it(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    doc = {"tenants": [tenant_entry("full"), tenant_entry("ad", quality="adaptive")]}
    (tmp_path / "tenants.yaml").write_text(yaml.safe_dump(doc))
    gw = fake_gateway(write_config(tmp_path, ["http://127.0.0.1:9"], ["A100"]), Hold(), clock)
    pred = CompletionPredictor(gw.scheduler, clock.t, later_queue_weight=0.0)
    # After the keywords stage: the full template's rest takes far longer than the floor's.
    phase = next(i for i, p in enumerate(CHESS_TEMPLATE.phases) if p.kind == "extract_keywords")
    full_rest = pred.critical_path(knob_plan(CHESS_TEMPLATE, FULL, phase=phase, rounds_done=1))
    floor_rest = pred.critical_path(knob_plan(CHESS_TEMPLATE, FLOOR, phase=phase, rounds_done=1))
    assert floor_rest < 0.7 * full_rest
    spec = CallSpec("extract_keywords", 677, 49)
    lone = lone_s(gw, spec)
    deadline = lone + (floor_rest + full_rest) / 2  # the floor fits, the full pipeline does not
    shed = {}
    stages = []
    for name in ("full", "ad"):
        t = tenant(gw, name)
        wf = gw.open_workflow(
            t, deadline, QuestionPlan(CHESS_TEMPLATE, FULL, FULL if name == "full" else FLOOR), route="text2sql"
        )
        stages.append(
            asyncio.create_task(gw.run_stage(wf, spec.kind, [(spec, CallRequest("/v1/chat/completions", {}))]))
        )
        await asyncio.sleep(0)
        shed[name] = gw.shed_overdue()
    assert shed["full"] == (1, 0)
    assert shed["ad"] == (0, 0)
    for task in stages:
        task.cancel()


# ------------------------------------------------------------------------------------------ tenants file


@pytest.mark.parametrize(
    ("extra", "ok"),
    [
        ({}, True),
        ({"on_predicted_miss": "best_effort"}, True),
        ({"on_predicted_miss": "reject", "predictive_admission": False}, True),
        ({"on_predicted_miss": "drop"}, False),
        ({"predictive_admission": "sometimes"}, False),
    ],
)
def test_tenants_file_validates_the_overload_settings(tmp_path: Path, extra: dict[str, Any], ok: bool) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(yaml.safe_dump({"tenants": [tenant_entry("a", **extra)]}))
    if ok:
        f = load_yaml_model(path, TenantsFile)
        t = Tenant.from_config(f.tenants[0])
        assert t.on_predicted_miss == extra.get("on_predicted_miss", "reject")
        assert t.predictive_admission is extra.get("predictive_admission", True)
    else:
        with pytest.raises(ConfigError) as info:
            load_yaml_model(path, TenantsFile)
        assert next(iter(extra)) in str(info.value)


def test_shipped_tenants_file_sets_overload_behaviour() -> None:
    store = TenantStore.load()
    assert {t.name: t.on_predicted_miss for t in store.tenants} == {"interactive": "reject", "batch": "best_effort"}


def gateway_with_share(tmp_path: Path, clock: FakeClock, share: float) -> Gateway:
    """``make_gateway`` with ``admission.sustainable_share`` set in gateway.yaml."""
    make_gateway(tmp_path, clock)  # writes tenants.yaml and gateway.yaml into tmp_path
    cfg = tmp_path / "gateway.yaml"
    doc = yaml.safe_load(cfg.read_text())
    doc["admission"] = {"sustainable_share": share}
    cfg.write_text(yaml.safe_dump(doc))
    return fake_gateway(cfg, Hold(), clock)


async def test_the_configured_sustainable_share_sets_what_admission_forecasts(tmp_path: Path) -> None:
    """A workflow whose deadline lies between its predictions at share 1 and at the default 0.25 is admitted
    by a gateway configured with share 1 and refused by one at the default."""
    clock = FakeClock(100.0)
    plan = calls_plan([[CALL]] * 3)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    loose = gateway_with_share(tmp_path / "a", clock, 1.0)
    tight = make_gateway(tmp_path / "b", clock)
    assert tight.cfg.admission.sustainable_share == 0.25 and loose.cfg.admission.sustainable_share == 1.0
    big = calls_plan([[CALL] * 8] * 40)
    for gw in (loose, tight):  # an admitted workflow's work still to come: the fluid term decides
        verify(gw)
        gw.admit(tenant(gw, "rej"), 320, big, 1e6)
    committed = tight.admitter.committed_s
    assert committed == loose.admitter.committed_s > 0.0
    at_one = CompletionPredictor(loose.scheduler, clock.t, committed_s=committed, efficiency=1.0).duration(plan)
    at_quarter = CompletionPredictor(tight.scheduler, clock.t, committed_s=committed).duration(plan)
    assert at_quarter > at_one
    deadline = (at_one + at_quarter) / 2 / ADMISSION_HEADROOM
    assert not loose.admit(tenant(loose, "rej"), 3, plan, deadline).best_effort
    with pytest.raises(Rejected):
        tight.admit(tenant(tight, "rej"), 3, plan, deadline)


@pytest.mark.parametrize("share", [0, -0.5, 1.5])
def test_a_sustainable_share_outside_0_1_is_refused(tmp_path: Path, share: float) -> None:
    clock = FakeClock(100.0)
    with pytest.raises(ConfigError, match="sustainable_share"):
        gateway_with_share(tmp_path, clock, share)


async def test_an_unverified_forecast_refuses_only_what_cannot_make_it_at_full_throughput(tmp_path: Path) -> None:
    """Until admitted workflows have checked the forecast (``QueueCalibration.verified``), a workflow is refused
    only when it misses even at the cluster's full throughput with nothing queued after its first stage; the
    cautious forecast (the sustainable share, later stages queued as now) refuses it once verified."""
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock)
    committed = calls_plan([[CALL] * 8] * 10)
    gw.admit(tenant(gw, "off"), 80, committed, 1.0)  # admitted work due before anything below: ahead of it
    plan = calls_plan([[CALL]] * 3)
    cautious = CompletionPredictor(gw.scheduler, clock.t, committed_s=gw.admitter.committed_s).duration(plan)
    bound = CompletionPredictor(
        gw.scheduler, clock.t, committed_s=gw.admitter.committed_s, efficiency=1.0, later_queue_weight=0.0
    ).duration(plan)
    assert bound < cautious
    deadline = (bound + cautious) / 2 / ADMISSION_HEADROOM
    gw.admit(tenant(gw, "rej"), 3, plan, deadline).release()
    verify(gw)
    with pytest.raises(Rejected):
        gw.admit(tenant(gw, "rej"), 3, plan, deadline)


async def test_an_admitted_workflow_that_answers_calibrates_later_forecasts(tmp_path: Path) -> None:
    """Its latency against what admission forecast for it is a sample of the calibration; one that failed, or
    answered without a valid answer, is not."""
    clock = FakeClock(100.0)
    gw = make_gateway(tmp_path, clock)
    gw.admit(tenant(gw, "off"), 80, calls_plan([[CALL] * 8] * 10), 1.0)  # a queue ahead: a forecast above its path
    plan = QuestionPlan(CHESS_TEMPLATE, FULL, FULL)
    t = tenant(gw, "rej")
    for valid, failed in ((True, False), (False, False), (True, True)):
        adm = gw.admit(t, 1, plan.rest(), 1e4, question=plan)
        assert adm.predicted_s > adm.critical_s
        wf = gw.open_workflow(t, 1e4, plan, admission=adm, route="text2sql")
        clock.t += adm.critical_s + 0.5 * (adm.predicted_s - adm.critical_s)
        gw.close_workflow(wf, valid=valid, failed=failed)
        assert gw.admitter.calibration.samples == 1  # the first one only
    assert gw.admitter.calibration._ratios[0] == pytest.approx(0.5)
