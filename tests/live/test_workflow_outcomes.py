"""How the live gateway ends a workflow: core's one deadline rule decides met or missed, and a workflow
that raises still ends (as failed) and gives its concurrency slot back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.dag import DagNode
from gateway.core.records import WorkflowOutcome
from gateway.core.workflow import CallSpec
from gateway.errors import Rejected
from gateway.live.history import GOODPUT_OUTCOMES
from gateway.live.routers.workflows import workflow_response
from gateway.live.runner import CallRequest
from gateway.live.schemas import WorkflowRequest
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant
from gateway.live.transport import LiveCall
from tests.fakes import FakeClock
from tests.live.fake_transport import FakeTransport, fake_gateway
from tests.live.harness import write_config

TENANT = Tenant("t", 10.0, 1.0, 100.0, 1.0, 10)


def _gateway(tmp_path: Path, clock: FakeClock) -> Gateway:
    """A gateway whose transport fails the test if a call is sent (these tests send none)."""
    return fake_gateway(write_config(tmp_path, ["http://127.0.0.1:9"], ["A100"]), FakeTransport(), clock)


def _count(gw: Gateway, outcome: str) -> float:
    value = gw.metrics.registry.get_sample_value("hexflow_workflows_total", {"tenant": "t", "outcome": outcome})
    return value or 0.0


@pytest.mark.parametrize(
    ("finish", "kwargs", "outcome"),
    [
        (5.0, {}, "met"),
        (10.0, {}, "met"),  # on the deadline is in time
        (10.5, {}, "missed"),
        (5.0, {"valid": False}, "missed"),  # in time, but no valid answer (Text-to-SQL without SQL)
        (5.0, {"failed": True}, "failed"),
    ],
)
async def test_close_workflow_counts_met_only_for_a_valid_answer_by_the_deadline(
    tmp_path: Path, finish: float, kwargs: dict[str, bool], outcome: str
) -> None:
    clock = FakeClock()
    gw = _gateway(tmp_path, clock)
    wf = gw.open_workflow(TENANT, 10.0, None, route="text2sql")
    clock.t = finish
    latency = gw.close_workflow(wf, **kwargs)
    assert latency == finish
    assert {o: _count(gw, o) for o in ("met", "missed", "failed")} == {
        o: 1.0 if o == outcome else 0.0 for o in ("met", "missed", "failed")
    }
    assert gw.active_total == 0


@pytest.mark.parametrize(
    ("finish", "kwargs", "outcome"),
    [
        (5.0, {}, "met"),
        (10.5, {}, "late"),
        (5.0, {"valid": False}, "no_valid_answer"),
        (12.0, {"valid": False}, "no_valid_answer"),
        (5.0, {"failed": True}, "failed"),
        (5.0, {"cancelled": True}, "cancelled"),
    ],
)
async def test_close_workflow_counts_exactly_one_goodput_outcome(
    tmp_path: Path, finish: float, kwargs: dict[str, bool], outcome: str
) -> None:
    clock = FakeClock()
    gw = _gateway(tmp_path, clock)
    wf = gw.open_workflow(TENANT, 10.0, None, route="text2sql")
    clock.t = finish
    gw.close_workflow(wf, **kwargs)
    counts = {
        o: gw.metrics.registry.get_sample_value("hexflow_workflow_outcomes_total", {"tenant": "t", "outcome": o}) or 0.0
        for o in GOODPUT_OUTCOMES
    }
    assert counts == {o: 1.0 if o == outcome else 0.0 for o in GOODPUT_OUTCOMES}
    goodput = gw.metrics.registry.get_sample_value("hexflow_goodput_workflows_total", {"tenant": "t"}) or 0.0
    assert goodput == (1.0 if outcome == "met" else 0.0)
    [ended] = gw.history.slowest(1)
    assert ended.status == outcome and ended.latency == finish and ended.calls == ()


async def test_a_shed_workflow_counts_as_rejected_for_goodput(tmp_path: Path) -> None:
    clock = FakeClock()
    gw = _gateway(tmp_path, clock)
    wf = gw.open_workflow(TENANT, 10.0, None, route="text2sql")
    gw.runner.fail_workflow(wf, Rejected("shed", 503, 3))
    gw.close_workflow(wf)
    assert _count(gw, "shed") == 1.0
    value = gw.metrics.registry.get_sample_value(
        "hexflow_workflow_outcomes_total", {"tenant": "t", "outcome": "rejected"}
    )
    assert value == 1.0


@pytest.mark.parametrize(
    ("status", "latency_s", "met"),
    [("ok", 3.0, True), ("ok", 10.0, True), ("ok", 10.000001, False), ("failed", 3.0, False)],
)
def test_workflow_outcome_meets_its_deadline_only_when_ok_and_in_time(status: str, latency_s: float, met: bool) -> None:
    req = WorkflowRequest.model_validate(
        {"calls": [{"id": "a", "kind": "k", "messages": [{"role": "user", "content": "hi"}]}]}
    )
    out: WorkflowOutcome[Any] = WorkflowOutcome(1, "t", 100.0, 110.0, 100.0 + latency_s, status)
    resp = workflow_response(req, out, "wf-1", 10.0)
    assert resp.deadline_met is met and resp.latency_s == round(latency_s, 6)
    # The call never ran (no outcome): reported with no worker and nothing run.
    assert resp.calls[0].worker is None and resp.calls[0].attempts == 0 and resp.calls[0].output is None


async def test_a_workflow_that_raises_ends_as_failed_and_frees_its_slot(tmp_path: Path) -> None:
    gw = _gateway(tmp_path, FakeClock())
    # An output length no float can hold: the scheduler's cost estimate raises inside run_workflow.
    nodes = [DagNode("a", "call", 10, 10**400)]
    with pytest.raises(OverflowError):
        await gw.run_workflow(TENANT, 10.0, nodes, [CallRequest("/v1/completions", {})], route="workflows")
    assert gw.active_total == 0
    assert _count(gw, "failed") == 1.0
    failed = gw.metrics.registry.get_sample_value(
        "hexflow_workflow_outcomes_total", {"tenant": "t", "outcome": "failed"}
    )
    assert failed == 1.0


async def test_a_stage_whose_submission_fails_part_way_takes_back_the_calls_already_submitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = _gateway(tmp_path, FakeClock())
    submitted: list[LiveCall] = []
    cancelled: list[LiveCall] = []
    real_submit = gw.runner.submit

    def submit_then_fail(*args: object, **kwargs: object) -> LiveCall:
        if submitted:
            raise RuntimeError("the second submission fails")
        call = real_submit(*args, **kwargs)  # type: ignore[arg-type]
        submitted.append(call)
        return call

    monkeypatch.setattr(gw.runner, "submit", submit_then_fail)
    monkeypatch.setattr(gw.pool, "cancel", cancelled.append)
    wf = gw.open_workflow(TENANT, 10.0, None, route="text2sql")
    req = CallRequest("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(RuntimeError, match="second submission"):
        await gw.run_stage(wf, "k", [(CallSpec("k", 10, 2), req), (CallSpec("k", 10, 2), req)])
    assert len(submitted) == 1 and cancelled == submitted, "the submitted call keeps running for nobody"
