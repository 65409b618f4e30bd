"""The port the Text-to-SQL pipeline needs from whatever runs its LLM calls: ``StageRunner`` (the live
gateway's is ``gateway.live.text2sql_runner``). Everything the pipeline reads about time comes from the
runner's clock, so it never mixes two clocks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.core.degrade import QuestionPlan
from gateway.core.predict import StagePlan
from gateway.errors import CallFailed

DEGRADED_STEPS = ("candidates", "revisions", "evaluation")
"""The knobs a degraded question can have turned down (``Degradation.step``; the gateway's bounded label of
``hexflow_degraded_workflows_total``)."""
RemainingPredictor = Callable[[Sequence[StagePlan]], float]
"""Seconds a workflow's remaining stages (a plan) are predicted to take from one instant on."""


@dataclass(frozen=True, slots=True)
class StageCall:
    """One chat-completion call of a stage: ``input_tokens``/``output_tokens`` are what the scheduler assumes
    (budgets, dispatch), ``max_tokens`` caps what the worker generates."""

    messages: tuple[dict[str, Any], ...]
    input_tokens: int
    output_tokens: int
    max_tokens: int
    temperature: float = 0.0


@dataclass(frozen=True, slots=True)
class StageCallResult:
    """What came back for one call: the text or the error (after the runner's retries; its ``status``: 502
    upstream error, 503 no worker, 504 timeout), where and how long it ran, and the worker's own token counts
    (its ``usage``; None when it gave none)."""

    worker: str | None
    queued_s: float
    run_s: float
    text: str | None = None
    error: CallFailed | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Closed:
    """A closed workflow: its latency (runner clock) and whether it met its deadline with a valid answer."""

    latency_s: float
    deadline_met: bool


class StageRunner(Protocol):
    """Runs one question's LLM calls under its deadline: ``open`` once, ``run_stage`` per stage,
    ``remaining``/``remaining_predictor`` for decisions, ``close`` exactly once."""

    def open(self, deadline_s: float, plan: QuestionPlan) -> None:
        """Start the workflow now, its deadline ``deadline_s`` from now, its stages predicted by ``plan``."""

    async def run_stage(self, kind: str, calls: Sequence[StageCall]) -> list[StageCallResult]:
        """Run one stage (``calls`` in parallel); one result per call, in order. Never raises for a failed
        call (its result carries the error); a cancelled caller takes its calls back."""

    def remaining(self) -> float:
        """Seconds left before the deadline (negative once it has passed)."""

    def remaining_predictor(self) -> RemainingPredictor:
        """Predictions at this instant: the seconds from now until a plan of remaining stages would be done
        (``math.inf`` when nothing could run it)."""

    def close(self, *, valid: bool, failed: bool = False, cancelled: bool = False) -> Closed:
        """End the workflow (``valid``: a usable answer; ``failed``: a stage failed; ``cancelled``: the question
        was abandoned). Called exactly once after ``open``, also on errors and cancellation."""
