"""The live gateway's side of the Text-to-SQL port: ``GatewayStageRunner`` runs a pipeline's stages on
``Gateway``, one online workflow per question (its plan sets the stage budgets, shedding and the prediction),
each stage's calls as ``/v1/chat/completions`` requests. ``close`` accounts the workflow and answers with the
same rule (``OnlineWorkflow.met``), so the response and the metrics agree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field

from gateway.core.admission import Admission
from gateway.core.degrade import QuestionPlan
from gateway.core.predict import CompletionPredictor
from gateway.core.workflow import CallSpec, OnlineWorkflow
from gateway.live.runner import CallRequest, LiveOutcome
from gateway.live.service import Gateway
from gateway.live.tenants import Tenant
from gateway.text2sql.port import Closed, RemainingPredictor, StageCall, StageCallResult

CHAT_ENDPOINT = "/v1/chat/completions"


@dataclass(eq=False)
class GatewayStageRunner:
    """``StageRunner`` on the live gateway, for one admitted question of ``tenant`` (``route``: its status page
    label; ``request_id``: the id the client gets)."""

    gw: Gateway
    tenant: Tenant
    _: KW_ONLY
    route: str
    admission: Admission | None = None
    request_id: str | None = None
    _wf: OnlineWorkflow | None = field(default=None, init=False)
    _closed: Closed | None = field(default=None, init=False)

    def _workflow(self) -> OnlineWorkflow:
        if self._wf is None:
            raise RuntimeError("the runner is not open")
        return self._wf

    def open(self, deadline_s: float, plan: QuestionPlan) -> None:
        """Start the online workflow now, its deadline ``deadline_s`` from now, predicted by ``plan``."""
        if self._wf is not None:
            raise RuntimeError("the runner is open already (one runner per question)")
        self._wf = self.gw.open_workflow(
            self.tenant, deadline_s, plan, route=self.route, admission=self.admission, wf_id=self.request_id
        )

    async def run_stage(self, kind: str, calls: Sequence[StageCall]) -> list[StageCallResult]:
        """One stage of parallel calls on the gateway; one result per call, in order."""
        wf = self._workflow()
        pairs = [(CallSpec(kind, c.input_tokens, c.output_tokens), _request(c)) for c in calls]
        outcomes = await self.gw.run_stage(wf, kind, pairs)
        return [_result(o) for o in outcomes]

    def remaining(self) -> float:
        """Seconds to the deadline on the gateway's clock (negative once past)."""
        return self._workflow().remaining(self.gw.clock())

    def remaining_predictor(self) -> RemainingPredictor:
        """The scheduler's critical path of a plan behind the queues now (``CompletionPredictor.path_time``,
        later stages at the default stationary queue weight); one predictor per call, reused across plans."""
        self._workflow()
        return CompletionPredictor(self.gw.scheduler, self.gw.clock()).path_time

    def close(self, *, valid: bool, failed: bool = False, cancelled: bool = False) -> Closed:
        """Account the workflow's end with the gateway once (a second call returns the first answer)."""
        if self._closed is not None:
            return self._closed
        wf = self._workflow()
        latency = self.gw.close_workflow(wf, failed=failed, valid=valid, cancelled=cancelled)
        met = not failed and not cancelled and wf.met(wf.arrival + latency, valid=valid)
        self._closed = Closed(latency, met)
        return self._closed


def _request(call: StageCall) -> CallRequest:
    body = {"messages": list(call.messages), "max_tokens": call.max_tokens, "temperature": call.temperature}
    return CallRequest(CHAT_ENDPOINT, body)


def _result(o: LiveOutcome) -> StageCallResult:
    if o.error is not None:
        return StageCallResult(o.worker_name, o.queued_s, o.run_s, error=o.error)
    outcome = o.answer
    assert outcome is not None  # a live call that did not fail carries the worker's response
    return StageCallResult(
        o.worker_name,
        o.queued_s,
        o.run_s,
        text=outcome.text() or "",
        prompt_tokens=outcome.prompt_tokens or None,
        completion_tokens=outcome.completion_tokens or None,
    )
