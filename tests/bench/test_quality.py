"""``hexflow bench quality``: the real pipeline in-process with scripted answers, accuracy per knob setting."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.bench.quality import QualityError, ScriptedStageRunner, quality_grid, run_quality
from gateway.cli import main
from gateway.config.quality import load_quality
from gateway.core.degrade import FLOOR, Knobs
from gateway.text2sql.db import DatabaseConfig, open_database
from gateway.text2sql.demo import DB_ID, write_sqlite
from gateway.text2sql.pipeline import PipelineConfig, Text2SqlPipeline
from gateway.text2sql.prompt_templates import Prompts
from workers.scripted import AnswersResponder

QUESTION = "How many customers are there?"
GOLD = "SELECT COUNT(*) FROM customers"
DIFFERENT = "SELECT COUNT(customer_id) FROM customers WHERE customer_id <= 10"  # executes, other rows


def _answer(db_path: Path, knobs: Knobs) -> list[list[object]]:
    responder = AnswersResponder({QUESTION: {"gold": GOLD, "wrong": [DIFFERENT]}})
    cfg = PipelineConfig(candidates=knobs.candidates, max_revisions=knobs.max_revisions, evaluate=knobs.evaluate)
    db = open_database(DB_ID, DatabaseConfig.model_validate({"url": f"sqlite:///{db_path}"}))
    runner = ScriptedStageRunner(responder)
    out = asyncio.run(Text2SqlPipeline(cfg, Prompts.load()).answer(runner, db, QUESTION, "", 1e9, request_id="q"))
    assert out.status == "ok"
    return out.rows


def test_a_different_first_candidate_is_right_only_with_two_candidates_and_evaluation(tmp_path: Path) -> None:
    db = write_sqlite(tmp_path / "demo.sqlite")
    assert _answer(db, Knobs(2, 10, True)) == [[300]]
    assert _answer(db, Knobs(1, 10, False)) == [[10]]
    assert _answer(db, Knobs(2, 10, False)) == [[10]]  # a tie on agreement: the first candidate
    assert _answer(db, Knobs(3, 10, False)) == [[300]]  # two of three agree


def test_the_runner_answers_as_the_emulator_and_skips_stages_per_knobs(tmp_path: Path) -> None:
    db_path = write_sqlite(tmp_path / "demo.sqlite")
    responder = AnswersResponder({QUESTION: {"gold": GOLD}})
    db = open_database(DB_ID, DatabaseConfig.model_validate({"url": f"sqlite:///{db_path}"}))
    runs = {}
    for knobs in (Knobs(2, 10, True), FLOOR):
        cfg = PipelineConfig(candidates=knobs.candidates, max_revisions=knobs.max_revisions, evaluate=knobs.evaluate)
        runner = ScriptedStageRunner(responder)
        asyncio.run(Text2SqlPipeline(cfg, Prompts.load()).answer(runner, db, QUESTION, "", 1e9, request_id="q"))
        runs[knobs] = runner.kinds
    assert runs[Knobs(2, 10, True)][-2:] == ["generate_unit_test", "evaluate"]
    assert runs[FLOOR] == ["extract_keywords", "information_retriever", "generate_candidate"]


def test_the_bench_measures_every_setting_and_full_quality_is_at_least_the_floor() -> None:
    report = run_quality(seeds=[0, 1, 2], demo_limit=12, max_candidates=3, command="test")
    assert report.settings == quality_grid(3)
    assert report.questions == {"demo": 12}
    assert set(report.correct) == set(quality_grid(3))
    full, floor = report.accuracy(Knobs(2, 10, True)), report.accuracy(FLOOR)
    assert full >= floor and full == 1.0  # the scripted evaluator always finds the gold candidate
    # Without evaluation, two candidates do no better than one (a tie goes to the wrong first candidate).
    assert report.accuracy(Knobs(2, 10, False)) == report.accuracy(Knobs(1, 10, False))


def test_the_written_file_loads_as_the_quality_model(tmp_path: Path) -> None:
    report = run_quality(seeds=[0], demo_limit=4, max_candidates=2, command="hexflow bench quality --seeds 0")
    path = tmp_path / "quality.yaml"
    path.write_text(report.to_yaml())
    assert path.read_text().startswith("# Answer accuracy per knob setting")
    assert "#   hexflow bench quality --seeds 0\n" in path.read_text()
    model = load_quality(path)
    assert set(model.table) == set(quality_grid(2))
    assert model.accuracy(Knobs(2, 10, True)) == report.accuracy(Knobs(2, 10, True))
    assert "4 questions x 1 seeds" in model.source


def test_the_packaged_quality_model_covers_the_default_pipelines_settings() -> None:
    model = load_quality()
    assert set(quality_grid(2)) <= set(model.table)
    assert model.accuracy(Knobs(2, 10, True)) >= model.accuracy(FLOOR)


def test_bad_arguments_stop_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, words in (
        (["--seeds", "x"], "--seeds"),
        (["--seeds", "1,1"], "distinct"),
        (["--wrong-fraction", "2"], "--wrong-fraction"),
        (["--max-candidates", "0"], "--max-candidates"),
        (["--spider", "nowhere"], "not a folder"),
        (["--spider-limit", "5"], "only with --spider"),
    ):
        assert main(["bench", "quality", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    with pytest.raises(QualityError, match="--max-candidates"):
        quality_grid(0)
