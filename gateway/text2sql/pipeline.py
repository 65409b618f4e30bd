"""The agentic Text-to-SQL pipeline (CHESS / CHASE-SQL shape), run stage by stage through a ``StageRunner``
(stages, prediction, degradation and deadlines: docs/text2sql.md). It decides which stages run, never how
calls are scheduled or sent; everything about the deadline comes from the runner's clock."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gateway.config.quality import QUALITY
from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.degrade import QUALITY_MODES, SKIPPABLE, Degrader, Knobs, QualityMode, QualityModel, QuestionPlan
from gateway.core.shapes import OutputWindow, QuestionSample, ShapeWindow, fit
from gateway.core.tokens import message_tokens
from gateway.core.workflow import CANDIDATE, EVALUATE, IR, KEYWORDS, REVISE, UNIT_TEST, PhaseSpec, WorkflowTemplate
from gateway.text2sql.db import Database, DatabaseUnavailable, SchemaInfo, serialize_schema
from gateway.text2sql.port import StageRunner
from gateway.text2sql.prompt_templates import Prompts
from gateway.text2sql.result import Candidate, Text2SqlResult
from gateway.text2sql.run import STRATEGIES, TEMPLATES, EventFn, Failure, QuestionRun

_CHESS_OUTPUT = {p.kind: p.output_tokens for p in CHESS_TEMPLATE.phases}
DB_WINDOW = 100
"""Answered questions per database its figures are fitted over (the most recent)."""
_POOLED_WINDOW = 300  # answered questions, over every database, the model's revise rounds are fitted over
_OUTPUT_WINDOW = 500  # calls per stage kind, over every database, the model's output lengths are fitted over
PRIOR_REVISE_ROUNDS = 1.0
"""Revise rounds a question is predicted to take before the model's own figure (``_POOLED_WINDOW``) is known."""
_TYPICAL = {  # a question's parts, to render the prior's prompts at a database's schema size
    "index": 0,
    "strategy": STRATEGIES[0][0],
    "strategy_text": STRATEGIES[0][1],
    "evidence": "none",
    "row_count": 3,
    "question": "Which customers placed more than three orders in 2023, and what did each of them spend in total?",
    "keywords": json.dumps(["customers", "orders", "2023", "total spent", "order count"]),
    "linked": "customers.customer_id, customers.name, orders.customer_id, orders.order_date, orders.total",
    "sql": "SELECT c.name, SUM(o.total) FROM customers AS c JOIN orders AS o ON o.customer_id = c.customer_id "
    "WHERE o.order_date >= '2023-01-01' GROUP BY c.customer_id HAVING COUNT(*) > 3",
    "problem": "Executing it failed: no such column: o.total",
    "unit_tests": "1. The result has one row per customer.\n2. Every total is positive.\n3. Only 2023 orders count.",
    "preview": "name | total\nAda | 120.5\nBo | 99.0\nCy | 87.25",
}


_STAGE_FIELDS = ("kind", "input_tokens", "output_tokens", "rounds", "width")
_MAX_TOKENS = {KEYWORDS: 96, IR: 256, CANDIDATE: 768, REVISE: 768, UNIT_TEST: 256, EVALUATE: 96}


@dataclass(frozen=True)
class PipelineConfig:
    """Stage counts and output budgets (tokens) of the pipeline: its full-quality knobs (``evaluate`` off, or a
    single candidate, skips unit tests and evaluation)."""

    candidates: int = 2
    max_revisions: int = 10
    evaluate: bool = True
    unit_tests: int = 3
    schema_max_chars: int = 24_000
    preview_rows: int = 5
    max_tokens: dict[str, int] = field(default_factory=_MAX_TOKENS.copy)

    @property
    def knobs(self) -> Knobs:
        """The full-quality knobs: evaluation only with two candidates or more."""
        return Knobs(self.candidates, self.max_revisions, self.evaluate and self.candidates >= 2)


class Text2SqlPipeline:
    """Runs questions through the pipeline; one instance serves every request (no per-run state). ``quality``:
    accuracy per knob setting, ranking an ``adaptive`` tenant's settings (default: ``gateway/config/quality.yaml``)."""

    def __init__(self, config: PipelineConfig, prompts: Prompts, quality: QualityModel | None = None) -> None:
        self.cfg = config
        self.prompts = prompts
        self.quality = quality if quality is not None else QUALITY
        self.degraders: dict[str, Degrader] = {
            mode: Degrader(mode, config.knobs, self.quality) for mode in QUALITY_MODES
        }
        self.shapes: dict[str, ShapeWindow] = {}  # per database: its recent answered questions
        self.pooled = ShapeWindow(_POOLED_WINDOW, SKIPPABLE)  # every database's: the model's revise rounds
        self.outputs = OutputWindow(_OUTPUT_WINDOW)  # every database's calls: the model's output lengths
        # per database: its schema as last introspected, serialised, and the prior's prompt tokens at it
        self._schemas: dict[str, tuple[SchemaInfo, str, dict[str, int]]] = {}

    def structure(self, inputs: dict[str, int] | None = None) -> WorkflowTemplate:
        """The pipeline's own stages at full quality before any answered question (``PRIOR_REVISE_ROUNDS``):
        outputs the model's (``OutputWindow``; before it was observed, the budget capped at CHESS's mean),
        inputs ``inputs[kind]`` (default: CHESS's)."""
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
        """Each stage's prompt tokens (estimated) for a typical question on a database of ``schema_text``."""
        system = {"role": "system", "content": self.prompts.render("system", dialect=dialect)}
        values = {**_TYPICAL, "schema": schema_text, "dialect": dialect, "n": self.cfg.unit_tests}
        return {
            kind: message_tokens((system, {"role": "user", "content": self.prompts.render(name, **values)}))
            for kind, name in TEMPLATES.items()
        }

    async def schema_text(self, db: Database) -> str:
        """``db``'s schema serialised for the prompts (kept, with the prior's prompt sizes at it, while
        ``Database.schema`` returns the same schema)."""
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
        """The prediction of the next question on ``db_id`` at quality ``mode``: fitted to the database's
        answered questions once it has ``MIN_QUESTIONS``, else the prior at its schema size; with the floor the
        mode may degrade to."""
        degrader = self.degrader(mode)
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
        quality = self.quality if mode == "adaptive" else None  # (a burst caps only a question that degrades)
        return QuestionPlan(template, degrader.full, floor, source, observed, quality=quality)

    async def plan(self, db: Database, mode: QualityMode = "full") -> QuestionPlan:
        """``plan_for`` with ``db``'s schema read first (once), so that its first question is predicted at its
        schema size (a database that cannot be read fails at its schema stage)."""
        with contextlib.suppress(DatabaseUnavailable):
            await self.schema_text(db)
        return self.plan_for(db.db_id, mode)

    def record(self, db_id: str, sample: QuestionSample) -> None:
        """One question answered with a valid SQL on ``db_id``: a sample of its database and of the model."""
        if db_id not in self.shapes:
            self.shapes[db_id] = ShapeWindow(DB_WINDOW, SKIPPABLE)
        self.shapes[db_id].add(sample)
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
                    {f: round(p.rounds, 3) if f == "rounds" else getattr(p, f) for f in _STAGE_FIELDS}
                    for p in plan.template.phases
                ],
            }
            if predict is not None:
                out[db_id]["predicted_s"] = round(predict(plan), 6)
        return out

    def degrader(self, mode: QualityMode) -> Degrader:
        """The ``Degrader`` of quality ``mode`` (``ValueError`` for an unknown one)."""
        degrader = self.degraders.get(mode)
        if degrader is None:
            raise ValueError(f"quality mode must be one of full, adaptive, fast, got {mode!r}")
        return degrader

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
        """Answer one question with ``runner`` (fresh, unopened; opened first, the schema read inside the
        deadline, closed exactly once, also on cancellation); model, SQL and database problems are statuses,
        never raised. ``plan``: the prediction admission made (default: ``plan_for`` now)."""
        if plan is None:
            plan = self.plan_for(db.db_id, quality_mode)
        started = time.perf_counter()
        values = {"question": question, "evidence": evidence or "none", "dialect": db.dialect}
        run = QuestionRun(self, runner, db, values, on_event, self.degrader(quality_mode), plan)
        runner.open(deadline_s, plan)
        outcome: tuple[str, Candidate | None] | Failure = Failure("open", "cancelled", 500)
        cancelled = False
        try:
            try:
                values["schema"] = await self.schema_text(db)
            except DatabaseUnavailable as exc:
                outcome = Failure("schema", str(exc), exc.status)
            else:
                run.local_s = time.perf_counter() - started
                outcome = await run.outcome()
        except asyncio.CancelledError:  # the caller gave up (the client went away): no further stage
            cancelled = True
            raise
        finally:
            ok = isinstance(outcome, tuple) and outcome[0] == "ok"
            closed = runner.close(valid=ok, failed=isinstance(outcome, Failure), cancelled=cancelled)
        if ok:
            # Only a valid answer is a sample: one the model could not answer ran every round it was allowed.
            self.record(db.db_id, QuestionSample.of(run.shape, evaluated=run.evaluated, prompt_sizes=run.prompt_sizes))
        return run.result(request_id, outcome, deadline_s, closed)
