"""The agentic Text-to-SQL pipeline (CHESS / CHASE-SQL shape), run stage by stage through the live gateway.

    extract_keywords -> schema linking (information_retriever) -> N candidates in parallel
    (generate_candidate, one strategy each) -> execute each; an error, an unparseable answer or an empty
    result triggers a ``revise`` call with the problem, up to ``max_revisions`` rounds (candidates that
    need it revise in parallel, one stage per round) -> unit tests (generate_unit_test) -> one evaluation
    per executable candidate in parallel (evaluate) -> selection: evaluator verdicts first, ties broken
    by how many candidates agree on the execution result, then by candidate order.

Every stage is announced to the gateway with its calls' token counts (``Gateway.run_stage``), so stage
budgets and urgency follow the CHESS template exactly as the simulator's ``chess-bird`` workload models
it. SQL is extracted from model output (``extract``), checked and parsed with sqlglot (``sqlsafe``)
and executed read-only with a timeout and row and byte caps (``db``).

Deadlines: no new revision round starts after the deadline; past the deadline with an executable
candidate, unit tests and evaluation are skipped and the best candidate by agreement is returned
(``deadline_met`` false); past it without one, the status is ``deadline_exceeded``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from string import Template
from typing import Any

from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.workflow import CANDIDATE, EVALUATE, IR, KEYWORDS, REVISE, UNIT_TEST, CallSpec, OnlineWorkflow
from gateway.errors import CallFailed
from gateway.live.service import CallRecord, CallRequest, Gateway
from gateway.live.tenants import Tenant
from gateway.live.transport import CallResult
from gateway.text2sql.answers import normalise_sql
from gateway.text2sql.db import Database, DatabaseUnavailable, QueryFailed, QueryResult, serialize_schema
from gateway.text2sql.evaluate import results_match
from gateway.text2sql.extract import extract_list, extract_sql, extract_verdict
from gateway.text2sql.sqlsafe import SqlRejected

CHARS_PER_TOKEN = 4
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


@dataclass(frozen=True)
class PipelineConfig:
    """Stage counts and output budgets (tokens) of the pipeline."""

    candidates: int = 2
    max_revisions: int = 10
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


class Prompts:
    """The prompt templates (``gateway/text2sql/prompts/*.txt``, ``$name`` placeholders)."""

    NAMES = ("system", "extract_keywords", "schema_linking", "candidate", "revise", "unit_tests", "evaluate")

    def __init__(self) -> None:
        base = resources.files("gateway.text2sql") / "prompts"
        self.templates = {n: Template((base / f"{n}.txt").read_text(encoding="utf-8")) for n in self.NAMES}

    def render(self, name: str, **values: object) -> str:
        """Fill a template; every placeholder must be given (a missing one is a bug: KeyError)."""
        return self.templates[name].substitute({k: str(v) for k, v in values.items()})


@dataclass
class Candidate:
    """One SQL candidate through its revisions."""

    index: int
    strategy: str
    sql: str | None = None
    result: QueryResult | None = None
    problem: str | None = None
    revisions: int = 0
    verdict: bool | None = None

    @property
    def valid(self) -> bool:
        """Executed without error, and returned rows (or an empty result the model confirmed)."""
        return self.result is not None and self.problem is None

    def as_dict(self) -> dict[str, Any]:
        """The response view."""
        return {
            "index": self.index,
            "strategy": self.strategy,
            "sql": self.sql,
            "valid": self.valid,
            "row_count": None if self.result is None else self.result.row_count,
            "problem": self.problem,
            "revisions": self.revisions,
            "verdict": self.verdict,
        }


@dataclass
class StageReport:
    """One call of one stage, for the response."""

    kind: str
    worker: str | None
    queued_s: float
    run_s: float
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The response view."""
        d: dict[str, Any] = {
            "kind": self.kind,
            "worker": self.worker,
            "queued_s": round(self.queued_s, 4),
            "run_s": round(self.run_s, 4),
        }
        if self.error:
            d["error"] = self.error
        return d


@dataclass
class Text2SqlResult:
    """What ``/v1/text2sql`` returns."""

    id: str
    status: str  # ok | no_valid_sql | deadline_exceeded | failed
    sql: str | None
    columns: list[str]
    rows: list[list[Any]]
    row_count: int
    truncated: bool
    candidates: list[dict[str, Any]]
    revisions: int
    stages: list[StageReport]
    deadline_s: float
    latency_s: float
    deadline_met: bool
    error: str | None = None
    failed_stage: str | None = None
    http_status: int = 200
    local_s: float = 0.0
    """Wall time of the work outside LLM calls: schema, SQL extraction, checks, execution, selection (on a
    busy event loop it includes waiting for the loop)."""

    def as_dict(self) -> dict[str, Any]:
        """The JSON body."""
        d = {
            "id": self.id,
            "status": self.status,
            "sql": self.sql,
            "columns": self.columns,
            "rows": self.rows,
            "row_count": self.row_count,
            "truncated": self.truncated,
            "candidates": self.candidates,
            "revisions": self.revisions,
            "stages": [s.as_dict() for s in self.stages],
            "deadline_s": self.deadline_s,
            "latency_s": round(self.latency_s, 4),
            "deadline_met": self.deadline_met,
            "local_s": round(self.local_s, 6),
        }
        if self.error is not None:
            d["error"] = self.error
            d["failed_stage"] = self.failed_stage
        return d


class _StageFailed(Exception):
    def __init__(self, stage: str, err: CallFailed) -> None:
        super().__init__(f"stage {stage} failed: {err}")
        self.stage = stage
        self.err = err


def _tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


def _preview(result: QueryResult, n: int) -> str:
    lines = [" | ".join(result.columns)]
    for row in result.rows[:n]:
        lines.append(" | ".join("NULL" if v is None else str(v)[:60] for v in row))
    return "\n".join(lines)


def _result_key(result: QueryResult) -> tuple[tuple[str, ...], ...]:
    """An order-insensitive, hashable form of a result set (for agreement between candidates)."""
    rows = [tuple(repr(round(v, 6)) if isinstance(v, float) else repr(v) for v in row) for row in result.rows]
    return tuple(sorted(rows))


class Text2SqlPipeline:
    """Runs one question through the pipeline on the live gateway.

    Args:
        gateway: the running gateway (scheduling and workers).
        config: stage counts and output budgets.
        prompts: the prompt templates.
        served_model: unused by workers (the pool fills ``model``); kept for request logs.
    """

    def __init__(self, gateway: Gateway, config: PipelineConfig | None = None, prompts: Prompts | None = None) -> None:
        self.gw = gateway
        self.cfg = config or PipelineConfig()
        self.prompts = prompts or Prompts()

    async def answer(
        self,
        tenant: Tenant,
        db: Database,
        question: str,
        evidence: str,
        deadline_s: float,
        *,
        request_id: str,
        on_event: EventFn | None = None,
    ) -> Text2SqlResult:
        """Answer one question; never raises for model or SQL problems (they are statuses)."""
        t0 = time.monotonic()
        stages: list[StageReport] = []
        # The workflow (and its deadline clock) opens at arrival: fetching the schema is part of the answer.
        wf = self.gw.open_workflow(tenant, deadline_s, CHESS_TEMPLATE)
        run: _Run | None = None
        failed = True
        try:
            try:
                schema = await db.schema()
            except DatabaseUnavailable as exc:
                return self._failed(request_id, "schema", str(exc), 503, stages, deadline_s, t0)
            schema_text = serialize_schema(schema, max_chars=self.cfg.schema_max_chars)
            run = _Run(self, wf, db, question, evidence or "none", schema_text, stages, on_event)
            run.local_s = time.monotonic() - t0
            result = await run.go()
            failed = False
        except _StageFailed as exc:
            return self._failed(
                request_id, exc.stage, str(exc.err), exc.err.status, stages, deadline_s, t0, candidates=_cands(run)
            )
        except DatabaseUnavailable as exc:
            return self._failed(request_id, "execute", str(exc), 503, stages, deadline_s, t0, candidates=_cands(run))
        finally:
            latency = self.gw.close_workflow(wf, tenant, failed=failed)
        status, chosen = result
        res = chosen.result if chosen is not None else None
        met = status == "ok" and latency <= deadline_s
        return Text2SqlResult(
            id=request_id,
            status=status,
            sql=chosen.sql if chosen is not None else None,
            columns=res.columns if res is not None else [],
            rows=res.rows if res is not None else [],
            row_count=res.row_count if res is not None else 0,
            truncated=res.truncated if res is not None else False,
            candidates=[c.as_dict() for c in run.candidates],
            revisions=sum(c.revisions for c in run.candidates),
            stages=stages,
            deadline_s=deadline_s,
            latency_s=latency,
            deadline_met=met,
            error=None if status == "ok" else run.last_problem,
            local_s=run.local_s,
        )

    def _failed(
        self,
        request_id: str,
        stage: str,
        message: str,
        status: int,
        stages: list[StageReport],
        deadline_s: float,
        t0: float,
        *,
        candidates: list[Candidate] | None = None,
    ) -> Text2SqlResult:
        return Text2SqlResult(
            id=request_id,
            status="failed",
            sql=None,
            columns=[],
            rows=[],
            row_count=0,
            truncated=False,
            candidates=[c.as_dict() for c in candidates or []],
            revisions=sum(c.revisions for c in candidates or []),
            stages=stages,
            deadline_s=deadline_s,
            latency_s=time.monotonic() - t0,
            deadline_met=False,
            error=message,
            failed_stage=stage,
            http_status=status if status >= 500 else 502,
        )


class _Run:
    """The state of one question's run."""

    def __init__(
        self,
        pipe: Text2SqlPipeline,
        wf: OnlineWorkflow,
        db: Database,
        question: str,
        evidence: str,
        schema: str,
        stages: list[StageReport],
        on_event: EventFn | None,
    ) -> None:
        self.p = pipe
        self.gw = pipe.gw
        self.cfg = pipe.cfg
        self.wf = wf
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

    def past_deadline(self) -> bool:
        return self.gw.clock() > self.wf.deadline

    async def stage(self, kind: str, prompts: list[str]) -> list[str]:
        """Run one stage of ``len(prompts)`` parallel calls; returns their output texts."""
        max_tokens = self.cfg.max_tokens[kind]
        expected = {p.kind: p.output_tokens for p in CHESS_TEMPLATE.phases}
        out_tokens = min(max_tokens, expected.get(kind, max_tokens))
        calls = []
        for text in prompts:
            messages = [{"role": "system", "content": self.system}, {"role": "user", "content": text}]
            body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
            spec = CallSpec(kind, _tokens(self.system) + _tokens(text) + 8, out_tokens)
            calls.append((spec, CallRequest("/v1/chat/completions", body)))
        results = await self.gw.run_stage(self.wf, kind, calls)
        texts: list[str] = []
        failure: CallFailed | None = None
        for rec, outcome in results:
            self.stages.append(_report(rec, outcome))
            if isinstance(outcome, CallFailed):
                failure = failure or outcome
                texts.append("")
            else:
                texts.append(outcome.text() or "")
        if self.on_event is not None:
            await self.on_event(
                {"event": "stage", "kind": kind, "calls": [s.as_dict() for s in self.stages[-len(results) :]]}
            )
        if failure is not None:
            raise _StageFailed(kind, failure)
        return texts

    async def execute_all(self, cands: list[Candidate], texts: list[str]) -> None:
        """Execute a stage's candidates concurrently; their wall time counts once towards ``local_s``."""
        t = time.monotonic()
        try:
            await asyncio.gather(*(self.execute(c, x) for c, x in zip(cands, texts, strict=True)))
        finally:
            self.local_s += time.monotonic() - t

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
            cand.result, cand.problem = None, f"The query was refused: {exc}"
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
        # 1. keywords
        (kw_text,) = await self.stage(KEYWORDS, [render("extract_keywords", question=q, evidence=ev)])
        keywords = extract_list(kw_text)
        # 2. schema linking
        (link_text,) = await self.stage(
            IR,
            [render("schema_linking", question=q, evidence=ev, keywords=json.dumps(keywords), schema=self.schema)],
        )
        linked = ", ".join(extract_list(link_text)) or "(all)"
        # 3. candidates
        n = self.cfg.candidates
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
        # 4. revisions, one stage per round, in parallel across candidates
        for _ in range(self.cfg.max_revisions):
            todo = [c for c in self.candidates if not c.valid]
            if not todo or self.past_deadline():
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
            await self.execute_all(todo, texts)
        valid = [c for c in self.candidates if c.valid]
        problems = [c.problem for c in self.candidates if c.problem]
        self.last_problem = problems[-1] if problems else None
        if not valid:
            return ("deadline_exceeded" if self.past_deadline() else "no_valid_sql"), None
        # 5-6. unit tests and evaluation (skipped past the deadline)
        if not self.past_deadline():
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
        t = time.monotonic()
        chosen = select(valid)
        self.local_s += time.monotonic() - t
        return "ok", chosen


def select(valid: list[Candidate]) -> Candidate:
    """The chosen candidate: evaluator verdicts first, then agreement of execution results, then order."""
    groups: dict[tuple[tuple[str, ...], ...], int] = {}
    for c in valid:
        assert c.result is not None
        k = _result_key(c.result)
        groups[k] = groups.get(k, 0) + 1

    def rank(c: Candidate) -> tuple[int, int, int]:
        assert c.result is not None
        verdict = 1 if c.verdict is True else (0 if c.verdict is None else -1)
        return (-verdict, -groups[_result_key(c.result)], c.index)

    return min(valid, key=rank)


def _cands(run: _Run | None) -> list[Candidate] | None:
    return run.candidates if run is not None else None


def _report(rec: CallRecord, outcome: CallResult | CallFailed) -> StageReport:
    return StageReport(
        rec.kind, rec.worker, rec.queued_s, rec.run_s, str(outcome) if isinstance(outcome, CallFailed) else None
    )


__all__ = [
    "Candidate",
    "PipelineConfig",
    "Prompts",
    "StageReport",
    "Text2SqlPipeline",
    "Text2SqlResult",
    "results_match",
    "select",
]
