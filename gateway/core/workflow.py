"""Workflows: DAGs of LLM calls, revealed online.

A Text-to-SQL query is a chain of *stages*; a stage is a group of calls that run in parallel (two SQL
candidates, several evaluations) or a single call (a ``revise`` round). A stage becomes ready when the
previous one has finished; whether another ``revise`` round follows depends on executing the SQL, so the
scheduler never sees the future of a workflow. What it may use is the workflow's *template*: the expected
shape of the stages still to come (mean token counts, mean rounds), which is what stage budgets need.

Classes:
    CallSpec          what one LLM call asks for (stage kind, input and output tokens)
    Call              a call inside the scheduler, with its deadline, budget and bookkeeping
    Workflow          the interface a driver (simulator or live gateway) steps through
    StagedWorkflow    a workflow whose stages are known to the driver (trace replay, synthetic load)
    PhaseSpec, WorkflowTemplate   the expected shape used for budgets (the numbers are data:
                      ``gateway/config/workflows.yaml``, loaded by ``gateway.config.workflows``)
    TemplateCursor    where a workflow stands in its template (every workflow kind walks one)
    deadline_met      the one rule for "met its deadline" (every driver and report asks it)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

from gateway.core.native import mypyc_attr
from gateway.core.prefix import PrefixSeg, segment_keys

CostFn = Callable[[str, int, int], float]
"""Reference cost of a call: ``cost(kind, input_tokens, output_tokens) -> seconds``."""

DEADLINE_TOLERANCE_S = 1e-9
"""A workflow finishing this close after its deadline still meets it (absorbs float rounding of
``arrival + deadline_s``)."""


def deadline_met(finish: float, deadline: float, *, valid: bool = True) -> bool:
    """The one deadline rule: a workflow meets its deadline when it finished by then *with a valid answer*.

    Every driver and report asks this (the simulator's records, the live gateway's metrics and responses,
    the Text-to-SQL pipeline); none compares times itself. ``valid`` is false for a failed workflow and for
    a Text-to-SQL answer without usable SQL.
    """
    return valid and finish <= deadline + DEADLINE_TOLERANCE_S


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(frozen=True, slots=True)
class CallSpec:
    """One LLM call as a workflow asks for it.

    ``prefix``: the parts of its prompt that other calls share, in prompt order (``gateway.core.prefix``);
    empty when nothing is known to be shared.
    """

    kind: str
    input_tokens: int
    output_tokens: int
    prefix: tuple[PrefixSeg, ...] = ()

    def __reduce__(self) -> tuple[type[CallSpec], tuple[object, ...]]:
        # Pickled by its fields (to a bench's worker processes), a subclass's included: a frozen dataclass
        # compiled by mypyc (the native build) cannot be unpickled by setting attributes.
        return (type(self), tuple(getattr(self, f.name) for f in fields(self)))


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(slots=True, eq=False, init=False)
class Call:
    """A call inside the scheduler.

    The driver fills the identity and request fields; ``Scheduler.submit`` fills the scheduling fields
    (``worker``, ``t_comp``, ``budget``, ``key``) and the estimator its own (``prefill_s``, ``gpu_s``; at start
    ``service_s``, the predicted time on the worker, and ``model_s``, the same uncorrected); the driver
    records ``started_at``/``finished_at``.
    Times are in the driver's clock (virtual seconds in the simulator, monotonic seconds live).
    """

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
    """Calls in the decode batch the call joined at start, itself included (at most the batch limit)."""
    batch_ctx: float = 0.0
    """Mean-context tokens that batch reads per decode step at start (what ``model_s`` assumed)."""
    wait_s: float = 0.0
    """Engine seconds predicted at start for the prompts ahead of the call (part of ``model_s``)."""
    cached: int = 0
    """Prompt tokens the scheduler expects its worker to have cached (set at dispatch by a prefix-aware
    policy; the estimates count only the rest as prefill)."""
    best_effort: bool = False
    """Run at the lowest urgency: the call waits behind every other call of its worker's queue (a workflow
    predicted to miss its deadline whose tenant asked for best effort rather than rejection)."""
    _prefix_keys: list[tuple[int, int]] | None = None

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
    ) -> None:
        # Written out, not generated: the native build compiles this one, where a compiled dataclass's generated
        # ``__init__`` runs as interpreted Python (about 8,000 instructions, a tenth of a simulated call). The
        # same parameters, in field order, as the generated one (tests/core/test_workflow.py checks).
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

    @property
    def prefix_keys(self) -> list[tuple[int, int]]:
        """The prefix-cache keys of its prompt's shared segments (``prefix.segment_keys`` of its spec's prefix and
        its workflow), computed once: the scheduler and the simulated engine both look them up."""
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
    """The interface a driver steps through; the scheduler reads only the attributes below.

    Drivers call ``start()`` once at arrival and ``complete(spec)`` for every finished call; both return
    the calls that became ready. ``done`` turns true after the last call completes.
    """

    wid: int
    tenant: str
    arrival: float
    deadline: float

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

    @property
    def pending_calls(self) -> int:
        """Calls released and not yet completed (what the workflow waits on now); -1 when unknown."""
        return -1

    def stage_cost(self, spec: CallSpec, cost: CostFn) -> float:
        """Expected duration of the stage ``spec`` belongs to (parallel calls count once)."""
        return cost(spec.kind, spec.input_tokens, spec.output_tokens)

    def expected_remaining(self, cost: CostFn) -> float:
        """Expected duration of the stages after the current one, from the template only."""
        raise NotImplementedError

    def remaining(self, now: float) -> float:
        """Seconds left before the deadline at ``now`` (negative once it has passed)."""
        return self.deadline - now

    def met(self, finish: float, *, valid: bool = True) -> bool:
        """Whether finishing at ``finish`` (with a ``valid`` answer) meets the deadline: ``deadline_met``."""
        return deadline_met(finish, self.deadline, valid=valid)


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    """One phase of a template: a stage kind, its mean tokens, parallel width and expected rounds.

    ``rounds`` is the expected number of sequential repetitions (0.8 for an optional stage that runs
    in 80% of queries, 3.3 for revise rounds); ``width`` the number of calls run in parallel per round.
    """

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
    # Per cost function: suffix sums of phase costs. Keyed by the cost function object, so a driver
    # should pass the same object every time (the scheduler does); bounded.
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
        """Index of the phase a new stage of ``kind`` belongs to, given the current phase ``cursor``.

        A repeatable phase (revise rounds) matches its own kind again; otherwise the search starts
        after ``cursor``, skipping optional phases that did not run. ``cursor`` is -1 before the first
        stage. An unknown kind keeps the cursor (it adds nothing to the expected remaining cost).
        """
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

    def standard_calls(self) -> list[CallSpec]:
        """The critical path of a typical workflow: each phase with integer rounds >= 0.5, width 1."""
        out: list[CallSpec] = []
        for p in self.phases:
            for _ in range(round(p.rounds)):
                out.append(CallSpec(p.kind, p.input_tokens, p.output_tokens))
        return out


@dataclass(slots=True)
class TemplateCursor:
    """Where a workflow stands in its template: the phase of its current stage and the rounds of it so far.

    Every workflow kind walks its template through one of these (``enter`` when a stage starts), and asks
    it for the expected cost of what is still to come (``remaining``). Without a template nothing is
    expected to follow.
    """

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
    """A workflow whose stage list the driver holds (trace replay, synthetic load, single chat calls).

    Stages are released one at a time, so the scheduler sees exactly what a live gateway would see.
    """

    stages: Sequence[Stage]
    template: WorkflowTemplate | None = None
    _index: int = field(default=-1, repr=False)
    _pending: int = field(default=0, repr=False)
    _cursor: TemplateCursor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._cursor = TemplateCursor(self.template)

    def fresh(self) -> StagedWorkflow:
        """An unstarted copy (same id, tenant, times and stages), for replaying a workload again."""
        return StagedWorkflow(self.wid, self.tenant, self.arrival, self.deadline, self.stages, self.template)

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
    def pending_calls(self) -> int:
        """Calls of the current stage not yet completed."""
        return self._pending

    @property
    def num_calls(self) -> int:
        """Total calls of the workflow (known to the driver, not used by the scheduler)."""
        return sum(len(s.calls) for s in self.stages)

    def expected_remaining(self, cost: CostFn) -> float:
        """Expected cost after the current stage, from the template (0 without a template)."""
        return self._cursor.remaining(cost)


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(eq=False)
class OnlineWorkflow(Workflow):
    """A workflow whose driver decides each next stage at run time, after seeing the last one's results.

    The Text-to-SQL pipeline is one: whether another ``revise`` round follows depends on executing the
    SQL. The driver announces every stage with ``begin_stage`` before submitting its calls, so the stage
    budgets follow the template exactly as for a ``StagedWorkflow`` of the same stages; it records what
    ran (kinds and token counts) so the alpha tuner can replay it. ``start``/``complete`` are not used.
    """

    template: WorkflowTemplate | None = None
    stages: list[Stage] = field(default_factory=list)
    _pending: int = field(default=0, repr=False)
    _cursor: TemplateCursor = field(init=False, repr=False)

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
    def pending_calls(self) -> int:
        """Calls in flight."""
        return self._pending

    def expected_remaining(self, cost: CostFn) -> float:
        """Expected cost after the current stage, from the template (0 without a template)."""
        return self._cursor.remaining(cost)

    @property
    def position(self) -> tuple[int, int]:
        """Where the workflow stands in its template: (phase of its current stage, rounds of it so far);
        (-1, 0) before its first stage."""
        return self._cursor.phase, self._cursor.rounds


def group_calls(calls: Sequence[CallSpec], parallel_kinds: frozenset[str]) -> list[Stage]:
    """Group a flat call list into stages: consecutive calls of a parallel kind form one stage."""
    stages: list[Stage] = []
    run: list[CallSpec] = []
    for c in calls:
        if run and c.kind == run[0].kind and c.kind in parallel_kinds:
            run.append(c)
            continue
        if run:
            stages.append(Stage(run[0].kind, tuple(run)))
        run = [c]
    if run:
        stages.append(Stage(run[0].kind, tuple(run)))
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
