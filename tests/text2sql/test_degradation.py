"""The pipeline's knobs and its degradation under a deadline, against a fake runner that predicts.

The fake (``PredictingRunner``, the ``FakeRunner`` of ``test_pipeline`` plus a prediction) predicts a plan's
remaining duration as ``per_round_s`` per call and round of each stage (``eval_round_s`` for evaluation
calls), and records every plan it was asked about; its clock advances one second per stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.core.degrade import FLOOR, Knobs, QualityModel
from gateway.core.predict import StagePlan
from gateway.text2sql.db import Database
from gateway.text2sql.pipeline import PipelineConfig, Text2SqlPipeline
from gateway.text2sql.port import DEGRADED_STEPS, RemainingPredictor, StageRunner
from gateway.text2sql.prompt_templates import Prompts
from gateway.text2sql.run import degraded_by_step
from tests.text2sql.test_pipeline import (
    GOLD,
    QUESTION,
    REFUSED,
    WRONG,
    FakeRunner,
    Script,
    demo_db,
    gold_everywhere,
    sql_block,
)

__all__ = ["demo_db"]  # the module-scoped demo database fixture, shared

DIFFERENT = "SELECT COUNT(customer_id) FROM customers WHERE customer_id <= 10"  # executes, other (non-empty) rows
FULL_KINDS = ["extract_keywords", "information_retriever", "generate_candidate", "generate_unit_test", "evaluate"]


@dataclass
class PredictingRunner(FakeRunner):
    """``FakeRunner`` whose predictions are ``per_round_s`` per remaining call and round (evaluation calls:
    ``eval_round_s``, default the same)."""

    per_round_s: float = 1.0
    eval_round_s: float | None = None
    plans: list[Sequence[StagePlan]] = field(default_factory=list)

    def remaining_predictor(self) -> RemainingPredictor:
        def predict(plan: Sequence[StagePlan]) -> float:
            self.plans.append(plan)
            ev = self.per_round_s if self.eval_round_s is None else self.eval_round_s
            return sum(
                st.rounds * len(st.calls) * (ev if st.calls[0].kind == "evaluate" else self.per_round_s) for st in plan
            )

        return predict


def _runner(
    per_round_s: float = 1.0, script: Script = gold_everywhere, eval_round_s: float | None = None
) -> PredictingRunner:
    r = PredictingRunner(script, per_round_s=per_round_s, eval_round_s=eval_round_s)
    _: StageRunner = r
    return r


def _pipeline(**kw: Any) -> Text2SqlPipeline:
    quality = QualityModel({Knobs(2, 10, True): 0.9, Knobs(2, 10, False): 0.8, FLOOR: 0.7})
    return Text2SqlPipeline(PipelineConfig(**kw), Prompts.load(), quality)


def wrong_first(bad: str) -> Script:
    """Candidate 0 answers ``bad`` (also when revised), every other call as ``gold_everywhere``."""

    def script(kind: str, i: int, prompt: str) -> str:
        if kind in ("generate_candidate", "revise") and "Candidate: 0" in prompt:
            return sql_block(bad)
        if kind == "evaluate":
            return "VERDICT: correct" if GOLD in prompt else "VERDICT: incorrect"
        return gold_everywhere(kind, i, prompt)

    return script


# ------------------------------------------------------------------------------------------------ knobs


@pytest.mark.parametrize(
    ("config", "kinds"),
    [
        ({}, FULL_KINDS),
        ({"evaluate": False}, FULL_KINDS[:3]),
        ({"candidates": 1}, FULL_KINDS[:3]),  # nothing to choose between: no unit tests, no evaluation
        ({"candidates": 3}, FULL_KINDS),
    ],
)
async def test_the_pipeline_runs_the_stages_its_knobs_ask_for(
    demo_db: Database, config: dict[str, Any], kinds: list[str]
) -> None:
    runner = _runner()
    out = await _pipeline(**config).answer(runner, demo_db, QUESTION, "", 60.0, request_id="r")
    assert out.status == "ok" and out.rows == [[300]]
    assert runner.kinds == kinds
    assert len(runner.stages[2][1]) == config.get("candidates", 2)
    assert out.degraded == [] and out.quality_mode == "full"


@pytest.mark.parametrize("cap", [0, 1, 3])
async def test_revision_rounds_stop_at_the_cap(demo_db: Database, cap: int) -> None:
    runner = _runner(script=wrong_first(REFUSED))  # candidate 0 is refused, also when revised
    out = await _pipeline(max_revisions=cap).answer(runner, demo_db, QUESTION, "", 60.0, request_id="r")
    assert runner.kinds.count("revise") == cap
    assert out.candidates[0]["revisions"] == cap and out.sql == GOLD


async def test_a_different_first_candidate_is_beaten_only_with_evaluation(demo_db: Database) -> None:
    runner = _runner(script=wrong_first(DIFFERENT))
    with_eval = await _pipeline().answer(runner, demo_db, QUESTION, "", 60.0, request_id="r")
    assert with_eval.sql == GOLD and with_eval.rows == [[300]]
    runner = _runner(script=wrong_first(DIFFERENT))
    without = await _pipeline(evaluate=False).answer(runner, demo_db, QUESTION, "", 60.0, request_id="r")
    assert without.sql == DIFFERENT  # two candidates tie on agreement; the first wins
    runner = _runner(script=wrong_first(DIFFERENT))
    three = await _pipeline(candidates=3, evaluate=False).answer(runner, demo_db, QUESTION, "", 60.0, request_id="r")
    assert three.sql == GOLD  # two of three agree


# ------------------------------------------------------------------------------------------ degradation


async def test_full_never_degrades_and_never_asks_for_a_prediction(demo_db: Database) -> None:
    runner = _runner(per_round_s=1000.0)
    out = await _pipeline().answer(runner, demo_db, QUESTION, "", 60.0, request_id="r", quality_mode="full")
    assert runner.kinds == FULL_KINDS and runner.plans == []
    assert out.degraded == [] and out.quality_mode == "full"
    assert out.as_dict()["degraded"] == [] and out.as_dict()["quality_mode"] == "full"


async def test_adaptive_keeps_full_quality_while_the_prediction_fits(demo_db: Database) -> None:
    runner = _runner(per_round_s=0.01)  # the whole plan ~0.1 s of 60
    out = await _pipeline().answer(runner, demo_db, QUESTION, "", 60.0, request_id="r", quality_mode="adaptive")
    assert runner.kinds == FULL_KINDS and out.degraded == []
    assert runner.plans  # it asked


async def test_adaptive_degrades_to_what_fits_when_the_prediction_is_long(demo_db: Database) -> None:
    runner = _runner(per_round_s=100.0)  # nothing fits 60 s: the floor
    out = await _pipeline().answer(runner, demo_db, QUESTION, "", 60.0, request_id="r", quality_mode="adaptive")
    assert out.status == "ok" and out.rows == [[300]]
    assert runner.kinds == FULL_KINDS[:3] and len(runner.stages[2][1]) == 1  # one candidate, no evaluation
    steps = {d.step: d for d in out.degraded}
    assert set(steps) == {"candidates", "evaluation"}  # the revision cap stopped nothing: not reported
    cands = steps["candidates"]
    assert cands.at == "arrival" and cands.detail == "candidates 2 -> 1"
    assert cands.reason == "predicted to miss the deadline"
    assert cands.time_left_s == 60.0 and cands.predicted_s > cands.time_left_s
    assert cands.predicted_full_s > cands.predicted_s  # the full plan was predicted longer still
    body = out.as_dict()
    assert body["quality_mode"] == "adaptive"
    assert [d["step"] for d in body["degraded"]] == ["candidates", "evaluation"]


async def test_adaptive_gives_up_evaluation_before_candidates_when_that_fits(demo_db: Database) -> None:
    runner = _runner(per_round_s=0.1, eval_round_s=1000.0)  # any plan with evaluation misses; others fit
    out = await _pipeline().answer(runner, demo_db, QUESTION, "", 60.0, request_id="r", quality_mode="adaptive")
    assert len(runner.stages[2][1]) == 2 and "evaluate" not in runner.kinds
    assert [d.step for d in out.degraded] == ["evaluation"]


async def test_fast_always_runs_the_floor(demo_db: Database) -> None:
    runner = _runner(per_round_s=0.0)  # everything would fit
    out = await _pipeline().answer(runner, demo_db, QUESTION, "", 60.0, request_id="r", quality_mode="fast")
    assert runner.kinds == FULL_KINDS[:3] and len(runner.stages[2][1]) == 1
    assert {d.step for d in out.degraded} == {"candidates", "evaluation"}
    assert all(d.reason == "quality mode fast" for d in out.degraded)


async def test_the_floor_still_revises_once_and_reports_the_cap_that_stopped_more(demo_db: Database) -> None:
    runner = _runner(script=wrong_first(REFUSED))
    out = await _pipeline().answer(runner, demo_db, QUESTION, "", 60.0, request_id="r", quality_mode="fast")
    assert runner.kinds.count("revise") == 1 and out.status == "no_valid_sql"  # one candidate, still refused
    assert [d.step for d in out.degraded] == list(DEGRADED_STEPS)
    assert out.degraded[1].detail == "revision rounds capped at 1 (of 10)"
    runner = _runner(script=wrong_first(WRONG))  # empty, then the same query again: the model stands by it
    out = await _pipeline().answer(runner, demo_db, QUESTION, "", 60.0, request_id="r", quality_mode="fast")
    assert runner.kinds.count("revise") == 1 and out.status == "ok" and out.sql == WRONG


async def test_an_unknown_quality_mode_is_refused(demo_db: Database) -> None:
    with pytest.raises(ValueError, match="quality mode"):
        await _pipeline().answer(_runner(), demo_db, QUESTION, "", 60.0, request_id="r", quality_mode="best")  # type: ignore[arg-type]


def test_degraded_steps_name_each_knob_turned_down() -> None:
    full = Knobs(2, 10, True)
    assert degraded_by_step(full, full) == []
    assert degraded_by_step(full, FLOOR) == [
        ("candidates", "candidates 2 -> 1"),
        ("revisions", "revision rounds capped at 1 (of 10)"),
        ("evaluation", "unit tests and evaluation skipped"),
    ]
    assert [s for s, _ in degraded_by_step(full, Knobs(2, 3, True))] == ["revisions"]


def test_the_metric_labels_are_the_pipelines_steps() -> None:
    from gateway.live.metrics import GatewayMetrics

    (family,) = GatewayMetrics([], ["t"]).degraded_workflows.collect()
    assert [s.labels["step"] for s in family.samples if s.name.endswith("_total")] == list(DEGRADED_STEPS)
