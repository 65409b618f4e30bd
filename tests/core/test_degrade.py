"""The degradation policy: settings, accuracy lookup, plans under knobs, choices against predictions."""

from __future__ import annotations

import math

import pytest

from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.degrade import (
    FLOOR,
    Degrader,
    Knobs,
    QualityModel,
    degraded_steps,
    knob_grid,
    knob_plan,
    quality_from_rows,
)
from gateway.core.predict import StagePlan
from gateway.core.workflow import CANDIDATE, EVALUATE, REVISE, UNIT_TEST

FULL = Knobs(2, 10, True)
Q = quality_from_rows(
    [(2, 10, True, 0.9), (2, 10, False, 0.8), (1, 10, False, 0.7), (1, 1, False, 0.6), (1, 0, False, 0.4)]
)


def test_knobs_validate() -> None:
    with pytest.raises(ValueError, match="candidates"):
        Knobs(0, 1, False)
    with pytest.raises(ValueError, match="max_revisions"):
        Knobs(1, -1, False)


def test_grid_is_fullest_first_ends_at_floor_and_never_evaluates_one_candidate() -> None:
    grid = knob_grid(FULL)
    assert grid[0] == FULL
    assert grid[-1] == FLOOR
    assert len(set(grid)) == len(grid)
    assert all(k.within(FULL) for k in grid)
    assert not any(k.evaluate and k.candidates < 2 for k in grid)
    assert all(k.max_revisions >= FLOOR.max_revisions for k in grid)


def test_grid_clamps_a_floor_above_full() -> None:
    assert knob_grid(Knobs(1, 0, False)) == [Knobs(1, 0, False)]


def test_quality_lookup_never_more_optimistic_than_a_measurement() -> None:
    assert Q.accuracy(FULL) == 0.9
    # Not measured: the best measured setting that does no more work.
    assert Q.accuracy(Knobs(2, 5, True)) == 0.6
    assert Q.accuracy(Knobs(2, 10, False)) == 0.8
    assert Q.accuracy(Knobs(1, 3, False)) == 0.6
    with pytest.raises(ValueError, match="within"):
        QualityModel({FULL: 1.5})
    with pytest.raises(ValueError, match="at least one"):
        QualityModel({})


def test_degraded_steps_name_what_was_skipped() -> None:
    assert degraded_steps(FULL, FULL) == []
    steps = degraded_steps(FULL, FLOOR)
    assert len(steps) == 3
    assert "candidates 2 -> 1" in steps[0]
    assert "capped at 1" in steps[1]
    assert "evaluation" in steps[2]


def _kinds(plan: tuple[StagePlan, ...]) -> list[tuple[str, int, float]]:
    return [(st.calls[0].kind, len(st.calls), st.rounds) for st in plan]


def test_knob_plan_applies_the_knobs() -> None:
    full = _kinds(knob_plan(CHESS_TEMPLATE, FULL))
    floor = _kinds(knob_plan(CHESS_TEMPLATE, FLOOR))
    assert (CANDIDATE, 2, 1.0) in full and (CANDIDATE, 1, 1.0) in floor
    assert any(k == EVALUATE for k, _, _ in full)
    assert not any(k in (EVALUATE, UNIT_TEST) for k, _, _ in floor)
    rev_full = next(r for k, _, r in full if k == REVISE)
    rev_floor = next(r for k, _, r in floor if k == REVISE)
    assert rev_full > 3 and rev_floor == 1.0
    # Mid-way through the revise phase: rounds already run count against the cap.
    phase = next(i for i, p in enumerate(CHESS_TEMPLATE.phases) if p.kind == REVISE)
    mid = _kinds(knob_plan(CHESS_TEMPLATE, Knobs(2, 2, True), phase=phase, rounds_done=2))
    assert all(k != REVISE for k, _, _ in mid)
    assert mid[0][0] != CANDIDATE  # the phases before the current one are over


def _seconds(k: Knobs) -> float:
    """A prediction: more work, more time (each candidate 10 s, each round 3 s, evaluation 4 s)."""
    return 10.0 * k.candidates + 3.0 * min(k.max_revisions, 4) + (4.0 if k.evaluate else 0.0)


def test_adaptive_keeps_full_quality_while_it_fits() -> None:
    d = Degrader("adaptive", FULL, Q)
    dec = d.choose(d.options(), _seconds, time_left_s=1000.0)
    assert dec.knobs == FULL and dec.fits and dec.time_left_s > dec.predicted_s


def test_adaptive_picks_the_most_accurate_setting_that_fits() -> None:
    d = Degrader("adaptive", FULL, Q)
    opts = d.options()
    limit = 30.0
    dec = d.choose(opts, _seconds, time_left_s=limit)
    assert dec.fits and _seconds(dec.knobs) <= limit
    best = max(Q.accuracy(k) for k in opts if _seconds(k) <= limit)
    assert Q.accuracy(dec.knobs) == best


def test_full_quality_while_it_fits_then_the_fastest_of_equal_accuracy() -> None:
    flat = quality_from_rows([(2, 10, True, 0.9), (2, 1, True, 0.9), (1, 1, False, 0.8)])
    d = Degrader("adaptive", FULL, flat)
    # Capping revisions is measured to cost nothing, but full quality fits: nothing is cut.
    assert d.choose(d.options(), _seconds, time_left_s=1000.0).knobs == FULL
    # Full does not fit: the most accurate that does, and of those the fastest (it degrades anyway).
    dec = d.choose(d.options(), _seconds, time_left_s=33.0)
    assert dec.fits and dec.knobs == Knobs(2, 1, True)


def test_adaptive_takes_the_fastest_when_nothing_fits() -> None:
    d = Degrader("adaptive", FULL, Q)
    dec = d.choose(d.options(), _seconds, time_left_s=1.0)
    assert not dec.fits and dec.knobs == FLOOR and dec.time_left_s < dec.predicted_s


def test_full_and_fast_modes() -> None:
    assert Degrader("full", FULL, Q).choose(knob_grid(FULL), _seconds, 1.0).knobs == FULL
    assert Degrader("fast", FULL, Q).choose(knob_grid(FULL), _seconds, 1e9).knobs == FLOOR
    with pytest.raises(ValueError, match="quality mode"):
        Degrader("best", FULL, Q)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="headroom"):
        Degrader("adaptive", FULL, Q, headroom=0.0)


def test_options_keep_what_is_spent() -> None:
    d = Degrader("adaptive", FULL, Q)
    after_candidates = d.options(candidates_fixed=2, revisions_done=3)
    assert {k.candidates for k in after_candidates} == {2}
    assert all(k.max_revisions >= 3 for k in after_candidates)
    one = d.options(candidates_fixed=1)
    assert not any(k.evaluate for k in one)
    fixed = d.options(candidates_fixed=2, evaluate_fixed=True)
    assert all(k.evaluate for k in fixed)
    assert not math.isnan(d.choose(fixed, _seconds, 5.0).predicted_s)
