"""One question's run through the pipeline's stages (``QuestionRun``), degraded at every stage boundary."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gateway.core.degrade import Decision, Degrader, Knobs, QuestionPlan, degraded_steps
from gateway.core.tokens import message_tokens, text_tokens
from gateway.core.workflow import CANDIDATE, EVALUATE, IR, KEYWORDS, REVISE, UNIT_TEST, TemplateCursor
from gateway.text2sql.answers import normalise_sql
from gateway.text2sql.db import Database, DatabaseUnavailable, QueryFailed, QueryResult
from gateway.text2sql.extract import extract_list, extract_sql, extract_verdict
from gateway.text2sql.port import DEGRADED_STEPS, Closed, StageCall, StageRunner
from gateway.text2sql.prompt_templates import Prompts
from gateway.text2sql.result import Candidate, Degradation, StageReport, Text2SqlResult, select
from gateway.text2sql.sqlsafe import SqlRejected

if TYPE_CHECKING:
    from gateway.text2sql.pipeline import Text2SqlPipeline

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
TEMPLATES = dict(zip((KEYWORDS, IR, CANDIDATE, REVISE, UNIT_TEST, EVALUATE), Prompts.NAMES[1:], strict=True))
"""Each stage's prompt template (``Prompts`` name)."""
EventFn = Callable[[dict[str, Any]], Awaitable[None]]
"""Called with each event of a streamed answer (a stage's calls as they finish)."""
_KNOBS = dict(zip(DEGRADED_STEPS, ("candidates", "max_revisions", "evaluate"), strict=True))
"""The ``Knobs`` field each degraded step names."""


def degraded_by_step(full: Knobs, used: Knobs) -> list[tuple[str, str]]:
    """``(step, words)`` for each knob ``used`` turned down from ``full``, in ``DEGRADED_STEPS`` order."""
    out: list[tuple[str, str]] = []
    for step, knob in _KNOBS.items():
        words = degraded_steps(full, replace(full, **{knob: getattr(used, knob)}))
        if words:
            out.append((step, words[0]))
    return out


@dataclass(eq=False)
class Failure(Exception):
    """Why a run ended without an answer: the stage, the message and its HTTP status (a failed stage raises it)."""

    stage: str
    message: str
    status: int


def _preview(result: QueryResult, n: int) -> str:
    rows = [" | ".join("NULL" if v is None else str(v)[:60] for v in row) for row in result.rows[:n]]
    return "\n".join([" | ".join(result.columns), *rows])


def _refusal(exc: SqlRejected) -> str:
    """The problem a model is told when its SQL was refused (the parser's own words too, when it has some)."""
    text = f"The query was refused: {exc}"
    return f"{text}. The parser said: {exc.detail}" if exc.detail else text


class QuestionRun:
    """The state of one question's run through the stages (``go``), made by ``Text2SqlPipeline.answer``."""

    def __init__(
        self,
        pipe: Text2SqlPipeline,
        runner: StageRunner,
        db: Database,
        values: dict[str, str],
        on_event: EventFn | None,
        degrader: Degrader,
        plan: QuestionPlan,
    ) -> None:
        """``values``: what every prompt of the question fills in (the schema added once read)."""
        self.p = pipe
        self.cfg = pipe.cfg
        self.runner = runner
        self.db = db
        self.values = values
        self.stages: list[StageReport] = []
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
        """Re-decide the knobs still open at a stage boundary (``at``: "arrival" or the stage just finished);
        ``full`` mode keeps the configured knobs."""
        if self.degrader.mode == "full":
            return
        options = self.plan.capped(  # (within a burst's cap, when one capped the question at admission)
            self.degrader.options(
                candidates_fixed=self.candidates_fixed,
                revisions_done=self.revisions_done,
                evaluate_fixed=self.evaluate_fixed,
            )
        )
        predict = self.runner.remaining_predictor()
        phase, rounds = self.cursor.phase, self.cursor.rounds

        @functools.cache
        def duration(k: Knobs) -> float:
            return predict(self.plan.at(k, phase=phase, rounds_done=rounds))

        decision = self.degrader.choose(options, duration, self.runner.remaining())
        before, self.knobs = self.knobs, decision.knobs
        fullest = duration(options[0])
        for step, _ in degraded_by_step(self.full, decision.knobs):
            if step not in self.why or getattr(before, _KNOBS[step]) != getattr(decision.knobs, _KNOBS[step]):
                self.why[step] = (at, decision, fullest)  # turned (further) down here: this decision is why

    def used(self) -> Knobs:
        """The knobs as they ended: what was spent where it was, the decided ones elsewhere (a revision cap counts
        only when it stopped a revision a candidate still needed)."""
        k = self.knobs
        cands = self.candidates_fixed if self.candidates_fixed is not None else k.candidates
        ev = self.evaluate_fixed if self.evaluate_fixed is not None else k.evaluate
        return Knobs(cands, k.max_revisions if self.revisions_capped else self.full.max_revisions, ev)

    def degradations(self) -> list[Degradation]:
        """What the final knobs skipped relative to full quality, each with the decision that skipped it."""
        reason = "quality mode fast" if self.degrader.mode == "fast" else "predicted to miss the deadline"
        cap = self.plan.ceiling
        out = []
        for step, words in degraded_by_step(self.full, self.used()):
            if step in self.why:  # always (only a decision turns a knob down); never fail the answer for it
                at, d, fullest = self.why[step]
                why = reason
                if cap is not None and getattr(cap, _KNOBS[step]) < getattr(self.full, _KNOBS[step]):
                    why = "capped in a burst (the arriving work exceeded admission.burst_capacity)"
                out.append(Degradation(step, words, at, why, fullest, d.predicted_s, d.time_left_s))
        return out

    def prompt(self, kind: str, **values: object) -> str:
        """The prompt of a ``kind`` stage: the question's own values, then ``values``."""
        return self.p.prompts.render(TEMPLATES[kind], **self.values, **values)

    def past_deadline(self) -> bool:
        return self.runner.remaining() < 0

    async def stage(self, kind: str, prompts: list[str]) -> list[str]:
        """Run one stage of ``len(prompts)`` parallel calls; returns their output texts."""
        self.cursor.enter(kind)
        max_tokens = self.cfg.max_tokens[kind]
        # Sized as the question's plan predicts it; a plan made before the model was observed guessed its outputs:
        # sized by what it has been seen to write since.
        expected = self.expected.get(kind, max_tokens)
        if not self.plan.observed:
            expected = self.p.outputs.expected(kind, max_tokens) or expected
        out_tokens = min(max_tokens, expected)
        messages = [({"role": "system", "content": self.system}, {"role": "user", "content": t}) for t in prompts]
        estimates = [message_tokens(m) for m in messages]
        calls = [
            StageCall(m, max(1, round(est * self.input_scale)), out_tokens, max_tokens, temperature=0.0)
            for m, est in zip(messages, estimates, strict=True)
        ]
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
        self.evaluated = self.evaluated or kind in (UNIT_TEST, EVALUATE)
        reports = [
            StageReport(kind, r.worker, r.queued_s, r.run_s, None if r.error is None else str(r.error)) for r in results
        ]
        self.stages.extend(reports)
        if self.on_event is not None:
            await self.on_event({"event": "stage", "kind": kind, "calls": [s.as_dict() for s in reports]})
        failure = next((r.error for r in results if r.error is not None), None)
        if failure is not None:
            raise Failure(kind, str(failure), failure.status)
        return [r.text or "" for r in results]

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
        cand.sql = extract_sql(text)
        if cand.sql is None:
            cand.result, cand.problem = None, "The answer contained no SQL query."
            return
        try:
            res = await self.db.execute(cand.sql)  # checks the statement (sqlsafe) before it runs
        except (SqlRejected, QueryFailed) as exc:
            cand.result = None
            cand.problem = _refusal(exc) if isinstance(exc, SqlRejected) else f"Executing it failed: {exc}"
            return
        # An empty result is suspicious and asked to be revised once; if the revision gives the same query back,
        # the model stands by it and the empty result is the answer (some questions have one), instead of
        # spending every remaining revision round on it.
        confirmed = (
            prev_problem == _EMPTY and prev_sql is not None and normalise_sql(prev_sql) == normalise_sql(cand.sql)
        )
        cand.result, cand.problem = res, _EMPTY if res.row_count == 0 and not confirmed else None

    async def outcome(self) -> tuple[str, Candidate | None] | Failure:
        """``go``, a stage or a database that failed as the ``Failure``."""
        try:
            return await self.go()
        except Failure as exc:
            return exc
        except DatabaseUnavailable as exc:
            return Failure("execute", str(exc), exc.status)

    async def go(self) -> tuple[str, Candidate | None]:
        """Run the stages; the status (ok, no_valid_sql, deadline_exceeded) and the chosen candidate."""
        self.decide("arrival")
        (keywords,) = await self.stage(KEYWORDS, [self.prompt(KEYWORDS)])
        self.decide(KEYWORDS)
        (linked,) = await self.stage(IR, [self.prompt(IR, keywords=json.dumps(extract_list(keywords)))])
        self.decide(IR)
        columns = ", ".join(extract_list(linked)) or "(all)"
        n = self.candidates_fixed = self.knobs.candidates
        strategies = [STRATEGIES[i % len(STRATEGIES)] for i in range(n)]
        self.candidates = [Candidate(i, name) for i, (name, _) in enumerate(strategies)]
        prompts = [
            self.prompt(CANDIDATE, index=i, strategy=name, strategy_text=text, linked=columns)
            for i, (name, text) in enumerate(strategies)
        ]
        await self.execute_all(self.candidates, await self.stage(CANDIDATE, prompts))
        self.decide(CANDIDATE)
        await self._revisions()
        valid = [c for c in self.candidates if c.valid]
        problems = [c.problem for c in self.candidates if c.problem]
        self.last_problem = problems[-1] if problems else None
        if not valid:
            return ("deadline_exceeded" if self.past_deadline() else "no_valid_sql"), None
        # Unit tests and evaluation: skipped past the deadline, or when the knobs say so.
        self.evaluate_fixed = self.knobs.evaluate and n >= 2
        if self.evaluate_fixed and not self.past_deadline():
            await self._evaluate(valid)
        t = time.perf_counter()
        chosen = select(valid)
        self.local_s += time.perf_counter() - t
        return "ok", chosen

    async def _revisions(self) -> None:
        """Stage 4: revise rounds, one stage per round, in parallel across the candidates that need one, up to
        the cap in force (none past the deadline)."""
        while True:
            todo = [c for c in self.candidates if not c.valid]
            if not todo or self.past_deadline():
                return
            if self.revisions_done >= self.knobs.max_revisions:
                self.revisions_capped = self.knobs.max_revisions < self.full.max_revisions
                return
            prompts = [self.prompt(REVISE, index=c.index, sql=c.sql or "(none)", problem=c.problem or "") for c in todo]
            texts = await self.stage(REVISE, prompts)
            for c in todo:
                c.revisions += 1
            self.revisions_done += 1
            await self.execute_all(todo, texts)
            self.decide(REVISE)

    async def _evaluate(self, valid: list[Candidate]) -> None:
        """Stages 5-6: unit tests, then one evaluation per valid candidate (its verdict)."""
        (tests_text,) = await self.stage(UNIT_TEST, [self.prompt(UNIT_TEST, n=self.cfg.unit_tests)])
        prompts = [
            self.prompt(
                EVALUATE,
                index=c.index,
                unit_tests=tests_text.strip() or "(none)",
                sql=c.sql or "",
                row_count=c.result.row_count if c.result else 0,
                preview=_preview(c.result, self.cfg.preview_rows) if c.result else "",
            )
            for c in valid
        ]
        verdicts = await self.stage(EVALUATE, prompts)
        for c, v in zip(valid, verdicts, strict=True):
            c.verdict = extract_verdict(v)

    def result(
        self, request_id: str, outcome: tuple[str, Candidate | None] | Failure, deadline_s: float, closed: Closed
    ) -> Text2SqlResult:
        """The answer to the question: the run's ``outcome`` (a status and the chosen candidate, or the failure),
        what it spent and the runner's verdict (``closed``)."""
        failure = outcome if isinstance(outcome, Failure) else None
        status, chosen = ("failed", None) if isinstance(outcome, Failure) else outcome
        res = chosen.result if chosen is not None and chosen.result is not None else QueryResult([], [], 0, False, 0)
        error = failure.message if failure is not None else None if status == "ok" else self.last_problem
        return Text2SqlResult(
            id=request_id,
            status=status,
            sql=chosen.sql if chosen is not None else None,
            columns=res.columns,
            rows=res.rows,
            row_count=res.row_count,
            truncated=res.truncated,
            candidates=[c.as_dict() for c in self.candidates],
            revisions=sum(c.revisions for c in self.candidates),
            stages=self.stages,
            deadline_s=deadline_s,
            latency_s=closed.latency_s,
            deadline_met=closed.deadline_met,
            error=error,
            failed_stage=failure.stage if failure is not None else None,
            http_status=200 if failure is None else failure.status if failure.status >= 500 else 502,
            local_s=self.local_s if failure is None else 0.0,
            degraded=self.degradations(),
            quality_mode=self.degrader.mode,
        )
