"""Degradation replayed in the simulator: traced CHESS queries whose remaining stages follow the knobs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.core.degrade import SKIPPABLE, Decision, Degrader, Knobs, cap_options, knob_plan
from gateway.core.predict import CompletionPredictor
from gateway.core.workflow import (
    CANDIDATE,
    REVISE,
    CallSpec,
    Stage,
    StagedWorkflow,
    TemplateCursor,
    WorkflowTemplate,
)


def knobbed_calls(stages: Sequence[Stage], knobs: Knobs) -> list[CallSpec]:
    """The calls of traced ``stages`` that a workflow run at ``knobs`` from its arrival issues (as
    ``KnobbedWorkflow`` releases them, without the deadline rule)."""
    return [c for st in knobbed_stages(stages, knobs) for c in st]


def knobbed_stages(stages: Sequence[Stage], knobs: Knobs) -> list[Sequence[CallSpec]]:
    """``knobbed_calls`` stage by stage."""
    out: list[Sequence[CallSpec]] = []
    revisions = 0
    run: int | None = None
    for st in stages:
        if st.kind == REVISE:
            if revisions >= knobs.max_revisions:
                continue
            revisions += 1
        elif st.kind in SKIPPABLE and not (knobs.evaluate and (run or knobs.candidates) >= 2):
            continue
        calls = st.calls
        if st.kind == CANDIDATE:
            run = min(knobs.candidates, len(calls)) if run is None else run
            calls = calls[:run]
        out.append(calls)
    return out


@dataclass(eq=False)
class KnobbedWorkflow(StagedWorkflow):
    """A traced query whose remaining stages follow ``knobs`` (set by ``decide`` between stages)."""

    full: Knobs = field(default_factory=lambda: Knobs(2, 10, True))
    knobs: Knobs | None = None
    degrader: Degrader | None = None
    candidates_run: int | None = field(default=None, repr=False)
    revisions_run: int = field(default=0, repr=False)
    evaluate_run: bool | None = field(default=None, repr=False)
    cut_candidates: bool = field(default=False, repr=False)
    cut_revisions: int | None = field(default=None, repr=False)
    cut_evaluate: bool = field(default=False, repr=False)
    plan_template: WorkflowTemplate | None = None
    """The template decisions predict the remaining stages with (default: ``template``, the budgets')."""
    log: list[tuple[float, str, Decision]] | None = field(default=None, repr=False)
    """When a list: every decision as ``(time, stage kind just finished or "arrival", decision)``."""
    deadline_rule: bool = False
    """The live pipeline's deadline rule: past the deadline no new ``revise`` round, unit test or evaluation starts."""
    ceiling: Knobs | None = field(default=None, repr=False)
    """The most work a burst lets it get (set at admission: ``BurstRegime``)."""
    clock: float = field(default=0.0, repr=False)
    """The simulator's time when the current stage's last call returned (set before ``complete``)."""
    _eval_begun: bool = field(default=False, init=False, repr=False)
    _plan_cursor: TemplateCursor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.plan_template is not None:
            self._plan_cursor = TemplateCursor(self.plan_template)

    def shifted(self, arrival: float, deadline: float) -> KnobbedWorkflow:
        """An unstarted copy with new arrival and deadline times."""
        return KnobbedWorkflow(
            self.wid,
            self.tenant,
            arrival,
            deadline,
            self.stages,
            template=self.template,
            full=self.full,
            degrader=self.degrader,
            plan_template=self.plan_template,
            deadline_rule=self.deadline_rule,
        )

    @property
    def last_of_stage(self) -> bool:
        """True when one more completion ends the current stage (the next is released then)."""
        return self._pending == 1

    @property
    def used(self) -> Knobs:
        """The setting the workflow ran at: a knob counts as cut only where it removed traced work."""
        return Knobs(
            self.candidates_run if self.cut_candidates and self.candidates_run else self.full.candidates,
            self.cut_revisions if self.cut_revisions is not None else self.full.max_revisions,
            self.full.evaluate and not self.cut_evaluate,
        )

    @property
    def degraded(self) -> bool:
        """Whether any knob removed work of the trace."""
        return self.used != self.full

    def _release_next(self) -> list[CallSpec]:
        k = self.knobs or self.full
        while True:
            self._index += 1
            if self._index >= len(self.stages):
                return []
            stage = self.stages[self._index]
            if (
                self.deadline_rule
                and self.clock > self.deadline
                and (stage.kind == REVISE or (stage.kind in SKIPPABLE and not self._eval_begun))
            ):
                continue
            if stage.kind == REVISE:
                if self.revisions_run >= k.max_revisions:
                    if self.cut_revisions is None:
                        self.cut_revisions = k.max_revisions
                    continue
                self.revisions_run += 1
            elif stage.kind in SKIPPABLE:
                ev = k.evaluate and (self.candidates_run or k.candidates) >= 2
                if self.evaluate_run is None:
                    self.evaluate_run = ev
                if not self.evaluate_run:
                    self.cut_evaluate = True
                    continue
                self._eval_begun = True
            calls = stage.calls
            if stage.kind == CANDIDATE:
                if self.candidates_run is None:
                    self.candidates_run = min(k.candidates, len(calls))
                    self.cut_candidates = self.candidates_run < len(calls)
                calls = calls[: self.candidates_run]
            self._pending = len(calls)
            self._cursor.enter(stage.kind)
            if self._plan_cursor is not None:
                self._plan_cursor.enter(stage.kind)
            return list(calls)

    def decide(self, predictor: CompletionPredictor) -> Decision | None:
        """Choose the knobs for the rest of the workflow at ``predictor.now`` (None without a policy)."""
        deg = self.degrader
        if deg is None or self.template is None:
            return None
        opts = deg.options(
            candidates_fixed=self.candidates_run,
            revisions_done=self.revisions_run,
            evaluate_fixed=self.evaluate_run,
        )
        opts = cap_options(opts, self.ceiling)
        template = self.plan_template if self.plan_template is not None else self.template
        cur = self._plan_cursor if self._plan_cursor is not None else self._cursor
        phase, rounds = cur.phase, cur.rounds
        full_k = self.full.candidates
        d = deg.choose(
            opts,
            lambda k: predictor.path_time(
                knob_plan(template, k, phase=phase, rounds_done=rounds, full_candidates=full_k)
            ),
            self.deadline - predictor.now,
        )
        self.knobs = d.knobs
        if self.log is not None:
            at = self.stages[self._index].kind if 0 <= self._index < len(self.stages) else "arrival"
            self.log.append((predictor.now, at, d))
        return d
