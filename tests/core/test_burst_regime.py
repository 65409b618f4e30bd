"""``BurstRegime``: degradation ahead of the backlog (pure: time, work and accuracy are arguments)."""

from __future__ import annotations

import pytest

from gateway.core.degrade import (
    BURST_MIN_WINDOW_S,
    BurstRegime,
    Knobs,
    QuestionPlan,
    cap_options,
    knob_grid,
    quality_from_rows,
)

FULL = Knobs(2, 10, True)
FLOOR = Knobs(1, 1, False)
Q = quality_from_rows([(2, 10, True, 0.998), (2, 10, False, 0.892), (1, 10, False, 0.892), (1, 1, False, 0.888)])
OPTIONS = knob_grid(FULL, FLOOR)
WORK = {k: (4.0 if k.candidates == 2 else 2.0) + 0.1 * k.max_revisions - (0.0 if k.evaluate else 0.5) for k in OPTIONS}


def _feed(reg: BurstRegime, start: float, n: int, gap: float, work: float = 5.0, pressure: float = 1.0) -> float:
    t = start
    for _ in range(n):
        reg.arrival(t, work, 60.0, pressure)
        t += gap
    return t


def test_a_burst_starts_above_capacity_with_a_backlog_forming_and_ends_after_a_calm_hold() -> None:
    reg = BurstRegime(capacity=1.0)  # window: 30 s (half a 60 s deadline)
    t = _feed(reg, 0.0, 20, 10.0)  # 0.5 s of work per second: calm
    assert not reg.in_burst and reg.load == pytest.approx(0.5, rel=0.2)
    t = _feed(reg, t, 30, 1.0, pressure=0.1)  # 5 s/s but nothing ahead of the arrivals yet: not a burst
    assert not reg.in_burst and reg.load > 1
    t = _feed(reg, t, 5, 1.0)
    assert reg.in_burst and reg.bursts == 1
    # Load just under the capacity but above the exit share: the burst holds (no flapping at the edge).
    t = _feed(reg, t, 60, 5.5)
    assert reg.in_burst
    # Calm for a whole deadline (twice the window): it ends, and a later status read agrees.
    t = _feed(reg, t, 30, 20.0)
    assert not reg.in_burst and reg.ceiling is None
    assert reg.status(t + 1000.0)["in_burst"] is False and reg.bursts == 1


def test_the_cap_is_the_most_accurate_setting_that_fits_and_only_ever_lowered_within_a_burst() -> None:
    reg = BurstRegime(capacity=1.0)
    assert reg.cap(OPTIONS, WORK.__getitem__, Q) is None  # outside a burst: no cap
    t = _feed(reg, 0.0, 40, 1.0)  # 5 s/s of full work over a capacity of 1: 5x
    assert reg.in_burst and reg.load == pytest.approx(5.0, rel=0.1)
    cap = reg.cap(OPTIONS, WORK.__getitem__, Q)
    # Nothing needs only a fifth of full work here: the most correct answers per engine-second (the floor).
    assert cap == FLOOR and reg.capped == 1
    trades = ["candidates 2 -> 1", "revision rounds capped at 1 (of 10)", "unit tests and evaluation skipped"]
    assert reg.status(t)["trades"] == trades
    # The load drops to what a fuller setting would fit: the cap stays where it was until the burst ends.
    _feed(reg, t, 10, 3.0)
    assert reg.in_burst and reg.cap(OPTIONS, WORK.__getitem__, Q) == FLOOR


def test_the_cap_serves_the_most_correct_answers_per_arrival() -> None:
    """Accuracy times the share of arrivals the capacity serves at a setting: a mild burst keeps what costs no
    accuracy (here: no setting short of full keeps evaluation, so one candidate without it, the most accurate that
    serves them all), never a setting that serves as many less accurately."""
    reg = BurstRegime(capacity=1.0)
    _feed(reg, 0.0, 40, 4.0)  # 1.25 s/s of full work: a quarter over the capacity
    assert reg.in_burst and reg.load == pytest.approx(1.25, rel=0.1)
    cap = reg.cap(OPTIONS, WORK.__getitem__, Q)

    def correct(k: Knobs) -> float:
        return Q.accuracy(k) * min(1.0, WORK[FULL] / (reg.load * WORK[k]))

    assert cap is not None and correct(cap) == max(correct(k) for k in OPTIONS)
    assert cap == Knobs(1, 10, False)


def test_below_the_capacity_nothing_is_capped() -> None:
    reg = BurstRegime(capacity=1.0)
    _feed(reg, 0.0, 200, 6.0)  # 0.83 s/s, pressure high: still no burst
    assert not reg.in_burst and reg.cap(OPTIONS, WORK.__getitem__, Q) is None and reg.capped == 0


def test_a_question_keeps_its_cap_and_bad_arguments_are_refused() -> None:
    assert cap_options(OPTIONS, None) == OPTIONS
    assert cap_options(OPTIONS, FLOOR) == [FLOOR]
    assert all(k.within(Knobs(1, 10, False)) for k in cap_options(OPTIONS, Knobs(1, 10, False)))
    from gateway.core.workflow import WorkflowTemplate

    plan = QuestionPlan(WorkflowTemplate("t", ()), FULL, FLOOR, ceiling=FLOOR)
    assert plan.capped(OPTIONS) == [FLOOR]
    with pytest.raises(ValueError, match="capacity"):
        BurstRegime(capacity=0.0)
    assert BURST_MIN_WINDOW_S > 0


def test_arrivals_kept_are_bounded() -> None:
    reg = BurstRegime(capacity=1.0, max_arrivals=100)
    _feed(reg, 0.0, 1000, 0.001, pressure=0.0)
    assert len(reg._times) <= 2 * 100 + 1
    assert reg.load > 1  # the rate over the arrivals kept
