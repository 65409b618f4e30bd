"""Deadline-aware degradation: do less work for a question when its deadline cannot be met otherwise.

``Degrader`` picks the CHESS pipeline's knobs (``Knobs``) at arrival and each stage boundary from the slack
``CompletionPredictor`` gives for ``knob_plan`` (docs/architecture.md, "Degradation and question shapes").
Tenants choose a ``QualityMode``. Pure: time and predictions are arguments."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gateway.core.predict import StagePlan
from gateway.core.workflow import (
    CANDIDATE,
    EVALUATE,
    REVISE,
    UNIT_TEST,
    UNIT_TESTER,
    CallSpec,
    WorkflowTemplate,
)

__all__ = [
    "FLOOR",
    "QUALITY_MODES",
    "Decision",
    "Degrader",
    "Knobs",
    "QualityMode",
    "QualityModel",
    "QuestionPlan",
    "degraded_steps",
    "knob_grid",
    "knob_plan",
]

QualityMode = Literal["full", "adaptive", "fast"]
QUALITY_MODES: tuple[QualityMode, ...] = ("full", "adaptive", "fast")

SKIPPABLE = frozenset({UNIT_TESTER, UNIT_TEST, EVALUATE})
"""Stage kinds that ``Knobs.evaluate = False`` skips: CHESS's unit-tester agent, its unit-test generation and
candidate evaluation (the traces' ``unit_tester`` calls are that agent's own steps around its two tools)."""


@dataclass(frozen=True, slots=True, order=True)
class Knobs:
    """How much work a question gets: SQL candidates, most ``revise`` rounds, unit tests and evaluation."""

    candidates: int
    max_revisions: int
    evaluate: bool

    def __post_init__(self) -> None:
        if self.candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {self.candidates}")
        if self.max_revisions < 0:
            raise ValueError(f"max_revisions must be >= 0, got {self.max_revisions}")

    def within(self, full: Knobs) -> bool:
        """True when every knob is at most ``full``'s (no setting does more work than full quality)."""
        return (
            self.candidates <= full.candidates
            and self.max_revisions <= full.max_revisions
            and (full.evaluate or not self.evaluate)
        )


FLOOR = Knobs(candidates=1, max_revisions=1, evaluate=False)
"""The least work that still gives an answer: one candidate, one revision round if its SQL fails or
returns nothing, no unit tests and no evaluation (nothing to choose between)."""


def degraded_steps(full: Knobs, used: Knobs) -> list[str]:
    """What ``used`` skipped relative to ``full``, in words (empty when nothing was)."""
    out: list[str] = []
    if used.candidates < full.candidates:
        out.append(f"candidates {full.candidates} -> {used.candidates}")
    if used.max_revisions < full.max_revisions:
        out.append(f"revision rounds capped at {used.max_revisions} (of {full.max_revisions})")
    if full.evaluate and not used.evaluate:
        out.append("unit tests and evaluation skipped")
    return out


def knob_grid(full: Knobs, floor: Knobs = FLOOR) -> list[Knobs]:
    """Every setting between ``floor`` and ``full`` that is worth considering, fullest first.

    Revision caps are taken from 0, 1, 2, 3, 5 and ``full``'s (within the range); evaluation only with
    two candidates or more. ``floor`` is clamped to ``full`` (a full setting below the floor is the floor).
    """
    lo = Knobs(
        min(floor.candidates, full.candidates),
        min(floor.max_revisions, full.max_revisions),
        floor.evaluate and full.evaluate,
    )
    caps = sorted({r for r in (0, 1, 2, 3, 5, full.max_revisions) if lo.max_revisions <= r <= full.max_revisions})
    out: list[Knobs] = []
    for k in range(full.candidates, lo.candidates - 1, -1):
        for r in reversed(caps):
            for ev in (True, False):
                if ev and (not full.evaluate or k < 2):
                    continue
                if not ev and lo.evaluate:
                    continue
                out.append(Knobs(k, r, ev))
    return out


@dataclass(frozen=True)
class QualityModel:
    """Accuracy (share of correct answers) per knob setting, as measured (``hexflow bench quality``).

    ``table`` maps measured settings to accuracy in [0, 1]. A setting not measured is looked up at the
    nearest measured one below it (fewer candidates, a lower revision cap, no evaluation rather than
    evaluation): never more optimistic than a measurement. ``source`` says where the numbers come from.
    """

    table: Mapping[Knobs, float]
    source: str = ""
    _sorted: tuple[tuple[Knobs, float], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.table:
            raise ValueError("a quality model needs at least one measured setting")
        for k, v in self.table.items():
            if not (0.0 <= v <= 1.0 and math.isfinite(v)):
                raise ValueError(f"accuracy of {k} must be within [0, 1], got {v}")
        object.__setattr__(self, "_sorted", tuple(sorted(self.table.items())))

    def accuracy(self, knobs: Knobs) -> float:
        """Accuracy at ``knobs``: measured, or the best measurement of a setting that does no more work."""
        v = self.table.get(knobs)
        if v is not None:
            return v
        below = [acc for k, acc in self._sorted if k.within(knobs)]
        if below:
            return max(below)
        return min(acc for _, acc in self._sorted)


@dataclass(frozen=True, slots=True)
class Decision:
    """The knobs chosen at one boundary, the remaining duration predicted with them and the time left."""

    knobs: Knobs
    predicted_s: float
    time_left_s: float
    fits: bool

    @property
    def slack_s(self) -> float:
        """Time left minus the predicted remaining duration (negative: predicted to miss)."""
        return self.time_left_s - self.predicted_s


def knob_plan(
    template: WorkflowTemplate,
    knobs: Knobs,
    *,
    phase: int = -1,
    rounds_done: int = 0,
    full_candidates: int | None = None,
) -> tuple[StagePlan, ...]:
    """The stages ``template`` still expects after round ``rounds_done`` of phase ``phase`` (-1: all) under
    ``knobs``: ``candidates`` calls, at most ``max_revisions`` revise rounds, no unit tests or evaluation without
    ``evaluate``; evaluation's width scales with the candidates (the template's is for ``full_candidates``)."""
    width_of = {p.kind: p.width for p in template.phases}
    base_k = full_candidates if full_candidates is not None else width_of.get(CANDIDATE, knobs.candidates)
    out: list[StagePlan] = []
    for i, p in enumerate(template.phases):
        if i < phase:
            continue
        if p.kind in SKIPPABLE and not knobs.evaluate:
            continue
        rounds = p.rounds
        if p.kind == REVISE:
            rounds = min(rounds, float(knobs.max_revisions))
        if i == phase:
            if not p.repeatable:
                continue
            rounds = max(rounds - rounds_done, 0.0)
        if rounds <= 0.0:
            continue
        width = p.width
        if p.kind == CANDIDATE:
            width = knobs.candidates
        elif p.kind == EVALUATE and base_k > 0:
            width = max(1, round(p.width * knobs.candidates / base_k))
        spec = CallSpec(p.kind, p.input_tokens, p.output_tokens)
        out.append(StagePlan((spec,) * width, rounds))
    return tuple(out)


@dataclass(frozen=True)
class Degrader:
    """The degradation policy of one tenant (docs/architecture.md, "Degradation and question shapes").

    Args:
        mode: ``full``, ``adaptive`` or ``fast``.
        full: the pipeline's configured knobs (full quality).
        quality: accuracy per setting (ranks the settings that fit).
        floor: the least work allowed (clamped to ``full``).
        headroom: the share of the time left a prediction must fit in (1: exactly the deadline).
    """

    mode: QualityMode
    full: Knobs
    quality: QualityModel
    floor: Knobs = FLOOR
    headroom: float = 1.0
    _grid: tuple[Knobs, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in QUALITY_MODES:
            raise ValueError(f"quality mode must be one of {', '.join(QUALITY_MODES)}, got {self.mode!r}")
        if not (0.0 < self.headroom <= 1.0):
            raise ValueError(f"headroom must be in (0, 1], got {self.headroom}")
        object.__setattr__(self, "_grid", tuple(knob_grid(self.full, self.floor)))

    @property
    def grid(self) -> tuple[Knobs, ...]:
        """The settings considered, fullest first; the last is the floor."""
        return self._grid

    def options(
        self, *, candidates_fixed: int | None = None, revisions_done: int = 0, evaluate_fixed: bool | None = None
    ) -> list[Knobs]:
        """The settings still open: candidates already generated (``candidates_fixed``) and evaluation
        already begun or skipped (``evaluate_fixed``) cannot change; a revision cap below the rounds already
        run means "no more rounds" and is the same as a cap of ``revisions_done``."""
        seen: set[Knobs] = set()
        out: list[Knobs] = []
        for k in self._grid:
            c = candidates_fixed if candidates_fixed is not None else k.candidates
            ev = evaluate_fixed if evaluate_fixed is not None else (k.evaluate and c >= 2)
            r = max(k.max_revisions, min(revisions_done, self.full.max_revisions))
            kk = Knobs(c, r, ev)
            if kk not in seen:
                seen.add(kk)
                out.append(kk)
        return out

    def choose(
        self,
        options: Sequence[Knobs],
        predict: Callable[[Knobs], float],
        time_left_s: float,
    ) -> Decision:
        """The first (fullest) of ``options`` if it is predicted to finish within ``headroom x time_left_s``;
        else the most accurate that is (equal accuracy: the fastest); none fits: the fastest. ``full`` mode
        takes the fullest option, ``fast`` the fastest, without predicting more than that one."""
        if not options:
            raise ValueError("no options to choose from")
        if self.mode == "full":
            k = options[0]
            p = predict(k)
            return Decision(k, p, time_left_s, p <= self.headroom * time_left_s)
        if self.mode == "fast":
            k = options[-1]
            p = predict(k)
            return Decision(k, p, time_left_s, p <= self.headroom * time_left_s)
        limit = self.headroom * time_left_s
        first = predict(options[0])
        if first <= limit:
            return Decision(options[0], first, time_left_s, True)
        best: tuple[float, float, Knobs] | None = None  # (-accuracy, predicted, knobs)
        fastest: tuple[float, Knobs] = (first, options[0])
        for k in options[1:]:
            p = predict(k)
            if p < fastest[0]:
                fastest = (p, k)
            if p <= limit:
                cand = (-self.quality.accuracy(k), p, k)
                if best is None or cand[:2] < best[:2]:
                    best = cand
        if best is not None:
            return Decision(best[2], best[1], time_left_s, True)
        return Decision(fastest[1], fastest[0], time_left_s, False)


def quality_from_rows(rows: Iterable[tuple[int, int, bool, float]], source: str = "") -> QualityModel:
    """A ``QualityModel`` from ``(candidates, max_revisions, evaluate, accuracy)`` rows."""
    return QualityModel({Knobs(c, r, e): a for c, r, e, a in rows}, source)


@dataclass(frozen=True)
class QuestionPlan:
    """The one prediction of a question, used by admission, budgets, the re-check and degradation.

    ``template``: its stages, fitted to what its database's questions cost (``gateway.core.shapes``); ``full``
    and ``floor``: the knobs the tenant's quality mode ranges over; ``source``: where the figures come from (shown
    by ``/v1/status``); ``observed``: False before the model answered anything (no question is refused on a guess).
    """

    template: WorkflowTemplate
    full: Knobs
    floor: Knobs
    source: str = ""
    observed: bool = True

    def rest(self, *, phase: int = -1, rounds_done: int = 0) -> tuple[StagePlan, ...]:
        """The stages still to run after round ``rounds_done`` of phase ``phase`` (-1: all of them) at the
        floor: the least a workflow of this plan can still do (its deadline check is against that)."""
        return knob_plan(
            self.template, self.floor, phase=phase, rounds_done=rounds_done, full_candidates=self.full.candidates
        )

    def at(self, knobs: Knobs, *, phase: int = -1, rounds_done: int = 0) -> tuple[StagePlan, ...]:
        """The stages still to run with ``knobs`` (degradation asks this for each setting it weighs)."""
        return knob_plan(
            self.template, knobs, phase=phase, rounds_done=rounds_done, full_candidates=self.full.candidates
        )
