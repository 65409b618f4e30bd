"""Deadline-aware degradation: ``Degrader`` picks the CHESS pipeline's ``Knobs`` at arrival and each stage boundary
(docs/architecture.md, "Degradation and question shapes"). Pure: time and predictions are arguments."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from gateway.core.predict import StagePlan, template_plan
from gateway.core.workflow import CANDIDATE, EVALUATE, REVISE, UNIT_TEST, UNIT_TESTER, PhaseSpec, WorkflowTemplate

QualityMode = Literal["full", "adaptive", "fast"]
QUALITY_MODES: tuple[QualityMode, ...] = ("full", "adaptive", "fast")

SKIPPABLE = frozenset({UNIT_TESTER, UNIT_TEST, EVALUATE})
"""Stage kinds that ``Knobs.evaluate = False`` skips: the unit-tester agent's steps and candidate evaluation."""


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
"""The least work that still gives an answer: one candidate, one revision round, no unit tests or evaluation."""


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


def cap_options(options: Sequence[Knobs], ceiling: Knobs | None) -> list[Knobs]:
    """``options`` within ``ceiling`` (None: all of them; none within: the last, the least work)."""
    if ceiling is None:
        return list(options)
    return [k for k in options if k.within(ceiling)] or list(options[-1:])


def knob_grid(full: Knobs, floor: Knobs = FLOOR) -> list[Knobs]:
    """Every setting between ``floor`` (clamped to ``full``) and ``full`` worth considering, fullest first:
    revision caps from 0, 1, 2, 3, 5 and ``full``'s; evaluation only with two candidates or more."""
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
    """Accuracy per knob setting, as measured (``hexflow bench quality``); a setting not measured reads as the best
    measured one that does no more work (never more optimistic than a measurement)."""

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


def knob_plan(
    template: WorkflowTemplate,
    knobs: Knobs,
    *,
    phase: int = -1,
    rounds_done: int = 0,
    full_candidates: int | None = None,
) -> tuple[StagePlan, ...]:
    """``template_plan`` under ``knobs``; evaluation's width scales with the candidates (the template's is for
    ``full_candidates``)."""
    width_of = {p.kind: p.width for p in template.phases}
    base_k = full_candidates if full_candidates is not None else width_of.get(CANDIDATE, knobs.candidates)

    def shape(p: PhaseSpec) -> tuple[int, float]:
        if p.kind in SKIPPABLE and not knobs.evaluate:
            return 0, 0.0
        rounds = min(p.rounds, float(knobs.max_revisions)) if p.kind == REVISE else p.rounds
        if p.kind == CANDIDATE:
            return knobs.candidates, rounds
        if p.kind == EVALUATE and base_k > 0:
            return max(1, round(p.width * knobs.candidates / base_k)), rounds
        return p.width, rounds

    return template_plan(template, phase=phase, rounds_done=rounds_done, shape=shape)


@dataclass(frozen=True)
class Degrader:
    """The degradation policy of one tenant: its ``mode``, ``full`` quality, the ``floor`` (clamped to ``full``) and
    the share of the time left a prediction must fit in (``headroom``)."""

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
        """The settings still open: generated candidates and begun or skipped evaluation cannot change; a revision
        cap below ``revisions_done`` is the same as a cap of ``revisions_done``."""
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
        """The fullest of ``options`` if predicted within ``headroom x time_left_s``; else the most accurate that is
        (ties: the fastest); none fits: the fastest. ``full`` and ``fast`` modes take the first or last option."""
        if not options:
            raise ValueError("no options to choose from")
        limit = self.headroom * time_left_s
        if self.mode != "adaptive":
            k = options[0] if self.mode == "full" else options[-1]
            p = predict(k)
            return Decision(k, p, time_left_s, p <= limit)
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
    """The one prediction of a question (admission, budgets, the re-check, degradation): its fitted ``template``,
    the knobs its mode ranges over; ``observed``: False before the model answered anything (nothing is refused)."""

    template: WorkflowTemplate
    full: Knobs
    floor: Knobs
    source: str = ""
    observed: bool = True
    ceiling: Knobs | None = None
    """The most work a burst lets the question get (``BurstRegime``; None: up to ``full``)."""
    quality: QualityModel | None = None
    """Accuracy per setting (what a burst's cap weighs); None: the question does not degrade."""

    def capped(self, options: Sequence[Knobs]) -> list[Knobs]:
        """``options`` within the ``ceiling`` (``cap_options``)."""
        return cap_options(options, self.ceiling)

    def rest(self, *, phase: int = -1, rounds_done: int = 0) -> tuple[StagePlan, ...]:
        """The stages still to run after round ``rounds_done`` of phase ``phase`` (-1: all of them) at the floor."""
        return self.at(self.floor, phase=phase, rounds_done=rounds_done)

    def at(self, knobs: Knobs, *, phase: int = -1, rounds_done: int = 0) -> tuple[StagePlan, ...]:
        """The stages still to run with ``knobs`` (degradation asks this for each setting it weighs)."""
        return knob_plan(
            self.template, knobs, phase=phase, rounds_done=rounds_done, full_candidates=self.full.candidates
        )


BURST_CAPACITY = 1.5
"""Cluster seconds of full-quality work per second (the latency model's: every worker at full batch is 1) that
arrivals may bring before a burst caps their settings (``admission.burst_capacity``), net of the prefix cache
(``CacheShare``). Calls are sized by their plan, so what the cluster sustains reads above 1 (docs/benchmarks.md,
"Bursts")."""
BURST_WINDOW = 0.5
"""``BurstRegime``'s arrival window, in the arriving workflow's deadlines."""
BURST_MIN_WINDOW_S = 30.0
"""``BurstRegime``'s shortest window, in seconds (a rate needs several arrivals, whatever the deadline)."""
BURST_PRESSURE = 0.5
"""A burst starts only when the arrival is predicted at full quality, behind the backlog drained saturated, to
take more than this share of the time admission allows it (the backlog is forming, not a passing blip)."""
BURST_EXIT = 0.8
"""A burst ends once the work arriving over the last deadline is at most this share of the capacity."""


@dataclass(eq=False)
class BurstRegime:
    """Degradation ahead of the backlog. A burst starts when the full-quality work arriving per second (over the
    last ``BURST_WINDOW`` of the arriving workflow's deadline, at least ``BURST_MIN_WINDOW_S``) exceeds the
    ``capacity`` while the backlog ahead of arrivals is forming (``BURST_PRESSURE``). In a burst a degrading arrival
    is capped at the setting with the most correct answers per arrival: its accuracy times the share of the arrivals
    the capacity serves at it (the goodput bound's choice under a burst; ties: the least work), the cap only ever
    lowered within a burst; the burst ends, at the earliest a deadline after it started, once the work arriving
    over the last deadline is at most ``BURST_EXIT`` of the capacity, so it never flaps. Pure: the driver passes
    time, work and the settings' accuracy."""

    capacity: float = BURST_CAPACITY
    max_arrivals: int = 100_000
    in_burst: bool = field(init=False, default=False)
    bursts: int = field(init=False, default=0)
    """Bursts entered so far."""
    capped: int = field(init=False, default=0)
    """Arrivals whose setting a burst capped below their full quality."""
    ceiling: Knobs | None = field(init=False, default=None)
    """The current burst's cap (None outside a burst, or before a degrading arrival in it)."""
    load: float = field(init=False, default=0.0)
    """The full-quality work arriving per second over the capacity, at the last arrival or status read."""
    _times: list[float] = field(init=False, default_factory=list)
    _cum: list[float] = field(init=False, default_factory=list)  # work arrived up to and including each arrival
    _start: int = field(init=False, default=0)  # the oldest arrival kept
    _entered: float = field(init=False, default=0.0)  # when the current burst started
    _full: Knobs | None = field(init=False, default=None)  # the last capped question's full setting
    _window: float = field(init=False, default=BURST_MIN_WINDOW_S)  # the last arrival's window

    def __post_init__(self) -> None:
        if not (self.capacity > 0 and math.isfinite(self.capacity)):
            raise ValueError(f"capacity must be positive and finite, got {self.capacity}")

    def arrival(self, now: float, work_s: float, deadline_s: float, pressure: float = math.inf) -> None:
        """Count an arrival at ``now`` bringing ``work_s`` cluster seconds at full quality, due ``deadline_s`` later;
        enter or leave a burst. ``pressure``: its predicted completion at full quality over the time admission
        allows it."""
        total = self._cum[-1] if self._cum else 0.0
        self._cum.append(total + (max(work_s, 0.0) if math.isfinite(work_s) else 0.0))
        self._times.append(now)
        if len(self._times) - self._start > self.max_arrivals:
            self._start += 1
            if self._start > self.max_arrivals:  # compact: the lists stay within twice the bound
                del self._times[: self._start - 1], self._cum[: self._start - 1]
                self._start = 1
        self._window = max(BURST_WINDOW * deadline_s, BURST_MIN_WINDOW_S)
        self.settle(now, pressure)

    def settle(self, now: float, pressure: float = 0.0) -> None:
        """Re-read the load at ``now`` and enter (with ``pressure`` above its threshold) or leave a burst."""
        if not self._times:
            return
        w = self._window
        self.load = self._rate(now, w) / self.capacity
        if not self.in_burst:
            if self.load > 1.0 and pressure > BURST_PRESSURE:
                self.in_burst, self.ceiling, self._entered = True, None, now
                self.bursts += 1
            return
        hold = w / BURST_WINDOW
        if now - self._entered >= hold and self._rate(now, hold) <= BURST_EXIT * self.capacity:
            self.in_burst, self.ceiling = False, None

    def _rate(self, now: float, window: float) -> float:
        """Work arrived per second over the last ``window`` seconds (of the arrivals kept)."""
        i = bisect.bisect_right(self._times, now - window, lo=self._start)
        before = self._cum[i - 1] if i > 0 else 0.0
        return (self._cum[-1] - before) / window

    def cap(self, options: Sequence[Knobs], work: Callable[[Knobs], float], quality: QualityModel) -> Knobs | None:
        """The cap of a degrading arrival just counted (``arrival``), None outside a burst. ``options``: its
        settings, fullest first; ``work``: its cluster seconds at a setting; ``quality``: their accuracy."""
        if not self.in_burst or not options:
            return None
        full_work = work(options[0])

        def goodput(k: Knobs) -> tuple[float, float]:
            # Correct answers per arrival at k: its accuracy, times the share of arrivals the capacity serves at k.
            w = work(k)
            served = min(1.0, full_work / (self.load * w)) if self.load * w > 0 else 1.0
            return quality.accuracy(k) * served, -w

        pick = max(options, key=goodput)
        if self.ceiling is None or pick.within(self.ceiling):  # (only ever lowered within a burst)
            self.ceiling = pick
        self._full = options[0]
        if self.ceiling != options[0]:
            self.capped += 1
        return self.ceiling

    def status(self, now: float) -> dict[str, object]:
        """What the status page shows at ``now``: whether a burst is on, the load, the cap and what it trades."""
        self.settle(now)
        c, full = self.ceiling, self._full
        return {
            "in_burst": self.in_burst,
            "load": round(self.load, 4),
            "capacity": self.capacity,
            "bursts": self.bursts,
            "capped_questions": self.capped,
            "ceiling": None if c is None else asdict(c),
            "trades": degraded_steps(full, c) if c is not None and full is not None else [],
        }
