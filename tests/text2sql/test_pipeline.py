"""The pipeline against a fake ``StageRunner``: no server, no workers, a fake clock, the demo SQLite database.

The fake answers each stage from a script (``kind, prompt -> text``), advances its clock by a fixed time
per stage, and records how it was driven: the stages and their calls, and the one ``close``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.core.degrade import QuestionPlan
from gateway.core.shapes import MIN_QUESTIONS
from gateway.core.tokens import message_tokens
from gateway.core.workflow import deadline_met
from gateway.errors import CallFailed
from gateway.text2sql.db import Database, DatabaseConfig, open_database
from gateway.text2sql.demo import write_sqlite
from gateway.text2sql.pipeline import PipelineConfig, Text2SqlPipeline
from gateway.text2sql.port import (
    Closed,
    RemainingPredictor,
    StageCall,
    StageCallResult,
    StageRunner,
)
from gateway.text2sql.prompt_templates import Prompts

QUESTION = "How many customers are there?"
GOLD = "SELECT COUNT(*) FROM customers"
WRONG = "SELECT customer_id FROM customers WHERE country = 'Atlantis'"  # executes, no rows
REFUSED = "SELECT load_extension('evil')"
Script = Callable[[str, int, str], str]
"""(stage kind, index of the call in its stage, user prompt) -> the model's answer."""


def sql_block(sql: str) -> str:
    return f"The query:\n```sql\n{sql}\n```"


def gold_everywhere(kind: str, i: int, prompt: str) -> str:
    return {
        "extract_keywords": '["customers"]',
        "information_retriever": '["customers.*"]',
        "generate_candidate": sql_block(GOLD),
        "revise": sql_block(GOLD),
        "generate_unit_test": "- It counts customers.",
        "evaluate": "VERDICT: correct",
    }[kind]


@dataclass
class FakeRunner:
    """``StageRunner`` on a fake clock: each stage takes ``stage_s`` seconds."""

    script: Script
    stage_s: float = 1.0
    fail: dict[str, CallFailed] = field(default_factory=dict)
    block_on: str | None = None
    now: float = 100.0
    deadline: float | None = None
    plan: QuestionPlan | None = None
    stages: list[tuple[str, list[StageCall]]] = field(default_factory=list)
    closes: list[dict[str, bool]] = field(default_factory=list)
    arrival: float = 0.0

    def open(self, deadline_s: float, plan: QuestionPlan) -> None:
        assert self.deadline is None, "opened twice"
        self.plan = plan
        self.arrival, self.deadline = self.now, self.now + deadline_s

    async def run_stage(self, kind: str, calls: Sequence[StageCall]) -> list[StageCallResult]:
        assert self.deadline is not None and not self.closes, "a stage outside open..close"
        self.stages.append((kind, list(calls)))
        if kind == self.block_on:
            await asyncio.Event().wait()
        self.now += self.stage_s
        out = []
        for i, c in enumerate(calls):
            if kind in self.fail:
                out.append(StageCallResult("w0", 0.01, 0.5, error=self.fail[kind]))
            else:
                out.append(StageCallResult("w0", 0.01, 0.5, text=self.script(kind, i, c.messages[-1]["content"])))
        return out

    def remaining(self) -> float:
        assert self.deadline is not None
        return self.deadline - self.now

    def remaining_predictor(self) -> RemainingPredictor:
        # One stage second per remaining stage round (``test_degradation`` predicts more finely).
        return lambda plan: self.stage_s * sum(st.rounds for st in plan)

    def close(self, *, valid: bool, failed: bool = False, cancelled: bool = False) -> Closed:
        assert self.deadline is not None
        self.closes.append({"valid": valid, "failed": failed} | ({"cancelled": True} if cancelled else {}))
        return Closed(self.now - self.arrival, not failed and deadline_met(self.now, self.deadline, valid=valid))

    @property
    def kinds(self) -> list[str]:
        return [k for k, _ in self.stages]


def _runner(script: Script = gold_everywhere, **kw: Any) -> FakeRunner:
    runner = FakeRunner(script, **kw)
    _: StageRunner = runner  # the fake implements the port
    return runner


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    path = write_sqlite(tmp_path_factory.mktemp("demo") / "demo_retail.sqlite")
    yield open_database("demo_retail", DatabaseConfig.model_validate({"url": f"sqlite:///{path}"}))


@pytest.fixture(scope="module")
def pipeline() -> Text2SqlPipeline:
    return Text2SqlPipeline(PipelineConfig(candidates=2, max_revisions=2), Prompts.load())


async def test_a_question_runs_every_stage_and_answers_in_time(pipeline: Text2SqlPipeline, demo_db: Database) -> None:
    runner = _runner()
    events: list[dict[str, Any]] = []

    async def on_event(ev: dict[str, Any]) -> None:
        events.append(ev)

    out = await pipeline.answer(runner, demo_db, QUESTION, "", 60.0, request_id="r1", on_event=on_event)
    assert out.status == "ok" and out.http_status == 200
    assert out.sql == GOLD and out.rows == [[300]]
    assert runner.kinds == [
        "extract_keywords",
        "information_retriever",
        "generate_candidate",
        "generate_unit_test",
        "evaluate",
    ]
    assert [len(calls) for _, calls in runner.stages] == [1, 1, 2, 1, 2]
    assert runner.closes == [{"valid": True, "failed": False}]
    # Time comes from the runner: five stages of one second on its clock.
    assert out.latency_s == 5.0 and out.deadline_met
    assert [e["kind"] for e in events] == runner.kinds
    assert [s.kind for s in out.stages] == ["extract_keywords", "information_retriever"] + [
        "generate_candidate"
    ] * 2 + ["generate_unit_test"] + ["evaluate"] * 2
    assert out.local_s > 0


async def test_calls_carry_the_one_token_estimate_and_the_output_budget(
    pipeline: Text2SqlPipeline, demo_db: Database
) -> None:
    runner = _runner()
    await pipeline.answer(runner, demo_db, QUESTION, "", 60.0, request_id="r1")
    for kind, calls in runner.stages:
        for c in calls:
            assert c.input_tokens == message_tokens(c.messages)
            assert c.max_tokens == pipeline.cfg.max_tokens[kind] and 0 < c.output_tokens <= c.max_tokens
            assert [m["role"] for m in c.messages] == ["system", "user"] and c.temperature == 0.0


async def test_a_refused_or_empty_candidate_is_revised_with_its_problem(
    pipeline: Text2SqlPipeline, demo_db: Database
) -> None:
    def script(kind: str, i: int, prompt: str) -> str:
        if kind == "generate_candidate":
            return sql_block(REFUSED if i == 0 else WRONG)
        return gold_everywhere(kind, i, prompt)

    runner = _runner(script)
    out = await pipeline.answer(runner, demo_db, QUESTION, "", 60.0, request_id="r2")
    assert out.status == "ok" and out.sql == GOLD
    assert runner.kinds.count("revise") == 1
    revise_prompts = [c.messages[-1]["content"] for c in runner.stages[runner.kinds.index("revise")][1]]
    assert len(revise_prompts) == 2
    assert "The query was refused: calling function load_extension() is not allowed" in revise_prompts[0]
    assert "It returned no rows." in revise_prompts[1]
    assert [c["revisions"] for c in out.candidates] == [1, 1]


async def test_without_valid_sql_the_answer_misses_its_deadline_even_in_time(
    pipeline: Text2SqlPipeline, demo_db: Database
) -> None:
    def script(kind: str, i: int, prompt: str) -> str:
        return "I cannot tell." if kind in ("generate_candidate", "revise") else gold_everywhere(kind, i, prompt)

    runner = _runner(script)
    out = await pipeline.answer(runner, demo_db, QUESTION, "", 60.0, request_id="r3")
    assert out.status == "no_valid_sql" and out.error == "The answer contained no SQL query."
    assert runner.kinds.count("revise") == 2  # max_revisions rounds
    assert runner.closes == [{"valid": False, "failed": False}]
    assert out.latency_s < out.deadline_s and not out.deadline_met


async def test_past_the_deadline_the_best_candidate_is_returned_without_evaluation(
    pipeline: Text2SqlPipeline, demo_db: Database
) -> None:
    runner = _runner(stage_s=2.0)
    out = await pipeline.answer(runner, demo_db, QUESTION, "", 5.0, request_id="r4")
    assert out.status == "ok" and out.sql == GOLD
    assert runner.kinds == ["extract_keywords", "information_retriever", "generate_candidate"]
    assert runner.closes == [{"valid": True, "failed": False}]
    assert out.latency_s == 6.0 and not out.deadline_met


async def test_past_the_deadline_without_a_valid_candidate_the_status_says_so(
    pipeline: Text2SqlPipeline, demo_db: Database
) -> None:
    def script(kind: str, i: int, prompt: str) -> str:
        return "no idea" if kind == "generate_candidate" else gold_everywhere(kind, i, prompt)

    runner = _runner(script, stage_s=2.0)
    out = await pipeline.answer(runner, demo_db, QUESTION, "", 5.0, request_id="r5")
    assert out.status == "deadline_exceeded" and not out.deadline_met
    assert "revise" not in runner.kinds  # no new round starts after the deadline


@pytest.mark.parametrize("status", [502, 503, 504, 400])
async def test_a_failed_call_fails_the_question_with_its_status(
    pipeline: Text2SqlPipeline, demo_db: Database, status: int
) -> None:
    runner = _runner(fail={"generate_candidate": CallFailed("worker said no", status)})
    out = await pipeline.answer(runner, demo_db, QUESTION, "", 60.0, request_id="r6")
    assert out.status == "failed" and out.failed_stage == "generate_candidate"
    assert out.http_status == (status if status >= 500 else 502)
    assert out.error == "worker said no"
    assert runner.closes == [{"valid": False, "failed": True}] and not out.deadline_met
    assert [s.error for s in out.stages if s.kind == "generate_candidate"] == ["worker said no"] * 2


async def test_a_database_that_is_down_fails_at_the_schema_stage(pipeline: Text2SqlPipeline, tmp_path: Path) -> None:
    db = open_database("gone", DatabaseConfig.model_validate({"url": f"sqlite:///{tmp_path / 'gone.sqlite'}"}))
    runner = _runner()
    out = await pipeline.answer(runner, db, QUESTION, "", 60.0, request_id="r7")
    assert (out.status, out.failed_stage, out.http_status) == ("failed", "schema", 503)
    assert "gone" in (out.error or "") and runner.stages == []
    assert runner.closes == [{"valid": False, "failed": True}]


async def test_a_cancelled_question_closes_its_runner_once_as_cancelled(
    pipeline: Text2SqlPipeline, demo_db: Database
) -> None:
    runner = _runner(block_on="generate_candidate")
    task = asyncio.create_task(pipeline.answer(runner, demo_db, QUESTION, "", 60.0, request_id="r8"))
    while "generate_candidate" not in runner.kinds:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert runner.closes == [{"valid": False, "failed": True, "cancelled": True}]


@dataclass
class UsageRunner(FakeRunner):
    """``FakeRunner`` whose worker reports usage: prompts at half the gateway's estimate, outputs by kind."""

    outputs: dict[str, int] = field(default_factory=dict)

    async def run_stage(self, kind: str, calls: Sequence[StageCall]) -> list[StageCallResult]:
        out = await super().run_stage(kind, calls)
        return [
            StageCallResult(
                r.worker,
                r.queued_s,
                r.run_s,
                text=r.text,
                prompt_tokens=message_tokens(c.messages) // 2,
                completion_tokens=self.outputs.get(kind, 7),
            )
            for c, r in zip(calls, out, strict=True)
        ]


async def test_calls_are_sized_as_the_databases_earlier_questions_ran(demo_db: Database) -> None:
    """Until a database has ``MIN_QUESTIONS`` answered questions its calls are sized by the prior (before the model
    wrote anything, each kind's budget capped at CHESS's mean output); then as its own questions ran: each kind's
    output as the workers counted it. The prompt estimate is scaled by the workers' count over it from the first
    answer on."""
    from gateway.config.workflows import CHESS_TEMPLATE

    pipe = Text2SqlPipeline(PipelineConfig(candidates=2, max_revisions=2), Prompts.load())
    chess_out = {p.kind: p.output_tokens for p in CHESS_TEMPLATE.phases}
    outputs = {"generate_candidate": 12, "evaluate": 3}
    for i in range(MIN_QUESTIONS + 1):
        fitted = i >= MIN_QUESTIONS
        assert pipe.plan_for(demo_db.db_id).source.startswith("fitted") == fitted
        runner = UsageRunner(gold_everywhere, outputs=outputs)
        await pipe.answer(runner, demo_db, QUESTION, "", 60.0, request_id=f"r{i}")
        for kind, calls in runner.stages:
            for c in calls:
                est = message_tokens(c.messages)
                if fitted:
                    assert c.output_tokens == min(outputs.get(kind, 7), c.max_tokens)
                elif i == 0 and kind in ("extract_keywords", "information_retriever"):  # the model unseen yet
                    assert c.output_tokens == min(chess_out[kind], c.max_tokens)
                # The tokenizer's ratio is the model's: learned from the first answered question on.
                assert abs(c.input_tokens - est / 2) <= 1 if i > 0 else c.input_tokens == est
    assert 0.45 < pipe.input_scale(demo_db.db_id) < 0.55
    cand = next(p for p in pipe.plan_for(demo_db.db_id).template.phases if p.kind == "generate_candidate")
    assert cand.output_tokens == 12, "the fitted template counts what the workers counted"


async def test_the_first_question_on_a_database_is_predicted_at_its_schema_size(demo_db: Database) -> None:
    """Before any question was answered, the plan renders the pipeline's prompts at the database's schema size:
    each stage's predicted prompt is within a factor of two of the one the pipeline then sends (CHESS on BIRD's
    is ten times a small schema's), and the plan has the pipeline's own stages."""
    pipe = Text2SqlPipeline(PipelineConfig(candidates=2, max_revisions=2), Prompts.load())
    plan = await pipe.plan(demo_db)
    assert plan.source.startswith("prior: prompts at demo_retail's schema size")
    predicted = {p.kind: p.input_tokens for p in plan.template.phases}
    assert [p.kind for p in plan.template.phases] == [
        "extract_keywords",
        "information_retriever",
        "generate_candidate",
        "revise",
        "generate_unit_test",
        "evaluate",
    ]
    runner = _runner()
    await pipe.answer(runner, demo_db, QUESTION, "", 60.0, request_id="p1", plan=plan)
    assert runner.plan is plan, "the runner's workflow is budgeted by the plan admission used"
    for kind, calls in runner.stages:
        sent = message_tokens(calls[0].messages)
        assert 0.5 < predicted[kind] / sent < 2.0, kind
    assert predicted["generate_candidate"] < 10790 / 5


async def test_a_question_without_a_valid_answer_does_not_stretch_the_prediction(demo_db: Database) -> None:
    """A question the model cannot answer runs every revision round it may; it is not a sample, so the questions
    after it are predicted as before it."""
    pipe = Text2SqlPipeline(PipelineConfig(candidates=2, max_revisions=10), Prompts.load())
    for i in range(MIN_QUESTIONS):
        await pipe.answer(_runner(), demo_db, QUESTION, "", 600.0, request_id=f"ok{i}")
    before = pipe.plan_for(demo_db.db_id).template

    def hopeless(kind: str, i: int, prompt: str) -> str:
        return "I cannot tell." if kind in ("generate_candidate", "revise") else gold_everywhere(kind, i, prompt)

    out = await pipe.answer(_runner(hopeless), demo_db, QUESTION, "", 600.0, request_id="bad")
    assert out.status == "no_valid_sql" and out.revisions == 20
    assert pipe.plan_for(demo_db.db_id).template == before
    status = pipe.status([demo_db.db_id, "other_db"])
    assert status[demo_db.db_id]["answered_in_window"] == MIN_QUESTIONS
    assert status["other_db"]["source"].startswith("prior: CHESS's prompt sizes (schema not read yet)")
