"""What one question's run produces, up to ``Text2SqlResult`` (the body of ``POST /v1/text2sql``)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gateway.text2sql.db import QueryResult

_CANDIDATE_KEYS = ("index", "strategy", "sql", "valid", "row_count", "problem", "revisions", "verdict")


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
        derived = {"valid": self.valid, "row_count": None if self.result is None else self.result.row_count}
        return {k: derived[k] if k in derived else getattr(self, k) for k in _CANDIDATE_KEYS}


@dataclass
class StageReport:
    """One call of one stage, for the response."""

    kind: str
    worker: str | None
    queued_s: float
    run_s: float
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The response view (``error`` only when there is one)."""
        d = asdict(self)
        d["queued_s"], d["run_s"] = round(self.queued_s, 4), round(self.run_s, 4)
        if not self.error:
            del d["error"]
        return d


@dataclass(frozen=True)
class Degradation:
    """One knob turned down from full quality (``step``), and the decision that did it: ``at`` "arrival" or the
    stage just finished, the remaining seconds predicted with the fullest knobs still open and with those
    chosen, the seconds left to the deadline then (runner clock)."""

    step: str
    detail: str
    at: str
    reason: str
    predicted_full_s: float
    predicted_s: float
    time_left_s: float

    def as_dict(self) -> dict[str, Any]:
        """The response view (seconds rounded to milliseconds; an infinite prediction as null)."""
        return {
            k: (round(v, 3) if math.isfinite(v) else None) if isinstance(v, float) else v
            for k, v in asdict(self).items()
        }


@dataclass
class Text2SqlResult:
    """What ``/v1/text2sql`` returns; ``latency_s`` and ``deadline_met`` come from the runner (its clock and
    ``gateway.core.workflow.deadline_met``, as the gateway's metrics)."""

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
    local_s: float = 0.0
    """Wall time of the work outside LLM calls (``time.perf_counter``, never compared with the runner's clock)."""
    quality_mode: str = "full"
    degraded: list[Degradation] = field(default_factory=list)
    error: str | None = None
    failed_stage: str | None = None
    http_status: int = 200

    def as_dict(self) -> dict[str, Any]:
        """The JSON body (``error`` and ``failed_stage`` only on an error; no ``http_status``)."""
        d = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("error", "failed_stage", "http_status")
        }
        d["stages"] = [s.as_dict() for s in self.stages]
        d["latency_s"], d["local_s"] = round(self.latency_s, 4), round(self.local_s, 6)
        d["degraded"] = [x.as_dict() for x in self.degraded]
        if self.error is not None:
            d["error"], d["failed_stage"] = self.error, self.failed_stage
        return d


def result_key(result: QueryResult) -> tuple[tuple[str, ...], ...]:
    """An order-insensitive, hashable form of a result set (for agreement between candidates)."""
    rows = [tuple(repr(round(v, 6)) if isinstance(v, float) else repr(v) for v in row) for row in result.rows]
    return tuple(sorted(rows))


def select(valid: list[Candidate]) -> Candidate:
    """The chosen candidate of ``valid`` (each has a result): evaluator verdicts first, then agreement of
    execution results, then order; ``ValueError`` for an empty list."""
    keys = {c.index: result_key(c.result) for c in valid if c.result is not None}
    groups = Counter(keys.values())

    def rank(c: Candidate) -> tuple[int, int, int]:
        verdict = 1 if c.verdict is True else (0 if c.verdict is None else -1)
        agreement = groups[keys[c.index]] if c.index in keys else 0
        return (-verdict, -agreement, c.index)

    return min(valid, key=rank)
