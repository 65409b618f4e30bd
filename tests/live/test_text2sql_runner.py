"""``GatewayStageRunner``: the live gateway's side of the pipeline's port, on a fake clock and a fake transport.

Each StageCall becomes a ``/v1/chat/completions`` call scheduled as one stage; each outcome comes back as
a ``StageCallResult`` (a failed call with its own status); ``close`` accounts the workflow with the
gateway and answers with the same deadline rule its metrics count (no valid answer: missed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.degrade import Knobs, QuestionPlan
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import CallSpec
from gateway.errors import CallFailed
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant
from gateway.live.text2sql_runner import GatewayStageRunner
from gateway.live.transport import CallResult, LiveCall
from gateway.text2sql.port import StageCall, StageRunner
from tests.fakes import FakeClock
from tests.live.fake_transport import FakeTransport, fake_gateway
from tests.live.harness import write_config

TENANT = Tenant("t", 10.0, 1.0, 1e9, 1.0, 100)

PLAN = QuestionPlan(CHESS_TEMPLATE, Knobs(2, 10, True), Knobs(2, 10, True))
"""A question's plan: the CHESS template at full quality (the runner's workflow is budgeted by it)."""


class ScriptedTransport(FakeTransport):
    """Answers each chat call after one second of fake time; a user message "refuse" gets a final 400."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.sent: list[tuple[str, dict[str, Any], CallSpec]] = []

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        self.sent.append((call.endpoint, dict(call.body), call.spec))
        self.clock.t += 1.0
        user = call.body["messages"][-1]["content"]
        if user == "refuse":
            raise CallFailed("the worker refused the request", 400)
        return CallResult({"choices": [{"message": {"content": f"echo {user}"}}]})


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[tuple[Gateway, FakeClock, ScriptedTransport]]:
    clock = FakeClock(1000.0)
    transport = ScriptedTransport(clock)
    gw = fake_gateway(write_config(tmp_path, ["http://127.0.0.1:9"], ["A100"]), transport, clock)
    await gw.start()
    try:
        yield gw, clock, transport
    finally:
        await gw.stop()


def call(text: str, input_tokens: int = 40, output_tokens: int = 20, max_tokens: int = 64) -> StageCall:
    messages = ({"role": "system", "content": "sys"}, {"role": "user", "content": text})
    return StageCall(messages, input_tokens, output_tokens, max_tokens)


def outcomes(gw: Gateway) -> dict[str, float]:
    text = gw.metrics.render().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("hexflow_workflows_total{") and 'tenant="t"' in line:
            outcome = line.split('outcome="')[1].split('"')[0]
            out[outcome] = float(line.rsplit(" ", 1)[1])
    return out


async def test_stage_calls_become_chat_requests_and_outcomes_come_back_per_call(
    live: tuple[Gateway, FakeClock, ScriptedTransport],
) -> None:
    gw, clock, transport = live
    runner = GatewayStageRunner(gw, TENANT, route="text2sql")
    _: StageRunner = runner
    runner.open(10.0, PLAN)
    assert runner.remaining() == 10.0
    results = await runner.run_stage("generate_candidate", [call("hello", 40, 20, 64), call("refuse", 50, 30, 96)])
    assert results[0].text == "echo hello" and results[0].error is None and results[0].worker == "a100-0"
    assert results[1].text is None and isinstance(results[1].error, CallFailed)
    assert results[1].error.status == 400 and str(results[1].error) == "the worker refused the request"
    assert all(r.run_s > 0 for r in results)
    endpoints = {endpoint for endpoint, _, _ in transport.sent}
    assert endpoints == {"/v1/chat/completions"}
    sent = {body["messages"][-1]["content"]: (body, spec) for _, body, spec in transport.sent}
    body, spec = sent["hello"]
    assert body["max_tokens"] == 64 and body["temperature"] == 0.0 and len(body["messages"]) == 2
    assert spec == CallSpec("generate_candidate", 40, 20)
    assert sent["refuse"][1] == CallSpec("generate_candidate", 50, 30)
    assert runner.remaining() == 10.0 - (clock.t - 1000.0)
    closed = runner.close(valid=True)
    assert closed.latency_s == clock.t - 1000.0 and closed.deadline_met
    assert runner.close(valid=False) is closed  # once
    assert outcomes(gw) == {"met": 1.0}
    assert gw.active_total == 0


@pytest.mark.parametrize(
    ("valid", "failed", "late", "met", "outcome"),
    [
        (True, False, False, True, "met"),
        (False, False, False, False, "missed"),  # in time without a valid answer: missed, in both
        (True, False, True, False, "missed"),
        (False, True, False, False, "failed"),
    ],
)
async def test_close_answers_with_the_rule_the_metrics_count(
    live: tuple[Gateway, FakeClock, ScriptedTransport], valid: bool, failed: bool, late: bool, met: bool, outcome: str
) -> None:
    gw, clock, _ = live
    runner = GatewayStageRunner(gw, TENANT, route="text2sql")
    runner.open(5.0, PLAN)
    clock.t += 6.0 if late else 4.0
    closed = runner.close(valid=valid, failed=failed)
    assert closed.deadline_met is met
    assert outcomes(gw) == {outcome: 1.0}


async def test_a_cancelled_stage_takes_its_calls_back(live: tuple[Gateway, FakeClock, ScriptedTransport]) -> None:
    gw, _, transport = live
    block: asyncio.Future[CallResult] = asyncio.get_running_loop().create_future()

    async def hang(worker: WorkerInfo, call: LiveCall) -> CallResult:
        return await block

    transport.send = hang  # type: ignore[method-assign]
    runner = GatewayStageRunner(gw, TENANT, route="text2sql")
    runner.open(10.0, PLAN)
    task = asyncio.create_task(runner.run_stage("revise", [call("x")]))
    for _ in range(20):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    runner.close(valid=False, failed=True)
    assert outcomes(gw) == {"failed": 1.0} and gw.active_total == 0


async def test_a_runner_is_opened_once_and_used_only_while_open(
    live: tuple[Gateway, FakeClock, ScriptedTransport],
) -> None:
    gw, _, _ = live
    runner = GatewayStageRunner(gw, TENANT, route="text2sql")
    with pytest.raises(RuntimeError, match="not open"):
        runner.remaining()
    runner.open(10.0, PLAN)
    with pytest.raises(RuntimeError, match="open already"):
        runner.open(10.0, PLAN)
    runner.close(valid=True)


@pytest.mark.parametrize(
    ("valid", "advance_s", "outcome"),
    [(True, 0.0, "met"), (True, 20.0, "late"), (False, 0.0, "no_valid_answer"), (False, 20.0, "no_valid_answer")],
)
async def test_a_closed_question_is_a_goodput_outcome_with_its_stages_timeline(
    live: tuple[Gateway, FakeClock, ScriptedTransport], valid: bool, advance_s: float, outcome: str
) -> None:
    gw, clock, _ = live
    runner = GatewayStageRunner(gw, TENANT, route="text2sql")
    runner.open(10.0, PLAN)
    await runner.run_stage("generate_candidate", [call("a"), call("b")])
    await runner.run_stage("revise", [call("c")])
    clock.t += advance_s
    runner.close(valid=valid)
    text = gw.metrics.render().decode()
    assert f'hexflow_workflow_outcomes_total{{outcome="{outcome}",tenant="t"}} 1.0' in text
    goodput = gw.metrics.registry.get_sample_value("hexflow_goodput_workflows_total", {"tenant": "t"})
    assert goodput == (1.0 if outcome == "met" else None)  # "t" is not a configured tenant: no series before
    [wf] = gw.history.slowest(5)
    assert wf.route == "text2sql" and wf.tenant == "t" and wf.status == outcome and wf.deadline - wf.arrival == 10.0
    assert [c.kind for c in wf.calls] == ["generate_candidate", "generate_candidate", "revise"]
    assert all(c.worker_name == "a100-0" and c.ok and c.budget_s > 0 for c in wf.calls)
    assert wf.calls[2].ready >= max(wf.calls[0].result, wf.calls[1].result)  # the stages ran one after the other
    assert wf.latency == pytest.approx(clock.t - 1000.0)
    assert gw.outcome_window.summary(clock.t)["t"]["outcomes"][outcome] == 1
    assert gw.runner.online == {}  # nothing kept for a closed workflow


async def test_the_runner_predicts_a_plan_as_the_schedulers_completion_predictor(
    live: tuple[Gateway, FakeClock, ScriptedTransport],
) -> None:
    from gateway.config.workflows import CHESS_TEMPLATE
    from gateway.core.degrade import FLOOR, Knobs, knob_plan
    from gateway.core.predict import CompletionPredictor

    gw, clock, _ = live
    runner = GatewayStageRunner(gw, TENANT, route="text2sql")
    with pytest.raises(RuntimeError, match="not open"):
        runner.remaining_predictor()
    runner.open(60.0, PLAN)
    predict = runner.remaining_predictor()
    full, floor = knob_plan(CHESS_TEMPLATE, Knobs(2, 10, True)), knob_plan(CHESS_TEMPLATE, FLOOR)
    expected = CompletionPredictor(gw.scheduler, clock.t).path_time
    assert predict(full) == expected(full) > predict(floor) == expected(floor) > 0
    runner.close(valid=False)
