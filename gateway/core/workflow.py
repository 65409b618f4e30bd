"""Workflows: chains of stages of parallel LLM calls, revealed online (the scheduler never sees a workflow's future,
only its *template*: the expected shape of the stages to come, ``gateway/config/workflows.yaml``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.core.native import mypyc_attr
from gateway.core.pickled import field_values
from gateway.core.prefix import PrefixSeg, segment_keys

CostFn = Callable[[str, int, int], float]
"""Reference cost of a call: ``cost(kind, input_tokens, output_tokens) -> seconds``."""

DEADLINE_TOLERANCE_S = 1e-9
"""A workflow finishing this close after its deadline still meets it (float rounding)."""


def deadline_met(finish: float, deadline: float, *, valid: bool = True) -> bool:
    """The one deadline rule (every driver and report asks it): finished by then *with a valid answer*."""
    return valid and finish <= deadline + DEADLINE_TOLERANCE_S


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(frozen=True, slots=True)
class CallSpec:
    """One LLM call as a workflow asks for it; ``prefix``: the prompt parts other calls share, in order."""

    kind: str
    input_tokens: int
    output_tokens: int
    prefix: tuple[PrefixSeg, ...] = ()

    def __reduce__(self) -> tuple[type[CallSpec], tuple[object, ...]]:
        return type(self), field_values(self)


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(slots=True, eq=False, init=False)
class Call:
    """A call inside the scheduler: the driver fills identity, request and ``started_at``/``finished_at``; the
    scheduler and estimator fill the rest (``service_s``: predicted time on the worker, ``model_s`` uncorrected).
    Times are in the driver's clock."""

    id: int
    workflow: Workflow
    spec: CallSpec
    ready_at: float
    seq: int = 0
    worker: int = -1
    t_comp: float = 0.0
    prefill_s: float = 0.0
    gpu_s: float = 0.0
    service_s: float = 0.0
    model_s: float = 0.0
    stage_cost: float = 0.0
    remaining_cost: float = 0.0
    budget: float = 0.0
    key: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int = 0
    batch_n: int = 0
    """Calls in the decode batch the call joined at start, itself included."""
    batch_ctx: float = 0.0
    """Mean-context tokens that batch reads per decode step at start (what ``model_s`` assumed)."""
    wait_s: float = 0.0
    """Engine seconds predicted at start for the prompts ahead of the call (part of ``model_s``)."""
    cached: int = 0
    """Prompt tokens the scheduler expects its worker to have cached (left out of the prefill)."""
    best_effort: bool = False
    """Run at the lowest urgency, behind every other call of its worker's queue."""
    _prefix_keys: list[tuple[int, int]] | None = None
    leg: int = 0
    """Prefill/decode disaggregation: 0 a whole call; 1 a split call's prefill (its first token), 2 its decode."""
    parent: Call | None = None
    """A leg's call as the workflow asked for it (the leg's own ``spec`` may differ: a prefill's has one output)."""
    decode_on: int = -1
    """A prefill leg's decode worker, chosen with it."""

    def __init__(
        self,
        id: int,
        workflow: Workflow,
        spec: CallSpec,
        ready_at: float,
        seq: int = 0,
        worker: int = -1,
        t_comp: float = 0.0,
        prefill_s: float = 0.0,
        gpu_s: float = 0.0,
        service_s: float = 0.0,
        model_s: float = 0.0,
        stage_cost: float = 0.0,
        remaining_cost: float = 0.0,
        budget: float = 0.0,
        key: float = 0.0,
        started_at: float | None = None,
        finished_at: float | None = None,
        attempts: int = 0,
        batch_n: int = 0,
        batch_ctx: float = 0.0,
        wait_s: float = 0.0,
        cached: int = 0,
        best_effort: bool = False,
        _prefix_keys: list[tuple[int, int]] | None = None,
        leg: int = 0,
        parent: Call | None = None,
        decode_on: int = -1,
    ) -> None:
        # Written out: mypyc runs a compiled dataclass's generated ``__init__`` interpreted (a tenth of a simulated
        # call). The generated one's parameters, in field order (tests/core/test_workflow.py checks).
        self.id = id
        self.workflow = workflow
        self.spec = spec
        self.ready_at = ready_at
        self.seq = seq
        self.worker = worker
        self.t_comp = t_comp
        self.prefill_s = prefill_s
        self.gpu_s = gpu_s
        self.service_s = service_s
        self.model_s = model_s
        self.stage_cost = stage_cost
        self.remaining_cost = remaining_cost
        self.budget = budget
        self.key = key
        self.started_at = started_at
        self.finished_at = finished_at
        self.attempts = attempts
        self.batch_n = batch_n
        self.batch_ctx = batch_ctx
        self.wait_s = wait_s
        self.cached = cached
        self.best_effort = best_effort
        self._prefix_keys = _prefix_keys
        self.leg = leg
        self.parent = parent
        self.decode_on = decode_on

    @property
    def prefix_keys(self) -> list[tuple[int, int]]:
        """The prefix-cache keys of its prompt's shared segments, computed once."""
        keys = self._prefix_keys
        if keys is None:
            keys = self._prefix_keys = segment_keys(self.spec.prefix, self.workflow.wid)
        return keys

    @property
    def kind(self) -> str:
        """The stage kind (``generate_candidate``, ``revise``, ...)."""
        return self.spec.kind

    @property
    def tenant(self) -> str:
        """The tenant the call's workflow belongs to."""
        return self.workflow.tenant

    @property
    def deadline(self) -> float:
        """Absolute end-to-end deadline of the call's workflow."""
        return self.workflow.deadline


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(eq=False)
class Workflow:
    """The interface a driver steps through: ``start()`` at arrival, ``complete(spec)`` per finished call (both
    return the calls that became ready) until ``done``."""

    wid: int
    tenant: str
    arrival: float
    deadline: float
    _cursor: TemplateCursor = field(default_factory=lambda: TemplateCursor(None), init=False, repr=False)
    """Where the workflow stands in its template (a subclass with a template sets it)."""

    def start(self) -> list[CallSpec]:
        """Calls ready at arrival."""
        raise NotImplementedError

    def complete(self, spec: CallSpec) -> list[CallSpec]:
        """Record that one call finished; return the calls that became ready because of it."""
        raise NotImplementedError

    @property
    def done(self) -> bool:
        """True once every call of the workflow has finished."""
        raise NotImplementedError

    def stage_cost(self, spec: CallSpec, cost: CostFn) -> float:
        """Expected duration of the stage ``spec`` belongs to (parallel calls count once)."""
        return cost(spec.kind, spec.input_tokens, spec.output_tokens)

    def expected_remaining(self, cost: CostFn) -> float:
        """Expected duration of the stages after the current one, from the template only (0 without one)."""
        return self._cursor.remaining(cost)

    def remaining(self, now: float) -> float:
        """Seconds left before the deadline at ``now`` (negative once it has passed)."""
        return self.deadline - now

    def met(self, finish: float, *, valid: bool = True) -> bool:
        """Whether finishing at ``finish`` (with a ``valid`` answer) meets the deadline: ``deadline_met``."""
        return deadline_met(finish, self.deadline, valid=valid)


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    """One phase of a template: a stage kind, mean tokens, parallel ``width`` and expected ``rounds`` (0.8 for an
    optional stage run by 80% of queries)."""

    kind: str
    input_tokens: int
    output_tokens: int
    rounds: float = 1.0
    width: int = 1
    repeatable: bool = False


@dataclass(frozen=True)
class WorkflowTemplate:
    """Expected shape of a workflow: ordered phases. Used for budgets, never to peek at the future."""

    name: str
    phases: tuple[PhaseSpec, ...]
    # Suffix sums of phase costs, keyed by the cost function object (pass the same one every time); bounded.
    _suffix: dict[object, list[float]] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def phase_costs(self, cost: CostFn) -> list[float]:
        """Expected duration of each phase (rounds x one call; parallel calls count once)."""
        return [p.rounds * cost(p.kind, p.input_tokens, p.output_tokens) for p in self.phases]

    def _suffix_sums(self, cost: CostFn) -> list[float]:
        sums = self._suffix.get(cost)
        if sums is None:
            costs = self.phase_costs(cost)
            sums = [0.0] * (len(costs) + 1)
            for i in range(len(costs) - 1, -1, -1):
                sums[i] = sums[i + 1] + costs[i]
            if len(self._suffix) >= 64:
                self._suffix.clear()
            self._suffix[cost] = sums
        return sums

    def advance(self, cursor: int, kind: str) -> int:
        """Index of the phase a new stage of ``kind`` belongs to, after phase ``cursor`` (-1: before the first);
        a repeatable phase matches itself again, optional phases may be skipped, an unknown kind keeps ``cursor``."""
        if 0 <= cursor < len(self.phases):
            cur = self.phases[cursor]
            if cur.repeatable and cur.kind == kind:
                return cursor
        for i in range(cursor + 1, len(self.phases)):
            if self.phases[i].kind == kind:
                return i
        return cursor

    def remaining_after(self, index: int, rounds_done: int, cost: CostFn) -> float:
        """Expected cost of what follows the current round of phase ``index`` (-1: before the first)."""
        sums = self._suffix_sums(cost)
        if index < 0:
            return sums[0]
        rest = sums[min(index + 1, len(self.phases))]
        if index < len(self.phases):
            p = self.phases[index]
            if p.repeatable:
                extra_rounds = max(p.rounds - rounds_done, 0.0)
                rest += extra_rounds * cost(p.kind, p.input_tokens, p.output_tokens)
        return rest


@dataclass(slots=True)
class TemplateCursor:
    """Where a workflow stands in its template: the phase of its current stage and the rounds of it so far."""

    template: WorkflowTemplate | None
    phase: int = -1
    rounds: int = 0

    def enter(self, kind: str) -> None:
        """A stage of ``kind`` starts: move to its phase (a repeated phase counts another round)."""
        if self.template is None:
            return
        prev = self.phase
        self.phase = self.template.advance(prev, kind)
        self.rounds = self.rounds + 1 if self.phase == prev else 1

    def remaining(self, cost: CostFn) -> float:
        """Expected cost after the current stage, from the template (0 without a template)."""
        if self.template is None:
            return 0.0
        return self.template.remaining_after(self.phase, self.rounds, cost)


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of a ``StagedWorkflow``: calls that run in parallel."""

    kind: str
    calls: tuple[CallSpec, ...]


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(eq=False)
class StagedWorkflow(Workflow):
    """A workflow whose stage list the driver holds (trace replay, synthetic load), released one at a time."""

    stages: Sequence[Stage]
    template: WorkflowTemplate | None = None
    _index: int = field(default=-1, repr=False)
    _pending: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self._cursor = TemplateCursor(self.template)

    def shifted(self, arrival: float, deadline: float) -> StagedWorkflow:
        """An unstarted copy with new arrival and deadline times."""
        return StagedWorkflow(self.wid, self.tenant, arrival, deadline, self.stages, self.template)

    def start(self) -> list[CallSpec]:
        """Release the first stage."""
        if self._index != -1:
            raise RuntimeError(f"workflow {self.wid} started twice")
        return self._release_next()

    def _release_next(self) -> list[CallSpec]:
        self._index += 1
        if self._index >= len(self.stages):
            return []
        stage = self.stages[self._index]
        self._pending = len(stage.calls)
        self._cursor.enter(stage.kind)
        return list(stage.calls)

    def complete(self, spec: CallSpec) -> list[CallSpec]:
        """One call of the current stage finished; release the next stage when all have."""
        if self._pending <= 0:
            raise RuntimeError(f"workflow {self.wid}: completion without a pending call")
        self._pending -= 1
        if self._pending > 0:
            return []
        return self._release_next()

    @property
    def done(self) -> bool:
        """True once the last stage has completed."""
        return self._index >= len(self.stages)

    @property
    def num_calls(self) -> int:
        """Total calls of the workflow (known to the driver, not used by the scheduler)."""
        return sum(len(s.calls) for s in self.stages)


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(eq=False)
class OnlineWorkflow(Workflow):
    """A workflow whose driver (the Text-to-SQL pipeline) decides each next stage at run time and announces it
    with ``begin_stage``; ``stages`` records what ran (the alpha tuner replays it)."""

    template: WorkflowTemplate | None = None
    stages: list[Stage] = field(default_factory=list)
    _pending: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self._cursor = TemplateCursor(self.template)

    def begin_stage(self, kind: str, calls: Sequence[CallSpec]) -> None:
        """The driver is about to submit ``calls`` as the next stage (of ``kind``)."""
        self.stages.append(Stage(kind, tuple(calls)))
        self._pending += len(calls)
        self._cursor.enter(kind)

    def stage_call_done(self) -> None:
        """One call of the current stage returned (bookkeeping for ``done``)."""
        self._pending = max(self._pending - 1, 0)

    def start(self) -> list[CallSpec]:
        """Not used: the driver submits stages itself."""
        return []

    def complete(self, spec: CallSpec) -> list[CallSpec]:
        """Not used: the driver submits stages itself."""
        return []

    @property
    def done(self) -> bool:
        """No call in flight (the driver decides when the workflow is over)."""
        return self._pending == 0

    @property
    def position(self) -> tuple[int, int]:
        """(phase of its current stage, rounds of it so far); (-1, 0) before its first stage."""
        return self._cursor.phase, self._cursor.rounds


def group_calls(calls: Sequence[CallSpec], parallel_kinds: frozenset[str]) -> list[Stage]:
    """Group a flat call list into stages: consecutive calls of a parallel kind form one stage."""
    stages: list[Stage] = []
    for kind, run in itertools.groupby(calls, key=lambda c: c.kind):
        group = tuple(run)
        stages += [Stage(kind, group)] if kind in parallel_kinds else [Stage(kind, (c,)) for c in group]
    return stages


# Stage kinds of the CHESS workflow (names as in the hexgen traces, normalised).
IR = "information_retriever"
KEYWORDS = "extract_keywords"
CANDIDATE = "generate_candidate"
REVISE = "revise"
UNIT_TESTER = "unit_tester"
UNIT_TEST = "generate_unit_test"
EVALUATE = "evaluate"
CHAT = "chat"
