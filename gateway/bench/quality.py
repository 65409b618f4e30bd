"""``hexflow bench quality``: answer accuracy of the Text-to-SQL pipeline at every knob setting (``quality_grid``),
the real ``Text2SqlPipeline`` run in-process with scripted answers (``ScriptedStageRunner``) on the demo and,
optionally, Spider dev questions. Method: docs/text2sql.md ("The quality model"); the output is
``gateway/config/quality.yaml`` (``QualityReport.to_yaml``)."""

from __future__ import annotations

import asyncio
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.bench.stats import table
from gateway.bench.text2sql_eval import EvalError, EvalItem, gold_rows, spider_items
from gateway.config.databases import DatabaseConfig
from gateway.core.degrade import Knobs, QuestionPlan, knob_grid
from gateway.core.predict import StagePlan
from gateway.core.workflow import CallSpec
from gateway.errors import GatewayError
from gateway.text2sql.answers import Answers, answers_from_spider, build_demo_answers
from gateway.text2sql.db import Database, open_database
from gateway.text2sql.demo import DB_ID, demo_questions, write_sqlite
from gateway.text2sql.evaluate import matches_gold
from gateway.text2sql.pipeline import PipelineConfig, Text2SqlPipeline
from gateway.text2sql.port import Closed, RemainingPredictor, StageCall, StageCallResult
from gateway.text2sql.prompt_templates import Prompts
from workers.emulator import GenRequest, chat_prompt_tokens, count_tokens
from workers.scripted import AnswersResponder

FULL = Knobs(candidates=2, max_revisions=10, evaluate=True)
"""The pipeline's default knobs (``config/gateway.yaml`` ``text2sql``), full quality."""
FAR = 1e9  # the bench's deadline, seconds: never reached (its clock counts one second per stage)


class QualityError(GatewayError):
    """The bench cannot run: an unreadable dataset or bad arguments (the message says which)."""


def quality_grid(max_candidates: int = 3, full: Knobs = FULL) -> list[Knobs]:
    """The settings measured: ``knob_grid`` of ``full`` widened to ``max_candidates`` candidates (fullest first)."""
    if max_candidates < 1:
        raise QualityError(f"--max-candidates must be >= 1, got {max_candidates}")
    return knob_grid(Knobs(max(max_candidates, 1), full.max_revisions, full.evaluate))


class ScriptedStageRunner:
    """A ``StageRunner`` in-process: every call is answered by a scripted model (``AnswersResponder``) from
    the prompt text the emulator would see (the messages' contents joined by a space), a call that the
    script does not cover gets an empty answer. Its clock counts one second per stage; nothing waits.
    ``calls``: every call's shape as the emulator counts it, in order."""

    def __init__(self, responder: AnswersResponder) -> None:
        self.responder = responder
        self.now = 0.0
        self.deadline: float | None = None
        self.closed: Closed | None = None
        self.kinds: list[str] = []
        self.calls: list[CallSpec] = []

    def open(self, deadline_s: float, plan: QuestionPlan) -> None:
        """Start the question (its deadline ``deadline_s`` from the clock's zero)."""
        if self.deadline is not None:
            raise RuntimeError("the runner is open already (one runner per question)")
        self.deadline = deadline_s

    async def run_stage(self, kind: str, calls: Sequence[StageCall]) -> list[StageCallResult]:
        """Answer each call from the script; one second passes."""
        self.kinds.append(kind)
        self.now += 1.0
        out = []
        for c in calls:
            text = " ".join(str(m.get("content", "")) for m in c.messages)
            req = GenRequest("chat", text, list(c.messages), c.input_tokens, c.max_tokens, None)
            answer = self.responder.answer(req)
            # Usage as the emulator counts it: its prompt tokens, and the scripted answer's words up to
            # max_tokens (a call the script does not cover generates max_tokens of filler there).
            n_out = c.max_tokens if answer is None else min(c.max_tokens, max(count_tokens(answer), 1))
            n_in = chat_prompt_tokens(list(c.messages))
            out.append(
                StageCallResult("scripted", 0.0, 0.0, text=answer or "", prompt_tokens=n_in, completion_tokens=n_out)
            )
            self.calls.append(CallSpec(kind, n_in, n_out))
        return out

    def remaining(self) -> float:
        """Seconds to the deadline on the stage clock."""
        return (self.deadline if self.deadline is not None else FAR) - self.now

    def remaining_predictor(self) -> RemainingPredictor:
        """One second per remaining stage round (the bench's clock; no queues)."""

        def predict(plan: Sequence[StagePlan]) -> float:
            return float(sum(st.rounds for st in plan))

        return predict

    def close(self, *, valid: bool, failed: bool = False, cancelled: bool = False) -> Closed:
        """End the question; met when valid and within the deadline."""
        if self.closed is None:
            ok = valid and not failed and not cancelled and self.deadline is not None and self.now <= self.deadline
            self.closed = Closed(self.now, ok)
        return self.closed


@dataclass
class _Set:
    """The questions of one source under one seed, with their script."""

    source: str
    seed: int
    items: list[EvalItem]
    answers: Answers


@dataclass
class QualityReport:
    """Correct answers per setting, per source (summed over seeds): see ``rows`` and ``to_yaml``. ``asked``:
    questions asked per source at each setting, summed over the seeds."""

    settings: list[Knobs]
    seeds: list[int]
    asked: dict[str, int] = field(default_factory=dict)
    correct: dict[Knobs, dict[str, int]] = field(default_factory=dict)
    wrong_fraction: float = 0.25
    command: str = ""

    @property
    def questions(self) -> dict[str, int]:
        """Questions per source (each asked once per seed and setting)."""
        return {s: n // len(self.seeds) for s, n in self.asked.items()}

    def accuracy(self, k: Knobs, source: str | None = None) -> float:
        """Share of correct answers at ``k`` over every seed (one source, or all pooled)."""
        sources = [source] if source is not None else list(self.asked)
        asked = sum(self.asked[s] for s in sources)
        return sum(self.correct.get(k, {}).get(s, 0) for s in sources) / asked if asked else 0.0

    def source_text(self) -> str:
        """What was measured, in words."""
        names = {"demo": f"demo questions ({DB_ID})", "spider-dev": "Spider dev"}
        parts = [f"{names.get(s, s)}: {n}" for s, n in self.questions.items()]
        return (
            f"the Text2SqlPipeline in-process with scripted answers (a wrong first candidate for "
            f"{self.wrong_fraction:g} of the questions), {' + '.join(parts)} questions"
        )

    def rows(self) -> list[dict[str, Any]]:
        """One row per setting: its knobs, the pooled accuracy and the accuracy per source."""
        out = []
        for k in self.settings:
            row: dict[str, Any] = {**asdict(k), "accuracy": round(self.accuracy(k), 4)}
            if len(self.questions) > 1:
                row["by_source"] = {s: round(self.accuracy(k, s), 4) for s in self.questions}
            out.append(row)
        return out

    def to_yaml(self) -> str:
        """The quality file (``gateway/config/quality.yaml``), its header naming the command."""
        header = (
            "# Answer accuracy per knob setting of the Text-to-SQL pipeline (gateway/config/quality.py loads it;\n"
            "# the degradation policy, gateway/core/degrade.py, ranks the settings that fit a deadline by it).\n"
            "# Measured, not edited: the output of\n"
            f"#   {self.command}\n"
            "# (gateway/bench/quality.py says how: the real pipeline in-process, scripted answers as the emulator\n"
            "# gives them, SQL executed on the real SQLite databases, rows compared with the gold query's).\n"
        )
        body = {
            "source": self.source_text(),
            "command": self.command,
            "questions": sum(self.questions.values()),
            "seeds": list(self.seeds),
            "rows": self.rows(),
        }
        return header + yaml.safe_dump(body, sort_keys=False, width=120)


def format_report(report: QualityReport) -> str:
    """A text table: accuracy per setting (pooled, then per source)."""
    sources = list(report.questions)
    headers = ["candidates", "max_revisions", "evaluate", "accuracy"] + (sources if len(sources) > 1 else [])
    cells = []
    for k in report.settings:
        row = [str(k.candidates), str(k.max_revisions), "yes" if k.evaluate else "no", f"{report.accuracy(k):.4f}"]
        if len(sources) > 1:
            row += [f"{report.accuracy(k, s):.4f}" for s in sources]
        cells.append(row)
    n = ", ".join(f"{s} {q}" for s, q in report.questions.items())
    title = f"accuracy per knob setting ({n} questions x {len(report.seeds)} seeds)"
    return title + "\n" + table(headers, cells, left=3, rule=False)


# --------------------------------------------------------------------------------------------- questions


def demo_items(db_path: Path) -> list[EvalItem]:
    """The demo questions on the demo database file ``db_path``."""
    return [EvalItem(DB_ID, q.question, q.query, db_path, q.evidence) for q in demo_questions()]


def spider_quality_items(dataset_dir: Path, limit: int | None) -> list[EvalItem]:
    """The first ``limit`` questions of a Spider-layout ``dev.json`` whose database file exists."""
    try:
        items = spider_items(dataset_dir, limit)
    except EvalError as exc:
        raise QualityError(str(exc)) from None
    firsts: dict[str, EvalItem] = {}  # the script keeps a repeated question's first entry; so do we
    for it in items:
        firsts.setdefault(" ".join(it.question.split()), it)
    return list(firsts.values())


# ------------------------------------------------------------------------------------------------ running


async def _ask(
    pipe: Text2SqlPipeline, db: Database, responder: AnswersResponder, item: EvalItem, gold: list[tuple[object, ...]]
) -> bool:
    runner = ScriptedStageRunner(responder)
    res = await pipe.answer(runner, db, item.question, item.evidence or "", FAR, request_id="quality")
    return res.status == "ok" and matches_gold(item.gold, gold, res.rows)


async def _measure(
    sets: Sequence[_Set],
    settings: Sequence[Knobs],
    report: QualityReport,
    progress: Callable[[int], object] | None,
) -> None:
    prompts = Prompts.load()
    dbs: dict[Path, Database] = {}
    try:
        for s in sets:
            responder = AnswersResponder(dict(s.answers))
            # A gold query that does not run here leaves its question out (never counted wrong).
            golds = await asyncio.gather(*(asyncio.to_thread(gold_rows, it) for it in s.items))
            runnable = [(it, g) for it, (g, _) in zip(s.items, golds, strict=True) if g is not None]
            report.asked[s.source] = report.asked.get(s.source, 0) + len(runnable)
            for it, _ in runnable:
                if it.db_path not in dbs:
                    cfg = DatabaseConfig.model_validate({"url": f"sqlite:///{it.db_path.resolve().as_posix()}"})
                    dbs[it.db_path] = open_database(it.db_id, cfg)
            for k in settings:
                pipe = Text2SqlPipeline(PipelineConfig(**asdict(k)), prompts)
                ok = 0
                for it, g in runnable:
                    ok += await _ask(pipe, dbs[it.db_path], responder, it, g)
                by_source = report.correct.setdefault(k, {})
                by_source[s.source] = by_source.get(s.source, 0) + ok
                if progress is not None:
                    progress(len(s.items))
    finally:
        for db in dbs.values():
            await db.close()


def run_quality(
    *,
    seeds: Sequence[int] = (0, 1, 2),
    wrong_fraction: float = 0.25,
    spider: Path | None = None,
    spider_limit: int | None = None,
    demo_limit: int | None = None,
    max_candidates: int = 3,
    command: str = "",
    progress: bool = False,
) -> QualityReport:
    """Measure accuracy at every setting of ``quality_grid(max_candidates)``. ``demo_limit``/``spider_limit``
    take the first questions of each set; questions whose gold query does not run are left out."""
    if not seeds:
        raise QualityError("--seeds: give at least one seed")
    if not 0.0 <= wrong_fraction <= 1.0 or math.isnan(wrong_fraction):
        raise QualityError(f"--wrong-fraction must be in [0, 1], got {wrong_fraction}")
    settings = quality_grid(max_candidates)
    with tempfile.TemporaryDirectory(prefix="hexflow-quality-") as tmp:
        sets: list[_Set] = []
        spider_items_ = spider_quality_items(spider, spider_limit) if spider is not None else []
        for seed in seeds:
            db_path = write_sqlite(Path(tmp) / f"demo_{seed}.sqlite", seed)
            items = demo_items(db_path)[:demo_limit] if demo_limit is not None else demo_items(db_path)
            sets.append(_Set("demo", seed, items, build_demo_answers(seed=seed, wrong_fraction=wrong_fraction)))
            if spider is not None:
                answers = answers_from_spider(spider, wrong_fraction=wrong_fraction, seed=seed, limit=spider_limit)
                sets.append(_Set("spider-dev", seed, spider_items_, answers))
        report = QualityReport(settings, list(seeds), wrong_fraction=wrong_fraction, command=command)
        total = sum(len(s.items) for s in sets) * len(settings)
        from tqdm import tqdm

        with tqdm(total=total, desc="quality", unit="q", disable=not progress, leave=False) as bar:
            asyncio.run(_measure(sets, settings, report, bar.update))
    return report
