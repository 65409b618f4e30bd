"""The agentic Text-to-SQL pipeline (CHESS / CHASE-SQL shape), run stage by stage through a ``StageRunner``.

    extract_keywords -> schema linking (information_retriever) -> N candidates in parallel
    (generate_candidate, one strategy each) -> execute each; an error, an unparseable answer or an empty
    result triggers a ``revise`` call with the problem, up to ``max_revisions`` rounds (candidates that
    need it revise in parallel, one stage per round) -> unit tests (generate_unit_test) -> one evaluation
    per executable candidate in parallel (evaluate) -> selection: evaluator verdicts first, ties broken
    by how many candidates agree on the execution result, then by candidate order.

The pipeline is a domain: it decides which stages run and never knows how calls are scheduled or sent.
Every stage goes to the runner (``gateway.text2sql.port``) with its calls' token counts
(``gateway.core.tokens.message_tokens``), so the live gateway's stage budgets and urgency follow the
CHESS template exactly as the simulator's ``chess-bird`` workload models it. SQL is extracted from model
output (``extract``), checked against the dialect's allowlists (``sqlsafe``) and executed read-only with a
timeout and row and byte caps (``db``).

Time: everything about the deadline comes from the runner (``remaining()``, ``Closed``), one clock. The
only other clock is the ``local_s`` stopwatch (``time.perf_counter``), the wall time of local work,
reported as such and never compared with the runner's.

Degradation (``gateway.core.degrade``): the knobs of a question (SQL candidates, the revision cap, unit tests
and evaluation) start at the configuration's (full quality) and, for a tenant whose quality mode is not
``full``, are re-decided at arrival and at every stage boundary by the tenant's ``Degrader``: the most
accurate setting (``QualityModel``) whose remaining plan the runner predicts to finish within the time left
(``StageRunner.remaining_predictor``), else the floor.

Prediction: one plan per question (``QuestionPlan``, from ``Text2SqlPipeline.plan``), made once at admission
and used for everything the gateway decides about it (admission, stage budgets, the overload re-check,
shedding, demotion) and for degradation here. Its template is the pipeline's own stages (keywords, schema
linking, the candidates, revise rounds, unit tests and evaluation: ``structure``), sized in three tiers:

* a database with ``MIN_QUESTIONS`` answered questions in its window (``DB_WINDOW``): that database's own
  figures (``gateway.core.shapes``: robust means over its recent answered questions: tokens per call and
  kind, rounds per kind, as the workers counted them);
* before that, a prior: each stage's prompt rendered at the database's schema size with typical values for
  the question's parts (``prior_inputs``), the model's output lengths from every database's recent calls
  (``OUTPUT_WINDOW``) and its revise rounds from every database's recent answered questions (``POOLED_WINDOW``);
* before any answered question at all, the output budget of each kind capped at CHESS's mean output, and
  ``PRIOR_REVISE_ROUNDS``.

Only questions answered with a valid SQL are samples: one the model cannot answer runs every revision round,
and would stretch every later question's prediction. The same figures size each call the scheduler dispatches:
its expected output is the plan's for its kind, its prompt the characters/4 estimate times the ratio of the
worker-counted prompt tokens (``usage``) to that estimate (``input_scale``).
Knobs spent stay spent (candidates generated, rounds run, evaluation begun or skipped). What
the final knobs skipped is reported in ``degraded`` with the decision that skipped it. Unit tests and
evaluation never run with fewer than two candidates (nothing to choose between).

Deadlines: no new revision round starts after the deadline; past the deadline with an executable
candidate, unit tests and evaluation are skipped and the best candidate by agreement is returned
(``deadline_met`` false); past it without one, the status is ``deadline_exceeded``. ``deadline_met`` is
the runner's verdict (``gateway.core.workflow.deadline_met``: in time *and* a valid answer), the same the
gateway's metrics count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gateway.config.quality import QUALITY
from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.degrade import (
    SKIPPABLE,
    Decision,
    Degrader,
    Knobs,
    QualityMode,
    QualityModel,
    QuestionPlan,
    degraded_steps,
)
from gateway.core.shapes import OutputWindow, QuestionSample, ShapeWindow, fit
from gateway.core.tokens import message_tokens, text_tokens
from gateway.core.workflow import (
    CANDIDATE,
    EVALUATE,
    IR,
    KEYWORDS,
    REVISE,
    UNIT_TEST,
    PhaseSpec,
    TemplateCursor,
    WorkflowTemplate,
)
from gateway.text2sql.answers import normalise_sql
from gateway.text2sql.db import Database, DatabaseUnavailable, QueryFailed, QueryResult, SchemaInfo, serialize_schema
from gateway.text2sql.evaluate import results_match
from gateway.text2sql.extract import extract_list, extract_sql, extract_verdict
from gateway.text2sql.port import Closed, StageCall, StageCallError, StageRunner
from gateway.text2sql.prompt_templates import Prompts
from gateway.text2sql.result import Candidate, Degradation, StageReport, Text2SqlResult, select
from gateway.text2sql.sqlsafe import SqlRejected

_EMPTY = "It returned no rows."
STRATEGIES: tuple[tuple[str, str], ...] = (
    (
        "divide_and_conquer",
        "Break the question into sub-questions, write SQL for each, then combine them into one query.",
    ),
    ("query_plan", "Think about the query plan first: which tables to scan, how to join and filter, then write it."),
    ("direct", "Write the most direct query that answers the question."),
    ("step_by_step", "Identify the needed columns, the join path and the filters step by step, then write it."),
)
EventFn = Callable[[dict[str, Any]], Awaitable[None]]
_CHESS_OUTPUT = {p.kind: p.output_tokens for p in CHESS_TEMPLATE.phases}
DB_WINDOW = 100
"""Answered questions per database its figures are fitted over (the most recent)."""
POOLED_WINDOW = 300
"""Answered questions, over every database, the model's revise rounds are fitted over."""
OUTPUT_WINDOW = 500
"""Calls per stage kind, over every database, the model's output lengths are fitted over."""
PRIOR_REVISE_ROUNDS = 1.0
"""Revise rounds a question is predicted to take before any question was answered: the pipeline revises a
wrong or empty first attempt, and most first attempts need at most one round; replaced by the model's own
figure after the first answered questions (``POOLED_WINDOW``)."""
_TYPICAL = {
    "question": "Which customers placed more than three orders in 2023, and what did each of them spend in total?",
    "keywords": json.dumps(["customers", "orders", "2023", "total spent", "order count"]),
    "linked": "customers.customer_id, customers.name, orders.customer_id, orders.order_date, orders.total",
    "sql": "SELECT c.name, SUM(o.total) FROM customers AS c JOIN orders AS o ON o.customer_id = c.customer_id "
    "WHERE o.order_date >= '2023-01-01' GROUP BY c.customer_id HAVING COUNT(*) > 3",
    "problem": "Executing it failed: no such column: o.total",
    "unit_tests": "1. The result has one row per customer.\n2. Every total is positive.\n3. Only 2023 orders count.",
    "preview": "name | total\nAda | 120.5\nBo | 99.0\nCy | 87.25",
}
"""Typical values of a question's parts, to render the prior's prompts at a database's schema size."""


@dataclass(frozen=True)
class PipelineConfig:
    """Stage counts and output budgets (tokens) of the pipeline: its full-quality knobs.

    ``evaluate`` off (or a single candidate) skips unit-test generation and evaluation.
    """

    candidates: int = 2
    max_revisions: int = 10
    evaluate: bool = True
    unit_tests: int = 3
    schema_max_chars: int = 24_000
    preview_rows: int = 5
    max_tokens: dict[str, int] = field(
        default_factory=lambda: {
            KEYWORDS: 96,
            IR: 256,
            CANDIDATE: 768,
            REVISE: 768,
            UNIT_TEST: 256,
            EVALUATE: 96,
        }
    )

    @property
    def knobs(self) -> Knobs:
        """The full-quality knobs: evaluation only with two candidates or more."""
        return Knobs(self.candidates, self.max_revisions, self.evaluate and self.candidates >= 2)


DEGRADED_STEPS: tuple[str, ...] = ("candidates", "revisions", "evaluation")
"""The knobs a degraded question can have turned down (a bounded metric label)."""


def degraded_by_step(full: Knobs, used: Knobs) -> list[tuple[str, str]]:
    """``(step, words)`` for each knob ``used`` turned down from ``full`` (``DEGRADED_STEPS`` order; the words
    are ``gateway.core.degrade.degraded_steps``')."""
    one_each = (
        ("candidates", Knobs(used.candidates, full.max_revisions, full.evaluate)),
        ("revisions", Knobs(full.candidates, used.max_revisions, full.evaluate)),
        ("evaluation", Knobs(full.candidates, full.max_revisions, used.evaluate)),
    )
    out: list[tuple[str, str]] = []
    for step, k in one_each:
        words = degraded_steps(full, k)
        if words:
            out.append((step, words[0]))
    return out


def _knob(k: Knobs, step: str) -> int | bool:
    """The value of the knob ``step`` names."""
    return k.candidates if step == "candidates" else k.max_revisions if step == "revisions" else k.evaluate


class _StageFailed(Exception):
    def __init__(self, stage: str, err: StageCallError) -> None:
        super().__init__(f"stage {stage} failed: {err}")
        self.stage = stage
        self.err = err


@dataclass(frozen=True)
class _Failure:
    """Why a run ended without an answer: the stage, the message and its HTTP status."""

    stage: str
    message: str
    status: int


def _preview(result: QueryResult, n: int) -> str:
    lines = [" | ".join(result.columns)]
    for row in result.rows[:n]:
        lines.append(" | ".join("NULL" if v is None else str(v)[:60] for v in row))
    return "\n".join(lines)


def _refusal(exc: SqlRejected) -> str:
    """The problem a model is told when its SQL was refused (the parser's own words too, when it has some)."""
    text = f"The query was refused: {exc}"
    return f"{text}. The parser said: {exc.detail}" if exc.detail else text


class Text2SqlPipeline:
    """Runs questions through the pipeline; one instance serves every request (it holds no per-run state).

    Args:
        config: stage counts and output budgets (the full-quality knobs).
        prompts: the prompt templates (``Prompts.load()``: read once, at start-up).
        quality: accuracy per knob setting, ranking the settings an ``adaptive`` tenant may get (default:
            the packaged, measured ``gateway/config/quality.yaml``).
    """

    def __init__(self, config: PipelineConfig, prompts: Prompts, quality: QualityModel | None = None) -> None:
        self.cfg = config
        self.prompts = prompts
        self.quality = quality if quality is not None else QUALITY
        self.degraders: dict[str, Degrader] = {
            mode: Degrader(mode, config.knobs, self.quality) for mode in ("full", "adaptive", "fast")
        }
        self.shapes: dict[str, ShapeWindow] = {}
        """Per database: its recent answered questions (one entry per configured database: bounded)."""
        self.pooled = ShapeWindow(POOLED_WINDOW, SKIPPABLE)
        """Every database's recent answered questions: the model's revise rounds."""
        self.outputs = OutputWindow(OUTPUT_WINDOW)
        """Every database's recent calls as they return: the model's output lengths."""
        self._schemas: dict[str, tuple[SchemaInfo, str, dict[str, int]]] = {}
        """Per database: its schema as last introspected, serialised, and the prior's prompt tokens at it."""

    def structure(self, inputs: dict[str, int] | None = None) -> WorkflowTemplate:
        """The pipeline's own stages at full quality, before any answered question: keywords, schema linking,
        the candidates in parallel, revise rounds (``PRIOR_REVISE_ROUNDS``), then unit tests and one evaluation
        per candidate when the configuration evaluates. Each call's output is the model's (``OutputWindow``),
        before the model was observed its kind's budget capped at CHESS's mean output; its input
        ``inputs[kind]`` (default: CHESS's)."""
        cfg = self.cfg
        knobs = cfg.knobs

        def phase(kind: str, rounds: float = 1.0, width: int = 1, repeatable: bool = False) -> PhaseSpec:
            n_in = (inputs or {}).get(kind) or next(p.input_tokens for p in CHESS_TEMPLATE.phases if p.kind == kind)
            budget = cfg.max_tokens[kind]
            n_out = self.outputs.expected(kind, budget) or min(budget, _CHESS_OUTPUT.get(kind, budget))
            return PhaseSpec(kind, n_in, n_out, rounds, width, repeatable)

        phases = [phase(KEYWORDS), phase(IR), phase(CANDIDATE, width=knobs.candidates)]
        rounds = min(PRIOR_REVISE_ROUNDS, float(knobs.max_revisions))
        if rounds > 0:
            phases.append(phase(REVISE, rounds, repeatable=True))
        if knobs.evaluate:
            phases += [phase(UNIT_TEST), phase(EVALUATE, width=knobs.candidates)]
        return WorkflowTemplate("text2sql", tuple(phases))

    def prior_inputs(self, schema_text: str, dialect: str) -> dict[str, int]:
        """Each stage's prompt tokens (estimated: characters / 4) for a typical question on a database whose
        serialised schema is ``schema_text``: the prompts rendered with typical values of the question's parts."""
        render = self.prompts.render
        system = render("system", dialect=dialect)
        t = _TYPICAL
        q, ev = t["question"], "none"
        texts = {
            KEYWORDS: render("extract_keywords", question=q, evidence=ev),
            IR: render("schema_linking", question=q, evidence=ev, keywords=t["keywords"], schema=schema_text),
            CANDIDATE: render(
                "candidate",
                index=0,
                strategy=STRATEGIES[0][0],
                strategy_text=STRATEGIES[0][1],
                question=q,
                evidence=ev,
                linked=t["linked"],
                schema=schema_text,
                dialect=dialect,
            ),
            REVISE: render(
                "revise",
                index=0,
                question=q,
                evidence=ev,
                schema=schema_text,
                sql=t["sql"],
                problem=t["problem"],
                dialect=dialect,
            ),
            UNIT_TEST: render("unit_tests", question=q, evidence=ev, schema=schema_text, n=self.cfg.unit_tests),
            EVALUATE: render(
                "evaluate",
                index=0,
                question=q,
                evidence=ev,
                unit_tests=t["unit_tests"],
                sql=t["sql"],
                row_count=3,
                preview=t["preview"],
            ),
        }
        return {
            k: message_tokens(({"role": "system", "content": system}, {"role": "user", "content": v}))
            for k, v in texts.items()
        }

    async def schema_text(self, db: Database) -> str:
        """``db``'s schema serialised for the prompts (introspected once, as ``Database.schema`` caches it; the
        text and the prior's prompt sizes at it are kept until the schema is introspected again)."""
        schema = await db.schema()
        kept = self._schemas.get(db.db_id)
        if kept is None or kept[0] is not schema:
            text = serialize_schema(schema, max_chars=self.cfg.schema_max_chars)
            kept = (schema, text, self.prior_inputs(text, db.dialect))
            self._schemas[db.db_id] = kept
        return kept[1]

    def input_scale(self, db_id: str) -> float:
        """The workers' prompt tokens over the gateway's estimate: the database's once it has ``MIN_QUESTIONS``
        answered questions, else every database's, else 1."""
        w = self.shapes.get(db_id)
        scale = w.input_scale if w is not None and w.ready else None
        if scale is None:
            scale = self.pooled.input_scale
        return 1.0 if scale is None else scale

    def plan_for(self, db_id: str, mode: QualityMode = "full") -> QuestionPlan:
        """The prediction of the next question on ``db_id`` at quality ``mode`` (see the module docstring):
        its template from the database's answered questions once it has ``MIN_QUESTIONS``, else the prior at
        its schema size (as last introspected: ``schema_text``; CHESS's prompt sizes if never), and the
        floor the mode may degrade to."""
        degrader = self.degraders.get(mode)
        if degrader is None:
            raise ValueError(f"quality mode must be one of full, adaptive, fast, got {mode!r}")
        kept = self._schemas.get(db_id)
        scale = self.input_scale(db_id)
        inputs = None if kept is None else {k: max(1, round(v * scale)) for k, v in kept[2].items()}
        base = self.structure(inputs)
        pooled = self.pooled
        if pooled.ready:
            base = fit(base, pooled, inputs=False, outputs=False, fixed_width=frozenset({CANDIDATE}), name="text2sql")
        mine = self.shapes.get(db_id)
        if mine is not None and mine.ready:
            template = fit(base, mine, fixed_width=frozenset({CANDIDATE}), name=f"text2sql-{db_id}")
            source = f"fitted to the last {mine.questions} answered questions on {db_id}"
        else:
            size = "CHESS's prompt sizes (schema not read yet)" if kept is None else f"prompts at {db_id}'s schema size"
            outputs = (
                "the model's output lengths over its recent calls"
                if self.outputs.observed
                else "output budgets capped at CHESS's mean output (the model not observed yet)"
            )
            rounds = (
                f"revise rounds over its last {pooled.questions} answered questions"
                if pooled.ready
                else f"{PRIOR_REVISE_ROUNDS:g} revise round"
            )
            source = f"prior: {size}, {outputs}, {rounds}"
            template = base
        floor = degrader.full if mode == "full" else degrader.grid[-1]
        observed = self.outputs.observed or (mine is not None and mine.ready)
        return QuestionPlan(template, degrader.full, floor, source, observed)

    async def plan(self, db: Database, mode: QualityMode = "full") -> QuestionPlan:
        """``plan_for`` with ``db``'s schema read first (once: it is cached), so that a database's first
        question is predicted at its schema size. A database that cannot be read is predicted as before it
        was (its question fails at its schema stage, as it would have)."""
        with contextlib.suppress(DatabaseUnavailable):
            await self.schema_text(db)
        return self.plan_for(db.db_id, mode)

    def record(self, db_id: str, sample: QuestionSample) -> None:
        """One question answered with a valid SQL on ``db_id``: a sample of its database and of the model."""
        w = self.shapes.get(db_id)
        if w is None:
            w = self.shapes[db_id] = ShapeWindow(DB_WINDOW, SKIPPABLE)
        w.add(sample)
        self.pooled.add(sample)

    def status(
        self, db_ids: Iterable[str] = (), predict: Callable[[QuestionPlan], float] | None = None
    ) -> dict[str, Any]:
        """Per database (``db_ids`` and every one seen so far): its predicted plan at full quality, and with
        ``predict`` the seconds it gives that plan (``predicted_s``)."""
        out: dict[str, Any] = {}
        for db_id in sorted(set(db_ids) | set(self._schemas) | set(self.shapes)):
            plan = self.plan_for(db_id)
            w = self.shapes.get(db_id)
            out[db_id] = {
                "source": plan.source,
                "answered_in_window": 0 if w is None else w.questions,
                "stages": [
                    {
                        "kind": p.kind,
                        "input_tokens": p.input_tokens,
                        "output_tokens": p.output_tokens,
                        "rounds": round(p.rounds, 3),
                        "width": p.width,
                    }
                    for p in plan.template.phases
                ],
            }
            if predict is not None:
                out[db_id]["predicted_s"] = round(predict(plan), 6)
        return out

    async def answer(
        self,
        runner: StageRunner,
        db: Database,
        question: str,
        evidence: str,
        deadline_s: float,
        *,
        request_id: str,
        on_event: EventFn | None = None,
        quality_mode: QualityMode = "full",
        plan: QuestionPlan | None = None,
    ) -> Text2SqlResult:
        """Answer one question with ``runner`` (fresh, unopened); never raises for model, SQL or database
        problems (they are statuses). The runner is opened first (the deadline runs from arrival: fetching
        the schema is part of the answer) and closed exactly once, also on cancellation. ``quality_mode``:
        the tenant's (``full`` never degrades; ``adaptive`` and ``fast``: see the module docstring).
        ``plan``: the question's prediction as admission made it (default: ``plan_for`` now)."""
        degrader = self.degraders.get(quality_mode)
        if degrader is None:
            raise ValueError(f"quality mode must be one of full, adaptive, fast, got {quality_mode!r}")
        if plan is None:
            plan = self.plan_for(db.db_id, quality_mode)
        started = time.perf_counter()
        stages: list[StageReport] = []
        runner.open(deadline_s, plan)
        run: _Run | None = None
        outcome: tuple[str, Candidate | None] | _Failure = _Failure("open", "cancelled", 500)
        cancelled = False
        try:
            try:
                schema_text = await self.schema_text(db)
            except DatabaseUnavailable as exc:
                outcome = _Failure("schema", str(exc), exc.status)
            else:
                run = _Run(
                    self, runner, db, question, evidence or "none", schema_text, stages, on_event, degrader, plan
                )
                run.local_s = time.perf_counter() - started
                try:
                    outcome = await run.go()
                except _StageFailed as exc:
                    outcome = _Failure(exc.stage, str(exc.err), exc.err.status)
                except DatabaseUnavailable as exc:
                    outcome = _Failure("execute", str(exc), exc.status)
        except asyncio.CancelledError:  # the caller gave up (the client went away): no further stage
            cancelled = True
            raise
        finally:
            ok = isinstance(outcome, tuple) and outcome[0] == "ok"
            closed = runner.close(valid=ok, failed=isinstance(outcome, _Failure), cancelled=cancelled)
        if run is not None and isinstance(outcome, tuple) and outcome[0] == "ok":
            # Answered with a valid SQL: its stages are a sample (one the model could not answer ran every round
            # it was allowed; counted, it would stretch every later question's prediction).
            self.record(db.db_id, QuestionSample.of(run.shape, evaluated=run.evaluated, prompt_sizes=run.prompt_sizes))
        candidates = run.candidates if run is not None else []
        degraded = run.degradations() if run is not None else []
        if isinstance(outcome, _Failure):
            failed = _failed(request_id, outcome, stages, deadline_s, closed, candidates)
            failed.degraded, failed.quality_mode = degraded, quality_mode
            return failed
        status, chosen = outcome
        res = chosen.result if chosen is not None else None
        return Text2SqlResult(
            id=request_id,
            status=status,
            sql=chosen.sql if chosen is not None else None,
            columns=res.columns if res is not None else [],
            rows=res.rows if res is not None else [],
            row_count=res.row_count if res is not None else 0,
            truncated=res.truncated if res is not None else False,
            candidates=[c.as_dict() for c in candidates],
            revisions=sum(c.revisions for c in candidates),
            stages=stages,
            deadline_s=deadline_s,
            latency_s=closed.latency_s,
            deadline_met=closed.deadline_met,
            error=None if status == "ok" or run is None else run.last_problem,
            local_s=run.local_s if run is not None else 0.0,
            degraded=degraded,
            quality_mode=quality_mode,
        )


def _failed(
    request_id: str,
    failure: _Failure,
    stages: list[StageReport],
    deadline_s: float,
    closed: Closed,
    candidates: list[Candidate],
) -> Text2SqlResult:
    return Text2SqlResult(
        id=request_id,
        status="failed",
        sql=None,
        columns=[],
        rows=[],
        row_count=0,
        truncated=False,
        candidates=[c.as_dict() for c in candidates],
        revisions=sum(c.revisions for c in candidates),
        stages=stages,
        deadline_s=deadline_s,
        latency_s=closed.latency_s,
        deadline_met=closed.deadline_met,
        error=failure.message,
        failed_stage=failure.stage,
        http_status=failure.status if failure.status >= 500 else 502,
    )


class _Run:
    """The state of one question's run."""

    def __init__(
        self,
        pipe: Text2SqlPipeline,
        runner: StageRunner,
        db: Database,
        question: str,
        evidence: str,
        schema: str,
        stages: list[StageReport],
        on_event: EventFn | None,
        degrader: Degrader,
        plan: QuestionPlan,
    ) -> None:
        self.p = pipe
        self.cfg = pipe.cfg
        self.runner = runner
        self.db = db
        self.question = question
        self.evidence = evidence
        self.schema = schema
        self.stages = stages
        self.on_event = on_event
        self.candidates: list[Candidate] = []
        self.last_problem: str | None = None
        self.local_s = 0.0
        self.system = pipe.prompts.render("system", dialect=db.dialect)
        self.degrader = degrader
        self.full = self.knobs = degrader.full
        self.plan = plan
        self.cursor = TemplateCursor(plan.template)
        self.expected = {p.kind: p.output_tokens for p in reversed(plan.template.phases)}
        self.input_scale = pipe.input_scale(db.db_id)
        self.shape: list[tuple[str, list[tuple[int, int]]]] = []  # each stage: kind, (tokens in, out) per call
        self.prompt_sizes: list[tuple[int, int]] = []  # per call the worker counted: (estimated, counted) prompt
        self.evaluated = False
        self.candidates_fixed: int | None = None
        self.revisions_done = 0
        self.evaluate_fixed: bool | None = None
        self.revisions_capped = False  # the revision cap stopped a round a candidate needed
        self.why: dict[str, tuple[str, Decision, float]] = {}  # step -> (boundary, decision, predicted full)

    def decide(self, at: str) -> None:
        """Re-decide the knobs still open at a stage boundary (``at``: "arrival" or the stage just finished).

        ``full`` mode keeps the configured knobs and asks for no prediction."""
        if self.degrader.mode == "full":
            return
        options = self.degrader.options(
            candidates_fixed=self.candidates_fixed,
            revisions_done=self.revisions_done,
            evaluate_fixed=self.evaluate_fixed,
        )
        predict = self.runner.remaining_predictor()
        phase, rounds = self.cursor.phase, self.cursor.rounds
        predicted: dict[Knobs, float] = {}

        def duration(k: Knobs) -> float:
            v = predicted.get(k)
            if v is None:
                v = predicted[k] = predict(self.plan.at(k, phase=phase, rounds_done=rounds))
            return v

        decision = self.degrader.choose(options, duration, self.runner.remaining())
        before, self.knobs = self.knobs, decision.knobs
        fullest = duration(options[0])
        for step, _ in degraded_by_step(self.full, decision.knobs):
            if step not in self.why or _knob(before, step) != _knob(decision.knobs, step):
                self.why[step] = (at, decision, fullest)  # turned (further) down here: this decision is why

    def used(self) -> Knobs:
        """The knobs as they ended: what was spent where it was, the decided ones elsewhere. A revision cap
        counts only when it stopped a revision a candidate still needed (one that needed none lost nothing)."""
        k = self.knobs
        cands = self.candidates_fixed if self.candidates_fixed is not None else k.candidates
        ev = self.evaluate_fixed if self.evaluate_fixed is not None else k.evaluate
        return Knobs(cands, k.max_revisions if self.revisions_capped else self.full.max_revisions, ev)

    def degradations(self) -> list[Degradation]:
        """What the final knobs skipped relative to full quality, each with the decision that skipped it."""
        out = []
        for step, words in degraded_by_step(self.full, self.used()):
            why = self.why.get(step)
            if why is None:  # not turned down by a decision (cannot happen; never fail the answer for it)
                continue
            at, d, fullest = why
            out.append(
                Degradation(
                    step=step,
                    detail=words,
                    at=at,
                    reason="quality mode fast" if self.degrader.mode == "fast" else "predicted to miss the deadline",
                    predicted_full_s=fullest,
                    predicted_s=d.predicted_s,
                    time_left_s=d.time_left_s,
                )
            )
        return out

    def past_deadline(self) -> bool:
        return self.runner.remaining() < 0

    async def stage(self, kind: str, prompts: list[str]) -> list[str]:
        """Run one stage of ``len(prompts)`` parallel calls; returns their output texts."""
        self.cursor.enter(kind)
        max_tokens = self.cfg.max_tokens[kind]
        # Sized as the question's plan predicts it (the database's earlier questions, else the prior); a plan made
        # before the model was observed guessed its outputs: sized by what it has been seen to write since.
        expected = self.expected.get(kind, max_tokens)
        if not self.plan.observed:
            expected = self.p.outputs.expected(kind, max_tokens) or expected
        out_tokens = min(max_tokens, expected)
        scale = self.input_scale
        calls = []
        estimates = []
        for text in prompts:
            messages = ({"role": "system", "content": self.system}, {"role": "user", "content": text})
            est = message_tokens(messages)
            estimates.append(est)
            n_in = max(1, round(est * scale))
            calls.append(StageCall(messages, n_in, out_tokens, max_tokens, temperature=0.0))
        results = await self.runner.run_stage(kind, calls)
        sizes = []
        for c, r, est in zip(calls, results, estimates, strict=True):
            if r.prompt_tokens:
                self.prompt_sizes.append((est, r.prompt_tokens))
            n_out = r.completion_tokens if r.completion_tokens is not None else text_tokens(r.text or "")
            if r.error is None:
                self.p.outputs.add(kind, n_out, c.max_tokens)
            sizes.append((r.prompt_tokens or c.input_tokens, n_out))
        self.shape.append((kind, sizes))
        if kind in (UNIT_TEST, EVALUATE):
            self.evaluated = True
        texts: list[str] = []
        failure: StageCallError | None = None
        for r in results:
            self.stages.append(
                StageReport(kind, r.worker, r.queued_s, r.run_s, None if r.error is None else str(r.error))
            )
            if r.error is not None:
                failure = failure or r.error
                texts.append("")
            else:
                texts.append(r.text or "")
        if self.on_event is not None:
            await self.on_event(
                {"event": "stage", "kind": kind, "calls": [s.as_dict() for s in self.stages[-len(results) :]]}
            )
        if failure is not None:
            raise _StageFailed(kind, failure)
        return texts

    async def execute_all(self, cands: list[Candidate], texts: list[str]) -> None:
        """Execute a stage's candidates concurrently; their wall time counts once towards ``local_s``."""
        t = time.perf_counter()
        try:
            await asyncio.gather(*(self.execute(c, x) for c, x in zip(cands, texts, strict=True)))
        finally:
            self.local_s += time.perf_counter() - t

    async def execute(self, cand: Candidate, text: str) -> None:
        """Extract, check and run a candidate's SQL; record the problem (if any) for a revision."""
        prev_sql, prev_problem = cand.sql, cand.problem
        sql = extract_sql(text)
        if sql is None:
            cand.sql, cand.result, cand.problem = None, None, "The answer contained no SQL query."
            return
        cand.sql = sql
        try:
            res = await self.db.execute(sql)  # checks the statement (sqlsafe) before it runs
        except SqlRejected as exc:
            cand.result, cand.problem = None, _refusal(exc)
            return
        except QueryFailed as exc:
            cand.result, cand.problem = None, f"Executing it failed: {exc}"
            return
        if res.row_count == 0:
            # An empty result is suspicious and asked to be revised once; if the revision gives the same
            # query back, the model stands by it and the empty result is the answer (some questions have
            # one), instead of spending every remaining revision round on it.
            confirmed = (
                prev_problem == _EMPTY and prev_sql is not None and normalise_sql(prev_sql) == normalise_sql(sql)
            )
            cand.result, cand.problem = res, None if confirmed else _EMPTY
            return
        cand.result, cand.problem = res, None

    async def go(self) -> tuple[str, Candidate | None]:
        q, ev = self.question, self.evidence
        render = self.p.prompts.render
        self.decide("arrival")
        # 1. keywords
        (kw_text,) = await self.stage(KEYWORDS, [render("extract_keywords", question=q, evidence=ev)])
        keywords = extract_list(kw_text)
        self.decide(KEYWORDS)
        # 2. schema linking
        (link_text,) = await self.stage(
            IR,
            [render("schema_linking", question=q, evidence=ev, keywords=json.dumps(keywords), schema=self.schema)],
        )
        linked = ", ".join(extract_list(link_text)) or "(all)"
        self.decide(IR)
        # 3. candidates
        n = self.candidates_fixed = self.knobs.candidates
        self.candidates = [Candidate(i, STRATEGIES[i % len(STRATEGIES)][0]) for i in range(n)]
        texts = await self.stage(
            CANDIDATE,
            [
                render(
                    "candidate",
                    index=c.index,
                    strategy=c.strategy,
                    strategy_text=STRATEGIES[c.index % len(STRATEGIES)][1],
                    question=q,
                    evidence=ev,
                    linked=linked,
                    schema=self.schema,
                    dialect=self.db.dialect,
                )
                for c in self.candidates
            ],
        )
        await self.execute_all(self.candidates, texts)
        self.decide(CANDIDATE)
        # 4. revisions, one stage per round, in parallel across candidates, up to the cap in force
        while True:
            todo = [c for c in self.candidates if not c.valid]
            if not todo or self.past_deadline():
                break
            if self.revisions_done >= self.knobs.max_revisions:
                self.revisions_capped = self.knobs.max_revisions < self.full.max_revisions
                break
            texts = await self.stage(
                REVISE,
                [
                    render(
                        "revise",
                        index=c.index,
                        question=q,
                        evidence=ev,
                        schema=self.schema,
                        sql=c.sql or "(none)",
                        problem=c.problem or "",
                        dialect=self.db.dialect,
                    )
                    for c in todo
                ],
            )
            for c in todo:
                c.revisions += 1
            self.revisions_done += 1
            await self.execute_all(todo, texts)
            self.decide(REVISE)
        valid = [c for c in self.candidates if c.valid]
        problems = [c.problem for c in self.candidates if c.problem]
        self.last_problem = problems[-1] if problems else None
        if not valid:
            return ("deadline_exceeded" if self.past_deadline() else "no_valid_sql"), None
        # 5-6. unit tests and evaluation (skipped past the deadline, or when the knobs say so)
        self.evaluate_fixed = self.knobs.evaluate and n >= 2
        if self.evaluate_fixed and not self.past_deadline():
            (tests_text,) = await self.stage(
                UNIT_TEST, [render("unit_tests", question=q, evidence=ev, schema=self.schema, n=self.cfg.unit_tests)]
            )
            verdicts = await self.stage(
                EVALUATE,
                [
                    render(
                        "evaluate",
                        index=c.index,
                        question=q,
                        evidence=ev,
                        unit_tests=tests_text.strip() or "(none)",
                        sql=c.sql or "",
                        row_count=c.result.row_count if c.result else 0,
                        preview=_preview(c.result, self.cfg.preview_rows) if c.result else "",
                    )
                    for c in valid
                ],
            )
            for c, v in zip(valid, verdicts, strict=True):
                c.verdict = extract_verdict(v)
        t = time.perf_counter()
        chosen = select(valid)
        self.local_s += time.perf_counter() - t
        return "ok", chosen


__all__ = [
    "DEGRADED_STEPS",
    "STRATEGIES",
    "Candidate",
    "Degradation",
    "EventFn",
    "PipelineConfig",
    "Prompts",
    "StageReport",
    "Text2SqlPipeline",
    "Text2SqlResult",
    "degraded_by_step",
    "results_match",
    "select",
]
