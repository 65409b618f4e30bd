"""What questions cost (``gateway.core.shapes``): robust, windowed fits of answered questions' stages."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.degrade import SKIPPABLE, Knobs, knob_plan
from gateway.core.shapes import INPUT_SCALE_LIMIT, MIN_QUESTIONS, QuestionSample, ShapeWindow, fit, robust_mean
from gateway.core.workflow import CANDIDATE, EVALUATE, IR, KEYWORDS, REVISE, UNIT_TEST, UNIT_TESTER

SMALL = [(KEYWORDS, [(100, 10)]), (IR, [(1000, 5)]), (CANDIDATE, [(1000, 40), (1000, 40)])]
EVALUATED = [(UNIT_TEST, [(1000, 20)]), (EVALUATE, [(200, 16), (200, 16)])]


def sample(stages: list[tuple[str, list[tuple[int, int]]]], evaluated: bool = True) -> QuestionSample:
    return QuestionSample.of(stages, evaluated=evaluated)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], math.nan),
        ([3.0], 3.0),
        ([1.0, 100.0], 50.5),  # below MIN_QUESTIONS every value counts
        ([1.0, 1.0, 1.0, 1.0, 100.0], 1.0),  # from MIN_QUESTIONS on, the highest is clipped to the next
        ([0.0] * 18 + [1.0, 20.0], 0.1),  # a rare event still counts, at the size of the next largest
        ([40.0] * 95 + [700.0] * 5, 40.0),  # the top 5% clipped
    ],
)
def test_robust_mean_drops_the_tails(values: list[float], expected: float) -> None:
    got = robust_mean(values)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


def test_fit_replaces_each_seen_kinds_figures_and_drops_kinds_never_run() -> None:
    w = ShapeWindow(100, SKIPPABLE)
    assert fit(CHESS_TEMPLATE, w) is CHESS_TEMPLATE  # nothing observed yet
    for _ in range(3):
        w.add(sample([*SMALL, (REVISE, [(1000, 40)]), *EVALUATED]))  # one revise round
        w.add(sample([*SMALL, *EVALUATED]))
        w.add(sample(SMALL, evaluated=False))  # ran without evaluation: does not dilute the evaluation rounds
    fitted = fit(CHESS_TEMPLATE, w, fixed_width=frozenset({CANDIDATE}))
    by_kind: dict[str, list[Any]] = {}
    for p in fitted.phases:
        by_kind.setdefault(p.kind, []).append(p)
    assert UNIT_TESTER not in by_kind  # never run by this pipeline
    assert sum(p.rounds for p in by_kind[IR]) == pytest.approx(1.0)  # one IR stage per question, over two phases
    [cand] = by_kind[CANDIDATE]
    assert (cand.input_tokens, cand.output_tokens, cand.width) == (1000, 40, 2)
    [rev] = by_kind[REVISE]
    assert rev.repeatable and 0.0 < rev.rounds <= 1 / 3
    [ev] = by_kind[EVALUATE]
    assert (ev.input_tokens, ev.width) == (200, 2) and ev.rounds == pytest.approx(1.0)
    full = Knobs(2, 10, True)
    cost = sum(st.rounds * sum(c.input_tokens for c in st.calls) for st in knob_plan(fitted, full))
    chess = sum(st.rounds * sum(c.input_tokens for c in st.calls) for st in knob_plan(CHESS_TEMPLATE, full))
    assert cost < chess / 5


def test_one_runaway_question_does_not_move_the_fit() -> None:
    """A question whose model wrote 20 long revisions (it was answered in the end) counts as no more than the
    next largest (one round, the usual revise call), where running sums would have put 20 rounds of 700
    tokens into every later question's prediction."""
    w = ShapeWindow(100, SKIPPABLE)
    for i in range(20):
        w.add(sample([*SMALL, *([(REVISE, [(1000, 40)])] if i % 4 == 0 else [])]))
    before = fit(CHESS_TEMPLATE, w)
    w.add(sample([*SMALL, *[(REVISE, [(1000, 700)])] * 20]))
    after = fit(CHESS_TEMPLATE, w)
    rev = {t: next(p for p in tpl.phases if p.kind == REVISE) for t, tpl in (("before", before), ("after", after))}
    assert rev["before"].rounds == pytest.approx(5 / 20)
    assert rev["after"].rounds == pytest.approx(6 / 21)  # as one more question with one round
    assert rev["after"].output_tokens == rev["before"].output_tokens == 40


def test_the_window_forgets_old_questions() -> None:
    w = ShapeWindow(MIN_QUESTIONS, SKIPPABLE)
    for _ in range(MIN_QUESTIONS):
        w.add(sample([(CANDIDATE, [(5000, 600)])], evaluated=False))
    assert w.outputs()[CANDIDATE] == 600
    for _ in range(MIN_QUESTIONS):
        w.add(sample([(CANDIDATE, [(500, 12)])], evaluated=False))
    assert w.outputs()[CANDIDATE] == 12 and w.questions == MIN_QUESTIONS


def test_input_scale_is_the_workers_count_over_the_estimate_within_limits() -> None:
    w = ShapeWindow(10)
    assert CANDIDATE not in w.outputs() and w.input_scale is None
    w.add(QuestionSample.of([(CANDIDATE, [(500, 10), (500, 14)])], evaluated=False, prompt_sizes=[(1000, 500)] * 2))
    assert w.outputs()[CANDIDATE] == 12
    assert w.input_scale == pytest.approx(0.5)
    w.add(QuestionSample.of([], evaluated=False, prompt_sizes=[(10, 10**6), (0, 5), (5, 0)]))  # a worker lying
    assert w.input_scale == INPUT_SCALE_LIMIT
