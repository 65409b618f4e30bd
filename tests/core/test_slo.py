"""Stage budgets from the remaining end-to-end deadline."""

from __future__ import annotations

import pytest

from gateway.core.slo import stage_budget


@pytest.mark.parametrize(
    ("deadline", "now", "stage", "remaining", "expected"),
    [
        (100.0, 0.0, 10.0, 40.0, 20.0),  # proportional share of the whole budget
        (100.0, 50.0, 10.0, 40.0, 10.0),  # a late start tightens the stage's budget
        (100.0, 0.0, 10.0, 0.0, 100.0),  # last stage gets all that is left
        (100.0, 0.0, 0.0, 0.0, 100.0),  # no cost information: all that is left
        (100.0, 120.0, 10.0, 40.0, -20.0),  # past the deadline: negative budget (most urgent)
        (0.0, 0.0, 1.0, 1.0, 0.0),  # t = 0.0 is a valid time
    ],
)
def test_stage_budget_table(deadline: float, now: float, stage: float, remaining: float, expected: float) -> None:
    assert stage_budget(deadline, now, stage, remaining) == pytest.approx(expected)


def test_late_stage_tightens_the_budgets_after_it() -> None:
    # Two stages of cost 10 and 10 with deadline 40: on time, stage 2 gets 20; after a 10 s overrun, 10.
    on_time = stage_budget(40.0, 20.0, 10.0, 0.0)
    late = stage_budget(40.0, 30.0, 10.0, 0.0)
    assert late < on_time
